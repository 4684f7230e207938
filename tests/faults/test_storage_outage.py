"""Fault 4: the S3 server dies mid-job.

Each scenario starts a SeaweedFS of its own (never the session's, which other tests share) with
the session server's keys, so the session Ray's workers, which inherited those keys, reach it
as is; the job's spec names its endpoint. The server is SIGKILLed once some shards are
committed:

- back a few seconds later: the writes retry with backoff (seen in the Ray workers' logs) and
  the job completes, identical to a clean run;
- gone for good: `rayaug run` fails with a one-line message and exit code 1; once the server is
  back, resuming completes the job, identical to a clean run.

The servers are started and restarted from the main thread only: `SeaweedS3` asks Linux to
SIGKILL weed when the *thread* that started it ends (PR_SET_PDEATHSIG), so a server started
from a helper thread dies with that thread.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow.fs as pafs
import pytest
import yaml
from click.testing import CliRunner
from conftest import RecordingProgress
from s3server import SeaweedS3

from rayaug import outputs, sampledata
from rayaug.cli import main
from rayaug.job import RunOptions, run_job
from rayaug.reports.summary import verify
from rayaug.spec import StorageSpec, parse_spec
from rayaug.storage import Location, open_location

pytestmark = [pytest.mark.s3, pytest.mark.slow]

OPS = [
    {"name": "random_resized_crop", "size": 48, "scale": [0.3, 1.0]},
    {"name": "horizontal_flip"},
    {"name": "color_jitter", "brightness": 0.3, "contrast": 0.3, "hue": 0.05, "p": 0.8},
    {"name": "rotation", "degrees": 10, "p": 0.5},
]
PHOTOS = 16
VIEWS = 2
SHARD_SIZE = 2
SHARDS = PHOTOS // SHARD_SIZE
BUCKET = "outage"


def spec_data(source: str, out: str, storage: dict | None = None) -> dict:
    data: dict = {
        "input": {"uri": source},
        "output": {"uri": out, "shard_size": SHARD_SIZE},
        "views": VIEWS,
        "seed": 21,
        "ops": OPS,
        "execution": {"batch_size": 4, "concurrency": 1},
    }
    if storage:
        data["storage"] = storage
    return data


def everything(location: Location) -> dict[str, bytes]:
    return {path: location.read_bytes(path) for path, _ in location.list(recursive=True)}


def manifest_view(location: Location) -> dict[str, tuple[str, str]]:
    """sample_id → (sha256, drawn ops) of every committed sample; none may appear twice."""
    rows = outputs.manifests(location).select(["sample_id", "sha256", "ops"]).to_pylist()
    assert len({r["sample_id"] for r in rows}) == len(rows), "a sample committed twice"
    return {r["sample_id"]: (r["sha256"], r["ops"]) for r in rows}


def assert_same_as_clean(out: Location, clean: Location, photos: list) -> None:
    """The oracle: `verify` finds nothing, and the output equals the clean run's, byte for byte."""
    assert verify(outputs.recorded_output(out)) == []
    got = manifest_view(out)
    assert set(got) == {f"{p.key}#{v}" for p in photos for v in range(VIEWS)}
    assert got == manifest_view(clean)
    objects, expected = everything(out), everything(clean)
    assert sorted(objects) == sorted(expected)  # no orphan, lock or partial object is left
    for path in expected:
        if path.startswith("data/"):
            assert objects[path] == expected[path], path


@pytest.fixture(scope="module")
def photos(photos: list[sampledata.SamplePhoto]) -> list[sampledata.SamplePhoto]:
    return photos[:PHOTOS]


@pytest.fixture(scope="module")
def clean(
    ray_cluster: str, photos: list, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Location]:
    """The input as a local folder, and the same job's output from a clean local run."""
    root = tmp_path_factory.mktemp("outage-clean")
    sampledata.write_folder(photos, root / "input")
    data = spec_data(str(root / "input"), str(root / "out"))
    run_job(parse_spec(data), RunOptions(), RecordingProgress())
    return root / "input", open_location(str(root / "out"), StorageSpec())


