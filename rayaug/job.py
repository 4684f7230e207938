"""The driver: plan, wire the Ray Data stages, count commits, summarize.

The only module that calls Ray. Stages (read → augment → write) are the engine-free functions
of `sources`, `augment` and `sinks`; this module only adapts them to Ray Data rows.
Each work unit travels as one row to one actor, which reads, augments and writes its shard
whole; the shard's manifest commits it: a killed actor costs only its uncommitted shard.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import math
import os
import pickle
import sys
import threading
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from rayaug import allocator, commit, outputs
from rayaug.augment import Augmenter, pick_device
from rayaug.clouds import is_cloud
from rayaug.errors import JobFailed, RayaugError
from rayaug.partners import Partners
from rayaug.plan import JobPlan, pending_units, prepare, recorded_job, versions
from rayaug.sinks import ShardCommit, WriteContext, finish_output, orphans, write_shard
from rayaug.sources import ReadAhead, SourceIndex, WorkUnit, check_apart, stream_unit
from rayaug.spec import ExecutionSpec, JobSpec
from rayaug.spill import SpillFile
from rayaug.storage import Location, check_reachable, open_location

if TYPE_CHECKING:
    import ray.data
    from ray.data._internal.execution.interfaces.execution_options import ExecutionResources

    from rayaug.epochs import Epoch

log = logging.getLogger(__name__)

# Non-secret settings the workers need to reach storage the way the driver does. Credentials
# are deliberately absent: they must come from the workers' own environment.
FORWARDED_ENV = (
    "AWS_EC2_METADATA_DISABLED",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "STORAGE_EMULATOR_HOST",  # gs://: an emulator's address (no secret: it takes none)
    "AZURE_STORAGE_ACCOUNT_NAME",  # az://: the account's name (its key stays behind)
    "AZURE_STORAGE_ACCOUNT",
)
# Shards handed to an actor at once: the next is there when one ends, and with overlap_shards
# one's reads and writes wait on storage while another augments. A job with fewer shards than
# that fills (fewer than CALLS_PER_ACTOR per actor) gets one call per actor instead: the first
# actor ready would otherwise take two while another sat idle.
CALLS_PER_ACTOR = 2
# Source bytes a shard call reads ahead of its augmenting (sources.ReadAhead): a whole unit of
# 300-600 px photos (about 14 MB), 5 phone photos (half a second of their 8-view augmenting).
# Held twice per actor when its shards overlap (overlaps_shards); 64 MiB took a 12 MP job's
# peak PSS 100-220 MiB higher.
READ_AHEAD_BYTES = 16 << 20
# A poison input that kills its actor is retried this often before the job fails.
ACTOR_RESTARTS = 8
# How long a job of few units waits for its whole actor pool before dispatching (see _pipeline).
ACTORS_UP_TIMEOUT_S = 600
# A job with fewer units than this many rounds of calls per actor waits for its whole pool.
FEW_UNITS_ROUNDS = 2
# The CLI draws its own progress; Ray's start-up chatter would bury it.
QUIET = {"log_to_driver": False, "logging_level": logging.ERROR}


@dataclass(frozen=True)
class RunOptions:
    address: str | None = None  # a Ray cluster; None starts an embedded local Ray
    grow: bool = True  # may add views and new sources to the job recorded in the output


@dataclass
class Tally:
    """Commits counted so far (from earlier runs and this one)."""

    shards_total: int
    planned_samples: int | None
    shards: int = 0
    samples: int = 0
    quarantined: int = 0
    new_samples: int = 0
    reasons: Counter = field(default_factory=Counter)

    def add(self, shard: ShardCommit, new: bool) -> None:
        self.shards += 1
        self.samples += shard.samples
        self.quarantined += shard.quarantined
        self.new_samples += (shard.samples + shard.quarantined) if new else 0
        self.reasons.update(shard.reasons)

    def over_budget(self, max_error_rate: float, final: bool) -> bool:
        total = self.planned_samples if self.planned_samples is not None else None
        if total is None and final:
            total = self.samples + self.quarantined
        return total is not None and self.quarantined > max_error_rate * total


class Progress(Protocol):
    def started(self, tally: Tally) -> None: ...

    def committed(self, tally: Tally) -> None: ...


@dataclass(frozen=True)
class JobSummary:
    output: str
    tally: Tally
    startup_seconds: float
    wall_seconds: float
    orphans_removed: int
    ignored_inputs: int

    @property
    def throughput(self) -> float:
        return self.tally.new_samples / self.wall_seconds if self.wall_seconds else 0.0

    def to_json(self) -> dict:
        return {
            "output": self.output,
            "shards": self.tally.shards,
            "samples": self.tally.samples,
            "quarantined": self.tally.quarantined,
            "samples_this_run": self.tally.new_samples,
            "reasons": dict(self.tally.reasons),
            "startup_seconds": round(self.startup_seconds, 3),
            "wall_seconds": round(self.wall_seconds, 3),
            "samples_per_second": round(self.throughput, 2),
            "orphans_removed": self.orphans_removed,
            "ignored_inputs": self.ignored_inputs,
            "versions": versions(),
        }


def run_job(spec: JobSpec, options: RunOptions, progress: Progress) -> JobSummary:
    """Run (or resume) a job to completion; raises RayaugError subclasses for the CLI."""
    started = time.monotonic()
    source = open_location(spec.input.uri, spec.storage)
    out = open_location(spec.output.uri, spec.storage)
    check_reachable(source, must_exist=True)
    check_reachable(out, must_exist=False)
    check_apart(source, out)
    lease = commit.Lease(out)
    lease.acquire()
    # An embedded Ray starts in the background (stopped on every exit), as early as nothing
    # can refuse the run any more: on a fresh output beside the planning (the input's listing,
    # which can take long), else once the plan matches the recorded job and work is left.
    local = _starts_local_ray(options)
    fresh = not out.exists(commit.FINGERPRINT)
    local_ray = LocalRayStart.begin() if local and fresh else None
    try:
        plan = prepare(spec, source, out, options.grow)
        # One listing for both the count and the work left: a shard committed between two
        # listings (by a writer of a stopped run still finishing) would be neither.
        committed = commit.committed_shards(out)
        pending = pending_units(plan, committed)
        if local and pending and local_ray is None:
            local_ray = LocalRayStart.begin()  # beside the count of what is committed
        run = _Run(spec, plan, out, lease, _count_committed(plan, out, committed), progress)
        progress.started(run.tally)
        startup = time.monotonic() - started
        if pending:
            startup = run.execute(pending, options, started, local_ray)
        if run.tally.over_budget(spec.errors.max_error_rate, final=True):
            raise JobFailed(run.budget_message())
        removed = _finish(spec, out)
        wall = time.monotonic() - started
        summary = JobSummary(out.uri, run.tally, startup, wall, removed, plan.ignored)
        commit.write_json(out, commit.SUCCESS, summary.to_json())
    except BaseException:
        _release_after_failure(lease)
        raise
    finally:
        if local_ray is not None:
            local_ray.stop()  # done already by execute, else a run with nothing to execute
    lease.release()
    return summary


def _release_after_failure(lease: commit.Lease) -> None:
    """The job's own error is the news: a lease that cannot be released (storage is gone)
    expires by itself, and is taken over by the next run on this host at once."""
    try:
        lease.release()
    except RayaugError as error:
        log.warning("could not release the lease: %s", error)


def _count_committed(plan: JobPlan, out: Location, committed: set[str]) -> Tally:
    tally = Tally(len(plan.units), plan.planned_samples)
    for shard in outputs.shard_commits(out, committed):
        tally.add(shard, new=False)
    return tally


class _OverBudget(Exception):
    """The error budget is spent: the run stops its writers, then counts what they committed."""


@dataclass
class _Run:
    """One driver's run of a job: what it executes and what it has counted."""

    spec: JobSpec
    plan: JobPlan
    out: Location
    lease: commit.Lease
    tally: Tally
    progress: Progress

    def execute(
        self,
        pending: list[WorkUnit],
        options: RunOptions,
        started: float,
        local_ray: LocalRayStart | None = None,
    ) -> float:
        """Stream the pending units through Ray Data; returns the start-up seconds."""
        import ray

        owns_ray = local_ray.wait() if local_ray is not None else _connect(options)
        resources = ray.cluster_resources()
        dataset = None
        over_budget = False
        engine = contextlib.ExitStack()
        if local_ray is not None:
            engine.enter_context(lean_data_on_local_node(resources))
        try:
            dataset = _pipeline(self.spec, self.plan, pending, resources)
            startup = time.monotonic() - started
            # Closed on any exit: a stopped run must not leave writers committing behind the
            # back of the next run (on a cluster Ray outlives this driver).
            with (
                contextlib.closing(iter(dataset.iter_rows())) as rows,
                noted_interrupts() as ctrl_c,
            ):
                for row in rows:
                    self.tally.add(pickle.loads(row["commit"]), new=True)
                    self.progress.committed(self.tally)
                    self._check_still_going()
                    ctrl_c.check()
                ctrl_c.check()
        except _OverBudget:
            over_budget = True
        except Exception as error:
            # Ray re-raises a stage's error as a subclass of both RayTaskError and the error
            # (which it keeps in `.cause`): only the driver's own RayaugErrors pass as they are.
            if isinstance(error, RayaugError) and not hasattr(error, "cause"):
                raise
            raise JobFailed(
                f"the job stopped: {_root_cause(error)}. Committed shards are kept; "
                f"run `rayaug resume {self.out.uri}` to continue."
            ) from error
        finally:
            _stop_ray_data(dataset)
            engine.close()
            if local_ray is not None:
                local_ray.stop()
            elif owns_ray:
                ray.shutdown()
        if over_budget:
            self._recount()
            raise JobFailed(self.budget_message())
        return startup

    def _recount(self) -> None:
        """Count the committed shards again once the writers have stopped: the shards committed
        after the last row the driver read count too, so that the progress and the message
        agree with `rayaug status`."""
        before = self.tally.samples + self.tally.quarantined
        committed = commit.settled_committed_shards(self.out)
        tally = _count_committed(self.plan, self.out, committed)
        tally.new_samples = self.tally.new_samples + tally.samples + tally.quarantined - before
        self.tally = tally
        self.progress.committed(tally)

    def _check_still_going(self) -> None:
        holder = self.lease.lost_to
        if holder is not None:
            raise JobFailed(
                f"another run ({holder.run_id} on {holder.host}) took over this "
                "output's lease; this run stops"
            )
        if self.tally.over_budget(self.spec.errors.max_error_rate, final=False):
            raise _OverBudget

    def budget_message(self) -> str:
        tally = self.tally
        top = ", ".join(f"{reason} ×{count}" for reason, count in tally.reasons.most_common(5))
        total = tally.planned_samples or (tally.samples + tally.quarantined)
        return (
            f"error budget exceeded: {tally.quarantined} of {total} samples quarantined "
            f"(max_error_rate {self.spec.errors.max_error_rate}): {top}. See `rayaug inspect "
            f"{self.out.uri}`; to accept them, raise errors.max_error_rate in the job file and "
            "run it again (`rayaug run JOB.yaml`): committed shards are kept."
        )


