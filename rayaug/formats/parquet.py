"""Parquet: input shards with an image-bytes column, and output shards `data/<shard>.parquet`.

Input: units are row ranges of one file (never two), read row group by row group; a row group
that cannot be decoded (a corrupt page under a valid footer) quarantines its rows only. A row's
key is its key column, or `file:row`; a key that repeats anywhere in the input is found at plan
time. Output: the columns of DATA_SCHEMA, uncompressed (encoded images do not compress), in
one row group whose `image` column is one PLAIN page (no dictionary, no statistics): each
image lies as raw bytes after its 4-byte length, one after another, and the byte span of each
is recorded in the manifest, so a reader fetches some samples by ranged reads.
"""

from __future__ import annotations

import dataclasses
import io
import itertools
import struct
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rayaug.errors import UsageError
from rayaug.formats.base import (
    TARGET_COLUMNS,
    Encoded,
    InputFormat,
    PositionReader,
    ShardFile,
    data_table,
    images_of,
    part_bounds,
    shard_name,
    with_targets,
)
from rayaug.records import AugmentedSample, Listing, SourceSample, Targets, WorkUnit

if TYPE_CHECKING:
    from rayaug.spec import InputSpec, OutputSpec
    from rayaug.storage import Location


class ParquetInput(InputFormat):
    name = "parquet"
    extensions = frozenset({"parquet"})
    random_access = True
    CACHED_ROW_GROUPS = 8  # a partner costs its row group; neighbours are often picked again

    def plan(
        self,
        location: Location,
        spec: InputSpec,
        files: list[tuple[str, int]],
        shard_size: int,
        seed: int,
    ) -> Listing:
        chosen = self.chosen(location, files)
        units = _parquet_units(location, spec, [path for path, _ in chosen], shard_size)
        return Listing(self.name, units, chosen, len(files) - len(chosen))

    def plan_added(
        self,
        location: Location,
        spec: InputSpec,
        recorded: list[tuple[str, int]],
        added: list[tuple[str, int]],
        shard_size: int,
        seed: int,
    ) -> list[WorkUnit]:
        """Planned after the recorded files, so that a key the added files repeat is marked
        in them (the recorded copy stays the first) as a planning of the whole would."""
        paths = {path for path, _ in added}
        units = self.plan(location, spec, recorded + added, shard_size, seed).units
        return [unit for unit in units if unit.files[0] in paths]

    def split_unit(self, unit: WorkUnit, sizes: list[int]) -> list[WorkUnit]:
        """Rows of one file: each part's rows, with the duplicates among them (their offsets
        counted from the part's first row)."""
        first = unit.rows[0]
        return [
            dataclasses.replace(
                unit,
                rows=(first + start, first + stop),
                planned=stop - start,
                duplicates=tuple(
                    (offset - start, *rest)
                    for offset, *rest in unit.duplicates
                    if start <= offset < stop
                ),
            )
            for start, stop in part_bounds(sizes)
        ]

    def read_unit(
        self, location: Location, spec: InputSpec, unit: WorkUnit
    ) -> Iterator[SourceSample]:
        return _read_parquet(location, spec, unit)

    def read_source(self, location: Location, spec: InputSpec, path: str) -> Iterable[SourceSample]:
        rows = _parquet_metadata(location, path).num_rows
        return _read_parquet(location, spec, WorkUnit("replay", (path,), (0, rows)))

    def positions(self, location: Location, spec: InputSpec) -> PositionReader:
        return _RowReader(location, spec, self.CACHED_ROW_GROUPS).read


class ParquetOutput(ShardFile):
    name = "parquet"
    extension = "parquet"

    def encode(self, samples: list[AugmentedSample], shard: str, output: OutputSpec) -> Encoded:
        # Encoded images do not compress: zstd over them would only cost CPU. No `view`
        # column: by_view's folders `data/view=E/` are its hive partition (a reader of `data/`
        # as one dataset would refuse a column of the same name).
        table = data_table(samples).drop_columns(["view"])
        others = [name for name in table.column_names if name != "image"]
        buffer = io.BytesIO()
        pq.write_table(
            table,
            buffer,
            compression="none",
            use_dictionary=others,
            write_statistics=others,
            row_group_size=max(table.num_rows, 1),
            data_page_size=1 << 40,  # one page: no page header between two images
            data_page_version="1.0",
        )
        data = buffer.getvalue()
        # the images as the table holds them: not read from the shard's spill file again
        return Encoded(data, _spans(data, table.column("image").to_pylist()))

    def split(self, raw: bytes, spans: list[int], output: OutputSpec) -> list[bytes]:
        """Each span of a run is an image's 4-byte length and its bytes."""
        images, base = [], spans[0]
        for begin, end in itertools.pairwise(spans):
            (length,) = struct.unpack_from("<I", raw, begin - base)
            if length != end - begin - 4:
                raise ValueError(f"an image of {length} bytes in a span of {end - begin - 4}")
            images.append(raw[begin - base + 4 : end - base])
        return images

    def decode(self, data: bytes, output: OutputSpec, masks: bool) -> dict[str, bytes]:
        column = "mask" if masks else "image"
        return images_of(pq.read_table(io.BytesIO(data), columns=["sample_id", column]), masks)


