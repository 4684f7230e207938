"""Small data sets of real photographs for the demo, the tests and the benchmark.

The photos are the natural images shipped inside installed wheels, so nothing is downloaded:
scikit-image's `skimage.data` (astronaut, camera, chelsea, coffee, coins, hubble_deep_field,
moon, motorcycle, rocket) and, when scikit-learn is installed, its
`load_sample_images()` (china, flower). Each sample is a random crop of one of them, rescaled
so its shorter side falls in a range, converted to RGB and JPEG-encoded at a random quality.
Its label is the source photo's name.

Sample `i` depends only on `(seed, i)`, so `make_photos(10)` is a prefix of `make_photos(1000)`.

Where scikit-image is not installed (the lent GPU machine), set `RAYAUG_SOURCE_PHOTOS=DIR` to a
folder of the source photos as lossless PNGs, written elsewhere by `save_source_photos(DIR)`:
the same photos, so the same samples.

    python -m rayaug.sampledata OUT --n 200 --format folder|parquet|webdataset --seed 0
"""

from __future__ import annotations

import argparse
import io
import os
import tarfile
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

import numpy as np
from PIL import Image

# Natural photos only: the synthetic patterns, textures and scans in skimage.data are left out.
SKIMAGE_PHOTOS = (
    "astronaut",
    "camera",
    "chelsea",
    "coffee",
    "coins",
    "hubble_deep_field",
    "moon",
    "rocket",
)
SOURCES_ENV = "RAYAUG_SOURCE_PHOTOS"


@dataclass(frozen=True)
class SamplePhoto:
    """One encoded sample: `key` like `astronaut/000017.jpg`, its class `label`, JPEG bytes."""

    key: str
    label: str
    jpeg: bytes


def source_photos() -> dict[str, Image.Image]:
    """The source photos by name, decoded to RGB: skimage.data, plus scikit-learn's if present;
    or the PNGs in `$RAYAUG_SOURCE_PHOTOS` when that is set (see `save_source_photos`)."""
    if folder := os.environ.get(SOURCES_ENV):
        pngs = sorted(Path(folder).glob("*.png"))
        if not pngs:
            raise FileNotFoundError(f"{SOURCES_ENV}={folder} holds no .png source photos")
        return {path.stem: Image.open(path).convert("RGB") for path in pngs}
    import skimage.data  # lazy: only the generator needs it

    photos: dict[str, np.ndarray] = {}
    for name in SKIMAGE_PHOTOS:
        with suppress(AttributeError, ImportError, OSError):  # not bundled in this version
            photos[name] = getattr(skimage.data, name)()
    with suppress(AttributeError, ImportError, OSError):
        photos["motorcycle"] = skimage.data.stereo_motorcycle()[0]  # the left view
    try:
        from sklearn.datasets import load_sample_images
    except ImportError:
        pass
    else:
        sample = load_sample_images()
        for path, image in zip(sample.filenames, sample.images, strict=True):
            photos[Path(path).stem] = image
    return {name: Image.fromarray(photos[name]).convert("RGB") for name in sorted(photos)}


