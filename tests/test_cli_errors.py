"""The mistakes a newcomer makes (issue 21), run as a user types them: each answer is the exact
line on stderr (nothing before it: no empty line, no traceback) and the exit code."""

from __future__ import annotations

import json
import re
import shutil
import uuid
import warnings
from pathlib import Path

import pyarrow.fs as pafs
import pytest
from click.testing import Result
from conftest import BUCKET
from test_cli import rayaug, write_spec

from rayaug import sampledata
from rayaug.plan import versions


def error_line(result: Result, code: int) -> str:
    """The one line a refused command prints on stderr, checked to be all it prints there."""
    assert result.exit_code == code, result.output
    assert result.stderr.count("\n") == 1 and result.stderr.endswith("\n"), repr(result.stderr)
    return result.stderr.rstrip("\n")


def photo_folder(root: Path, count: int, seed: int = 2) -> Path:
    photos = list(sampledata.make_photos(count, seed=seed, short_side=(64, 96)))
    sampledata.write_folder(photos, root)
    return root


# ---------------------------------------------------------------- 1. an output inside its input


@pytest.mark.parametrize("where", ["inside", "same", "input-inside"])
def test_an_output_inside_its_input_is_refused_before_anything_is_written(
    tmp_path: Path, where: str
) -> None:
    source = photo_folder(tmp_path / "in", 2)
    out = {"inside": source / "out", "same": source, "input-inside": tmp_path}[where]
    spec = write_spec(tmp_path / "job.yaml", source, out)
    before = sorted(tmp_path.rglob("*"))
    line = error_line(rayaug("run", str(spec)), 2)
    if where == "input-inside":
        assert line == (
            f"error: input {source} is inside the output {tmp_path}: the job would write among "
            "its own sources. Set output.uri to a folder outside the input"
        )
    else:
        relation = "inside" if where == "inside" else "the same folder as"
        assert line == (
            f"error: output {out} is {relation} its input {source}: the job would read its own "
            "files as sources. Set output.uri to a folder outside the input"
        )
    assert sorted(tmp_path.rglob("*")) == before  # not even the lease


def test_s3_prefixes_nested_are_refused_before_anything_is_written(s3, tmp_path: Path) -> None:
    prefix = f"{BUCKET}/nested-{uuid.uuid4().hex}"
    bucket = s3.filesystem()
    photo = next(iter(sampledata.make_photos(1, seed=1, short_side=(64, 96))))
    with bucket.open_output_stream(f"{prefix}/in/cat/a.jpg") as stream:
        stream.write(photo.jpeg)
    spec = write_spec(tmp_path / "job.yaml", f"s3://{prefix}/in", f"s3://{prefix}/in/out")
    assert error_line(rayaug("run", str(spec)), 2) == (
        f"error: output s3://{prefix}/in/out is inside its input s3://{prefix}/in: the job would "
        "read its own files as sources. Set output.uri to a folder outside the input"
    )
    spec = write_spec(tmp_path / "job.yaml", f"s3://{prefix}/in/cat", f"s3://{prefix}/in")
    assert error_line(rayaug("run", str(spec)), 2) == (
        f"error: input s3://{prefix}/in/cat is inside the output s3://{prefix}/in: the job would "
        "write among its own sources. Set output.uri to a folder outside the input"
    )
    listed = bucket.get_file_info(pafs.FileSelector(prefix, recursive=True))
    assert [info.path for info in listed if info.type == pafs.FileType.File] == [
        f"{prefix}/in/cat/a.jpg"
    ]


def test_an_output_made_inside_its_input_is_rescued(ray_cluster: str, tmp_path: Path) -> None:
    """An output an older rayaug let a user make inside its input (its fingerprint covered
    every file listed, its own lock among them, and kept no sizes): refused with the way out,
    which then works."""
    source = photo_folder(tmp_path / "in", 10)
    made = tmp_path / "made"
    assert rayaug("run", str(write_spec(tmp_path / "job.yaml", source, made))).exit_code == 0
    for name in ("fingerprint.json", "plan.json"):  # an older digest, and no listing kept
        record = json.loads((made / "_job" / name).read_text())
        record.pop("files", None)
        record["fingerprint"] = "0" * 64
        (made / "_job" / name).write_text(json.dumps(record))
    (made / "manifests/part-00001.parquet").unlink()  # stopped before its last shard
    (made / "_SUCCESS").unlink()
    shutil.move(made, source / "out")

    nested = write_spec(tmp_path / "nested.yaml", source, source / "out")
    assert error_line(rayaug("run", str(nested)), 2) == (
        f"error: output {source}/out is inside its input {source}: the job would read its own "
        "files as sources. Set output.uri to a folder outside the input; it already holds a "
        "job: move it (every file under it) out of the input, then finish it with "
        "`rayaug resume NEW_URI`"
    )
    shutil.move(source / "out", tmp_path / "rescued")
    result = rayaug("resume", str(tmp_path / "rescued"))
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("done: 20 samples in 2 shards, 0 quarantined; 4 this run")
    assert "files" in json.loads((tmp_path / "rescued/_job/fingerprint.json").read_text())


