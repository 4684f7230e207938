"""Growing an output: more views, new sources, what is refused, and source lineage."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import lance
import pytest
import yaml
from click.testing import CliRunner
from conftest import BUCKET, RecordingProgress

from rayaug import api, commit, outputs, plan, sampledata
from rayaug.cli import main
from rayaug.diff import diff_outputs
from rayaug.errors import UsageError
from rayaug.formats.lance import DATASET
from rayaug.job import JobSummary, RunOptions, run_job
from rayaug.plan import prepare, recorded_job
from rayaug.replay import replay
from rayaug.reports.summary import verify
from rayaug.spec import JobSpec, StorageSpec, parse_spec
from rayaug.storage import Location, open_location

OPS = [
    {"name": "random_resized_crop", "size": 48, "scale": [0.3, 1.0]},
    {"name": "horizontal_flip"},
    {"name": "color_jitter", "brightness": 0.4, "hue": 0.1},
]


def spec_of(source: Path | str, out: Path | str, views: int = 2, **overrides) -> JobSpec:
    data = {
        "input": {"uri": str(source)},
        "output": {"uri": str(out), "shard_size": 8},
        "views": views,
        "seed": 11,
        "ops": OPS,
        "execution": {"batch_size": 8, "concurrency": 1},
    }
    return parse_spec(data | overrides)


def location(spec: JobSpec, uri: str | None = None) -> Location:
    return open_location(uri or spec.output.uri, spec.storage)


def planned(spec: JobSpec, grow: bool = True) -> plan.JobPlan:
    return prepare(spec, location(spec, spec.input.uri), location(spec), grow)


def run(spec: JobSpec) -> JobSummary:
    return run_job(spec, RunOptions(), RecordingProgress())


def samples(uri: str | Path) -> dict[str, tuple[str, str]]:
    """sample_id → (sha256, ops) of every committed sample."""
    rows = outputs.manifests(open_location(str(uri), StorageSpec())).to_pylist()
    return {r["sample_id"]: (r["sha256"], r["ops"]) for r in rows}


def files_under(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


# ---------------------------------------------------------------- planning (no Ray)


def test_more_views_plan_only_the_new_views(photo_folder: Path, tmp_path: Path) -> None:
    first = planned(spec_of(photo_folder, tmp_path / "out", views=2))
    assert [u.views for u in first.units] == [(0, 2)] * 3  # 24 photos, 8 a shard
    (tmp_path / "out" / "_SUCCESS").write_text("{}")

    grown = planned(spec_of(photo_folder, tmp_path / "out", views=5))
    added = grown.units[3:]
    assert grown.units[:3] == first.units
    assert [(u.shard, u.files, u.views) for u in added] == [
        (f"g1-part-{i:05d}", unit.files, (2, 5)) for i, unit in enumerate(first.units)
    ]
    assert grown.planned_samples == 24 * 5
    assert not (tmp_path / "out" / "_SUCCESS").exists()  # not finished any more
    assert (tmp_path / "out" / commit.generation_path(1)).exists()
    # The same grown job again: a resume of it, no third generation.
    assert planned(spec_of(photo_folder, tmp_path / "out", views=5)) == grown
    assert not (tmp_path / "out" / commit.generation_path(2)).exists()
    assert recorded_job(location(spec_of(photo_folder, tmp_path / "out"))).spec.views == 5


def test_new_files_in_a_folder_plan_only_them(photos, photo_folder: Path, tmp_path: Path) -> None:
    first = planned(spec_of(photo_folder, tmp_path / "out"))
    new = list(sampledata.make_photos(3, seed=9, short_side=(96, 120)))
    sampledata.write_folder([p.__class__(f"new/{p.key}", "new", p.jpeg) for p in new], photo_folder)
    grown = planned(spec_of(photo_folder, tmp_path / "out"))
    added = grown.units[len(first.units) :]
    assert [(u.shard, u.views, u.planned) for u in added] == [("g1-part-00000", (0, 2), 3)]
    assert all(path.startswith("new/") for path in added[0].files)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"seed": 12}, "seed: 11 recorded, 12 now"),
        ({"ops": OPS[:2]}, "ops[2]: {"),
        ({"views": 1}, "views: 2 recorded, 1 now (views only grow)"),
        ({"output": {"uri": "OUT", "shard_size": 4}}, "output.shard_size: 8 recorded, 4 now"),
    ],
)
def test_a_change_that_is_not_growth_is_refused_by_name(
    photo_folder: Path, tmp_path: Path, change: dict, message: str
) -> None:
    out = tmp_path / "out"
    planned(spec_of(photo_folder, out))
    if "output" in change:
        change = {"output": change["output"] | {"uri": str(out)}}
    with pytest.raises(UsageError) as refused:
        planned(spec_of(photo_folder, out, **change))
    assert message in str(refused.value)
    assert "An output can only grow (more views, new input files)" in str(refused.value)


def test_a_gone_or_changed_source_file_is_refused(photo_folder: Path, tmp_path: Path) -> None:
    spec = spec_of(photo_folder, tmp_path / "out")
    planned(spec)
    (photo_folder / "astronaut" / "000000.jpg").unlink()
    with pytest.raises(UsageError, match=r"1 input files are gone since the job ran \(e\.g\. "):
        planned(spec)
    chelsea = sorted((photo_folder / "chelsea").iterdir())[0]
    chelsea.write_bytes(chelsea.read_bytes() + b"\0")
    with pytest.raises(UsageError, match=r"1 input files changed size .*chelsea/"):
        planned(spec)


def test_a_new_version_is_refused(
    photo_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = spec_of(photo_folder, tmp_path / "out")
    planned(spec)
    upgraded = plan.versions() | {"kornia": "99.0"}
    monkeypatch.setattr(plan, "versions", lambda: upgraded)
    with pytest.raises(UsageError, match=r"kornia \S+ recorded, 99\.0 now"):
        planned(spec_of(photo_folder, tmp_path / "out", views=4))


def test_a_version_the_output_never_recorded_is_named_without_a_recorded_one(
    photo_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = spec_of(photo_folder, tmp_path / "out")
    planned(spec)
    added = plan.versions() | {"newlib": "1.0"}
    monkeypatch.setattr(plan, "versions", lambda: added)
    with pytest.raises(UsageError) as refused:
        planned(spec)
    message = str(refused.value)
    assert "newlib absent recorded, 1.0 now" in message
    assert "finish the recorded one with the versions it recorded: rayaug resume" in message


def test_resume_does_not_take_new_files(photo_folder: Path, tmp_path: Path) -> None:
    spec = spec_of(photo_folder, tmp_path / "out")
    planned(spec)
    sampledata.write_folder(list(sampledata.make_photos(2, seed=4)), photo_folder / "late")
    refusal = "the input gained 2 files since the job was recorded; resume finishes"
    with pytest.raises(UsageError, match=refusal):
        planned(spec, grow=False)


def test_mixes_cannot_gain_sources(photo_folder: Path, tmp_path: Path) -> None:
    mixing = {"ops": [*OPS, {"name": "mixup", "p": 0.5}]}
    planned(spec_of(photo_folder, tmp_path / "out", **mixing))
    assert len(planned(spec_of(photo_folder, tmp_path / "out", views=3, **mixing)).units) == 6
    sampledata.write_folder(list(sampledata.make_photos(2, seed=4)), photo_folder / "late")
    with pytest.raises(UsageError, match="mix ops draw their partners from the whole input"):
        planned(spec_of(photo_folder, tmp_path / "out", views=3, **mixing))


# ---------------------------------------------------------------- end to end


def test_four_to_eight_views_equals_a_fresh_eight_view_job(
    ray_cluster: str, photo_folder: Path, tmp_path: Path
) -> None:
    grown, fresh = tmp_path / "grown", tmp_path / "fresh"
    run(spec_of(photo_folder, grown, views=4))
    written = files_under(grown / "data") | files_under(grown / "manifests")

    summary = run(spec_of(photo_folder, grown, views=8))
    assert summary.tally.new_samples == 24 * 4  # the new views only, not a rerun of 8
    after = files_under(grown / "data") | files_under(grown / "manifests")
    assert {k: after[k] for k in written} == written  # committed shards never rewritten
    run(spec_of(photo_folder, fresh, views=8))
    assert samples(grown) == samples(fresh)
    a, b = (outputs.recorded_output(open_location(str(p), StorageSpec())) for p in (grown, fresh))
    assert verify(a) == [] and diff_outputs(a, b).identical
    new_view = next(s for s in samples(grown) if s.endswith("#6"))
    assert replay(a, new_view, StorageSpec()).matches
    # The training reader: epoch 6 is view 6, read from the growth's shards as one dataset.
    epochs = [
        api.open_output(p).epoch(6, columns=("sample_id",), decode=False) for p in (grown, fresh)
    ]
    served = [sorted(item["sample_id"] for item in epoch) for epoch in epochs]
    assert served[0] == served[1] == sorted(s for s in samples(fresh) if s.endswith("#6"))
    # Three views per item, views 3, 4 and 5: an item joins the first run's and the growth's
    # shards of one source, as the fresh job's one shard holds them.
    triples = [
        sorted(
            tuple(item["sample_id"])
            for item in api.open_output(p).epoch(
                1, views_per_item=3, columns=("sample_id",), decode=False
            )
        )
        for p in (grown, fresh)
    ]
    assert triples[0] == triples[1] and len(triples[0]) == len(served[0])
    assert all([i.rsplit("#", 1)[1] for i in t] == ["3", "4", "5"] for t in triples[0])


def test_new_parquet_file_is_the_only_work(ray_cluster: str, photos, tmp_path: Path) -> None:
    source = tmp_path / "pq"
    sampledata.write_parquet(photos[:16], source, rows_per_file=8)
    spec = spec_of(source, tmp_path / "out", input={"uri": str(source), "key_column": "key"})
    run(spec)
    sampledata.write_parquet(photos[16:], tmp_path / "more", rows_per_file=8)
    (tmp_path / "more" / "part-00000.parquet").rename(source / "part-00009.parquet")
    assert run(spec).tally.new_samples == 8 * 2
    assert len(samples(tmp_path / "out")) == 24 * 2
    assert verify(outputs.recorded_output(open_location(spec.output.uri, spec.storage))) == []


@pytest.mark.slow
def test_a_killed_growth_resumes_to_the_final_spec(
    ray_cluster: str, photo_folder: Path, tmp_path: Path
) -> None:
    out, fresh = tmp_path / "out", tmp_path / "fresh"
    small = spec_of(photo_folder, out, views=2, output={"uri": str(out), "shard_size": 2})
    run(small)
    rayaug = Path(sys.executable).parent / "rayaug"
    driver = subprocess.Popen(
        [str(rayaug), "extend", str(out), "--views", "4", "--address", ray_cluster],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=os.environ | {"RAY_ADDRESS": ""},
    )
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and len(list((out / "manifests").glob("g1-*"))) < 2:
        assert driver.poll() is None, driver.stderr.read().decode()
        time.sleep(0.05)
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    assert 2 <= len(list((out / "manifests").glob("g1-*"))) < 12, "the kill must land mid-growth"

    api.resume(out)
    run(spec_of(photo_folder, fresh, views=4, output={"uri": str(fresh), "shard_size": 2}))
    assert samples(out) == samples(fresh) and len(samples(out)) == 24 * 4
    assert verify(outputs.recorded_output(open_location(str(out), StorageSpec()))) == []


@pytest.mark.s3
def test_growth_on_s3_into_one_lance_version(ray_cluster: str, s3, photo_folder: Path) -> None:
    uri = f"s3://{BUCKET}/{uuid.uuid4().hex[:8]}/out"
    lance_output = {"uri": uri, "shard_size": 8, "format": "lance"}
    run(spec_of(photo_folder, uri, views=1, output=lance_output))
    summary = api.extend(uri, views=2)
    assert summary.tally.new_samples == 24
    view = api.open_output(uri)
    assert view.verify() == [] and view.status()["samples_committed"] == 48
    options = {"endpoint": f"http://{s3.endpoint}", "region": s3.region, "allow_http": "true"}
    dataset = lance.dataset(f"{uri}/{DATASET}", storage_options=options)
    assert dataset.count_rows() == 48  # one version holds the old and the new fragments
    assert sorted(dataset.to_table(columns=["sample_id"])["sample_id"].to_pylist()) == sorted(
        view.manifest()["sample_id"].to_pylist()
    )


def test_a_changed_source_is_told_apart_from_a_damaged_output(
    ray_cluster: str, photos, photo_folder: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    run(spec_of(photo_folder, out))
    key = photos[0].key
    (photo_folder / key).write_bytes(photos[1].jpeg)  # replaced after the job ran
    cli = CliRunner()

    replayed = cli.invoke(main, ["replay", str(out), f"{key}#0"])
    assert replayed.exit_code == 1
    assert f"{key}#0: SOURCE CHANGED since the job ran — {key} in " in replayed.output
    assert "this says nothing against the output" in replayed.output

    verified = cli.invoke(main, ["inspect", str(out), "--verify"])
    assert verified.exit_code == 1
    assert "verify: OK" in verified.output
    assert "sources: 1 changed since the job ran" in verified.output
    assert f"  source {key} changed since the job ran (" in verified.output

    other = photos[2].key
    untouched = cli.invoke(main, ["replay", str(out), f"{other}#1"])
    assert untouched.exit_code == 0 and "identical" in untouched.output
    assert yaml.safe_load((out / commit.SPEC).read_text())["views"] == 2