def own_server(s3: SeaweedS3, root: Path) -> SeaweedS3:
    """A SeaweedFS that a test may kill, with the session server's keys."""
    server = SeaweedS3(root, access_key=s3.access_key, secret_key=s3.secret_key)
    try:
        server.start()
        server.create_bucket(BUCKET)
    except BaseException:
        server.stop()
        raise
    return server


def storage_of(server: SeaweedS3, retries: int) -> dict:
    return {"endpoint": f"http://{server.endpoint}", "region": server.region, "retries": retries}


def wait_for_manifests(
    server: SeaweedS3, prefix: str, at_least: int, running: Callable[[], bool]
) -> int:
    """Block until `at_least` shards are committed under `prefix`; returns how many are."""
    probe = server.filesystem(
        connect_timeout=1,
        request_timeout=5,
        retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=1),
    )
    selector = pafs.FileSelector(f"{prefix}/manifests", allow_not_found=True)
    deadline = time.monotonic() + 300
    while True:
        found = len(probe.get_file_info(selector))
        if found >= at_least:
            return found
        assert running(), "the job ended before the server was killed"
        assert time.monotonic() < deadline, f"no {at_least} commits under {prefix} in 300s"
        time.sleep(0.05)


def worker_retries(needle: str, since: float) -> list[str]:
    """rayaug's retry warnings about `needle` in the Ray workers' logs written since `since`."""
    import ray

    logs = Path(ray._private.worker._global_node.get_logs_dir_path())
    lines = []
    for path in logs.glob("worker-*"):
        try:
            if path.stat().st_mtime < since:
                continue
            text = path.read_text(errors="replace")
        except OSError:
            continue
        lines += [line for line in text.splitlines() if needle in line and "; retry " in line]
    return lines


def test_job_survives_a_storage_outage_mid_job(
    ray_cluster: str, s3: SeaweedS3, photos: list, clean: tuple[Path, Location], tmp_path: Path
) -> None:
    began = time.time() - 1
    server = own_server(s3, tmp_path / "weed")
    try:
        prefix = f"back-{uuid.uuid4().hex[:8]}"
        filesystem = server.filesystem()
        for photo in photos:
            with filesystem.open_output_stream(f"{BUCKET}/{prefix}/in/{photo.key}") as stream:
                stream.write(photo.jpeg)
        storage = storage_of(server, retries=10)  # backoff for ~1 minute before giving up
        spec = parse_spec(
            spec_data(f"s3://{BUCKET}/{prefix}/in", f"s3://{BUCKET}/{prefix}/out", storage)
        )

        # The job runs in a thread; this (main) thread kills and restarts the server.
        outcome: dict = {}

        def job() -> None:
            try:
                outcome["summary"] = run_job(spec, RunOptions(), RecordingProgress())
            except BaseException as error:  # reported below
                outcome["error"] = error
            outcome["finished"] = time.monotonic()

        worker = threading.Thread(target=job, name="rayaug-job", daemon=True)
        worker.start()
        try:
            at_kill = wait_for_manifests(server, f"{BUCKET}/{prefix}/out", 2, worker.is_alive)
            server.kill()
            killed = time.monotonic()
            # Down for at least 4 s, and until a worker has retried (so the retries are seen).
            retried: list[str] = []
            while time.monotonic() < killed + 4 or (not retried and time.monotonic() < killed + 60):
                time.sleep(0.5)
                retried = worker_retries(f"s3://{BUCKET}/{prefix}/", began)
            assert worker.is_alive(), f"the job ended during the outage: {outcome}"
            server.start()
            restarted = time.monotonic()
        finally:
            worker.join(timeout=300)
        assert not worker.is_alive(), "the job did not finish within 300s of the restart"
        assert "error" not in outcome, repr(outcome.get("error"))
        assert at_kill < SHARDS, "the outage must land mid-job"
        assert outcome["finished"] > restarted  # it waited the outage out
        assert retried, "no worker logged a retry during the outage"
        assert "NETWORK_CONNECTION" in retried[0] and "/10 in " in retried[0], retried[0]
        summary = outcome["summary"]
        assert summary.tally.samples == summary.tally.new_samples == PHOTOS * VIEWS
        assert summary.tally.quarantined == 0  # an outage never passes for a broken input

        out = open_location(spec.output.uri, spec.storage)
        assert_same_as_clean(out, clean[1], photos)
    finally:
        server.stop()


