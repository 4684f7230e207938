"""Fault injection for tests/faults, without a single test hook in rayaug's own code.

Two ways in, both real (no mock of Ray or of storage):

* **Workers**: Ray's `runtime_env={"worker_process_setup_hook": "faults.injection.worker_setup"}`
  runs `worker_setup` in every worker process of one job before its first task. It reads the
  faults to install from the `RAYAUG_TEST_FAULTS` environment variable (JSON, set through the
  same runtime_env) and patches rayaug's stage code in that process only: the augment actor
  exits on its k-th call, a write pauses between its data object and its manifest, the
  augment stage is slowed down, actors record the node they run on. The faults are per job:
  other jobs on the same Ray never get them.
* **The driver**: `python -m faults.injection drive ...` is a real `run_job` driver in its own
  process (so a test can SIGKILL it), joined to a given Ray with that runtime_env, that can
  pause at a chosen point of its own work (planning, final summary) for the test to kill it.
  `python -m faults.injection node-loss ...` runs a whole multi-node `ray.cluster_utils.Cluster`
  job in its own process, and removes a worker node mid-job.

A fault that must happen once (across actor restarts and processes) claims a marker file with
O_EXCL: the first process to create it fires, every later one sees it and does nothing. The
marker holds what happened (pid, shard, node), for the test to check.

Test-side helpers (inputs, clean reference runs, the independent output check) live here too.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

FAULTS_ENV = "RAYAUG_TEST_FAULTS"
HOOK = "faults.injection.worker_setup"
TESTS_DIR = Path(__file__).resolve().parent.parent  # tests/: `faults` is importable from it
# How long an injected pause lasts at most: the test kills the paused process long before.
PAUSE_SECONDS = 300.0
SUMMARY_PREFIX = "rayaug-summary: "


# ---------------------------------------------------------------- once-only markers


def claim(marker: str | os.PathLike, **facts) -> bool:
    """Create `marker` atomically with `facts` (JSON); False if it already existed."""
    try:
        handle = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(handle, "w") as stream:
        json.dump({"pid": os.getpid(), **facts}, stream)
        stream.flush()
        os.fsync(stream.fileno())
    return True


def _pause(reason: str) -> None:
    """Block this process until it is killed (at most PAUSE_SECONDS)."""
    deadline = time.monotonic() + PAUSE_SECONDS
    while time.monotonic() < deadline:
        time.sleep(0.2)
    raise RuntimeError(f"injected pause ({reason}) was never ended by the test")


# ---------------------------------------------------------------- faults inside Ray workers


def worker_setup() -> None:
    """Ray's worker_process_setup_hook: install the faults named in RAYAUG_TEST_FAULTS."""
    faults = json.loads(os.environ.get(FAULTS_ENV) or "{}")
    # In this order: each wraps the ones before it, so recording sees every call start.
    installers: dict[str, Callable[[dict], None]] = {
        "slow_augment": _slow_augment,
        "crash_actor": _crash_actor,
        "hang_actor": _hang_actor,
        "record_actor_nodes": _record_actor_nodes,
        "pause_before_manifest": _pause_before_manifest,
    }
    unknown = set(faults) - set(installers)
    if unknown:
        raise ValueError(f"unknown faults {sorted(unknown)}")
    for name, install in installers.items():
        if name in faults:
            install(faults[name])


def _wrap_augment_call(wrapper: Callable) -> None:
    """Wrap `_ShardStage.__call__` (the actor's per-batch method) in this process."""
    from rayaug import job

    original = job._ShardStage.__call__

    def patched(self, batch):
        return wrapper(original, self, batch)

    patched.__wrapped__ = original
    job._ShardStage.__call__ = patched


def _shards(batch: dict) -> list[str]:
    """The shards of the work units in an actor's batch."""
    return [pickle.loads(unit).shard for unit in batch["unit"]]


def _crash_actor(settings: dict) -> None:
    """The actor process dies (`os._exit(1)`) on its k-th call, once per job: the shard is
    written and committed, then its commit record is lost with the process before it reaches
    the driver, so the retry redoes a shard that is already there."""
    calls = Counter()

    def crash(original, stage, batch):
        calls["n"] += 1
        result = original(stage, batch)
        if calls["n"] == settings["call"]:
            shards = _shards(batch)
            if claim(settings["marker"], shards=shards, node=_node_id()):
                os._exit(1)
        return result

    _wrap_augment_call(crash)


