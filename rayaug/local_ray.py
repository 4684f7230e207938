"""The embedded Ray: the single local node `rayaug run` starts where no cluster is named.

It starts in a thread beside the planning (`LocalRayStart`), registers 127.0.0.1 and listens
on loopback only (`ray_on_loopback`), and leaves out what one node of rayaug's own has no use
for (`start_local_ray`): Ray's log monitor, autoscaler monitor and API server, its agents'
imports of Ray (`rayaug.node_agents` stands in for them), metrics, Ray's second-long wait for
its raylet, and, while a run lasts, Ray Data's helper actors (`lean_data_on_local_node`).
What it changes in Ray (a flag, a few of Ray's functions) it changes only while Ray starts or
the run lasts: a process that later joins a cluster gets Ray as it is. `rayaug.job` wires it
in; joining a cluster (`--address`) uses only `ray_on_loopback`, for a loopback address.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from rayaug import allocator
from rayaug.errors import JobFailed, RayaugError, root_cause

if TYPE_CHECKING:
    from ray.data._internal.execution.interfaces.execution_options import ExecutionResources

# The CLI draws its own progress; Ray's start-up chatter would bury it.
QUIET = {"log_to_driver": False, "logging_level": logging.ERROR}


class LocalRayStart:
    """The embedded Ray, started in a thread of its own while the driver plans.

    `ray.init` of a local node waits seconds for its processes (GCS, raylet, agents) to come
    up, mostly on the other core; the driver plans meanwhile, and the same thread imports Ray
    Data after it, before the driver needs it.
    `wait()` returns once Ray is up (True: this run owns it), or raises what starting it
    raised; `stop()` shuts Ray down (from the calling thread) and lets the starter end.

    The starter thread lives until then: Ray ties its GCS and raylet to the thread that
    spawned them (Linux's parent-death signal is per thread), so a starter that returned
    would kill the node under the run.
    """

    def __init__(self) -> None:
        self._error: BaseException | None = None
        self._up = threading.Event()
        self._release = threading.Event()
        self._stopped = False
        self._thread = threading.Thread(target=self._start, name="rayaug-ray-start", daemon=True)

    @classmethod
    def begin(cls) -> LocalRayStart:
        starting = cls()
        _exit_on_sigterm()  # ray.init sets this only from the main thread
        starting._thread.start()
        return starting

    def _start(self) -> None:
        try:
            start_local_ray(include_dashboard=False, **QUIET)
            import ray.data  # noqa: F401 - its import (≈ 0.5 s) is off the driver's path too
        except BaseException as error:  # noqa: BLE001 - handed to the waiting thread
            self._error = error
        finally:
            self._up.set()
        self._release.wait()  # keep the node's processes' parent alive until stop()

    def wait(self) -> bool:
        self._up.wait()
        if isinstance(self._error, RayaugError | KeyboardInterrupt | SystemExit):
            raise self._error
        if self._error is not None:  # Ray's own (a node that did not come up in time): one line
            raise JobFailed(
                f"the embedded Ray did not start: {root_cause(self._error)}"
            ) from self._error
        return True

    def stop(self) -> None:
        """Shut the Ray down (once its start has finished) and end the starter thread."""
        if self._stopped:
            return
        self._stopped = True
        self._up.wait()
        try:
            import ray

            if ray.is_initialized():
                ray.shutdown()
        finally:
            self._release.set()
            self._thread.join()


def _exit_on_sigterm() -> None:
    """What ray.init does from the main thread: SIGTERM ends the driver through SystemExit,
    so that its `finally` blocks (the lease, Ray's shutdown) run."""
    import signal

    if threading.current_thread() is not threading.main_thread():
        return

    def exit_on_sigterm(signum, frame):
        raise SystemExit(signum)

    if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, exit_on_sigterm)


def is_loopback_host(host: str) -> bool:
    """Whether `host` (a name, or an address; IPv6 with or without its brackets) is this
    machine's loopback: `localhost`, 127.0.0.0/8 or ::1."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _is_loopback_address(address: str | None) -> bool:
    if address is None:
        return False
    return is_loopback_host(address.split("://", 1)[-1].rsplit(":", 1)[0])


@contextlib.contextmanager
def ray_on_loopback(address: str | None = "local") -> Iterator[None]:
    """While Ray starts or joins at a loopback address, keep it there.

    Ray 2.60 on Linux rewrites 127.0.0.1 (as `_node_ip_address` or in an address) to the
    machine's network address (`services.resolve_ip_for_localhost`) unless its "cluster mode"
    is off, and a node registered under that address listens on it, on 0.0.0.0 and on `*`.
    Cluster mode is a flag Ray reads once, at import, from RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER;
    turning the flag off in this process for the length of `ray.init` is enough: every process
    Ray spawns then gets 127.0.0.1 from the driver (proven by tests/test_loopback.py in a
    network namespace), and nothing in the user's environment changes. An address that is
    not loopback (a real cluster) is left to Ray as it was.
    """
    if address is not None and address != "local" and not _is_loopback_address(address):
        yield
        return
    from ray._private import ray_constants

    if not hasattr(ray_constants, "ENABLE_RAY_CLUSTER"):  # a Ray that moved the flag
        raise RayaugError(
            "this Ray version cannot be kept on loopback by rayaug (ray_constants."
            "ENABLE_RAY_CLUSTER is gone); refusing to start a Ray that listens on the network"
        )
    saved = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved


# Ray's RayConfig for a single-node Ray of rayaug's own, for every process of the node:
# - no metrics collection and export (a thread in every worker, the agents' exporters);
# - no task events: they feed only the dashboard and the state API (`ray list tasks`), which
#   this node does not serve, and the driver's core worker flushed them as it shut down: from
#   the last commit to the run's exit 0.21-0.42 s (median 0.39) against 0.12-0.37 s (0.17)
#   without, six paired runs;
# - the workers the raylet starts ahead (one per CPU, which the pool's actors then take) import
#   Ray Data and the stage's modules as they start (rayaug.augment named apart: rayaug.job
#   leaves it to the actor, so that the driver never imports it), while the driver still
#   builds its pipeline, rather than once they are given an actor: first commit 0.25 s earlier
#   (six paired runs);
# - workers at the driver's own priority: Ray renices them by 15, and on a machine the job
#   shares any busy process then took nearly all of the pool actors' CPU (20,000 views at 33
#   samples/s beside three busy processes on two cores, 552 at the driver's priority).
LOCAL_SYSTEM_CONFIG = {
    "enable_metrics_collection": False,
    "task_events_report_interval_ms": 0,
    "preload_python_modules": ["ray.data", "rayaug.job", "rayaug.augment"],
    "worker_niceness": 0,
}


@contextlib.contextmanager
def lean_head_node(include_dashboard: bool, with_runtime_env: bool) -> Iterator[None]:
    """While ray.init starts a local head node, leave out the processes nobody uses there.

    - the log monitor: it forwards workers' output to the driver, which rayaug turns off
      (`log_to_driver=False`); the output stays in the session's log files;
    - the autoscaler's monitor: one fixed node has nothing to scale;
    - without a dashboard, the API server Ray starts anyway (for usage stats and the Jobs
      API: a local run submits no job, and usage stats are off for rayaug's runs);
    - without a dashboard, Ray's dashboard agent, and without a `runtime_env`, Ray's
      runtime-env agent: each is a process that imports Ray for work this node does not have,
      while the raylet waits for its ports before it registers. `rayaug.node_agents` stands
      in for them;
    - without a dashboard, the driver's import of the dashboard's dependencies (aiohttp,
      OpenCensus, Prometheus' client: 24 MiB), which Ray makes only to learn that they import.
    Ray 2.60's ray.init has no parameter for these (RayParams has, for `ray start`, but not
    for the agents), so the three start methods of the node are skipped, the agents'
    commands run the stand-ins and the dependencies are said to be missing, for the length of
    ray.init only.
    """
    from ray._private import node, ray_constants, services
    from ray._private import utils as ray_utils

    from rayaug import node_agents  # here: the actors, which import this module, need none of it

    skipped = ["start_log_monitor", "start_monitor"]
    stand_ins = {}
    replaced = []
    if not include_dashboard:
        skipped.append("start_api_server")
        stand_ins[ray_constants.PROCESS_TYPE_DASHBOARD_AGENT] = node_agents.command(
            node_agents.DASHBOARD
        )
        replaced.append((ray_utils, "get_dashboard_dependency_error", _no_dashboard))
    if not with_runtime_env:
        stand_ins[ray_constants.PROCESS_TYPE_RUNTIME_ENV_AGENT] = node_agents.command(
            node_agents.RUNTIME_ENV
        )
    python_command = services._build_python_executable_command_memory_profileable
    replaced.append(
        (
            services,
            "_build_python_executable_command_memory_profileable",
            functools.partial(_agent_command, python_command, stand_ins),
        )
    )
    replaced += [(node.Node, name, _does_nothing) for name in skipped]
    with attributes_replaced(replaced):
        yield


def _does_nothing(*args: object, **kwargs: object) -> None:
    """In place of a function or method of Ray's whose work the local node does not need."""
    return None


def _no_dashboard() -> str:
    return "rayaug's local node runs no dashboard"


def _agent_command(
    python_command: Callable[..., list[str]],
    stand_ins: dict[str, list[str]],
    component: str,
    *args: object,
    **kwargs: object,
) -> list[str]:
    """Ray's Python command for a process of the node (`python -u`, or memray's), with the
    stand-in's script and its agent for a component of `stand_ins` (Ray appends its own script
    and arguments after them)."""
    return python_command(component, *args, **kwargs) + stand_ins.get(component, [])


@contextlib.contextmanager
def attributes_replaced(replacements: list[tuple[object, str, object]]) -> Iterator[None]:
    """Each (owner, name, stand-in) in place of the owner's own attribute (a module's, or a
    class's as it is stored: a staticmethod stays one), the originals back afterwards."""
    saved = [(owner, name, vars(owner)[name]) for owner, name, _ in replacements]
    for owner, name, stand_in in replacements:
        setattr(owner, name, stand_in)
    try:
        yield
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)


# How often the driver asks the GCS whether the local raylet has registered, and for how long
# at most (Ray's own raylet_start_wait_time_s); Ray's own loop then returns at once.
REGISTRATION_POLL_S = 0.02
REGISTRATION_WAIT_S = 30.0


@contextlib.contextmanager
def node_registration_polled() -> Iterator[None]:
    """While ray.init starts a local node, the driver learns at once when its raylet registers.

    Ray 2.60's ray.init asks the GCS for the new node 0.1 s after starting the raylet and, if
    it is not registered yet, asks again a whole second later (GlobalStateAccessor::GetNode
    sleeps 1 s between tries). The raylet registers only once its two agents are up, about
    0.5 s after it starts here: the driver then waited 0.6 s for nothing, and the prestarted
    workers, which the raylet starts as the driver connects, with it. Here the driver polls
    every REGISTRATION_POLL_S before Ray's first try, so that try finds the node."""
    from ray._private import services

    ray_get_node = services.get_node

    def get_node(gcs_address: str, node_id: str) -> dict:
        _wait_for_registration(gcs_address, node_id)
        return ray_get_node(gcs_address, node_id)

    with attributes_replaced([(services, "get_node", get_node)]):
        yield


def _wait_for_registration(gcs_address: str, node_id: str) -> None:
    """Return once the GCS at `gcs_address` lists node `node_id` or REGISTRATION_WAIT_S has
    passed; Ray's own lookup that follows reports a node that never came."""
    from ray._raylet import GcsClient

    client = GcsClient(address=gcs_address)
    deadline = time.monotonic() + REGISTRATION_WAIT_S
    while time.monotonic() < deadline:
        if any(node.hex() == node_id for node in client.get_all_node_info(timeout=1)):
            return
        time.sleep(REGISTRATION_POLL_S)


class _Discarded:
    """A helper actor's method that a one-node Ray has no use for: its calls go nowhere."""

    remote = staticmethod(_does_nothing)


class _OneNodeLocations:
    """Ray Data's actor-location tracker on a one-node Ray: every actor is on that node.

    Passed to each pool actor (pickled by reference), which reports its node to it."""

    update_actor_location = _Discarded()


class _FixedNode:
    """Ray Data's cluster autoscaler for a node that does not grow: its budget is the node.

    Ray Data's own asks an autoscaling-coordinator actor to reserve resources for it and
    relays its requests to the cluster's autoscaler; rayaug's node runs no autoscaler
    (`lean_head_node`), and the coordinator would reserve the whole node for the one job."""

    def __init__(self, resources: dict[str, float]) -> None:
        from ray.data._internal.execution.interfaces.execution_options import (
            ExecutionResources,
        )

        self._total = ExecutionResources.from_resource_dict(resources)

    def try_trigger_scaling(self) -> None:
        return None

    def on_executor_shutdown(self) -> None:
        return None

    def get_total_resources(self) -> ExecutionResources:
        return self._total


@contextlib.contextmanager
def lean_data_on_local_node(resources: dict[str, float]) -> Iterator[None]:
    """While Ray Data runs a job on the node rayaug started, do without its helper actors.

    For an actor pool Ray Data 2.60 starts three actors of its own, each a worker process that
    imports Ray Data (about 100 MiB of memory, a second of a core at start-up, on a 2-core
    machine while the pool's actors import it too) and none of use to a single local node:
    - the stats actor keeps per-dataset metrics for the dashboard and Prometheus: a local run
      has no dashboard and collects no metrics (LOCAL_SYSTEM_CONFIG);
    - the autoscaling coordinator (`_FixedNode`): the node does not grow;
    - the actor-location tracker (`_OneNodeLocations`): every actor is on the one node, which
      Ray Data also learns from each actor as it comes up (its `get_location`).
    The stand-ins are installed on Ray Data's modules for the length of the run only: a
    process that later joins a cluster gets Ray Data as it is. A Ray Data whose names differ
    (another version) is left as it is too: the helper actors then start as before.
    """
    try:
        from ray.data._internal.execution import streaming_executor
        from ray.data._internal.execution.operators import actor_pool_map_operator as pool
        from ray.data._internal.stats import _StatsManager
    except ImportError:
        yield
        return

    replaced = [
        (streaming_executor, "create_cluster_autoscaler", lambda *a, **k: _FixedNode(resources)),
        (pool, "get_or_create_actor_location_tracker", _OneNodeLocations),
        (pool, "get_actor_locations", lambda logical_ids: {}),
        (_StatsManager, "register_dataset_to_stats_actor", staticmethod(_does_nothing)),
        (_StatsManager, "update_execution_metrics", staticmethod(_does_nothing)),
        (_StatsManager, "update_iteration_metrics", staticmethod(_does_nothing)),
    ]
    if not all(name in vars(owner) for owner, name, _ in replaced):
        yield
        return
    with attributes_replaced(replaced):
        yield


def start_local_ray(**init_args: object) -> None:
    """Start a fresh Ray of this process's own that registers 127.0.0.1 and listens on
    loopback only (its dashboard, if asked for, on 127.0.0.1 too); raises if Ray would not.
    It runs without the processes and the metrics a single local node does not need
    (`lean_head_node`, LOCAL_SYSTEM_CONFIG), and without Ray's second-long wait for its raylet
    (`node_registration_polled`)."""
    import ray

    system_config = {**LOCAL_SYSTEM_CONFIG, **init_args.pop("_system_config", {})}
    include_dashboard = bool(init_args.get("include_dashboard"))
    with (
        ray_on_loopback(),
        lean_head_node(include_dashboard, with_runtime_env=bool(init_args.get("runtime_env"))),
        node_registration_polled(),
        worker_allocators(),
    ):
        ray.init(
            _system_config=system_config,
            # "local": always a fresh Ray of our own. Without it, ray.init joins the cluster
            # recorded in /tmp/ray/ray_current_cluster, which a killed rayaug leaves behind
            # pointing at a dead GCS: the next run (its resume) hung connecting to it.
            address="local",
            _node_ip_address="127.0.0.1",
            dashboard_host="127.0.0.1",
            **init_args,
        )
    node_ip = ray.util.get_node_ip_address()
    if node_ip != "127.0.0.1":  # a Ray upgrade that resolves loopback elsewhere
        ray.shutdown()
        raise RayaugError(
            f"the embedded Ray registered {node_ip} instead of 127.0.0.1; refusing to run a "
            "Ray that listens on the network (use --address to join a cluster)"
        )


@contextlib.contextmanager
def worker_allocators() -> Iterator[None]:
    """While ray.init starts the local node, `allocator.worker_environment()` in the environment
    its processes inherit; this process's own environment is as it was afterwards."""
    added = allocator.worker_environment()
    os.environ.update(added)
    try:
        yield
    finally:
        for name in added:
            del os.environ[name]
