"""rayaug.jpeg_window: a window of a JPEG decoded alone has, away from its cut edges, exactly
the pixels of a whole decode (OpenCV's, at every DCT scale), on real photos of every chroma
subsampling; what the library refuses is None, never a wrong picture."""

from __future__ import annotations

import io
import random

import cv2
import numpy as np
import pytest
from PIL import Image

from rayaug import jpeg_window, sampledata

pytestmark = pytest.mark.skipif(
    not jpeg_window.available(),
    reason="no libturbojpeg >= 3 here (the turbojpeg wheel installs one); windows are slices",
)
_REDUCED = {
    1: 0,
    2: cv2.IMREAD_REDUCED_GRAYSCALE_2,
    4: cv2.IMREAD_REDUCED_GRAYSCALE_4,
    8: cv2.IMREAD_REDUCED_GRAYSCALE_8,
}


def _whole(data: bytes, scale: int) -> np.ndarray:
    return cv2.imdecode(np.frombuffer(data, np.uint8), _REDUCED[scale] | cv2.IMREAD_COLOR_RGB)


def _jpegs() -> list[bytes]:
    """Real photos as encoded for users: 4:2:0 (the default), 4:4:4, 4:2:2, grayscale."""
    photos = [p.jpeg for p in sampledata.make_photos(12, seed=5, short_side=(200, 420))]
    recoded = []
    for data, subsampling in zip(photos[:6], ["4:4:4", "4:2:2"] * 3, strict=True):
        image = Image.open(io.BytesIO(data))
        buffer = io.BytesIO()
        image.save(buffer, "JPEG", quality=88, subsampling=subsampling)
        recoded.append(buffer.getvalue())
    gray = Image.open(io.BytesIO(photos[6])).convert("L")
    buffer = io.BytesIO()
    gray.save(buffer, "JPEG", quality=80)
    return photos + recoded + [buffer.getvalue()]


@pytest.mark.parametrize("scale", [1, 2, 4, 8])
def test_a_window_has_a_whole_decodes_pixels_inside_its_margin(scale: int) -> None:
    rng = random.Random(scale)
    margin = jpeg_window.MARGIN
    for data in _jpegs():
        whole = _whole(data, scale)
        height, width = whole.shape[:2]
        for _ in range(6):
            left, top = rng.randrange(width - 1), rng.randrange(height - 1)
            right, bottom = rng.randint(left + 1, width), rng.randint(top + 1, height)
            window = jpeg_window.decode(data, scale, (left, top, right, bottom))
            assert window is not None and window.shape == (bottom - top, right - left, 3)
            # exact where the window was not cut (an image edge), else `margin` inside the cut
            inner = (
                slice(0 if top == 0 else margin, None if bottom == height else -margin),
                slice(0 if left == 0 else margin, None if right == width else -margin),
            )
            expected = whole[top:bottom, left:right]
            np.testing.assert_array_equal(window[inner], expected[inner])


def test_the_whole_image_as_a_window_is_the_whole_decode() -> None:
    for data in _jpegs()[:3]:
        whole = _whole(data, 1)
        height, width = whole.shape[:2]
        np.testing.assert_array_equal(jpeg_window.decode(data, 1, (0, 0, width, height)), whole)


def test_what_is_not_a_jpeg_is_none() -> None:
    png = io.BytesIO()
    Image.new("RGB", (64, 48)).save(png, "PNG")
    for data in (b"", b"\xff\xd8\xff garbage", png.getvalue()):
        assert jpeg_window.decode(data, 1, (0, 0, 16, 16)) is None
