"""The actor's allocator keeps freed image buffers (rayaug.allocator), measured in a fresh
process: glibc reads its settings once, so each case gets an interpreter of its own."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's mallopt"
)

# Three 3 MB buffers a view, as a 512 px hue step makes them, 40 views; the minor page faults.
VIEWS = """
import json, resource, sys
import numpy as np
from rayaug import allocator
kept = allocator.keep_freed_buffers() if sys.argv[1] == "keep" else None
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
before = faults()
for _ in range(40):
    buffers = [np.ones((512, 512, 3), np.float32) for _ in range(3)]
    del buffers
print(json.dumps({"kept": kept, "faults": faults() - before}))
"""
PAGES_TOUCHED = 40 * 3 * 512 * 512 * 3 * 4 // 4096


def run_views(mode: str, **env: str) -> dict:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")} | env
    done = subprocess.run(
        [sys.executable, "-c", VIEWS, mode], env=environ, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_freed_image_buffers_are_used_again_not_faulted_in_from_the_kernel() -> None:
    default, kept = run_views("default"), run_views("keep")
    assert kept["kept"] is True
    assert default["faults"] > PAGES_TOUCHED // 4  # glibc's defaults give them back each time
    assert kept["faults"] < PAGES_TOUCHED // 20  # only the first view's pages fault in


def test_a_users_own_malloc_settings_stay_theirs() -> None:
    assert run_views("keep", MALLOC_TRIM_THRESHOLD_="0")["kept"] is False
    assert run_views("keep", MALLOC_MMAP_THRESHOLD_="131072")["kept"] is False
