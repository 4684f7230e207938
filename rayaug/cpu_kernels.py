"""The CPU path's pixel kernels: OpenCV and numpy on (H, W, 3) uint8 RGB, decoder to encoder.

On a CPU, Kornia's float32 kernels and the float↔uint8 conversions around them cost several
times OpenCV's SIMD uint8 kernels. Every op keeps its Kornia semantics (the reference, see
`kernels`): a warp takes the same source→destination homography as
`warp_perspective(align_corners=True)` (pixel centres at integer coordinates, black outside);
a photometric kernel computes Kornia's formula and rounds to 8 bits once, where Kornia's path
rounds at the encoder. Point ops are bit operations where the levels' bits say it (posterize,
solarize, invert), else lookup tables; colour maps are `cv2.transform` (float maths, one
rounding); the README states each kernel's measured distance from Kornia's.
Every kernel works on one sample alone and never writes into its input: its result never
depends on its batch, and a sample can be rerun from its decoded pixels.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import cv2
import numpy as np

from rayaug.ops import (
    LUMA,
    Params,
    fused_colour_map,
    kernels_in,
    noise_field,
    saturation_matrix,
)

# OpenCV's warps index pixels with 16-bit integers: larger images go through Kornia.
_MAX_SIDE = 32767
# From OpenCV 5 on, warpAffine takes a rotation's or a shear's taps exactly where
# warpPerspective does (the same bytes), about 13 % faster; OpenCV 4's warpAffine steps its
# coordinates in 1/1024 pixel, so there those maps keep warpPerspective and their bytes.
_AFFINE_TAPS_EXACT = int(cv2.__version__.split(".")[0]) >= 5
_LEVELS = np.arange(256, dtype=np.float64)
_LUMA_WEIGHTS = [float(weight) for weight in LUMA]

PixelKernel = Callable[[np.ndarray, Params], np.ndarray]


def use_one_thread() -> None:
    """One OpenCV thread per actor, like torch's: actors scale out by count, not threads."""
    cv2.setNumThreads(1)


def can_warp(size: tuple[int, int], canvas: tuple[int, int]) -> bool:
    """Whether OpenCV warps an image of `size` onto `canvas` (both (height, width)) as Kornia
    does. Not one pixel wide or high: Kornia's align_corners grid degenerates there into
    sampling that pixel everywhere, where OpenCV would blend it with the black outside."""
    return max(*size, *canvas) < _MAX_SIDE and min(size) > 1


def warp(pixels: np.ndarray, matrix: np.ndarray, canvas: tuple[int, int]) -> np.ndarray:
    """Bilinear warp by the source→destination homography `matrix` onto a `canvas`, zeros
    outside the source (each of the four taps on its own, as Kornia's zero padding)."""
    # Inverted here, in float64, so OpenCV samples exactly where Kornia's inverse grid does.
    inverse = np.linalg.inv(matrix)
    size = (canvas[1], canvas[0])
    flags = cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP
    axis_aligned = matrix[0, 1] == matrix[1, 0] == 0
    if matrix[2, 0] == matrix[2, 1] == 0 and (axis_aligned or _AFFINE_TAPS_EXACT):
        # Crops, flips and resizes: OpenCV's warpAffine has a fast path for an axis-aligned map
        # (2.4x as fast as warpPerspective, the same taps; its 1/1024-pixel coordinate steps
        # move 9 in 100,000 values of a photo one level), on every OpenCV since rayaug 0.8.0.
        affine = inverse[:2] / inverse[2, 2]
        return cv2.warpAffine(pixels, affine, size, flags=flags, borderMode=cv2.BORDER_CONSTANT)
    return cv2.warpPerspective(pixels, inverse, size, flags=flags, borderMode=cv2.BORDER_CONSTANT)


# ---------------------------------------------------------------- building blocks