# ---------------------------------------------------------------- 2. "a different job": what


def test_a_different_job_names_what_differs_with_both_values(
    ray_cluster: str, tmp_path: Path
) -> None:
    source = photo_folder(tmp_path / "in", 10)
    out = tmp_path / "out"
    spec = write_spec(tmp_path / "job.yaml", source, out)
    assert rayaug("run", str(spec)).exit_code == 0
    refusal = (
        "An output can only grow (more views, new input files); use a new output URI for "
        f"another job, or finish the recorded one with: rayaug resume {out}"
    )

    reseeded = write_spec(tmp_path / "seed.yaml", source, out, seed=6)
    assert error_line(rayaug("run", str(reseeded)), 2) == (
        f"error: {out} holds the output of a different job: seed: 5 recorded, 6 now. {refusal}"
    )

    (source / "README.txt").write_text("not read by the job: changes nothing")
    result = rayaug("resume", str(out))
    assert result.exit_code == 0 and "0 this run" in result.stdout, result.output
    gone = sorted(source.rglob("*.jpg"))[0]
    kept = gone.read_bytes()
    gone.unlink()
    assert error_line(rayaug("run", str(spec)), 2) == (
        f"error: {out} holds the output of a different job: 1 input files are gone since the "
        f"job ran (e.g. {gone.relative_to(source).as_posix()}): put them back to grow this "
        f"output. {refusal}"
    )

    gone.write_bytes(kept)
    fingerprint = out / "_job/fingerprint.json"
    record = json.loads(fingerprint.read_text())
    record["versions"]["kornia"] = "0.0.1"
    record["fingerprint"] = "0" * 64
    fingerprint.write_text(json.dumps(record))
    assert error_line(rayaug("run", str(spec)), 2) == (
        f"error: {out} holds the output of a different job: kornia 0.0.1 recorded, "
        f"{versions()['kornia']} now. "
        + refusal.replace(" one with:", " one with the versions it recorded (kornia 0.0.1):")
    )


# ---------------------------------------------------------------- 3, 4. the spec


def test_a_misspelt_op_or_parameter_gets_a_suggestion(tmp_path: Path) -> None:
    spec = write_spec(tmp_path / "job.yaml", "in", "out", ops=[{"name": "random_resized_crp"}])
    assert error_line(rayaug("validate", str(spec)), 2) == (
        f"invalid job spec {spec}: ops[0]: unknown op 'random_resized_crp'; did you mean "
        "'random_resized_crop'?"
    )
    spec = write_spec(
        tmp_path / "job.yaml", "in", "out", ops=[{"name": "random_resized_crop", "sise": 48}]
    )
    assert error_line(rayaug("run", str(spec)), 2) == (
        f"invalid job spec {spec}: ops[0].sise: unknown field; did you mean 'size'?"
    )


def test_a_range_given_as_a_word_says_a_number_or_a_range(tmp_path: Path) -> None:
    spec = write_spec(
        tmp_path / "job.yaml", "in", "out", ops=[{"name": "rotation", "degrees": "ten"}]
    )
    assert error_line(rayaug("validate", str(spec)), 2) == (
        f"invalid job spec {spec}: ops[0].degrees: must be a number or [min, max], not 'ten'"
    )


# ---------------------------------------------------------------- 5, 6, 8. quarantine, diff


