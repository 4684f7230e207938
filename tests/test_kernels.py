"""rayaug.kernels: recorded parameters applied to a batch; a sample's result never depends on
its batch-mates."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from test_ops import CONFIGS

from rayaug.kernels import KERNELS, color_jitter
from rayaug.ops import CATALOGUE, ColorJitter, Op


def _op(name: str, **overrides) -> Op:
    return CATALOGUE[name](**(CONFIGS[name] | overrides))


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def _images(batch: int, height: int = 24, width: int = 32) -> torch.Tensor:
    return torch.rand(batch, 3, height, width, generator=torch.Generator().manual_seed(batch))


def test_every_photometric_op_has_a_kernel() -> None:
    assert set(KERNELS) == {n for n, c in CATALOGUE.items() if c.kind == "photometric"}


def test_fused_color_jitter_is_recorded_and_matches_the_exact_path_without_hue() -> None:
    exact_op = ColorJitter(brightness=0.2, contrast=0.2, saturation=0.2)
    fused_op = exact_op.model_copy(update={"fused": True})
    params = [exact_op.draw(_rng(seed), (24, 32)) for seed in range(6)]
    fused = [fused_op.draw(_rng(seed), (24, 32)) for seed in range(6)]
    assert fused == [p | {"fused": True} for p in params]  # replay takes the same path
    assert all("fused" not in p for p in params)
    images = _images(6) * 0.4 + 0.3  # mid-tones: small factors never clip
    exact_result = color_jitter(images, params)
    fused_result = color_jitter(images, fused)
    assert (exact_result - fused_result).abs().max() < 1e-5
    gray = torch.full((1, 3, 4, 4), 0.5)  # a hue rotation leaves gray alone
    rotated = color_jitter(gray, [{"order": ["hue"], "hue": 0.3, "fused": True}])
    assert torch.allclose(rotated, gray, atol=1e-6)


def test_color_jitter_order_changes_the_result() -> None:
    image = torch.rand(1, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    factors = {"brightness": 1.3, "hue": 0.2}
    one = color_jitter(image, [{"order": ["brightness", "hue"], **factors}])
    other = color_jitter(image, [{"order": ["hue", "brightness"], **factors}])
    assert not torch.equal(one, other)
    nothing = color_jitter(image, [{"order": []}])
    assert torch.equal(nothing, image)


PHOTOMETRIC = sorted(n for n, c in CATALOGUE.items() if c.kind == "photometric")


@pytest.mark.parametrize(
    ("name", "overrides"),
    [(name, {}) for name in PHOTOMETRIC] + [("color_jitter", {"fused": True})],
    ids=[*PHOTOMETRIC, "color_jitter-fused"],
)
def test_a_photometric_op_gives_each_sample_the_same_result_alone_or_in_a_batch(
    name: str, overrides: dict
) -> None:
    op = _op(name, **overrides)
    images = _images(9)
    params = [op.draw(_rng(seed), (24, 32)) for seed in range(9)]
    assert all(json.loads(json.dumps(p)) == p for p in params)
    # samples that cannot share a call (e.g. blur kernel size) are never batched together
    assert len({op.batch_key(p) for p in params}) == 1
    batched = KERNELS[name](images.clone(), params)
    assert batched.shape == images.shape and batched.dtype == images.dtype
    assert float(batched.min()) >= 0 and float(batched.max()) <= 1
    for i in range(9):
        alone = KERNELS[name](images[i : i + 1].clone(), params[i : i + 1])
        assert torch.equal(alone[0], batched[i]), (name, i)
    assert torch.equal(images, _images(9))  # inputs are not modified


@pytest.mark.parametrize("name", ["gaussian_noise", "salt_and_pepper"])
def test_noise_comes_from_the_recorded_seed(name: str) -> None:
    op = _op(name)
    image = _images(1)
    params = op.draw(_rng(1), (24, 32))
    first = KERNELS[name](image, [params])
    assert torch.equal(first, KERNELS[name](image, [params]))
    reseeded = params | {"noise_seed": params["noise_seed"] + 1}
    assert not torch.equal(first, KERNELS[name](image, [reseeded]))
    assert not torch.equal(first, image)


def test_erasing_fills_exactly_its_box() -> None:
    name = "erasing"
    op = _op(name, value=0.25)
    image = _images(1) * 0.5 + 0.5  # no pixel is 0.25 to start with
    params = op.draw(_rng(2), (24, 32))
    x0, y0, w, h = params["box"]
    out = KERNELS[name](image, [params])[0]
    inside = torch.zeros(24, 32, dtype=torch.bool)
    inside[y0 : y0 + h, x0 : x0 + w] = True
    assert (out[:, inside] == 0.25).all()
    assert torch.equal(out[:, ~inside], image[0][:, ~inside])
