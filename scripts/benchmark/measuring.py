"""What is measured of a runner: its process tree's wall time and memory (RSS, PSS), and the
commit times of its output files, from which start-up and steady state follow."""

from __future__ import annotations

import json
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from . import ROOT

PSS_EVERY = 5  # PSS on every 5th memory sample (every ~1 s): reading it costs CPU


def pss_of(pid: int) -> int:
    """Proportional set size in bytes (shared pages split between sharers); 0 if unreadable."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as rollup:
            for line in rollup:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


class TreeMonitor:
    """Samples the RSS (and PSS) sum of a process and all its descendants in a thread.

    RSS counts shared pages (libraries, Ray's object store, fork copy-on-write) once per
    process that maps them, so a tree of many similar processes sums high; PSS splits them.
    """

    def __init__(self, pid: int, interval: float = 0.2) -> None:
        self.root = psutil.Process(pid)
        self.interval = interval
        self.seen: dict[int, Any] = {pid: self.root}
        self.peak_rss = self.peak_pss = self.peak_procs = self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> TreeMonitor:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _tree(self) -> list[Any]:
        try:
            return [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            return []

    def sample(self) -> None:
        """RSS every call; PSS (costly: ~1 ms per large process) every PSS_EVERY-th call."""
        with_pss = self.samples % PSS_EVERY == 0
        self.samples += 1
        rss = pss = 0
        tree = self._tree()
        for proc in tree:
            self.seen.setdefault(proc.pid, proc)
            try:
                rss += proc.memory_info().rss
            except psutil.Error:
                continue
            pss += pss_of(proc.pid) if with_pss else 0
        self.peak_rss, self.peak_pss = max(self.peak_rss, rss), max(self.peak_pss, pss)
        self.peak_procs = max(self.peak_procs, len(tree))

    def _loop(self) -> None:
        while True:
            self.sample()
            if self._stop.wait(self.interval):
                return

    def reap(self, grace: float = 10.0) -> int:
        """Stop descendants still alive after the root exited (only processes it started)."""
        alive = [p for pid, p in self.seen.items() if pid != self.root.pid and p.is_running()]
        if not alive:
            return 0
        _, alive = psutil.wait_procs(alive, timeout=grace)
        for proc in alive:
            with suppress(psutil.Error, OSError):
                proc.terminate()
        _, alive = psutil.wait_procs(alive, timeout=5)
        for proc in alive:
            with suppress(psutil.Error, OSError):
                proc.kill()
        return len(alive)


@dataclass
class Measured:
    returncode: int
    started_at: float  # epoch seconds, just before the process was started
    wall_seconds: float
    peak_rss_bytes: int
    peak_pss_bytes: int
    peak_processes: int
    stdout: str


@dataclass
class Result:
    """One runner's run of one recipe at one size and number of views. A sample = one view."""

    runner: str
    recipe: str
    views: int
    sources: int
    samples: int  # expected: sources x views
    outputs: int = 0
    complete: bool = False
    wall_seconds: float | None = None
    samples_per_second: float | None = None  # end to end: outputs / (process start to exit)
    # After every worker's first commit: samples committed after the workers-th commit /
    # (last commit - workers-th commit)
    steady_samples_per_second: float | None = None
    startup_seconds: float | None = None  # process start to first commit
    steady_seconds: float | None = None  # workers-th commit to last commit
    workers: int = 1  # processes working side by side (pool processes, rayaug's actors)
    commits: int = 0
    peak_rss_bytes: int | None = None
    peak_pss_bytes: int | None = None
    peak_processes: int | None = None
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def good(self) -> bool:
        return self.complete and not self.error and bool(self.samples_per_second)


def measure(command: Sequence[str], env: dict[str, str], log: Path) -> Measured:
    """Run `command` to its end, timing it and sampling the memory of its process tree."""
    with open(log, "wb") as err, tempfile.TemporaryFile() as out:
        started_at, started = time.time(), time.monotonic()
        proc = subprocess.Popen(
            command, stdout=out, stderr=err, env=env, cwd=ROOT, stdin=subprocess.DEVNULL
        )
        with TreeMonitor(proc.pid) as monitor:
            try:
                proc.wait()
            except BaseException:
                proc.kill()
                proc.wait()
                raise
            finally:
                wall = time.monotonic() - started
                monitor.reap()
        out.seek(0)
        stdout = out.read().decode(errors="replace")
    return Measured(
        proc.returncode,
        started_at,
        wall,
        monitor.peak_rss,
        monitor.peak_pss,
        monitor.peak_procs,
        stdout,
    )


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def finish(
    result: Result, measured: Measured, log: Path, commits: list[tuple[float, int]]
) -> Result:
    """Fill `result` from the measured process and its commits (time, samples)."""
    result.wall_seconds = round(measured.wall_seconds, 3)
    result.peak_rss_bytes, result.peak_pss_bytes = measured.peak_rss_bytes, measured.peak_pss_bytes
    result.peak_processes = measured.peak_processes
    if measured.returncode != 0:
        result.error = f"exit {measured.returncode}; log {log}:\n{_tail(log)}"
    result.complete = result.outputs == result.samples
    if result.outputs:
        result.samples_per_second = round(result.outputs / measured.wall_seconds, 2)
    steady_state(result, commits, measured.started_at)
    return result


def steady_state(result: Result, commits: list[tuple[float, int]], started_at: float) -> None:
    """Start-up and steady-state figures from (commit time, samples) pairs (epoch seconds).

    Steady state starts once each of the result's workers has committed once (its
    `workers`-th commit): the workers start together, so a shard committed just after the
    first commit was made before it, and counting it would credit a runner for the size of
    its first shards rather than for its rate."""
    if not commits:
        return
    commits = sorted(commits)
    result.commits = len(commits)
    result.startup_seconds = round(commits[0][0] - started_at, 3)
    begun = min(result.workers, len(commits)) - 1
    begin, last = commits[begun][0], commits[-1][0]
    result.steady_seconds = round(last - begin, 3)
    if len(commits) > begun + 1 and last - begin >= 0.01:
        after = sum(samples for _, samples in commits[begun + 1 :])
        result.steady_samples_per_second = round(after / (last - begin), 2)


def last_json(stdout: str) -> dict[str, Any]:
    """The JSON document a child printed last (rayaug --json prints an indented one)."""
    start = stdout.rfind("\n{")
    text = stdout[start + 1 :] if start >= 0 else stdout
    try:
        return json.loads(text)
    except ValueError:
        return {}


def committed_files(filesystem: Any, base: str, suffix: str) -> list[tuple[float, int]]:
    """(modification time, samples) of each file under `base` ending in `suffix`: a Parquet
    file's rows from its footer, an image file counts one. Commit times for steady state."""
    import pyarrow.parquet as pq
    from pyarrow import fs

    infos = filesystem.get_file_info(fs.FileSelector(base, recursive=True, allow_not_found=True))
    commits = []
    for info in infos:
        if info.type != fs.FileType.File or not info.path.endswith(suffix):
            continue
        rows = 1
        if suffix == ".parquet":
            with filesystem.open_input_file(info.path) as handle:
                rows = pq.ParquetFile(handle).metadata.num_rows
        commits.append((info.mtime.timestamp(), rows))
    return commits


def parquet_rows(filesystem: Any, base: str) -> int:
    """Rows in every .parquet file under `base` (footers only)."""
    return sum(rows for _, rows in committed_files(filesystem, base, ".parquet"))


def local_fs() -> Any:
    from pyarrow import fs

    return fs.LocalFileSystem()
