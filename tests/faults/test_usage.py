"""Fault 8: bad specs and bad usage, table-driven through the `rayaug` command.

Each case is refused with exit code 2 (a usage or spec error: nothing ran) or 1 (the job
failed), one actionable line on stderr that names what is wrong and what to do, and never a
traceback. Most cases run in-process through click's CliRunner (refused before Ray starts);
the missing-credentials case runs the installed script in a subprocess with a scrubbed
environment, since credentials come from the process environment.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from click.testing import CliRunner, Result
from conftest import BUCKET
from ports import free_port

from faults import hostile
from rayaug import commit
from rayaug.cli import main
from rayaug.spec import StorageSpec
from rayaug.storage import open_location

OPS = [{"name": "horizontal_flip"}]


def spec_data(source: str | Path, out: str | Path, **overrides) -> dict:
    data = {
        "input": {"uri": str(source)},
        "output": {"uri": str(out), "shard_size": 4},
        "views": 1,
        "seed": 1,
        "ops": OPS,
        "execution": {"batch_size": 4, "concurrency": 1},
    }
    for key, value in overrides.items():
        data[key] = data[key] | value if isinstance(value, dict) and key in data else value
    return data


def write_job(path: Path, data: object) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def rayaug(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def assert_refused(code: int, returned: int, stderr: str, stdout: str, words: list[str]) -> None:
    """Exit `code`; one non-blank line on stderr holding every word; no traceback anywhere."""
    assert "Traceback" not in stderr + stdout, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert returned == code, f"exit {returned}, not {code}: {stderr}"
    assert len(lines) == 1, f"not one line: {lines}"
    for word in words:
        assert word in lines[0], f"{word!r} not in {lines[0]!r}"


def assert_cli_refused(result: Result, code: int, words: list[str]) -> None:
    assert_refused(code, result.exit_code, result.stderr, result.stdout, words)


@pytest.fixture
def images(tmp_path: Path) -> Path:
    """A small valid image folder."""
    root = tmp_path / "images"
    (root / "c").mkdir(parents=True)
    for i in range(3):
        (root / "c" / f"{i}.jpg").write_bytes(hostile.good_jpeg((40 * i, 90, 200)))
    return root


# ---------------------------------------------------------------- the table


@dataclass(frozen=True)
class Case:
    """`make(tmp_path, images) -> argv` builds the files a case needs and the command line."""

    make: Callable[[Path, Path], list[str]]
    code: int
    words: list[str] = field(default_factory=list)


def _run(**overrides) -> Callable[[Path, Path], list[str]]:
    """`rayaug run` of a spec with these top-level overrides (input/output default to valid)."""

    def make(tmp: Path, images: Path) -> list[str]:
        data = spec_data(images, tmp / "out", **overrides)
        return ["run", str(write_job(tmp / "job.yaml", data))]

    return make


def _input(uri_of: Callable[[Path], str], **overrides) -> Callable[[Path, Path], list[str]]:
    def make(tmp: Path, images: Path) -> list[str]:
        data = spec_data(uri_of(tmp), tmp / "out", **overrides)
        return ["run", str(write_job(tmp / "job.yaml", data))]

    return make


def _raw_job(text: str | None) -> Callable[[Path, Path], list[str]]:
    def make(tmp: Path, images: Path) -> list[str]:
        path = tmp / "job.yaml"
        if text is not None:
            path.write_text(text)
        return ["run", str(path)]

    return make


def _folder(tmp: Path, files: dict[str, bytes]) -> str:
    for name, data in files.items():
        (tmp / "in" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp / "in" / name).write_bytes(data)
    (tmp / "in").mkdir(exist_ok=True)
    return str(tmp / "in")


def _parquet(tmp: Path, table: pa.Table) -> str:
    (tmp / "in").mkdir()
    pq.write_table(table, tmp / "in" / "part.parquet")
    return str(tmp / "in")


def _s3(tmp: Path) -> str:
    return f"s3://{BUCKET}/{tmp.name}/in"


CASES: dict[str, Case] = {
    # -- the spec file itself
    "unknown-field": Case(
        _run(input={"formt": "folder"}),
        2,
        ["job.yaml", "input.formt: unknown field; did you mean 'format'?"],
    ),
    "unknown-top-level-field": Case(
        _run(view=2), 2, ["job.yaml", "view: unknown field; did you mean 'views'?"]
    ),
    "unknown-op": Case(
        _run(ops=[{"name": "blurr"}]),
        2,
        ["job.yaml", "ops[0]: unknown op 'blurr'; did you mean 'gaussian_blur'?"],
    ),
    "negative-degrees": Case(
        _run(ops=[{"name": "rotation", "degrees": -3}]), 2, ["ops[0].degrees: must be ≥ 0"]
    ),
    "inverted-range": Case(
        _run(ops=[{"name": "random_resized_crop", "size": 8, "scale": [0.9, 0.1]}]),
        2,
        ["ops[0].scale: range must be [low, high] with low ≤ high"],
    ),
    "even-kernel": Case(
        _run(ops=[{"name": "gaussian_blur", "kernel_size": 4}]), 2, ["ops[0].kernel_size"]
    ),
    "probability-over-1": Case(
        _run(ops=[{"name": "horizontal_flip", "p": 1.5}]), 2, ["ops[0].p", "less than or equal"]
    ),
    "zero-views": Case(_run(views=0), 2, ["views: ", "greater than or equal to 1"]),
    "no-ops": Case(_run(ops=[]), 2, ["ops: ", "at least 1 item"]),
    "error-rate-over-1": Case(
        _run(errors={"max_error_rate": 2}), 2, ["errors.max_error_rate", "less than or equal"]
    ),
    "quality-101": Case(_run(output={"quality": 101}), 2, ["output.quality"]),
    "string-for-number": Case(_run(seed="abc"), 2, ["seed: ", "integer"]),
    "not-yaml": Case(_raw_job("input: [unclosed\nops: {"), 2, ["job.yaml", "not valid YAML"]),
    "not-a-mapping": Case(_raw_job("- just\n- a list\n"), 2, ["a job spec is a YAML mapping"]),
    "no-spec-file": Case(_raw_job(None), 2, ["job.yaml", "cannot read"]),
    # -- URIs and inputs
    "unknown-scheme": Case(
        _input(lambda t: "hdfs://x/images"), 2, ["unsupported URI scheme 'hdfs'"]
    ),
    "s3-without-bucket": Case(_input(lambda t: "s3://"), 2, ["names no bucket", "s3://BUCKET"]),
    "file-uri-with-host": Case(_input(lambda t: "file://host/x"), 2, ["file:///path"]),
    "missing-input": Case(
        _input(lambda t: str(t / "absent" / "[/]odd [bold]name")), 2, ["does not exist", "[/]"]
    ),
    "empty-input": Case(_input(lambda t: _folder(t, {})), 2, ["holds no files"]),
    "mixed-formats": Case(
        _input(lambda t: _folder(t, {"a.tar": b"", "b.parquet": b"", "c.jpg": b""})),
        2,
        ["mixes", "set input.format"],
    ),
    "parquet-without-image-column": Case(
        _input(lambda t: _parquet(t, pa.table({"pixels": [b"x"]}))),
        2,
        ["has no column 'image'", "columns: pixels", "input.image_column"],
    ),
    "parquet-without-key-column": Case(
        _input(lambda t: _parquet(t, pa.table({"image": [b"x"]})), input={"key_column": "id"}),
        2,
        ["has no column 'id'", "input.key_column"],
    ),
    "not-parquet": Case(
        _input(lambda t: _folder(t, {"part.parquet": b"PAR1 this is not parquet"})),
        2,
        ["part.parquet is not a readable Parquet file", "remove it"],
    ),
    "input-is-a-file": Case(
        _input(lambda t: _folder(t, {"one.jpg": hostile.good_jpeg()}) + "/one.jpg"),
        2,
        ["one.jpg", "folder"],
    ),
    "output-is-a-file": Case(
        lambda t, images: [
            "run",
            str(write_job(t / "job.yaml", spec_data(images, _folder(t, {"f": b"x"}) + "/f"))),
        ],
        2,
        ["is a file", "prefix"],
    ),
    # -- S3 (the session's SeaweedFS)
    "s3-bucket-missing": Case(
        _input(lambda t: "s3://bucket-that-does-not-exist/x"),
        2,
        ["input s3://bucket-that-does-not-exist/x", "no bucket 'bucket-that-does-not-exist'"],
    ),
    "s3-output-bucket-missing": Case(
        lambda t, images: [
            "run",
            str(write_job(t / "job.yaml", spec_data(images, "s3://bucket-that-does-not-exist/o"))),
        ],
        2,
        ["output s3://bucket-that-does-not-exist/o", "no bucket", "output.uri"],
    ),
    "s3-prefix-missing": Case(_input(_s3), 2, ["does not exist"]),
    "s3-endpoint-closed-port": Case(
        lambda t, images: [
            "run",
            str(
                write_job(
                    t / "job.yaml",
                    spec_data(
                        _s3(t),
                        t / "out",
                        storage={"endpoint": f"http://127.0.0.1:{free_port()}", "retries": 0},
                    ),
                )
            ),
        ],
        2,
        ["cannot access s3://", "endpoint unreachable", "storage.endpoint"],
    ),
    "s3-endpoint-not-a-url": Case(
        _input(_s3, storage={"endpoint": "http://"}), 2, ["storage.endpoint", "http://host:port"]
    ),
    # -- commands on something that is not an output
    "resume-not-an-output": Case(
        lambda t, images: ["resume", str(t)], 2, ["is not a rayaug output"]
    ),
    "status-not-an-output": Case(
        lambda t, images: ["status", str(t / "nothing")], 2, ["is not a rayaug output"]
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_refused_with_one_actionable_line(
    name: str, s3, tmp_path: Path, images: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    case = CASES[name]
    monkeypatch.chdir(tmp_path)
    assert_cli_refused(rayaug(*case.make(tmp_path, images)), case.code, case.words)


# ---------------------------------------------------------------- cases that need a state


def test_missing_credentials(s3, tmp_path: Path, images: Path) -> None:
    """No AWS credentials anywhere (env scrubbed, config files /dev/null, no metadata probe)."""
    prefix = f"{BUCKET}/{uuid.uuid4().hex[:8]}"
    with s3.filesystem().open_output_stream(f"{prefix}/in/c/0.jpg") as stream:
        stream.write(hostile.good_jpeg())
    job = write_job(tmp_path / "job.yaml", spec_data(f"s3://{prefix}/in", tmp_path / "out"))
    keep = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "RAY_TMPDIR")
    env = {k: os.environ[k] for k in keep if k in os.environ} | {
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": "/dev/null",
        "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
        "AWS_ENDPOINT_URL": f"http://{s3.endpoint}",
        "AWS_REGION": s3.region,
        "NO_PROXY": "127.0.0.1,localhost",
    }
    script = Path(sys.executable).parent / "rayaug"
    done = subprocess.run(
        [str(script), "run", str(job)], capture_output=True, text=True, env=env, timeout=180
    )
    assert_refused(
        2,
        done.returncode,
        done.stderr,
        done.stdout,
        [f"s3://{prefix}/in", "credentials refused", "AWS_ACCESS_KEY_ID is not set"],
    )
    assert s3.secret_key not in done.stderr + done.stdout


def test_output_of_another_job_and_a_concurrent_run(
    ray_cluster: str, tmp_path: Path, images: Path
) -> None:
    out = tmp_path / "out"
    job = write_job(tmp_path / "job.yaml", spec_data(images, out))
    first = rayaug("run", str(job))
    assert first.exit_code == 0, first.output

    other = write_job(tmp_path / "other.yaml", spec_data(images, out, seed=2))
    assert_cli_refused(
        rayaug("run", str(other)),
        2,
        [
            f"{out} holds the output of a different job: seed: 1 recorded, 2 now",
            "use a new output URI",
            "rayaug resume",
        ],
    )

    lease = commit.Lease(open_location(str(out), StorageSpec()))
    lease.acquire()  # another driver, alive, is writing this output
    try:
        for args in (["run", str(job)], ["resume", str(out)]):
            assert_cli_refused(
                rayaug(*args),
                2,
                [f"{out} is being written by another run ({lease.run_id}", "wait for it"],
            )
    finally:
        lease.release()

    (out / commit.LOCK).write_text("{not json")  # a lock file damaged by hand
    assert_cli_refused(rayaug("run", str(job)), 2, ["_job/lock is unreadable", "delete it"])
