"""Image decode and encode with Pillow: any mode in, 8-bit RGB out; reduced-scale JPEG decode."""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

# EXIF orientations 5-8 swap width and height.
_TRANSPOSED = {5, 6, 7, 8}
_ENCODE_OPTIONS = {
    "jpeg": lambda quality: {"format": "JPEG", "quality": quality},
    "png": lambda quality: {"format": "PNG", "compress_level": 3},
    "webp": lambda quality: {"format": "WEBP", "quality": quality, "method": 4},
}
EXTENSIONS = {"jpeg": "jpg", "png": "png", "webp": "webp"}


class DecodeError(Exception):
    """An input that cannot become an image; its message is the quarantine reason."""


@dataclass
class Opened:
    """A lazily opened image: its header is read, its pixels not yet."""

    image: Image.Image
    canvas: tuple[int, int]  # (height, width) after EXIF orientation


def open_image(data: bytes, max_pixels: int) -> Opened:
    """Read the header only; refuse empty, unknown and oversized inputs before any pixel work."""
    if not data:
        raise DecodeError("empty input (0 bytes)")
    # max_pixels is the one limit: Pillow's own bomb guard (~89M pixels) must not undercut it.
    if Image.MAX_IMAGE_PIXELS is not None and max_pixels > Image.MAX_IMAGE_PIXELS:
        Image.MAX_IMAGE_PIXELS = max_pixels
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # checked below
            image = Image.open(io.BytesIO(data))
    except UnidentifiedImageError as error:
        raise DecodeError(f"not a readable image: {error}") from None
    except Image.DecompressionBombError as error:  # over twice Pillow's limit ≥ max_pixels
        raise DecodeError(f"image exceeds max_pixels={max_pixels}: {error}") from None
    except (OSError, ValueError) as error:
        raise DecodeError(f"bad image header: {error}") from None
    width, height = image.size
    if width < 1 or height < 1:
        raise DecodeError(f"image has no pixels ({width}x{height})")
    if width * height > max_pixels:
        raise DecodeError(f"image of {width}x{height} pixels exceeds max_pixels={max_pixels}")
    try:  # PNG keeps EXIF after the pixels: Pillow loads them to find it
        orientation = image.getexif().get(0x0112, 1)
    except (OSError, ValueError, SyntaxError) as error:
        raise DecodeError(f"cannot decode: {error}") from None
    return Opened(image, (width, height) if orientation in _TRANSPOSED else (height, width))


def decode(opened: Opened, reduction: int = 1) -> np.ndarray:
    """Pixels as (H, W, 3) uint8 RGB, EXIF-oriented, shrunk by about `reduction` when > 1.

    JPEGs shrink inside the decoder (DCT scaling, nearly free); the rest of the factor is a
    box filter, which also keeps the later warp from aliasing.
    """
    image = opened.image
    try:
        if reduction > 1:
            width, height = image.size
            image.draft("RGB", (max(1, width // reduction), max(1, height // reduction)))
            remaining = min(image.size[0] // max(1, width // reduction), reduction)
            if remaining >= 2:
                image = image.reduce(remaining)
        image = ImageOps.exif_transpose(image)
        return np.array(_to_rgb(image))  # writable: torch can share it without a copy
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as error:
        raise DecodeError(f"cannot decode: {error}") from None


def _to_rgb(image: Image.Image) -> Image.Image:
    """Every mode becomes 8-bit RGB; transparency is composited onto black."""
    if image.mode in ("I;16", "I;16B", "I;16L", "I", "F"):
        wide = np.asarray(image, dtype=np.float64)
        scale = 255.0 / 65535.0 if image.mode != "F" else 255.0
        return Image.fromarray(np.clip(wide * scale + 0.5, 0, 255).astype(np.uint8)).convert("RGB")
    if image.mode == "P":
        image = image.convert("RGBA")
    if image.mode in ("RGBA", "LA", "PA", "RGBa", "La"):
        rgba = image.convert("RGBA")
        black = Image.new("RGBA", rgba.size, (0, 0, 0, 255))
        return Image.alpha_composite(black, rgba).convert("RGB")
    return image.convert("RGB")


def encode(pixels: np.ndarray, image_format: str, quality: int) -> bytes:
    """(H, W, 3) uint8 → encoded bytes; the same pixels always give the same bytes."""
    buffer = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buffer, **_ENCODE_OPTIONS[image_format](quality))
    return buffer.getvalue()
