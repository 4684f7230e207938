"""A peer's process: `python -m benchmark.runners.worker RUNNER RECIPE IMAGES OUT --views V
--cores K [--annotations FILE]`; prints one JSON line (samples written, work seconds)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from .. import cores
from ..recipes import RECIPES
from . import PEERS


def work(runner: str, args: argparse.Namespace) -> int:
    recipe = RECIPES[args.recipe]
    if runner == "naive-ray":
        from .naive_ray import run_naive_ray

        return run_naive_ray(recipe, args.images, args.out, args.views, args.cores)
    if runner == "dali":
        from .dali import run_dali

        return run_dali(recipe, args.images, args.out, args.views, args.cores)
    from .pool import run_pool

    return run_pool(recipe, args.images, args.out, args.views, args.cores, runner, args.annotations)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmark.runners.worker")
    parser.add_argument("runner", choices=PEERS)
    parser.add_argument("recipe", choices=sorted(RECIPES))
    parser.add_argument("images", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--views", type=int, default=1)
    parser.add_argument("--cores", type=int, default=cores())
    parser.add_argument("--annotations")
    args = parser.parse_args()
    started = time.monotonic()
    written = work(args.runner, args)
    print(json.dumps({"written": written, "work_seconds": round(time.monotonic() - started, 3)}))


if __name__ == "__main__":
    main()
