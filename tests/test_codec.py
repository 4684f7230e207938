"""rayaug.codec: every input mode a user meets becomes (H, W, 3) uint8; bad inputs are refused
with a precise reason; reduced decode shrinks; encoding is byte-stable."""

from __future__ import annotations

import io
import resource
import struct
import time
import zlib

import numpy as np
import pytest
import torch
from PIL import Image

from rayaug import codec, sampledata
from rayaug.codec import DecodeError
from rayaug.spec import OutputSpec

MAX_PIXELS = 100_000_000  # the spec's default


@pytest.fixture(autouse=True)
def _pillow_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """open_image raises Pillow's process-wide bomb guard up to max_pixels: undo it per test."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", Image.MAX_IMAGE_PIXELS)


def _save(image: Image.Image, fmt: str, **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


def _decode(data: bytes, reduction: int = 1, max_pixels: int = MAX_PIXELS) -> np.ndarray:
    opened = codec.open_image(data, max_pixels)
    pixels = codec.decode(opened, reduction)
    assert pixels.dtype == np.uint8 and pixels.ndim == 3 and pixels.shape[2] == 3
    assert pixels.shape[:2] == opened.canvas or reduction > 1
    return pixels


def _gradient(height: int, width: int) -> np.ndarray:
    """A smooth RGB picture with some edges: compresses well and survives rescaling."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    r = 255 * x / max(1, width - 1)
    g = 255 * y / max(1, height - 1)
    b = 127.5 + 127.5 * np.sin(x / 37.0) * np.cos(y / 23.0)
    rgb = np.stack([r, g, b], axis=-1)
    rgb[height // 4 : height // 2, width // 4 : width // 2] = (255, 255, 0)
    return rgb.round().astype(np.uint8)


def _png_chunk(kind: bytes, body: bytes) -> bytes:
    crc = zlib.crc32(kind + body) & 0xFFFFFFFF
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)


