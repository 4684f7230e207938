"""rayaug.cpu_kernels: OpenCV's uint8 warp and colour map agree with the Kornia/torch path
(same geometry, same padding, differences of rounding only), and the Augmenter uses them."""

from __future__ import annotations

import io

import cv2
import kornia
import numpy as np
import pytest
import torch
from PIL import Image

from rayaug import cpu_kernels
from rayaug.augment import Augmenter
from rayaug.kernels import color_jitter
from rayaug.ops import CATALOGUE, ColorJitter, Rotation
from rayaug.records import SourceSample
from rayaug.spec import parse_spec

BENCH_OPS = [
    {"name": "random_resized_crop", "size": 96, "scale": [0.08, 1.0]},
    {"name": "horizontal_flip", "p": 0.5},
    {"name": "rotation", "degrees": 15},
    {
        "name": "color_jitter",
        "brightness": 0.4,
        "contrast": 0.4,
        "saturation": 0.4,
        "hue": 0.1,
        "fused": True,
    },
]


def _picture(height: int = 61, width: int = 83) -> np.ndarray:
    """Smooth gradients plus hard edges, and nothing symmetric: misplacement shows."""
    y, x = np.mgrid[0:height, 0:width]
    picture = np.stack(
        [x * 255 // (width - 1), y * 255 // (height - 1), (x // 7 + y // 5) % 2 * 255]
    )
    return np.ascontiguousarray(picture.transpose(1, 2, 0).astype(np.uint8))


def _kornia_warp(pixels: np.ndarray, matrix: np.ndarray, canvas: tuple[int, int]) -> np.ndarray:
    """What the torch path does, as 0-255 floats (unrounded)."""
    image = torch.from_numpy(pixels).permute(2, 0, 1)[None].float() / 255
    warped = kornia.geometry.transform.warp_perspective(
        image,
        torch.tensor(matrix[None], dtype=torch.float32),
        canvas,
        mode="bilinear",
        padding_mode="zeros",
        align_corners=True,
    )
    return warped[0].permute(1, 2, 0).numpy().astype(np.float64) * 255


def _matrices(canvas: tuple[int, int]) -> dict[str, tuple[np.ndarray, tuple[int, int]]]:
    def op(name: str, params: dict) -> tuple[np.ndarray, tuple[int, int]]:
        return CATALOGUE[name].matrix(params, canvas)

    h, w = canvas
    return {
        "crop+resize": op("random_resized_crop", {"box": [5, 3, 40, 30], "size": [50, 64]}),
        "flip": op("horizontal_flip", {}),
        "rotation": op("rotation", {"angle": 12.5}),
        "affine": op(
            "affine", {"angle": -7, "translate": [3.5, -2], "scale": 0.9, "shear": [4, -3]}
        ),
        "perspective": op(
            "perspective",
            {
                "start": [[0, 0], [w - 1, 0], [w - 1, h - 1], [0, h - 1]],
                "end": [[4, 2], [w - 7, 5], [w - 3, h - 6], [2, h - 1]],
            },
        ),
        "half-pixel shift": (np.array([[1, 0, 0.5], [0, 1, -0.5], [0, 0, 1.0]]), canvas),
    }


@pytest.mark.parametrize("case", list(_matrices((61, 83))))
def test_the_warp_is_kornias_rounded_to_8_bits(case: str) -> None:
    pixels = _picture()
    matrix, canvas = _matrices(pixels.shape[:2])[case]
    ours = cpu_kernels.warp(pixels, matrix, canvas).astype(np.float64)
    reference = _kornia_warp(pixels, matrix, canvas)
    assert ours.shape == reference.shape
    difference = np.abs(ours - reference)
    assert difference.mean() < 0.3  # rounding: at most 0.25 on average
    assert difference.max() < 0.6  # half a level: same taps, same weights, same padding


def test_a_flip_and_a_quarter_turn_land_where_numpy_puts_them() -> None:
    pixels = _picture(41, 41)
    flip, canvas = CATALOGUE["horizontal_flip"].matrix({}, (41, 41))
    assert np.array_equal(cpu_kernels.warp(pixels, flip, canvas), pixels[:, ::-1])
    turn, canvas = Rotation.matrix({"angle": 90}, (41, 41))  # counter-clockwise as displayed
    assert np.array_equal(cpu_kernels.warp(pixels, turn, canvas), np.rot90(pixels))


def test_outside_the_source_is_black() -> None:
    white = np.full((20, 30, 3), 255, np.uint8)
    shift = np.array([[1, 0, 10.0], [0, 1, 0], [0, 0, 1]])  # 10 px right: 10 columns uncovered
    warped = cpu_kernels.warp(white, shift, (20, 30))
    assert (warped[:, :10] == 0).all() and (warped[:, 10:] == 255).all()


def test_fused_jitter_matches_the_torch_kernel_within_a_level() -> None:
    op = ColorJitter(brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1, fused=True)
    pixels = _picture()
    for seed in range(20):
        params = op.draw(np.random.default_rng(seed), pixels.shape[:2])
        ours = cpu_kernels.fused_color_jitter(pixels, params).astype(int)
        image = torch.from_numpy(pixels).permute(2, 0, 1)[None].float() / 255
        theirs = color_jitter(image, [params])[0].permute(1, 2, 0)
        theirs = (theirs * 255).round().clamp(0, 255).to(torch.uint8).numpy().astype(int)
        assert np.abs(ours - theirs).max() <= 1


def test_only_the_fused_jitter_has_a_pixel_kernel() -> None:
    fused = ColorJitter(brightness=0.2, fused=True).draw(np.random.default_rng(0), (8, 8))
    exact = ColorJitter(brightness=0.2).draw(np.random.default_rng(0), (8, 8))
    assert cpu_kernels.pixel_kernel("color_jitter", fused) is cpu_kernels.fused_color_jitter
    assert cpu_kernels.pixel_kernel("color_jitter", exact) is None
    assert cpu_kernels.pixel_kernel("gaussian_blur", {"kernel_size": 3, "sigma": 1.0}) is None


def test_opencv_warps_what_it_warps_as_kornia_does() -> None:
    assert cpu_kernels.can_warp((4000, 3000), (224, 224))
    assert not cpu_kernels.can_warp((40000, 10), (224, 224))
    assert not cpu_kernels.can_warp((1, 1), (16, 16))  # a 1-pixel image: Kornia, as before


def _augment(photos) -> list[np.ndarray]:
    spec = parse_spec(
        {
            "input": {"uri": "in"},
            "output": {"uri": "out", "image_format": "png"},
            "seed": 7,
            "ops": BENCH_OPS,
        }
    )
    sources = [SourceSample(p.key, f"mem://{p.key}", p.jpeg) for p in photos]
    output = Augmenter(spec, "cpu").augment(sources)
    assert output.quarantined == []
    return [np.asarray(Image.open(io.BytesIO(s.image))).astype(int) for s in output.samples]


def test_the_opencv_path_agrees_with_the_kornia_path(
    photos, monkeypatch: pytest.MonkeyPatch
) -> None:
    fast = _augment(photos)
    assert cv2.getNumThreads() == 1  # set by the Augmenter: one thread, like torch's
    monkeypatch.setattr(cpu_kernels, "can_warp", lambda size, canvas: False)
    monkeypatch.setattr(cpu_kernels, "pixel_kernel", lambda name, params: None)
    kornia_path = _augment(photos)
    differences = [np.abs(a - b) for a, b in zip(fast, kornia_path, strict=True)]
    assert np.mean([d.mean() for d in differences]) < 0.5  # rounding, then the colour gain
    assert max(d.max() for d in differences) <= 4