def _stop_ray_data(dataset: object | None, timeout: float = 30.0) -> None:
    """Stop the dataset's executor and let its scheduling loop end, on every exit.

    Ray Data stops an executor whose rows were not all read only when it is garbage-collected:
    after a Ctrl-C that was after `ray.shutdown` (a traceback at exit), and on a cluster its
    writers went on committing meanwhile. Its own stop waits for the loop only 2 s; a loop
    still running then calls into a shut-down Ray, which ends the process with exit 1."""
    executor = getattr(dataset, "_current_executor", None)  # Ray Data keeps it nowhere public
    if executor is not None:
        try:
            executor.shutdown(force=True)
        except Exception as error:  # noqa: BLE001 - must not hide the run's own outcome
            log.warning("stopping Ray Data's executor failed: %s", _root_cause(error))
    deadline = time.monotonic() + timeout
    for thread in threading.enumerate():
        if thread.name.startswith("StreamingExecutor-"):
            thread.join(max(0.0, deadline - time.monotonic()))


def _root_cause(error: BaseException) -> str:
    """The innermost error under Ray's wrappers (RayTaskError keeps it in `.cause`)."""
    seen: set[int] = set()
    while id(error) not in seen:
        seen.add(id(error))
        inner = getattr(error, "cause", None) or error.__cause__
        if not isinstance(inner, BaseException):
            break
        error = inner
    if isinstance(error, RayaugError):
        # rayaug's messages are one line; Ray Data appends its retry advice on further lines
        # ("configure ray.data.DataContext ..."), which is about Ray's retries, not rayaug's.
        return str(error).split("\n", 1)[0]
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text[:400]}"


