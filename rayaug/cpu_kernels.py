"""The CPU path's pixel kernels: OpenCV on (H, W, 3) uint8 RGB, straight from the decoder.

On a CPU, Kornia's float32 warp and the float↔uint8 conversions around it cost several
times OpenCV's SIMD uint8 kernels. The conventions are Kornia's: a warp takes the same
source→destination homography as `warp_perspective(align_corners=True)` (pixel centres at
integer coordinates, black outside), so it differs from Kornia's result only by rounding to
8 bits. Every kernel works on one sample alone: its result never depends on its batch.
"""

from __future__ import annotations

from collections.abc import Callable

import cv2
import numpy as np

from rayaug.ops import Canvas, Params, fused_colour_map

# OpenCV's warps index pixels with 16-bit integers: larger images go through Kornia.
_MAX_SIDE = 32767

PixelKernel = Callable[[np.ndarray, Params], np.ndarray]


def use_one_thread() -> None:
    """One OpenCV thread per actor, like torch's: actors scale out by count, not threads."""
    cv2.setNumThreads(1)


def can_warp(size: Canvas, canvas: Canvas) -> bool:
    """Whether OpenCV warps an image of `size` onto `canvas` (both (height, width)) as Kornia
    does. Not one pixel wide or high: Kornia's align_corners grid degenerates there into
    sampling that pixel everywhere, where OpenCV would blend it with the black outside."""
    return max(*size, *canvas) < _MAX_SIDE and min(size) > 1


def warp(pixels: np.ndarray, matrix: np.ndarray, canvas: Canvas) -> np.ndarray:
    """Bilinear warp by the source→destination homography `matrix` onto a `canvas`, zeros
    outside the source (each of the four taps on its own, as Kornia's zero padding)."""
    # Inverted here, in float64, so OpenCV samples exactly where Kornia's inverse grid does.
    inverse = np.linalg.inv(matrix)
    return cv2.warpPerspective(
        pixels,
        inverse,
        (canvas[1], canvas[0]),
        flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
        borderMode=cv2.BORDER_CONSTANT,
        borderValue=(0, 0, 0),
    )


def fused_color_jitter(pixels: np.ndarray, params: Params) -> np.ndarray:
    """`kernels.color_jitter` with `fused: true`: one affine colour map, rounded and clipped
    to 8 bits once (as the float path's final conversion does)."""
    mean = np.array(cv2.mean(pixels)[:3]) / 255
    matrix, offset = fused_colour_map(mean, params)
    affine = np.hstack([matrix, 255 * offset[:, None]])
    return cv2.transform(pixels, affine)


def pixel_kernel(name: str, params: Params) -> PixelKernel | None:
    """The uint8 kernel for one photometric step, or None when it needs the torch kernels."""
    if name == "color_jitter" and params.get("fused"):
        return fused_color_jitter
    return None
