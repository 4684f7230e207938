"""Composite ops: OneOf, SomeOf, and the published policies RandAugment, TrivialAugment and
AutoAugment (ImageNet), as torchvision defines them.

A composite op draws which catalogue ops to apply, and their parameters, from the sample's
own stream; the manifest records only the catalogue ops actually applied (each tagged with
`via`), so a replay needs nothing from this module.
"""

from __future__ import annotations

import math
from typing import Annotated, ClassVar, Literal, Union

import numpy as np
from pydantic import Field, model_validator

from rayaug.ops import GEOMETRIC, MIXES, PHOTOMETRIC, Canvas, Op, Params, advance

Step = tuple[str, Params]


class CompositeOp(Op):
    kind: ClassVar = "composite"


def _run(ops: list[Op], rng: np.random.Generator, canvas: Canvas, via: str) -> list[Step]:
    """Each chosen op in turn (with its own probability), the canvas following the geometry."""
    steps: list[Step] = []
    for op in ops:
        if rng.random() >= op.p:
            continue
        for name, params in op.steps(rng, canvas):
            steps.append((name, params | {"via": via}))
            canvas = advance(name, params, canvas)
    return steps


class OneOf(CompositeOp):
    """Apply one of `ops`, chosen with probability proportional to `weights` (default equal)."""

    name: Literal["one_of"] = "one_of"
    ops: list[AnyOp] = Field(min_length=1)
    weights: list[float] | None = None

    @model_validator(mode="after")
    def _weights_match(self) -> OneOf:
        if self.weights is not None and (
            len(self.weights) != len(self.ops) or min(self.weights) < 0 or sum(self.weights) <= 0
        ):
            raise ValueError("weights: one non-negative weight per op, not all zero")
        return self

    def steps(self, rng: np.random.Generator, canvas: Canvas) -> list[Step]:
        weights = np.array(self.weights or [1.0] * len(self.ops), dtype=np.float64)
        chosen = int(rng.choice(len(self.ops), p=weights / weights.sum()))
        return _run([self.ops[chosen]], rng, canvas, self.name)


class SomeOf(CompositeOp):
    """Apply `n` distinct ops of `ops`, chosen at random, in the order they are listed."""

    name: Literal["some_of"] = "some_of"
    ops: list[AnyOp] = Field(min_length=1)
    n: int = Field(2, ge=1)

    @model_validator(mode="after")
    def _enough_ops(self) -> SomeOf:
        if self.n > len(self.ops):
            raise ValueError(f"n ({self.n}) is larger than the number of ops ({len(self.ops)})")
        return self

    def steps(self, rng: np.random.Generator, canvas: Canvas) -> list[Step]:
        chosen = sorted(int(i) for i in rng.choice(len(self.ops), size=self.n, replace=False))
        return _run([self.ops[i] for i in chosen], rng, canvas, self.name)


# ---------------------------------------------------------------- torchvision's policies


def _magnitudes(name: str, bins: int, canvas: Canvas, wide: bool) -> np.ndarray | None:
    """torchvision's `_augmentation_space`: the magnitude of each bin (None: no magnitude)."""
    top = 0.99 if wide else 0.9
    spaces = {
        "ShearX": np.linspace(0.0, 0.99 if wide else 0.3, bins),
        "ShearY": np.linspace(0.0, 0.99 if wide else 0.3, bins),
        "TranslateX": np.linspace(0.0, 32.0 if wide else 150.0 / 331.0 * canvas[1], bins),
        "TranslateY": np.linspace(0.0, 32.0 if wide else 150.0 / 331.0 * canvas[0], bins),
        "Rotate": np.linspace(0.0, 135.0 if wide else 30.0, bins),
        "Brightness": np.linspace(0.0, top, bins),
        "Color": np.linspace(0.0, top, bins),
        "Contrast": np.linspace(0.0, top, bins),
        "Sharpness": np.linspace(0.0, top, bins),
        "Posterize": 8 - np.round(np.arange(bins) / ((bins - 1) / (6 if wide else 4))),
        "Solarize": np.linspace(255.0, 0.0, bins),
    }
    return spaces.get(name)


