"""The benchmark (scripts/benchmark, run by scripts/bench) keeps working: small smoke runs
of every recipe at 1 and 8 views (rayaug through Ray for one of them), the Albumentations
runner's views drawn from one decode, the phone photos, and the augment stage alone on the
CPU (the GPU check's dry run). It is a benchmark: no time is asserted."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
RECIPES = ("a", "b", "c", "d")
RUNNERS = ("floor", "albumentations", "rayaug")
VIEWS = ("1", "8")
N = 40  # output samples: 40 sources at 1 view, 5 at 8 views


def bench(*args: str, timeout: int) -> subprocess.CompletedProcess:
    env = os.environ | {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(SCRIPTS), os.environ.get("PYTHONPATH")]))
    }
    return subprocess.run(
        [sys.executable, "-m", "benchmark", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def benchmark_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(SCRIPTS))


@pytest.mark.slow
@pytest.mark.timeout(900)  # 8 process trees, 2 of them Ray: minutes on a shared 2-core machine
def test_bench_quick_reports_runners_views_and_ratio(tmp_path: Path) -> None:
    """The whole report, with rayaug run through Ray, for the recipe of jobs/imagenet.yaml
    (c). Every recipe's rayaug spec runs through the augment stage in
    test_augment_only_runs_every_recipe_and_views_on_the_cpu_without_ray, and the peers of
    every recipe in the test below: a Ray run per recipe and views would add minutes to CI
    and nothing that those two do not check."""
    pytest.importorskip("albumentations")
    pytest.importorskip("psutil")
    data, stdout = quick_bench(tmp_path, "c", RUNNERS)
    assert set(data["config"]["recipes"]) == {"c"}
    assert data["machine"]["cores"] >= 1
    assert set(data["results"]) == {"c"}
    assert_runs_complete(data, "c", RUNNERS)
    for views in VIEWS:
        ratios = data["ratios"]["c"][views][str(N)]
        assert set(ratios) == {"floor", "albumentations"}, views
        for peer in ratios.values():
            assert set(peer) == {"end_to_end", "steady_state", "rounds"}
            assert peer["end_to_end"] > 0
            assert peer["rounds"] == [{k: peer[k] for k in ("end_to_end", "steady_state")}]
    assert set(data["targets"]["c"]) == {
        f"{kind}_views_{views}_at_{N}_ge_{bound}"
        for views in VIEWS
        for kind, bound in (("end_to_end", 1.0), ("steady_state", 1.2))
    }
    assert "rayaug ÷ peer, end to end / steady state" in stdout
    assert "V=1 N=40" in stdout and "V=8 N=40" in stdout
    assert "summary: rayaug ÷ Albumentations" in stdout


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_bench_quick_runs_the_peers_of_every_other_recipe(tmp_path: Path) -> None:
    pytest.importorskip("albumentations")
    pytest.importorskip("psutil")
    others = [recipe for recipe in RECIPES if recipe != "c"]
    peers = ("floor", "albumentations")
    data, stdout = quick_bench(tmp_path, ",".join(others), peers)
    assert set(data["results"]) == set(others)
    for recipe in others:
        assert_runs_complete(data, recipe, peers)
    assert "no ratios: rayaug and at least one peer must both run" in stdout


def quick_bench(tmp_path: Path, recipes: str, runners: tuple[str, ...]) -> tuple[dict, str]:
    report = tmp_path / "bench.json"
    done = bench(
        "--quick",
        "--recipe",
        recipes,
        "--n",
        str(N),
        "--views",
        ",".join(VIEWS),
        "--only",
        ",".join(runners),
        "--json",
        str(report),
        timeout=850,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    data = json.loads(report.read_text())
    assert data["config"]["views"] == [1, 8]
    assert data["config"]["sizes"] == {views: [N] for views in VIEWS}
    return data, done.stdout


def assert_runs_complete(data: dict, recipe: str, runners: tuple[str, ...]) -> None:
    assert set(data["results"][recipe]) == set(VIEWS), recipe
    for views in VIEWS:
        runs = data["results"][recipe][views][str(N)]
        assert set(runs) == set(runners), (recipe, views)
        for name in runners:
            assert len(runs[name]) == 1, (recipe, views, name)  # one round
            run = runs[name][0]
            where = (recipe, views, name)
            assert run["error"] is None, (where, run["error"])
            assert run["views"] == int(views) and run["sources"] * int(views) == N, where
            assert run["outputs"] == N and run["complete"], where
            assert run["samples_per_second"] > 0, where
            assert run["wall_seconds"] > 0 and run["peak_rss_bytes"] > 0, where
            assert run["commits"] >= 1 and run["startup_seconds"] > 0, where
            assert "steady_samples_per_second" in run, where


def test_albumentations_draws_every_view_from_one_decode(
    benchmark_package: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a user writes: cv2.imdecode once per source, the Compose once per view."""
    pytest.importorskip("albumentations")
    cv2 = pytest.importorskip("cv2")
    import pyarrow.parquet as pq
    from benchmark.photos import list_images
    from benchmark.recipes import RECIPES as TABLE
    from benchmark.runners import pool

    from rayaug import sampledata

    sampledata.write_folder(sampledata.make_photos(3, seed=5), tmp_path / "images")
    items = list_images(tmp_path / "images")
    real_imdecode, decodes = cv2.imdecode, []

    def counting_imdecode(*args: object) -> object:
        decodes.append(args)
        return real_imdecode(*args)

    monkeypatch.setattr(cv2, "imdecode", counting_imdecode)
    monkeypatch.setattr(pool, "_RECIPE", TABLE["c"])
    monkeypatch.setattr(pool, "_VIEWS", 4)
    monkeypatch.setattr(pool, "_ALBU", None)  # set by _albu_init: restored after the test
    pool._albu_init(None)
    assert pool._albu_shard((0, items, tmp_path)) == 12
    assert len(decodes) == 3
    keys = pq.read_table(tmp_path / "part-00000.parquet").column("key").to_pylist()
    assert keys == [f"{key}#{view}" for key, _ in items for view in range(4)]


