"""The input sets: real photographs (rayaug.sampledata: scikit-image's and scikit-learn's
bundled photos) as cached image folders under bench-data/input/, each with a COCO
annotations.json of random boxes; or the user's own folder (--input DIR).

  bundled  seed 0, crops with shorter side 300-600 px, JPEG quality 75-95 (earlier figures)
  varied   seed 1, other crops of the same photographs, shorter side 200-900 px, quality 60-98
  phone    12 MP (4032 x 3024, a quarter portrait) JPEGs, quality 92-95: a crop upscaled with
           INTER_CUBIC plus Gaussian sensor noise (sigma 4 levels), about 3 MB each like a
           phone's; PHONE_DISTINCT of them, repeated under other keys (hard links) beyond that
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import psutil

from . import DATA, SEED

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
PHONE_SIZE = (4032, 3024)
PHONE_NOISE = 4.0  # Gaussian sigma, levels: sigma 3 at q90 gave 1.5 MB, under a phone's 2.5-5
PHONE_QUALITY = (92, 95)
PHONE_DISTINCT = 120  # one of issue 17's jobs: 120 phone photos x 16 views


@dataclass(frozen=True)
class Photos:
    """An input for one size: the image folder, its COCO boxes, and what it is."""

    images: Path
    annotations: Path
    sources: int
    name: str


@dataclass(frozen=True)
class CroppedSet:
    """Crops of the photographs at web sizes (rayaug.sampledata.make_photos)."""

    seed: int
    short_side: tuple[int, int]
    quality: tuple[int, int]
    help: str
    default_n: int = 20_000  # output samples at N when --n is not given

    def write(self, count: int, images: Path) -> int:
        from rayaug import sampledata

        photos = sampledata.make_photos(
            count, self.seed, short_side=self.short_side, quality=self.quality
        )
        return sampledata.write_folder(photos, images)


@dataclass(frozen=True)
class PhoneSet:
    """12 MP phone-like JPEGs: PHONE_DISTINCT made once (bench-data/input/phone-pool), then
    linked under as many keys as a folder needs (rayaug draws per key: other parameters)."""

    seed: int
    help: str
    default_n: int = PHONE_DISTINCT * 16

    def write(self, count: int, images: Path) -> int:
        pool = self.pool(min(count, PHONE_DISTINCT))
        for i in range(count):
            made = pool[i % len(pool)]
            link = images / made.stem.split("-", 1)[1] / f"{i:06d}.jpg"
            link.parent.mkdir(parents=True, exist_ok=True)
            os.link(made, link)
        return count

    def pool(self, count: int) -> list[Path]:
        """The first `count` distinct phone photos, made where missing (each from (seed, j))."""
        from rayaug import sampledata

        folder = DATA / "input" / f"phone-pool-seed{self.seed}"
        folder.mkdir(parents=True, exist_ok=True)
        sources = sampledata.source_photos()
        names = list(sources)

        def one(j: int) -> Path:
            name = names[j % len(names)]
            path = folder / f"{j:03d}-{name}.jpg"
            if not path.exists():
                partial = path.with_name(f".{path.name}.{os.getpid()}")
                partial.write_bytes(phone_jpeg(sources[name], j, self.seed))
                partial.replace(path)
            return path

        with ThreadPoolExecutor(max_workers=2) as threads:  # OpenCV and numpy drop the GIL
            return list(threads.map(one, range(count)))


def phone_jpeg(source: object, index: int, seed: int) -> bytes:
    """One 12 MP JPEG: a random crop of `source` (a PIL image) at the phone's aspect, upscaled
    with INTER_CUBIC, Gaussian noise added per pixel, encoded at quality 92-95."""
    import cv2
    import numpy as np

    rng = np.random.default_rng([seed, index])
    width, height = PHONE_SIZE if rng.random() < 0.75 else PHONE_SIZE[::-1]
    pixels = np.asarray(source)
    h, w = pixels.shape[:2]
    fit = min(w / width, h / height) * rng.uniform(0.6, 1.0)  # crop = 60-100 % of what fits
    cw, ch = max(1, round(width * fit)), max(1, round(height * fit))
    x, y = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
    large = cv2.resize(
        pixels[y : y + ch, x : x + cw], (width, height), interpolation=cv2.INTER_CUBIC
    )
    noise = rng.standard_normal(large.shape, dtype=np.float32) * PHONE_NOISE
    noisy = np.clip(large + noise, 0, 255).astype(np.uint8)
    quality = int(rng.integers(PHONE_QUALITY[0], PHONE_QUALITY[1] + 1))
    ok, jpeg = cv2.imencode(
        ".jpg", cv2.cvtColor(noisy, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, quality]
    )
    if not ok:
        raise RuntimeError(f"phone photo {index}: JPEG encode failed")
    return jpeg.tobytes()


PHOTO_SETS: dict[str, CroppedSet | PhoneSet] = {
    "bundled": CroppedSet(
        0,
        (300, 600),
        (75, 95),
        "seed 0, shorter side 300-600 px, JPEG quality 75-95 (earlier figures)",
    ),
    "varied": CroppedSet(
        1,
        (200, 900),
        (60, 98),
        "seed 1: other crops of the same photographs, shorter side 200-900 px, quality 60-98",
    ),
    "phone": PhoneSet(
        2,
        f"12 MP {PHONE_SIZE[0]}x{PHONE_SIZE[1]} JPEGs, q{PHONE_QUALITY[0]}-"
        f"{PHONE_QUALITY[1]}, about 3 MB each ({PHONE_DISTINCT} distinct, "
        "repeated under other keys beyond that); default N "
        f"{PHONE_DISTINCT * 16}",
    ),
}


def input_folder(sources: int, photo_set: str) -> Path:
    """The cached image folder of `sources` photos of a set; built aside and renamed when done."""
    chosen = PHOTO_SETS[photo_set]
    name = f"n{sources}-seed{chosen.seed}" if photo_set == "bundled" else f"{photo_set}-n{sources}"
    target = DATA / "input" / name
    if (target / "COUNT").exists():
        return target
    for stale in target.parent.glob(f"{target.name}.partial-*"):  # left by a killed build
        if not psutil.pid_exists(int(stale.name.rsplit("-", 1)[1])):
            shutil.rmtree(stale, ignore_errors=True)
    partial = target.with_name(f"{target.name}.partial-{os.getpid()}")
    print(f"building {sources} {photo_set} photos in {target} ...", flush=True)
    started = time.monotonic()
    count = chosen.write(sources, partial / "images")
    write_annotations(partial / "images", partial / "annotations.json", chosen.seed)
    (partial / "COUNT").write_text(f"{count}\n")
    try:
        partial.rename(target)
    except OSError:  # another invocation finished it first
        shutil.rmtree(partial, ignore_errors=True)
    print(f"built {count} photos in {time.monotonic() - started:.1f}s", flush=True)
    return target


def photos_for(sources: int, photo_set: str) -> Photos:
    folder = input_folder(sources, photo_set)
    annotations = folder / "annotations.json"
    if not annotations.exists():  # a folder cached before boxes were added
        write_annotations(folder / "images", annotations, PHOTO_SETS[photo_set].seed)
    return Photos(folder / "images", annotations, sources, photo_set)


def own_photos(images: Path, scratch: Path) -> Photos:
    """--input DIR: the user's image folder as it is; boxes generated beside the run."""
    images = images.resolve()
    count = len(list_images(images))
    if not count:
        raise SystemExit(f"--input {images}: no .jpg/.jpeg/.png images under it")
    annotations = scratch / "annotations.json"
    write_annotations(images, annotations, SEED)
    return Photos(images, annotations, count, "own")


