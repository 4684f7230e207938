"""The op catalogue: each op's spec fields, how it draws its parameters, and its geometry.

Drawing (`draw`) uses only numpy and the sample's own generator, so parameters never depend on
the batch, the actor or the device. Geometric ops give a 3x3 pixel homography (pixel centres
at integer coordinates), fused per sample into one warp by `augment`. Photometric ops
are applied from their recorded parameters alone by `kernels` (Kornia's split: sample, then
apply). Mix ops (MixUp, CutMix, Mosaic) draw their layout and partner picks here too, and
`mixes` applies them. This module needs no torch, so the spec loads fast and I/O workers stay
light.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, Union

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from rayaug.streams import Streams

Canvas = tuple[int, int]  # (height, width)
Params = dict[str, Any]
Range = tuple[float, float]
Region = tuple[float, float, float, float]  # (x0, y0, x1, y1) of the canvas, pixel centres

# The homography of no warp at all, shared rather than a new np.eye(3) for every sample (a
# sample's pending warp, a fusion's start, a mix layer already on its canvas). Read-only:
# every use makes new matrices from it (`@`), never writes into it.
NO_WARP = np.eye(3)
NO_WARP.flags.writeable = False


def is_no_warp(matrix: np.ndarray) -> bool:
    """Whether `matrix` warps nothing (the shared NO_WARP itself is recognised at once)."""
    return matrix is NO_WARP or np.array_equal(matrix, NO_WARP)


def _as_range(value: object, around: float = 0.0) -> object:
    """A scalar x means the symmetric range [around - x, around + x]."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return (around - value, around + value)
    if isinstance(value, list | tuple):
        return value
    raise ValueError(f"must be a number or [min, max], not {value!r}")


def _ordered(value: tuple[float, float]) -> tuple[float, float]:
    if value[0] > value[1]:
        raise ValueError("range must be [low, high] with low ≤ high")
    return value


def _size_pair(value: object) -> object:
    if isinstance(value, int) and not isinstance(value, bool):
        return (value, value)
    if isinstance(value, list | tuple):
        return value
    raise ValueError(f"must be a number or [height, width], not {value!r}")


def _non_neg(value: object) -> object:
    if isinstance(value, int | float) and value < 0:
        raise ValueError("must be ≥ 0")
    return value


def _non_neg_range(value: tuple[float, float]) -> tuple[float, float]:
    if value[0] < 0:
        raise ValueError("must be ≥ 0")
    return value


def _positive_size(value: tuple[int, int]) -> tuple[int, int]:
    if min(value) < 1:
        raise ValueError("sizes must be ≥ 1")
    return value


class Op(BaseModel):
    """An op's configuration (from the spec) and its behaviour."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: ClassVar[Literal["geometric", "photometric", "composite", "mix"]]
    p: float = Field(1.0, ge=0, le=1, description="probability that a sample gets this op")
    same_on_views: bool = Field(False, description="draw once per source: every view alike")

    def draw(self, rng: np.random.Generator, canvas: Canvas) -> Params:
        """The op's random parameters for one sample on a canvas of the given size."""
        return {}

    def steps(self, rng: np.random.Generator, canvas: Canvas) -> list[tuple[str, Params]]:
        """The catalogue ops this op applies, with their parameters (composites: several)."""
        return [(self.name, self.draw(rng, canvas))]


class GeometricOp(Op):
    kind: ClassVar = "geometric"
    # The canvas is the same size after the op (a flip, a rotation): planning a sample's ops
    # then needs no matrix of it (Perspective's solves a linear system).
    keeps_canvas: ClassVar[bool] = False

    @staticmethod
    def matrix(params: Params, canvas: Canvas) -> tuple[np.ndarray, Canvas]:
        """The source→destination pixel homography and the canvas size after the op."""
        raise NotImplementedError

    @classmethod
    def canvas_after(cls, params: Params, canvas: Canvas) -> Canvas:
        """The canvas size after the op: `matrix(params, canvas)[1]`, without the matrix."""
        return canvas if cls.keeps_canvas else cls.matrix(params, canvas)[1]


class PhotometricOp(Op):
    kind: ClassVar = "photometric"

    @staticmethod
    def batch_key(params: Params) -> object:
        """Samples whose keys differ cannot share one kernel call (e.g. blur kernel size)."""
        return None


# ---------------------------------------------------------------- geometry helpers


def scale_translate(sx: float, sy: float, tx: float, ty: float) -> np.ndarray:
    """x → sx·x + tx, y → sy·y + ty as a homography."""
    # From a flat list: numpy takes a third of the time it takes for nested lists.
    return np.array([sx, 0.0, tx, 0.0, sy, ty, 0.0, 0.0, 1.0]).reshape(3, 3)


def _crop_resize(box: list[float], size: Canvas) -> np.ndarray:
    """Map the box [x0, y0, w, h] (pixel edges) onto a (h, w) canvas, pixel centres aligned."""
    x0, y0, w, h = box
    sx, sy = size[1] / w, size[0] / h
    return scale_translate(sx, sy, (0.5 - x0) * sx - 0.5, (0.5 - y0) * sy - 0.5)