@pytest.fixture(scope="module")
def broken(ray_cluster: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """5 photos and a JPEG cut in half. `raised`: refused by the error budget, then run again
    with the budget raised; `reshard`: the same job in shards of 2 with that budget at once."""
    root = tmp_path_factory.mktemp("broken")
    source = photo_folder(root / "in", 5)
    whole = sorted(source.rglob("*.jpg"))[0].read_bytes()
    (source / "bad").mkdir()
    (source / "bad" / "half.jpg").write_bytes(whole[: len(whole) // 2])
    raised = root / "raised"
    tight = write_spec(root / "tight.yaml", source, raised, views=1)
    first = rayaug("run", str(tight))
    assert first.exit_code == 1
    bar, line = first.stderr.splitlines()  # the progress, then why the run stopped
    assert bar.startswith("samples ") and " 6/6 " in bar
    assert line == (
        "error: error budget exceeded: 1 of 6 samples quarantined (max_error_rate 0.01): "
        f"decode: DecodeError ×1. See `rayaug inspect {raised}`; to accept them, raise "
        "errors.max_error_rate in the job file and run it again (`rayaug run JOB.yaml`): "
        "committed shards are kept."
    )
    loose = write_spec(root / "loose.yaml", source, raised, views=1, errors={"max_error_rate": 0.5})
    assert rayaug("run", str(loose)).exit_code == 0
    reshard = write_spec(
        root / "reshard.yaml", source, root / "reshard", views=1, errors={"max_error_rate": 0.5}
    )
    reshard.write_text(reshard.read_text().replace("shard_size: 8", "shard_size: 2"))
    assert rayaug("run", str(reshard)).exit_code == 0
    return {"raised": raised, "reshard": root / "reshard"}


TRUNCATED = (
    "cannot decode: the file is truncated: its image data ends early (an incomplete copy or "
    "download)"
)


def test_replay_of_a_quarantined_sample_says_where_and_why(broken: dict[str, Path]) -> None:
    out = broken["raised"]
    assert error_line(rayaug("replay", str(out), "bad/half.jpg#0"), 2) == (
        f"error: sample 'bad/half.jpg#0' was quarantined at the decode stage (DecodeError: "
        f"{TRUNCATED}), so it has no output to replay; `rayaug inspect {out}` lists the "
        "quarantine"
    )
    inspect = rayaug("inspect", str(out))
    assert inspect.exit_code == 0
    assert f"quarantined ×1: decode: {TRUNCATED}" in inspect.stdout.splitlines()


def test_diff_compares_samples_not_their_layout_nor_run_settings(
    broken: dict[str, Path],
) -> None:
    result = rayaug("diff", str(broken["raised"]), str(broken["reshard"]))
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    # max_error_rate was raised for the run that finished `raised`: its record says so.
    assert lines[2:4] == [
        "spec: 1 difference",
        "  output.shard_size: 8 → 2   (layout: the same samples, stored otherwise)",
    ]
    assert "samples in both: 5" in lines and lines[-1] == "IDENTICAL"


# ---------------------------------------------------------------- 7, 8. what a run prints


def test_a_small_job_prints_no_ray_data_warning(ray_cluster: str, tmp_path: Path) -> None:
    """One shard for a pool of two: the pool is sized to the units, so Ray Data has no
    'minimum number of concurrent actors' warning to print."""
    source = photo_folder(tmp_path / "in", 3)
    spec = write_spec(
        tmp_path / "job.yaml",
        source,
        tmp_path / "out",
        execution={"batch_size": 16, "concurrency": 2},
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = rayaug("run", str(spec))
    assert result.exit_code == 0, result.output
    assert not [str(w.message) for w in caught if "concurrent actors" in str(w.message)]


def test_the_progress_agrees_with_status_when_the_error_budget_stops_a_run(
    ray_cluster: str, tmp_path: Path
) -> None:
    source = photo_folder(tmp_path / "in", 12)
    for i in range(12):
        (source / "text" / f"{i:02}.jpg").parent.mkdir(exist_ok=True)
        (source / "text" / f"{i:02}.jpg").write_text("a README saved as a photo")
    out = tmp_path / "out"
    spec = write_spec(
        tmp_path / "job.yaml", source, out, views=1, execution={"batch_size": 4, "concurrency": 2}
    )
    spec.write_text(spec.read_text().replace("shard_size: 8", "shard_size: 2"))
    result = rayaug("run", str(spec))
    assert result.exit_code == 1
    status = json.loads(rayaug("status", str(out), "--json").stdout)
    bars = re.findall(r"(\d+)/24", result.stderr)
    assert bars, result.stderr
    assert int(bars[-1]) == status["samples_committed"] + status["quarantined"]
    last = result.stderr.strip().splitlines()[-1]
    assert f"error: error budget exceeded: {status['quarantined']} of 24 samples" in last