def _spans(data: bytes, images: list[bytes | None]) -> list[int] | None:
    """Where each image's 4-byte length starts, and where the last image ends: each of the
    `images` found in the bytes themselves, in order, so a page boundary, or a writer that
    laid them out otherwise, gives None (the object is then read whole), never a wrong span.
    The images are those just written, not read back from `data`."""
    if not images or any(image is None for image in images):
        return None
    first = struct.pack("<I", len(images[0])) + images[0]
    at = data.find(first)
    if at < 0:
        return None
    starts = []
    for image in images:
        value = struct.pack("<I", len(image)) + image
        if data[at : at + len(value)] != value:
            return None
        starts.append(at)
        at += len(value)
    return [*starts, at]


INPUT = ParquetInput()
OUTPUT = ParquetOutput()


# ---------------------------------------------------------------- planning


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
                WorkUnit(shard_name(len(units)), (path,), (start, stop), stop - start, marked)
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


# ---------------------------------------------------------------- reading


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
        yield with_targets(sample, lambda o=offset: _row_targets(table, o, spec.box_format))


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
    size = location.retrying(
        lambda: location.fs.get_file_info(location.path(path)).size,
        f"reading {location.uri_of(path)}",
    )
    for group, (first, rows) in enumerate(_row_groups(metadata)):
        lo, hi = max(start, first), min(stop, first + rows)
        if lo >= hi:
            continue
        span = location.retrying(
            lambda g=group: _fetch_group(location, path, metadata, g),
            f"reading {location.uri_of(path)}",
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
                lo,
                hi - lo,
                None if keys is None else keys.slice(lo - first, hi - lo),
                f"unreadable Parquet row group {group} (rows {first}-{first + rows - 1}): {reason}",
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
        return location.retrying(read, f"reading {location.uri_of(path)}")
    except pa.ArrowInvalid as error:  # not Parquet at all: no rows to plan, nothing to retry
        raise UsageError(
            f"{location.uri_of(path)} is not a readable Parquet file ({error}); "
            "remove it from the input or replace it"
        ) from None


def _parquet_column(location: Location, path: str, column: str) -> pa.ChunkedArray:
    def read() -> pa.ChunkedArray:
        with location.fs.open_input_file(location.path(path)) as handle:
            return pq.ParquetFile(handle).read(columns=[column]).column(column)

    return location.retrying(read, f"reading {location.uri_of(path)}")


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


def _row_targets(table: pa.Table, offset: int, box_format: str) -> Targets | None:
    present = [c for c in (*TARGET_COLUMNS, "mask") if c in table.column_names]
    if not present:
        return None
    values = {c: table.column(c)[offset].as_py() for c in present}
    return Targets.parse(values, box_format, values.get("mask"))


# ---------------------------------------------------------------- random access (mix partners)


class _RowReader:
    """Rows by position, through a small cache of whole row groups."""

    def __init__(self, location: Location, spec: InputSpec, cached: int) -> None:
        self.location, self.spec, self.cached = location, spec, cached
        self._row_groups: dict[str, list[tuple[int, int]]] = {}  # per file: see _row_groups
        self._groups: OrderedDict[tuple[str, int], pa.Table] = OrderedDict()

    def read(self, unit: WorkUnit, offset: int) -> SourceSample:
        row = unit.rows[0] + offset
        duplicates = tuple((0, *rest) for at, *rest in unit.duplicates if at == offset)
        one_row = WorkUnit(unit.shard, unit.files, (row, row + 1), 1, duplicates)
        table = self._row(unit.files[0], row)
        return next(_parquet_samples(self.location, self.spec, one_row, table))

    def _row(self, path: str, row: int) -> pa.Table:
        if path not in self._row_groups:
            self._row_groups[path] = _row_groups(_parquet_metadata(self.location, path))
        groups = self._row_groups[path]
        group = next(i for i, (first, rows) in enumerate(groups) if first <= row < first + rows)
        if (path, group) not in self._groups:
            self._groups[(path, group)] = _parquet_group(self.location, path, group)
            if len(self._groups) > self.cached:
                self._groups.popitem(last=False)
        self._groups.move_to_end((path, group))
        return self._groups[(path, group)].slice(row - groups[group][0], 1)


def _parquet_group(location: Location, path: str, group: int) -> pa.Table:
    def read() -> pa.Table:
        with location.fs.open_input_file(location.path(path)) as handle:
            return pq.ParquetFile(handle).read_row_group(group)

    return location.retrying(read, f"reading {location.uri_of(path)}")