def describe(photos: Photos) -> str:
    """`N <set> photos (<mean size>, <folder>)`: the mean file size says what they are like."""
    sizes = [path.stat().st_size for _, path in list_images(photos.images)]
    mean = sum(sizes) / max(1, len(sizes))
    shown = f"{mean / 2**20:.2f} MB" if mean >= 2**20 else f"{mean / 2**10:.0f} KB"
    return f"{photos.sources} {photos.name} photos (mean {shown}, {photos.images})"


def write_annotations(images: Path, path: Path, seed: int) -> int:
    """A COCO file with 1-4 random boxes (classes 1-5) inside each image; header reads only."""
    from PIL import Image

    categories = [{"id": c, "name": f"class{c}"} for c in range(1, 6)]
    document: dict[str, list] = {"images": [], "annotations": [], "categories": categories}
    box_id = 0
    for image_id, (key, file) in enumerate(list_images(images)):
        with Image.open(file) as image:
            width, height = image.size
        document["images"].append(
            {"id": image_id, "file_name": key, "width": width, "height": height}
        )
        rng = random.Random(f"{seed}/{key}")
        for _ in range(rng.randint(1, 4)):
            w, h = width * rng.uniform(0.1, 0.6), height * rng.uniform(0.1, 0.6)
            x, y = rng.uniform(0, width - w), rng.uniform(0, height - h)
            box = [round(x, 2), round(y, 2), round(w, 2), round(h, 2)]
            document["annotations"].append(
                {
                    "id": box_id,
                    "image_id": image_id,
                    "bbox": box,
                    "category_id": rng.randint(1, 5),
                    "iscrowd": 0,
                    "area": round(box[2] * box[3], 2),
                }
            )
            box_id += 1
    partial = path.with_name(f"{path.name}.{os.getpid()}")
    partial.write_text(json.dumps(document))
    partial.replace(path)
    return box_id


def list_images(root: Path) -> list[tuple[str, Path]]:
    """(relative key, path) of every image under root, sorted."""
    return sorted(
        (p.relative_to(root).as_posix(), p)
        for p in root.rglob("*")
        if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file()
    )
