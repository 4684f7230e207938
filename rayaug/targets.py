"""Label targets that move with the pixels: boxes, keypoints and a segmentation mask.

Coordinates are in pixels of the EXIF-oriented source, edges at integers (a box [0, 0, W, H]
is the whole image). A sample's geometric ops compose to one homography (pixel centres at
integer coordinates, as in `ops`); targets go through that same matrix:

- a box becomes the axis-aligned box of its four transformed corners, clipped to the output;
  it is kept when its clipped area is at least MIN_VISIBLE of its transformed area and at
  least one pixel wide and high — otherwise it is dropped with its class;
- a keypoint moves with the matrix; one that leaves the frame gets visibility 0;
- the mask is warped with nearest-neighbour sampling (class ids never blend).
"""

from __future__ import annotations

import io

import kornia
import numpy as np
import torch
from PIL import Image

from rayaug.records import Targets

MIN_VISIBLE = 0.3


def _project(matrix: np.ndarray, points: np.ndarray) -> np.ndarray:
    """Edge-coordinate points through a pixel-centre homography."""
    centred = np.c_[points - 0.5, np.ones(len(points))]
    moved = centred @ matrix.T
    return moved[:, :2] / moved[:, 2:3] + 0.5


def _move_boxes(targets: Targets, matrix: np.ndarray, canvas: tuple[int, int]):
    height, width = canvas
    boxes, classes = [], []
    for (x0, y0, x1, y1), cls in zip(targets.boxes, targets.classes, strict=True):
        corners = _project(matrix, np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]]))
        (lx, ly), (hx, hy) = corners.min(axis=0), corners.max(axis=0)
        cx0, cy0, cx1, cy1 = max(lx, 0), max(ly, 0), min(hx, width), min(hy, height)
        area = (hx - lx) * (hy - ly)
        clipped = max(cx1 - cx0, 0) * max(cy1 - cy0, 0)
        if cx1 - cx0 >= 1 and cy1 - cy0 >= 1 and clipped >= MIN_VISIBLE * area:
            boxes.append([float(v) for v in (cx0, cy0, cx1, cy1)])
            classes.append(cls)
    return boxes, classes


def _move_keypoints(keypoints: list[list[float]], matrix: np.ndarray, canvas: tuple[int, int]):
    if not keypoints:
        return []
    points = np.array(keypoints, dtype=np.float64)
    moved = _project(matrix, points[:, :2])
    inside = (moved[:, 0] >= 0) & (moved[:, 0] < canvas[1]) & (moved[:, 1] >= 0)
    inside &= moved[:, 1] < canvas[0]
    visibility = np.where(inside, points[:, 2], 0.0)
    return [[float(x), float(y), float(v)] for (x, y), v in zip(moved, visibility, strict=True)]


def _move_mask(mask: bytes, matrix: np.ndarray, source: tuple[int, int], canvas: tuple[int, int]):
    ids = np.array(Image.open(io.BytesIO(mask)).convert("L"), dtype=np.float32)
    if ids.shape != source:
        raise ValueError(f"mask is {ids.shape[1]}x{ids.shape[0]}, image {source[1]}x{source[0]}")
    warped = kornia.geometry.transform.warp_perspective(
        torch.from_numpy(ids)[None, None],
        torch.tensor(matrix, dtype=torch.float32)[None],
        canvas,
        mode="nearest",
        padding_mode="zeros",
        align_corners=True,
    )
    buffer = io.BytesIO()
    Image.fromarray(warped[0, 0].round().to(torch.uint8).numpy(), "L").save(buffer, "PNG")
    return buffer.getvalue()


def move(
    targets: Targets, matrix: np.ndarray, source: tuple[int, int], canvas: tuple[int, int]
) -> Targets:
    """The targets of the output: through `matrix` from the source canvas (h, w) to `canvas`."""
    boxes, classes = _move_boxes(targets, matrix, canvas)
    keypoints = _move_keypoints(targets.keypoints, matrix, canvas)
    mask = None if targets.mask is None else _move_mask(targets.mask, matrix, source, canvas)
    return Targets(boxes, classes, keypoints, mask)
