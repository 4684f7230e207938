"""rayaug.cpu_kernels: OpenCV's uint8 warp and colour map agree with the Kornia/torch path
(same geometry, same padding, differences of rounding only), and the Augmenter uses them."""

from __future__ import annotations

import io
from collections.abc import Iterator

import cv2
import kornia
import numpy as np
import pytest
import torch
from PIL import Image

from rayaug import cpu_kernels
from rayaug.augment import KORNIA_ON_CPU, Augmenter
from rayaug.kernels import KERNELS
from rayaug.ops import CATALOGUE, Rotation
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


def _cropped_then(
    then: str, options: dict, photos
) -> Iterator[tuple[np.ndarray, np.ndarray, tuple]]:
    """Each photo's pixels with a random resized crop, then `then`, fused: (pixels, map,
    canvas)."""
    crop = CATALOGUE["random_resized_crop"](size=64, scale=[0.08, 1.0])
    last = CATALOGUE[then](**options)
    for seed, photo in enumerate(photos):
        pixels = np.array(Image.open(io.BytesIO(photo.jpeg)).convert("RGB"))
        rng, matrix, canvas = np.random.default_rng(seed), np.eye(3), pixels.shape[:2]
        for op in (crop, last):
            step, canvas = op.matrix(op.draw(rng, canvas), canvas)
            matrix = step @ matrix
        yield pixels, matrix, canvas


@pytest.mark.parametrize("then", ["horizontal_flip", "rotation", "perspective"])
def test_fused_warps_of_real_photos_are_kornias_to_the_level(then: str, photos) -> None:
    """A random resized crop, then a flip (an axis-aligned map: OpenCV's warpAffine), a
    rotation (warpAffine on OpenCV 5, else warpPerspective) or a perspective (warpPerspective):
    Kornia's 8-bit result but for rare pixels one level off."""
    differences = []
    options = {"degrees": 15} if then == "rotation" else {}
    for pixels, matrix, canvas in _cropped_then(then, options, photos):
        assert (matrix[[0, 1], [1, 0]] == 0).all() == (then == "horizontal_flip")
        theirs = np.clip(np.round(_kornia_warp(pixels, matrix, canvas)), 0, 255)
        differences.append(np.abs(cpu_kernels.warp(pixels, matrix, canvas) - theirs))
    assert max(d.max() for d in differences) <= 1
    assert np.mean([d.mean() for d in differences]) < 0.01


@pytest.mark.parametrize(
    ("then", "options"),
    [("rotation", {"degrees": 15}), ("affine", {"degrees": 10, "shear": [5, 5]})],
)
def test_a_rotation_or_shear_keeps_warp_perspectives_bytes_on_this_opencv(
    then: str, options: dict, photos
) -> None:
    """Outputs written before OpenCV 5's warpAffine was used for these maps stay resumable:
    whichever warp runs, the bytes are warpPerspective's (the fingerprint names the OpenCV
    version, not the call)."""
    flags = cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP
    for pixels, matrix, canvas in _cropped_then(then, options, photos):
        assert (matrix[[0, 1], [1, 0]] != 0).all()
        perspective = cv2.warpPerspective(
            pixels, np.linalg.inv(matrix), canvas[::-1], flags=flags, borderMode=cv2.BORDER_CONSTANT
        )
        assert np.array_equal(cpu_kernels.warp(pixels, matrix, canvas), perspective)


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


# Each kernel against its Kornia kernel on real photos: (mean, max) absolute difference in
# levels that the README promises (measured: exact jitter 0.23 / 4, the others ≤ 0.03 / 1).
KERNEL_BOUNDS = {
    "color_jitter": ({"brightness": 0.4, "contrast": 0.4, "saturation": 0.4, "hue": 0.1}, 0.3, 5),
    "color_jitter (fused)": (
        {"brightness": 0.4, "contrast": 0.4, "saturation": 0.4, "hue": 0.1, "fused": True},
        0.1,
        1,
    ),
    "grayscale": ({}, 0.05, 1),
    "gaussian_blur": ({"kernel_size": 23, "sigma": [0.1, 2.0]}, 0.05, 1),
    "gaussian_noise": ({"std": [0.01, 0.1]}, 0.05, 1),
    "salt_and_pepper": ({"amount": [0.01, 0.1]}, 0.0, 0),
    "erasing": ({"scale": [0.02, 0.25]}, 0.0, 0),
    "sharpness": ({"factor": [0.1, 2.0]}, 0.05, 1),
    "posterize": ({"bits": [1, 8]}, 0.0, 0),
    "solarize": ({"threshold": [0.0, 1.0]}, 0.0, 0),
    "equalize": ({}, 0.0, 0),
    "autocontrast": ({}, 0.05, 1),
    "invert": ({}, 0.0, 0),
}


