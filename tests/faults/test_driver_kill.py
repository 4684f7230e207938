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
import random
import subprocess
import sys
import time
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
    driver = start(
        driver_faults={"pause_before_write": {"path": commit.PLAN, "marker": str(marker)}}
    )
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
    driver = start(worker_faults={"pause_before_manifest": {"shard": shard, "marker": str(marker)}})
    # The write of this shard stops between its data object and its manifest. (Other shards
    # may still commit meanwhile; on 2 CPUs Ray Data mostly runs one write at a time, so the
    # paused one holds the others back.)
    injection.wait_for(marker.exists, driver, f"{shard} to pause before its manifest")
    orphan = out / "data" / "view=1" / f"{shard}.parquet"  # by_view: its last data object
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
    assert f"orphan object data/view=1/{shard}.parquet" in breaches
    assert f"shard {shard} is not committed" in breaches
    assert not any("appears" in b or "mismatch" in b for b in breaches)
    driver.kill()
    at_kill = _manifests(out)
    assert shard not in at_kill and _status(out)["state"] == "incomplete"
    assert f"data/view=1/{shard}.parquet" in injection.uncommitted_objects(out)

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
        capture_output=True,
        text=True,
        timeout=300,
        env=injection.python_env(),
    )
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    summary = json.loads(resumed.stdout)
    assert summary["samples"] == len(planned) and summary["samples_this_run"] == 0
    injection.assert_same_as_clean(out, planned, clean)
    assert os.path.getsize(out / commit.SUCCESS) > 0


SOAK_PHOTOS, SOAK_SHARDS = 40, 20  # 80 samples, 2 photos (4 samples) per shard


def _written(out: Path) -> set[tuple[str, int]]:
    """Every data, quarantine and manifest file with its modification time."""
    return {
        (str(p.relative_to(out)), p.stat().st_mtime_ns)
        for folder in ("data", "errors", "manifests")
        if (out / folder).exists()
        for p in (out / folder).rglob("*")
        if p.is_file()
    }


def _moment(out: Path, shards: int, before: set[tuple[str, int]]) -> str:
    """Which moment of the job a kill hit, read from what it left on disk (`before`: what
    was written before the killed driver started)."""
    if (out / commit.SUCCESS).exists():
        return "after the end (the job had finished)"
    committed = len(_manifests(out)) if (out / "manifests").exists() else 0
    orphans = injection.uncommitted_objects(out) if (out / "data").exists() else []
    if _written(out) == before and not orphans:
        return "start-up / planning (this driver had written no shard yet)"
    if committed == shards:
        return "during the final summary (every shard committed, no _SUCCESS)"
    if orphans:
        return f"between data and manifest ({len(orphans)} uncommitted, {committed} committed)"
    return f"mid-job ({committed} of {shards} shards committed)"


@pytest.mark.slow
def test_soak_of_five_kills_at_random_moments(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, ray_cluster: str
) -> None:
    """SIGKILL the driver at five random moments of one job in a row, resuming each time; the
    end is the uninterrupted run's output, sample for sample and byte for byte.

    Each kill comes at a random moment of its driver: a random time into its start-up and
    planning, or a random fraction of a second after a random one of its commits (leaving
    shards for the later kills), so the kills land in start-up, planning, shards in flight,
    between a data object and its manifest, or the summary, as chance has it. Each
    actor call is slowed by 0.3 s (no effect on the bytes) so that shards take long enough.
    RAYAUG_SOAK_SEED replays a draw; the moments hit are printed (pytest -s / -rA).
    """
    source = tmp_path_factory.mktemp("soak-input")
    planned = injection.make_input(source, count=SOAK_PHOTOS, seed=9)
    out = tmp_path / "out"
    data = injection.spec_data(source, out, concurrency=1)
    clean = injection.clean_digests(tmp_path_factory, data)
    spec = injection.write_spec(tmp_path / "job.yaml", data)
    slow = {"slow_augment": {"seconds": 0.3}}
    seed = int(os.environ.get("RAYAUG_SOAK_SEED", random.SystemRandom().randrange(2**32)))
    draw = random.Random(seed)
    moments: list[str] = []
    drivers: list[injection.Driver] = []
    try:
        for kill in range(5):
            # The first starts the job; every later one resumes it (`run` on its output).
            before = _written(out)
            driver = injection.start_driver(spec, ray_cluster, tmp_path / f"d{kill}.log", slow)
            drivers.append(driver)
            started = time.monotonic()
            committed = len(_manifests(out)) if (out / "manifests").exists() else 0
            left = SOAK_SHARDS - committed
            if left <= 2 or draw.random() < 0.3:  # somewhere in start-up or planning
                when = f"{draw.uniform(0.3, 3.0):.2f} s after start"
                due = started + float(when.split()[0])
                ready = lambda due=due: time.monotonic() >= due  # noqa: E731
            else:  # a random time after this driver's k-th commit, the job not yet over:
                # ~2 more shards commit while a kill is under way, and room is left for the
                # later kills. (The summary, a few ms after the last commit, is hit only by
                # chance; test_killed_during_final_summary hits it on purpose.)
                k = draw.randint(1, max(1, left - 2 - 3 * (4 - kill)))
                extra = draw.uniform(0.0, 0.4)
                when = f"{extra:.2f} s after its commit {k} of {left}"
                seen: list[float] = []

                def ready(target=committed + k, extra=extra, seen=seen) -> bool:
                    if not seen and len(_manifests(out)) >= target:
                        seen.append(time.monotonic())
                    return bool(seen) and time.monotonic() >= seen[0] + extra

            deadline = started + 240
            while not ready() and driver.alive() and time.monotonic() < deadline:
                time.sleep(0.01)
            assert driver.alive() or driver.process.returncode == 0, driver.stderr()
            driver.kill()
            moments.append(f"kill {kill + 1}, {when}: {_moment(out, SOAK_SHARDS, before)}")
        report = f"soak seed {seed}:\n  " + "\n  ".join(moments)
        print(report)

        final = injection.start_driver(spec, ray_cluster, tmp_path / "final.log")
        drivers.append(final)
        assert final.wait(timeout=300) == 0, f"{report}\n{final.stderr()}"
    finally:
        for driver in drivers:
            driver.kill()
    injection.assert_same_as_clean(out, planned, clean)
    verdict = subprocess.run(
        [str(Path(sys.executable).parent / "rayaug"), "inspect", str(out), "--verify"],
        capture_output=True,
        text=True,
        timeout=300,
        env=injection.python_env(),
    )
    assert verdict.returncode == 0, f"{report}\n{verdict.stdout}{verdict.stderr}"
