"""scripts/bench.py keeps working: one small smoke run. It is a benchmark: no time is asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUNNERS = ("floor", "albumentations", "rayaug")
N = 40


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_bench_quick_reports_every_runner_and_the_ratios(tmp_path: Path) -> None:
    pytest.importorskip("albumentations")
    pytest.importorskip("psutil")
    report = tmp_path / "bench.json"
    command = [sys.executable, str(ROOT / "scripts" / "bench.py"), "--quick", "--n", str(N),
               "--only", ",".join(RUNNERS), "--json", str(report)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]

    data = json.loads(report.read_text())
    assert data["config"]["sizes"] == [N]
    assert data["machine"]["cores"] >= 1
    runs = data["runs"][str(N)]
    assert set(runs) == set(RUNNERS)
    for name in RUNNERS:
        run = runs[name]
        assert run["error"] is None, run["error"]
        assert run["outputs"] == N and run["complete"], name
        assert run["images_per_second"] > 0, name
        assert run["wall_seconds"] > 0 and run["peak_rss_bytes"] > 0, name
    assert set(data["ratios"][str(N)]) == {"floor", "albumentations"}
    assert all(ratio > 0 for ratio in data["ratios"][str(N)].values())
    assert data["rayaug_startup_seconds"][str(N)] > 0
    assert "rayaug img/s ÷ peer img/s" in done.stdout