def _photo_pixels(photos, side: int = 96) -> list[np.ndarray]:
    return [
        cv2.resize(np.asarray(Image.open(io.BytesIO(p.jpeg)).convert("RGB")), (side, side))
        for p in photos
    ]


def test_every_photometric_op_has_a_uint8_kernel() -> None:
    assert set(cpu_kernels.KERNELS) == set(KERNELS)


@pytest.mark.parametrize("case", list(KERNEL_BOUNDS))
def test_each_kernel_is_kornias_within_its_stated_bound(case: str, photos) -> None:
    name = case.split()[0]
    fields, mean_bound, max_bound = KERNEL_BOUNDS[case]
    op = CATALOGUE[name](**fields)
    means, maxima = [], []
    for seed, pixels in enumerate(_photo_pixels(photos) * 2):
        params = op.draw(np.random.default_rng(seed), pixels.shape[:2])
        ours = cpu_kernels.KERNELS[name](pixels, params)
        assert ours.dtype == np.uint8 and ours.shape == pixels.shape
        image = torch.from_numpy(pixels).permute(2, 0, 1)[None].float() / 255
        theirs = KERNELS[name](image, [params])[0].permute(1, 2, 0)
        theirs = (theirs * 255).round().clamp(0, 255).to(torch.uint8).numpy()
        difference = np.abs(ours.astype(int) - theirs.astype(int))
        means.append(difference.mean())
        maxima.append(difference.max())
    assert np.mean(means) <= mean_bound and max(maxima) <= max_bound, (means, maxima)


@pytest.mark.parametrize("name", list(KERNELS))
def test_a_kernel_leaves_its_input_as_it_was(name: str, photos) -> None:
    pixels = _photo_pixels(photos[:1])[0]
    before = pixels.copy()
    op = CATALOGUE[name](**KERNEL_BOUNDS[name][0])
    cpu_kernels.KERNELS[name](pixels, op.draw(np.random.default_rng(0), pixels.shape[:2]))
    assert np.array_equal(pixels, before)


def test_solarize_inverts_exactly_the_levels_kornias_float32_comparison_inverts() -> None:
    """Every level of every channel, at thresholds on and between the levels: the compare and
    XOR give the table of Kornia's comparison, on a strided view as on a whole image."""
    levels = np.arange(256, dtype=np.float32)
    ramp = np.stack([np.arange(256), np.arange(256)[::-1], np.roll(np.arange(256), 7)], axis=-1)
    pixels = np.tile(ramp.astype(np.uint8)[None], (3, 1, 1))
    for threshold in [0.0, 1.0, *np.linspace(0, 1, 200), *(np.arange(1, 255) / 255)]:
        below = levels / np.float32(255) < np.float32(threshold)
        table = np.where(below, levels, 255 - levels).astype(np.uint8)
        for image in (pixels, pixels[:, ::2]):
            solarized = cpu_kernels.solarize(image, {"threshold": float(threshold)})
            assert np.array_equal(solarized, table[image]), threshold


@pytest.mark.parametrize("bits", range(1, 9))
def test_posterize_keeps_exactly_the_high_bits(bits: int) -> None:
    pixels = np.tile(np.arange(256, dtype=np.uint8)[None, :, None], (2, 1, 3))
    kept = cpu_kernels.posterize(pixels, {"bits": bits})
    assert np.array_equal(kept, (pixels >> (8 - bits)) << (8 - bits))


def test_the_exact_jitter_follows_the_recorded_order() -> None:
    pixels = _picture()
    bright_first = {"order": ["brightness", "saturation"], "brightness": 1.8, "saturation": 0.0}
    gray_first = bright_first | {"order": ["saturation", "brightness"]}
    one = cpu_kernels.color_jitter(pixels, bright_first)
    other = cpu_kernels.color_jitter(pixels, gray_first)
    assert not np.array_equal(one, other)  # clipping between steps makes order matter
    assert np.array_equal(other, cpu_kernels.color_jitter(pixels, gray_first))


