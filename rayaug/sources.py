"""Input formats → work units (what one output shard covers) → source samples (key, bytes, label).

Formats: an image folder (sub-folder name = label), Parquet with an image-bytes column,
WebDataset tar shards. Every sample has a stable key: its relative path, `file:row` (or the
key column), or `shard.tar/member-key`. Reading never extracts anything to disk, so hostile
member names cannot escape; a sample that cannot be read becomes a SourceSample with `error`.
"""

from __future__ import annotations

import bisect
import dataclasses
import io
import itertools
import json
import lzma
import tarfile
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rayaug.errors import UsageError
from rayaug.records import SourceSample, Targets
from rayaug.spec import InputSpec
from rayaug.storage import Location, retrying

IMAGE_EXTENSIONS = {"jpg", "jpeg", "png", "webp", "bmp", "gif", "tif", "tiff", "ppm", "pgm"}
LABEL_EXTENSIONS = ("cls", "label", "txt", "label.txt")
MASK_MEMBER = "mask.png"  # WebDataset: `<key>.mask.png`, a PNG of class ids
TARGET_COLUMNS = ("boxes", "classes", "keypoints")  # Parquet; plus a `mask` PNG column


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


@dataclass(frozen=True)
class Listing:
    """What the input holds: the format, its work units and its files (for the fingerprint)."""

    format: str
    units: list[WorkUnit]
    files: list[tuple[str, int]]
    ignored: int  # files in an image folder that are not images (reported, not read)


def _extension(path: str) -> str:
    name = path.rsplit("/", 1)[-1]
    return name.rsplit(".", 1)[-1].lower() if "." in name else ""


def _detect(location: Location, files: list[tuple[str, int]], declared: str) -> str:
    if declared != "auto":
        return declared
    extensions = {_extension(path) for path, _ in files}
    found = [
        fmt for fmt, ext in (("parquet", "parquet"), ("webdataset", "tar")) if ext in extensions
    ]
    if extensions & IMAGE_EXTENSIONS:
        found.append("folder")
    if len(found) > 1:  # one stray file must not silently change what is read
        raise UsageError(
            f"input {location.uri} mixes {' and '.join(found)} files; set input.format"
        )
    return found[0] if found else "folder"


def _shard_name(index: int) -> str:
    return f"part-{index:05d}"


def list_input(location: Location, spec: InputSpec, shard_size: int) -> Listing:
    """Plan the input into work units of at most `shard_size` source images (a tar: one unit)."""
    files = location.list(recursive=True)
    if not files:
        raise UsageError(f"input {location.uri} holds no files")
    fmt = _detect(location, files, spec.format)
    if fmt == "folder":
        masks = _masks_inside(location, spec)  # mask PNGs are labels, not images to augment
        images = [
            path
            for path, _ in files
            if _extension(path) in IMAGE_EXTENSIONS and not (masks and path.startswith(masks))
        ]
        chunks = [tuple(images[i : i + shard_size]) for i in range(0, len(images), shard_size)]
        units = [
            WorkUnit(_shard_name(i), chunk, None, len(chunk)) for i, chunk in enumerate(chunks)
        ]
        return Listing(fmt, units, files, len(files) - len(images))
    wanted = "parquet" if fmt == "parquet" else "tar"
    chosen = [(path, size) for path, size in files if _extension(path) == wanted]
    if not chosen:
        raise UsageError(f"input {location.uri} holds no .{wanted} files (format: {fmt})")
    if fmt == "webdataset":
        units = [WorkUnit(_shard_name(i), (path,)) for i, (path, _) in enumerate(chosen)]
    else:
        units = _parquet_units(location, spec, [path for path, _ in chosen], shard_size)
    return Listing(fmt, units, chosen, len(files) - len(chosen))