def _slow_augment(settings: dict) -> None:
    """Each actor call takes `seconds` longer: keeps a job in flight long enough to hit it."""

    def slow(original, stage, batch):
        time.sleep(settings["seconds"])
        return original(stage, batch)

    _wrap_augment_call(slow)


def _hang_actor(settings: dict) -> None:
    """The actor's k-th call hangs (in the middle of its batch) until its process is killed,
    once per job; the marker names the node and the shard, for the test to remove that node."""
    calls = Counter()

    def hang(original, stage, batch):
        calls["n"] += 1
        shards = _shards(batch)
        if calls["n"] == settings["call"] and claim(
            settings["marker"], shards=shards, node=_node_id()
        ):
            _pause(f"augmenting {shards}")
        return original(stage, batch)

    _wrap_augment_call(hang)


def _record_actor_nodes(settings: dict) -> None:
    """Each actor call appends `<node id> <shard> <time>` to `<dir>/<pid>` as it starts."""
    folder = Path(settings["dir"])

    def record(original, stage, batch):
        with open(folder / str(os.getpid()), "a") as stream:
            stamp = time.time()
            stream.writelines(f"{_node_id()} {shard} {stamp}\n" for shard in _shards(batch))
        return original(stage, batch)

    _wrap_augment_call(record)


def _pause_before_manifest(settings: dict) -> None:
    """The write of `shard` stops after its data object, before its manifest (its commit)."""
    from rayaug import commit

    original = commit.commit_shard

    def paused(out, shard, manifest):
        if shard == settings["shard"] and claim(settings["marker"], shard=shard):
            _pause(f"before the manifest of {shard}")
        return original(out, shard, manifest)

    commit.commit_shard = paused


def _node_id() -> str:
    import ray

    return ray.get_runtime_context().get_node_id()


# ---------------------------------------------------------------- faults inside the driver


def _driver_pause_before_write(settings: dict) -> None:
    """The driver stops just before writing `path` under the output (e.g. `_job/plan.json`)."""
    from rayaug.storage import Location

    original = Location.write_bytes

    def paused(self, relative, data):
        if relative == settings["path"] and claim(settings["marker"], path=relative):
            _pause(f"before writing {relative}")
        return original(self, relative, data)

    Location.write_bytes = paused


def _driver_pause_in_summary(settings: dict) -> None:
    """The driver stops in its final summary: every manifest written, no orphan removed yet
    (nor a Lance dataset version committed), no `_SUCCESS`."""
    from rayaug import job

    original = job._finish

    def paused(spec, out):
        if claim(settings["marker"], stage="remove_orphans"):
            _pause("in the final summary")
        return original(spec, out)

    job._finish = paused


DRIVER_FAULTS = {
    "pause_before_write": _driver_pause_before_write,
    "pause_in_summary": _driver_pause_in_summary,
}


def job_runtime_env(worker_faults: dict) -> dict:
    """The runtime_env of a job whose workers get `worker_faults`."""
    from rayaug.job import FORWARDED_ENV

    env_vars = {name: os.environ[name] for name in FORWARDED_ENV if name in os.environ}
    env_vars |= {
        FAULTS_ENV: json.dumps(worker_faults),
        "PYTHONPATH": f"{TESTS_DIR}:${{PYTHONPATH}}",
    }
    return {"worker_process_setup_hook": HOOK, "env_vars": env_vars}


class _Silent:
    def started(self, tally) -> None:
        pass

    def committed(self, tally) -> None:
        pass


def _drive(args: argparse.Namespace) -> int:
    """A real driver: join the Ray at `--address` with the faulty runtime_env, run the job."""
    import ray

    from rayaug.job import RunOptions, run_job
    from rayaug.local_ray import ray_on_loopback
    from rayaug.spec import load_spec

    for name, settings in json.loads(args.driver_faults).items():
        DRIVER_FAULTS[name](settings)
    spec = load_spec(args.spec)
    with ray_on_loopback(args.address):  # else Ray rewrites 127.0.0.1 to a network address
        ray.init(
            address=args.address,
            runtime_env=job_runtime_env(json.loads(args.worker_faults)),
            log_to_driver=False,
        )
    try:
        summary = run_job(spec, RunOptions(), _Silent())
    finally:
        ray.shutdown()
    print(SUMMARY_PREFIX + json.dumps(summary.to_json()), flush=True)
    return 0


# ---------------------------------------------------------------- node loss on a local cluster


