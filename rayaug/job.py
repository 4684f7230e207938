"""The driver: plan, wire the Ray Data stages, count commits, summarize.

The only module that calls Ray, with `local_ray` (the node it starts where no cluster is
named). Stages (read → augment → write) are the engine-free functions of `sources`, `augment`
and `sinks`; this module only adapts them to Ray Data rows.
Each work unit travels as one row to one actor, which reads, augments and writes its shard
whole; the shard's manifest commits it: a killed actor costs only its uncommitted shard.
"""

from __future__ import annotations

import contextlib
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
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from rayaug import allocator, commit, outputs
from rayaug.clouds import is_cloud
from rayaug.errors import JobFailed, RayaugError, root_cause
from rayaug.local_ray import (
    QUIET,
    LocalRayStart,
    lean_data_on_local_node,
    ray_on_loopback,
    start_local_ray,
)
from rayaug.partners import Partners
from rayaug.plan import JobPlan, pending_units, prepare, recorded_job, versions
from rayaug.sinks import ShardCommit, WriteContext, finish_output, orphans, write_shard
from rayaug.sources import ReadAhead, SourceIndex, WorkUnit, check_apart, stream_unit
from rayaug.spec import ExecutionSpec, JobSpec
from rayaug.spill import SpillFile
from rayaug.storage import Location, check_reachable, open_location

if TYPE_CHECKING:
    import ray.data

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
                f"the job stopped: {root_cause(error)}. Committed shards are kept; "
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
            log.warning("stopping Ray Data's executor failed: %s", root_cause(error))
    deadline = time.monotonic() + timeout
    for thread in threading.enumerate():
        if thread.name.startswith("StreamingExecutor-"):
            thread.join(max(0.0, deadline - time.monotonic()))


def _starts_local_ray(options: RunOptions) -> bool:
    """Whether `_connect` would start an embedded Ray (no cluster named, none running here)."""
    if options.address or os.environ.get("RAY_ADDRESS"):
        return False
    ray = sys.modules.get("ray")  # not imported yet: certainly not initialized
    return ray is None or not ray.is_initialized()


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
        # Imported here, in the actor (its worker has it preloaded: LOCAL_SYSTEM_CONFIG): the
        # driver decodes nothing, and OpenCV's import would put 0.2 s before its Ray start.
        from rayaug.augment import Augmenter, pick_device

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
