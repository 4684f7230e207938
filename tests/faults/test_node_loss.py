"""Fault 2: a worker node of a multi-node cluster is lost mid-job; the job finishes on the rest.

`ray.cluster_utils.Cluster` on loopback: a head with no CPU (it holds only the driver) and two
worker nodes with 2 CPUs each, so every actor and task runs on a worker node. One actor hangs in
the middle of its second batch (the job's worker_process_setup_hook, once, marker file naming
its node); once that has happened and a shard is committed, that actor's node is removed (all
its processes SIGKILLed: raylet, object store, the actor). The job must complete on the other
node through Ray's actor restarts and task retries, with the output of an uninterrupted run.
Ray's default health checks are kept: the GCS declares the node dead only ~15 s later, and
until then every retry of the lost actor's tasks fails at once (this is the test that showed a
finite `max_task_retries` failing the whole job; see `rayaug.job._pipeline`).

The cluster and its driver run in their own process (`python -m faults.injection node-loss`),
not in pytest's: pytest already holds a `ray.init` to the session Ray and a process can drive
only one Ray (run_job would use the session one), and `Cluster` also changes process-wide Ray
state (the recorded cluster address, exit hooks) that the session Ray's tests must not see.
That process shuts the cluster down whatever happens; its node processes share its fate (Ray's
kernel fate-sharing), and the finalizer here kills any that would still be alive.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from faults import injection


@pytest.mark.slow
def test_worker_node_lost_mid_job(
    ray_cluster: str, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    source, planned = injection.shared_input(tmp_path_factory)
    out = tmp_path / "out"
    data = injection.spec_data(source, out, concurrency=2, cpus_per_actor=0.5)
    clean = injection.clean_digests(tmp_path_factory, data)  # on the session Ray
    records, report_file, pids = tmp_path / "calls", tmp_path / "report.json", tmp_path / "pids"
    records.mkdir()
    faults = {
        "slow_augment": {"seconds": 0.3},  # shards stay in flight on both nodes
        "hang_actor": {"call": 2, "marker": str(tmp_path / "hung.json")},
        "record_actor_nodes": {"dir": str(records)},
    }
    script = injection.start(
        [
            "node-loss",
            str(injection.write_spec(tmp_path / "job.yaml", data)),
            "--out",
            str(out),
            "--report",
            str(report_file),
            "--pids",
            str(pids),
            "--worker-faults",
            json.dumps(faults),
            "--timeout",
            "240",
        ],
        tmp_path / "cluster.log",
    )
    try:
        assert script.wait(timeout=420) == 0, script.stderr()
    finally:
        script.kill()
        leftovers = injection.kill_survivors(pids)
    assert leftovers == [], "the cluster's processes outlived its shutdown"

    report = json.loads(report_file.read_text())
    assert "remover_error" not in report, report
    removed = report["removed_node"]
    survivor = next(node for node in report["worker_nodes"] if node != removed)
    assert removed not in report["nodes_alive_at_end"]
    assert survivor in report["nodes_alive_at_end"]
    # The node went while its actor was in the middle of a batch, after other shards had
    # been committed; that batch was lost with it and done again on the surviving node.
    hung = report["hung_shards"]
    assert hung and not set(hung) & set(report["manifests_at_removal"])
    redone = {
        shard
        for node, shard, at in injection.actor_calls(records)
        if node == survivor and at > report["removed_at"]
    }
    assert set(hung) <= redone
    # The job finished on the remaining node: every shard committed once, bytes of a clean run.
    summary = report["summary"]
    assert summary["samples"] == summary["samples_this_run"] == len(planned)
    injection.assert_same_as_clean(out, planned, clean)
