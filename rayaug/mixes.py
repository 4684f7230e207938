"""Mixes: a sample combined with partner sources (MixUp, CutMix, Mosaic), pixels and labels.

`ops` says where each image goes (the op's tiles and weights, drawn from the sample's seed);
this module puts it there. Each image is cover-fitted to its tile with one warp from its
decoded pixels, its label targets go through the same matrix and are clipped to the tile,
and the soft label is the weighted sum of the images' (possibly already soft) labels.
Pixels are the CPU path's (H, W, 3) uint8 arrays (OpenCV) or the device path's (3, H, W)
float tensors (Kornia), as the sample's are: a mix never moves a sample between the two.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from rayaug import cpu_kernels, targets
from rayaug.ops import Canvas, MixOp, Params, Tile
from rayaug.records import Targets

if TYPE_CHECKING:
    import torch

    Image = np.ndarray | torch.Tensor

SoftLabel = dict[str | None, float]  # label → share, shares summing to 1


@dataclass(frozen=True)
class Layer:
    """One image of a mix: its decoded pixels and its labels, in its own coordinates."""

    image: Image  # HWC uint8 or CHW float; h, w may be a reduced decode of `canvas`
    to_canvas: np.ndarray  # pixels of `image` → pixels of `canvas`
    canvas: Canvas  # the size its label targets are measured in
    targets: Targets | None
    labels: SoftLabel


@dataclass(frozen=True)
class Mixed:
    image: Image
    targets: Targets | None
    labels: SoftLabel


def mix(op: type[MixOp], params: Params, canvas: Canvas, layers: list[Layer]) -> Mixed:
    """`layers[0]` (the sample, already `canvas`-sized) mixed with its partners."""
    tiles = op.tiles(params, canvas)
    labelled = _labelled(layers)
    pixels = _ArrayPixels if isinstance(layers[0].image, np.ndarray) else _TensorPixels
    if op.blend == "mix":
        (tile,) = tiles
        fitted = _fitted(pixels, layers[tile.image], tile)
        image = pixels.blend(layers[0].image, fitted, params["weights"][0])
        partner = _placed(labelled[tile.image], tile, canvas)
        mixed = None if partner is None else targets.blend(labelled[0].targets, partner)
        return Mixed(image, mixed, _soft_label(layers, params["weights"]))
    keeps_sample = all(tile.image != 0 for tile in tiles)
    image = pixels.copy(layers[0].image) if keeps_sample else pixels.blank(layers[0].image)
    below = labelled[0].targets if keeps_sample else _background(labelled, canvas)
    for tile in tiles:
        pixels.paste(image, tile.rect, _fitted(pixels, layers[tile.image], tile))
        above = _placed(labelled[tile.image], tile, canvas)
        below = None if above is None else targets.overlay(below, above, tile.rect)
    return Mixed(image, below, _soft_label(layers, params["weights"]))


class _ArrayPixels:
    """The CPU path: (H, W, 3) uint8, OpenCV."""

    @staticmethod
    def fit(image: np.ndarray, matrix: np.ndarray, size: Canvas) -> np.ndarray:
        return cpu_kernels.warp(image, matrix, size)

    @staticmethod
    def blend(first: np.ndarray, second: np.ndarray, weight: float) -> np.ndarray:
        return cpu_kernels.blend(first, second, weight)

    @staticmethod
    def copy(image: np.ndarray) -> np.ndarray:
        return image.copy()

    @staticmethod
    def blank(image: np.ndarray) -> np.ndarray:
        return np.zeros_like(image)

    @staticmethod
    def paste(image: np.ndarray, rect: tuple[int, int, int, int], tile: np.ndarray) -> None:
        x0, y0, x1, y1 = rect
        image[y0:y1, x0:x1] = tile


class _TensorPixels:
    """The device path: (3, H, W) float in [0, 1], Kornia."""

    @staticmethod
    def fit(image: torch.Tensor, matrix: np.ndarray, size: Canvas) -> torch.Tensor:
        from rayaug.kernels import warp

        return warp(image[None], matrix[None], size)[0]

    @staticmethod
    def blend(first: torch.Tensor, second: torch.Tensor, weight: float) -> torch.Tensor:
        return weight * first + (1 - weight) * second

    @staticmethod
    def copy(image: torch.Tensor) -> torch.Tensor:
        return image.clone()

    @staticmethod
    def blank(image: torch.Tensor) -> torch.Tensor:
        return image.new_zeros(image.shape)

    @staticmethod
    def paste(image: torch.Tensor, rect: tuple[int, int, int, int], tile: torch.Tensor) -> None:
        x0, y0, x1, y1 = rect
        image[:, y0:y1, x0:x1] = tile


def _fitted(pixels: type[_ArrayPixels | _TensorPixels], layer: Layer, tile: Tile) -> Image:
    return pixels.fit(layer.image, tile.matrix(layer.canvas) @ layer.to_canvas, tile.size)


def _labelled(layers: list[Layer]) -> list[Layer]:
    """When any image has label targets, an image without any has none (not unknown ones)."""
    if all(layer.targets is None for layer in layers):
        return layers
    return [
        layer if layer.targets is not None else dataclasses.replace(layer, targets=Targets())
        for layer in layers
    ]


def _placed(layer: Layer, tile: Tile, canvas: Canvas) -> Targets | None:
    if layer.targets is None:
        return None
    return targets.move(
        layer.targets, tile.placement(layer.canvas), layer.canvas, canvas, tile.rect
    )


def _background(layers: list[Layer], canvas: Canvas) -> Targets | None:
    """What a mosaic's empty canvas holds: no objects, and class 0 where masks are used."""
    if layers[0].targets is None:
        return None
    masked = any(layer.targets.mask is not None for layer in layers)
    return Targets(mask=targets.mask_png(np.zeros(canvas, np.uint8)) if masked else None)


def _soft_label(layers: list[Layer], weights: list[float]) -> SoftLabel:
    mixed: SoftLabel = {}
    for layer, weight in zip(layers, weights, strict=True):
        for label, share in layer.labels.items():
            mixed[label] = mixed.get(label, 0.0) + weight * share
    return {label: share for label, share in mixed.items() if share > 0}
