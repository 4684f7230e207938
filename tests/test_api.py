"""The Python API (`rayaug.run`, `resume`, `open_output`) on one real job (the session Ray)."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from PIL import Image

import rayaug
from rayaug.job import JobSummary

PHOTOS = 10  # and one file that is not a JPEG: 2 views each, 20 samples, 2 quarantined


@pytest.fixture(scope="module")
def job(ray_cluster: str, tmp_path_factory: pytest.TempPathFactory) -> dict:
    from rayaug import sampledata

    root = tmp_path_factory.mktemp("api")
    photos = list(sampledata.make_photos(PHOTOS, seed=9, short_side=(64, 96)))
    sampledata.write_folder(photos, root / "input")
    (root / "input" / photos[0].label / "zz-broken.jpg").write_bytes(b"not a jpeg")
    return {
        "input": {"uri": str(root / "input")},
        "output": {"uri": str(root / "out"), "shard_size": 6},
        "views": 2,
        "ops": [{"name": "rotation", "degrees": 20}, {"name": "resize", "size": [40, 56]}],
        "errors": {"max_error_rate": 0.5},
        "execution": {"batch_size": 8, "concurrency": 1},
    }


@pytest.fixture(scope="module")
def finished(job: dict) -> JobSummary:
    return rayaug.run(job)


def test_run_returns_the_summary(finished: JobSummary, job: dict) -> None:
    assert finished.output == job["output"]["uri"]
    assert (finished.tally.samples, finished.tally.quarantined) == (2 * PHOTOS, 2)
    assert finished.tally.new_samples == 2 * PHOTOS + 2
    assert finished.to_json()["reasons"] == {"decode: DecodeError": 2}


def test_open_output_reads_status_manifest_and_errors(finished: JobSummary) -> None:
    out = rayaug.open_output(finished.output)
    assert out.uri == finished.output and out.spec.views == 2
    status = out.status()
    assert status["state"] == "done"
    assert status["samples_committed"] == 2 * PHOTOS and status["quarantined"] == 2
    manifest = out.manifest()
    assert manifest.num_rows == 2 * PHOTOS
    assert {"sample_id", "ops", "sha256", "width", "height"} <= set(manifest.column_names)
    errors = out.errors().to_pylist()
    assert sorted(e["sample_id"].split("/")[-1] for e in errors) == [
        "zz-broken.jpg#0",
        "zz-broken.jpg#1",
    ]
    assert {e["stage"] for e in errors} == {"decode"}
    assert out.verify() == []


def test_samples_decode_to_their_rows(finished: JobSummary) -> None:
    out = rayaug.open_output(finished.output)
    decoded = list(out.samples())
    # Shard by shard, each in manifest order: the manifest's own row order.
    assert [row["sample_id"] for row, _ in decoded] == out.manifest()["sample_id"].to_pylist()
    for row, image in decoded:
        assert isinstance(image, Image.Image)
        assert image.size == (row["width"], row["height"]) == (56, 40)
    for row, data in out.samples(decode=False):
        assert hashlib.sha256(data).hexdigest() == row["sha256"]
    assert len(list(out.samples(limit=3))) == 3


def test_reports_through_the_view(finished: JobSummary) -> None:
    out = rayaug.open_output(finished.output)
    report = out.summary(stats=True)
    assert report["ops"]["resize"]["applied"] == 2 * PHOTOS
    assert report["stats"]["ops"]["rotation"]["expected_rate"] == 1.0
    result = out.query("SELECT count(*) FROM applied_ops WHERE op = 'rotation'")
    assert result.rows == [(2 * PHOTOS,)]
    with pytest.raises(rayaug.UsageError, match="query failed: Parser Error"):
        out.query("SELEC 1")
    assert out.contact_sheet(limit=4).size[0] > 0


def test_resume_and_rerun_of_a_finished_output_do_nothing(
    finished: JobSummary, job: dict, tmp_path: Path
) -> None:
    resumed = rayaug.resume(finished.output)
    assert resumed.tally.new_samples == 0 and resumed.tally.samples == 2 * PHOTOS
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    for same in (path, str(path), rayaug.load_job(job)):  # a path, a str, a JobSpec
        again = rayaug.run(same)
        assert again.tally.new_samples == 0 and again.output == finished.output


def test_errors_are_typed_not_printed(
    job: dict, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    bad = job | {"ops": [{"name": "resize", "size": 40}, {"name": "rotation", "degrees": -5}]}
    with pytest.raises(rayaug.SpecError) as error:
        rayaug.run(bad)
    assert error.value.exit_code == 2
    assert error.value.source == "<job dict>"
    assert [m.split(":")[0] for m in error.value.messages] == ["ops[1].degrees"]
    with pytest.raises(rayaug.UsageError, match="is not a rayaug output"):
        rayaug.open_output(str(tmp_path))
    with pytest.raises(rayaug.UsageError, match="is not a rayaug output"):
        rayaug.resume(str(tmp_path))
    assert capsys.readouterr() == ("", "")


def test_import_rayaug_stays_light() -> None:
    code = (
        "import sys, rayaug; heavy = {'ray', 'torch', 'pyarrow', 'PIL'} & set(sys.modules); "
        "assert not heavy, heavy; rayaug.open_output; "
        "assert not {'ray', 'torch'} & set(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