def _parquet_units(
    location: Location, spec: InputSpec, paths: list[str], size: int
) -> list[WorkUnit]:
    units: list[WorkUnit] = []
    files: list[tuple[str, int]] = []
    for path in paths:
        metadata = _parquet_metadata(location, path)
        names = metadata.schema.to_arrow_schema().names
        for field, column in (("image_column", spec.image_column), ("key_column", spec.key_column)):
            if column is not None and column not in names:
                raise UsageError(
                    f"{location.uri_of(path)} has no column {column!r} "
                    f"(columns: {', '.join(names)}); set input.{field}"
                )
        files.append((path, metadata.num_rows))
    duplicates = _duplicate_rows(location, spec, files)
    for path, rows in files:
        later = duplicates.get(path, [])
        for start in range(0, rows, size):
            stop = min(start + size, rows)
            marked = tuple((row - start, *rest) for row, *rest in later if start <= row < stop)
            units.append(
                WorkUnit(_shard_name(len(units)), (path,), (start, stop), stop - start, marked)
            )
    return units


def _row_key(value: object, path: str, row: int) -> str:
    """A Parquet row's source key: its key column, or `file:row` where that is null."""
    return f"{path}:{row}" if value is None else str(value)


def _duplicate_rows(
    location: Location, spec: InputSpec, files: list[tuple[str, int]]
) -> dict[str, list[tuple[int, int, str, int]]]:
    """Per file, every row whose key an earlier row of the input already has.

    Keys are unique within a tar or a folder by construction; with a key column they are
    only as unique as the data. A repeat in another unit would give two samples one id, so
    it is found here, at plan time, over the whole input: the key columns are read alone
    (compact Arrow strings), and only the few repeated keys are walked in Python.
    """
    if spec.key_column is None or not files:
        return {}
    keys, file_index, rows = [], [], []
    for index, (path, count) in enumerate(files):
        values = _parquet_column(location, path, spec.key_column).to_pylist()
        keys.append(pa.array([_row_key(v, path, r) for r, v in enumerate(values)], pa.string()))
        file_index.append(pa.array([index] * count, pa.int32()))
        rows.append(pa.array(range(count), pa.int64()))
    table = pa.table(
        {
            "key": pa.concat_arrays(keys),
            "file": pa.concat_arrays(file_index),
            "row": pa.concat_arrays(rows),
        }
    )
    counts = table.group_by("key").aggregate([("key", "count")])
    repeated = counts.filter(pc.greater(counts["key_count"], 1)).column("key")
    if len(repeated) == 0:
        return {}
    first: dict[str, tuple[int, str, int]] = {}  # key → (copies so far, first file, first row)
    found: dict[str, list[tuple[int, int, str, int]]] = {}
    for row in table.filter(pc.is_in(table["key"], value_set=repeated)).to_pylist():
        path = files[row["file"]][0]
        if row["key"] not in first:
            first[row["key"]] = (1, path, row["row"])
            continue
        copies, first_path, first_row = first[row["key"]]
        first[row["key"]] = (copies + 1, first_path, first_row)
        found.setdefault(path, []).append((row["row"], copies + 1, first_path, first_row))
    return found


def read_unit(location: Location, spec: InputSpec, fmt: str, unit: WorkUnit) -> list[SourceSample]:
    """Every source sample of one unit, in a stable order; duplicates are marked, not dropped."""
    if fmt == "folder":
        samples = [_read_file(location, path) for path in unit.files]
        if spec.annotations or spec.masks:
            samples = _with_folder_targets(location, spec, samples)
    elif fmt == "parquet":
        samples = list(_read_parquet(location, spec, unit))
    else:
        samples = list(_read_tar(location, unit.files[0]))
    return _mark_duplicates(samples)


def _read_file(location: Location, path: str) -> SourceSample:
    label = path.split("/", 1)[0] if "/" in path else None
    return SourceSample(path, location.uri_of(path), location.read_bytes(path), label)


