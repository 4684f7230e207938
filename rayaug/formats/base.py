"""What a format is (the two small interfaces) and what the formats share.

An input format turns the listed files into work units, reads a unit's source samples, reads
the samples of one source object (replay), and, when it has random access, reads a source by
its position (mix partners). An output format writes a shard's data (one object per view in
the `by_view` layout, one for the shard in `by_source`) and returns the record the shard's
manifest keeps of it, names the objects a committed shard's data is, reads an object's images
back, and may finish the output once every shard is committed (Lance commits its dataset
version there).
"""

from __future__ import annotations

import dataclasses
import io
import itertools
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, NamedTuple

import pyarrow as pa
import pyarrow.parquet as pq

from rayaug.commit import manifest_metadata
from rayaug.errors import UsageError
from rayaug.records import AugmentedSample, Listing, SourceSample, Targets, WorkUnit

if TYPE_CHECKING:
    from rayaug.spec import InputSpec, OutputSpec
    from rayaug.storage import Location

TARGET_COLUMNS = ("boxes", "classes", "keypoints")  # Parquet input; plus a `mask` PNG column
# After a mix op: each label's share of the sample (null when no mix was applied).
SOFT_LABEL = pa.list_(pa.struct([("label", pa.string()), ("weight", pa.float64())]))
# The rows of a table-shaped data shard (Parquet, Lance): one per sample.
DATA_SCHEMA = pa.schema(
    [
        ("sample_id", pa.string()),
        ("view", pa.int32()),
        ("image", pa.binary()),
        ("label", pa.string()),
        ("width", pa.int32()),
        ("height", pa.int32()),
        ("boxes", pa.list_(pa.list_(pa.float64()))),  # [x0, y0, x1, y1] per box
        ("classes", pa.list_(pa.int32())),
        ("keypoints", pa.list_(pa.list_(pa.float64()))),  # [x, y, visibility]
        ("mask", pa.binary()),  # PNG of class ids
        ("soft_label", SOFT_LABEL),
    ]
)

# In a manifest's file metadata: the shard's layout and its data objects (JSON list). A
# manifest without them was written before layouts: by_source, one object per shard.
LAYOUT_KEY, OBJECTS_KEY = "rayaug.layout", "rayaug.objects"
BY_VIEW, BY_SOURCE = "by_view", "by_source"


@dataclass(frozen=True)
class DataObject:
    """One object of a committed shard's data: its path (relative to the output), the view
    it holds (None: every view, the by_source layout), its samples (None: not recorded) and,
    where the format can tell, the byte offsets where each sample starts (and the last ends):
    what lets a reader fetch some samples by ranged reads."""

    path: str
    view: int | None
    samples: int | None
    spans: list[int] | None = None

    def to_json(self) -> dict:
        # every field, shallow: dataclasses.asdict deep-copies the spans, one call per sample
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


def view_groups(
    samples: list[AugmentedSample], by_view: bool
) -> list[tuple[int | None, list[AugmentedSample]]]:
    """The samples of each data object, in order: per view (by_view), or all in one."""
    if not by_view:
        return [(None, samples)]
    views = sorted({s.view for s in samples})
    return [(v, [s for s in samples if s.view == v]) for v in views]


def objects_record(objects: list[DataObject]) -> dict[str, str]:
    """What a shard's manifest keeps of its data objects (read back by `recorded_objects`)."""
    return {OBJECTS_KEY: json.dumps([o.to_json() for o in objects])}


def recorded_objects(metadata: dict[str, str]) -> list[DataObject] | None:
    """The data objects a manifest's metadata records; None for a manifest from before."""
    if OBJECTS_KEY not in metadata:
        return None
    return [DataObject(**o) for o in json.loads(metadata[OBJECTS_KEY])]


# A source read by its position in the plan: (its unit, its offset in the unit) → the sample.
PositionReader = Callable[[WorkUnit, int], SourceSample]