_BASIC = [
    "Identity",
    "ShearX",
    "ShearY",
    "TranslateX",
    "TranslateY",
    "Rotate",
    "Brightness",
    "Color",
    "Contrast",
    "Sharpness",
    "Posterize",
    "Solarize",
    "AutoContrast",
    "Equalize",
]


# The ops whose magnitude takes a random sign: ShearX … Sharpness in torchvision's order.
_SIGNED = set(_BASIC[1:10])


def _affine(
    angle: float = 0.0,
    translate: tuple[float, float] = (0.0, 0.0),
    shear: tuple[float, float] = (0.0, 0.0),
) -> Step:
    return "affine", {
        "angle": angle,
        "translate": list(translate),
        "scale": 1.0,
        "shear": list(shear),
    }


def _catalogue_step(name: str, magnitude: float) -> Step | None:
    """A torchvision policy op at a magnitude, as the catalogue op that does the same."""
    m = float(magnitude)
    table = {
        "ShearX": lambda: _affine(shear=(math.degrees(math.atan(m)), 0.0)),
        "ShearY": lambda: _affine(shear=(0.0, math.degrees(math.atan(m)))),
        "TranslateX": lambda: _affine(translate=(float(int(m)), 0.0)),
        "TranslateY": lambda: _affine(translate=(0.0, float(int(m)))),
        "Rotate": lambda: ("rotation", {"angle": m}),
        "Brightness": lambda: ("color_jitter", {"order": ["brightness"], "brightness": 1 + m}),
        "Color": lambda: ("color_jitter", {"order": ["saturation"], "saturation": 1 + m}),
        "Contrast": lambda: ("color_jitter", {"order": ["contrast"], "contrast": 1 + m}),
        "Sharpness": lambda: ("sharpness", {"factor": 1 + m}),
        "Posterize": lambda: ("posterize", {"bits": int(m)}),
        "Solarize": lambda: ("solarize", {"threshold": m / 255.0}),
        "AutoContrast": lambda: ("autocontrast", {}),
        "Equalize": lambda: ("equalize", {}),
        "Invert": lambda: ("invert", {}),
    }
    return table[name]() if name in table else None  # Identity: nothing to apply


def _policy_step(
    name: str,
    bin_index: int | None,
    bins: int,
    rng: np.random.Generator,
    canvas: Canvas,
    wide: bool = False,
) -> Step | None:
    space = _magnitudes(name, bins, canvas, wide)
    magnitude = 0.0 if space is None or bin_index is None else float(space[bin_index])
    if name in _SIGNED and rng.integers(2):
        magnitude = -magnitude
    return _catalogue_step(name, magnitude)


def _tagged(steps: list[Step | None], via: str) -> list[Step]:
    return [(name, params | {"via": via}) for name, params in filter(None, steps)]


class RandAugment(CompositeOp):
    """torchvision's RandAugment: `num_ops` ops drawn uniformly, at a fixed `magnitude` bin."""

    name: Literal["rand_augment"] = "rand_augment"
    num_ops: int = Field(2, ge=1, le=10)
    magnitude: int = Field(9, ge=0)
    num_magnitude_bins: int = Field(31, ge=2)

    @model_validator(mode="after")
    def _in_range(self) -> RandAugment:
        if self.magnitude >= self.num_magnitude_bins:
            raise ValueError("magnitude must be below num_magnitude_bins")
        return self

    def steps(self, rng: np.random.Generator, canvas: Canvas) -> list[Step]:
        names = [_BASIC[int(rng.integers(len(_BASIC)))] for _ in range(self.num_ops)]
        return _tagged(
            [_policy_step(n, self.magnitude, self.num_magnitude_bins, rng, canvas) for n in names],
            self.name,
        )


