"""Input formats → work units (what one output shard covers) → source samples (key, bytes, label).

Formats: an image folder (sub-folder name = label), Parquet with an image-bytes column,
WebDataset tar shards. Every sample has a stable key: its relative path, `file:row` (or the
key column), or `shard.tar/member-key`. Reading never extracts anything to disk, so hostile
member names cannot escape; a sample that cannot be read becomes a SourceSample with `error`.
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from rayaug.errors import UsageError
from rayaug.records import SourceSample
from rayaug.spec import InputSpec
from rayaug.storage import Location, retrying

IMAGE_EXTENSIONS = {"jpg", "jpeg", "png", "webp", "bmp", "gif", "tif", "tiff", "ppm", "pgm"}
LABEL_EXTENSIONS = ("cls", "label", "txt", "label.txt")


@dataclass(frozen=True)
class WorkUnit:
    """The input covered by one output shard; its name depends only on the input listing."""

    shard: str
    files: tuple[str, ...]  # relative to the input root
    rows: tuple[int, int] | None = None  # Parquet: [start, stop) rows of files[0]
    planned: int | None = None  # source images, when known without reading (not for tar)


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
        images = [path for path, _ in files if _extension(path) in IMAGE_EXTENSIONS]
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
    for path in paths:
        metadata = _parquet_metadata(location, path)
        names = metadata.schema.to_arrow_schema().names
        for field, column in (("image_column", spec.image_column), ("key_column", spec.key_column)):
            if column is not None and column not in names:
                raise UsageError(
                    f"{location.uri_of(path)} has no column {column!r} "
                    f"(columns: {', '.join(names)}); set input.{field}"
                )
        for start in range(0, metadata.num_rows, size):
            stop = min(start + size, metadata.num_rows)
            units.append(WorkUnit(_shard_name(len(units)), (path,), (start, stop), stop - start))
    return units


def read_unit(location: Location, spec: InputSpec, fmt: str, unit: WorkUnit) -> list[SourceSample]:
    """Every source sample of one unit, in a stable order; duplicates are marked, not dropped."""
    if fmt == "folder":
        samples = [_read_file(location, path) for path in unit.files]
    elif fmt == "parquet":
        samples = list(_read_parquet(location, spec, unit))
    else:
        samples = list(_read_tar(location, unit.files[0]))
    return _mark_duplicates(samples)


def _read_file(location: Location, path: str) -> SourceSample:
    label = path.split("/", 1)[0] if "/" in path else None
    return SourceSample(path, location.uri_of(path), location.read_bytes(path), label)


def _read_parquet(location: Location, spec: InputSpec, unit: WorkUnit) -> Iterator[SourceSample]:
    path, (start, stop) = unit.files[0], unit.rows
    table = _parquet_rows(location, path, start, stop)
    images = _image_values(table.column(spec.image_column))
    labels = _optional_column(table, spec.label_column)
    keys = _optional_column(table, spec.key_column)
    uri = location.uri_of(path)
    for offset, data in enumerate(images):
        key = keys[offset] if keys[offset] is not None else f"{path}:{start + offset}"
        label = None if labels[offset] is None else str(labels[offset])
        error = None if data is not None else f"null image in column {spec.image_column!r}"
        yield SourceSample(str(key), uri, data, label, error)


def _parquet_metadata(location: Location, path: str) -> pq.FileMetaData:
    def read() -> pq.FileMetaData:
        with location.fs.open_input_file(location.path(path)) as handle:
            return pq.ParquetFile(handle).metadata

    return retrying(read, f"reading {location.uri_of(path)}", location.attempts)


def _parquet_rows(location: Location, path: str, start: int, stop: int) -> pa.Table:
    def read() -> pa.Table:
        with location.fs.open_input_file(location.path(path)) as handle:
            return _row_range(pq.ParquetFile(handle), start, stop)

    return retrying(read, f"reading {location.uri_of(path)}", location.attempts)


def _row_range(parquet: pq.ParquetFile, start: int, stop: int) -> pa.Table:
    """Only the row groups that overlap [start, stop) are read."""
    groups, first, offset = [], None, 0
    for index in range(parquet.num_row_groups):
        rows = parquet.metadata.row_group(index).num_rows
        if offset < stop and offset + rows > start:
            groups.append(index)
            first = offset if first is None else first
        offset += rows
    table = parquet.read_row_groups(groups)
    return table.slice(start - (first or 0), stop - start)


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
    """WebDataset grouping: members sharing a key (basename up to its first dot) are one sample."""
    uri = location.uri_of(path)
    data = location.read_bytes(path)
    key, members = None, {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as archive:
        for member in archive:
            if not member.isfile():
                continue
            folder, _, name = member.name.rpartition("/")
            stem, _, extension = name.partition(".")
            member_key = f"{folder}/{stem}" if folder else stem
            if member_key != key or extension.lower() in members:
                if key is not None:
                    yield _tar_sample(f"{path}/{key}", uri, members)
                key, members = member_key, {}
            members[extension.lower()] = archive.extractfile(member).read()
    if key is not None:
        yield _tar_sample(f"{path}/{key}", uri, members)


def _tar_sample(key: str, uri: str, members: dict[str, bytes]) -> SourceSample:
    image = next((members[e] for e in members if e.rsplit(".", 1)[-1] in IMAGE_EXTENSIONS), None)
    label = next(
        (members[e].decode(errors="replace").strip() for e in LABEL_EXTENSIONS if e in members),
        None,
    )
    error = None if image is not None else f"no image member (found: {', '.join(sorted(members))})"
    return SourceSample(key, uri, image, label, error)


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