class InputFormat:
    """How one input format is planned and read."""

    name: ClassVar[str]
    extensions: ClassVar[frozenset[str]]  # of the files it reads
    random_access: ClassVar[bool] = False  # can a source be read by position (mix partners)?

    def claims(self, path: str) -> bool:
        """Whether a listed file is this format's (what `auto` detects, and what is read)."""
        return extension(path) in self.extensions

    def plan(
        self,
        location: Location,
        spec: InputSpec,
        files: list[tuple[str, int]],
        shard_size: int,
        seed: int,
    ) -> Listing:
        """The work units of at most `shard_size` sources over the listed (path, size) files;
        where the format decides which sources share a unit, `seed` draws it."""
        raise NotImplementedError

    def plan_added(
        self,
        location: Location,
        spec: InputSpec,
        recorded: list[tuple[str, int]],
        added: list[tuple[str, int]],
        shard_size: int,
        seed: int,
    ) -> list[WorkUnit]:
        """The work units of the files `added` to a listing of which `recorded` was planned
        already (an output that grows): the added files planned on their own."""
        return self.plan(location, spec, added, shard_size, seed).units

    def split_unit(self, unit: WorkUnit, sizes: list[int]) -> list[WorkUnit]:
        """The unit's sources, in order, as units of `sizes` sources each (named as the unit;
        the plan renames them). A format whose units are read whole (a tar) keeps it."""
        return [unit]

    def read_unit(
        self, location: Location, spec: InputSpec, unit: WorkUnit
    ) -> Iterator[SourceSample]:
        """Every source sample of one unit, in a stable order, read as it is asked for (as far
        as the format allows: a tar is one read)."""
        raise NotImplementedError

    def read_source(self, location: Location, spec: InputSpec, path: str) -> Iterable[SourceSample]:
        """The samples of one source object (a file, a Parquet file, a tar): what replay
        searches for a recorded key."""
        raise NotImplementedError

    def positions(self, location: Location, spec: InputSpec) -> PositionReader:
        """Random access (only where `random_access`): a reader of sources by position."""
        raise NotImplementedError

    def listed_labels(self, units: list[WorkUnit]) -> list[str | None] | None:
        """Every planned source's label, when the listing alone tells it; else None."""
        return None

    def chosen(self, location: Location, files: list[tuple[str, int]]) -> list[tuple[str, int]]:
        """The listed files this format reads; UsageError when there are none."""
        chosen = [(path, size) for path, size in files if self.claims(path)]
        if not chosen:
            wanted = "/".join(f".{e}" for e in sorted(self.extensions))
            raise UsageError(f"input {location.uri} holds no {wanted} files (format: {self.name})")
        return chosen


class OutputFormat:
    """How one output format writes a shard's data and reads it back."""

    name: ClassVar[str]
    # Where its data objects lie: an object there that no committed shard vouches for is an orphan.
    folder: ClassVar[str]

    def write(
        self,
        out: Location,
        shard: str,
        samples: list[AugmentedSample],
        output: OutputSpec,
        by_view: bool,
    ) -> dict[str, str]:
        """Write a shard's data, whole (one object per view when `by_view`); returns what the
        shard's manifest records of it (in its file metadata), so that the committed manifest
        is enough to find the data."""
        raise NotImplementedError

    def objects(self, shard: str, metadata: dict[str, str]) -> list[DataObject]:
        """The data objects of a committed shard, from its manifest's file metadata."""
        raise NotImplementedError

    def read_object(
        self, out: Location, output: OutputSpec, data: DataObject, masks: bool = False
    ) -> dict[str, bytes]:
        """sample_id → encoded image (or mask PNG) of one data object, read as an ordinary
        reader of the format would."""
        raise NotImplementedError

    def picks_rows(self, data: DataObject) -> bool:
        """Whether some samples of `data` can be read without the rest: by ranged reads of its
        recorded byte spans, or where the format's own reader takes rows (`read_rows`)."""
        return data.spans is not None

    def read_rows(
        self, out: Location, output: OutputSpec, data: DataObject, rows: list[int]
    ) -> dict[str, bytes]:
        """sample_id → encoded image of the samples at positions `rows` (ascending) of one data
        object, for a format whose reader takes rows itself (Lance)."""
        raise NotImplementedError

    def data_objects(self, out: Location, shard: str) -> set[str]:
        """The objects (relative to the output) of a committed shard's data."""
        return {o.path for o in self.objects(shard, manifest_metadata(out, shard))}

    def read_images(
        self, out: Location, output: OutputSpec, shard: str, masks: bool = False
    ) -> dict[str, bytes]:
        """sample_id → encoded image (or mask PNG) of one committed shard, every object."""
        images: dict[str, bytes] = {}
        for data in self.objects(shard, manifest_metadata(out, shard)):
            images |= self.read_object(out, output, data, masks)
        return images

    def finish(self, out: Location, shards: set[str]) -> None:
        """The driver, once `shards` are all the committed shards of a finished job."""

    def breaches(self, out: Location, shards: set[str]) -> list[str]:
        """What `verify` finds wrong with the format's own records of a finished output."""
        return []


class Encoded(NamedTuple):
    """A data object's bytes, and where each of its samples starts in them (and where the last
    ends), or None where the format's samples cannot be read apart."""

    data: bytes
    spans: list[int] | None