def _lut(pixels: np.ndarray, table: np.ndarray) -> np.ndarray:
    """A point op per channel: `table` (256 x 3) of 0-255 floats, rounded as the float path's
    encoder rounds (half to even) and clipped."""
    return cv2.LUT(pixels, _to_uint8(table).reshape(256, 1, 3))


def _colour_map(pixels: np.ndarray, matrix: np.ndarray, offset: np.ndarray) -> np.ndarray:
    """RGB → matrix @ RGB + offset (offset in 0-255 levels), one rounding, clipped."""
    return cv2.transform(pixels, np.hstack([matrix, offset[:, None]]))


def _to_uint8(levels: np.ndarray) -> np.ndarray:
    """0-255 floats → uint8, rounded half to even and clipped (the encoder's conversion)."""
    return np.clip(np.rint(levels), 0, 255).astype(np.uint8)


# ---------------------------------------------------------------- colour


def _hue(pixels: np.ndarray, turns: float) -> np.ndarray:
    """Kornia's `adjust_hue`: rotate the HSV hue by `turns` of a full circle. In float32:
    8-bit HSV would quantise the hue to 1.4° steps (up to 3 levels off on saturated colours).
    OpenCV's float HSV keeps V in the input's 0-255 scale, so no rescaling either way."""
    hsv = cv2.cvtColor(pixels.astype(np.float32), cv2.COLOR_RGB2HSV)
    # OpenCV's HSV2RGB wraps a hue past 360 itself: one SIMD add of (shift, 0, 0), no masks
    cv2.add(hsv, (turns * 360 % 360, 0.0, 0.0, 0.0), dst=hsv)
    return cv2.convertScaleAbs(cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB))


@dataclass
class _AffineRun:
    """Affine jitter steps not applied yet, composed: x -> a·x + b·luma(x) + c (each channel,
    levels). Brightness, contrast and saturation, in any order, stay in this form."""

    a: float = 1.0
    b: float = 0.0
    c: float = 0.0
    input_luma: float | None = None  # the mean luma of the run's input, once contrast asks

    def then(self, step: str, factor: float, pixels: np.ndarray) -> None:
        """Compose one more step (`pixels`: the run's input, for contrast's mean)."""
        if step == "saturation":  # f·y + (1 - f)·luma(y), and luma(y) = (a + b)·luma(x) + c
            self.b = factor * self.b + (1 - factor) * (self.a + self.b)
            self.a *= factor
            return
        shift = 0.0
        if step == "contrast":  # about the mean luma of y, which is the run's map of x's
            if self.input_luma is None:
                self.input_luma = float(LUMA @ np.array(cv2.mean(pixels)[:3]))
            shift = (1 - factor) * ((self.a + self.b) * self.input_luma + self.c)
        self.a, self.b, self.c = factor * self.a, factor * self.b, factor * self.c + shift

    def stays_in_levels(self) -> bool:
        """Whether every 8-bit RGB maps into [0, 255]: nothing clips before the next step.
        Interval arithmetic over the RGB cube: channel k's map has the weight a + b·w_k on
        itself and b·w_j on the others, which add up to b·(1 - w_k) (the luma weights w sum
        to 1)."""
        for weight in _LUMA_WEIGHTS:
            own, others = self.a + self.b * weight, self.b * (1 - weight)
            low = self.c + 255 * (min(own, 0.0) + min(others, 0.0))
            high = self.c + 255 * (max(own, 0.0) + max(others, 0.0))
            if low < -1e-6 or high > 255 + 1e-6:
                return False
        return True

    def apply(self, pixels: np.ndarray) -> np.ndarray:
        """The run as one colour map (RGB rows), rounded once and clipped."""
        a, b, c = self.a, self.b, self.c
        rows = [[b * w for w in _LUMA_WEIGHTS] + [c] for _ in range(3)]
        for channel in range(3):
            rows[channel][channel] += a
        return cv2.transform(pixels, np.array(rows))