@pytest.mark.parametrize(
    "params",
    [
        {"order": ["brightness", "saturation", "contrast"], "contrast": 1.4},
        {"order": ["contrast", "saturation", "brightness"], "brightness": 1.4},
    ],
)
def test_jitter_steps_that_cannot_clip_are_rounded_once(params: dict, photos) -> None:
    """Factors ≤ 1 keep every level inside [0, 255], so Kornia clips nothing before the last
    step: the kernel maps the steps as one and rounds once (one level at most from Kornia),
    where a rounding after each step was amplified by the last step's gain of 1.4."""
    params = {"brightness": 0.7, "contrast": 0.6, "saturation": 0.5} | params
    differences = []
    for pixels in _photo_pixels(photos):
        ours = cpu_kernels.color_jitter(pixels, params)
        image = torch.from_numpy(pixels).permute(2, 0, 1)[None].float() / 255
        theirs = KERNELS["color_jitter"](image, [params])[0].permute(1, 2, 0)
        theirs = (theirs * 255).round().clamp(0, 255).to(torch.uint8).numpy()
        differences.append(np.abs(ours.astype(int) - theirs.astype(int)))
    # measured: at most 1 level, 4-5 % of levels off (rounding per step: 2 levels, 35 %)
    assert max(d.max() for d in differences) <= 1
    assert np.mean([(d > 0).mean() for d in differences]) < 0.1


def test_a_jitter_step_that_may_clip_is_clipped_before_the_next() -> None:
    """Brightness 1.8 clips the bright levels, and a contrast step after it works on the
    clipped image (its mean luma too): mapping both as one would leave levels over 255."""
    pixels = _picture()
    params = {"order": ["brightness", "contrast"], "brightness": 1.8, "contrast": 0.5}
    brightened = cpu_kernels.color_jitter(pixels, {"order": ["brightness"], "brightness": 1.8})
    step_by_step = cpu_kernels.color_jitter(brightened, {"order": ["contrast"], "contrast": 0.5})
    assert np.array_equal(cpu_kernels.color_jitter(pixels, params), step_by_step)


def test_a_blur_wider_than_the_image_is_refused_as_kornia_refuses_it() -> None:
    with pytest.raises(ValueError, match="23-pixel blur"):
        cpu_kernels.gaussian_blur(_picture(8, 40), {"kernel_size": 23, "sigma": 1.0})


def test_opencv_warps_what_it_warps_as_kornia_does() -> None:
    assert cpu_kernels.can_warp((4000, 3000), (224, 224))
    assert not cpu_kernels.can_warp((40000, 10), (224, 224))
    assert not cpu_kernels.can_warp((1, 1), (16, 16))  # a 1-pixel image: Kornia, as before


def _augment(photos, ops: list[dict], device: str) -> list[np.ndarray]:
    spec = parse_spec(
        {
            "input": {"uri": "in"},
            "output": {"uri": "out", "image_format": "png"},
            "seed": 7,
            "ops": ops,
        }
    )
    sources = [SourceSample(p.key, f"mem://{p.key}", p.jpeg) for p in photos]
    output = Augmenter(spec, device).augment(sources)
    assert output.quarantined == []
    return [np.asarray(Image.open(io.BytesIO(s.image))).astype(int) for s in output.samples]


IMAGENET_OPS = [
    {"name": "random_resized_crop", "size": 96, "scale": [0.08, 1.0]},
    {"name": "horizontal_flip", "p": 0.5},
    {"name": "color_jitter", "brightness": 0.4, "contrast": 0.4, "saturation": 0.4, "hue": 0.1},
    {"name": "grayscale", "p": 0.2},
    {"name": "gaussian_blur", "kernel_size": 23, "sigma": [0.1, 2.0], "p": 0.5},
    {"name": "solarize", "threshold": 0.5, "p": 0.2},
    {"name": "erasing", "scale": [0.02, 0.25], "p": 0.25},
]
POLICY_OPS = [
    {"name": "random_resized_crop", "size": 96},
    {"name": "rand_augment", "num_ops": 2, "magnitude": 9},
    {"name": "auto_augment"},
]


# Through a whole recipe the paths differ by each kernel's rounding (the float path rounds
# once, at the encoder) plus, in the policies, the rare pixel that rounding moves across a
# solarize threshold or a posterize/equalize step: (mean, 99th percentile, max) in levels.
@pytest.mark.parametrize(
    ("ops", "bounds"),
    [(BENCH_OPS, (0.3, 1, 2)), (IMAGENET_OPS, (0.4, 2, 4)), (POLICY_OPS, (0.5, 6, 255))],
    ids=["bench-fused", "imagenet", "policies"],
)
def test_the_opencv_path_agrees_with_the_kornia_path(
    photos, ops: list[dict], bounds: tuple[float, int, int]
) -> None:
    fast = _augment(photos, ops, "cpu")
    assert cv2.getNumThreads() == 1  # set by the Augmenter: one thread, like torch's
    kornia_path = _augment(photos, ops, KORNIA_ON_CPU)
    difference = np.concatenate(
        [np.abs(a - b).ravel() for a, b in zip(fast, kornia_path, strict=True)]
    )
    assert difference.mean() < bounds[0]
    assert np.percentile(difference, 99) <= bounds[1]
    assert difference.max() <= bounds[2]
