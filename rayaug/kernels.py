"""The photometric kernels: apply recorded parameters to a batch, on any device, with Kornia.

Each kernel takes images (B, 3, H, W) in [0, 1] and one parameter dict per image (as drawn by
`ops`), and returns the new images. A kernel never draws anything: what a sample gets depends
only on its own parameters, so it comes out the same alone or in any batch.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import kornia
import numpy as np
import torch

from rayaug.ops import Params, fused_colour_map, kernels_in, noise_field

Kernel = Callable[[torch.Tensor, list[Params]], torch.Tensor]


def warp(images: torch.Tensor, matrices: np.ndarray, canvas: tuple[int, int]) -> torch.Tensor:
    """Images (B, 3, h, w) through per-image pixel homographies (B, 3, 3) onto a (H, W) canvas
    (pixel centres at integer coordinates, black outside the source)."""
    return kornia.geometry.transform.warp_perspective(
        images,
        torch.tensor(matrices, dtype=torch.float32, device=images.device),
        canvas,
        mode="bilinear",
        padding_mode="zeros",
        align_corners=True,
    )


def _per_sample(params: list[Params], key: str, like: torch.Tensor) -> torch.Tensor:
    return torch.tensor([p[key] for p in params], dtype=like.dtype, device=like.device)


def _noise(params: list[Params], size: tuple[int, int], kind: str, like: torch.Tensor):
    """Each sample's noise field (`ops.noise_field`, drawn on the CPU from its recorded seed:
    every device, and the CPU's uint8 kernels, see the same numbers), channels first."""
    fields = [torch.from_numpy(noise_field(p["noise_seed"], size, kind)) for p in params]
    stacked = torch.stack(fields)
    stacked = stacked.permute(0, 3, 1, 2) if kind == "normal" else stacked[:, None]
    return stacked.to(device=like.device, dtype=like.dtype)


def _jitter_steps() -> dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]:
    enhance = kornia.enhance
    return {
        "brightness": enhance.adjust_brightness_accumulative,
        "contrast": enhance.adjust_contrast_with_mean_subtraction,
        "saturation": enhance.adjust_saturation_with_gray_subtraction,
        "hue": lambda x, f: enhance.adjust_hue(x, f * 2 * math.pi),
    }


def _fused_jitter(images: torch.Tensor, params: list[Params]) -> torch.Tensor:
    """All four steps as one per-sample affine colour map (one batched matmul)."""
    means = images.mean(dim=(2, 3)).double().cpu().numpy()
    matrices, offsets = [], []
    for mean, p in zip(means, params, strict=True):
        matrix, offset = fused_colour_map(mean, p)
        matrices.append(matrix)
        offsets.append(offset)
    matrix = torch.tensor(np.stack(matrices), dtype=images.dtype, device=images.device)
    offset = torch.tensor(np.stack(offsets), dtype=images.dtype, device=images.device)
    flat = images.flatten(2)
    return torch.baddbmm(offset[:, :, None], matrix, flat).clamp_(0, 1).view_as(images)


def color_jitter(images: torch.Tensor, params: list[Params]) -> torch.Tensor:
    """Kornia's torchvision-style steps, each sample in its own order (or the fused map)."""
    if params[0].get("fused"):
        return _fused_jitter(images, params)
    images = images.clone()  # updated in place, one subset per step, below
    steps = _jitter_steps()
    for position in range(4):
        for step, fn in steps.items():
            chosen = [
                i for i, p in enumerate(params) if p["order"][position : position + 1] == [step]
            ]
            if chosen:
                index = torch.tensor(chosen, device=images.device)
                factor = _per_sample([params[i] for i in chosen], step, images)
                images[index] = fn(images[index], factor)
    return images.clamp(0, 1)


def grayscale(images: torch.Tensor, params: list[Params]) -> torch.Tensor:
    return kornia.color.rgb_to_grayscale(images).expand(-1, 3, -1, -1).contiguous()


def gaussian_blur(images: torch.Tensor, params: list[Params]) -> torch.Tensor:
    k = params[0]["kernel_size"]  # one size per call: ops.GaussianBlur.batch_key groups by it
    sigma = _per_sample(params, "sigma", images)[:, None].expand(-1, 2)
    return kornia.filters.gaussian_blur2d(images, (k, k), sigma, border_type="reflect")


def gaussian_noise(images: torch.Tensor, params: list[Params]) -> torch.Tensor:
    noise = _noise(params, tuple(images.shape[2:]), "normal", images)
    mean, std = (_per_sample(params, k, images)[:, None, None, None] for k in ("mean", "std"))
    return (images + noise * std + mean).clamp(0, 1)


def salt_and_pepper(images: torch.Tensor, params: list[Params]) -> torch.Tensor:
    u = _noise(params, tuple(images.shape[2:]), "uniform", images)
    amount = _per_sample(params, "amount", images)[:, None, None, None]
    salt = amount * _per_sample(params, "salt_vs_pepper", images)[:, None, None, None]
    images = torch.where(u < salt, torch.ones_like(images), images)
    return torch.where((u >= salt) & (u < amount), torch.zeros_like(images), images)


def erasing(images: torch.Tensor, params: list[Params]) -> torch.Tensor:
    images = images.clone()
    for image, p in zip(images, params, strict=True):
        x0, y0, w, h = p["box"]
        image[:, y0 : y0 + h, x0 : x0 + w] = p["value"]
    return images


def _levels(images: torch.Tensor) -> torch.Tensor:
    """The 8-bit levels the encoder would write. Ops defined on levels (posterize, solarize,
    equalize: PIL's, which torchvision's policies follow) see these, as the CPU's uint8 kernels
    do; Kornia's own would truncate unrounded values, half a level low on average."""
    return (images * 255).round() / 255


def sharpness(images: torch.Tensor, params: list[Params]) -> torch.Tensor:
    return kornia.enhance.sharpness(images, _per_sample(params, "factor", images))


def posterize(images: torch.Tensor, params: list[Params]) -> torch.Tensor:
    bits = torch.tensor([p["bits"] for p in params], device=images.device)
    return kornia.enhance.posterize(_levels(images), bits)


def solarize(images: torch.Tensor, params: list[Params]) -> torch.Tensor:
    return kornia.enhance.solarize(_levels(images), _per_sample(params, "threshold", images))


def equalize(images: torch.Tensor, params: list[Params]) -> torch.Tensor:
    return kornia.enhance.equalize(_levels(images))


def autocontrast(images: torch.Tensor, params: list[Params]) -> torch.Tensor:
    low = images.amin(dim=(2, 3), keepdim=True)
    high = images.amax(dim=(2, 3), keepdim=True)
    span = torch.where(high > low, high - low, torch.ones_like(high))
    return torch.where(high > low, (images - low) / span, images).clamp(0, 1)


def invert(images: torch.Tensor, params: list[Params]) -> torch.Tensor:
    return 1 - images


KERNELS: dict[str, Kernel] = kernels_in(globals())