def _read_parquet(location: Location, spec: InputSpec, unit: WorkUnit) -> Iterator[SourceSample]:
    """A unit's rows, row group by row group: the rows of a group that cannot be decoded (a
    corrupt page under a valid footer) are quarantined with the reason; the others go on."""
    path, (start, stop) = unit.files[0], unit.rows
    for first, rows, table, error in _parquet_pieces(location, path, start, stop, spec):
        if error is None:
            yield from _parquet_samples(location, spec, unit, table, first - start)
            continue
        keys = _optional_column(table, spec.key_column) if table is not None else [None] * rows
        for offset in range(rows):
            key = _row_key(keys[offset], path, first + offset)
            yield SourceSample(key, location.uri_of(path), None, None, error)


def _parquet_samples(
    location: Location, spec: InputSpec, unit: WorkUnit, table: pa.Table, base: int = 0
) -> Iterator[SourceSample]:
    """The samples of some of a unit's rows (`table`, whose first row is the unit's `base`)."""
    path, start = unit.files[0], unit.rows[0] + base
    images = _image_values(table.column(spec.image_column))
    labels = _optional_column(table, spec.label_column)
    keys = _optional_column(table, spec.key_column)
    uri = location.uri_of(path)
    later = {offset - base: rest for offset, *rest in unit.duplicates}
    for offset, data in enumerate(images):
        key = _row_key(keys[offset], path, start + offset)
        label = None if labels[offset] is None else str(labels[offset])
        if offset in later:  # the same id as an earlier row, maybe in another unit
            copy, first_path, first_row = later[offset]
            reason = (
                f"duplicate source key {key!r} (copy {copy}; the first is row {first_row} "
                f"of {first_path})"
            )
            yield SourceSample(f"{key}~dup{copy - 1}", uri, None, label, reason)
            continue
        error = None if data is not None else f"null image in column {spec.image_column!r}"
        sample = SourceSample(key, uri, data, label, error)
        yield _with_targets(sample, lambda o=offset: _row_targets(table, o, spec.box_format))


# What decoding bytes already in memory raises on corrupt data (never a storage fault).
_CORRUPT = (pa.ArrowException, OSError, ValueError, EOFError, IndexError)


def _parquet_pieces(
    location: Location, path: str, start: int, stop: int, spec: InputSpec
) -> Iterator[tuple[int, int, pa.Table | None, str | None]]:
    """(first row, rows, table, error) for each row group overlapping [start, stop).

    Reading and decoding are kept apart so that each failure means one thing: a group's bytes
    are fetched with `retrying` (a storage fault is retried, and stops the job if it lasts);
    decoding them from memory can only fail on the data itself. Such a group yields its error
    (and, when its key column still decodes, the keys), never an exception.
    """
    metadata = _parquet_metadata(location, path)
    size = retrying(
        lambda: location.fs.get_file_info(location.path(path)).size,
        f"reading {location.uri_of(path)}",
        location.attempts,
    )
    for group, (first, rows) in enumerate(_row_groups(metadata)):
        lo, hi = max(start, first), min(stop, first + rows)
        if lo >= hi:
            continue
        span = retrying(
            lambda g=group: _fetch_group(location, path, metadata, g),
            f"reading {location.uri_of(path)}",
            location.attempts,
        )
        parquet = pq.ParquetFile(_Span(size, *span), metadata=metadata)
        try:
            table = parquet.read_row_group(group)
        except _CORRUPT as error:
            reason = " ".join(str(error).split())[:300] or type(error).__name__
            keys = None
            if spec.key_column is not None:
                try:
                    keys = parquet.read_row_group(group, columns=[spec.key_column])
                except _CORRUPT:
                    keys = None
            yield (
                lo, hi - lo, None if keys is None else keys.slice(lo - first, hi - lo),
                f"unreadable Parquet row group {group} (rows {first}-{first + rows - 1}): "
                f"{reason}",
            )
            continue
        yield lo, hi - lo, table.slice(lo - first, hi - lo), None


