"""The allocators of a process that augments: freed image buffers are kept for the next image,
Arrow allocates from the same heap, and Python's collector leaves the set-up's objects alone.

Each view allocates and frees several buffers of a few MB (a decoded window, a warped canvas,
the float32 planes of a hue step: 3 MB at 512 px). glibc's defaults hand them back to the
kernel as they are freed: a buffer above its mmap threshold is unmapped, and a heap whose free
top passes its trim threshold (twice the largest mapped buffer freed so far) is shrunk. The next
image then faults every page in again, zeroed by the kernel: 2.3 million faults and 2.7 s of
system time per shard actor in a 20,000-sample job of 512 px views. Raising both thresholds
keeps that memory in the heap for the next image.

What glibc and Arrow read only as a process starts goes into the environment the local node's
processes inherit (`worker_environment`).
"""

from __future__ import annotations

import ctypes
import gc
import os

# mallopt's parameter numbers (glibc's malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

# Buffers up to this size come from the heap: glibc's largest mmap threshold on 64-bit. Above
# it (a whole 12 MP decode, 36 MB) a buffer is still mapped and unmapped on its own.
MMAP_THRESHOLD = 32 * 1024 * 1024
# A heap gives memory back once this much is free at its top: a few images' buffers are kept,
# no more, so an actor's resident size stays within 64 MiB of what it uses.
TRIM_THRESHOLD = 64 * 1024 * 1024

# glibc's environment variables for the same settings: a value the user set stays theirs.
_USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")

# Read once, as a process starts (Arrow's pool as pyarrow is imported, which Ray's workers do
# before they take an actor), so they cannot be set from inside an actor.
WORKER_ENVIRONMENT = {
    # glibc gives each thread an arena of its own, up to eight per core, each keeping what was
    # freed in it: a shard actor's threads (Ray's, two calls', their read-ahead) left it
    # 50-100 MiB larger at its peak.
    "MALLOC_ARENA_MAX": "2",
    # Arrow's default pool (mimalloc) is a second heap: a shard's write (its table and Parquet
    # pages, about three copies of the shard's image bytes) stayed resident there until Arrow
    # allocated again, beside the image buffers kept in glibc's. On malloc, the write reuses
    # the image buffers the augmenting just freed.
    "ARROW_DEFAULT_MEMORY_POOL": "system",
}


def keep_freed_buffers() -> bool:
    """Raise this process's glibc mmap and trim thresholds (above). Returns whether they were
    set: not where the C library has no working `mallopt` (macOS; musl's ignores it) or the
    user set their own through glibc's environment variables."""
    if any(name in os.environ for name in _USER_SETTINGS):
        return False
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # mallopt returns 1 on success; setting either turns off glibc's own threshold tuning.
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )


def worker_environment() -> dict[str, str]:
    """WORKER_ENVIRONMENT less the variables the user set: theirs stay theirs."""
    return {name: value for name, value in WORKER_ENVIRONMENT.items() if name not in os.environ}


def exempt_loaded_objects() -> None:
    """Leave every object alive now (modules, Ray's and Arrow's, the augmenter) out of Python's
    later cyclic collections. A full collection walks every tracked object: 165,000 in a shard
    actor, 65 ms each time, two or three times a shard, and none of them is ever garbage. One
    collection first, so that nothing already unreachable is kept for good."""
    gc.collect()
    gc.freeze()
