"""The recipes: one op list each, every step made from the same numbers as a rayaug spec op and
as the Albumentations transform that does the same thing (never two copies to keep in step).

  a  RandomResizedCrop 224 (scale 0.08-1, ratio 3/4-4/3), HorizontalFlip p .5,
     ColorJitter(0.4, 0.4, 0.4, 0.1) p 1 (rayaug's default, exact Kornia jitter),
     Rotation +-15 deg p 1 (black corners); JPEG q90
  b  the same with rayaug's `fused: true` colour jitter (one affine colour map per sample)
  c  the ops of jobs/imagenet.yaml: RRC 224 0.08-1, flip .5, jitter(.4,.4,.4,.1) p .8,
     grayscale .2, gaussian blur kernel 23 sigma 0.1-2 p .5, solarize 0.5 p .2,
     erasing scale 0.02-0.25 p .25; JPEG q90
  d  detection, jobs/detection.yaml without the mosaic: COCO boxes in, RRC 512 scale 0.3-1,
     flip .5, affine (5 deg, translate 0.05, scale 0.9-1.1) p .5, jitter(.3,.3,.3,.02) p .8,
     gaussian blur 5 sigma 0.1-1 p .1; boxes dropped under 30 % visible (Albumentations:
     BboxParams(format="coco", min_visibility=0.3)); JPEG q92
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import SEED, shard_sources

MIN_VISIBLE = 0.3  # a box less visible than this is dropped (rayaug's rule, see the README)


@dataclass(frozen=True)
class Step:
    op: dict[str, Any]  # the rayaug spec op, as a job YAML would hold it
    albu: Callable[[Any, Any], Any]  # (albumentations, cv2) -> the same transform


def random_resized_crop(
    size: int, scale: tuple[float, float], ratio: tuple[float, float] = (3 / 4, 4 / 3)
) -> Step:
    return Step(
        {"name": "random_resized_crop", "size": size, "scale": list(scale), "ratio": list(ratio)},
        lambda A, cv2: A.RandomResizedCrop(size=(size, size), scale=scale, ratio=ratio),
    )


def horizontal_flip(p: float = 0.5) -> Step:
    return Step({"name": "horizontal_flip", "p": p}, lambda A, cv2: A.HorizontalFlip(p=p))


def color_jitter(b: float, c: float, s: float, h: float, p: float, fused: bool = False) -> Step:
    op = {
        "name": "color_jitter",
        "brightness": b,
        "contrast": c,
        "saturation": s,
        "hue": h,
        "p": p,
    } | ({"fused": True} if fused else {})
    return Step(op, lambda A, cv2: A.ColorJitter(b, c, s, h, p=p))


def rotation(degrees: float, p: float = 1.0) -> Step:
    return Step(
        {"name": "rotation", "degrees": degrees, "p": p},
        lambda A, cv2: A.Rotate(limit=degrees, border_mode=cv2.BORDER_CONSTANT, fill=0, p=p),
    )


def affine(degrees: float, translate: float, scale: tuple[float, float], p: float) -> Step:
    return Step(
        {
            "name": "affine",
            "degrees": degrees,
            "translate": [translate, translate],
            "scale": list(scale),
            "p": p,
        },
        lambda A, cv2: A.Affine(
            rotate=(-degrees, degrees),
            scale=scale,
            translate_percent=(-translate, translate),
            border_mode=cv2.BORDER_CONSTANT,
            fill=0,
            p=p,
        ),
    )


def grayscale(p: float) -> Step:
    return Step(
        {"name": "grayscale", "p": p},
        lambda A, cv2: A.ToGray(num_output_channels=3, method="weighted_average", p=p),
    )


def gaussian_blur(kernel: int, sigma: tuple[float, float], p: float) -> Step:
    return Step(
        {"name": "gaussian_blur", "kernel_size": kernel, "sigma": list(sigma), "p": p},
        lambda A, cv2: A.GaussianBlur(blur_limit=(kernel, kernel), sigma_limit=sigma, p=p),
    )


def solarize(threshold: float, p: float) -> Step:
    return Step(
        {"name": "solarize", "threshold": threshold, "p": p},
        lambda A, cv2: A.Solarize(threshold_range=(threshold, threshold), p=p),
    )


def erasing(scale: tuple[float, float], p: float, ratio: tuple[float, float] = (0.3, 3.3)) -> Step:
    return Step(
        {"name": "erasing", "scale": list(scale), "ratio": list(ratio), "p": p},
        lambda A, cv2: A.Erasing(scale=scale, ratio=ratio, fill=0, p=p),
    )


@dataclass(frozen=True)
class Recipe:
    key: str
    title: str
    size: int  # output side, pixels (the floor resizes to it)
    quality: int  # JPEG quality out
    steps: tuple[Step, ...]
    boxes: bool = False  # COCO boxes in, moved boxes out

    def rayaug_ops(self) -> list[dict[str, Any]]:
        return [dict(step.op) for step in self.steps]

    def albumentations(self, seed: int) -> Any:
        import albumentations as A
        import cv2

        bbox = (
            A.BboxParams(format="coco", label_fields=["classes"], min_visibility=MIN_VISIBLE)
            if self.boxes
            else None
        )
        return A.Compose([step.albu(A, cv2) for step in self.steps], bbox_params=bbox, seed=seed)

    def describe(self) -> dict[str, Any]:
        described = {
            "title": self.title,
            "size": self.size,
            "quality": self.quality,
            "boxes": self.boxes,
            "rayaug_ops": self.rayaug_ops(),
        }
        with suppress(ImportError):  # not on the GPU machine (augment-only needs no peers)
            import albumentations as A
            import cv2

            described["albumentations"] = [repr(step.albu(A, cv2)) for step in self.steps]
        return described

    def headline(self) -> str:
        return (
            f"recipe {self.key}: {self.title} — "
            + ", ".join(step.op["name"] for step in self.steps)
            + f"; {self.size}px JPEG q{self.quality}"
        )


# The four ops, their numbers shared with the hand-written naive-ray and DALI runners.
CROP_SCALE, CROP_RATIO = (0.08, 1.0), (3 / 4, 4 / 3)
P_FLIP, P_JITTER, P_ROTATE = 0.5, 1.0, 1.0
BRIGHTNESS = CONTRAST = SATURATION = 0.4
HUE = 0.1
DEGREES = 15.0


def four_ops(fused: bool) -> tuple[Step, ...]:
    return (
        random_resized_crop(224, CROP_SCALE, CROP_RATIO),
        horizontal_flip(P_FLIP),
        color_jitter(BRIGHTNESS, CONTRAST, SATURATION, HUE, P_JITTER, fused),
        rotation(DEGREES, P_ROTATE),
    )


RECIPES = {
    "a": Recipe("a", "four ops, exact colour jitter", 224, 90, four_ops(fused=False)),
    "b": Recipe("b", "four ops, fused colour jitter", 224, 90, four_ops(fused=True)),
    "c": Recipe(
        "c",
        "jobs/imagenet.yaml ops",
        224,
        90,
        (
            random_resized_crop(224, (0.08, 1.0), (0.75, 1.3333)),
            horizontal_flip(0.5),
            color_jitter(0.4, 0.4, 0.4, 0.1, p=0.8),
            grayscale(0.2),
            gaussian_blur(23, (0.1, 2.0), 0.5),
            solarize(0.5, 0.2),
            erasing((0.02, 0.25), 0.25),
        ),
    ),
    "d": Recipe(
        "d",
        "detection with COCO boxes (jobs/detection.yaml, no mosaic)",
        512,
        92,
        (
            random_resized_crop(512, (0.3, 1.0)),
            horizontal_flip(0.5),
            affine(5.0, 0.05, (0.9, 1.1), 0.5),
            color_jitter(0.3, 0.3, 0.3, 0.02, p=0.8),
            gaussian_blur(5, (0.1, 1.0), 0.1),
        ),
        boxes=True,
    ),
}
FOUR_OPS = ("a", "b")  # the recipes the hand-written naive-ray and DALI runners do


def rayaug_spec(
    recipe: Recipe,
    images: Path,
    output_uri: str,
    sources: int,
    views: int,
    gpu: bool,
    storage: dict[str, str],
    annotations: Path | None,
) -> dict[str, Any]:
    """The job spec of a recipe, as a user would write it for this input and output."""
    spec: dict[str, Any] = {
        "version": 1,
        "name": f"bench-{recipe.key}",
        "input": {"uri": str(images), "format": "folder"},
        "output": {
            "uri": output_uri,
            "format": "parquet",
            "image_format": "jpeg",
            "quality": recipe.quality,
            "shard_size": shard_sources(sources),
        },
        "views": views,
        "seed": SEED,
        "ops": recipe.rayaug_ops(),
        "execution": {"num_gpus": 1 if gpu else 0},
    }
    if recipe.boxes and annotations is not None:
        spec["input"]["annotations"] = str(annotations.resolve())
    if storage:
        spec["storage"] = storage
    return spec
