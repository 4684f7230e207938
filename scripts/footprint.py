"""Where a `rayaug run` spends its start-up, CPU and memory, process by process.

Runs `rayaug run SPEC --json` (a fresh output each time) as a child process and samples its
whole process tree (Ray's GCS, raylet, agents, workers and actors included) every 0.2 s with
psutil: each process's CPU seconds and, every few samples, the PSS of the tree. Commit times
are the modification times of `manifests/*.parquet` (a shard's commit). Prints, per run:

  start-up     process start -> first commit
  steady       first commit -> last commit (the samples within it): CPU seconds per process
               role in that window; the share of the tree's CPU taken by everything but the
               shard actors (Ray's own processes and the driver); how busy the whole machine
               was (/proc/stat) and each role's share of it; and how long the shard actors'
               threads were ready to run but waited for a core, against their time on one
               (the kernel's schedstat of each thread)
  peak PSS     of the tree, and the most processes seen at once

With --json, each run's record also holds every commit's time from the process start
(`commits_s`): where the shards' ends fall, and whether an actor finished alone.

With several specs and --repeat, runs them interleaved (A B A B ...), so a busy machine
slows each alike. A measurement, not a test: nothing here asserts a time.

    .venv/bin/python scripts/footprint.py SPEC.yaml [SPEC.yaml ...] [--repeat 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import psutil
import yaml
from benchmark.measuring import pss_of  # scripts/ is this script's folder: on sys.path

ROOT = Path(__file__).resolve().parent.parent
INTERVAL = 0.2
PSS_EVERY = 2


def role(proc: psutil.Process, root_pid: int) -> str:
    """A short name for what a process of the tree is."""
    if proc.pid == root_pid:
        return "driver"
    try:
        argv = proc.cmdline()
    except psutil.Error:
        return "gone"
    cmd = " ".join(argv)
    if cmd.startswith("ray::"):
        name = cmd.split()[0][5:]
        if "ShardStage" in name or "MapWorker" in name:
            return "shard actor"
        for helper in ("ActorLocationTracker", "AutoscalingCoordinator", "StatsActor"):
            if helper in name:
                return f"ray::{helper}"
        return f"ray::{name}"
    program = " ".join(argv[:4])  # the flags of some name the others' programs
    for key, name in (
        ("raylet/raylet", "raylet"),
        ("rayaug/node_agents.py dashboard", "dashboard agent"),
        ("rayaug/node_agents.py runtime_env", "runtime-env agent"),
        ("rayaug/minimal_agent.py", "dashboard agent"),  # rayaug 0.8.0 before the stand-ins
        ("gcs_server", "gcs_server"),
        ("default_worker.py", "idle worker"),
        ("dashboard/agent.py", "dashboard agent"),
        ("runtime_env/agent", "runtime-env agent"),
        ("log_monitor", "log_monitor"),
        ("autoscaler/_private/monitor.py", "autoscaler monitor"),
        ("dashboard/dashboard.py", "dashboard (API server)"),
    ):
        if key in program:
            return name
    return os.path.basename(cmd.split()[0]) if cmd else proc.name()


@dataclass(frozen=True)
class Sample:
    at: float  # time.time(), the clock of the commits' modification times
    cpu: dict[int, float]  # CPU seconds of each process of the tree
    sched: dict[tuple[int, int], tuple[int, int]]  # thread_schedstats of the shard actors
    machine: tuple[int, int]  # machine_ticks
    sampler: float  # this script's own CPU seconds: its sampling takes some of the machine


def thread_schedstats(pid: int) -> dict[tuple[int, int], tuple[int, int]]:
    """(ns on a core, ns ready to run but waiting for one) of each thread of a process, by
    (pid, tid): its busiest thread is not its main one (Ray Data calls the shard stage from a
    thread), and a thread that ends (a shard's read-ahead) must keep what it had counted, so
    each is read, and carried, on its own. A process or thread gone meanwhile is left out."""
    stats = {}
    with suppress(OSError):
        for thread in os.listdir(f"/proc/{pid}/task"):
            with suppress(OSError, ValueError, IndexError):
                fields = Path(f"/proc/{pid}/task/{thread}/schedstat").read_text().split()
                stats[pid, int(thread)] = (int(fields[0]), int(fields[1]))
    return stats


def machine_ticks() -> tuple[int, int]:
    """(busy, all) clock ticks of every CPU since boot (/proc/stat; idle and iowait are not
    busy)."""
    ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return sum(ticks) - ticks[3] - ticks[4], sum(ticks)


def measure(spec_path: Path, workdir: Path, env: dict, label: str = "this") -> dict:
    spec = yaml.safe_load(spec_path.read_text())
    out = workdir / f"out-{spec_path.stem}"
    shutil.rmtree(out, ignore_errors=True)
    spec["output"]["uri"] = str(out)
    run_spec = workdir / spec_path.name
    run_spec.write_text(yaml.safe_dump(spec))
    started = time.time()
    command = [sys.executable, "-c", "from rayaug.cli import main; main()"]
    child = subprocess.Popen(
        [*command, "run", str(run_spec), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
        cwd=workdir,  # not the checkout: its rayaug would shadow --against's on sys.path
    )
    root = psutil.Process(child.pid)
    roles: dict[int, str] = {}
    samples: list[Sample] = []
    peak_pss = peak_procs = 0
    peak_pss_roles: dict[str, int] = {}
    n = 0
    while child.poll() is None:
        try:
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            break
        now = time.time()
        # A process this sample misses (it ended, or psutil's walk of the tree raced with it)
        # keeps its last reading: counted as nothing, it once halved the actors' steady CPU.
        cpu: dict[int, float] = dict(samples[-1].cpu) if samples else {}
        sched: dict[tuple[int, int], tuple[int, int]] = dict(samples[-1].sched) if samples else {}
        total_pss = 0
        pss_roles: dict[str, int] = defaultdict(int)
        for proc in procs:
            with suppress(psutil.Error):
                times = proc.cpu_times()
                cpu[proc.pid] = times.user + times.system
                if proc.pid not in roles or roles[proc.pid] in ("idle worker", "ray::IDLE"):
                    roles[proc.pid] = role(proc, root.pid)
                if roles[proc.pid] == "shard actor":
                    sched |= thread_schedstats(proc.pid)
                if n % PSS_EVERY == 0:
                    mine = pss_of(proc.pid)
                    total_pss += mine
                    pss_roles[roles[proc.pid]] += mine
        samples.append(Sample(now, cpu, sched, machine_ticks(), time.process_time()))
        if n % PSS_EVERY == 0 and total_pss > peak_pss:
            peak_pss, peak_pss_roles = total_pss, dict(pss_roles)
        peak_procs = max(peak_procs, len(procs))
        n += 1
        time.sleep(INTERVAL)
    stdout, stderr = child.communicate()
    ended = time.time()
    commits = sorted(p.stat().st_mtime for p in (out / "manifests").glob("*.parquet"))
    result = {
        "code": label,
        "spec": spec_path.name,
        "rc": child.returncode,
        "wall_s": round(ended - started, 2),
        "shards": len(commits),
        "peak_pss_mib": round(peak_pss / 2**20),
        "peak_pss_mib_by_role": {k: round(v / 2**20) for k, v in sorted(peak_pss_roles.items())},
        "peak_processes": peak_procs,
        "stderr": stderr,
    }
    with suppress(json.JSONDecodeError):
        result["summary"] = json.loads(stdout)
    if not commits:
        return result
    result["startup_s"] = round(commits[0] - started, 2)
    result["commits_s"] = [round(commit - started, 2) for commit in commits]

    whole = cpu_by_role(roles, {}, samples[-1].cpu) if samples else {}
    result["cpu_whole_run"] = {k: round(v, 2) for k, v in sorted(whole.items())}
    # The window runs between the first and last samples taken within it: their times, not
    # the commits', bound the CPU they measure.
    within = [s for s in samples if commits[0] <= s.at <= commits[-1]]
    if len(commits) >= 3 and len(within) >= 2:
        result |= steady_state(within[0], within[-1], roles)
    return result


def cpu_by_role(
    roles: dict[int, str], before: dict[int, float], after: dict[int, float]
) -> dict[str, float]:
    """CPU seconds of each role between two samples' per-process figures."""
    shares: dict[str, float] = defaultdict(float)
    for pid, seconds in after.items():
        shares[roles.get(pid, "?")] += seconds - before.get(pid, 0.0)
    return dict(shares)


def steady_state(first: Sample, last: Sample, roles: dict[int, str]) -> dict:
    """CPU by role between two samples, Ray's and the driver's share of it, the machine's
    busy share and each role's share of the machine, and the shard actors' threads' wait for
    a core against their time on one."""
    window = last.at - first.at
    steady = cpu_by_role(roles, first.cpu, last.cpu)
    total = sum(steady.values())
    ray_own = total - steady.get("shard actor", 0.0)
    sampling = {"footprint.py (sampling)": last.sampler - first.sampler}
    busy, ticks = (b - a for a, b in zip(first.machine, last.machine, strict=True))
    cores = os.cpu_count() or 1
    on_core = waiting = 0
    for thread, (on, wait) in last.sched.items():
        before = first.sched.get(thread, (0, 0))  # (0, 0): the thread started within it
        on_core, waiting = on_core + on - before[0], waiting + wait - before[1]
    return {
        "steady_window_s": round(window, 2),
        "cpu_steady": {k: round(v, 2) for k, v in sorted(steady.items())},
        "ray_share_steady": round(ray_own / total, 3) if total else None,
        # Load-independent: Ray's and the driver's CPU per second of steady state (in cores).
        "ray_cores_steady": round(ray_own / window, 3),
        "machine_busy_steady": round(busy / ticks, 3) if ticks else None,
        "machine_share_steady": {
            k: round(v / (window * cores), 3) for k, v in (steady | sampling).items()
        },
        "actor_waiting_steady": round(waiting / (on_core + waiting), 3) if on_core else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("specs", nargs="+", type=Path)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument(
        "--against",
        type=Path,
        metavar="DIR",
        help="also run the rayaug package found in DIR (e.g. a `git archive` of another commit, "
        "put first on PYTHONPATH, for the driver and Ray's workers alike), interleaved",
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", AWS_EC2_METADATA_DISABLED="true")
    results = []
    with tempfile.TemporaryDirectory(prefix="fp-", dir="/tmp") as tmp:
        env.setdefault("RAY_TMPDIR", tmp)
        codes = [("this", env)]
        if args.against:
            codes.append(("against", dict(env, PYTHONPATH=str(args.against.resolve()))))
        runs = [
            (i, spec, code) for i in range(args.repeat) for spec in args.specs for code in codes
        ]
        for i, spec, (label, code_env) in runs:
            r = measure(spec, Path(tmp), code_env, label)
            r["round"] = i
            results.append(r)
            steady = r.get("ray_share_steady")
            print(
                f"{r['code']:<8}{r['spec']:<12} rc {r['rc']}  "
                f"start-up {r.get('startup_s', '-'):>5} s  "
                f"wall {r['wall_s']:>6} s  shards {r['shards']:>3}  "
                f"Ray+driver share (steady) {steady if steady is not None else '-'}  "
                f"peak PSS {r['peak_pss_mib']} MiB  procs {r['peak_processes']}",
                flush=True,
            )
            print("   steady:", r.get("cpu_steady"), flush=True)
            print("   whole: ", r.get("cpu_whole_run"), flush=True)
            print(
                "   machine busy (steady):",
                r.get("machine_busy_steady"),
                " its share by role:",
                r.get("machine_share_steady"),
                " shard actors' threads waiting for a core:",
                r.get("actor_waiting_steady"),
                flush=True,
            )
            print(
                "   Ray+driver cores (steady):",
                r.get("ray_cores_steady"),
                " PSS at peak:",
                r.get("peak_pss_mib_by_role"),
                flush=True,
            )
            err = [line for line in r["stderr"].splitlines() if line.strip() and "━" not in line]
            if err:
                print("   stderr:", *err[:6], sep="\n     ", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    sys.exit(max(r["rc"] for r in results))


if __name__ == "__main__":
    main()