def _starts_local_ray(options: RunOptions) -> bool:
    """Whether `_connect` would start an embedded Ray (no cluster named, none running here)."""
    if options.address or os.environ.get("RAY_ADDRESS"):
        return False
    ray = sys.modules.get("ray")  # not imported yet: certainly not initialized
    return ray is None or not ray.is_initialized()


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
                f"the embedded Ray did not start: {_root_cause(self._error)}"
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


class _Interrupts:
    """Ctrl-C, noted as well as raised. Python drops a KeyboardInterrupt raised while a
    finalizer (`__del__`) runs, printing "Exception ignored"; the driver runs Ray's finalizers
    all the time, and one CI run ignored a Ctrl-C and finished the job. The driver raises a
    noted one itself at its next committed row."""

    def __init__(self) -> None:
        self.noted = threading.Event()

    def check(self) -> None:
        if self.noted.is_set():
            raise KeyboardInterrupt


@contextlib.contextmanager
def noted_interrupts() -> Iterator[_Interrupts]:
    """While the driver reads committed rows, SIGINT is noted, then handled as before (the
    default raises KeyboardInterrupt); Python's report of one it dropped is left out. Off the
    main thread (an API caller's own thread) signals are not this thread's: nothing changes."""
    import signal

    interrupts = _Interrupts()
    main = threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGINT) if main else signal.SIG_IGN
    if before == signal.SIG_IGN:  # another thread's, or ignored by whoever started us (nohup)
        yield interrupts
        return

    def note(signum, frame):
        interrupts.noted.set()
        if callable(before):
            before(signum, frame)
        raise KeyboardInterrupt

    def unraisable(report) -> None:  # the dropped Ctrl-C is not news: the driver raises it
        if not (report.exc_type is KeyboardInterrupt and interrupts.noted.is_set()):
            hook(report)

    hook = sys.unraisablehook
    signal.signal(signal.SIGINT, note)
    sys.unraisablehook = unraisable
    try:
        yield interrupts
    finally:
        signal.signal(signal.SIGINT, before)
        sys.unraisablehook = hook


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


