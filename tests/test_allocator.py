"""The actor's allocator keeps freed image buffers, and its collector leaves the set-up's objects
alone (rayaug.allocator), measured in a fresh process: glibc reads its settings once, and a
frozen object stays frozen, so each case gets an interpreter of its own."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

glibc_only = pytest.mark.skipif(
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


@glibc_only
def test_freed_image_buffers_are_used_again_not_faulted_in_from_the_kernel() -> None:
    default, kept = run_views("default"), run_views("keep")
    assert kept["kept"] is True
    assert default["faults"] > PAGES_TOUCHED // 4  # glibc's defaults give them back each time
    assert kept["faults"] < PAGES_TOUCHED // 20  # only the first view's pages fault in


@glibc_only
def test_a_users_own_malloc_settings_stay_theirs() -> None:
    assert run_views("keep", MALLOC_TRIM_THRESHOLD_="0")["kept"] is False
    assert run_views("keep", MALLOC_MMAP_THRESHOLD_="131072")["kept"] is False


# An actor's set-up: rayaug's modules imported, one cycle already garbage, one still in use.
SET_UP = """
import gc, json, weakref
import rayaug.augment, rayaug.job
from rayaug import allocator
class Node:
    pass
def cycle():
    node = Node()
    node.me = node
    return node
dropped, kept = cycle(), cycle()
dropped_ref, kept_ref = weakref.ref(dropped), weakref.ref(kept)
del dropped
tracked_before = len(gc.get_objects())
allocator.exempt_loaded_objects()
print(json.dumps({
    "tracked_before": tracked_before,
    "tracked_after": len(gc.get_objects()),
    "frozen": gc.get_freeze_count(),
    "dropped_collected": dropped_ref() is None,
    "kept_alive": kept_ref() is kept,
}))
"""


def test_the_set_ups_objects_are_left_out_of_collections_and_its_garbage_is_not_kept() -> None:
    done = subprocess.run([sys.executable, "-c", SET_UP], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["tracked_before"] > 10_000  # the modules' objects, walked by each collection
    assert found["tracked_after"] < 100  # what a full collection still walks
    assert found["frozen"] >= found["tracked_before"] * 0.9
    assert found["dropped_collected"] and found["kept_alive"]
