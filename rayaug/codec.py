"""Image decode and encode: Pillow (any mode in, 8-bit RGB out, reduced-scale JPEG decode),
OpenCV for the common case of a whole, upright 8-bit JPEG, libjpeg-turbo through the
`turbojpeg` wheel for JPEG windows and JPEG encodes, and nvJPEG through torchvision on a CUDA
device when torchvision imports beside torch."""

from __future__ import annotations

import functools
import io
import math
import warnings
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

import cv2
import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from rayaug import jpeg_window

if TYPE_CHECKING:  # torch loads only on a CUDA device's path (see augment)
    import torch

Box = tuple[float, float, float, float]  # (x0, y0, x1, y1)
Wanted = tuple[int, Box | None]  # one view's (reduction, needed box): what `decode_part` takes
# EXIF orientations 5-8 swap width and height.
_TRANSPOSED = {5, 6, 7, 8}
# OpenCV's read flags for RGB at each JPEG DCT scale; the orientation is Pillow's to apply.
_CV2_SCALED_RGB = {
    scale: flag | cv2.IMREAD_COLOR_RGB | cv2.IMREAD_IGNORE_ORIENTATION
    for scale, flag in {
        1: 0,
        2: cv2.IMREAD_REDUCED_GRAYSCALE_2,
        4: cv2.IMREAD_REDUCED_GRAYSCALE_4,
        8: cv2.IMREAD_REDUCED_GRAYSCALE_8,
    }.items()
}
_JPEG_END = b"\xff\xd9"
_ENCODE_OPTIONS = {
    "jpeg": lambda quality: {"format": "JPEG", "quality": quality},
    "png": lambda quality: {"format": "PNG", "compress_level": 3},
    "webp": lambda quality: {"format": "WEBP", "quality": quality, "method": 4},
}


class DecodeError(Exception):
    """An input that cannot become an image; its message is the quarantine reason."""


@dataclass
class Opened:
    """A lazily opened image: its header is read, its pixels not yet."""

    image: Image.Image
    data: bytes
    canvas: tuple[int, int]  # (height, width) after EXIF orientation
    orientation: int = 1  # the EXIF orientation tag


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
    except UnidentifiedImageError:  # its message holds a memory address: not reproducible
        raise DecodeError(
            f"not a readable image: no known image format in its {len(data)} bytes"
        ) from None
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
        raise _cannot_decode(error) from None
    canvas = (width, height) if orientation in _TRANSPOSED else (height, width)
    return Opened(image, data, canvas, orientation)


