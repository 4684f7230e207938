"""Child side of the floor and Albumentations runners: a process per core over Parquet shards
of `shard_sources` source photos, each decoded once and turned into V views, as a user writes
it (Albumentations: the Compose applied V times to the one decoded array)."""

from __future__ import annotations

import io
import json
import multiprocessing
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from .. import SEED, shard_sources
from ..photos import list_images
from ..recipes import Recipe

Task = tuple[int, list[tuple[str, Path]], Path]  # shard index, (key, path) of its sources, out

# Set before the pool forks: its processes inherit them.
_RECIPE: Recipe | None = None
_VIEWS = 1
_ALBU: Any = None
_BOXES: dict[str, tuple[list[list[float]], list[int]]] | None = None


def chunks(items: list, size: int) -> Iterator[tuple[int, list]]:
    """(index, items[start:start + size]) over the whole list."""
    for index, start in enumerate(range(0, len(items), size)):
        yield index, items[start : start + size]


def run_pool(
    recipe: Recipe,
    images: Path,
    out: Path,
    views: int,
    procs: int,
    kind: str,
    annotations: str | None,
) -> int:
    """`kind` floor or albumentations over every image under `images`; returns samples out."""
    global _RECIPE, _VIEWS
    _RECIPE, _VIEWS = recipe, views
    items = list_images(images)
    tasks = [(i, chunk, out) for i, chunk in chunks(items, shard_sources(len(items), procs))]
    shard = _floor_shard if kind == "floor" else _albu_shard
    initializer, initargs = (_albu_init, (annotations,)) if kind == "albumentations" else (None, ())
    with multiprocessing.get_context("fork").Pool(procs, initializer, initargs) as pool:
        return sum(pool.imap_unordered(shard, tasks))


def sample_key(key: str, view: int) -> str:
    return f"{key}#{view}"


def write_shard(
    path: Path, keys: list[str], images: list[bytes], targets: list[str] | None = None
) -> None:
    """A Parquet shard: key, image, label (+ targets: the moved boxes as JSON), written aside
    and renamed, so its modification time is its commit time."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns = {
        "key": pa.array(keys, pa.string()),
        "image": pa.array(images, pa.binary()),
        "label": pa.array([key.split("/", 1)[0] for key in keys], pa.string()),
    }
    if targets is not None:
        columns["targets"] = pa.array(targets, pa.string())
    partial = path.with_name(f".{path.name}.partial")
    pq.write_table(pa.table(columns), partial)
    partial.rename(path)


def _floor_shard(task: Task) -> int:
    """Decode once, then per view resize to the recipe's size and encode: the codec's share."""
    from PIL import Image

    index, items, out = task
    size, quality = _RECIPE.size, _RECIPE.quality
    keys, encoded = [], []
    for key, path in items:
        with Image.open(path) as image:
            rgb = image.convert("RGB")
        for view in range(_VIEWS):
            buffer = io.BytesIO()
            rgb.resize((size, size), Image.Resampling.BILINEAR).save(
                buffer, "JPEG", quality=quality
            )
            keys.append(sample_key(key, view))
            encoded.append(buffer.getvalue())
    write_shard(out / f"part-{index:05d}.parquet", keys, encoded)
    return len(encoded)


def _albu_init(annotations: str | None) -> None:
    """Per process: OpenCV on one thread (one process per core), the Compose, the boxes."""
    global _ALBU, _BOXES
    import cv2

    cv2.setNumThreads(1)
    _ALBU = _RECIPE.albumentations(seed=SEED + os.getpid())
    if _RECIPE.boxes and annotations:
        document = json.loads(Path(annotations).read_text())
        names = {image["id"]: image["file_name"] for image in document["images"]}
        _BOXES = {}
        for box in document["annotations"]:
            boxes, classes = _BOXES.setdefault(names[box["image_id"]], ([], []))
            boxes.append(box["bbox"])
            classes.append(box["category_id"])


def start_albumentations(recipe: Recipe, views: int, annotations: str | None) -> None:
    """This process as one of the pool's Albumentations processes (for a loop in this
    process: `scripts/bench --augment-only --loop`)."""
    global _RECIPE, _VIEWS
    _RECIPE, _VIEWS = recipe, views
    _albu_init(annotations)


def _albu_shard(task: Task) -> int:
    index, items, out = task
    keys, encoded, targets = albu_samples((key, path.read_bytes()) for key, path in items)
    write_shard(
        out / f"part-{index:05d}.parquet", keys, encoded, targets if _BOXES is not None else None
    )
    return len(encoded)


def albu_samples(
    sources: Iterable[tuple[str, bytes]],
) -> tuple[list[str], list[bytes], list[str | None]]:
    """Each source decoded once (cv2.imdecode), its V views drawn from that array and encoded:
    the samples' keys, JPEGs and moved boxes as JSON (None without boxes)."""
    import cv2
    import numpy as np

    keys, encoded, targets = [], [], []
    for key, data in sources:
        bgr = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
        rgb = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
        for view in range(_VIEWS):
            augmented, target = _albu_view(key, rgb)
            ok, jpeg = cv2.imencode(
                ".jpg",
                cv2.cvtColor(augmented, cv2.COLOR_RGB2BGR),
                [cv2.IMWRITE_JPEG_QUALITY, _RECIPE.quality],
            )
            if ok:
                keys.append(sample_key(key, view))
                encoded.append(jpeg.tobytes())
                targets.append(target)
    return keys, encoded, targets


def _albu_view(key: str, rgb: Any) -> tuple[Any, str | None]:
    """One view: the augmented image, and its moved boxes as JSON (recipe d) or None."""
    import numpy as np

    if _BOXES is None:
        return _ALBU(image=rgb)["image"], None
    boxes, classes = _BOXES.get(key, ([], []))
    augmented = _ALBU(image=rgb, bboxes=np.array(boxes, np.float32).reshape(-1, 4), classes=classes)
    xyxy = [[float(x), float(y), float(x + w), float(y + h)] for x, y, w, h in augmented["bboxes"]]
    return augmented["image"], json.dumps(
        {"boxes": xyxy, "classes": [int(c) for c in augmented["classes"]]}
    )
