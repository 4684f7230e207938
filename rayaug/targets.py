"""Label targets that move with the pixels: boxes, keypoints and a segmentation mask.

Coordinates are in pixels of the EXIF-oriented source, edges at integers (a box [0, 0, W, H]
is the whole image). A sample's geometric ops compose to one homography (pixel centres at
integer coordinates, as in `ops`); targets go through that same matrix:

- a box becomes the axis-aligned box of its four transformed corners, clipped to the output;
  it is kept when its clipped area is at least MIN_VISIBLE of its transformed area and at
  least one pixel wide and high — otherwise it is dropped with its class;
- a keypoint moves with the matrix; one that leaves the frame gets visibility 0;
- the mask is warped with nearest-neighbour sampling (class ids never blend).

Mixes (`mixes`) place each image's targets in its tile with `move(..., rect)`, then `overlay`
(CutMix, Mosaic: what is pasted over covers what is under) or `blend` (MixUp: both sets).
"""

from __future__ import annotations

import io

import cv2
import numpy as np
from PIL import Image

from rayaug.records import Targets

MIN_VISIBLE = 0.3
Rect = tuple[int, int, int, int]  # x0, y0, x1, y1 in output pixels (edges)


def _project(matrix: np.ndarray, points: np.ndarray) -> np.ndarray:
    """Edge-coordinate points through a pixel-centre homography."""
    centred = np.ones((len(points), 3))
    centred[:, :2] = points - 0.5
    moved = centred @ matrix.T
    return moved[:, :2] / moved[:, 2:3] + 0.5


def _move_boxes(targets: Targets, matrix: np.ndarray, rect: Rect):
    """Boxes through `matrix`, clipped to `rect`; kept when enough of each stays visible. Every
    box's corners go through one projection: a box of its own cost 20 µs of numpy calls."""
    if not targets.boxes:
        return [], []
    x0, y0, x1, y1 = np.array(targets.boxes, dtype=np.float64).T
    corners = np.stack([x0, y0, x1, y0, x1, y1, x0, y1], axis=1).reshape(-1, 2)
    moved = _project(matrix, corners).reshape(-1, 4, 2)
    low, high = moved.min(axis=1), moved.max(axis=1)
    clipped_low, clipped_high = np.maximum(low, rect[:2]), np.minimum(high, rect[2:])
    spans, sides = high - low, clipped_high - clipped_low
    area = spans[:, 0] * spans[:, 1]
    clipped = np.maximum(sides[:, 0], 0) * np.maximum(sides[:, 1], 0)
    kept = (sides[:, 0] >= 1) & (sides[:, 1] >= 1) & (clipped >= MIN_VISIBLE * area)
    boxes = np.concatenate([clipped_low, clipped_high], axis=1)[kept].tolist()
    return boxes, [cls for cls, keep in zip(targets.classes, kept, strict=True) if keep]


def _inside(points: np.ndarray, rect: Rect) -> np.ndarray:
    inside = (points[:, 0] >= rect[0]) & (points[:, 0] < rect[2])
    return inside & (points[:, 1] >= rect[1]) & (points[:, 1] < rect[3])


def _move_keypoints(keypoints: list[list[float]], matrix: np.ndarray, rect: Rect):
    if not keypoints:
        return []
    points = np.array(keypoints, dtype=np.float64)
    moved = _project(matrix, points[:, :2])
    visibility = np.where(_inside(moved, rect), points[:, 2], 0.0)
    return [[float(x), float(y), float(v)] for (x, y), v in zip(moved, visibility, strict=True)]


def mask_ids(mask: bytes) -> np.ndarray:
    """A mask PNG as an (h, w) array of class ids."""
    return np.array(Image.open(io.BytesIO(mask)).convert("L"), dtype=np.uint8)