@dataclass
class GoneRun:
    """A `rayaug run` whose storage died for good mid-job."""

    server: SeaweedS3
    data: dict
    returncode: int
    stdout: str
    stderr: str
    committed_at_kill: int


@pytest.fixture(scope="module")
def gone(
    ray_cluster: str,
    s3: SeaweedS3,
    clean: tuple[Path, Location],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[GoneRun]:
    root = tmp_path_factory.mktemp("outage-gone")
    server = own_server(s3, root / "weed")
    try:
        storage = storage_of(server, retries=1)  # give up fast: the server is not coming back
        data = spec_data(str(clean[0]), f"s3://{BUCKET}/gone/out", storage)
        spec_file = root / "job.yaml"
        spec_file.write_text(yaml.safe_dump(data))
        driver = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "rayaug"),
                "run",
                str(spec_file),
                "--address",
                ray_cluster,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            at_kill = wait_for_manifests(
                server, f"{BUCKET}/gone/out", 2, lambda: driver.poll() is None
            )
            server.kill()
            stdout, stderr = driver.communicate(timeout=300)
        finally:
            if driver.poll() is None:
                driver.kill()
                driver.communicate()
        yield GoneRun(server, data, driver.returncode, stdout, stderr, at_kill)
    finally:
        server.stop()


def test_storage_gone_for_good_fails_in_one_line_then_resumes(
    gone: GoneRun, photos: list, clean: tuple[Path, Location]
) -> None:
    assert gone.committed_at_kill < SHARDS, "the outage must land mid-job"
    # A clear failure: exit 1, one line naming the output, no traceback.
    assert gone.returncode == 1, gone.stderr
    assert "Traceback" not in gone.stderr + gone.stdout
    errors = [line for line in gone.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, gone.stderr
    assert gone.stderr.rstrip().endswith(errors[0]), gone.stderr
    assert f"s3://{BUCKET}/gone/out" in errors[0]
    assert "NETWORK_CONNECTION" in errors[0] or "connect" in errors[0], errors[0]  # the why
    assert 'File "' not in errors[0] and "\x1b[" not in errors[0], errors[0]  # no trace inside

    gone.server.start()  # back, with everything committed before the outage
    spec = parse_spec(gone.data)
    out = open_location(spec.output.uri, spec.storage)
    committed = len(out.list("manifests"))
    assert gone.committed_at_kill <= committed < SHARDS
    status = CliRunner().invoke(
        main,
        ["status", out.uri, "--json", "--endpoint", spec.storage.endpoint],
        catch_exceptions=False,
    )
    assert status.exit_code == 0, status.output
    assert '"state": "incomplete"' in status.output

    progress = RecordingProgress()
    summary = run_job(spec, RunOptions(), progress)  # the resume
    assert progress.start == committed * SHARD_SIZE * VIEWS  # kept, not redone
    assert summary.tally.new_samples == (SHARDS - committed) * SHARD_SIZE * VIEWS
    assert_same_as_clean(out, clean[1], photos)


def test_storage_gone_for_good_message_says_why_and_how_to_resume(gone: GoneRun) -> None:
    errors = [line for line in gone.stderr.splitlines() if line.startswith("error:")]
    assert errors, gone.stderr
    message = errors[-1]
    assert "rayaug resume" in message and "_job/lock" not in message, message
    assert "writing s3://" in message and "NETWORK_CONNECTION" in message, message
    assert 'File "' not in message, message
