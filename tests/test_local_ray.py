"""The embedded Ray (`rayaug.local_ray`): what the node `rayaug run` starts has, what it leaves
out, and that Ray's own functions are back once it is up."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from rayaug import local_ray
from rayaug.local_ray import node_registration_polled, worker_allocators

# A driver of its own (the test process holds the shared Ray): runs the job on an embedded Ray
# and notes, at every commit, the class of every actor that Ray has seen start (a pool that
# has finished its units is dead by the time the driver reads their rows).
ACTOR_WATCH = """
import json, sys
from ray._private.state import state
from rayaug import api

class Watch:
    seen = set()

    def started(self, tally):
        pass

    def committed(self, tally):
        self.seen.update(a["ActorClassName"] for a in state.actor_table(None).values())

summary = api.run(sys.argv[1], progress=Watch())
print(json.dumps({"samples": summary.tally.samples, "actors": sorted(Watch.seen)}))
"""


def test_an_embedded_run_starts_only_its_pool_actors(photo_folder: Path, tmp_path: Path) -> None:
    """Ray Data's stats, autoscaling-coordinator and actor-location actors serve nothing on a
    node of rayaug's own (no dashboard, no metrics, no autoscaler, one node) and cost three
    processes importing Ray Data at start-up and about 300 MiB: a local run has none."""
    job = tmp_path / "job.yaml"
    spec = {
        "input": {"uri": str(photo_folder)},
        "output": {"uri": str(tmp_path / "out"), "shard_size": 6},
        "views": 2,
        "ops": [{"name": "random_resized_crop", "size": 32}, {"name": "horizontal_flip"}],
        "execution": {"concurrency": 2},
    }
    job.write_text(yaml.safe_dump(spec))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    done = subprocess.run(
        [sys.executable, "-c", ACTOR_WATCH, str(job)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["samples"] == 48
    assert report["actors"] == ["MapWorker(MapBatches(_ShardStage))"]


def test_the_local_rays_workers_run_at_the_drivers_priority(ray_cluster: str) -> None:
    """Ray renices its workers by 15. On a machine rayaug shares, a busy process then took
    nearly all of the pool actors' CPU: 33 samples/s beside three busy processes on two cores,
    552 at the driver's priority. The Ray that rayaug starts keeps its workers there."""
    import ray

    @ray.remote
    def niceness() -> int:
        return os.nice(0)

    assert ray.get(niceness.remote()) == os.nice(0)


def test_the_local_nodes_workers_allocate_arrow_from_malloc(ray_cluster: str) -> None:
    """What a shard actor's process gets on the node `start_local_ray` started: Arrow's pool
    and glibc's arenas are read as a process starts, so only the environment can set them."""
    import ray

    @ray.remote
    def allocators() -> tuple[str, str | None]:
        import pyarrow

        return pyarrow.default_memory_pool().backend_name, os.environ.get("MALLOC_ARENA_MAX")

    users = os.environ.get("ARROW_DEFAULT_MEMORY_POOL"), os.environ.get("MALLOC_ARENA_MAX")
    assert ray.get(allocators.remote()) == (users[0] or "system", users[1] or "2")


def test_the_local_node_starts_with_the_workers_allocators_and_the_callers_env_is_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The node's processes inherit two malloc arenas and Arrow on malloc while it starts; the
    caller's own environment is as it was afterwards, and a value the user set is theirs."""
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    monkeypatch.delenv("ARROW_DEFAULT_MEMORY_POOL", raising=False)
    with worker_allocators():
        assert os.environ["MALLOC_ARENA_MAX"] == "2"
        assert os.environ["ARROW_DEFAULT_MEMORY_POOL"] == "system"
    assert "MALLOC_ARENA_MAX" not in os.environ
    assert "ARROW_DEFAULT_MEMORY_POOL" not in os.environ
    monkeypatch.setenv("MALLOC_ARENA_MAX", "8")
    with worker_allocators():
        assert os.environ["MALLOC_ARENA_MAX"] == "8"
        assert os.environ["ARROW_DEFAULT_MEMORY_POOL"] == "system"
    assert os.environ["MALLOC_ARENA_MAX"] == "8"
    assert "ARROW_DEFAULT_MEMORY_POOL" not in os.environ


def test_the_local_nodes_registration_is_awaited_only_while_ray_starts(ray_cluster: str) -> None:
    """Ray's own node lookup runs once the node is registered (it sleeps a whole second
    between its tries), and only within ray.init: Ray's function is back afterwards."""
    import ray
    from ray._private import services

    ray_get_node = services.get_node
    node_id = ray.get_runtime_context().get_node_id()
    with node_registration_polled():
        assert services.get_node is not ray_get_node
        assert services.get_node(ray_cluster, node_id)["node_id"] == node_id
    assert services.get_node is ray_get_node


