"""rayaug.targets: boxes, keypoints and masks follow the pixels through every geometric op."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from rayaug import targets
from rayaug.augment import Augmenter
from rayaug.ops import scale_translate
from rayaug.records import SourceSample, Targets
from rayaug.spec import parse_spec

# A 200x160 image, gray, with a red rectangle [60, 40, 120, 100) (x0, y0, x1, y1).
RED = (60, 40, 120, 100)


def scene() -> tuple[bytes, bytes]:
    pixels = np.full((160, 200, 3), 128, dtype=np.uint8)
    x0, y0, x1, y1 = RED
    pixels[y0:y1, x0:x1] = (255, 0, 0)
    mask = np.zeros((160, 200), dtype=np.uint8)
    mask[y0:y1, x0:x1] = 7
    image, mask_png = io.BytesIO(), io.BytesIO()
    Image.fromarray(pixels).save(image, "PNG")
    Image.fromarray(mask, "L").save(mask_png, "PNG")
    return image.getvalue(), mask_png.getvalue()


def run(ops: list[dict], views: int = 6):
    image, mask = scene()
    targets = Targets(
        boxes=[list(map(float, RED))],
        classes=[3],
        keypoints=[[60.0, 40.0, 2.0], [119.5, 99.5, 2.0]],
        mask=mask,
    )
    spec = parse_spec(
        {
            "input": {"uri": "i"},
            "output": {"uri": "o", "image_format": "png"},
            "views": views,
            "ops": ops,
            "seed": 4,
        }
    )
    source = SourceSample("scene.png", "mem://scene.png", image, "thing", targets=targets)
    output = Augmenter(spec).augment([source])
    assert output.quarantined == []
    return output.samples


def red_box(data: bytes) -> tuple[float, float, float, float] | None:
    pixels = np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).astype(int)
    red = (pixels[..., 0] > 180) & (pixels[..., 1] < 90) & (pixels[..., 2] < 90)
    if not red.any():
        return None
    ys, xs = np.nonzero(red)
    return xs.min(), ys.min(), xs.max() + 1, ys.max() + 1


def iou(a, b) -> float:
    ix = max(0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    return inter / ((a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter)


@pytest.mark.parametrize(
    "ops",
    [
        [{"name": "horizontal_flip", "p": 1}],
        [{"name": "vertical_flip", "p": 1}, {"name": "resize", "size": [120, 90]}],
        [{"name": "random_crop", "size": [120, 150]}],
        [{"name": "random_resized_crop", "size": 96, "scale": [0.5, 1.0]}],
        [{"name": "rotation", "degrees": 8}],
        [{"name": "affine", "degrees": 5, "translate": [0.1, 0.1], "scale": [0.8, 1.2]}],
        [{"name": "color_jitter", "brightness": 0.1}, {"name": "rotation", "degrees": 5}],
    ],
    ids=["hflip", "vflip+resize", "random_crop", "rrc", "rotation", "affine", "jitter+rotation"],
)
def test_a_box_still_encloses_its_object(ops: list[dict]) -> None:
    for sample in run(ops):
        found = red_box(sample.image)
        boxes = sample.targets.boxes
        if found is None:  # cropped away: the box must be gone too (or barely visible)
            assert boxes == [] or (boxes[0][2] - boxes[0][0]) * (boxes[0][3] - boxes[0][1]) < 4
            continue
        if not boxes:  # dropped by the visibility rule: little of the object is left
            assert (found[2] - found[0]) * (found[3] - found[1]) < 0.5 * 60 * 60
            continue
        assert sample.targets.classes == [3]
        assert iou(boxes[0], found) > 0.75, (sample.ops, boxes[0], found)


def test_each_box_is_clipped_or_dropped_on_its_own_and_keeps_its_class() -> None:
    # A crop 50 px in from the left onto a 100x100 canvas (a translation)
    boxes = [
        [0.0, 0.0, 40.0, 40.0],  # left of the crop: gone
        [60.0, 10.0, 90.0, 40.0],  # inside: moved
        [40.0, 50.0, 70.0, 80.0],  # two thirds inside: clipped
        [0.0, 60.0, 58.0, 90.0],  # 8 of 58 px inside, under MIN_VISIBLE: dropped
        [45.0, 0.0, 55.0, 10.0],  # half inside: clipped
    ]
    crop = scale_translate(1, 1, -50, 0)
    moved = targets.move(Targets(boxes, [1, 2, 3, 4, 5]), crop, (100, 200), (100, 100))
    assert moved.boxes == [[10.0, 10.0, 40.0, 40.0], [0.0, 50.0, 20.0, 80.0], [0.0, 0.0, 5.0, 10.0]]
    assert moved.classes == [2, 3, 5]
    assert targets.move(Targets(), crop, (100, 200), (100, 100)) == Targets()


def test_mask_moves_with_nearest_sampling_and_keeps_its_ids() -> None:
    for sample in run([{"name": "rotation", "degrees": 20}, {"name": "horizontal_flip"}]):
        mask = np.asarray(Image.open(io.BytesIO(sample.targets.mask)))
        assert set(np.unique(mask)) <= {0, 7}  # no blended ids
        pixels = np.asarray(Image.open(io.BytesIO(sample.image)).convert("RGB")).astype(int)
        red = (pixels[..., 0] > 180) & (pixels[..., 1] < 90)
        agree = ((mask == 7) == red).mean()
        assert agree > 0.97


def test_keypoints_move_and_lose_visibility_outside() -> None:
    flipped = run([{"name": "horizontal_flip", "p": 1}], views=1)[0]
    (x0, y0, v0), (x1, y1, v1) = flipped.targets.keypoints
    assert (x0, y0, v0) == pytest.approx((140.0, 40.0, 2.0))
    assert (x1, y1) == pytest.approx((80.5, 99.5))
    shifted = run([{"name": "center_crop", "size": [40, 40]}], views=1)[0]
    # the crop is x 80..120, y 60..100: the first point falls outside, the second inside
    outside, inside = shifted.targets.keypoints
    assert outside[2] == 0.0
    assert inside == pytest.approx([39.5, 39.5, 2.0])


def test_targets_round_trip_and_validation() -> None:
    parsed = Targets.parse({"boxes": [[1, 2, 3, 4]], "classes": [5]}, "xywh")
    assert parsed.boxes == [[1.0, 2.0, 4.0, 6.0]] and parsed.classes == [5]
    with pytest.raises(ValueError, match="one class per box"):
        Targets.parse({"boxes": [[1, 2, 3, 4]], "classes": [1, 2]}, "xyxy")
    with pytest.raises(ValueError, match="triples"):
        Targets.parse({"keypoints": [1, 2]}, "xyxy")
