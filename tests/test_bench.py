"""scripts/bench.py keeps working: one small smoke run of every recipe, and the augment stage
alone on the CPU (the GPU check's dry run). It is a benchmark: no time is asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "scripts" / "bench.py"
RECIPES = ("a", "b", "c", "d")
RUNNERS = ("floor", "albumentations", "rayaug")
N = 40


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_bench_quick_reports_every_recipe_runner_and_ratio(tmp_path: Path) -> None:
    pytest.importorskip("albumentations")
    pytest.importorskip("psutil")
    report = tmp_path / "bench.json"
    command = [sys.executable, str(BENCH), "--quick", "--n", str(N),
               "--only", ",".join(RUNNERS), "--json", str(report)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=560)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]

    data = json.loads(report.read_text())
    assert data["config"]["sizes"] == [N]
    assert set(data["config"]["recipes"]) == set(RECIPES)
    assert data["machine"]["cores"] >= 1
    assert set(data["results"]) == set(RECIPES)
    for recipe in RECIPES:
        runs = data["results"][recipe][str(N)]
        assert set(runs) == set(RUNNERS), recipe
        for name in RUNNERS:
            run = runs[name]
            assert run["error"] is None, (recipe, name, run["error"])
            assert run["outputs"] == N and run["complete"], (recipe, name)
            assert run["images_per_second"] > 0, (recipe, name)
            assert run["wall_seconds"] > 0 and run["peak_rss_bytes"] > 0, (recipe, name)
            assert run["commits"] >= 1 and run["startup_seconds"] > 0, (recipe, name)
            assert "steady_images_per_second" in run, (recipe, name)
        ratios = data["ratios"][recipe][str(N)]
        assert set(ratios) == {"floor", "albumentations"}, recipe
        for peer in ratios.values():
            assert set(peer) == {"end_to_end", "steady_state"}
            assert peer["end_to_end"] > 0
        assert data["targets"][recipe], recipe
    assert "rayaug ÷ peer, end to end / steady state" in done.stdout
    assert "summary: rayaug ÷ Albumentations" in done.stdout


@pytest.mark.timeout(300)
def test_augment_only_runs_every_recipe_on_the_cpu_without_ray(tmp_path: Path) -> None:
    """The GPU check's bench mode, dry-run on the CPU: Augmenter alone, Ray refused on import."""
    report = tmp_path / "augment.json"
    command = [sys.executable, str(BENCH), "--augment-only", "--device", "cpu", "--n", "24",
               "--batch-size", "8", "--json", str(report)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    data = json.loads(report.read_text())
    assert data["mode"] == "augment-only" and data["device"] == "cpu"
    assert set(data["results"]) == set(RECIPES)
    for recipe, result in data["results"].items():
        assert result["samples"] == 24 and result["quarantined"] == 0, recipe
        assert result["images_per_second"] > 0, recipe