def test_a_node_that_never_registers_is_left_to_rays_own_lookup(
    ray_cluster: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wait for a node the GCS never lists ends at its deadline, without an error of its
    own: what to say of the missing node is left to Ray's lookup that follows."""
    monkeypatch.setattr(local_ray, "REGISTRATION_WAIT_S", 0.2)
    started = time.monotonic()
    local_ray._wait_for_registration(ray_cluster, "ff" * 28)
    assert time.monotonic() - started >= 0.2


def test_the_local_nodes_agents_are_rayaugs_stand_ins_where_it_has_no_work_for_rays(
    ray_cluster: str,
) -> None:
    """Without a dashboard, the node's dashboard agent is rayaug's stand-in: its ports not
    served. The session's node was given a runtime_env (the tests' own), so its runtime-env
    agent is Ray's, which serves it. Ray's function that builds the agents' commands is Ray's
    own again once the node is up, and so is its check of the dashboard's dependencies."""
    import ray
    from ray._private import services
    from ray._private import utils as ray_utils

    node = ray._private.worker._global_node
    logs = Path(node.get_logs_dir_path())
    assert (node.metrics_agent_port, node.dashboard_agent_listen_port) == (-1, -1)
    assert "rayaug: no dashboard" in (logs / "dashboard_agent.out").read_text()
    assert "Starting runtime env agent" in (logs / "runtime_env_agent.log").read_text()
    python_command = services._build_python_executable_command_memory_profileable
    assert getattr(python_command, "__module__", None) == services.__name__
    assert ray_utils.get_dashboard_dependency_error is not local_ray._no_dashboard


# A node started as `rayaug run` starts it (no runtime_env): a plain task runs, a task that asks
# for a runtime_env is refused by the stand-in in plain words; prints what it saw as JSON.
LOCAL_NODE_RUN = """
import json, ray
from rayaug.local_ray import QUIET, start_local_ray
start_local_ray(include_dashboard=False, **QUIET)
@ray.remote
def variable():
    import os
    return os.environ.get("RAYAUG_TEST_VARIABLE")
try:
    ray.get(variable.options(runtime_env={"env_vars": {"RAYAUG_TEST_VARIABLE": "1"}}).remote())
    refusal = None
except ray.exceptions.RuntimeEnvSetupError as error:
    refusal = str(error)
print(json.dumps({
    "plain": ray.get(variable.remote()),
    "refusal": refusal,
    "logs": ray._private.worker._global_node.get_logs_dir_path(),
}))
ray.shutdown()
"""


def test_a_local_node_without_runtime_env_runs_tasks_and_refuses_one_in_plain_words() -> None:
    from rayaug import node_agents

    environment = {name: value for name, value in os.environ.items() if "RAY" not in name}
    done = subprocess.run(
        [sys.executable, "-c", LOCAL_NODE_RUN],
        capture_output=True,
        text=True,
        timeout=180,
        env=environment,
        check=True,
    )
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["plain"] is None
    assert node_agents.REFUSAL in seen["refusal"]
    agent_log = (Path(seen["logs"]) / "runtime_env_agent.out").read_text()
    assert "rayaug: refused" in agent_log


@pytest.mark.parametrize(
    ("address", "loopback"),
    [
        ("localhost:6379", True),
        ("127.0.0.1:6379", True),
        ("ray://127.0.0.1:10001", True),
        ("127.0.0.2:6379", True),
        ("[::1]:6379", True),
        ("10.0.0.5:6379", False),
        ("head.example.com:6379", False),
        ("auto", False),
        (None, False),
    ],
)
def test_a_loopback_address_is_told_from_a_clusters(address: str | None, loopback: bool) -> None:
    """`rayaug run --address` keeps Ray on loopback for this machine's own addresses only, and
    `rayaug submit` sends the local token to those alone: both ask the same question."""
    assert local_ray._is_loopback_address(address) is loopback


def test_a_url_hostname_is_loopback_as_an_address_is() -> None:
    """`rayaug submit` asks with a URL's hostname: IPv6 without brackets, any case."""
    assert all(map(local_ray.is_loopback_host, ["::1", "LOCALHOST", "127.8.9.10"]))
    assert not any(map(local_ray.is_loopback_host, ["", "::2", "192.168.1.1", "ray-head"]))
