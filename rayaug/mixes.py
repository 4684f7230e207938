"""Mixes: a sample combined with partner sources (MixUp, CutMix, Mosaic), pixels and labels.

`ops` says where each image goes (the op's tiles and weights, drawn from the sample's seed);
this module puts it there. Each image is cover-fitted to its tile with one warp from its
decoded pixels, its label targets go through the same matrix and are clipped to the tile,
and the soft label is the weighted sum of the images' (possibly already soft) labels.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from rayaug import targets
from rayaug.kernels import warp
from rayaug.ops import Canvas, MixOp, Params, Tile
from rayaug.records import Targets

SoftLabel = dict[str | None, float]  # label → share, shares summing to 1


@dataclass(frozen=True)
class Layer:
    """One image of a mix: its decoded pixels and its labels, in its own coordinates."""

    image: torch.Tensor  # (3, h, w) in [0, 1]; h, w may be a reduced decode of `canvas`
    to_canvas: np.ndarray  # pixels of `image` → pixels of `canvas`
    canvas: Canvas  # the size its label targets are measured in
    targets: Targets | None
    labels: SoftLabel


@dataclass(frozen=True)
class Mixed:
    image: torch.Tensor
    targets: Targets | None
    labels: SoftLabel


def mix(op: type[MixOp], params: Params, canvas: Canvas, layers: list[Layer]) -> Mixed:
    """`layers[0]` (the sample, already `canvas`-sized) mixed with its partners."""
    tiles = op.tiles(params, canvas)
    labelled = _labelled(layers)
    if op.blend == "mix":
        (tile,) = tiles
        lam = params["weights"][0]
        image = lam * layers[0].image + (1 - lam) * _fitted(layers[tile.image], tile)
        partner = _placed(labelled[tile.image], tile, canvas)
        mixed = None if partner is None else targets.blend(labelled[0].targets, partner)
        return Mixed(image, mixed, _soft_label(layers, params["weights"]))
    keeps_sample = all(tile.image != 0 for tile in tiles)
    image = layers[0].image.clone() if keeps_sample else torch.zeros_like(layers[0].image)
    below = labelled[0].targets if keeps_sample else _background(labelled, canvas)
    for tile in tiles:
        x0, y0, x1, y1 = tile.rect
        image[:, y0:y1, x0:x1] = _fitted(layers[tile.image], tile)
        above = _placed(labelled[tile.image], tile, canvas)
        below = None if above is None else targets.overlay(below, above, tile.rect)
    return Mixed(image, below, _soft_label(layers, params["weights"]))


def _fitted(layer: Layer, tile: Tile) -> torch.Tensor:
    matrix = tile.matrix(layer.canvas) @ layer.to_canvas
    return warp(layer.image[None], matrix[None], tile.size)[0]


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
