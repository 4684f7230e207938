"""Fault 3: the driver is SIGKILLed at four points of a job, then the job is resumed.

The driver is a real subprocess (`python -m faults.injection drive`) joined to the session Ray.
Where the kill must land at an exact point, the driver or its write workers pause there (a
patch inside the driver process, or the job's `worker_process_setup_hook` in its workers) and
announce it with a marker file; the test checks the state on disk, then SIGKILLs the driver.
After every kill the job is resumed and must give the output of an uninterrupted run: every
planned sample committed once, same bytes, `verify` clean, no orphan left, none ever counted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from faults import injection
from rayaug import commit, outputs
from rayaug.job import RunOptions, Tally, run_job
from rayaug.reports.summary import verify
from rayaug.spec import StorageSpec, parse_spec
from rayaug.storage import open_location

SHARDS = 8  # 16 photos, 2 per shard
PER_SHARD = 2 * injection.VIEWS


class Recorder:
    """A Progress that keeps what the resumed driver counted."""

    def started(self, tally: Tally) -> None:
        self.start = tally.samples

    def committed(self, tally: Tally) -> None:
        self.tally = tally


def _manifests(out: Path) -> set[str]:
    return {p.name.removesuffix(".parquet") for p in (out / "manifests").glob("*.parquet")}


def _status(out: Path) -> dict:
    return outputs.status(outputs.recorded_output(open_location(str(out), StorageSpec())))


def _verify(out: Path) -> list[str]:
    return verify(outputs.recorded_output(open_location(str(out), StorageSpec())))


def _resume(data: dict) -> Recorder:
    """Run the same spec again in this process (`rayaug run JOB.yaml` on an existing output)."""
    progress = Recorder()
    run_job(parse_spec(data), RunOptions(), progress)
    return progress


@pytest.fixture
def job(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, ray_cluster: str):
    source, planned = injection.shared_input(tmp_path_factory)
    out = tmp_path / "out"
    data = injection.spec_data(source, out, concurrency=1)
    clean = injection.clean_digests(tmp_path_factory, data)
    assert len(planned) == SHARDS * PER_SHARD
    drivers: list[injection.Driver] = []

    def start(**faults) -> injection.Driver:
        spec = injection.write_spec(tmp_path / "job.yaml", data)
        log = tmp_path / f"driver-{len(drivers)}.log"
        driver = injection.start_driver(spec, ray_cluster, log, **faults)
        drivers.append(driver)
        return driver

    yield data, out, planned, clean, start
    for driver in drivers:
        driver.kill()


@pytest.mark.slow
def test_killed_while_planning(job, tmp_path: Path) -> None:
    data, out, planned, clean, start = job
    marker = tmp_path / "paused.json"
    driver = start(driver_faults={
        "pause_before_write": {"path": commit.PLAN, "marker": str(marker)}})
    injection.wait_for(marker.exists, driver, "the driver to pause while planning")
    # Killed right after the resolved spec was written: no plan, no fingerprint, no shard.
    assert (out / commit.SPEC).exists() and (out / commit.LOCK).exists()
    assert not (out / commit.PLAN).exists() and not (out / commit.FINGERPRINT).exists()
    assert not (out / "data").exists() and not (out / "manifests").exists()
    driver.kill()

    resumed = _resume(data)  # the dead driver's lease is taken over (its pid is gone)
    assert resumed.start == 0 and resumed.tally.new_samples == len(planned)
    injection.assert_same_as_clean(out, planned, clean)


@pytest.mark.slow
def test_killed_mid_job(job) -> None:
    data, out, planned, clean, start = job
    # Each batch is slowed down so that the kill lands while shards are in flight.
    driver = start(worker_faults={"slow_augment": {"seconds": 0.5}})
    injection.wait_for(lambda: len(_manifests(out)) >= 2, driver, "two committed shards")
    driver.kill()
    at_kill = _manifests(out)
    assert 2 <= len(at_kill) < SHARDS, "the kill must land mid-job"
    status = _status(out)
    assert status["state"] == "incomplete"  # the lease's driver is dead
    assert status["shards_committed"] >= len(at_kill)

    resumed = _resume(data)
    # Committed shards were counted, not redone; the rest was done once.
    assert resumed.start >= len(at_kill) * PER_SHARD
    assert resumed.start + resumed.tally.new_samples == len(planned)
    injection.assert_same_as_clean(out, planned, clean)


@pytest.mark.slow
def test_killed_between_data_and_manifest(job, tmp_path: Path) -> None:
    data, out, planned, clean, start = job
    marker, shard = tmp_path / "paused.json", "part-00003"
    driver = start(worker_faults={
        "pause_before_manifest": {"shard": shard, "marker": str(marker)}})
    # The write of this shard stops between its data object and its manifest. (Other shards
    # may still commit meanwhile; on 2 CPUs Ray Data mostly runs one write at a time, so the
    # paused one holds the others back.)
    injection.wait_for(marker.exists, driver, f"{shard} to pause before its manifest")
    orphan = out / "data" / f"{shard}.parquet"
    assert orphan.exists() and shard not in _manifests(out)
    orphan_bytes, orphan_inode = orphan.read_bytes(), orphan.stat().st_ino
    # The orphan is never counted: status counts committed shards only, and verify names it.
    before = _manifests(out)
    status = _status(out)
    after = _manifests(out)
    assert status["state"] == "running"
    assert len(before) <= status["shards_committed"] <= len(after) and shard not in after
    assert status["samples_committed"] == status["shards_committed"] * PER_SHARD
    breaches = _verify(out)
    assert f"orphan object data/{shard}.parquet" in breaches
    assert f"shard {shard} is not committed" in breaches
    assert not any("appears" in b or "mismatch" in b for b in breaches)
    driver.kill()
    at_kill = _manifests(out)
    assert shard not in at_kill and _status(out)["state"] == "incomplete"
    assert f"data/{shard}.parquet" in injection.uncommitted_objects(out)

    resumed = _resume(data)
    # Committed shards were counted, not redone; the orphan was not trusted: its shard was
    # written again (same bytes, a new file) and then committed by its manifest.
    assert resumed.start >= len(at_kill) * PER_SHARD
    assert resumed.start + resumed.tally.new_samples == len(planned)
    assert orphan.stat().st_ino != orphan_inode and orphan.read_bytes() == orphan_bytes
    assert shard in _manifests(out)
    injection.assert_same_as_clean(out, planned, clean)  # no orphan left


@pytest.mark.slow
def test_killed_during_final_summary(job, tmp_path: Path, ray_cluster: str) -> None:
    data, out, planned, clean, start = job
    marker = tmp_path / "paused.json"
    driver = start(driver_faults={"pause_in_summary": {"marker": str(marker)}})
    injection.wait_for(marker.exists, driver, "the driver to pause in its final summary")
    # Every shard is committed, but the job has not finished: no _SUCCESS.
    assert _manifests(out) == {f"part-{i:05d}" for i in range(SHARDS)}
    assert not (out / commit.SUCCESS).exists()
    driver.kill()
    status = _status(out)
    assert status["state"] == "incomplete"
    assert status["samples_committed"] == len(planned)
    assert _verify(out) == ["no _SUCCESS: the job has not finished"]

    # `rayaug resume OUT`, as a user would: nothing is redone, the summary is written.
    rayaug = Path(sys.executable).parent / "rayaug"
    resumed = subprocess.run(
        [str(rayaug), "resume", str(out), "--address", ray_cluster, "--json"],
        capture_output=True, text=True, timeout=300, env=injection.python_env(),
    )
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    summary = json.loads(resumed.stdout)
    assert summary["samples"] == len(planned) and summary["samples_this_run"] == 0
    injection.assert_same_as_clean(out, planned, clean)
    assert os.path.getsize(out / commit.SUCCESS) > 0