def save_source_photos(folder: Path) -> list[Path]:
    """Write the source photos as lossless PNGs, `<name>.png`, for `$RAYAUG_SOURCE_PHOTOS`."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    paths = []
    for name, image in source_photos().items():
        paths.append(Path(folder) / f"{name}.png")
        image.save(paths[-1], "PNG")
    return paths


def _render(
    source: Image.Image,
    rng: np.random.Generator,
    short_side: tuple[int, int],
    quality: tuple[int, int],
) -> bytes:
    """Crop 60-100% of each side at a random place, rescale, maybe mirror, encode."""
    w, h = source.size
    cw, ch = (max(1, round(s * rng.uniform(0.6, 1.0))) for s in (w, h))
    x, y = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
    short = int(rng.integers(short_side[0], short_side[1] + 1))
    scale = short / min(cw, ch)
    size = (short, max(short, round(ch * scale))) if cw <= ch else (round(cw * scale), short)
    image = source.resize(size, Image.Resampling.BICUBIC, box=(x, y, x + cw, y + ch))
    if rng.random() < 0.5:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=int(rng.integers(quality[0], quality[1] + 1)))
    return buffer.getvalue()


def make_photos(
    n: int,
    seed: int = 0,
    short_side: tuple[int, int] = (300, 600),
    quality: tuple[int, int] = (75, 95),
) -> Iterator[SamplePhoto]:
    """Yield `n` JPEG samples cut from the bundled photos, classes in round-robin order.

    Deterministic for a seed and a Pillow build. Pillow releases the GIL while resizing and
    encoding, so two threads use both cores; a bounded window keeps memory flat for large n.
    """
    sources = source_photos()
    names = list(sources)

    def one(i: int) -> SamplePhoto:
        label = names[i % len(names)]
        jpeg = _render(sources[label], np.random.default_rng([seed, i]), short_side, quality)
        return SamplePhoto(f"{label}/{i:06d}.jpg", label, jpeg)

    with ThreadPoolExecutor(max_workers=2) as pool:
        for start in range(0, n, 64):
            yield from pool.map(one, range(start, min(n, start + 64)))


def _chunks(items: Iterable[SamplePhoto], size: int) -> Iterator[list[SamplePhoto]]:
    iterator = iter(items)
    while chunk := list(islice(iterator, size)):
        yield chunk


def write_folder(photos: Iterable[SamplePhoto], root: Path) -> int:
    """Write an ImageNet-style image folder `root/<label>/<name>.jpg`; return the count."""
    count = 0
    for photo in photos:
        path = Path(root) / photo.key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(photo.jpeg)
        count += 1
    return count


def write_parquet(photos: Iterable[SamplePhoto], root: Path, rows_per_file: int = 256) -> int:
    """Write `root/part-00000.parquet`... with columns key, image (JPEG bytes), label."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    Path(root).mkdir(parents=True, exist_ok=True)
    count = 0
    for index, chunk in enumerate(_chunks(photos, rows_per_file)):
        table = pa.table(
            {
                "key": pa.array([p.key for p in chunk], pa.string()),
                "image": pa.array([p.jpeg for p in chunk], pa.binary()),
                "label": pa.array([p.label for p in chunk], pa.string()),
            }
        )
        pq.write_table(table, Path(root) / f"part-{index:05d}.parquet")
        count += len(chunk)
    return count


def _add_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)  # fixed mtime/owner: same photos give the same tar bytes
    info.size, info.mode, info.mtime = len(data), 0o644, 0
    tar.addfile(info, io.BytesIO(data))


def write_webdataset(photos: Iterable[SamplePhoto], root: Path, samples_per_tar: int = 256) -> int:
    """Write WebDataset shards `root/shard-00000.tar`...: `<stem>.jpg` + `<stem>.txt` (label)."""
    Path(root).mkdir(parents=True, exist_ok=True)
    count = 0
    for index, chunk in enumerate(_chunks(photos, samples_per_tar)):
        path = Path(root) / f"shard-{index:05d}.tar"
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
            for photo in chunk:
                stem = photo.key.rsplit(".", 1)[0]
                _add_member(tar, f"{stem}.jpg", photo.jpeg)
                _add_member(tar, f"{stem}.txt", photo.label.encode())
        count += len(chunk)
    return count


WRITERS = {"folder": write_folder, "parquet": write_parquet, "webdataset": write_webdataset}


def main(argv: list[str] | None = None) -> None:
    """Command line: build a sample data set under OUT."""
    parser = argparse.ArgumentParser(
        prog="python -m rayaug.sampledata",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("out", type=Path, help="output directory")
    parser.add_argument("--n", type=int, default=200, help="number of images (default 200)")
    parser.add_argument("--format", choices=sorted(WRITERS), default="folder")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--short-side",
        type=int,
        nargs=2,
        default=(300, 600),
        metavar=("MIN", "MAX"),
        help="range of the shorter side in pixels",
    )
    args = parser.parse_args(argv)
    photos = make_photos(args.n, args.seed, short_side=tuple(args.short_side))
    count = WRITERS[args.format](photos, args.out)
    print(f"wrote {count} photos ({args.format}) to {args.out}")


if __name__ == "__main__":
    main()
