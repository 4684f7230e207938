"""Side-by-side benchmark of recipes: rayaug against what a team would otherwise run, same
input, same ops, in the order users write them, at 1 view and at the views of the job files.

One invocation builds (or reuses) folders of real-photo JPEGs under bench-data/input/ (plus a
COCO annotations.json with a few boxes per photo), then, for each number of views V, size
(N and 4N output samples: N / V source photos) and recipe, runs one runner after another:

  floor           decode once + V x (resize to the recipe's size + JPEG encode), Pillow, a
                  process per core: the codec's share of any augmentation job
  albumentations  the recipe's ops with Albumentations 2, as a user writes it: each source
                  decoded once (OpenCV), the Compose applied V times, a process per core,
                  Parquet shards out (recipe d: bbox_params, boxes serialized as JSON per row)
  rayaug          `rayaug run SPEC --json` in a subprocess, the spec generated from the same op
                  list with `views: V`, Ray start-up included; Parquet shards + manifests out
  naive-ray       (--only; recipes a, b) Ray actors calling Pillow per image, a file per view
  rayaug-s3       (--only or --s3) rayaug writing to S3 on a SeaweedFS server on loopback
  dali            (--only with --gpu; recipes a, b) NVIDIA DALI on the GPU

With `--rounds K` each recipe's runners run K times, round by round (the order reversed every
other round), and a ratio is the median of the K rounds' ratios: one run on a shared machine
moves a ratio by about 0.1.

A sample is one output view; every figure is samples/s. Every runner is its own process tree,
timed end to end (interpreter start and imports included), with the RSS and PSS of the whole
tree sampled every 0.2 s. Commit times are the modification times of the committed files
(rayaug: manifests/*.parquet; pool peers: each Parquet shard; naive-ray: each image file):
start-up = process start to first commit; steady state, once every worker (pool process,
rayaug actor) has committed once = samples committed after that commit / (last commit - that
commit). It is a benchmark, not a test: nothing here asserts a
time. Issue 17's targets (rayaug / Albumentations, every recipe, at every views): >= 1.0x end
to end and >= 1.2x in steady state at 20,000 samples.

    scripts/bench [--recipe a,b,c,d] [--views 1,8] [--n 20000] [--quick | --no-4n]
                  [--photos bundled|varied|phone] [--input DIR]
                  [--only floor,albumentations,rayaug] [--rounds K] [--s3] [--gpu]
                  [--json FILE] [--keep]
    scripts/bench --augment-only [--device cpu|cuda] [--recipe ...] [--views ...] [--n N]
                  [--repeat K] [--batch-size B] [--loop] [--json FILE]   # the augment stage alone
"""

from __future__ import annotations

import math
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"
DATA = ROOT / "bench-data"
SEED = 0
SHARD_SOURCES = 256  # source photos per output shard, at most (rayaug's `shard_size`)


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def shard_sources(sources: int, procs: int | None = None) -> int:
    """SHARD_SOURCES, or fewer when there are few sources, so every core gets a shard."""
    return max(1, min(SHARD_SOURCES, math.ceil(sources / (procs or cores()))))
