"""The records that flow between stages: plain, typed, and free of any engine type."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from rayaug.spill import Spilled, SpillFile


def sample_id(source_key: str, view: int) -> str:
    return f"{source_key}#{view}"


# The seed of what all views of a source share (ops with `same_on_views`).
SHARED_VIEW = -1
# The seed that places a source: its unit (folder inputs) and its position in its shard.
PLACEMENT = -2


def sample_seed(job_seed: int, source_key: str, view: int) -> int:
    """The seed of one output sample: depends on nothing but the job seed, key and view."""
    digest = hashlib.blake2b(f"{job_seed}\0{source_key}\0{view}".encode(), digest_size=8)
    return int.from_bytes(digest.digest(), "big") >> 1  # 63 bits: fits Arrow int64


def placement(job_seed: int, source_key: str) -> int:
    """Where a source goes among others: sorting by it is a permutation drawn from the job
    seed that stays put for every other source when one is added or removed."""
    return sample_seed(job_seed, source_key, PLACEMENT)


@dataclass(frozen=True)
class Targets:
    """Label targets of one image (see rayaug.targets for how they move)."""

    boxes: list[list[float]] = field(default_factory=list)  # [x0, y0, x1, y1]
    classes: list[int] = field(default_factory=list)  # one per box
    keypoints: list[list[float]] = field(default_factory=list)  # [x, y, visibility]
    mask: bytes | None = None  # a PNG of class ids, the size of the image

    def to_json(self) -> dict:
        return {
            "boxes": self.boxes,
            "classes": self.classes,
            "keypoints": self.keypoints,
            "mask": self.mask is not None,
        }

    @classmethod
    def parse(cls, data: dict, box_format: str, mask: bytes | None = None) -> Targets:
        """From `{"boxes", "classes", "keypoints"}` (boxes xyxy or COCO's xywh)."""
        boxes = [[float(v) for v in box] for box in data.get("boxes") or []]
        if box_format == "xywh":
            boxes = [[x, y, x + w, y + h] for x, y, w, h in boxes]
        classes = [int(c) for c in data.get("classes") or [0] * len(boxes)]
        if len(classes) != len(boxes) or any(len(b) != 4 for b in boxes):
            raise ValueError("targets: one class per box, four numbers per box")
        points = [float(v) for v in np.ravel(data.get("keypoints") or [])]
        if len(points) % 3:
            raise ValueError("targets: keypoints are x, y, visibility triples")
        keypoints = [points[i : i + 3] for i in range(0, len(points), 3)]
        return cls(boxes, classes, keypoints, mask)


@dataclass(frozen=True)
class SourceSample:
    """One input image as read from storage; a read failure travels as `error`, not as raise."""

    key: str
    uri: str  # the object that holds it (the file, the Parquet file, the tar shard)
    data: bytes | None
    label: str | None = None
    error: str | None = None
    targets: Targets | None = None

    @property
    def size(self) -> int:
        """Bytes it holds in memory (none for a read failure): what read budgets count."""
        return len(self.data or b"")

    @cached_property
    def digest(self) -> str | None:
        """sha256 of the bytes as read: what ties each of its samples to this very source."""
        return None if self.data is None else source_digest(self.data)


def source_digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class AugmentedSample:
    """One output view: its encoded bytes and everything needed to replay it."""

    source_key: str
    source_uri: str
    view: int
    seed: int
    label: str | None
    ops: list[dict[str, Any]]
    source_size: tuple[int, int]  # (height, width) after EXIF orientation
    encoded: bytes | Spilled  # the image's bytes, or where a shard's spill file holds them
    height: int
    width: int
    targets: Targets | None = None
    soft_label: dict[str | None, float] | None = None  # label → share, after a mix op
    source_digest: str | None = None  # sha256 of the source's bytes as read

    @property
    def sample_id(self) -> str:
        return sample_id(self.source_key, self.view)

    @property
    def image(self) -> bytes:
        """The encoded image (read from the spill file when it is held there)."""
        return self.encoded if isinstance(self.encoded, bytes) else self.encoded.read()

    @property
    def soft_label_rows(self) -> list[dict] | None:
        """The soft label as Arrow/JSON rows: [{"label": ..., "weight": ...}]."""
        if self.soft_label is None:
            return None
        return [{"label": label, "weight": weight} for label, weight in self.soft_label.items()]

    @property
    def sha256(self) -> str:
        if isinstance(self.encoded, bytes):
            return hashlib.sha256(self.encoded).hexdigest()
        return self.encoded.sha256  # taken as the spill file took the bytes


@dataclass(frozen=True)
class Quarantined:
    """A sample that could not be produced, and why (the quarantine row)."""

    source_key: str
    view: int
    stage: str  # read | decode | augment | encode
    error_class: str
    message: str

    @property
    def sample_id(self) -> str:
        return sample_id(self.source_key, self.view)


@dataclass
class ShardOutput:
    """What the augment stage made of one work unit."""

    device: str = "cpu"
    views: range = range(0)  # of each source that the unit makes
    sources: int = 0
    samples: list[AugmentedSample] = field(default_factory=list)
    quarantined: list[Quarantined] = field(default_factory=list)
    spill: SpillFile | None = None  # where samples' bytes wait for the sink; None: in memory

    def add(self, sample: AugmentedSample) -> None:
        if self.spill is not None:
            held = self.spill.hold(sample.image)
            if not isinstance(held, bytes):  # on disk: the sample keeps where, not the bytes
                sample = replace(sample, encoded=held)
        self.samples.append(sample)


# ---------------------------------------------------------------- planning


@dataclass(frozen=True)
class WorkUnit:
    """The input covered by one output shard; its name depends only on the input listing."""

    shard: str
    files: tuple[str, ...]  # relative to the input root
    rows: tuple[int, int] | None = None  # Parquet: [start, stop) rows of files[0]
    planned: int | None = None  # source images, when known without reading (not for tar)
    # Parquet with a key column: rows of this unit whose key an earlier row (of any unit)
    # already has, as (offset in the unit, copy number, file of the first copy, its row).
    duplicates: tuple[tuple[int, int, str, int], ...] = ()
    # [first, stop) of the views it makes of its sources; a plan sets it (see rayaug.plan).
    views: tuple[int, int] | None = None

    @property
    def view_count(self) -> int:
        first, stop = self.views or (0, 0)
        return stop - first


@dataclass(frozen=True)
class Listing:
    """What the input holds: the format, its work units and its files (for the fingerprint)."""

    format: str
    units: list[WorkUnit]
    files: list[tuple[str, int]]
    ignored: int  # files in an image folder that are not images (reported, not read)