def _connect(options: RunOptions) -> bool:
    """Join the given cluster (or the one RAY_ADDRESS names), else start a local one."""
    import ray

    if ray.is_initialized():
        return False
    env_vars = {name: os.environ[name] for name in FORWARDED_ENV if name in os.environ}
    address = options.address or os.environ.get("RAY_ADDRESS")
    if options.address:
        package = str(Path(__file__).parent)
        runtime_env = {"py_modules": [package], "env_vars": env_vars}
        with ray_on_loopback(address):
            ray.init(address=address, runtime_env=runtime_env, **QUIET)
    elif address:  # inside a submitted job: the job's runtime_env already carries rayaug
        with ray_on_loopback(address):
            ray.init(address=address, **QUIET)
    else:
        # The local node's workers inherit this process's environment (FORWARDED_ENV included):
        # no runtime_env, so that the workers the raylet starts ahead serve the pool's actors.
        start_local_ray(include_dashboard=False, **QUIET)
    return True


LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")


def _is_loopback_address(address: str | None) -> bool:
    if address is None:
        return False
    host = address.split("://", 1)[-1].rsplit(":", 1)[0]
    return host in LOOPBACK_HOSTS


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
# - the workers the raylet starts ahead (one per CPU, which the pool's actors then take) import
#   Ray Data and the stage's module as they start, while the driver still builds its pipeline,
#   rather than once they are given an actor: first commit 0.25 s earlier (six paired runs);
# - workers at the driver's own priority: Ray renices them by 15, and on a machine the job
#   shares any busy process then took nearly all of the pool actors' CPU (20,000 views at 33
#   samples/s beside three busy processes on two cores, 552 at the driver's priority).
LOCAL_SYSTEM_CONFIG = {
    "enable_metrics_collection": False,
    "preload_python_modules": ["ray.data", "rayaug.job"],
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
    replaced += [(node.Node, name, lambda self, *args, **kwargs: None) for name in skipped]
    with _replaced(replaced):
        yield


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
def _replaced(replacements: list[tuple[object, str, object]]) -> Iterator[None]:
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

    with _replaced([(services, "get_node", get_node)]):
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

    def remote(self, *args: object, **kwargs: object) -> None:
        return None


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

    def no_metrics(*args: object, **kwargs: object) -> None:
        return None

    replaced = [
        (streaming_executor, "create_cluster_autoscaler", lambda *a, **k: _FixedNode(resources)),
        (pool, "get_or_create_actor_location_tracker", _OneNodeLocations),
        (pool, "get_actor_locations", lambda logical_ids: {}),
        (_StatsManager, "register_dataset_to_stats_actor", staticmethod(no_metrics)),
        (_StatsManager, "update_execution_metrics", staticmethod(no_metrics)),
        (_StatsManager, "update_iteration_metrics", staticmethod(no_metrics)),
    ]
    if not all(name in vars(owner) for owner, name, _ in replaced):
        yield
        return
    with _replaced(replaced):
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


@dataclass(frozen=True)
class PoolShape:
    size: int
    cpus_per_actor: float
    gpus_per_actor: float


def pool_shape(execution: ExecutionSpec, cpus: float, gpus: float) -> PoolShape:
    """Actors and their resources. The actors do all the work, reading and writing included;
    a share of the CPUs (≥ 0.5) is left to the driver and Ray's own processes."""
    reserve = max(0.5, 0.1 * cpus)
    budget = max(cpus - reserve, 0.25)
    if execution.num_gpus == "auto":
        gpus_per_actor = 1.0 if gpus >= 1 else 0.0
    else:
        gpus_per_actor = float(execution.num_gpus)
    if execution.concurrency != "auto":
        size = execution.concurrency
    elif gpus_per_actor > 0:
        size = max(1, int(gpus // gpus_per_actor))
    else:
        size = max(1, math.ceil(budget))
    if execution.cpus_per_actor == "auto":
        cpus_per_actor = min(1.0 if gpus_per_actor == 0 else 4.0, budget / size)
    else:
        cpus_per_actor = float(execution.cpus_per_actor)
    return PoolShape(size, round(cpus_per_actor, 3), gpus_per_actor)


def calls_per_actor(units: int, actors: int) -> int:
    """Shards handed to each actor at once: CALLS_PER_ACTOR when every actor can be given that
    many, else one, so that each shard goes to an actor of its own (Ray Data hands a unit to the
    first actor with a free slot)."""
    return CALLS_PER_ACTOR if units >= CALLS_PER_ACTOR * actors else 1


def waits_for_every_actor(units: int, actors: int) -> bool:
    """Whether dispatching waits until every actor of the pool is up. With few units per
    actor, the first actor up would take them one after another while a slower one (a busy
    machine, a node still pulling its image) got none: four shards on two actors all went to
    the first. With many units a late actor still finds work, and the wait would only delay
    the first commit."""
    return units < FEW_UNITS_ROUNDS * CALLS_PER_ACTOR * actors


def overlaps_shards(spec: JobSpec) -> bool:
    """Whether an actor's second call runs beside the one augmenting (`execution.overlap_shards`),
    rather than only waiting in its queue, as Ray Data has it unless told otherwise
    (`enable_true_multi_threading`). Overlapped, one call's reads and the other's writes wait on
    storage while the device works (`_ShardStage.device_lock` keeps the augmenting one at a
    time), at the cost of two shards' reads and writes in memory. "auto": where the input or
    the output is in cloud storage; a local disk has no such waits to hide."""
    chosen = spec.execution.overlap_shards
    if chosen != "auto":
        return chosen
    return is_cloud(spec.input.uri) or is_cloud(spec.output.uri)


def _pipeline(spec: JobSpec, plan: JobPlan, pending: list[WorkUnit], resources: dict):
    import ray
    from ray.data import ActorPoolStrategy, DataContext
    from ray.data.context import DEFAULT_WAIT_FOR_MIN_ACTORS_S

    context = DataContext.get_current()
    context.enable_progress_bars = False
    context.print_on_execution_start = False
    context.raise_original_map_exception = True  # a StorageError, not Ray's wrapper, reaches us
    if logging.getLogger().getEffectiveLevel() > logging.INFO:
        # rayaug reports a failed stage in one line; Ray Data would print its traceback first.
        logging.getLogger("ray.data").setLevel(logging.CRITICAL)
    shape = pool_shape(spec.execution, resources.get("CPU", 1.0), resources.get("GPU", 0.0))
    # No more actors than units (a small job, the rest of a resume): an actor without a unit
    # would start for nothing, and Ray Data warns of a pool larger than its inputs.
    actors = min(shape.size, len(pending))
    calls = calls_per_actor(len(pending), actors)
    # Bounded: a pool that cannot be placed fails the run in one line. The context is the
    # process's: a later pipeline of many units gets Ray Data's default back.
    context.wait_for_min_actors_s = (
        ACTORS_UP_TIMEOUT_S
        if waits_for_every_actor(len(pending), actors)
        else DEFAULT_WAIT_FOR_MIN_ACTORS_S
    )
    _inline_actor_arguments()
    units = [{"unit": pickle.dumps(unit)} for unit in pending]
    dataset = ray.data.from_items(units, override_num_blocks=len(units))
    with warnings.catch_warnings():
        # Ray 2.60 names no parameter for max_restarts/max_task_retries yet, so they still go
        # through **ray_remote_args, which warns on every run.
        warnings.filterwarnings("ignore", "`ray_remote_args` is deprecated")
        return dataset.map_batches(
            _ShardStage,
            fn_constructor_kwargs={
                "spec": spec,
                "fmt": plan.format,
                "num_gpus": shape.gpus_per_actor,
            },
            batch_size=1,
            batch_format="numpy",
            compute=ActorPoolStrategy(
                size=actors,
                max_concurrent_calls_per_actor=calls,
                # Ray Data queues twice the calls on an actor unless told: the first actor up
                # took four units of a four-unit job, and the other, idle once every unit was
                # handed out, was stopped.
                max_tasks_in_flight_per_actor=calls,
                enable_true_multi_threading=calls > 1 and overlaps_shards(spec),
            ),
            num_cpus=shape.cpus_per_actor,
            num_gpus=shape.gpus_per_actor,
            # -1: an actor task is retried until it succeeds or its actor has used up its
            # restarts, which is what bounds a poison input. A finite count is also spent while a
            # lost node's actor is merely unreachable (before Ray declares the node dead and
            # restarts the actor elsewhere): 4 retries were gone within seconds and a node loss
            # failed the whole job.
            max_restarts=ACTOR_RESTARTS,
            max_task_retries=-1,
        )


# Ray Data's by-reference constructor arguments of a pool actor (cached properties of its operator).
INLINE_ARGS = ("_map_transformer_ref", "_data_context_ref")


def _inline_actor_arguments() -> None:
    """Create Ray Data's pool actors with their constructor arguments inline, not in the store.

    Ray Data 2.60 `ray.put`s a map operator's transformer (which holds `_ShardStage` and its
    constructor kwargs) and its DataContext, and creates each pool actor with those two object
    refs. Ray restarts an actor (max_restarts, which makes a killed actor recoverable) by running
    its creation task again, but does not keep constructor arguments in the object store alive
    for that (ray-project/ray#53727), and the driver's core worker says so at error level on
    every run: the `core_worker.cc ... constructor arguments in the object store and
    max_restarts > 0` line. Passed by value, the arguments travel in the actor's creation task
    itself, which the GCS keeps for every restart, wherever the actor restarts. Both are small,
    a few KiB (the spec, the format; the source index of mix jobs is read by the actor from
    the output's recorded plan rather than passed): under Ray's inline limit (100 KiB, above
    which Ray would put an argument in the object store after all).

    Installed once per process, on the operator class of the pinned Ray version; a Ray whose
    operator differs is left as it is (the arguments then go by reference, as Ray Data does).
    """
    try:
        from ray.data._internal.execution.operators.actor_pool_map_operator import (
            ActorPoolMapOperator,
        )
    except ImportError:
        return
    start_actor = getattr(ActorPoolMapOperator, "_start_actor", None)
    if start_actor is None or getattr(start_actor, "_rayaug_inline", False):
        return
    if not all(hasattr(ActorPoolMapOperator, name) for name in INLINE_ARGS):
        return

    def start_inline(self, *args, **kwargs):
        # Both are functools.cached_property: a value in the instance's __dict__ takes their
        # place while this actor is created; the refs (for the tasks) are put back after.
        saved = {n: self.__dict__.pop(n) for n in INLINE_ARGS if n in self.__dict__}
        self.__dict__["_map_transformer_ref"] = self._map_transformer
        self.__dict__["_data_context_ref"] = self.data_context
        try:
            return start_actor(self, *args, **kwargs)
        finally:
            for name in INLINE_ARGS:
                self.__dict__.pop(name, None)
            self.__dict__.update(saved)

    start_inline._rayaug_inline = True
    ActorPoolMapOperator._start_actor = start_inline


# ---------------------------------------------------------------- the stage (runs on workers)


class _ShardStage:
    """One actor: reads a work unit, augments it on its device, writes and commits its shard.

    One stage, not three: the source and output bytes of a shard (megabytes) never pass
    through Ray's object store, only the unit in and its commit record out.
    """

    def __init__(self, spec: JobSpec, fmt: str, num_gpus: float) -> None:
        allocator.keep_freed_buffers()  # the actor's process is rayaug's own
        self.spec = spec
        self.fmt = fmt
        self.source = open_location(spec.input.uri, spec.storage)
        self.out = open_location(spec.output.uri, spec.storage)
        self.context = WriteContext(spec.output, versions(), spec.seed, spec.layout)
        partners = None
        if spec.mixes:  # mix ops read their partners from the input themselves
            partners = Partners(_source_index(self.source, spec, self.out))
        self.augmenter = Augmenter(spec, pick_device(num_gpus), partners)
        self.device_lock = threading.Lock()
        allocator.exempt_loaded_objects()

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        commits = [self._shard(pickle.loads(unit)) for unit in batch["unit"]]
        return {"commit": np.array([pickle.dumps(c) for c in commits], dtype=object)}

    def _shard(self, unit: WorkUnit) -> ShardCommit:
        samples = stream_unit(self.source, self.spec.input, self.fmt, unit)
        with SpillFile() as spill:
            # The reads start before the device is free: concurrent calls overlap only those.
            with ReadAhead(samples, READ_AHEAD_BYTES) as read, self.device_lock:
                output = self.augmenter.augment(read, range(*unit.views), spill)
            return write_shard(self.out, unit.shard, output, self.context)


def _source_index(source: Location, spec: JobSpec, out: Location) -> SourceIndex:
    """Every source of the plan (not only the pending units'): partners come from all sources.

    Read from the plan the job recorded in its output (`_job/plan.json`, written before any
    shard, the one `rayaug replay` reads too), not handed to the actor: its constructor's
    arguments stay a few KiB (inline in the actor's creation task, see _inline_actor_arguments)
    whatever the input's size, and a restarted actor reads the same record again."""
    recorded = recorded_job(out)
    if recorded is None:  # prepare() records the job before a run goes on
        raise RayaugError(f"{out.uri} has no {commit.PLAN}; run `rayaug resume {out.uri}`")
    plan = recorded.plan
    return SourceIndex(source, spec.input, plan.format, plan.source_units)


# ---------------------------------------------------------------- end of the job


def _finish(spec: JobSpec, out: Location) -> int:
    """The end of a successful run, over every committed shard: the output format's last step
    (Lance: the dataset version of exactly those shards), then the orphans are removed;
    returns how many."""
    committed = commit.committed_shards(out)
    finish_output(out, spec.output, committed)
    found = orphans(out, spec.output, committed)
    for path in found:
        out.delete(path)
    return len(found)


# ---------------------------------------------------------------- training: an epoch for Ray Train


def epoch_dataset(epoch: Epoch, rows_per_batch: int = 64) -> ray.data.Dataset:
    """One epoch as a Ray Data dataset (for Ray Train): one read task per part of the epoch
    (`epoch` is opened with num_workers = parts), each serving its part's items as rows,
    `rows_per_batch` at a time: a task holds one window of its part, never the whole part."""
    import ray

    parts = max(epoch.split.num_workers, 1)
    tasks = ray.data.from_items([{"part": p} for p in range(parts)], override_num_blocks=parts)
    return tasks.map_batches(
        _epoch_rows, batch_size=1, fn_kwargs={"epoch": epoch, "rows": rows_per_batch}
    )


def _epoch_rows(batch: dict[str, np.ndarray], epoch: Epoch, rows: int) -> Iterator[dict]:
    for part in batch["part"]:
        items = epoch.serve(int(part))
        while chunk := list(itertools.islice(items, rows)):
            yield {key: _column([_views(item[key]) for item in chunk]) for key in chunk[0]}


def _views(value: object) -> object:
    """An item's k views (views_per_item > 1) as one (k, H, W, 3) array when their shapes
    agree, so a row's `image` is one tensor for Ray Train; any other value as it is."""
    arrays = isinstance(value, list) and value and isinstance(value[0], np.ndarray)
    if arrays and len({v.shape for v in value}) == 1:
        return np.stack(value)
    return value


def _column(values: list) -> np.ndarray:
    """A batch column: images of one shape stacked, anything else one object per row."""
    shapes = {getattr(v, "shape", None) for v in values}
    if len(shapes) == 1 and None not in shapes:
        return np.stack(values)
    column = np.empty(len(values), dtype=object)
    column[:] = values
    return column
