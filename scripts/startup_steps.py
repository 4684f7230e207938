"""When each start-up step of a `rayaug run` begins and ends, seconds from process start.

Runs `rayaug run SPEC --json` in this process with timing wrappers around the driver's own
functions (nothing else changes): the imports, `prepare` (storage checks, listing, plan),
`start_local_ray` (ray.init, in whichever thread runs it), `LocalRayStart.wait`, `_pipeline`,
the first commit row, and the first committed manifest's modification time. Works on older
commits too (PYTHONPATH=DIR of a `git archive`): a wrapper whose function is absent is skipped.

    .venv/bin/python scripts/startup_steps.py SPEC.yaml   # the output should not exist yet
"""

from __future__ import annotations

import functools
import glob
import os
import sys
import threading
import time
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


def main() -> None:
    mark("interpreter up")
    from rayaug import cli

    mark("import rayaug.cli")
    from rayaug import api, job  # noqa: F401 - their import is a step

    mark("import rayaug.api, rayaug.job")
    for name in ("prepare", "start_local_ray", "_connect", "_pipeline"):
        wrap(job, name)
    if hasattr(job, "LocalRayStart"):
        wrap(job.LocalRayStart, "wait")
    add = job.Tally.add

    def first_add(self, shard, new):
        if new and not any("first commit" in m for _, m in marks):
            mark("first commit row reaches the driver")
        return add(self, shard, new)

    job.Tally.add = first_add
    spec = sys.argv[1]
    with open(spec) as file:
        out = yaml.safe_load(file)["output"]["uri"]
    try:
        cli.main(["run", spec, "--json"], standalone_mode=False)
    finally:
        commits = sorted(map(os.path.getmtime, glob.glob(f"{out}/manifests/*.parquet")))
        if commits:
            marks.append((commits[0] - T0, "first manifest on disk (start-up)"))
        for at, name in sorted(marks):
            print(f"{at:7.2f}  {name}", file=sys.stderr)


if __name__ == "__main__":
    main()
