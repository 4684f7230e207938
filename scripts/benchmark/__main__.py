"""scripts/bench: parse the flags, build the inputs, run every runner, report."""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import psutil

from . import DATA, SEED, shard_sources
from . import __doc__ as overview
from .photos import PHOTO_SETS, Photos, describe, own_photos, photos_for
from .reader import add_arguments as add_reader_arguments
from .reader import run_reader
from .recipes import RECIPES
from .report import (
    TARGETS,
    Results,
    failed,
    machine_info,
    print_machine,
    print_recipe,
    print_result,
    print_summary,
    ratios,
    report_json,
    targets,
)
from .runners import DEFAULT_RUNNERS, RUNNERS, Setting, applies, run_one, start_s3


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="scripts/bench",
        description=overview,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--recipe",
        default=",".join(RECIPES),
        help=f"comma-separated recipes of: {', '.join(RECIPES)} (default: all)",
    )
    parser.add_argument(
        "--views",
        default="1,8",
        help="comma-separated views per source photo, each run in turn "
        "(default 1,8: one view, and the 8 of jobs/imagenet.yaml)",
    )
    parser.add_argument(
        "--n",
        type=int,
        help="output samples at N (one sample = one view; sources = N / views);"
        " default 20000, 1920 with --photos phone, 200 with --quick",
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: N=200, no 4N run")
    parser.add_argument(
        "--no-4n",
        dest="no_4n",
        action="store_true",
        help="N only, no 4N run (issue 17's targets are stated at N = 20,000)",
    )
    parser.add_argument(
        "--photos",
        choices=sorted(PHOTO_SETS),
        default="bundled",
        help="; ".join(f"{k}: {v.help}" for k, v in PHOTO_SETS.items()),
    )
    parser.add_argument(
        "--input",
        type=Path,
        metavar="DIR",
        help="your own image folder instead (all its images as the sources, "
        "one size, no 4N; boxes for recipe d are generated)",
    )
    parser.add_argument(
        "--only",
        help=f"comma-separated runners of: {', '.join(RUNNERS)} "
        f"(default: {', '.join(DEFAULT_RUNNERS)})",
    )
    parser.add_argument("--s3", action="store_true", help="also run rayaug to S3 (SeaweedFS)")
    parser.add_argument(
        "--gpu",
        action="store_true",
        help="rayaug with num_gpus: 1, and DALI as a peer when it imports",
    )
    parser.add_argument("--json", type=Path, metavar="FILE", help="write all figures as JSON")
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep this run's outputs and logs in bench-data/runs (until the next)",
    )
    parser.add_argument(
        "--augment-only",
        action="store_true",
        help="the augment stage alone (rayaug.augment.Augmenter, no Ray, no "
        "peers): decode -> ops -> encode per recipe and views, samples/s",
    )
    parser.add_argument("--device", default="cpu", help="--augment-only: cpu or cuda (default cpu)")
    parser.add_argument(
        "--batch-size",
        type=int,
        default=64,
        help="--augment-only: samples per device batch (default 64)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="--augment-only: use each photo K times under K keys (other "
        "parameters): N samples from N / (views x K) photos",
    )
    parser.add_argument(
        "--loop",
        action="store_true",
        help="--augment-only on the cpu: also Albumentations' loop (each source decoded once, "
        "its views drawn from it) in this process on the same photos, shard by shard after "
        "rayaug's stage, and the ratio: the two per core, without Ray or a pool",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        metavar="K",
        help="run each recipe's runners K times, round by round, the order reversed every "
        "other round; a ratio is the median over the rounds of each round's rayaug ÷ peer "
        "(one run on a busy machine moves a ratio by about 0.1)",
    )
    add_reader_arguments(parser)
    args = parser.parse_args(argv)
    args.n = args.n or (200 if args.quick else PHOTO_SETS[args.photos].default_n)
    if args.n < 1 or args.repeat < 1 or args.rounds < 1:
        parser.error("--n, --repeat and --rounds must be ≥ 1")
    if args.loop and (not args.augment_only or args.device != "cpu"):
        parser.error("--loop goes with --augment-only on the cpu")
    args.recipes = _listed(parser, "recipe", args.recipe, RECIPES)
    args.views = [int(v) for v in _listed(parser, "views", args.views, None)]
    if args.input and not args.input.is_dir():
        parser.error(f"--input {args.input}: not a directory")
    args.runners = select_runners(parser, args)
    return args


def _listed(
    parser: argparse.ArgumentParser, flag: str, value: str, choices: dict | None
) -> list[str]:
    """The comma-separated items of --flag, each a choice (or a positive integer)."""
    items = [item.strip() for item in value.split(",") if item.strip()]
    wrong = [
        item
        for item in items
        if (item not in choices if choices else not (item.isdigit() and int(item) >= 1))
    ]
    if wrong or not items:
        expected = ", ".join(choices) if choices else "positive integers"
        parser.error(f"--{flag} {value}: {', '.join(wrong) or 'empty'}; expected {expected}")
    return items


def select_runners(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    if args.only:
        chosen = _listed(parser, "only", args.only, dict.fromkeys(RUNNERS))
        if "dali" in chosen and not args.gpu:
            parser.error("dali needs --gpu")
        args.s3 = args.s3 or "rayaug-s3" in chosen
    else:
        chosen = list(DEFAULT_RUNNERS) + ["rayaug-s3"] * args.s3 + ["dali"] * args.gpu
    return [name for name in RUNNERS if name in chosen]


def gpu_check(args: argparse.Namespace) -> str | None:
    """The GPU's name under --gpu; exit 2 without CUDA; drop DALI when it does not import."""
    if not args.gpu:
        return None
    try:
        import torch

        available = torch.cuda.is_available()
    except ImportError:
        available = False
    if not available:
        print(
            "bench --gpu: no CUDA device visible to torch (CPU-only torch build, or no GPU); "
            "run without --gpu",
            file=sys.stderr,
        )
        sys.exit(2)
    if "dali" in args.runners:
        try:
            import nvidia.dali  # noqa: F401
        except ImportError:
            print(
                "note: nvidia.dali does not import; DALI is left out "
                "(pip install nvidia-dali-cuda120)"
            )
            args.runners.remove("dali")
    return torch.cuda.get_device_name(0)


def fresh_run_dir() -> Path:
    """A new, empty directory for this invocation's outputs; stale ones of dead runs go."""
    runs = DATA / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    for old in runs.iterdir():
        pid = old.name.split("-", 1)[0]
        if not pid.isdigit() or not psutil.pid_exists(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    run = runs / f"{os.getpid()}-{int(time.time())}"
    run.mkdir()
    return run


def inputs_for(args: argparse.Namespace, views: int, run_dir: Path) -> list[Photos]:
    """The inputs at each size (`sizes`) for `views` (N / views sources), or the user's folder."""
    if args.input:
        return [own_photos(args.input, run_dir)]
    return [photos_for(math.ceil(n / views), args.photos) for n in sizes(args)]


def sizes(args: argparse.Namespace) -> list[int]:
    """The output samples of each run of a photo set: N, and 4N unless told otherwise."""
    return [args.n] if args.quick or args.no_4n else [args.n, 4 * args.n]


def run_all(args: argparse.Namespace, setting: Setting) -> Results:
    """Views by views, size by size (all recipes at N first), each recipe's runners back to
    back on the same input, `--rounds` times. A round's runs follow each other, so its ratio
    compares runs of one moment of the machine; the order turns every other round, so no
    runner always runs first (after the page cache warmed) or last."""
    results: Results = {key: {} for key in args.recipes}
    for views in args.views:
        for photos in inputs_for(args, views, setting.run_dir):
            samples = photos.sources * views
            print(f"\nviews {views}, N = {samples} samples: {describe(photos)}", flush=True)
            for key in args.recipes:
                by_runner = results[key].setdefault(views, {}).setdefault(samples, {})
                names = [name for name in args.runners if applies(name, key)]
                for number in range(1, args.rounds + 1):
                    for name in names if number % 2 else names[::-1]:
                        result = run_one(name, RECIPES[key], photos, views, setting, number)
                        by_runner.setdefault(name, []).append(result)
                        print_result(result, number, args.rounds)
    return results


def config(args: argparse.Namespace, results: Results) -> dict:
    run_sizes = {
        views: sorted(by_n) for by_views in results.values() for views, by_n in by_views.items()
    }
    return {
        "n": args.n,
        "views": args.views,
        "sizes": {str(v): s for v, s in run_sizes.items()},
        "quick": args.quick,
        "rounds": args.rounds,
        "seed": SEED,
        "photos": str(args.input) if args.input else args.photos,
        "photo_set": None if args.input else asdict(PHOTO_SETS[args.photos]),
        "runners": args.runners,
        "s3": args.s3,
        "gpu": args.gpu,
        "shard_sources": {
            str(v): {n: shard_sources(n // v) for n in s} for v, s in run_sizes.items()
        },
        "recipes": {k: RECIPES[k].describe() for k in args.recipes},
        "targets": TARGETS,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.reader:
        return run_reader(args)
    if args.augment_only:
        from .runners.augment_only import run_augment_only

        return run_augment_only(args)
    info = machine_info(gpu_check(args))
    print_machine(info)
    print(
        f"recipes: {', '.join(args.recipes)}; runners: {', '.join(args.runners)}; views: "
        f"{', '.join(map(str, args.views))}; "
        + (
            f"input {args.input}"
            if args.input
            else f"{args.photos} photos, N = "
            + " and ".join(str(n) for n in sizes(args))
            + " samples"
        ),
        flush=True,
    )
    run_dir = fresh_run_dir()
    ray_tmp = Path(tempfile.mkdtemp(prefix="rayaug-bench.", dir="/tmp"))  # short socket paths
    s3 = start_s3(run_dir) if args.s3 else None
    try:
        results = run_all(args, Setting(run_dir, ray_tmp, args.gpu, args.keep, s3))
    finally:
        if s3 is not None:
            s3.stop()
        shutil.rmtree(ray_tmp, ignore_errors=True)
        if args.keep:
            print(f"outputs kept in {run_dir} (the next run removes them)")
        else:
            shutil.rmtree(run_dir, ignore_errors=True)
    table = ratios(results)
    verdicts = targets(table)
    for key in args.recipes:
        print_recipe(RECIPES[key], results[key], table)
    print_summary(results, table, verdicts)
    if args.json:
        report_json(args.json, info, config(args, results), results, table, verdicts)
    return 1 if failed(results) else 0


if __name__ == "__main__":
    sys.exit(main())
