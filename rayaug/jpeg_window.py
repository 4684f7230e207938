"""A window of a JPEG, decoded alone: libjpeg-turbo's TurboJPEG 3 API decodes only the rows
down to the window's bottom and runs the IDCT only for its columns (`tj3SetCroppingRegion`,
with `tj3SetScalingFactor` for the DCT-scaled decode). A random crop rarely needs the whole
photo, and the decode is half of a CPU job's time.

No maintained Python binding exposes the cropping region (PyTurboJPEG decodes whole images),
so the five calls are bound here with ctypes: on a system libturbojpeg >= 3, or the one the
`turbojpeg` wheel bundles. Inside the window the pixels are a whole decode's (OpenCV's and
Pillow's are the same libjpeg-turbo's), except within an iMCU of a cut edge, where the fancy
upsampling lacks its neighbours: callers ask for `MARGIN` more on each side.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import importlib.util
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np

# Pixels (of the scaled decode) beyond which a window's pixels equal a whole decode's: one
# 4:2:0 iMCU. Measured equal at 8 on 5,000 random windows at each DCT scale; 16 for room.
MARGIN = 16

_DECOMPRESS = 1  # TJINIT_DECOMPRESS
_RGB = 0  # TJPF_RGB
_SUBSAMPLING = 4  # TJPARAM_SUBSAMP
# iMCU width in pixels by TJSAMP_* (444, 422, 420, gray, 440, 411, 441)
_IMCU_WIDTH = {0: 8, 1: 16, 2: 16, 3: 8, 4: 8, 5: 32, 6: 8}


class _Region(ctypes.Structure):
    _fields_ = [("x", ctypes.c_int), ("y", ctypes.c_int), ("w", ctypes.c_int), ("h", ctypes.c_int)]


class _Scaling(ctypes.Structure):
    _fields_ = [("num", ctypes.c_int), ("denom", ctypes.c_int)]


def available() -> bool:
    """Whether windows decode alone here (else callers slice a whole decode: same pixels)."""
    return _library() is not None


def decode(data: bytes, scale: int, window: tuple[int, int, int, int]) -> np.ndarray | None:
    """RGB pixels (H, W, 3) uint8 of `window` — (left, top, right, bottom) in the pixels of the
    decode at 1/`scale` — or None where the library is missing or refuses the data (a whole
    decode then serves, and words any error)."""
    library = _library()
    if library is None:
        return None
    handle = _handle(library)
    if library.tj3DecompressHeader(handle, data, len(data)) != 0:
        return None
    imcu = _IMCU_WIDTH.get(library.tj3Get(handle, _SUBSAMPLING))
    if imcu is None:
        return None
    left, top, right, bottom = window
    aligned = left // -(-imcu // scale) * -(-imcu // scale)  # the scaled iMCU, rounded up
    region = _Region(aligned, top, right - aligned, bottom - top)
    if (
        library.tj3SetScalingFactor(handle, _Scaling(1, scale)) != 0
        or library.tj3SetCroppingRegion(handle, region) != 0
    ):
        return None
    pixels = np.empty((bottom - top, right - aligned, 3), np.uint8)
    status = library.tj3Decompress8(
        handle, data, len(data), pixels.ctypes.data, pixels.strides[0], _RGB
    )
    return pixels[:, left - aligned :] if status == 0 else None


_local = threading.local()


def _handle(library: ctypes.CDLL) -> int:
    """One decompressor per thread (a handle is not thread-safe), kept for the thread's life."""
    handle = getattr(_local, "handle", None)
    if handle is None:
        handle = _local.handle = library.tj3Init(_DECOMPRESS)
    return handle


@functools.cache
def _library() -> ctypes.CDLL | None:
    for path in _candidates():
        if path is None:
            continue
        try:
            library = ctypes.CDLL(str(path))
        except OSError:
            continue
        if hasattr(library, "tj3SetCroppingRegion"):  # TurboJPEG 3 and later
            return _declare(library)
    return None


def _candidates() -> Iterator[Path | str | None]:
    """The wheel's library first; the system's only if that one is missing or too old:
    ctypes.util.find_library runs ldconfig and then gcc (a compiler and linker run, in every
    actor, before its first decode)."""
    yield from _bundled()
    yield ctypes.util.find_library("turbojpeg")


def _bundled() -> list[Path]:
    """The libturbojpeg inside the `turbojpeg` wheel (auditwheel's, delocate's or
    delvewheel's folder)."""
    spec = importlib.util.find_spec("turbojpeg")
    if spec is None or spec.origin is None:
        return []
    site = Path(spec.origin).parent
    return sorted(
        path
        for folder in ("turbojpeg.libs", "turbojpeg.dylibs", ".dylibs")
        for path in (site / folder).glob("*turbojpeg*")
    )


def _declare(library: ctypes.CDLL) -> ctypes.CDLL:
    handle, size = ctypes.c_void_p, ctypes.c_size_t
    library.tj3Init.restype = handle
    library.tj3Init.argtypes = [ctypes.c_int]
    library.tj3DecompressHeader.argtypes = [handle, ctypes.c_char_p, size]
    library.tj3Get.argtypes = [handle, ctypes.c_int]
    library.tj3SetScalingFactor.argtypes = [handle, _Scaling]
    library.tj3SetCroppingRegion.argtypes = [handle, _Region]
    library.tj3Decompress8.argtypes = [
        handle,
        ctypes.c_char_p,
        size,
        ctypes.c_void_p,
        ctypes.c_int,
        ctypes.c_int,
    ]
    return library