def test_phone_photos_are_12_megapixel_jpegs_of_a_phones_size(benchmark_package: None) -> None:
    pytest.importorskip("skimage")
    from benchmark.photos import PHONE_SIZE, phone_jpeg
    from PIL import Image

    from rayaug import sampledata

    source = next(iter(sampledata.source_photos().values()))
    jpeg = phone_jpeg(source, 0, seed=2)
    with Image.open(io.BytesIO(jpeg)) as image:
        assert sorted(image.size) == sorted(PHONE_SIZE) and image.format == "JPEG"
    assert 2.0 * 2**20 < len(jpeg) < 6 * 2**20  # a real 12 MP phone JPEG: 2.5-5 MB


@pytest.mark.timeout(300)
def test_augment_only_runs_every_recipe_and_views_on_the_cpu_without_ray(tmp_path: Path) -> None:
    """The GPU check's bench mode, dry-run on the CPU: Augmenter alone, Ray refused on import."""
    report = tmp_path / "augment.json"
    done = bench(
        "--augment-only",
        "--device",
        "cpu",
        "--n",
        "24",
        "--views",
        "1,8",
        "--batch-size",
        "8",
        "--json",
        str(report),
        timeout=280,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    data = json.loads(report.read_text())
    assert data["mode"] == "augment-only" and data["device"] == "cpu"
    assert data["config"]["views"] == [1, 8]
    assert set(data["results"]) == set(VIEWS)
    for views, by_recipe in data["results"].items():
        assert set(by_recipe) == set(RECIPES), views
        for recipe, result in by_recipe.items():
            assert result["samples"] == 24 and result["quarantined"] == 0, (views, recipe)
            assert result["views"] == int(views), (views, recipe)
            assert result["samples_per_second"] > 0, (views, recipe)


@pytest.mark.timeout(300)
def test_augment_only_times_the_albumentations_loop_beside_rayaugs_stage(tmp_path: Path) -> None:
    """`--loop`: the loop's samples of the same photos (recipe d's with their boxes), and the
    ratio of the two rates; only with --augment-only on the CPU."""
    pytest.importorskip("albumentations")
    report = tmp_path / "augment.json"
    common = ("--augment-only", "--recipe", "c,d", "--views", "1,8", "--n", "16", "--loop")
    done = bench(*common, "--json", str(report), timeout=280)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    data = json.loads(report.read_text())
    assert data["config"]["loop"] is True
    for views, by_recipe in data["results"].items():
        for recipe, result in by_recipe.items():
            loop = result["loop"]
            assert loop["samples"] == result["expected"] == 16, (views, recipe)
            assert loop["samples_per_second"] > 0 and loop["seconds"] > 0, (views, recipe)
            rate = result["samples_per_second"] / loop["samples_per_second"]
            assert result["ratio"] == pytest.approx(rate, rel=0.01), (views, recipe)
    assert "Albumentations, each source decoded once" in done.stdout
    refused = bench(*common, "--device", "cuda", timeout=60)
    assert refused.returncode == 2
    assert "--loop goes with --augment-only on the cpu" in refused.stderr


def test_no_4n_runs_each_photo_set_at_n_only(benchmark_package: None) -> None:
    """`--no-4n` runs N alone, as --quick does, at the N asked for: a 20,000-sample run of a
    generated set without generating four times its photos."""
    from benchmark.__main__ import parse_args, sizes

    assert sizes(parse_args(["--photos", "varied"])) == [20_000, 80_000]
    assert sizes(parse_args(["--photos", "varied", "--no-4n"])) == [20_000]
    assert sizes(parse_args(["--quick", "--n", "40"])) == [40]


def test_rounds_alternate_the_runners_and_take_the_median_of_each_rounds_ratio(
    benchmark_package: None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`--rounds 3`: the runners three times, the order reversed in the second round (no
    runner always first), and each ratio the median of the rounds' own ratios, a round
    where a runner failed left out; every round's ratio is printed under the median."""
    from benchmark import __main__ as bench_main
    from benchmark.measuring import Result
    from benchmark.photos import Photos
    from benchmark.recipes import RECIPES as TABLE
    from benchmark.report import print_recipe, ratios, targets
    from benchmark.runners import Setting

    # (end to end, steady) samples/s by round and runner; Albumentations fails round 2
    rates = {
        (1, "albumentations"): (1000.0, 1000.0),
        (1, "rayaug"): (1000.0, 1500.0),
        (2, "albumentations"): None,
        (2, "rayaug"): (900.0, 900.0),
        (3, "albumentations"): (1000.0, 1000.0),
        (3, "rayaug"): (1300.0, 1300.0),
    }
    order = []

    def run_one(
        name: str, recipe, photos: Photos, views: int, setting, round_number: int
    ) -> Result:
        order.append((round_number, name))
        rate = rates[round_number, name]
        samples = photos.sources * views
        if rate is None:  # produced nothing
            return Result(name, recipe.key, views, photos.sources, samples, error="exit 1")
        return Result(
            name,
            recipe.key,
            views,
            photos.sources,
            samples,
            outputs=samples,
            complete=True,
            samples_per_second=rate[0],
            steady_samples_per_second=rate[1],
            startup_seconds=float(round_number),
            commits=10,
        )

    photos = Photos(tmp_path, tmp_path / "annotations.json", 10, "test")
    monkeypatch.setattr(bench_main, "run_one", run_one)
    monkeypatch.setattr(bench_main, "inputs_for", lambda args, views, run_dir: [photos])
    args = bench_main.parse_args(
        ["--recipe", "c", "--views", "8", "--rounds", "3", "--only", "albumentations,rayaug"]
    )
    results = bench_main.run_all(args, Setting(tmp_path, tmp_path, False, False))

    assert order == [
        (1, "albumentations"),
        (1, "rayaug"),
        (2, "rayaug"),
        (2, "albumentations"),
        (3, "albumentations"),
        (3, "rayaug"),
    ]
    assert [len(runs) for runs in results["c"][8][80].values()] == [3, 3]
    table = ratios(results)
    cell = table["c"]["8"]["80"]["albumentations"]
    assert cell["rounds"] == [
        {"end_to_end": 1.0, "steady_state": 1.5},
        {"end_to_end": None, "steady_state": None},
        {"end_to_end": 1.3, "steady_state": 1.3},
    ]
    assert (cell["end_to_end"], cell["steady_state"]) == (1.15, 1.4)
    assert all(targets(table)["c"].values())  # 1.15 ≥ 1.0 and 1.4 ≥ 1.2
    capsys.readouterr()
    print_recipe(TABLE["c"], results["c"], table)
    printed = capsys.readouterr().out
    assert "the median of 3 rounds, then each round's" in printed
    assert "1.15 / 1.40" in printed and "round 2" in printed and "- / -" in printed


def test_steady_state_begins_once_every_worker_has_committed(benchmark_package: None) -> None:
    """Two workers' first shards, made side by side, commit 0.1 s apart: the second was made
    before the steady window, whose rate counts only what was committed after it."""
    from benchmark.measuring import Result, steady_state

    commits = [(107.2, 2048), (105.0, 2048), (105.1, 2048), (107.1, 2048), (109.1, 1000)]
    two = Result("rayaug", "c", 8, 1136, 9088, workers=2)
    steady_state(two, commits, started_at=100.0)
    assert (two.startup_seconds, two.steady_seconds, two.commits) == (5.0, 4.0, 5)
    assert two.steady_samples_per_second == (2048 * 2 + 1000) / 4.0

    one = Result("rayaug", "c", 8, 1136, 9088, workers=1)  # one worker: from the first commit
    steady_state(one, commits, started_at=100.0)
    assert one.steady_seconds == 4.1
    assert one.steady_samples_per_second == round((2048 * 3 + 1000) / 4.1, 2)
