"""Fault 5: transient storage errors, injected by a proxy between rayaug and a real S3 server.

The proxy (`flaky_proxy.FlakyProxy`, on 127.0.0.1) forwards to the session's SeaweedFS and
fails a deterministic share of the requests: 503 SlowDown, 500 InternalError, a connection
reset before the request reaches the server, a reset after the server acted (the answer is
lost) and GET bodies cut half-way. The job reads its input and writes its output through it,
and must end with the same samples, byte for byte, as a clean run: none lost, none twice.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pyarrow.fs as pafs
import pytest
import yaml
from click.testing import CliRunner
from conftest import BUCKET, RecordingProgress
from s3server import SeaweedS3

from faults.flaky_proxy import KINDS, STALLS, FlakyProxy
from rayaug import outputs, sampledata
from rayaug.cli import main
from rayaug.errors import StorageError
from rayaug.job import RunOptions, run_job
from rayaug.reports.summary import verify
from rayaug.spec import JobSpec, StorageSpec, parse_spec
from rayaug.storage import Location, open_location

pytestmark = pytest.mark.s3

OPS = [
    {"name": "random_resized_crop", "size": 48, "scale": [0.3, 1.0]},
    {"name": "horizontal_flip"},
    {"name": "color_jitter", "brightness": 0.3, "contrast": 0.3, "hue": 0.05, "p": 0.8},
    {"name": "rotation", "degrees": 10, "p": 0.5},
]
VIEWS = 2


# Deadlines of a test: a stalled call fails after ~1 s instead of the defaults' 10 s / 60 s.
SHORT_DEADLINES = {"connect_timeout": 1.0, "request_timeout": 1.0}


def job_spec(source: str, out: str, endpoint: str | None = None, **storage: float | int) -> JobSpec:
    data: dict = {
        "input": {"uri": source},
        "output": {"uri": out, "shard_size": 3},
        "views": VIEWS,
        "seed": 7,
        "ops": OPS,
        "execution": {"batch_size": 4, "concurrency": 1},
    }
    if endpoint:
        data["storage"] = {"endpoint": endpoint, "region": SeaweedS3.region, **storage}
    return parse_spec(data)


def upload(filesystem: pafs.FileSystem, photos: list[sampledata.SamplePhoto], prefix: str) -> None:
    for photo in photos:
        with filesystem.open_output_stream(f"{prefix}/{photo.key}") as stream:
            stream.write(photo.jpeg)


def everything(location: Location) -> dict[str, bytes]:
    """Every object under the location, read back whole."""
    return {path: location.read_bytes(path) for path, _ in location.list(recursive=True)}


def manifest_view(location: Location) -> dict[str, tuple[str, str, int]]:
    """sample_id → (sha256, drawn ops, view) of every committed sample."""
    rows = outputs.manifests(location).select(["sample_id", "sha256", "ops", "view"]).to_pylist()
    assert len({r["sample_id"] for r in rows}) == len(rows), "a sample committed twice"
    return {r["sample_id"]: (r["sha256"], r["ops"], r["view"]) for r in rows}


def assert_same_output(out: Location, reference: Location) -> None:
    """A committed output equals the clean run's: it verifies, has the same samples with the
    same parameters and bytes, and holds no orphan, lock or temporary."""
    assert verify(outputs.recorded_output(out)) == []
    assert manifest_view(out) == manifest_view(reference)
    objects, expected = everything(out), everything(reference)
    assert sorted(objects) == sorted(expected)
    for path in expected:
        if path.startswith("data/"):
            assert objects[path] == expected[path], path


@pytest.fixture
def direct(s3: SeaweedS3) -> StorageSpec:
    """Storage settings that bypass the proxy: the oracle reads the server itself."""
    return StorageSpec(endpoint=f"http://{s3.endpoint}", region=s3.region, retries=2)


@pytest.fixture
def proxy(s3: SeaweedS3) -> Iterator[FlakyProxy]:
    with FlakyProxy(s3.endpoint, every=4, limit=24, truncate_every=4, truncate_limit=6) as flaky:
        yield flaky


def test_a_delete_whose_answer_is_lost_is_not_an_error(s3: SeaweedS3, direct: StorageSpec) -> None:
    """DELETE carried out, its answer lost (every SDK attempt): the retry finds nothing left.

    The lease release and the orphan clean-up delete; a retried delete must count as done.
    """
    prefix = f"{BUCKET}/faults-lost-{uuid.uuid4().hex[:8]}"
    with FlakyProxy(s3.endpoint, every=1, limit=6, kinds=("lost",), methods=("DELETE",)) as lost:
        location = open_location(
            f"s3://{prefix}", StorageSpec(endpoint=lost.url, region=s3.region, retries=3)
        )
        location.write_bytes("_job/lock", b"{}")
        location.delete("_job/lock")
        assert lost.counts["lost"] >= 2, lost.counts  # the SDK retried, then rayaug did
        assert not location.exists("_job/lock")
        # A file that was never there is still reported on the first try.
        with pytest.raises(StorageError, match="never-there"):
            location.delete("never-there")
    assert not open_location(f"s3://{prefix}", direct).exists("_job/lock")


def test_reads_and_writes_survive_every_kind_of_fault(s3: SeaweedS3, direct: StorageSpec) -> None:
    """Location level, no Ray: every injected fault is absorbed, every byte comes back right."""
    prefix = f"{BUCKET}/faults-rw-{uuid.uuid4().hex[:8]}"
    with FlakyProxy(s3.endpoint, every=3, limit=12, truncate_every=2, truncate_limit=4) as flaky:
        location = open_location(
            f"s3://{prefix}", StorageSpec(endpoint=flaky.url, region=s3.region, retries=6)
        )
        payloads = {
            f"data/part-{i:05d}.bin": hashlib.sha256(bytes([i])).digest() * (3000 + i)
            for i in range(6)
        }
        for path, payload in payloads.items():
            location.write_bytes(path, payload)
        assert {p: location.read_bytes(p) for p in payloads} == payloads
        assert location.list("data") == sorted((p, len(b)) for p, b in payloads.items())
        for path in payloads:
            assert location.exists(path)
            location.delete(path)
        assert location.list("data") == []
        assert all(flaky.counts[kind] > 0 for kind in (*KINDS, "truncate")), flaky.counts
    assert everything(open_location(f"s3://{prefix}", direct)) == {}


def test_a_stalled_call_ends_at_its_deadline_and_is_retried(
    s3: SeaweedS3, direct: StorageSpec
) -> None:
    """Location level, no Ray: a call that gets no answer, or half an answer and then silence,
    fails at its deadline and is retried like any transient error; every byte comes back."""
    prefix = f"{BUCKET}/faults-stall-{uuid.uuid4().hex[:8]}"
    with FlakyProxy(s3.endpoint, every=3, limit=6, kinds=STALLS) as stalling:
        location = open_location(
            f"s3://{prefix}",
            StorageSpec(endpoint=stalling.url, region=s3.region, retries=4, **SHORT_DEADLINES),
        )
        payloads = {
            f"data/part-{i}.bin": hashlib.sha256(bytes([i])).digest() * 500 for i in range(4)
        }
        started = time.monotonic()
        for path, payload in payloads.items():
            location.write_bytes(path, payload)
        assert {p: location.read_bytes(p) for p in payloads} == payloads
        elapsed = time.monotonic() - started
        assert all(stalling.counts[kind] > 0 for kind in STALLS), stalling.counts
    assert elapsed < 60, elapsed  # without deadlines the first stall never ended
    assert everything(open_location(f"s3://{prefix}", direct)) == payloads


def test_storage_that_keeps_hanging_fails_in_one_line(s3: SeaweedS3) -> None:
    """Every call hangs: after its retries the call is a StorageError, one line, in bounded
    time (the driver turns it into `the job stopped: ...; run rayaug resume`)."""
    with FlakyProxy(s3.endpoint, every=1, limit=10_000, kinds=("stall",)) as hanging:
        location = open_location(
            f"s3://{BUCKET}/faults-hang",
            StorageSpec(endpoint=hanging.url, region=s3.region, retries=1, **SHORT_DEADLINES),
        )
        started = time.monotonic()
        with pytest.raises(StorageError) as caught:
            location.read_bytes("anything")
        elapsed = time.monotonic() - started
    message = str(caught.value)
    assert "\n" not in message and "reading s3://" in message and "Timeout" in message, message
    assert elapsed < 30, elapsed


@pytest.mark.slow
def test_job_through_a_stalling_proxy_equals_a_clean_run(
    ray_cluster: str,
    s3: SeaweedS3,
    photos: list[sampledata.SamplePhoto],
    direct: StorageSpec,
    tmp_path: Path,
) -> None:
    """Reads and writes of a job hang now and then (no answer, or an answer that stops): the
    job still finishes, in bounded time, with the bytes of a clean run."""
    sampledata.write_folder(photos, tmp_path / "input")
    clean = job_spec(str(tmp_path / "input"), str(tmp_path / "clean"))
    run_job(clean, RunOptions(), RecordingProgress())

    prefix = f"{BUCKET}/faults-stalls-{uuid.uuid4().hex[:8]}"
    upload(s3.filesystem(), photos, f"{prefix}/in")
    with FlakyProxy(s3.endpoint, every=7, limit=8, kinds=STALLS, warmup=3) as stalling:
        spec = job_spec(
            f"s3://{prefix}/in", f"s3://{prefix}/out", endpoint=stalling.url, **SHORT_DEADLINES
        )
        started = time.monotonic()
        summary = run_job(spec, RunOptions(), RecordingProgress())
        elapsed = time.monotonic() - started
        faults = dict(stalling.counts)
    assert all(faults.get(kind, 0) > 0 for kind in STALLS), faults
    assert elapsed < 180, elapsed
    assert summary.tally.samples == len(photos) * VIEWS and summary.tally.quarantined == 0
    reference = open_location(clean.output.uri, StorageSpec())
    assert_same_output(open_location(spec.output.uri, direct), reference)


@pytest.mark.slow
def test_a_job_whose_storage_keeps_hanging_stops_in_one_line_and_resumes(
    ray_cluster: str,
    s3: SeaweedS3,
    photos: list[sampledata.SamplePhoto],
    direct: StorageSpec,
    tmp_path: Path,
) -> None:
    """Mid-job, every storage call starts to hang: `rayaug run` stops, in bounded time, with
    one line and exit 1, like an outage; resumed (storage answering again), the job ends with
    the bytes of a clean run."""
    sampledata.write_folder(photos, tmp_path / "input")
    clean = job_spec(str(tmp_path / "input"), str(tmp_path / "clean"))
    run_job(clean, RunOptions(), RecordingProgress())

    prefix = f"{BUCKET}/faults-hang-{uuid.uuid4().hex[:8]}"
    upload(s3.filesystem(), photos, f"{prefix}/in")
    with FlakyProxy(s3.endpoint, every=0) as proxy:
        data = job_spec(
            f"s3://{prefix}/in",
            f"s3://{prefix}/out",
            endpoint=proxy.url,
            retries=1,
            **SHORT_DEADLINES,
        ).model_dump(mode="json")
        spec_file = tmp_path / "job.yaml"
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
            env=os.environ | {"RAY_ADDRESS": ""},
        )
        out = open_location(f"s3://{prefix}/out", direct)
        try:
            deadline = time.monotonic() + 240
            while len(out.list("manifests")) < 2 and time.monotonic() < deadline:
                assert driver.poll() is None, driver.communicate()
                time.sleep(0.1)
            proxy.hang_all = True
            hung = time.monotonic()
            stdout, stderr = driver.communicate(timeout=180)
            stopped_after = time.monotonic() - hung
        finally:
            if driver.poll() is None:
                driver.kill()
                driver.communicate()
        hangs = proxy.counts["stall"]
    assert driver.returncode == 1, stderr[-3000:]
    assert "Traceback" not in stderr + stdout
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and stderr.rstrip().endswith(errors[0]), stderr[-3000:]
    assert "Timeout" in errors[0] and "rayaug resume" in errors[0], errors[0]
    assert "DataContext" not in errors[0], errors[0]  # Ray Data's retry advice is not ours
    assert hangs > 0 and stopped_after < 120, (hangs, stopped_after)
    print(
        f"stopped {stopped_after:.1f} s after storage began to hang ({hangs} stalled calls): "
        f"{errors[0]}"
    )

    committed = len(out.list("manifests"))
    resumed = parse_spec(data | {"storage": {"endpoint": direct.endpoint, "region": direct.region}})
    progress = RecordingProgress()
    run_job(resumed, RunOptions(), progress)
    assert progress.start == committed * 3 * VIEWS  # kept, not redone (shard_size 3)
    assert_same_output(out, open_location(clean.output.uri, StorageSpec()))


@pytest.mark.slow
def test_job_through_a_flaky_proxy_equals_a_clean_run(
    ray_cluster: str,
    s3: SeaweedS3,
    photos: list[sampledata.SamplePhoto],
    proxy: FlakyProxy,
    direct: StorageSpec,
    tmp_path: Path,
) -> None:
    # The reference: the same spec, local disk to local disk, no faults.
    sampledata.write_folder(photos, tmp_path / "input")
    clean = job_spec(str(tmp_path / "input"), str(tmp_path / "clean"))
    run_job(clean, RunOptions(), RecordingProgress())

    prefix = f"{BUCKET}/faults-errors-{uuid.uuid4().hex[:8]}"
    upload(s3.filesystem(), photos, f"{prefix}/in")
    flaky = job_spec(f"s3://{prefix}/in", f"s3://{prefix}/out", endpoint=proxy.url)
    summary = run_job(flaky, RunOptions(), RecordingProgress())
    assert summary.tally.samples == len(photos) * VIEWS
    assert summary.tally.quarantined == 0  # a storage fault never passes for a broken input
    faults = dict(proxy.counts)

    # The oracle reads the server directly, not through the proxy.
    out = open_location(flaky.output.uri, direct)
    planned = {f"{photo.key}#{view}" for photo in photos for view in range(VIEWS)}
    assert set(manifest_view(out)) == planned  # every planned sample once, none quarantined
    assert_same_output(out, open_location(clean.output.uri, StorageSpec()))

    verdict = CliRunner().invoke(
        main,
        ["inspect", flaky.output.uri, "--verify", "--json", "--endpoint", direct.endpoint],
        catch_exceptions=False,
    )
    assert verdict.exit_code == 0, verdict.output
    assert '"breaches": []' in verdict.output

    # The faults really happened, of every kind.
    for kind in (*KINDS, "truncate"):
        assert faults.get(kind, 0) > 0, (kind, faults, proxy.requests)