class ShardFile(OutputFormat):
    """An output format that writes each shard as one object per view,
    `data/view=<view>/<shard>.<extension>` (by_view), or one object, `data/<shard>.<extension>`
    (by_source): a retried shard overwrites them with the same bytes."""

    folder = "data"
    extension: ClassVar[str]

    def data_path(self, shard: str, view: int | None = None) -> str:
        folder = self.folder if view is None else f"{self.folder}/view={view}"
        return f"{folder}/{shard}.{self.extension}"

    def encode(self, samples: list[AugmentedSample], shard: str, output: OutputSpec) -> Encoded:
        raise NotImplementedError

    def decode(self, data: bytes, output: OutputSpec, masks: bool) -> dict[str, bytes]:
        """sample_id → image (or mask) of an object's bytes, or of some of its samples' spans."""
        raise NotImplementedError

    def split(self, raw: bytes, spans: list[int], output: OutputSpec) -> list[bytes]:
        """The images of consecutive samples from one ranged read of their spans (`spans`:
        where each starts in the object, and where the last ends), in order."""
        raise NotImplementedError

    def write(
        self,
        out: Location,
        shard: str,
        samples: list[AugmentedSample],
        output: OutputSpec,
        by_view: bool,
    ) -> dict[str, str]:
        objects = []
        for view, group in view_groups(samples, by_view):
            path = self.data_path(shard, view)
            encoded = self.encode(group, shard, output)
            out.write_bytes(path, encoded.data)
            objects.append(DataObject(path, view, len(group), encoded.spans))
        return objects_record(objects)

    def objects(self, shard: str, metadata: dict[str, str]) -> list[DataObject]:
        recorded = recorded_objects(metadata)
        return recorded if recorded is not None else [DataObject(self.data_path(shard), None, None)]

    def read_object(
        self, out: Location, output: OutputSpec, data: DataObject, masks: bool = False
    ) -> dict[str, bytes]:
        return self.decode(out.read_bytes(data.path), output, masks)


# ---------------------------------------------------------------- shared helpers


def extension(path: str) -> str:
    name = path.rsplit("/", 1)[-1]
    return name.rsplit(".", 1)[-1].lower() if "." in name else ""


def shard_name(index: int) -> str:
    return f"part-{index:05d}"


def part_bounds(sizes: list[int]) -> list[tuple[int, int]]:
    """[start, stop) of consecutive parts of `sizes` items each."""
    return list(itertools.pairwise([0, *itertools.accumulate(sizes)]))


def with_targets(sample: SourceSample, targets: Callable[[], Targets | None]) -> SourceSample:
    """The sample with its targets; targets that do not parse quarantine it (at read)."""
    if sample.error is not None:
        return sample
    try:
        return dataclasses.replace(sample, targets=targets())
    except (ValueError, TypeError, KeyError) as error:
        return dataclasses.replace(sample, data=None, error=f"bad label targets: {error}")


def data_table(samples: list[AugmentedSample]) -> pa.Table:
    """The rows of a table-shaped data shard (DATA_SCHEMA), in sample order."""
    # Column by column: Arrow converts a list per column in a fifth of the time it takes for
    # a dict per row (3 µs a sample against 14, of a sample's 1,000 in recipe c).
    targets = [s.targets for s in samples]
    columns = {
        "sample_id": [s.sample_id for s in samples],
        "view": [s.view for s in samples],
        "image": [s.image for s in samples],
        "label": [s.label for s in samples],
        "width": [s.width for s in samples],
        "height": [s.height for s in samples],
        "boxes": [None if t is None else t.boxes for t in targets],
        "classes": [None if t is None else t.classes for t in targets],
        "keypoints": [None if t is None else t.keypoints for t in targets],
        "mask": [None if t is None else t.mask for t in targets],
        "soft_label": [s.soft_label_rows for s in samples],
    }
    return pa.Table.from_pydict(columns, schema=DATA_SCHEMA)


def images_of(table: pa.Table, masks: bool) -> dict[str, bytes]:
    """sample_id → image (or mask) of a table-shaped data shard's rows (nulls left out)."""
    column = "mask" if masks else "image"
    pairs = zip(
        table.column("sample_id").to_pylist(), table.column(column).to_pylist(), strict=True
    )
    return {sample: value for sample, value in pairs if value is not None}


def parquet_bytes(table: pa.Table) -> bytes:
    """A manifest or quarantine table as zstd-compressed Parquet."""
    buffer = io.BytesIO()
    pq.write_table(table, buffer, compression="zstd")
    return buffer.getvalue()
