"""When each start-up step of a `rayaug run` begins and ends, seconds from process start.

Runs `rayaug run SPEC --json` in this process with timing wrappers around the driver's own
functions (nothing else changes): the imports, `prepare` (storage checks, listing, plan),
`start_local_ray` (ray.init, in whichever thread runs it), `LocalRayStart.wait`, `_pipeline`,
the first commit row, and the first committed manifest's modification time. Works on older
commits too (PYTHONPATH=DIR of a `git archive`): a wrapper whose function is absent is skipped.
For a node this process started, the node's own steps too, from its session folder: when each
process wrote its port file, when the raylet came up and started its prestarted workers, when
they registered, and when the driver's registration was answered (Ray holds it for them).

    .venv/bin/python scripts/startup_steps.py SPEC.yaml   # the output should not exist yet
"""

from __future__ import annotations

import functools
import glob
import importlib
import importlib.util
import os
import re
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

import yaml


def _process_start() -> float:
    """This process's start, epoch seconds, to the clock tick: psutil's create_time adds the
    boot time in whole seconds (/proc/stat's btime), up to a second off."""
    ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")


T0 = _process_start()
marks: list[tuple[float, str]] = []


def mark(name: str, start: float | None = None) -> None:
    now = time.time() - T0
    if start is not None:
        thread = threading.current_thread().name
        name = f"{name} [{start:.2f} -> {now:.2f}, {now - start:.2f} s, {thread}]"
    marks.append((now, name))


def wrap(owner: object, name: str) -> None:
    function = getattr(owner, name, None)
    if function is None:
        return

    @functools.wraps(function)
    def timed(*args, **kwargs):
        start = time.time() - T0
        try:
            return function(*args, **kwargs)
        finally:
            mark(name, start)

    setattr(owner, name, timed)


def _has_local_ray() -> bool:
    """Whether rayaug has its embedded Ray in a module of its own (older commits: in job)."""
    return importlib.util.find_spec("rayaug.local_ray") is not None


def main() -> None:
    mark("interpreter up")
    from rayaug import cli

    mark("import rayaug.cli")
    from rayaug import api, job  # noqa: F401 - their import is a step

    mark("import rayaug.api, rayaug.job")
    node = importlib.import_module("rayaug.local_ray") if _has_local_ray() else job
    for name in ("prepare", "_connect", "_pipeline"):
        wrap(job, name)
    wrap(node, "start_local_ray")
    if hasattr(node, "LocalRayStart"):
        wrap(node.LocalRayStart, "wait")
    add = job.Tally.add

    def first_add(self, shard, new):
        if new and not any("first commit" in m for _, m in marks):
            mark("first commit row reaches the driver")
        return add(self, shard, new)

    job.Tally.add = first_add
    spec = sys.argv[1]
    with open(spec) as file:
        out = yaml.safe_load(file)["output"]["uri"]
    sessions: list[str] = []
    start_local_ray = getattr(node, "start_local_ray", None)
    if start_local_ray is not None:

        def recorded(*args, **kwargs):
            start_local_ray(*args, **kwargs)
            import ray

            sessions.append(ray._private.worker._global_node.get_session_dir_path())

        for owner in {node, job}:  # the driver's `_connect` calls it by its own name
            if hasattr(owner, "start_local_ray"):
                owner.start_local_ray = recorded
    try:
        cli.main(["run", spec, "--json"], standalone_mode=False)
    finally:
        commits = sorted(map(os.path.getmtime, glob.glob(f"{out}/manifests/*.parquet")))
        if commits:
            marks.append((commits[0] - T0, "first manifest on disk (start-up)"))
        for session in sessions:
            marks.extend(node_marks(Path(session)))
        for at, name in sorted(marks):
            print(f"{at:7.2f}  {name}", file=sys.stderr)


# A line of Ray's C++ logs: "[2026-12-06 18:27:19,438 I 6610 6616] file.cc:144: message"
LOG_LINE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) [A-Z] [^]]*\] (.*)$")
NODE_EVENTS = {  # log file pattern -> {what a line says: the mark's name}
    "raylet.out": {
        "Raylet of id": "node: raylet up",
        "Started worker process": "node: raylet starts a worker",
    },
    "python-core-worker-*.log": {"worker server started": "node: a worker registers"},
    "python-core-driver-*.log": {
        "Constructing CoreWorkerProcess": "node: driver asks to register",
        "driver server started": "node: driver registered",
    },
}


def node_marks(session: Path) -> list[tuple[float, str]]:
    """The node's steps, seconds from this process's start: its port files' modification times,
    and every line of its logs that says one of NODE_EVENTS' messages."""
    found = [
        (path.stat().st_mtime - T0, f"node: {path.name.rsplit('_port', 1)[0]} port written")
        for path in session.glob("*_port_*")
    ]
    for pattern, events in NODE_EVENTS.items():
        for log in sorted((session / "logs").glob(pattern)):
            for line in log.read_text(errors="replace").splitlines():
                matched = LOG_LINE.match(line)
                if matched is None:
                    continue
                names = [name for says, name in events.items() if says in matched.group(2)]
                if names:  # the time parsed only for the few lines that count
                    stamp = datetime.strptime(matched.group(1), "%Y-%m-%d %H:%M:%S,%f")
                    found += [(stamp.timestamp() - T0, name) for name in names]
    return found


if __name__ == "__main__":
    main()