def mask_png(ids: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(ids.astype(np.uint8), "L").save(buffer, "PNG")
    return buffer.getvalue()


def _move_mask(
    mask: bytes, matrix: np.ndarray, source: tuple[int, int], canvas: tuple[int, int]
) -> np.ndarray:
    ids = mask_ids(mask)
    if ids.shape != source:
        raise ValueError(f"mask is {ids.shape[1]}x{ids.shape[0]}, image {source[1]}x{source[0]}")
    # Nearest neighbour, class 0 outside: class ids are never blended. OpenCV on every device:
    # a mask is a small uint8 array on the host whatever the pixels run on.
    return cv2.warpPerspective(
        ids,
        np.linalg.inv(matrix),
        (canvas[1], canvas[0]),
        flags=cv2.INTER_NEAREST | cv2.WARP_INVERSE_MAP,
        borderMode=cv2.BORDER_CONSTANT,
        borderValue=0,
    )


def move(
    targets: Targets,
    matrix: np.ndarray,
    source: tuple[int, int],
    canvas: tuple[int, int],
    rect: Rect | None = None,
) -> Targets:
    """The targets of the output: through `matrix` from the source canvas (h, w) to `canvas`,
    keeping only what lies in `rect` (default: all of the canvas)."""
    rect = rect or (0, 0, canvas[1], canvas[0])
    boxes, classes = _move_boxes(targets, matrix, rect)
    keypoints = _move_keypoints(targets.keypoints, matrix, rect)
    mask = None
    if targets.mask is not None:
        ids = _move_mask(targets.mask, matrix, source, canvas)
        ids[_outside(rect, canvas)] = 0
        mask = mask_png(ids)
    return Targets(boxes, classes, keypoints, mask)


def _outside(rect: Rect, canvas: tuple[int, int]) -> np.ndarray:
    outside = np.ones(canvas, dtype=bool)
    outside[rect[1] : rect[3], rect[0] : rect[2]] = False
    return outside


# ---------------------------------------------------------------- mixes


def occlude(targets: Targets, rect: Rect) -> Targets:
    """What stays visible of `targets` under an image pasted over `rect`: boxes keep their
    extent while at least MIN_VISIBLE of them is uncovered; covered keypoints get visibility 0.
    The mask is left to `overlay`, which pastes the covering mask."""
    boxes, classes = [], []
    for box, cls in zip(targets.boxes, targets.classes, strict=True):
        area = (box[2] - box[0]) * (box[3] - box[1])
        covered = max(min(box[2], rect[2]) - max(box[0], rect[0]), 0) * max(
            min(box[3], rect[3]) - max(box[1], rect[1]), 0
        )
        if area - covered >= MIN_VISIBLE * area:
            boxes.append(box)
            classes.append(cls)
    keypoints = [
        [x, y, 0.0 if rect[0] <= x < rect[2] and rect[1] <= y < rect[3] else v]
        for x, y, v in targets.keypoints
    ]
    return Targets(boxes, classes, keypoints, targets.mask)


def overlay(below: Targets, above: Targets, rect: Rect) -> Targets:
    """The targets of `above` (already inside `rect`) pasted over those of `below`."""
    below = occlude(below, rect)
    mask = None
    if below.mask is not None or above.mask is not None:
        if below.mask is None or above.mask is None:
            raise ValueError("a mix needs a mask on every image or on none")
        ids, pasted = mask_ids(below.mask), mask_ids(above.mask)
        inside = ~_outside(rect, ids.shape)
        ids[inside] = pasted[inside]
        mask = mask_png(ids)
    return _joined(below, above, mask)


def blend(first: Targets, second: Targets) -> Targets:
    """Both images' targets, for a blend of the two (MixUp): class ids cannot be blended."""
    if first.mask is not None or second.mask is not None:
        raise ValueError("mixup cannot blend segmentation masks; use cutmix or mosaic")
    return _joined(first, second, None)


def _joined(first: Targets, second: Targets, mask: bytes | None) -> Targets:
    return Targets(
        first.boxes + second.boxes,
        first.classes + second.classes,
        first.keypoints + second.keypoints,
        mask,
    )