def _node_loss(args: argparse.Namespace) -> int:
    from rayaug.local_ray import ray_on_loopback

    with ray_on_loopback():  # else Ray rewrites 127.0.0.1 (of the nodes, of the address)
        return _node_loss_on_loopback(args)


def _node_loss_on_loopback(args: argparse.Namespace) -> int:
    """Head (no CPU: only the driver) + two worker nodes on loopback; the job's actors run on
    the workers. The worker faults make one actor hang in the middle of a batch (`hang_actor`,
    whose marker names its node); once that has happened and a shard is committed, that node
    is removed (every process of it SIGKILLed). The job must finish on the other worker node.
    """
    import ray
    from ray.cluster_utils import Cluster

    from rayaug.job import RunOptions, run_job
    from rayaug.spec import load_spec

    worker_faults = json.loads(args.worker_faults)
    marker = Path(worker_faults["hang_actor"]["marker"])
    report_path, out = Path(args.report), Path(args.out)
    report: dict = {}
    loopback = {"node_ip_address": "127.0.0.1", "object_store_memory": 100 * 1024**2}
    cluster = Cluster(shutdown_at_exit=True)
    try:
        # Ray's default health checks: the GCS declares the lost node dead only after several
        # missed checks (~15 s), and the job must ride that window out (see max_task_retries
        # in job._pipeline).
        cluster.add_node(num_cpus=0, include_dashboard=False, **loopback)
        workers = [cluster.add_node(num_cpus=2, **loopback) for _ in range(2)]
        cluster.wait_for_nodes()
        report["worker_nodes"] = [node.node_id for node in workers]
        # For the test's finalizer, should this process die without shutting the cluster down.
        pids = [p.pid for node in cluster.list_all_nodes() for _, p in node.live_processes()]
        Path(args.pids).write_text(json.dumps([[pid, started_at(pid)] for pid in pids]))
        ray.init(
            address=cluster.address, runtime_env=job_runtime_env(worker_faults), log_to_driver=False
        )
        remover = _Remover(cluster, workers, marker, out, args.timeout, report)
        remover.start()
        summary = run_job(load_spec(args.spec), RunOptions(), _Silent())
        remover.join(timeout=60)
        report["summary"] = summary.to_json()
        report["nodes_alive_at_end"] = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])
        return 0
    except BaseException as error:
        report["error"] = repr(error)
        raise
    finally:
        report_path.write_text(json.dumps(report, indent=2))
        ray.shutdown()
        cluster.shutdown()


class _Remover(threading.Thread):
    """Removes the node of the hung actor once a shard is committed; reports what it did."""

    def __init__(
        self, cluster, workers, marker: Path, out: Path, timeout: float, report: dict
    ) -> None:
        super().__init__(name="node-remover", daemon=True)
        self.cluster, self.workers, self.marker = cluster, workers, marker
        self.out, self.timeout, self.report = out, timeout, report

    def run(self) -> None:
        try:
            self.report.update(self._remove())
        except BaseException as error:  # reported; the test fails on it
            self.report["remover_error"] = repr(error)

    def _remove(self) -> dict:
        deadline = time.monotonic() + self.timeout
        manifests: list[str] = []
        while not (self.marker.exists() and manifests):
            if time.monotonic() > deadline:
                raise TimeoutError("no hung actor and committed shard to remove a node for")
            time.sleep(0.05)
            manifests = sorted(p.stem for p in (self.out / "manifests").glob("*.parquet"))
        hung = json.loads(self.marker.read_text())
        victim = next(node for node in self.workers if node.node_id == hung["node"])
        removed_at = time.time()
        self.cluster.remove_node(victim, allow_graceful=False)
        return {
            "removed_node": victim.node_id,
            "hung_shards": hung["shards"],
            "manifests_at_removal": manifests,
            "removed_at": removed_at,
        }