def _exact_jitter(pixels: np.ndarray, params: Params) -> np.ndarray:
    """Kornia's four steps in the sample's order, each clipped. A run of the affine ones
    (brightness, contrast, saturation) that cannot leave [0, 255] before its last step clips
    nothing in Kornia either: it is one colour map and one rounding. A run ends at hue (HSV,
    not affine) and after a step that may clip."""
    run: _AffineRun | None = None
    for step in params["order"]:
        if step == "hue":
            pixels = _hue(run.apply(pixels) if run else pixels, params["hue"])
            run = None
            continue
        run = run or _AffineRun()
        run.then(step, params[step], pixels)
        if not run.stays_in_levels():
            pixels, run = run.apply(pixels), None
    return run.apply(pixels) if run else pixels


def color_jitter(pixels: np.ndarray, params: Params) -> np.ndarray:
    """`kernels.color_jitter`: each step in the sample's recorded order, clipped after each
    step as Kornia's are; or, with `fused`, one affine colour map rounded once."""
    if params.get("fused"):
        matrix, offset = fused_colour_map(np.array(cv2.mean(pixels)[:3]) / 255, params)
        return _colour_map(pixels, matrix, 255 * offset)
    return _exact_jitter(pixels, params)


def grayscale(pixels: np.ndarray, params: Params) -> np.ndarray:
    """Kornia's saturation step at factor 0: each channel becomes the luma."""
    return _colour_map(pixels, saturation_matrix(0.0), np.zeros(3))


def posterize(pixels: np.ndarray, params: Params) -> np.ndarray:
    """Keep the high `bits` of each level (Kornia truncates to levels, then shifts): a mask of
    those bits, one SIMD AND (a lookup table took eight times as long)."""
    high_bits = 0xFF << (8 - params["bits"]) & 0xFF
    return _levels_op(cv2.bitwise_and, pixels, high_bits)


def solarize(pixels: np.ndarray, params: Params) -> np.ndarray:
    """Invert levels at or above the threshold, compared in float32 as Kornia compares. The
    levels below it are 0 up to some level, and 255 - x is x XOR 255 in 8 bits: a compare
    and an XOR, a quarter of a lookup table's time."""
    below = np.arange(256, dtype=np.float32) / np.float32(255) < np.float32(params["threshold"])
    first_inverted = int(np.count_nonzero(below))  # within 0-255: the threshold is at most 1
    inverted = _levels_op(cv2.compare, pixels, first_inverted, cv2.CMP_GE)  # 255 or 0
    return cv2.bitwise_xor(pixels, inverted)


def _levels_op(op: Callable, pixels: np.ndarray, level: int, *flags: int) -> np.ndarray:
    """`op(pixels, level, ...)` on every level of every channel: OpenCV takes a scalar per
    channel, so the image goes in as one channel of H x 3W levels (a view, not a copy)."""
    return op(pixels.reshape(pixels.shape[0], -1), level, *flags).reshape(pixels.shape)


def invert(pixels: np.ndarray, params: Params) -> np.ndarray:
    return cv2.bitwise_not(pixels)


def autocontrast(pixels: np.ndarray, params: Params) -> np.ndarray:
    """Stretch each channel from its own [min, max] to [0, 255]; a flat channel stays."""
    extremes = [cv2.minMaxLoc(channel)[:2] for channel in cv2.split(pixels)]
    low, high = (np.array(side) for side in zip(*extremes, strict=True))
    span = np.where(high > low, high - low, 1.0)
    stretched = (_LEVELS[:, None] - low) * (255 / span)
    return _lut(pixels, np.where(high > low, stretched, _LEVELS[:, None]))


