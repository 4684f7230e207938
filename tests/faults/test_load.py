"""Fault 10: load. A job of 20,000 small images in 200 shards completes with bounded driver
memory and a constant number of open files.

One job covers both sizes the issue names (20,000 images; 200 shards): on two cores every
shard costs about a quarter of a second of Ray scheduling whatever it holds (measured: 200
tar shards of 5 images took 57 s, 20,000 images in 200 shards 47 s), so a second job of 200
small shards would double the test's time to learn nothing the first does not show.

The driver is the installed `rayaug run` script in a subprocess joined to the session Ray (what
a user runs), so its memory and file descriptors are its own: sampled from /proc while it runs,
and its peak RSS read from the kernel's rusage when it exits (`os.wait4`). The bounds are
generous (a leak of a few KB per sample or one descriptor per shard would cross them); nothing
here asserts a time.
"""

from __future__ import annotations

import io
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from PIL import Image

from rayaug import outputs
from rayaug.reports.summary import verify
from rayaug.spec import StorageSpec
from rayaug.storage import open_location

IMAGES = 20_000
SHARD_SIZE = 100  # → 200 shards
RSS_GROWTH_LIMIT = 500 * 2**20  # bytes over the driver's RSS once the job is running
FD_GROWTH_LIMIT = 48  # descriptors over those open once the job is running (one per shard: 200)


def _write_images(root: Path, count: int) -> None:
    """`count` 16x16 JPEGs in 10 class folders (64 distinct pictures, reused)."""
    pictures = []
    for i in range(64):
        buffer = io.BytesIO()
        Image.new("RGB", (16, 16), (4 * i, 255 - 4 * i, (37 * i) % 256)).save(buffer, "JPEG")
        pictures.append(buffer.getvalue())
    for label in range(10):
        (root / f"c{label}").mkdir(parents=True)
    for i in range(count):
        (root / f"c{i % 10}" / f"{i:06d}.jpg").write_bytes(pictures[i % 64])


def _rss(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _open_files(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def _committed(out: Path) -> int:
    try:
        return sum(1 for name in os.listdir(out / "manifests") if name.endswith(".parquet"))
    except OSError:
        return 0


@pytest.mark.slow
def test_20000_images_in_200_shards_bounded_driver_memory_and_open_files(
    ray_cluster: str, tmp_path: Path
) -> None:
    source, out = tmp_path / "in", tmp_path / "out"
    _write_images(source, IMAGES)
    job = tmp_path / "job.yaml"
    job.write_text(
        yaml.safe_dump(
            {
                "input": {"uri": str(source)},
                "output": {"uri": str(out), "shard_size": SHARD_SIZE},
                "views": 1,
                "ops": [{"name": "horizontal_flip"}],
                "execution": {"batch_size": 256},
            }
        )
    )
    log = tmp_path / "driver.log"
    script = Path(sys.executable).parent / "rayaug"
    with open(tmp_path / "summary.json", "wb") as stdout, open(log, "wb") as stderr:
        driver = subprocess.Popen(
            [str(script), "run", str(job), "--address", ray_cluster, "--json"],
            stdout=stdout,
            stderr=stderr,
            env=os.environ | {"RAY_ADDRESS": ""},
        )
    # (shards committed, RSS bytes, open descriptors), sampled while the driver runs
    samples: list[tuple[int, int, int]] = []
    deadline = time.monotonic() + 540
    while True:
        pid, status, usage = os.wait4(driver.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() > deadline:
            driver.kill()
            driver.wait()
            pytest.fail(f"the driver did not finish in 9 minutes: {log.read_text()[-3000:]}")
        rss, fds, committed = _rss(driver.pid), _open_files(driver.pid), _committed(out)
        if rss is not None and fds is not None:
            samples.append((committed, rss, fds))
        time.sleep(0.2)
    driver.returncode = os.waitstatus_to_exitcode(status)
    assert driver.returncode == 0, log.read_text()[-3000:]

    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["samples"] == IMAGES and summary["shards"] == IMAGES // SHARD_SIZE
    assert summary["quarantined"] == 0
    output = outputs.recorded_output(open_location(str(out), StorageSpec()))
    assert verify(output) == []

    running = [s for s in samples if s[0] >= 1]  # from the first commit on: Ray joined, planned
    assert len(running) >= 10, f"too few samples while the job ran: {samples}"
    base_rss, base_fds = running[0][1], running[0][2]
    peak_rss = max(usage.ru_maxrss * 1024, *(s[1] for s in running))
    assert peak_rss - base_rss < RSS_GROWTH_LIMIT, (
        f"driver RSS grew {(peak_rss - base_rss) / 2**20:.0f} MB "
        f"(from {base_rss / 2**20:.0f} MB once running to a peak of {peak_rss / 2**20:.0f} MB)"
    )
    fds = [s[2] for s in running]
    assert max(fds) - base_fds <= FD_GROWTH_LIMIT, f"open files grew: {fds}"
    # No trend: the last quarter of the run holds about as many descriptors as the first.
    quarter = max(1, len(fds) // 4)
    early, late = statistics.median(fds[:quarter]), statistics.median(fds[-quarter:])
    assert late - early <= 24, f"open files trend upwards: {fds}"
    print(
        f"{len(samples)} samples; RSS {base_rss / 2**20:.0f} → peak {peak_rss / 2**20:.0f} MB; "
        f"fds {base_fds} → max {max(fds)} (median {early} early, {late} late); "
        f"{summary['wall_seconds']:.1f}s, {summary['samples_per_second']:.0f} samples/s"
    )
