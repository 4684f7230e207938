"""Fault 1: the augment actor's process dies mid-batch; Ray restarts it and retries the batch.

Injected for real, with no hook in rayaug: the job's `worker_process_setup_hook` patches the
actor's per-batch call in every worker of that job so that its k-th call augments the batch
and then `os._exit(1)`s before returning it, once (a marker file). The driver is a subprocess
joined to the session Ray with that runtime_env, so no other test's workers are touched.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from faults import injection


def _dead(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.slow
def test_actor_killed_mid_batch_costs_only_that_batch(
    ray_cluster: str, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    source, planned = injection.shared_input(tmp_path_factory)
    out = tmp_path / "out"
    data = injection.spec_data(source, out, concurrency=1)
    clean = injection.clean_digests(tmp_path_factory, data)
    marker = tmp_path / "crashed.json"
    crash = {"crash_actor": {"call": 3, "marker": str(marker)}}

    driver = injection.start_driver(
        injection.write_spec(tmp_path / "job.yaml", data),
        ray_cluster,
        tmp_path / "driver.log",
        worker_faults=crash,
    )
    try:
        assert driver.wait(timeout=300) == 0, driver.stderr()
    finally:
        driver.kill()

    # The fault fired: the only actor died (its process is gone) holding a whole shard.
    assert marker.exists(), "the actor never reached its 3rd call"
    crashed = json.loads(marker.read_text())
    assert len(crashed["shards"]) == 1 and _dead(crashed["pid"])
    shard = crashed["shards"][0]
    # The job went on through the restarted actor: the lost shard was redone and committed
    # once, with the same bytes as an uninterrupted run; no sample lost, none twice.
    assert (out / "manifests" / f"{shard}.parquet").exists()
    injection.assert_same_as_clean(out, planned, clean)
    summary = driver.summary()
    assert summary["samples"] == summary["samples_this_run"] == len(planned)
    assert summary["shards"] == len(planned) // (2 * injection.VIEWS)