def _fetch_group(
    location: Location, path: str, metadata: pq.FileMetaData, group: int
) -> tuple[int, bytes]:
    """(offset, bytes) of one row group's column chunks: one contiguous range of the file."""
    chunks = [metadata.row_group(group).column(i) for i in range(metadata.num_columns)]
    begin = min(
        min(c.data_page_offset, c.dictionary_page_offset or c.data_page_offset) for c in chunks
    )
    end = max(
        min(c.data_page_offset, c.dictionary_page_offset or c.data_page_offset)
        + c.total_compressed_size
        for c in chunks
    )
    with location.fs.open_input_file(location.path(path)) as handle:
        return begin, handle.read_at(end - begin, begin)


class _Span(io.RawIOBase):
    """A read-only file of `size` bytes of which only [offset, offset + len(data)) is known:
    what pyarrow reads of one row group once the footer is parsed already."""

    def __init__(self, size: int, offset: int, data: bytes) -> None:
        super().__init__()
        self._size, self._offset, self._data, self._position = size, offset, data, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, position: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self._size}[whence]
        self._position = base + position
        return self._position

    def read(self, n: int = -1) -> bytes:
        n = self._size - self._position if n < 0 else n
        begin = self._position - self._offset
        if begin < 0 or begin + n > len(self._data):
            raise _OutsideSpan(f"read of {n} bytes at {self._position} outside the row group")
        self._position += n
        return self._data[begin : begin + n]


class _OutsideSpan(RuntimeError):
    """pyarrow asked for bytes beyond a row group's column chunks: a bug, never data."""


def _parquet_metadata(location: Location, path: str) -> pq.FileMetaData:
    def read() -> pq.FileMetaData:
        with location.fs.open_input_file(location.path(path)) as handle:
            return pq.ParquetFile(handle).metadata

    try:
        return retrying(read, f"reading {location.uri_of(path)}", location.attempts)
    except pa.ArrowInvalid as error:  # not Parquet at all: no rows to plan, nothing to retry
        raise UsageError(
            f"{location.uri_of(path)} is not a readable Parquet file ({error}); "
            "remove it from the input or replace it"
        ) from None


def _parquet_column(location: Location, path: str, column: str) -> pa.ChunkedArray:
    def read() -> pa.ChunkedArray:
        with location.fs.open_input_file(location.path(path)) as handle:
            return pq.ParquetFile(handle).read(columns=[column]).column(column)

    return retrying(read, f"reading {location.uri_of(path)}", location.attempts)


def _row_groups(metadata: pq.FileMetaData) -> list[tuple[int, int]]:
    """(first row, rows) of each row group."""
    counts = [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]
    return list(zip(itertools.accumulate(counts, initial=0), counts, strict=False))


def _image_values(column: pa.ChunkedArray) -> list[bytes | None]:
    """Raw bytes, or the `bytes` field of a Hugging Face style {bytes, path} struct."""
    if pa.types.is_struct(column.type):
        column = pa.chunked_array([chunk.field("bytes") for chunk in column.chunks])
    return column.to_pylist()


def _optional_column(table: pa.Table, name: str | None) -> list:
    if name and name in table.column_names:
        return table.column(name).to_pylist()
    return [None] * table.num_rows


def _read_tar(location: Location, path: str) -> Iterator[SourceSample]:
    """WebDataset grouping: members sharing a key (basename up to its first dot) are one sample.

    A link or device member is refused (its sample quarantined), never followed. A shard that
    breaks off (truncated, corrupt) keeps the samples before the break; the one being read
    when it broke is quarantined with the reason (tar has no index: the rest is unknowable).
    """
    uri = location.uri_of(path)
    data = location.read_bytes(path)
    key, members, refused = None, {}, []
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as archive:
            for member in archive:
                if member.isdir():
                    continue
                folder, _, name = member.name.rpartition("/")
                stem, _, extension = name.partition(".")
                member_key = f"{folder}/{stem}" if folder else stem
                if member_key != key or extension.lower() in members:
                    if key is not None:
                        yield _tar_sample(f"{path}/{key}", uri, members, refused)
                    key, members, refused = member_key, {}, []
                if member.isfile():
                    members[extension.lower()] = archive.extractfile(member).read()
                else:
                    members[extension.lower()] = b""
                    refused.append(f"tar member {member.name!r} is {_tar_kind(member)}")
    except (tarfile.TarError, EOFError, OSError, zlib.error, lzma.LZMAError) as error:
        where = f"{path}/{key}" if key is not None else path
        reason = " ".join(f"unreadable tar shard {path}: {error}".split())  # one line
        yield SourceSample(where, uri, None, None, reason[:500])
        return
    if key is not None:
        yield _tar_sample(f"{path}/{key}", uri, members, refused)


