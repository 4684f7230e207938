"""Input: an image folder. The sub-folder name is the label; the key is the relative path.

Sources go to units by a permutation drawn from the job's seed, so every shard mixes classes.

Label targets ride beside it: a COCO annotation file, and a tree of mask PNGs mirroring the
images (inside the input or elsewhere on its storage).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from rayaug import clouds
from rayaug.formats.base import (
    InputFormat,
    PositionReader,
    part_bounds,
    shard_name,
    with_targets,
)
from rayaug.records import Listing, SourceSample, Targets, WorkUnit, placement

if TYPE_CHECKING:
    from rayaug.spec import InputSpec
    from rayaug.storage import Location

IMAGE_EXTENSIONS = frozenset(
    {"jpg", "jpeg", "png", "webp", "bmp", "gif", "tif", "tiff", "ppm", "pgm"}
)


class FolderInput(InputFormat):
    name = "folder"
    extensions = IMAGE_EXTENSIONS
    random_access = True

    def plan(
        self,
        location: Location,
        spec: InputSpec,
        files: list[tuple[str, int]],
        shard_size: int,
        seed: int,
    ) -> Listing:
        masks = _masks_inside(location, spec)  # mask PNGs are labels, not images to augment
        images = [
            path
            for path, _ in files
            if self.claims(path) and not (masks and path.startswith(masks))
        ]
        # Listing order puts a class in a folder, so a unit would be one class: a permutation
        # drawn from the seed mixes every shard (a shuffle buffer cannot mix one-class shards).
        images.sort(key=lambda path: placement(seed, path))
        chunks = [tuple(images[i : i + shard_size]) for i in range(0, len(images), shard_size)]
        units = [WorkUnit(shard_name(i), chunk, None, len(chunk)) for i, chunk in enumerate(chunks)]
        return Listing(self.name, units, files, len(files) - len(images))

    def split_unit(self, unit: WorkUnit, sizes: list[int]) -> list[WorkUnit]:
        return [
            dataclasses.replace(unit, files=unit.files[start:stop], planned=stop - start)
            for start, stop in part_bounds(sizes)
        ]

    def read_unit(
        self, location: Location, spec: InputSpec, unit: WorkUnit
    ) -> Iterator[SourceSample]:
        samples = (_read_file(location, path) for path in unit.files)
        if spec.annotations or spec.masks:
            return _with_folder_targets(location, spec, samples)
        return samples

    def read_source(self, location: Location, spec: InputSpec, path: str) -> Iterable[SourceSample]:
        return [_read_file(location, path)]

    def positions(self, location: Location, spec: InputSpec) -> PositionReader:
        def read(unit: WorkUnit, offset: int) -> SourceSample:
            return next(self.read_unit(location, spec, WorkUnit(unit.shard, (unit.files[offset],))))

        return read

    def listed_labels(self, units: list[WorkUnit]) -> list[str | None]:
        return [label_of(path) for unit in units for path in unit.files]


INPUT = FolderInput()


def label_of(path: str) -> str | None:
    """The top folder of a relative path: the label of the image there."""
    return path.split("/", 1)[0] if "/" in path else None


def _read_file(location: Location, path: str) -> SourceSample:
    return SourceSample(path, location.uri_of(path), location.read_bytes(path), label_of(path))


def _with_folder_targets(
    location: Location, spec: InputSpec, samples: Iterable[SourceSample]
) -> Iterator[SourceSample]:
    coco = _coco_index(*_annotation_file(location, spec)) if spec.annotations else {}
    masks = _mask_location(location, spec)

    def targets_of(sample: SourceSample) -> Targets:
        mask = None
        if masks is not None:
            name = _mask_name(sample.key)
            if not masks.exists(name):
                raise ValueError(f"no mask {masks.uri_of(name)}")
            mask = masks.read_bytes(name)
        return Targets.parse(coco.get(sample.key, {}), "xywh", mask)  # COCO boxes are xywh

    return (with_targets(s, lambda s=s: targets_of(s)) for s in samples)


def _mask_name(key: str) -> str:
    return key.rsplit(".", 1)[0] + ".png"


def _beside(location: Location, where: str) -> Location:
    """Another prefix on the input's storage: relative to the input, an absolute path, or a
    URI of the same scheme (same endpoint and credentials)."""
    where = where.rstrip("/")
    if "://" in where:
        return dataclasses.replace(location, uri=where, root=clouds.path_of(where))
    if where.startswith("/"):
        return dataclasses.replace(location, uri=where, root=where)
    return dataclasses.replace(location, uri=location.uri_of(where), root=location.path(where))


def _masks_inside(location: Location, spec: InputSpec) -> str | None:
    """The masks' folder as a prefix of input paths, when it lies inside the input."""
    masks = _mask_location(location, spec)
    if masks is None or not masks.root.startswith(location.root + "/"):
        return None
    return masks.root[len(location.root) + 1 :] + "/"


def _mask_location(location: Location, spec: InputSpec) -> Location | None:
    return _beside(location, spec.masks) if spec.masks else None


def _annotation_file(location: Location, spec: InputSpec) -> tuple[Location, str]:
    folder, _, name = (spec.annotations or "").rpartition("/")
    return (_beside(location, folder) if folder else location), name


# The last COCO file parsed in this worker process: every shard of a job needs the same one,
# and parsing it per shard would cost more than the shard.
_COCO_CACHE: dict[str, dict[str, dict]] = {}


def _coco_index(location: Location, path: str) -> dict[str, dict]:
    uri = location.uri_of(path)
    index = _COCO_CACHE.get(uri)
    if index is None:  # get, not `in`: a concurrent reader may clear the cache in between
        index = _parse_coco(location.read_bytes(path))
        _COCO_CACHE.clear()
        _COCO_CACHE[uri] = index
    return index


def _parse_coco(raw: bytes) -> dict[str, dict]:
    """COCO annotations by image file name (relative to the input root)."""
    data = json.loads(raw)
    names = {image["id"]: image["file_name"] for image in data.get("images", [])}
    index: dict[str, dict] = {}
    for annotation in data.get("annotations", []):
        entry = index.setdefault(
            names[annotation["image_id"]], {"boxes": [], "classes": [], "keypoints": []}
        )
        if "bbox" in annotation:
            entry["boxes"].append(annotation["bbox"])
            entry["classes"].append(annotation.get("category_id", 0))
        entry["keypoints"] += annotation.get("keypoints") or []
    return index
