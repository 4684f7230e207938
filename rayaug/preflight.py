"""The first act of a submitted job: check that the cluster's Python has rayaug's requirements.

`rayaug submit` writes `REQUIREMENTS_FILE` into the job's working_dir (distribution name →
the module it provides) and runs `python -m rayaug.preflight REQUIREMENTS_FILE` before
`python -m rayaug.cli run`. This module imports nothing but the standard library, so it runs
on any Python that has Ray, and it says in one line what is missing instead of the traceback
of whichever import fails first.

Exit codes: 0 all present, 2 something is missing (a usage error: the fix is how the job is
submitted or how the cluster is built, not the job).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

REQUIREMENTS_FILE = "rayaug-requirements.json"
# The start of the line; `rayaug submit --wait` finds it in the job's log by this.
MISSING_PREFIX = "rayaug: this Ray cluster's Python lacks "


def missing(modules: dict[str, str]) -> list[str]:
    """The distributions of `modules` (distribution → module) whose module cannot be found."""
    return sorted(
        dist for dist, module in modules.items() if importlib.util.find_spec(module) is None
    )


def missing_line(dists: list[str]) -> str:
    """What a user reads: what is missing and the two ways to provide it."""
    # torch is never shipped by default (its build must match the cluster's CUDA).
    torch = " (add --ship-torch for torch and kornia)" if {"torch", "kornia"} & set(dists) else ""
    return (
        f"{MISSING_PREFIX}{', '.join(dists)}: submit without --no-ship-deps{torch} so that "
        "rayaug ships its requirements with the job, or install rayaug into the cluster's "
        'image (README "Running on a cluster")'
    )


def main(argv: list[str]) -> int:
    modules = json.loads(Path(argv[0]).read_text())
    absent = missing(modules)
    if absent:
        print(missing_line(absent), flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