def _tar_kind(member: tarfile.TarInfo) -> str:
    if member.issym():
        return f"a symbolic link (to {member.linkname!r}), not a file"
    if member.islnk():
        return f"a hard link (to {member.linkname!r}), not a file"
    return "a device or FIFO, not a file"


def _tar_sample(key: str, uri: str, members: dict[str, bytes], refused: list[str]) -> SourceSample:
    if refused:
        return SourceSample(key, uri, None, None, "; ".join(refused))
    image = next((members[e] for e in members if _is_image_member(e)), None)
    label = next(
        (members[e].decode(errors="replace").strip() for e in LABEL_EXTENSIONS if e in members),
        None,
    )
    error = None if image is not None else f"no image member (found: {', '.join(sorted(members))})"
    sample = SourceSample(key, uri, image, label, error)
    return _with_targets(sample, lambda: _member_targets(members))


def _is_image_member(extension: str) -> bool:
    return extension != MASK_MEMBER and extension.rsplit(".", 1)[-1] in IMAGE_EXTENSIONS


def _mark_duplicates(samples: list[SourceSample]) -> list[SourceSample]:
    """A repeated key would make two samples with one id: later copies are quarantined."""
    seen: dict[str, int] = {}
    marked = []
    for sample in samples:
        copies = seen.get(sample.key, 0)
        seen[sample.key] = copies + 1
        if copies:
            reason = f"duplicate source key {sample.key!r} (copy {copies + 1})"
            sample = SourceSample(
                f"{sample.key}~dup{copies}", sample.uri, None, sample.label, reason
            )
        marked.append(sample)
    return marked


def read_one(
    location: Location, spec: InputSpec, fmt: str, source_uri: str, key: str
) -> SourceSample:
    """One source sample by key, for replay."""
    relative = source_uri[len(location.uri) :].lstrip("/")
    if fmt == "folder":
        return _read_file(location, relative)
    if fmt == "parquet":
        rows = _parquet_metadata(location, relative).num_rows
        samples = _read_parquet(location, spec, WorkUnit("replay", (relative,), (0, rows)))
    else:
        samples = _read_tar(location, relative)
    found = next((s for s in samples if s.key == key), None)
    if found is None:
        raise UsageError(f"source {key!r} is no longer in {source_uri}")
    return found


# ---------------------------------------------------------------- random access (mix partners)


