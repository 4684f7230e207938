"""A corpus of hostile and broken inputs, generated in memory (not a test module).

Every entry is bytes plus what rayaug must make of it: either a sample of a known size (and,
where it matters, a known colour in a known place) or a quarantine row with a known stage and
message. The tests write these into an image folder, a WebDataset tar and Parquet files.
"""

from __future__ import annotations

import io
import struct
import tarfile
import zlib
from dataclasses import dataclass, field

import numpy as np
from PIL import Image

RED, GREEN, BLUE, WHITE = (255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 255)


@dataclass(frozen=True)
class Expect:
    """What one input must become.

    Processed: `size` is the source's (height, width) as displayed (after EXIF orientation);
    `colours` the mean RGB of the output, per region ("all", or a corner: "top-left", ...).
    Quarantined: the `stage` and words that must appear in the message.
    """

    size: tuple[int, int] | None = None
    colours: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    stage: str | None = None
    words: tuple[str, ...] = ()

    @property
    def quarantined(self) -> bool:
        return self.stage is not None


def _save(image: Image.Image, fmt: str, **options: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


def _png_chunk(kind: bytes, body: bytes) -> bytes:
    crc = zlib.crc32(kind + body) & 0xFFFFFFFF
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)


def png_by_hand(width: int, height: int, bit_depth: int, colour_type: int, raw: bytes) -> bytes:
    """A PNG written chunk by chunk (valid signature, CRCs), for what Pillow cannot save."""
    ihdr = struct.pack(">IIBBBBB", width, height, bit_depth, colour_type, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", ihdr)
        + _png_chunk(b"IDAT", zlib.compress(raw))
        + _png_chunk(b"IEND", b"")
    )


def bomb_png(side: int = 100_000) -> bytes:
    """A decompression bomb: a valid PNG header that claims side x side RGB pixels.

    The one IDAT holds a few rows of a real deflate stream (what a bomb looks like until it is
    inflated); a decoder that trusted the header would try to allocate 30 GB for side=100,000.
    """
    rows = b"".join(b"\x00" + bytes(3 * side) for _ in range(4))
    return png_by_hand(side, side, 8, 2, rows)


def solid(colour: tuple[int, int, int], size: tuple[int, int] = (32, 48)) -> Image.Image:
    """An RGB image of (height, width) `size` in one colour."""
    return Image.new("RGB", (size[1], size[0]), colour)


def jpeg(image: Image.Image, **options: object) -> bytes:
    return _save(image, "JPEG", quality=95, **options)


def noise_jpeg(seed: int = 0) -> bytes:
    """64x64 random pixels: a JPEG whose entropy-coded data is most of the file."""
    rng = np.random.default_rng(seed)
    return jpeg(Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)))


def truncated_jpeg() -> bytes:
    """A real JPEG cut in its entropy-coded data: the header is fine, the pixels are not."""
    data = noise_jpeg()
    return data[: len(data) // 2]


def cmyk_jpeg() -> bytes:
    """A CMYK (Adobe) JPEG of pure cyan: (255, 0, 0, 0) in CMYK."""
    return jpeg(Image.new("CMYK", (48, 32), (255, 0, 0, 0)))


def gray16_png() -> bytes:
    """A 16-bit greyscale PNG at 0x8000 (mid grey once scaled to 8 bits)."""
    return _save(Image.fromarray(np.full((32, 48), 0x8000, dtype=np.uint16)), "PNG")


def rgb16_png() -> bytes:
    """A 48-bit RGB PNG (16 bits per channel) of red, which Pillow can read but not write."""
    row = b"\x00" + b"\xff\xff\x00\x00\x00\x00" * 48
    return png_by_hand(48, 32, 16, 2, row * 32)


def palette_png() -> bytes:
    image = Image.new("P", (48, 32), 0)
    image.putpalette([*GREEN, *RED] + [0] * (254 * 3))
    return _save(image, "PNG")


def rgba_png() -> bytes:
    """Opaque blue on the left half, fully transparent red on the right (composited on black)."""
    pixels = np.zeros((32, 48, 4), dtype=np.uint8)
    pixels[:, :24] = (0, 0, 255, 255)
    pixels[:, 24:] = (255, 0, 0, 0)
    return _save(Image.fromarray(pixels, "RGBA"), "PNG")


def animated_gif() -> bytes:
    """Three frames (red, green, blue): the first frame is the image."""
    frames = [solid(c) for c in (RED, GREEN, BLUE)]
    return _save(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=50, loop=0)


def one_pixel_png() -> bytes:
    return _save(solid(GREEN, (1, 1)), "PNG")


def exif_rotated_jpeg() -> bytes:
    """Stored 48 wide x 32 high, white with a red marker top-left; EXIF orientation 6.

    Orientation 6 means "rotate 90° clockwise to display": shown 32 wide x 48 high with the
    marker in the top-right corner. A decoder that ignores EXIF puts it top-left, landscape.
    """
    stored = solid(WHITE)
    stored.paste(RED, (0, 0, 16, 12))
    exif = Image.Exif()
    exif[0x0112] = 6
    return jpeg(stored, exif=exif.tobytes())


def good_jpeg(colour: tuple[int, int, int] = BLUE) -> bytes:
    return jpeg(solid(colour))


def image_corpus() -> dict[str, tuple[bytes, Expect]]:
    """File name → (bytes, expectation). The extension decides nothing: the content does."""
    size = (32, 48)
    return {
        "good.jpg": (good_jpeg(), Expect(size, {"all": BLUE})),
        "zero.jpg": (b"", Expect(stage="decode", words=("empty input (0 bytes)",))),
        "truncated.jpg": (
            truncated_jpeg(),
            Expect(stage="decode", words=("cannot decode: the file is truncated",)),
        ),
        "text.jpg": (
            b"this is not a picture, only text pretending to be one\n" * 4,
            Expect(stage="decode", words=("not a readable image: no known image format",)),
        ),
        "bomb.png": (
            bomb_png(),
            Expect(stage="decode", words=("exceeds max_pixels=100000000", "10000000000 pixels")),
        ),
        "bomb-12k.png": (  # under Pillow's own guard, over max_pixels: rayaug's check
            bomb_png(12_000),
            Expect(
                stage="decode",
                words=("image of 12000x12000 pixels exceeds max_pixels=100000000",),
            ),
        ),
        "cmyk.jpg": (cmyk_jpeg(), Expect(size, {"all": (0, 255, 255)})),
        "gray16.png": (gray16_png(), Expect(size, {"all": (128, 128, 128)})),
        "rgb16.png": (rgb16_png(), Expect(size, {"all": RED})),
        "palette.png": (palette_png(), Expect(size, {"all": GREEN})),
        "rgba.png": (
            rgba_png(),
            Expect(size, {"top-left": BLUE, "bottom-left": BLUE, "top-right": (0, 0, 0)}),
        ),
        "animated.gif": (animated_gif(), Expect(size, {"all": RED})),  # the first frame
        "one.png": (one_pixel_png(), Expect((1, 1), {"all": GREEN})),
        "exif6.jpg": (  # displayed portrait, the marker top-right
            exif_rotated_jpeg(),
            Expect(
                (48, 32),
                {"top-right": RED, "top-left": WHITE, "bottom-left": WHITE, "bottom-right": WHITE},
            ),
        ),
    }


def add_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o644, 0
    tar.addfile(info, io.BytesIO(data))


def add_symlink(tar: tarfile.TarFile, name: str, target: str) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode, info.mtime = tarfile.SYMTYPE, target, 0o777, 0
    tar.addfile(info)