def decode(opened: Opened, reduction: int = 1) -> np.ndarray:
    """Pixels as (H, W, 3) uint8 RGB, EXIF-oriented, shrunk by about `reduction` when > 1.

    JPEGs shrink inside the decoder (DCT scaling, nearly free); the rest of the factor is a
    box filter, which also keeps the later warp from aliasing.
    """
    pixels = _decode_plain_jpeg(opened, reduction)
    if pixels is not None:
        return pixels
    image = _fresh(opened)
    try:
        if reduction > 1:
            width, height = image.size
            image.draft("RGB", (max(1, width // reduction), max(1, height // reduction)))
            remaining = _box_factor(image.size[0], width, reduction)
            if remaining >= 2:
                image = image.reduce(remaining)
        ImageOps.exif_transpose(image, in_place=True)  # not a copy of every upright image
        return np.array(_to_rgb(image))  # writable: torch can share it without a copy
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as error:
        raise _cannot_decode(error) from None


# Pillow's words for the failures a user meets most, and what they mean in plain words.
_PLAIN_REASONS = (
    (
        "image file is truncated",
        "the file is truncated: its image data ends early (an incomplete copy or download)",
    ),
    ("broken data stream", "the image data is corrupt (damaged bytes inside the file)"),
)


def _cannot_decode(error: BaseException) -> DecodeError:
    """The quarantine reason of a failed decode: plain words where Pillow's are cryptic
    ("image file is truncated (48 bytes not processed)"), else Pillow's own."""
    text = str(error)
    plain = next((words for marker, words in _PLAIN_REASONS if marker in text), text)
    return DecodeError(f"cannot decode: {plain}")


def _fresh(opened: Opened) -> Image.Image:
    """The image as opened, unloaded: `draft` and the EXIF transpose change a Pillow image in
    place, and one source may be decoded at several scales (its views', its partners')."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # checked at open
        return Image.open(io.BytesIO(opened.data))


@dataclass(frozen=True)
class Part:
    """Decoded pixels that may be a window of the whole decode."""

    pixels: np.ndarray
    size: tuple[int, int]  # (height, width) of the whole decode at this scale
    origin: tuple[int, int] = (0, 0)  # (x, y) of pixels[0, 0] in it


def decode_part(opened: Opened, reduction: int, needed: Box | None) -> Part:
    """`decode`, but of a plain JPEG only the window around `needed` — (x0, y0, x1, y1) in
    canvas pixels, the least box a warp reads — that a whole decode would give there.

    The window is a pure function of the image's header and `needed`, never of whether
    libjpeg-turbo's windowed decode is installed: without it, the same window is a slice of a
    whole decode, so the pixels (and every output byte) are the same either way."""
    window = _plain_jpeg_window(opened, reduction, needed)
    if window is None:
        pixels = decode(opened, reduction)
        return Part(pixels, pixels.shape[:2])
    return _decode_window(opened, reduction, *window)


def _decode_window(
    opened: Opened, reduction: int, scale: int, size: tuple[int, int], window: Box
) -> Part:
    """The pixels of `window` (in the decode at 1/`scale`, of `size`) as a whole decode gives
    them there: libjpeg-turbo's windowed decode, or a slice of a whole decode without it."""
    left, top, right, bottom = window
    pixels = jpeg_window.decode(opened.data, scale, window)
    if pixels is None:
        pixels = decode(opened, reduction)[top:bottom, left:right]
    return Part(pixels, size, (left, top))


# What a decode costs, counted in source pixels whose Huffman codes are read: libjpeg-turbo reads
# every row down to a window's bottom across the whole width, at any DCT scale, while only the
# window's own pixels (at that scale) go through the IDCT, upsampling and colour conversion, at
# about the same cost each; every call adds a fixed cost (header, tables, buffers). Measured on
# 500x400 and 4032x3024 photos, windows of 5-100 % of the area, scales 1/1 to 1/8.
_WINDOW_PIXEL_COST = 1.0
_CALL_COST = 15_000


def decode_parts(opened: Opened, wanted: Sequence[Wanted]) -> list[Part]:
    """`decode_part` for each view of one source, sharing the decodes: views at one scale are
    cut from one decode of their windows' union where that costs less than a decode of each
    (see `_CALL_COST`). Each view gets exactly the pixels `decode_part` gives it (its own window,
    cut from the shared decode), so no output byte depends on whether a decode was shared."""
    groups: dict[tuple, list[int]] = defaultdict(list)
    for index, (reduction, _) in enumerate(wanted):
        scale = _plain_jpeg_scale(opened, reduction)
        groups[("pillow", reduction) if scale is None else ("jpeg", scale)].append(index)
    parts: dict[int, Part] = {}
    for (kind, _), members in groups.items():
        if kind == "pillow":  # a whole decode for every view at this reduction: decode it once
            pixels = decode(opened, wanted[members[0]][0])
            parts |= {index: Part(pixels, pixels.shape[:2]) for index in members}
        else:
            parts |= _shared_jpeg_parts(opened, {index: wanted[index] for index in members})
    return [parts[index] for index in range(len(wanted))]


def _shared_jpeg_parts(opened: Opened, wanted: dict[int, Wanted]) -> dict[int, Part]:
    """Views of a plain JPEG at one DCT scale: one decode of their windows' union, or one
    decode each, whichever costs less."""
    reduction = next(iter(wanted.values()))[0]
    scale = _plain_jpeg_scale(opened, reduction)
    size = _scaled_size(opened.canvas, scale)
    whole = (0, 0, size[1], size[0])
    boxes = {}
    for index, (view_reduction, needed) in wanted.items():
        window = _plain_jpeg_window(opened, view_reduction, needed)
        boxes[index] = whole if window is None else window[2]
    union = tuple(f(box[i] for box in boxes.values()) for i, f in enumerate((min, min, max, max)))
    separate = sum(_decode_cost(opened.canvas, size, box) for box in boxes.values())
    if _decode_cost(opened.canvas, size, union) >= separate:
        return {index: decode_part(opened, *view) for index, view in wanted.items()}
    if union == whole:
        pixels = decode(opened, reduction)
        shared = Part(pixels, size)
    else:
        shared = _decode_window(opened, reduction, scale, size, union)
    left, top = shared.origin
    return {
        index: Part(shared.pixels[y0 - top : y1 - top, x0 - left : x1 - left], size, (x0, y0))
        for index, (x0, y0, x1, y1) in boxes.items()
    }


def _decode_cost(canvas: tuple[int, int], size: tuple[int, int], box: Box) -> float:
    """A decode's cost of the window `box` (in the pixels of the decode of `size`), counted as
    in `_WINDOW_PIXEL_COST`."""
    left, top, right, bottom = box
    rows_read = math.ceil(bottom * canvas[0] / size[0])
    window = (right - left) * (bottom - top)
    return _CALL_COST + rows_read * canvas[1] + _WINDOW_PIXEL_COST * window


def _plain_jpeg_window(
    opened: Opened, reduction: int, needed: Box | None
) -> tuple[int, tuple[int, int], Box] | None:
    """(DCT scale, whole decode's size, window in its pixels), or None where the whole image
    is decoded: not OpenCV's plain JPEG, or nothing to leave out."""
    scale = _plain_jpeg_scale(opened, reduction)
    if needed is None or scale is None:
        return None
    height, width = opened.canvas
    size = _scaled_size(opened.canvas, scale)
    x0, y0, x1, y1 = needed
    # Canvas positions → the scaled decode's; then both bilinear taps, and the decoder's margin.
    sx, sy = size[1] / width, size[0] / height
    left = max(0, math.floor((x0 + 0.5) * sx - 0.5) - jpeg_window.MARGIN)
    top = max(0, math.floor((y0 + 0.5) * sy - 0.5) - jpeg_window.MARGIN)
    right = min(size[1], math.ceil((x1 + 0.5) * sx - 0.5) + 1 + jpeg_window.MARGIN)
    bottom = min(size[0], math.ceil((y1 + 0.5) * sy - 0.5) + 1 + jpeg_window.MARGIN)
    if right <= left or bottom <= top or (right - left, bottom - top) == (size[1], size[0]):
        return None
    return scale, size, (left, top, right, bottom)


def _scaled_size(canvas: tuple[int, int], scale: int) -> tuple[int, int]:
    """(height, width) of a decode at 1/`scale`: libjpeg rounds a scaled size up."""
    return -(-canvas[0] // scale), -(-canvas[1] // scale)


def _whole_plain_jpeg(opened: Opened) -> bool:
    """A whole, upright, 8-bit RGB or gray JPEG: what OpenCV and nvJPEG decode as Pillow does.
    A truncated file is not: Pillow reports it, where OpenCV and nvJPEG pad it with gray."""
    image = opened.image
    return (
        image.format == "JPEG"
        and image.mode in ("RGB", "L")
        and opened.orientation == 1
        and opened.data.endswith(_JPEG_END)
    )


def _plain_jpeg_scale(opened: Opened, reduction: int) -> int | None:
    """The DCT scale OpenCV decodes a whole, upright, 8-bit JPEG at; None where Pillow
    decodes (a truncated or CMYK file, a box filter to follow): Pillow words its errors."""
    image = opened.image
    if not _whole_plain_jpeg(opened):
        return None
    scale = _dct_scale(image.size, reduction)
    drafted_width = -(-image.size[0] // scale)  # libjpeg rounds a scaled size up
    if reduction > 1 and _box_factor(drafted_width, image.size[0], reduction) >= 2:
        return None
    return scale


def _decode_plain_jpeg(opened: Opened, reduction: int) -> np.ndarray | None:
    """OpenCV's decode of a whole, upright, 8-bit JPEG: the same libjpeg-turbo pixels as
    Pillow's at the same DCT scale, a third faster, straight into an array (Pillow's needs a
    copy out). None where it does not apply (see `_plain_jpeg_scale`)."""
    scale = _plain_jpeg_scale(opened, reduction)
    if scale is None:
        return None
    pixels = cv2.imdecode(np.frombuffer(opened.data, np.uint8), _CV2_SCALED_RGB[scale])
    return pixels if pixels is not None and pixels.ndim == 3 else None


def _box_factor(drafted_width: int, width: int, reduction: int) -> int:
    """The box filter left to apply after the decoder's DCT scaling to shrink by `reduction`."""
    return min(drafted_width // max(1, width // reduction), reduction)


def _dct_scale(size: tuple[int, int], reduction: int) -> int:
    """The DCT scale (1, 2, 4 or 8) Pillow's JPEG `draft` picks to shrink by `reduction`."""
    if reduction <= 1:
        return 1
    width, height = size
    fits = min(width // max(1, width // reduction), height // max(1, height // reduction))
    return next(scale for scale in (8, 4, 2, 1) if fits >= scale)


def _to_rgb(image: Image.Image) -> Image.Image:
    """Every mode becomes 8-bit RGB; transparency is composited onto black."""
    if image.mode == "RGB":  # as most JPEGs decode: convert() would only copy it
        return image
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
    """(H, W, 3) uint8 → encoded bytes; the same pixels always give the same bytes.

    JPEGs are byte for byte Pillow's (the same libjpeg-turbo and settings, 4:2:0) with no copy
    into a Pillow image: from the RGB pixels themselves through the `turbojpeg` wheel where it
    is installed (see pyproject.toml), else through OpenCV, which takes BGR (a fifth faster
    than Pillow even with the channel swap; the wheel saves the swap, 8 % of the encode)."""
    if image_format == "jpeg":
        pixels = np.ascontiguousarray(pixels)
        turbojpeg = _turbojpeg()
        if turbojpeg is not None:
            return turbojpeg.compress(
                pixels, quality, turbojpeg.SAMP.Y420, pixelformat=turbojpeg.PF.RGB
            )
        bgr = cv2.cvtColor(pixels, cv2.COLOR_RGB2BGR)
        ok, encoded = cv2.imencode(".jpg", bgr, [cv2.IMWRITE_JPEG_QUALITY, quality])
        if ok:
            return encoded.tobytes()
    buffer = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buffer, **_ENCODE_OPTIONS[image_format](quality))
    return buffer.getvalue()


@functools.cache
def _turbojpeg() -> ModuleType | None:
    """The `turbojpeg` wheel's module, where it has a wheel (see pyproject.toml)."""
    try:
        import turbojpeg
    except ImportError:
        return None
    return turbojpeg


# ---------------------------------------------------------------- nvJPEG on a CUDA device


@functools.cache
def _torchvision_io() -> ModuleType | None:
    """torchvision.io when it imports beside this torch (PyPI's may not: it stays optional)."""
    try:
        from torchvision import io as tvio
    except Exception:  # noqa: BLE001 - missing, or built for another torch: use Pillow
        return None
    return tvio


def decode_on_device(opened: Opened, reduction: int, device: str) -> torch.Tensor | None:
    """(3, H, W) float in [0, 1] on a CUDA device, decoded by nvJPEG and box-filtered by
    `reduction` like the Pillow path; None when nvJPEG does not apply (not a whole plain JPEG:
    EXIF-rotated or truncated, say; no torchvision): the caller decodes with Pillow then."""
    if not device.startswith("cuda"):
        return None
    tvio = _torchvision_io()
    if tvio is None or not _whole_plain_jpeg(opened):
        return None
    import torch
    import torch.nn.functional as F

    try:
        raw = torch.frombuffer(bytearray(opened.data), dtype=torch.uint8)
        image = tvio.decode_jpeg(raw, mode=tvio.ImageReadMode.RGB, device=device)
    except RuntimeError:
        return None
    image = image.to(torch.float32) / 255
    if reduction > 1:
        image = F.avg_pool2d(image[None], reduction, ceil_mode=True)[0]
    return image


def encode_on_device(pixels: torch.Tensor, image_format: str, quality: int) -> bytes | None:
    """JPEG-encode (3, H, W) uint8 on a CUDA device with nvJPEG; None when that does not apply."""
    tvio = _torchvision_io()
    if pixels.device.type != "cuda" or tvio is None or image_format != "jpeg":
        return None
    try:
        return tvio.encode_jpeg(pixels, quality=quality).cpu().numpy().tobytes()
    except RuntimeError:
        return None