class SourceIndex:
    """Every source of the job by position (folder files, Parquet rows, in plan order): what
    mix ops pick partners from. A tar has no index, so WebDataset input has none."""

    CACHED_ROW_GROUPS = 8  # a partner costs its row group; neighbours are often picked again

    def __init__(
        self, location: Location, spec: InputSpec, fmt: str, units: Sequence[WorkUnit]
    ) -> None:
        if fmt not in ("folder", "parquet"):
            raise UsageError(
                "mix ops (mixup, cutmix, mosaic) pick partners from all sources, which needs "
                f"random access; {fmt} input is read in sequence (use Parquet or a folder)"
            )
        self.location, self.spec, self.fmt, self.units = location, spec, fmt, list(units)
        self._starts = list(itertools.accumulate((u.planned or 0 for u in units), initial=0))
        self._row_groups: dict[str, list[tuple[int, int]]] = {}  # per file: see _row_groups
        self._groups: OrderedDict[tuple[str, int], pa.Table] = OrderedDict()

    def __len__(self) -> int:
        return self._starts[-1]

    def read(self, index: int) -> SourceSample:
        """The source at `index` (0 ≤ index < len), as the job's read stage would give it."""
        number = bisect.bisect_right(self._starts, index) - 1
        unit, offset = self.units[number], index - self._starts[number]
        if self.fmt == "folder":
            return read_unit(
                self.location, self.spec, self.fmt, WorkUnit(unit.shard, (unit.files[offset],))
            )[0]
        row = unit.rows[0] + offset
        duplicates = tuple((0, *rest) for at, *rest in unit.duplicates if at == offset)
        one_row = WorkUnit(unit.shard, unit.files, (row, row + 1), 1, duplicates)
        return next(
            _parquet_samples(self.location, self.spec, one_row, self._row(unit.files[0], row))
        )

    def find(self, uri: str, key: str) -> SourceSample:
        """A source by its recorded URI and key (what a replay of a mix reads)."""
        return read_one(self.location, self.spec, self.fmt, uri, key)

    def _row(self, path: str, row: int) -> pa.Table:
        if path not in self._row_groups:
            self._row_groups[path] = _row_groups(_parquet_metadata(self.location, path))
        groups = self._row_groups[path]
        group = next(i for i, (first, rows) in enumerate(groups) if first <= row < first + rows)
        if (path, group) not in self._groups:
            self._groups[(path, group)] = _parquet_group(self.location, path, group)
            if len(self._groups) > self.CACHED_ROW_GROUPS:
                self._groups.popitem(last=False)
        self._groups.move_to_end((path, group))
        return self._groups[(path, group)].slice(row - groups[group][0], 1)


def _parquet_group(location: Location, path: str, group: int) -> pa.Table:
    def read() -> pa.Table:
        with location.fs.open_input_file(location.path(path)) as handle:
            return pq.ParquetFile(handle).read_row_group(group)

    return retrying(read, f"reading {location.uri_of(path)}", location.attempts)


# ---------------------------------------------------------------- label targets


def _with_targets(sample: SourceSample, targets: Callable[[], Targets | None]) -> SourceSample:
    """The sample with its targets; targets that do not parse quarantine it (at read)."""
    if sample.error is not None:
        return sample
    try:
        return dataclasses.replace(sample, targets=targets())
    except (ValueError, TypeError, KeyError) as error:
        return dataclasses.replace(sample, data=None, error=f"bad label targets: {error}")


def _row_targets(table: pa.Table, offset: int, box_format: str) -> Targets | None:
    present = [c for c in (*TARGET_COLUMNS, "mask") if c in table.column_names]
    if not present:
        return None
    values = {c: table.column(c)[offset].as_py() for c in present}
    return Targets.parse(values, box_format, values.get("mask"))


def _member_targets(members: dict[str, bytes]) -> Targets | None:
    meta = json.loads(members["json"]) if "json" in members else {}
    has_labels = isinstance(meta, dict) and any(k in meta for k in TARGET_COLUMNS)
    if not has_labels and MASK_MEMBER not in members:
        return None
    return Targets.parse(meta if has_labels else {}, "xyxy", members.get(MASK_MEMBER))


def _with_folder_targets(
    location: Location, spec: InputSpec, samples: list[SourceSample]
) -> list[SourceSample]:
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

    return [_with_targets(s, lambda s=s: targets_of(s)) for s in samples]


def _mask_name(key: str) -> str:
    return key.rsplit(".", 1)[0] + ".png"


def _beside(location: Location, where: str) -> Location:
    """Another prefix on the input's storage: relative to the input, an absolute path, or a
    URI of the same scheme (same endpoint and credentials)."""
    where = where.rstrip("/")
    if "://" in where:
        return dataclasses.replace(location, uri=where, root=where.split("://", 1)[1])
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