def actor_calls(record_dir: Path) -> list[tuple[str, str, float]]:
    """Every recorded start of an actor call: (node id, shard, time)."""
    calls = []
    for path in sorted(record_dir.iterdir()):
        for line in path.read_text().split("\n")[:-1]:  # complete lines only
            node, shard, stamp = line.split(" ")
            calls.append((node, shard, float(stamp)))
    return calls


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m faults.injection")
    commands = parser.add_subparsers(dest="command", required=True)
    drive = commands.add_parser("drive", help="run a job as a killable driver")
    drive.add_argument("spec")
    drive.add_argument("--address", required=True)
    drive.add_argument("--worker-faults", default="{}")
    drive.add_argument("--driver-faults", default="{}")
    loss = commands.add_parser("node-loss", help="a job on a 3-node cluster, losing a node")
    loss.add_argument("spec")
    loss.add_argument("--out", required=True)
    loss.add_argument("--report", required=True)
    loss.add_argument("--pids", required=True)
    loss.add_argument("--worker-faults", default="{}")
    loss.add_argument("--timeout", type=float, default=240.0)
    args = parser.parse_args(argv)
    return _drive(args) if args.command == "drive" else _node_loss(args)


# ---------------------------------------------------------------- test-side helpers

OPS = [
    {"name": "random_resized_crop", "size": 32, "scale": [0.4, 1.0]},
    {"name": "horizontal_flip"},
    {"name": "color_jitter", "brightness": 0.3, "contrast": 0.3, "saturation": 0.3, "hue": 0.05},
    {"name": "rotation", "degrees": 10, "p": 0.5},
]
VIEWS = 2


def make_input(root: Path, count: int, seed: int) -> list[str]:
    """A folder of `count` tiny real photos; returns every planned sample id (key#view)."""
    from rayaug import sampledata

    photos = list(sampledata.make_photos(count, seed=seed, short_side=(40, 56)))
    sampledata.write_folder(photos, root)
    return sorted(f"{p.key}#{view}" for p in photos for view in range(VIEWS))


def spec_data(source: Path, out: Path, shard_size: int = 2, **execution) -> dict:
    return {
        "input": {"uri": str(source)},
        "output": {"uri": str(out), "shard_size": shard_size},
        "views": VIEWS,
        "seed": 23,
        "ops": OPS,
        "execution": {"batch_size": 3, "concurrency": 1} | execution,
    }


def write_spec(path: Path, data: dict) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(data))
    return path


_cache: dict[str, object] = {}


def shared_input(tmp_path_factory) -> tuple[Path, list[str]]:
    """One input folder for every fault test of this pytest process (its clean run is shared
    too); returns it with every planned sample id."""
    if "input" not in _cache:
        root = tmp_path_factory.mktemp("fault-input")
        _cache["input"] = (root, make_input(root, count=16, seed=4))
    return _cache["input"]


def clean_digests(tmp_path_factory, data: dict) -> dict[str, str]:
    """sample_id → sha256 of an uninterrupted run of the job `data` describes (on the Ray this
    process is connected to), run once per output-defining spec in this process."""
    from rayaug.job import RunOptions, run_job
    from rayaug.spec import parse_spec

    defining = {k: v for k, v in data.items() if k != "execution"}
    defining["output"] = {k: v for k, v in data["output"].items() if k != "uri"}
    key = json.dumps(defining, sort_keys=True)
    if key not in _cache:
        out = tmp_path_factory.mktemp("clean") / "out"
        run_job(
            parse_spec(data | {"output": data["output"] | {"uri": str(out)}}),
            RunOptions(),
            _Silent(),
        )
        _cache[key] = output_digests(out)
    return _cache[key]


def output_digests(out: Path) -> dict[str, str]:
    """sample_id → sha256 of the image bytes, read straight from the committed data files
    (pyarrow only, not rayaug's reader); fails on a sample found twice or a manifest that
    disagrees with its data file."""
    import pyarrow.parquet as pq

    digests: dict[str, str] = {}
    for manifest_file in sorted((out / "manifests").glob("*.parquet")):
        shard = manifest_file.name.removesuffix(".parquet")
        manifest = pq.read_table(manifest_file, columns=["sample_id", "sha256"]).to_pylist()
        data = [  # by_view (VIEWS > 1): one object per view, data/view=E/<shard>.parquet
            row
            for path in sorted((out / "data").rglob(f"{shard}.parquet"))
            for row in pq.read_table(
                io.BytesIO(path.read_bytes()), columns=["sample_id", "image"]
            ).to_pylist()
        ]
        images = {row["sample_id"]: hashlib.sha256(row["image"]).hexdigest() for row in data}
        assert len(images) == len(data), f"{shard}: a sample twice in one data file"
        recorded = {row["sample_id"]: row["sha256"] for row in manifest}
        assert recorded == images, f"{shard}: manifest and data file disagree"
        for sample, digest in images.items():
            assert sample not in digests, f"{sample} committed twice"
            digests[sample] = digest
    return digests


