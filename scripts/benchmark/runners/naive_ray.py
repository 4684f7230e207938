"""Child side of naive-ray: what a team writes by hand for the four ops (recipes a, b) with
Ray actors and Pillow, one image at a time, each source opened once and saved as a file per
view."""

from __future__ import annotations

import math
import os
import random
from pathlib import Path
from typing import Any

from ..photos import list_images
from ..recipes import (
    BRIGHTNESS,
    CONTRAST,
    CROP_RATIO,
    CROP_SCALE,
    DEGREES,
    HUE,
    P_FLIP,
    P_JITTER,
    P_ROTATE,
    SATURATION,
    Recipe,
)
from .pool import chunks

RAY_CHUNK = 32  # source images per actor call


def pil_random_resized_crop(image: Any, rng: random.Random, size: int) -> Any:
    from PIL import Image

    width, height = image.size
    box = (0, 0, width, height)
    for _ in range(10):
        area = width * height * rng.uniform(*CROP_SCALE)
        aspect = math.exp(rng.uniform(math.log(CROP_RATIO[0]), math.log(CROP_RATIO[1])))
        w, h = round(math.sqrt(area * aspect)), round(math.sqrt(area / aspect))
        if 0 < w <= width and 0 < h <= height:
            x, y = rng.randint(0, width - w), rng.randint(0, height - h)
            box = (x, y, x + w, y + h)
            break
    return image.resize((size, size), Image.Resampling.BILINEAR, box=box)


def pil_hue(image: Any, shift: float) -> Any:
    import numpy as np
    from PIL import Image

    hsv = np.array(image.convert("HSV"))
    hsv[..., 0] = (hsv[..., 0].astype(np.int16) + round(shift * 255)) % 256
    return Image.fromarray(hsv, "HSV").convert("RGB")


def pil_color_jitter(image: Any, rng: random.Random) -> Any:
    from PIL import ImageEnhance

    steps = [
        lambda im: ImageEnhance.Brightness(im).enhance(rng.uniform(1 - BRIGHTNESS, 1 + BRIGHTNESS)),
        lambda im: ImageEnhance.Contrast(im).enhance(rng.uniform(1 - CONTRAST, 1 + CONTRAST)),
        lambda im: ImageEnhance.Color(im).enhance(rng.uniform(1 - SATURATION, 1 + SATURATION)),
        lambda im: pil_hue(im, rng.uniform(-HUE, HUE)),
    ]
    rng.shuffle(steps)
    for step in steps:
        image = step(image)
    return image


def pil_augment(rgb: Any, rng: random.Random, size: int) -> Any:
    """One view of an RGB image (the image itself is not changed)."""
    from PIL import Image

    image = pil_random_resized_crop(rgb, rng, size)
    if rng.random() < P_FLIP:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    if rng.random() < P_JITTER:
        image = pil_color_jitter(image, rng)
    if rng.random() < P_ROTATE:
        image = image.rotate(rng.uniform(-DEGREES, DEGREES), Image.Resampling.BILINEAR)
    return image


class NaiveAugmenter:
    """The Ray actor of the naive script: read each image, save each view as its own file."""

    def __init__(self, out: str, size: int, quality: int, views: int) -> None:
        self.out, self.size, self.quality, self.views = Path(out), size, quality, views
        self.rng = random.Random(os.getpid())

    def process(self, items: list[tuple[str, str]]) -> int:
        from PIL import Image

        for key, path in items:
            with Image.open(path) as image:
                rgb = image.convert("RGB")
            stem = self.out / key.rsplit(".", 1)[0]
            stem.parent.mkdir(parents=True, exist_ok=True)
            for view in range(self.views):
                augmented = pil_augment(rgb, self.rng, self.size)
                augmented.save(f"{stem}_{view}.jpg", "JPEG", quality=self.quality)
        return len(items) * self.views


def run_naive_ray(recipe: Recipe, images: Path, out: Path, views: int, procs: int) -> int:
    import ray
    from ray.util import ActorPool

    ray.init(
        address="local",
        num_cpus=procs,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
    )
    try:
        actor = ray.remote(num_cpus=0.5)(NaiveAugmenter)  # fractional: no 2-CPU deadlock
        pool = ActorPool(
            [actor.remote(str(out), recipe.size, recipe.quality, views) for _ in range(procs)]
        )
        items = [(key, str(path)) for key, path in list_images(images)]
        batches = [chunk for _, chunk in chunks(items, RAY_CHUNK)]
        return sum(pool.map_unordered(lambda a, chunk: a.process.remote(chunk), batches))
    finally:
        ray.shutdown()
