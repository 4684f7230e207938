"""Where a `rayaug run` spends its start-up, CPU and memory, process by process.

Runs `rayaug run SPEC --json` (a fresh output each time) as a child process and samples its
whole process tree (Ray's GCS, raylet, agents, workers and actors included) every 0.2 s with
psutil: each process's CPU seconds and, every few samples, the PSS of the tree. Commit times
are the modification times of `manifests/*.parquet` (a shard's commit). Prints, per run:

  start-up     process start -> first commit
  steady       first commit -> last commit: CPU seconds per process role in that window, and
               the share of the tree's CPU taken by everything but the shard actors (Ray's own
               processes and the driver)
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
    # pid -> (role, create_time); samples: (t, {pid: cpu seconds})
    roles: dict[int, str] = {}
    samples: list[tuple[float, dict[int, float]]] = []
    peak_pss = peak_procs = 0
    peak_pss_roles: dict[str, int] = {}
    n = 0
    while child.poll() is None:
        try:
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            break
        now = time.time()
        cpu: dict[int, float] = {}
        total_pss = 0
        pss_roles: dict[str, int] = defaultdict(int)
        for proc in procs:
            with suppress(psutil.Error):
                times = proc.cpu_times()
                cpu[proc.pid] = times.user + times.system
                if proc.pid not in roles or roles[proc.pid] in ("idle worker", "ray::IDLE"):
                    roles[proc.pid] = role(proc, root.pid)
                if n % PSS_EVERY == 0:
                    mine = pss_of(proc.pid)
                    total_pss += mine
                    pss_roles[roles[proc.pid]] += mine
        samples.append((now, cpu))
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

    def at(t: float) -> dict[int, float]:
        """CPU seconds per pid at the sample nearest time t (a pid absent then: 0)."""
        return min(samples, key=lambda s: abs(s[0] - t))[1] if samples else {}

    def by_role(a: dict[int, float], b: dict[int, float]) -> dict[str, float]:
        shares: dict[str, float] = defaultdict(float)
        for pid, seconds in b.items():
            shares[roles.get(pid, "?")] += seconds - a.get(pid, 0.0)
        return dict(shares)

    last: dict[int, float] = {}
    for _, cpu in samples:
        last.update(cpu)
    whole = by_role({}, last)
    result["cpu_whole_run"] = {k: round(v, 2) for k, v in sorted(whole.items())}
    if len(commits) >= 3:
        steady = by_role(at(commits[0]), at(commits[-1]))
        total = sum(steady.values())
        ray_own = total - steady.get("shard actor", 0.0)
        result["steady_window_s"] = round(commits[-1] - commits[0], 2)
        result["cpu_steady"] = {k: round(v, 2) for k, v in sorted(steady.items())}
        result["ray_share_steady"] = round(ray_own / total, 3) if total else None
        # Load-independent: Ray's and the driver's CPU per second of steady state (in cores).
        result["ray_cores_steady"] = round(ray_own / (commits[-1] - commits[0]), 3)
    return result


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
