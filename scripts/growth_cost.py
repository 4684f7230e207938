"""What growing an output costs, against a fresh run of the final spec (issue 19's figure).

Runs, each as a user would (`rayaug run` / `rayaug extend` as child processes, an embedded
Ray each), on one input folder and a fresh temporary output each, interleaved over --repeat
rounds so a busy machine slows each alike:

  views A          a fresh job of A views              (what was there before the growth)
  grow A -> B      `rayaug extend OUT --views B` of it  (the growth alone is timed)
  views B-A        a fresh job of B-A views            (the new views' own cost)
  views B          a fresh job of B views              (the rerun a growth saves)

and prints each one's wall time (median over the rounds) and the growth's ratios to the last
two. Every run also reports what its summary says it made. A measurement, not a test.

    .venv/bin/python scripts/growth_cost.py [--input DIR] [--sources 400] [--views 4 8] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from rayaug import sampledata

RAYAUG = Path(sys.executable).parent / "rayaug"
OPS = yaml.safe_load(
    """
- {name: random_resized_crop, size: 224, scale: [0.08, 1.0]}
- {name: horizontal_flip}
- {name: color_jitter, brightness: 0.4, contrast: 0.4, saturation: 0.4, hue: 0.1, p: 0.8}
- {name: grayscale, p: 0.2}
"""
)


def timed(*args: str) -> tuple[float, dict]:
    """Wall seconds of one rayaug command (process start to exit), and its --json summary."""
    started = time.monotonic()
    done = subprocess.run([str(RAYAUG), *args, "--json"], capture_output=True, text=True)
    wall = time.monotonic() - started
    if done.returncode != 0:
        sys.exit(f"rayaug {' '.join(args)} failed:\n{done.stderr}")
    return wall, json.loads(done.stdout[done.stdout.index("{") :])


def write_spec(folder: Path, source: Path, out: Path, views: int) -> Path:
    spec = {
        "input": {"uri": str(source)},
        "output": {"uri": str(out), "shard_size": 64, "size": [224, 224]},
        "views": views,
        "seed": 7,
        "ops": OPS,
    }
    path = folder / f"{out.name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def one_round(work: Path, source: Path, before: int, after: int) -> dict[str, float]:
    walls = {}
    for views in (before, after - before, after):
        out = work / f"views-{views}"
        shutil.rmtree(out, ignore_errors=True)
        walls[f"views {views}"], summary = timed("run", str(write_spec(work, source, out, views)))
        print(f"  views {views}: {walls[f'views {views}']:.1f} s, {summary['samples']} samples")
        if views == before:
            name = f"grow {before} -> {after}"
            walls[name], summary = timed("extend", str(out), "--views", str(after))
            made = summary["samples_this_run"]
            print(f"  {name}: {walls[name]:.1f} s, {made} new samples, {summary['samples']} in all")
    return walls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", type=Path, help="an image folder (default: generated photos)")
    parser.add_argument("--sources", type=int, default=400, help="generated photos")
    parser.add_argument("--views", type=int, nargs=2, default=(4, 8), metavar=("A", "B"))
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    before, after = args.views
    with tempfile.TemporaryDirectory(prefix="rayaug-growth-") as tmp:
        work = Path(tmp)
        source = args.input
        if source is None:
            source = work / "input"
            photos = sampledata.make_photos(args.sources, seed=3, short_side=(300, 600))
            sampledata.write_folder(list(photos), source)
        rounds = []
        for number in range(args.repeat):
            print(f"round {number + 1}")
            rounds.append(one_round(work, source, before, after))
    medians = {name: statistics.median(r[name] for r in rounds) for name in rounds[0]}
    grow = medians[f"grow {before} -> {after}"]
    print("\nmedian wall seconds over", args.repeat, "rounds")
    for name, wall in medians.items():
        print(f"  {name:14} {wall:7.1f}")
    print(f"growth / fresh {after - before} views: {grow / medians[f'views {after - before}']:.2f}")
    print(f"growth / fresh {after} views: {grow / medians[f'views {after}']:.2f}")


if __name__ == "__main__":
    main()