def _about_centre(linear: np.ndarray, canvas: Canvas, shift: tuple[float, float] = (0, 0)):
    cx, cy = (canvas[1] - 1) / 2, (canvas[0] - 1) / 2
    to_origin = scale_translate(1, 1, -cx, -cy)
    back = scale_translate(1, 1, cx + shift[0], cy + shift[1])
    return back @ linear @ to_origin


def _rotation(angle_deg: float) -> np.ndarray:
    """Counter-clockwise as displayed (y points down)."""
    a = math.radians(angle_deg)
    return np.array([[math.cos(a), math.sin(a), 0], [-math.sin(a), math.cos(a), 0], [0, 0, 1.0]])


def _homography(src: list[list[float]], dst: list[list[float]]) -> np.ndarray:
    rows, rhs = [], []
    for (x, y), (u, v) in zip(src, dst, strict=True):
        rows.append([x, y, 1, 0, 0, 0, -u * x, -u * y])
        rows.append([0, 0, 0, x, y, 1, -v * x, -v * y])
        rhs += [u, v]
    h = np.linalg.solve(np.array(rows, dtype=np.float64), np.array(rhs, dtype=np.float64))
    return np.append(h, 1.0).reshape(3, 3)


def _uniform(rng: np.random.Generator, bounds: Range) -> float:
    """`rng.uniform(*bounds)`, the very same double: numpy computes low + (high - low) · the
    next `random()`, and its argument handling costs three times the draw itself."""
    low, high = float(bounds[0]), float(bounds[1])  # numpy takes them as doubles
    return low + (high - low) * rng.random()


def _noise_seed(rng: np.random.Generator) -> int:
    """Noise pixels come from a recorded seed: the manifest stays small and replay exact."""
    return int(rng.integers(0, 2**63 - 1))


def noise_field(seed: int, size: Canvas, kind: Literal["normal", "uniform"]) -> np.ndarray:
    """A noise op's random field from its recorded seed alone: (h, w, 3) standard normals, or
    (h, w) uniforms in [0, 1). numpy on the CPU, so both kernel sets and every device draw the
    same numbers for a sample."""
    rng = np.random.default_rng(seed)
    if kind == "normal":
        return rng.standard_normal((*size, 3), dtype=np.float32)
    return rng.random(size, dtype=np.float32)


# ---------------------------------------------------------------- geometric ops


class Resize(GeometricOp):
    """Resize to [height, width], or the shorter side to `size` when it is one number."""

    name: Literal["resize"] = "resize"
    size: int | tuple[int, int]

    @field_validator("size")
    @classmethod
    def _size(cls, value: int | tuple[int, int]) -> int | tuple[int, int]:
        _positive_size(_size_pair(value))
        return value

    def draw(self, rng: np.random.Generator, canvas: Canvas) -> Params:
        if isinstance(self.size, int):
            h, w = canvas
            scale = self.size / min(h, w)
            out = (
                (self.size, max(1, round(w * scale)))
                if h <= w
                else (max(1, round(h * scale)), self.size)
            )
            return {"size": list(out)}
        return {"size": list(self.size)}

    @staticmethod
    def matrix(params: Params, canvas: Canvas) -> tuple[np.ndarray, Canvas]:
        size = tuple(params["size"])
        return _crop_resize([0, 0, canvas[1], canvas[0]], size), size

    @classmethod
    def canvas_after(cls, params: Params, canvas: Canvas) -> Canvas:
        return tuple(params["size"])


class _Crop(GeometricOp):
    size: tuple[int, int]
    _check_size = field_validator("size", mode="before")(lambda cls, v: _size_pair(v))
    _positive = field_validator("size")(lambda cls, v: _positive_size(v))

    @staticmethod
    def matrix(params: Params, canvas: Canvas) -> tuple[np.ndarray, Canvas]:
        x0, y0, w, h = params["box"]
        return scale_translate(1, 1, -x0, -y0), (h, w)

    @classmethod
    def canvas_after(cls, params: Params, canvas: Canvas) -> Canvas:
        _, _, w, h = params["box"]
        return (h, w)