def uncommitted_objects(out: Path) -> list[str]:
    """Files under data/ and errors/ without a manifest, and temp files anywhere."""
    committed = {p.name.removesuffix(".parquet") for p in (out / "manifests").glob("*.parquet")}
    found = [
        str(p.relative_to(out))
        for folder in ("data", "errors")
        for p in (out / folder).rglob("*")
        if p.is_file() and p.name.split(".")[0] not in committed
    ]
    return found + [str(p.relative_to(out)) for p in out.rglob("*.tmp-*")]


def assert_same_as_clean(out: Path, planned: list[str], clean: dict[str, str]) -> None:
    """The oracle: rayaug's verify is clean, and independently, every planned sample is
    committed exactly once with the bytes of an uninterrupted run, and no orphan is left."""
    from rayaug import outputs
    from rayaug.reports.summary import verify
    from rayaug.spec import StorageSpec
    from rayaug.storage import open_location

    output = outputs.recorded_output(open_location(str(out), StorageSpec()))
    assert verify(output) == []
    digests = output_digests(out)
    assert sorted(digests) == planned
    assert digests == clean
    assert uncommitted_objects(out) == []
    success = json.loads((out / "_SUCCESS").read_text())
    assert success["samples"] == len(planned) and success["quarantined"] == 0
    assert not (out / "_job" / "lock").exists()


# ---------------------------------------------------------------- subprocesses


@dataclass
class Driver:
    """A subprocess driver (own process group) that a test can SIGKILL."""

    process: subprocess.Popen
    log: Path

    def alive(self) -> bool:
        return self.process.poll() is None

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")[-6000:]

    def summary(self) -> dict:
        """The JSON summary the driver printed when its job succeeded."""
        lines = self.log.read_text().splitlines()
        found = [line for line in lines if line.startswith(SUMMARY_PREFIX)]
        assert found, f"the driver printed no summary:\n{self.stderr()}"
        return json.loads(found[-1].removeprefix(SUMMARY_PREFIX))

    def kill(self) -> None:
        """SIGKILL the driver (and anything it forked in its process group); reap it."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)

    def wait(self, timeout: float) -> int:
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"driver still running after {timeout}s:\n{self.stderr()}"
            ) from None


def started_at(pid: int) -> str | None:
    """When a process started (clock ticks after boot, /proc/PID/stat field 22): with its pid,
    it names one process, never a later one that reuses the pid. None if it has exited."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def kill_survivors(pids_file: Path) -> list[int]:
    """SIGKILL the recorded processes (`[[pid, started_at], ...]`) still alive; returns them."""
    if not pids_file.exists():
        return []
    killed = []
    for pid, started in json.loads(pids_file.read_text()):
        if started is not None and started_at(pid) == started:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
    return killed


def python_env() -> dict[str, str]:
    """The environment of a subprocess that imports `faults.injection` and joins a Ray."""
    path = os.pathsep.join(filter(None, [str(TESTS_DIR), os.environ.get("PYTHONPATH")]))
    return os.environ | {"PYTHONPATH": path, "RAY_ADDRESS": "", "PYTHONUNBUFFERED": "1"}


def start(args: list[str], log: Path) -> Driver:
    with open(log, "wb") as stream:
        process = subprocess.Popen(
            [sys.executable, "-m", "faults.injection", *args],
            stdout=stream,
            stderr=subprocess.STDOUT,
            env=python_env(),
            cwd=TESTS_DIR,
            start_new_session=True,
        )
    return Driver(process, log)


def start_driver(
    spec: Path,
    address: str,
    log: Path,
    worker_faults: dict | None = None,
    driver_faults: dict | None = None,
) -> Driver:
    return start(
        [
            "drive",
            str(spec),
            "--address",
            address,
            "--worker-faults",
            json.dumps(worker_faults or {}),
            "--driver-faults",
            json.dumps(driver_faults or {}),
        ],
        log,
    )


def wait_for(
    condition: Callable[[], bool], driver: Driver, what: str, timeout: float = 240.0
) -> None:
    """Poll `condition` while the driver runs; fail with its log if it exits or time runs out."""
    deadline = time.monotonic() + timeout
    while not condition():
        if not driver.alive():
            raise AssertionError(
                f"driver exited ({driver.process.returncode}) before {what}:\n{driver.stderr()}"
            )
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}:\n{driver.stderr()}")
        time.sleep(0.02)


if __name__ == "__main__":
    sys.exit(main())