def _png_header_only(width: int, height: int) -> bytes:
    """A valid PNG signature + IHDR (8-bit RGB) + IEND: a size claim with no pixels at all."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", ihdr) + _png_chunk(b"IEND", b"")


def _jpeg_header_only(width: int, height: int) -> bytes:
    """SOI + SOF0 + SOS of a baseline 3-channel JPEG with no real scan data."""

    def segment(marker: int, body: bytes) -> bytes:
        return b"\xff" + bytes([marker]) + struct.pack(">H", len(body) + 2) + body

    sof = struct.pack(">BHHB", 8, height, width, 3) + b"".join(
        bytes([c, 0x11, 0]) for c in (1, 2, 3)
    )
    sos = bytes([3]) + b"".join(bytes([c, 0]) for c in (1, 2, 3)) + b"\x00\x3f\x00"
    return b"\xff\xd8" + segment(0xC0, sof) + segment(0xDA, sos) + b"\x00" * 16 + b"\xff\xd9"


# ---------------------------------------------------------------- modes


def test_rgb_jpeg_and_png() -> None:
    rgb = _gradient(30, 40)
    assert np.array_equal(_decode(_save(Image.fromarray(rgb), "PNG")), rgb)
    jpeg = _decode(_save(Image.fromarray(rgb), "JPEG", quality=95))
    assert jpeg.shape == (30, 40, 3)
    assert np.abs(jpeg.astype(int) - rgb).mean() < 4


def test_a_truncated_jpeg_is_left_to_pillow_on_every_decoder() -> None:
    """OpenCV (and, likeliest, nvJPEG: an H200 run's decode-failure test failed before it
    was held to this) pad a truncated JPEG with gray and return an image; Pillow reports it.
    Neither fast decoder is given one, so it is quarantined on CPU and GPU alike."""
    photo = next(iter(sampledata.make_photos(1, seed=4, short_side=(120, 160))))
    whole = codec.open_image(photo.jpeg, MAX_PIXELS)
    cut = codec.open_image(photo.jpeg[: len(photo.jpeg) // 2], MAX_PIXELS)
    assert codec._whole_plain_jpeg(whole) and not codec._whole_plain_jpeg(cut)
    assert codec._decode_plain_jpeg(cut, 1) is None
    with pytest.raises(DecodeError):
        codec.decode(cut, 1)


def test_grayscale_l_is_replicated_to_three_channels() -> None:
    gray = (np.arange(30 * 40) % 256).astype(np.uint8).reshape(30, 40)
    pixels = _decode(_save(Image.fromarray(gray, "L"), "PNG"))
    assert pixels.shape == (30, 40, 3)
    for channel in range(3):
        assert np.array_equal(pixels[..., channel], gray)


def test_la_transparent_becomes_black() -> None:
    gray = np.full((10, 12), 200, np.uint8)
    alpha = np.full((10, 12), 255, np.uint8)
    alpha[:, :6] = 0
    image = Image.merge("LA", [Image.fromarray(gray), Image.fromarray(alpha)])
    pixels = _decode(_save(image, "PNG"))
    assert pixels.shape == (10, 12, 3)
    assert (pixels[:, :6] == 0).all()
    assert (pixels[:, 6:] == 200).all()


def test_rgba_transparent_becomes_black_and_opaque_is_kept() -> None:
    rgb = _gradient(20, 30)
    alpha = np.full((20, 30, 1), 255, np.uint8)
    alpha[:, :10] = 0
    alpha[:, 10:20] = 128
    pixels = _decode(_save(Image.fromarray(np.concatenate([rgb, alpha], axis=2), "RGBA"), "PNG"))
    assert pixels.shape == (20, 30, 3)
    assert (pixels[:, :10] == 0).all()
    half = rgb[:, 10:20].astype(int) * 128 / 255
    assert np.abs(pixels[:, 10:20] - half).max() <= 1
    assert np.array_equal(pixels[:, 20:], rgb[:, 20:])


def _palette_image(transparent: int | None) -> bytes:
    indices = np.zeros((8, 10), np.uint8)
    indices[:, 5:] = 1
    image = Image.fromarray(indices, "P")
    image.putpalette([255, 255, 255, 10, 200, 30] + [0, 0, 0] * 254)
    options = {} if transparent is None else {"transparency": transparent}
    return _save(image, "PNG", **options)


def test_palette_without_transparency_keeps_its_colours() -> None:
    data = _palette_image(None)
    assert Image.open(io.BytesIO(data)).mode == "P"
    pixels = _decode(data)
    assert pixels.shape == (8, 10, 3)
    assert (pixels[:, :5] == (255, 255, 255)).all()
    assert (pixels[:, 5:] == (10, 200, 30)).all()


def test_palette_with_transparency_composites_onto_black() -> None:
    data = _palette_image(transparent=0)
    opened = Image.open(io.BytesIO(data))
    assert opened.mode == "P" and "transparency" in opened.info
    pixels = _decode(data)
    assert (pixels[:, :5] == 0).all()  # the transparent (white) index
    assert (pixels[:, 5:] == (10, 200, 30)).all()


def test_cmyk_jpeg_gives_rgb_with_the_right_colours() -> None:
    rgb = np.zeros((16, 24, 3), np.uint8)
    rgb[:, :12] = (220, 20, 20)
    rgb[:, 12:] = (20, 20, 220)
    data = _save(Image.fromarray(rgb).convert("CMYK"), "JPEG", quality=95)
    assert Image.open(io.BytesIO(data)).mode == "CMYK"
    pixels = _decode(data).astype(int)
    assert pixels.shape == (16, 24, 3)
    assert np.abs(pixels[2:-2, 2:10] - (220, 20, 20)).max() < 25
    assert np.abs(pixels[2:-2, 14:-2] - (20, 20, 220)).max() < 25


def test_16_bit_png_scales_to_8_bit() -> None:
    wide = np.array([[0, 65535, 32768], [257, 65280, 1000]], np.uint16)
    data = _save(Image.fromarray(wide), "PNG")
    assert Image.open(io.BytesIO(data)).mode.startswith("I;16")
    pixels = _decode(data)
    expected = np.array([[0, 255, 128], [1, 254, 4]], np.uint8)
    for channel in range(3):
        assert np.array_equal(pixels[..., channel], expected)


def test_one_bit_png_is_black_and_white() -> None:
    bits = np.zeros((9, 11), bool)
    bits[::2] = True
    data = _save(Image.fromarray(bits), "PNG")
    assert Image.open(io.BytesIO(data)).mode == "1"
    pixels = _decode(data)
    assert pixels.shape == (9, 11, 3)
    assert (pixels[::2] == 255).all() and (pixels[1::2] == 0).all()


def test_exif_orientation_6_is_applied_to_canvas_and_pixels() -> None:
    stored = np.zeros((30, 40, 3), np.uint8)  # stored landscape: 40 wide, 30 high
    stored[:10, :10] = (255, 0, 0)  # a red block at the stored top-left
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90° clockwise to display"
    data = _save(Image.fromarray(stored), "JPEG", quality=95, exif=exif)
    opened = codec.open_image(data, MAX_PIXELS)
    assert opened.image.size == (40, 30)  # Pillow: (width, height) as stored
    assert opened.canvas == (40, 30)  # (height, width) as displayed: transposed
    pixels = codec.decode(opened)
    assert pixels.shape == (40, 30, 3)
    # Turned clockwise, the stored top-left lands at the displayed top-right.
    top_right, top_left = pixels[2:8, -8:-2].astype(int), pixels[2:8, 2:8].astype(int)
    assert top_right[..., 0].min() > 200 and top_right[..., 1:].max() < 60
    assert top_left.max() < 40
    # The reduced decode is oriented the same way.
    opened = codec.open_image(data, MAX_PIXELS)
    assert codec.decode(opened, 2).shape == (20, 15, 3)


def test_animated_gif_gives_its_first_frame() -> None:
    frames = [Image.new("RGB", (20, 10), colour) for colour in ((255, 0, 0), (0, 0, 255))]
    buffer = io.BytesIO()
    frames[0].save(buffer, "GIF", save_all=True, append_images=frames[1:], duration=100)
    data = buffer.getvalue()
    assert getattr(Image.open(io.BytesIO(data)), "n_frames", 1) == 2
    pixels = _decode(data)
    assert pixels.shape == (10, 20, 3)
    assert (pixels == (255, 0, 0)).all()


# ---------------------------------------------------------------- refusals


def test_zero_bytes_is_refused() -> None:
    with pytest.raises(DecodeError, match=r"^empty input \(0 bytes\)$"):
        codec.open_image(b"", MAX_PIXELS)


def test_text_named_jpg_is_refused() -> None:
    with pytest.raises(DecodeError, match="^not a readable image"):
        codec.open_image(b"this is a README saved as photo.jpg\n", MAX_PIXELS)


def test_truncated_jpeg_opens_then_fails_to_decode() -> None:
    data = _save(Image.fromarray(_gradient(120, 160)), "JPEG", quality=90)
    opened = codec.open_image(data[: len(data) // 2], MAX_PIXELS)  # the header is intact
    assert opened.canvas == (120, 160)
    with pytest.raises(DecodeError, match="^cannot decode: the file is truncated: its image data"):
        codec.decode(opened)


def test_jpeg_cut_inside_its_header_is_refused_at_open() -> None:
    data = _save(Image.fromarray(_gradient(120, 160)), "JPEG", quality=90)
    with pytest.raises(DecodeError, match="^bad image header"):
        codec.open_image(data[:120], MAX_PIXELS)


def test_png_claiming_100000_squared_pixels_is_refused_fast_without_allocating() -> None:
    data = _png_header_only(100_000, 100_000)
    assert len(data) < 100
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    start = time.perf_counter()
    with pytest.raises(DecodeError, match="max_pixels=100000000") as refused:
        codec.open_image(data, MAX_PIXELS)
    assert time.perf_counter() - start < 0.5
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before < 100 * 1024
    assert "10000000000" in str(refused.value) or "100000x100000" in str(refused.value)


def test_max_pixels_is_checked_on_the_header_before_any_pixel_work() -> None:
    # The file has no pixel data at all: any attempt to read pixels would fail differently.
    with pytest.raises(DecodeError) as refused:
        codec.open_image(_png_header_only(100, 100), max_pixels=9_999)
    assert str(refused.value) == "image of 100x100 pixels exceeds max_pixels=9999"


def test_max_pixels_and_not_pillows_own_guard_is_the_limit() -> None:
    # 95 M pixels: over Pillow's default bomb guard (~89 M), under the spec's default 100 M.
    opened = codec.open_image(_jpeg_header_only(10_000, 9_500), MAX_PIXELS)
    assert opened.canvas == (9_500, 10_000)
    # A user who raises max_pixels gets bigger images; one who lowers it gets the refusal.
    assert codec.open_image(_jpeg_header_only(20_000, 10_000), 10**9).canvas == (10_000, 20_000)
    with pytest.raises(DecodeError, match=r"^image of 10000x9500 pixels exceeds max_pixels"):
        codec.open_image(_jpeg_header_only(10_000, 9_500), 50_000_000)


def test_header_only_png_under_the_limit_is_a_decode_error_not_a_crash() -> None:
    with pytest.raises(DecodeError, match="^cannot decode"):
        _decode(_png_header_only(64, 48))


# ---------------------------------------------------------------- reduced decode


@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
def test_reduced_decode_of_1600x1200_by_4_is_about_400x300(fmt: str) -> None:
    rgb = _gradient(1200, 1600)
    data = _save(Image.fromarray(rgb), fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    opened = codec.open_image(data, MAX_PIXELS)
    assert opened.canvas == (1200, 1600)  # the canvas is the full size, whatever the reduction
    small = codec.decode(opened, 4)
    assert small.dtype == np.uint8
    assert abs(small.shape[0] - 300) <= 1 and abs(small.shape[1] - 400) <= 1
    expected = np.asarray(Image.fromarray(rgb).resize(small.shape[1::-1], Image.Resampling.BOX))
    assert np.abs(small.astype(int) - expected).mean() < 4  # the same picture, not a corner


def _pillow_at_dct_scale(data: bytes, scale: int) -> np.ndarray:
    """Pillow's own decode of a JPEG at 1/scale (DCT scaling, no box filter after it)."""
    image = Image.open(io.BytesIO(data))
    image.draft("RGB", (image.width // scale, image.height // scale))
    return np.asarray(image.convert("RGB"))


@pytest.mark.parametrize("mode", ["RGB", "L"])
@pytest.mark.parametrize("scale", [1, 2, 4, 8])
def test_opencv_decodes_a_plain_jpeg_to_pillows_exact_pixels(photos, mode: str, scale: int) -> None:
    """Upright 8-bit JPEGs take OpenCV's decoder: the pixels (and so every output byte) are
    Pillow's, at every DCT scale."""
    data = _save(Image.open(io.BytesIO(photos[0].jpeg)).convert(mode), "JPEG", quality=87)
    np.testing.assert_array_equal(_decode(data, scale), _pillow_at_dct_scale(data, scale))


def test_a_cut_jpeg_is_refused_or_filled_exactly_as_pillow_does() -> None:
    """The OpenCV path changes no verdict: without its end marker a cut JPEG is Pillow's to
    refuse; with one (neither decoder can tell) both fill the lost rows alike."""
    whole = _save(Image.fromarray(_gradient(64, 96)), "JPEG", quality=90)
    cut = whole[: len(whole) * 2 // 3]
    with pytest.raises(DecodeError, match="the file is truncated"):
        _decode(cut)
    np.testing.assert_array_equal(
        _decode(cut + b"\xff\xd9"), _pillow_at_dct_scale(cut + b"\xff\xd9", 1)
    )


def test_a_reduction_beyond_the_dct_scales_is_box_filtered_as_before() -> None:
    data = _save(Image.fromarray(_gradient(640, 960)), "JPEG", quality=90)
    expected = _pillow_at_dct_scale(data, 8)
    expected = np.asarray(Image.fromarray(expected).reduce(2))
    np.testing.assert_array_equal(_decode(data, 16), expected)


def test_reduction_one_is_full_size() -> None:
    data = _save(Image.fromarray(_gradient(120, 160)), "JPEG")
    assert codec.decode(codec.open_image(data, MAX_PIXELS), 1).shape == (120, 160, 3)


# ---------------------------------------------------------------- the window a warp reads


@pytest.mark.parametrize("reduction", [1, 2, 4])
def test_a_part_is_the_whole_decode_around_the_needed_box(reduction: int) -> None:
    """Only the needed box (plus the decoder's margin) is decoded; there its pixels are the
    whole decode's, and `origin`/`size` place it in that decode."""
    (photo,) = sampledata.make_photos(1, seed=7, short_side=(600, 640))
    opened = codec.open_image(photo.jpeg, MAX_PIXELS)
    whole = codec.decode(opened, reduction)
    height, width = opened.canvas
    needed = (width * 0.4, height * 0.3, width * 0.7, height * 0.6)
    part = codec.decode_part(opened, reduction, needed)
    left, top = part.origin
    assert part.size == whole.shape[:2] and left > 0 and top > 0
    assert part.pixels.shape[0] < whole.shape[0] and part.pixels.shape[1] < whole.shape[1]
    rows, columns = part.pixels.shape[:2]
    margin = codec.jpeg_window.MARGIN
    inside = (slice(margin, -margin), slice(margin, -margin))
    np.testing.assert_array_equal(
        part.pixels[inside], whole[top : top + rows, left : left + columns][inside]
    )
    x0 = (needed[0] + 0.5) * whole.shape[1] / width - 0.5  # in the decode's pixels
    assert left + margin <= x0 < left + margin + 1


def test_a_part_is_the_same_without_the_windowed_decoder(photos, monkeypatch) -> None:
    """Whether libturbojpeg's windowed decode is installed changes the speed, never a pixel:
    without it the same window is cut out of a whole decode."""
    opened = codec.open_image(photos[1].jpeg, MAX_PIXELS)
    height, width = opened.canvas
    needed = (3.2, width * 0.1, width * 0.5, height - 4.5)
    windowed = codec.decode_part(opened, 1, needed)
    monkeypatch.setattr(codec.jpeg_window, "decode", lambda *args: None)
    sliced = codec.decode_part(opened, 1, needed)
    assert (sliced.origin, sliced.size) == (windowed.origin, windowed.size)
    np.testing.assert_array_equal(sliced.pixels, windowed.pixels)


def test_a_part_is_the_whole_image_where_no_window_applies(photos) -> None:
    """No box (no geometric op first), a box that covers everything, or an image the plain
    JPEG path does not take (here EXIF-rotated): the whole decode, at the origin."""
    opened = codec.open_image(photos[2].jpeg, MAX_PIXELS)
    height, width = opened.canvas
    for needed in (None, (-5.0, -5.0, width + 5.0, height + 5.0)):
        part = codec.decode_part(opened, 1, needed)
        assert part.origin == (0, 0) and part.pixels.shape[:2] == part.size == opened.canvas
    image = Image.open(io.BytesIO(photos[2].jpeg))
    exif = image.getexif()
    exif[0x0112] = 6
    rotated = codec.open_image(_save(image, "JPEG", exif=exif.tobytes()), MAX_PIXELS)
    part = codec.decode_part(rotated, 1, (10.0, 10.0, 20.0, 20.0))
    assert part.origin == (0, 0) and part.pixels.shape[:2] == rotated.canvas


def _views_of(opened: codec.Opened, boxes: list[tuple[float, float, float, float]]) -> list:
    height, width = opened.canvas
    return [(1, (x0 * width, y0 * height, x1 * width, y1 * height)) for x0, y0, x1, y1 in boxes]


def test_views_of_one_source_share_a_decode_and_each_gets_its_own_parts_pixels(
    counted_decodes,
) -> None:
    """Overlapping windows at one scale come from one decode of their union; each view gets
    the very window (origin, size, and the pixels a warp reads) that a decode of its own
    gives, so sharing never moves an output byte."""
    (photo,) = sampledata.make_photos(1, seed=8, short_side=(600, 640))
    opened = codec.open_image(photo.jpeg, MAX_PIXELS)
    wanted = _views_of(opened, [(0.1, 0.1, 0.6, 0.5), (0.3, 0.2, 0.8, 0.7), (0.2, 0.4, 0.5, 0.9)])
    alone = [codec.decode_part(opened, *view) for view in wanted]
    counted_decodes.clear()  # what the calls below decode
    shared = codec.decode_parts(opened, wanted)
    assert len(counted_decodes) == 1
    margin = codec.jpeg_window.MARGIN
    inside = (slice(margin, -margin), slice(margin, -margin))
    for own, cut in zip(alone, shared, strict=True):
        assert (cut.origin, cut.size, cut.pixels.shape) == (own.origin, own.size, own.pixels.shape)
        np.testing.assert_array_equal(cut.pixels[inside], own.pixels[inside])


def test_views_at_different_scales_decode_once_per_scale(counted_decodes) -> None:
    (photo,) = sampledata.make_photos(1, seed=9, short_side=(600, 640))
    opened = codec.open_image(photo.jpeg, MAX_PIXELS)
    height, width = opened.canvas
    wanted = [(1, None), (2, None), (1, (5.0, 5.0, width / 2, height / 2)), (2, None)]
    counted_decodes.clear()  # what the calls below decode
    parts = codec.decode_parts(opened, wanted)
    assert len(counted_decodes) == 2
    np.testing.assert_array_equal(parts[0].pixels, codec.decode(opened, 1))
    np.testing.assert_array_equal(parts[1].pixels, codec.decode(opened, 2))
    assert np.shares_memory(parts[3].pixels, parts[1].pixels)


def test_far_apart_small_windows_of_a_large_photo_are_decoded_apart(counted_decodes) -> None:
    """A union mostly of pixels no view reads costs more than the windows alone: each view
    then gets a decode of its own."""
    (photo,) = sampledata.make_photos(1, seed=10, short_side=(1800, 1900))
    opened = codec.open_image(photo.jpeg, MAX_PIXELS)
    wanted = _views_of(opened, [(0.0, 0.0, 0.05, 0.05), (0.9, 0.9, 0.95, 0.95)])
    counted_decodes.clear()  # what the calls below decode
    parts = codec.decode_parts(opened, wanted)
    assert len(counted_decodes) == 2
    for view, part in zip(wanted, parts, strict=True):
        own = codec.decode_part(opened, *view)
        np.testing.assert_array_equal(part.pixels, own.pixels)


def test_a_source_not_plain_jpeg_is_decoded_once_for_all_views_at_one_reduction(
    monkeypatch,
) -> None:
    """PNGs (and EXIF-rotated or CMYK JPEGs) decode whole: views at one reduction share it,
    and a second reduction of the same opened image is decoded afresh, not from a drafted
    image."""
    pixels = _gradient(400, 600)
    opened = codec.open_image(_save(Image.fromarray(pixels), "PNG"), MAX_PIXELS)
    parts = codec.decode_parts(opened, [(1, None), (1, (10.0, 10.0, 50.0, 50.0)), (2, None)])
    assert np.shares_memory(parts[0].pixels, parts[1].pixels)
    np.testing.assert_array_equal(parts[0].pixels, pixels)
    assert parts[2].pixels.shape == (200, 300, 3)
    np.testing.assert_array_equal(parts[2].pixels, _decode(opened.data, 2))


# ---------------------------------------------------------------- encode


@pytest.mark.parametrize("image_format", ["jpeg", "png", "webp"])
def test_identical_pixels_give_identical_bytes(image_format: str) -> None:
    pixels = _gradient(48, 64)
    first = codec.encode(pixels, image_format, 85)
    again = codec.encode(pixels.copy(), image_format, 85)
    flipped = codec.encode(pixels[:, ::-1], image_format, 85)  # a strided view
    assert first == again
    assert flipped == codec.encode(np.ascontiguousarray(pixels[:, ::-1]), image_format, 85)
    decoded = Image.open(io.BytesIO(first))
    assert decoded.format == {"jpeg": "JPEG", "png": "PNG", "webp": "WEBP"}[image_format]
    assert decoded.size == (64, 48) and decoded.mode == "RGB"
    assert OutputSpec(uri="o", image_format=image_format).extension in {"jpg", "png", "webp"}


@pytest.mark.parametrize("encoder", ["turbojpeg wheel", "opencv"])
@pytest.mark.parametrize("quality", [1, 50, 75, 90, 95, 100])
def test_jpeg_bytes_are_pillows_whatever_the_quality_and_encoder(
    photos, quality: int, encoder: str, monkeypatch
) -> None:
    """The turbojpeg wheel (or, without it, OpenCV) encodes JPEGs: the bytes must stay
    Pillow's, so outputs and replays of earlier runs keep their sha256 on any machine."""
    if encoder == "opencv":
        monkeypatch.setattr(codec, "_turbojpeg", lambda: None)
    elif codec._turbojpeg() is None:
        pytest.skip("no turbojpeg wheel on this platform (see pyproject.toml)")
    for photo in photos[:6]:  # odd widths and heights among them
        pixels = np.asarray(Image.open(io.BytesIO(photo.jpeg)).convert("RGB"))
        expected = _save(Image.fromarray(pixels), "JPEG", quality=quality)
        assert codec.encode(pixels, "jpeg", quality) == expected
        inner = pixels[1:, 1:]  # a strided view
        expected = _save(Image.fromarray(np.ascontiguousarray(inner)), "JPEG", quality=quality)
        assert codec.encode(inner, "jpeg", quality) == expected


def test_device_codec_steps_aside_where_nvjpeg_does_not_apply() -> None:
    """On the CPU (or for a PNG, or a rotated JPEG) the Pillow path is taken: None, not a stub."""
    data = _save(Image.fromarray(_gradient(32, 48)), "JPEG")
    opened = codec.open_image(data, 10**8)
    assert codec.decode_on_device(opened, 1, "cpu") is None
    pixels = torch.zeros(3, 8, 8, dtype=torch.uint8)
    assert codec.encode_on_device(pixels, "jpeg", 90) is None


def test_png_round_trip_is_lossless_and_quality_matters_for_jpeg() -> None:
    pixels = _gradient(48, 64)
    assert np.array_equal(_decode(codec.encode(pixels, "png", 90)), pixels)
    assert len(codec.encode(pixels, "jpeg", 30)) < len(codec.encode(pixels, "jpeg", 95))