def equalize(pixels: np.ndarray, params: Params) -> np.ndarray:
    """PIL's (and Kornia's) per-channel histogram equalisation."""
    tables = []
    for channel in range(3):
        histogram = cv2.calcHist([pixels], [channel], None, [256], [0, 256]).ravel().astype(int)
        last = histogram[np.flatnonzero(histogram)[-1]]
        step = (histogram.sum() - last) // 255
        if step == 0:  # one level (or nearly): the channel is left as it is
            tables.append(_LEVELS)
            continue
        table = (np.cumsum(histogram) + step // 2) // step
        tables.append(np.concatenate([[0], table[:-1]]))
    return _lut(pixels, np.stack(tables, axis=1))


# ---------------------------------------------------------------- filters


def gaussian_blur(pixels: np.ndarray, params: Params) -> np.ndarray:
    """Kornia's `gaussian_blur2d` (its normalised kernel, 'reflect' = OpenCV's REFLECT_101),
    in float, rounded once."""
    size, sigma = params["kernel_size"], params["sigma"]
    if size // 2 >= min(pixels.shape[:2]):  # torch's reflect padding refuses it: so do we
        raise ValueError(f"a {size}-pixel blur needs an image over {size // 2} pixels a side")
    x = np.arange(size, dtype=np.float64) - size // 2
    kernel = np.exp(-(x**2) / (2 * sigma**2))
    kernel /= kernel.sum()
    # Taps under 1e-6 move no pixel by 0.01 level; a small sigma in a wide kernel (sigma 0.5
    # of a 23-tap kernel: 5 taps matter) would otherwise cost the whole width.
    kernel = kernel[np.abs(x) <= np.abs(x[kernel >= 1e-6]).max()]
    return cv2.sepFilter2D(pixels, -1, kernel, kernel, borderType=cv2.BORDER_REFLECT_101)


_SMOOTH = np.array([[1, 1, 1], [1, 5, 1], [1, 1, 1]], dtype=np.float64) / 13


def sharpness(pixels: np.ndarray, params: Params) -> np.ndarray:
    """Kornia's (PIL's) sharpness: blend with the 3x3-smoothed image, whose one-pixel border
    is the original's; factor 1 is the image, 0 the smoothed one, 2 sharper."""
    if min(pixels.shape[:2]) < 3:  # Kornia's unpadded 3x3 convolution refuses it: so do we
        raise ValueError("sharpness needs an image of at least 3x3 pixels")
    smooth = cv2.filter2D(pixels, cv2.CV_32F, _SMOOTH)
    image = pixels.astype(np.float32)
    for edge in (np.s_[0], np.s_[-1], np.s_[:, 0], np.s_[:, -1]):
        smooth[edge] = image[edge]
    np.clip(smooth, 0, 255, out=smooth)
    return _to_uint8(smooth + (image - smooth) * np.float32(params["factor"]))


# ---------------------------------------------------------------- noise and erasing


def gaussian_noise(pixels: np.ndarray, params: Params) -> np.ndarray:
    noise = noise_field(params["noise_seed"], pixels.shape[:2], "normal")
    levels = pixels.astype(np.float32)
    levels += noise * np.float32(255 * params["std"]) + np.float32(255 * params["mean"])
    return _to_uint8(levels)


def salt_and_pepper(pixels: np.ndarray, params: Params) -> np.ndarray:
    draws = noise_field(params["noise_seed"], pixels.shape[:2], "uniform")
    salt = params["amount"] * params["salt_vs_pepper"]
    out = pixels.copy()
    out[draws < salt] = 255
    out[(draws >= salt) & (draws < params["amount"])] = 0
    return out


def erasing(pixels: np.ndarray, params: Params) -> np.ndarray:
    x0, y0, w, h = params["box"]
    out = pixels.copy()
    out[y0 : y0 + h, x0 : x0 + w] = round(params["value"] * 255)
    return out


KERNELS: dict[str, PixelKernel] = kernels_in(globals())

# ---------------------------------------------------------------- mixes


def blend(first: np.ndarray, second: np.ndarray, weight: float) -> np.ndarray:
    """weight · first + (1 - weight) · second, rounded once (MixUp)."""
    return cv2.addWeighted(first, weight, second, 1 - weight, 0.0)