class CenterCrop(_Crop):
    """Crop [height, width] from the centre (padded with black when the image is smaller)."""

    name: Literal["center_crop"] = "center_crop"

    def draw(self, rng: np.random.Generator, canvas: Canvas) -> Params:
        h, w = self.size
        return {"box": [(canvas[1] - w) // 2, (canvas[0] - h) // 2, w, h]}


class RandomCrop(_Crop):
    """Crop [height, width] at a uniformly random position."""

    name: Literal["random_crop"] = "random_crop"

    def draw(self, rng: np.random.Generator, canvas: Canvas) -> Params:
        h, w = self.size
        x0 = int(rng.integers(min(0, canvas[1] - w), max(0, canvas[1] - w) + 1))
        y0 = int(rng.integers(min(0, canvas[0] - h), max(0, canvas[0] - h) + 1))
        return {"box": [x0, y0, w, h]}


class RandomResizedCrop(GeometricOp):
    """A crop of random area and aspect ratio, resized to `size` (torchvision's sampling)."""

    name: Literal["random_resized_crop"] = "random_resized_crop"
    size: tuple[int, int]
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    _pair = field_validator("size", mode="before")(lambda cls, v: _size_pair(v))
    _positive = field_validator("size")(lambda cls, v: _positive_size(v))

    @field_validator("scale", "ratio")
    @classmethod
    def _range(cls, value: tuple[float, float]) -> tuple[float, float]:
        if value[0] <= 0:
            raise ValueError("must be > 0")
        return _ordered(value)

    def draw(self, rng: np.random.Generator, canvas: Canvas) -> Params:
        height, width = canvas
        area = height * width
        log_ratio = (math.log(self.ratio[0]), math.log(self.ratio[1]))
        for _ in range(10):
            target = area * _uniform(rng, self.scale)
            aspect = math.exp(_uniform(rng, log_ratio))
            w = round(math.sqrt(target * aspect))
            h = round(math.sqrt(target / aspect))
            if 0 < w <= width and 0 < h <= height:
                x0 = int(rng.integers(0, width - w + 1))
                y0 = int(rng.integers(0, height - h + 1))
                return {"box": [x0, y0, w, h], "size": list(self.size)}
        # Like torchvision: fall back to the largest centred crop within the ratio bounds.
        w, h = width, height
        if width / height < self.ratio[0]:
            h = round(width / self.ratio[0])
        elif width / height > self.ratio[1]:
            w = round(height * self.ratio[1])
        return {"box": [(width - w) // 2, (height - h) // 2, w, h], "size": list(self.size)}

    @staticmethod
    def matrix(params: Params, canvas: Canvas) -> tuple[np.ndarray, Canvas]:
        size = tuple(params["size"])
        return _crop_resize(params["box"], size), size

    @classmethod
    def canvas_after(cls, params: Params, canvas: Canvas) -> Canvas:
        return tuple(params["size"])


class HorizontalFlip(GeometricOp):
    keeps_canvas: ClassVar = True
    name: Literal["horizontal_flip"] = "horizontal_flip"
    p: float = Field(0.5, ge=0, le=1)

    @staticmethod
    def matrix(params: Params, canvas: Canvas) -> tuple[np.ndarray, Canvas]:
        return scale_translate(-1, 1, canvas[1] - 1, 0), canvas


class VerticalFlip(GeometricOp):
    keeps_canvas: ClassVar = True
    name: Literal["vertical_flip"] = "vertical_flip"
    p: float = Field(0.5, ge=0, le=1)

    @staticmethod
    def matrix(params: Params, canvas: Canvas) -> tuple[np.ndarray, Canvas]:
        return scale_translate(1, -1, 0, canvas[0] - 1), canvas


class Rotation(GeometricOp):
    """Rotate about the centre by an angle in `degrees` (x means [-x, x]); corners go black."""

    name: Literal["rotation"] = "rotation"
    keeps_canvas: ClassVar = True
    degrees: tuple[float, float]
    _range = field_validator("degrees", mode="before")(lambda cls, v: _as_range(_non_neg(v)))
    _order = field_validator("degrees")(lambda cls, v: _ordered(v))

    def draw(self, rng: np.random.Generator, canvas: Canvas) -> Params:
        return {"angle": _uniform(rng, self.degrees)}

    @staticmethod
    def matrix(params: Params, canvas: Canvas) -> tuple[np.ndarray, Canvas]:
        return _about_centre(_rotation(params["angle"]), canvas), canvas


class Affine(GeometricOp):
    """Rotation, translation (fraction of the size), scale and shear (degrees) about the centre."""

    name: Literal["affine"] = "affine"
    keeps_canvas: ClassVar = True
    degrees: tuple[float, float] = (0.0, 0.0)
    translate: tuple[float, float] = (0.0, 0.0)
    scale: tuple[float, float] = (1.0, 1.0)
    shear: tuple[float, float] = (0.0, 0.0)
    _sym = field_validator("degrees", "shear", mode="before")(lambda cls, v: _as_range(_non_neg(v)))
    _order = field_validator("degrees", "shear", "scale")(lambda cls, v: _ordered(v))

    @field_validator("translate")
    @classmethod
    def _translate(cls, value: tuple[float, float]) -> tuple[float, float]:
        if not all(0 <= t <= 1 for t in value):
            raise ValueError("fractions must be in [0, 1]")
        return value

    @field_validator("scale")
    @classmethod
    def _scale(cls, value: tuple[float, float]) -> tuple[float, float]:
        if value[0] <= 0:
            raise ValueError("must be > 0")
        return value

    def draw(self, rng: np.random.Generator, canvas: Canvas) -> Params:
        max_dx, max_dy = self.translate[0] * canvas[1], self.translate[1] * canvas[0]
        return {
            "angle": _uniform(rng, self.degrees),
            "translate": [_uniform(rng, (-max_dx, max_dx)), _uniform(rng, (-max_dy, max_dy))],
            "scale": _uniform(rng, self.scale),
            "shear": [_uniform(rng, self.shear), _uniform(rng, self.shear)],
        }

    @staticmethod
    def matrix(params: Params, canvas: Canvas) -> tuple[np.ndarray, Canvas]:
        shx, shy = (math.tan(math.radians(s)) for s in params["shear"])
        shear = np.array([[1, shx, 0], [shy, 1, 0], [0, 0, 1.0]])
        scale = scale_translate(params["scale"], params["scale"], 0, 0)
        linear = _rotation(params["angle"]) @ scale @ shear
        return _about_centre(linear, canvas, tuple(params["translate"])), canvas


class Perspective(GeometricOp):
    """Move each corner inward by up to `distortion_scale` of half the size (torchvision's)."""

    name: Literal["perspective"] = "perspective"
    keeps_canvas: ClassVar = True
    distortion_scale: float = Field(0.5, ge=0, le=1)

    def draw(self, rng: np.random.Generator, canvas: Canvas) -> Params:
        h, w = canvas
        dx, dy = int(self.distortion_scale * w / 2), int(self.distortion_scale * h / 2)

        def inward(limit: int) -> int:
            return int(rng.integers(0, limit + 1))

        start = [[0, 0], [w - 1, 0], [w - 1, h - 1], [0, h - 1]]
        end = [
            [inward(dx), inward(dy)],
            [w - 1 - inward(dx), inward(dy)],
            [w - 1 - inward(dx), h - 1 - inward(dy)],
            [inward(dx), h - 1 - inward(dy)],
        ]
        return {"start": start, "end": end}

    @staticmethod
    def matrix(params: Params, canvas: Canvas) -> tuple[np.ndarray, Canvas]:
        return _homography(params["start"], params["end"]), canvas


# ---------------------------------------------------------------- photometric ops


class ColorJitter(PhotometricOp):
    """torchvision's ColorJitter, with the order of its four steps drawn per sample.

    `fused: true` applies the four steps as one affine colour map per sample: about 10x
    faster on CPU, without clipping between steps, and with hue as a rotation about the gray
    axis (YIQ) instead of an HSV shift. The default is Kornia's exact torchvision semantics.
    """

    name: Literal["color_jitter"] = "color_jitter"
    brightness: float = Field(0.0, ge=0)
    contrast: float = Field(0.0, ge=0)
    saturation: float = Field(0.0, ge=0)
    hue: float = Field(0.0, ge=0, le=0.5)
    fused: bool = False

    # The steps in the order their permutation is drawn from
    STEPS: ClassVar = ("brightness", "contrast", "saturation", "hue")

    def draw(self, rng: np.random.Generator, canvas: Canvas) -> Params:
        # A permutation of indices draws exactly what one of the names did (numpy's shuffle
        # draws by position, whatever the items) in a fifth of the time: no string array.
        order = [self.STEPS[i] for i in rng.permutation(len(self.STEPS)).tolist()]
        spans = {"brightness": self.brightness, "contrast": self.contrast}
        spans |= {"saturation": self.saturation}
        factors = {k: _uniform(rng, (max(0.0, 1 - v), 1 + v)) for k, v in spans.items() if v}
        if self.hue:
            factors["hue"] = _uniform(rng, (-self.hue, self.hue))
        order = [s for s in order if s in factors]
        return {"order": order, **factors} | ({"fused": True} if self.fused else {})

    @staticmethod
    def batch_key(params: Params) -> object:
        return params.get("fused", False)


class Grayscale(PhotometricOp):
    name: Literal["grayscale"] = "grayscale"
    p: float = Field(0.1, ge=0, le=1)


class GaussianBlur(PhotometricOp):
    """Blur with an odd `kernel_size` and a sigma drawn from `sigma` [low, high]."""

    name: Literal["gaussian_blur"] = "gaussian_blur"
    kernel_size: int = Field(5, ge=3, le=63)
    sigma: tuple[float, float] = (0.1, 2.0)
    _order = field_validator("sigma")(lambda cls, v: _ordered(v))

    @field_validator("kernel_size")
    @classmethod
    def _odd(cls, value: int) -> int:
        if value % 2 == 0:
            raise ValueError("must be odd")
        return value

    @field_validator("sigma")
    @classmethod
    def _positive(cls, value: tuple[float, float]) -> tuple[float, float]:
        if value[0] <= 0:
            raise ValueError("must be > 0")
        return value

    def draw(self, rng: np.random.Generator, canvas: Canvas) -> Params:
        return {"kernel_size": self.kernel_size, "sigma": _uniform(rng, self.sigma)}

    @staticmethod
    def batch_key(params: Params) -> object:
        return params["kernel_size"]


class GaussianNoise(PhotometricOp):
    """Add N(mean, std) noise, std drawn from `std` [low, high] (in units of full scale)."""

    name: Literal["gaussian_noise"] = "gaussian_noise"
    mean: float = 0.0
    std: tuple[float, float] = (0.01, 0.05)
    _order = field_validator("std")(lambda cls, v: _ordered(_non_neg_range(v)))

    def draw(self, rng: np.random.Generator, canvas: Canvas) -> Params:
        return {"mean": self.mean, "std": _uniform(rng, self.std), "noise_seed": _noise_seed(rng)}


class SaltAndPepper(PhotometricOp):
    """Set a fraction `amount` [low, high] of pixels to white (salt) or black (pepper)."""

    name: Literal["salt_and_pepper"] = "salt_and_pepper"
    amount: tuple[float, float] = (0.01, 0.05)
    salt_vs_pepper: float = Field(0.5, ge=0, le=1)

    @field_validator("amount")
    @classmethod
    def _fraction(cls, value: tuple[float, float]) -> tuple[float, float]:
        if not 0 <= value[0] <= value[1] <= 1:
            raise ValueError("must be [low, high] within [0, 1]")
        return value

    def draw(self, rng: np.random.Generator, canvas: Canvas) -> Params:
        amount = _uniform(rng, self.amount)
        return {
            "amount": amount,
            "salt_vs_pepper": self.salt_vs_pepper,
            "noise_seed": _noise_seed(rng),
        }


class Erasing(PhotometricOp):
    """Fill a random rectangle (area fraction `scale`, aspect `ratio`) with `value`."""

    name: Literal["erasing"] = "erasing"
    p: float = Field(0.5, ge=0, le=1)
    scale: tuple[float, float] = (0.02, 0.33)
    ratio: tuple[float, float] = (0.3, 3.3)
    value: float = Field(0.0, ge=0, le=1)
    _order = field_validator("scale", "ratio")(lambda cls, v: _ordered(v))

    def draw(self, rng: np.random.Generator, canvas: Canvas) -> Params:
        height, width = canvas
        log_ratio = (math.log(self.ratio[0]), math.log(self.ratio[1]))
        for _ in range(10):
            area = height * width * _uniform(rng, self.scale)
            aspect = math.exp(_uniform(rng, log_ratio))
            h, w = round(math.sqrt(area * aspect)), round(math.sqrt(area / aspect))
            if 0 < h < height and 0 < w < width:
                x0 = int(rng.integers(0, width - w + 1))
                y0 = int(rng.integers(0, height - h + 1))
                return {"box": [x0, y0, w, h], "value": self.value}
        return {"box": [0, 0, 0, 0], "value": self.value}


class Sharpness(PhotometricOp):
    """PIL-style sharpness with a factor from `factor` [low, high] (1 = unchanged)."""

    name: Literal["sharpness"] = "sharpness"
    factor: tuple[float, float] = (0.5, 2.0)
    _order = field_validator("factor")(lambda cls, v: _ordered(_non_neg_range(v)))

    def draw(self, rng: np.random.Generator, canvas: Canvas) -> Params:
        return {"factor": _uniform(rng, self.factor)}


class Posterize(PhotometricOp):
    """Keep `bits` [low, high] high bits per channel."""

    name: Literal["posterize"] = "posterize"
    bits: tuple[int, int] = (4, 8)

    @field_validator("bits")
    @classmethod
    def _bits(cls, value: tuple[int, int]) -> tuple[int, int]:
        if not 1 <= value[0] <= value[1] <= 8:
            raise ValueError("must be [low, high] within [1, 8]")
        return value

    def draw(self, rng: np.random.Generator, canvas: Canvas) -> Params:
        return {"bits": int(rng.integers(self.bits[0], self.bits[1] + 1))}


class Solarize(PhotometricOp):
    """Invert pixels at or above a threshold drawn from `threshold` [low, high]."""

    name: Literal["solarize"] = "solarize"
    threshold: tuple[float, float] = (0.5, 0.5)

    @field_validator("threshold", mode="before")
    @classmethod
    def _scalar(cls, value: object) -> object:
        return (value, value) if isinstance(value, int | float) else value

    @field_validator("threshold")
    @classmethod
    def _unit(cls, value: tuple[float, float]) -> tuple[float, float]:
        if not 0 <= value[0] <= value[1] <= 1:
            raise ValueError("must be [low, high] within [0, 1]")
        return value

    def draw(self, rng: np.random.Generator, canvas: Canvas) -> Params:
        return {"threshold": _uniform(rng, self.threshold)}


class Equalize(PhotometricOp):
    name: Literal["equalize"] = "equalize"


class AutoContrast(PhotometricOp):
    """Stretch each channel to the full range (PIL's autocontrast)."""

    name: Literal["autocontrast"] = "autocontrast"


class Invert(PhotometricOp):
    name: Literal["invert"] = "invert"


# The fused colour jitter, as one affine map of RGB (the kernels on every device apply it).
# ITU-R 601 luma, as Kornia's grayscale; YIQ for the fused hue rotation about the gray axis.
LUMA = np.array([0.299, 0.587, 0.114])
_YIQ = np.array([[0.299, 0.587, 0.114], [0.596, -0.274, -0.322], [0.211, -0.523, 0.312]])


def saturation_matrix(factor: float) -> np.ndarray:
    """factor · RGB + (1 - factor) · its luma, as a 3x3 map (0: grayscale)."""
    return factor * np.eye(3) + (1 - factor) * np.outer(np.ones(3), LUMA)


def _fused_step(step: str, factor: float, mean_gray: float) -> tuple[np.ndarray, np.ndarray]:
    """One jitter step as an affine map of RGB: (3x3 matrix, offset)."""
    identity, no_offset = np.eye(3), np.zeros(3)
    if step == "brightness":
        return factor * identity, no_offset
    if step == "contrast":
        return factor * identity, np.full(3, (1 - factor) * mean_gray)
    if step == "saturation":
        return saturation_matrix(factor), no_offset
    angle = factor * 2 * math.pi
    rotation = np.array(
        [[1, 0, 0], [0, math.cos(angle), -math.sin(angle)], [0, math.sin(angle), math.cos(angle)]]
    )
    return np.linalg.inv(_YIQ) @ rotation @ _YIQ, no_offset


def fused_colour_map(mean: np.ndarray, params: Params) -> tuple[np.ndarray, np.ndarray]:
    """One sample's jitter steps as one affine colour map of RGB in [0, 1]: (3x3, offset).

    Exact without clipping between steps: the contrast step's mean is the mean of an affine
    image, i.e. the same affine map of the input's mean colour (`mean`, RGB in [0, 1]).
    """
    matrix, offset = np.eye(3), np.zeros(3)
    for step in params["order"]:
        mean_gray = float(LUMA @ (matrix @ mean + offset))
        step_matrix, step_offset = _fused_step(step, params[step], mean_gray)
        matrix, offset = step_matrix @ matrix, step_matrix @ offset + step_offset
    return matrix, offset


# ---------------------------------------------------------------- mixes (several sources)

Box = tuple[int, int, int, int]  # x0, y0, x1, y1 in canvas pixels (edges)


def _cover(source: Canvas, size: Canvas) -> np.ndarray:
    """Scale `source` (aspect kept) to cover `size`, keeping its centre."""
    scale = max(size[0] / source[0], size[1] / source[1])
    w, h = size[1] / scale, size[0] / scale
    return _crop_resize([(source[1] - w) / 2, (source[0] - h) / 2, w, h], size)


@dataclass(frozen=True)
class Tile:
    """Where one image of a mix lands: cover-fitted to `fit`, of which `rect` is kept."""

    image: int  # 0: the sample itself; i ≥ 1: its i-th partner
    fit: Box
    rect: Box

    @property
    def size(self) -> Canvas:
        return (self.rect[3] - self.rect[1], self.rect[2] - self.rect[0])

    def matrix(self, source: Canvas) -> np.ndarray:
        """Source pixels → pixels of `rect` (its top-left pixel at 0, 0)."""
        x0, y0, x1, y1 = self.fit
        shift = scale_translate(1, 1, x0 - self.rect[0], y0 - self.rect[1])
        return shift @ _cover(source, (y1 - y0, x1 - x0))

    def placement(self, source: Canvas) -> np.ndarray:
        """Source pixels → canvas pixels (what the image's labels go through)."""
        return scale_translate(1, 1, self.rect[0], self.rect[1]) @ self.matrix(source)


class MixOp(Op):
    """Mixes the sample with partner sources, picked from the job's whole source list.

    `draw` records `picks` (uniform numbers that choose the partners); the augment stage
    resolves them to the partners' keys, recorded as `partners`, which is what a replay reads.
    `weights` (the sample first, then each partner) are the shares of the soft label.
    """

    kind: ClassVar = "mix"
    partner_count: ClassVar[int] = 1
    blend: ClassVar[Literal["mix", "paste"]] = "paste"

    def draw(self, rng: np.random.Generator, canvas: Canvas) -> Params:
        picks = [float(rng.random()) for _ in range(self.partner_count)]
        return self.layout(rng, canvas) | {"picks": picks}

    def layout(self, rng: np.random.Generator, canvas: Canvas) -> Params:
        raise NotImplementedError

    @staticmethod
    def tiles(params: Params, canvas: Canvas) -> list[Tile]:
        """The images pasted (or blended) onto the canvas, in order."""
        raise NotImplementedError


def _whole(canvas: Canvas) -> Box:
    return (0, 0, canvas[1], canvas[0])


class MixUp(MixOp):
    """Blend with one partner: `weights[0]`·sample + `weights[1]`·partner (λ ~ Beta(α, α))."""

    name: Literal["mixup"] = "mixup"
    alpha: float = Field(1.0, gt=0)
    blend: ClassVar = "mix"

    def layout(self, rng: np.random.Generator, canvas: Canvas) -> Params:
        lam = float(rng.beta(self.alpha, self.alpha))
        return {"weights": [lam, 1 - lam]}

    @staticmethod
    def tiles(params: Params, canvas: Canvas) -> list[Tile]:
        return [Tile(1, _whole(canvas), _whole(canvas))]


class CutMix(MixOp):
    """Paste a box of one partner (fitted to the canvas) over the sample; its area is ~Beta."""

    name: Literal["cutmix"] = "cutmix"
    alpha: float = Field(1.0, gt=0)

    def layout(self, rng: np.random.Generator, canvas: Canvas) -> Params:
        height, width = canvas
        cut = math.sqrt(1 - float(rng.beta(self.alpha, self.alpha)))
        cx, cy = int(rng.integers(0, width)), int(rng.integers(0, height))
        half_w, half_h = int(width * cut) // 2, int(height * cut) // 2
        box = [max(cx - half_w, 0), max(cy - half_h, 0)]
        box += [min(cx + half_w, width), min(cy + half_h, height)]
        share = (box[2] - box[0]) * (box[3] - box[1]) / (width * height)
        return {"box": box, "weights": [1 - share, share]}

    @staticmethod
    def tiles(params: Params, canvas: Canvas) -> list[Tile]:
        x0, y0, x1, y1 = params["box"]
        return [Tile(1, _whole(canvas), (x0, y0, x1, y1))] if x1 > x0 and y1 > y0 else []


class Mosaic(MixOp):
    """Four images in a 2x2 grid split at a random centre: the sample top-left, then three
    partners (top-right, bottom-left, bottom-right), each cover-fitted to its cell."""

    name: Literal["mosaic"] = "mosaic"
    centre: tuple[float, float] = Field((0.25, 0.75), description="split point range, 0–1")
    partner_count: ClassVar = 3

    @field_validator("centre")
    @classmethod
    def _inside(cls, value: tuple[float, float]) -> tuple[float, float]:
        if not 0 < value[0] <= value[1] < 1:
            raise ValueError("must be [low, high] with 0 < low ≤ high < 1")
        return value

    def layout(self, rng: np.random.Generator, canvas: Canvas) -> Params:
        height, width = canvas
        cx = min(max(round(width * _uniform(rng, self.centre)), 1), max(width - 1, 1))
        cy = min(max(round(height * _uniform(rng, self.centre)), 1), max(height - 1, 1))
        cells = self.tiles({"centre": [cx, cy]}, canvas)
        areas = {tile.image: tile.size[0] * tile.size[1] / (width * height) for tile in cells}
        return {"centre": [cx, cy], "weights": [areas.get(i, 0.0) for i in range(4)]}

    @staticmethod
    def tiles(params: Params, canvas: Canvas) -> list[Tile]:
        (cx, cy), (height, width) = params["centre"], canvas
        cells = [(0, 0, cx, cy), (cx, 0, width, cy), (0, cy, cx, height), (cx, cy, width, height)]
        return [
            Tile(i, cell, cell)
            for i, cell in enumerate(cells)
            if cell[2] > cell[0] and cell[3] > cell[1]
        ]


GEOMETRIC = (Resize, CenterCrop, RandomCrop, RandomResizedCrop, HorizontalFlip, VerticalFlip)
GEOMETRIC += (Rotation, Affine, Perspective)
PHOTOMETRIC = (ColorJitter, Grayscale, GaussianBlur, GaussianNoise, SaltAndPepper, Erasing)
PHOTOMETRIC += (Sharpness, Posterize, Solarize, Equalize, AutoContrast, Invert)
MIXES = (MixUp, CutMix, Mosaic)
CATALOGUE: dict[str, type[Op]] = {
    cls.model_fields["name"].default: cls for cls in GEOMETRIC + PHOTOMETRIC + MIXES
}


def kernels_in(namespace: dict[str, Any]) -> dict[str, Any]:
    """A kernel module's kernels by op name: one function per photometric op, named as the op
    (a kernel set that lacks one fails at import, not on the first sample that needs it)."""
    return {
        cls.model_fields["name"].default: namespace[cls.model_fields["name"].default]
        for cls in PHOTOMETRIC
    }


CatalogueOp = Annotated[Union[GEOMETRIC + PHOTOMETRIC], Field(discriminator="name")]  # noqa: UP007


# ---------------------------------------------------------------- per-sample plans


@dataclass(frozen=True)
class Applied:
    """One op applied to one sample: its place in the pipeline and its drawn parameters.

    `position` is (index in the pipeline, index among the steps a composite op expanded to).
    """

    position: tuple[int, int]
    name: str
    params: Params

    @property
    def op(self) -> type[Op]:
        return CATALOGUE[self.name]

    def record(self) -> dict[str, Any]:
        return {"op": self.name, "params": self.params}


def advance(name: str, params: Params, canvas: Canvas) -> Canvas:
    """The canvas size after one catalogue op."""
    op = CATALOGUE[name]
    return op.canvas_after(params, canvas) if issubclass(op, GeometricOp) else canvas


def draw_ops(
    pipeline: Sequence[Op],
    seed: int,
    canvas: Canvas,
    source_seed: int | None = None,
    streams: Streams | None = None,
) -> list[Applied]:
    """Every random choice for one sample, from its seed alone (each op its own stream).

    An op with `same_on_views` draws from `source_seed` (the same for every view of a
    source) instead; without one, the sample is planned on its own. `streams`: the op streams
    seeded beforehand for these seeds (all the views of a source at once), else seeded here.
    """
    if streams is None:
        streams = Streams([seed] if source_seed is None else [seed, source_seed], len(pipeline))
    applied = []
    for position, op in enumerate(pipeline):
        shared = op.same_on_views and source_seed is not None
        rng = streams(source_seed if shared else seed, position)
        if rng.random() >= op.p:
            continue
        for sub, (name, params) in enumerate(op.steps(rng, canvas)):
            applied.append(Applied((position, sub), name, params))
            canvas = advance(name, params, canvas)
    return applied


def from_records(records: list[dict[str, Any]]) -> list[Applied]:
    """The manifest's `ops` back into a plan (positions are the order they were applied in)."""
    return [Applied((i, 0), r["op"], r["params"]) for i, r in enumerate(records)]


def composed_warp(applied: Sequence[Applied], canvas: Canvas) -> np.ndarray:
    """The fused homography of all the geometric ops (what labels go through)."""
    return _fused([step for step in applied if step.op.kind == "geometric"], canvas)[0]


def leading_warp(applied: Sequence[Applied], canvas: Canvas) -> tuple[np.ndarray, Canvas]:
    """The first warp a sample's pixels go through: the fused homography of the geometric ops
    before its first other op, and the canvas it draws."""
    leading = itertools.takewhile(lambda step: step.op.kind == "geometric", applied)
    return _fused(list(leading), canvas)


def _fused(geometric: Sequence[Applied], canvas: Canvas) -> tuple[np.ndarray, Canvas]:
    """One homography for geometric steps in a row, and the canvas the last one draws."""
    matrix = NO_WARP
    for step in geometric:
        step_matrix, canvas = step.op.matrix(step.params, canvas)
        matrix = step_matrix @ matrix
    return matrix, canvas


def decode_request(applied: Sequence[Applied], canvas: Canvas) -> tuple[int, Region | None]:
    """What one sample asks of its source's decode, from its first warp: the reduction (source
    pixels per output pixel, rounded down) and the least box (x0, y0, x1, y1) of the canvas
    where that warp samples, or None where it samples everywhere (no geometric op first; a
    perspective that folds the horizon in). A pure function of the plan, so a replay decodes
    what the job decoded; the decode leaves the rest out."""
    matrix, drawn = leading_warp(applied, canvas)
    return reduction_for(matrix), _box_sampled(matrix, drawn, canvas)


def _box_sampled(matrix: np.ndarray, drawn: Canvas, canvas: Canvas) -> Region | None:
    if drawn == canvas and is_no_warp(matrix):
        return None
    height, width = drawn
    inverse = _inverse(matrix.tolist())
    corners = [(0, 0), (width - 1, 0), (0, height - 1), (width - 1, height - 1)]
    points = [[r[0] * x + r[1] * y + r[2] for r in inverse] for x, y in corners]
    if any(w <= 0 for _, _, w in points):
        return None
    xs, ys = [x / w for x, _, w in points], [y / w for _, y, w in points]
    return (min(xs), min(ys), max(xs), max(ys))


def _inverse(m: list[list[float]]) -> list[list[float]]:
    """A 3×3 matrix's inverse by its adjugate, in Python floats: a decode request is asked
    for every view, where numpy's call costs more than the arithmetic."""
    (a, b, c), (d, e, f), (g, h, i) = m
    cofactors = [
        [e * i - f * h, c * h - b * i, b * f - c * e],
        [f * g - d * i, a * i - c * g, c * d - a * f],
        [d * h - e * g, b * g - a * h, a * e - b * d],
    ]
    det = a * cofactors[0][0] + b * cofactors[1][0] + c * cofactors[2][0]
    return [[v / det for v in row] for row in cofactors]


def reduction_for(matrix: np.ndarray) -> int:
    """Source pixels per output pixel of a homography's linear part, rounded down."""
    # The least-shrunk direction decides: a mean (sqrt of det) over-shrinks a squashed axis.
    # Its stretch is the largest singular value of the 2×2 part, in closed form (see _inverse)
    # from its rotation and reflection parts: exact to an ulp where a scaled rotation would
    # lose half its digits to cancellation in the eigenvalue form.
    (a, b), (c, d) = matrix[:2, :2].tolist()
    stretch = (math.hypot(a + d, c - b) + math.hypot(a - d, c + b)) / 2
    return max(1, int(1 / stretch + 1e-9)) if stretch > 0 else 1  # k - 1e-15 is still k