class TrivialAugment(CompositeOp):
    """torchvision's TrivialAugmentWide: one op, at a uniformly drawn magnitude bin."""

    name: Literal["trivial_augment"] = "trivial_augment"
    num_magnitude_bins: int = Field(31, ge=2)

    def steps(self, rng: np.random.Generator, canvas: Canvas) -> list[Step]:
        name = _BASIC[int(rng.integers(len(_BASIC)))]
        bin_index = int(rng.integers(self.num_magnitude_bins))
        return _tagged(
            [_policy_step(name, bin_index, self.num_magnitude_bins, rng, canvas, wide=True)],
            self.name,
        )


# torchvision's AutoAugmentPolicy.IMAGENET: (op, probability, magnitude bin of 10).
IMAGENET_POLICY = (
    (("Posterize", 0.4, 8), ("Rotate", 0.6, 9)),
    (("Solarize", 0.6, 5), ("AutoContrast", 0.6, None)),
    (("Equalize", 0.8, None), ("Equalize", 0.6, None)),
    (("Posterize", 0.6, 7), ("Posterize", 0.6, 6)),
    (("Equalize", 0.4, None), ("Solarize", 0.2, 4)),
    (("Equalize", 0.4, None), ("Rotate", 0.8, 8)),
    (("Solarize", 0.6, 3), ("Equalize", 0.6, None)),
    (("Posterize", 0.8, 5), ("Equalize", 1.0, None)),
    (("Rotate", 0.2, 3), ("Solarize", 0.6, 8)),
    (("Equalize", 0.6, None), ("Posterize", 0.4, 6)),
    (("Rotate", 0.8, 8), ("Color", 0.4, 0)),
    (("Rotate", 0.4, 9), ("Equalize", 0.6, None)),
    (("Equalize", 0.0, None), ("Equalize", 0.8, None)),
    (("Invert", 0.6, None), ("Equalize", 1.0, None)),
    (("Color", 0.6, 4), ("Contrast", 1.0, 8)),
    (("Rotate", 0.8, 8), ("Color", 1.0, 2)),
    (("Color", 0.8, 8), ("Solarize", 0.8, 7)),
    (("Sharpness", 0.4, 7), ("Invert", 0.6, None)),
    (("ShearX", 0.6, 5), ("Equalize", 1.0, None)),
    (("Color", 0.4, 0), ("Equalize", 0.6, None)),
    (("Equalize", 0.4, None), ("Solarize", 0.2, 4)),
    (("Solarize", 0.6, 5), ("AutoContrast", 0.6, None)),
    (("Invert", 0.6, None), ("Equalize", 1.0, None)),
    (("Color", 0.6, 4), ("Contrast", 1.0, 8)),
    (("Equalize", 0.8, None), ("Equalize", 0.6, None)),
)


class AutoAugment(CompositeOp):
    """torchvision's AutoAugment with the ImageNet policy: one sub-policy of two ops."""

    name: Literal["auto_augment"] = "auto_augment"
    policy: Literal["imagenet"] = "imagenet"

    def steps(self, rng: np.random.Generator, canvas: Canvas) -> list[Step]:
        sub_policy = IMAGENET_POLICY[int(rng.integers(len(IMAGENET_POLICY)))]
        steps: list[Step | None] = []
        for name, probability, bin_index in sub_policy:
            if rng.random() <= probability:
                steps.append(_policy_step(name, bin_index, 10, rng, canvas))
        return _tagged(steps, self.name)


COMPOSITE = (OneOf, SomeOf, RandAugment, TrivialAugment, AutoAugment)
_ALL = Union[GEOMETRIC + PHOTOMETRIC + COMPOSITE]  # noqa: UP007 - built from a tuple
AnyOp = Annotated[_ALL, Field(discriminator="name")]
# Mixes read other sources: top-level ops only, never drawn by a composite.
_TOP_LEVEL = Union[GEOMETRIC + PHOTOMETRIC + COMPOSITE + MIXES]  # noqa: UP007
PipelineOp = Annotated[_TOP_LEVEL, Field(discriminator="name")]
for _composite in (OneOf, SomeOf):
    _composite.model_rebuild()
