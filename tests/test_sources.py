"""rayaug.sources: the three input formats, locally and on S3, listed into units and read back.

Inputs are real photos built with rayaug.sampledata; S3 inputs are uploaded to the session's
SeaweedFS server under a unique prefix.
"""

from __future__ import annotations

import io
import tarfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import BUCKET
from s3server import SeaweedS3

from rayaug import sampledata
from rayaug.errors import UsageError
from rayaug.formats import input_format
from rayaug.records import SourceSample
from rayaug.sampledata import SamplePhoto
from rayaug.sources import ReadAhead, SourceIndex, list_input, read_one, read_unit, stream_unit
from rayaug.spec import InputSpec, StorageSpec
from rayaug.storage import Location, open_location

FORMATS = ("folder", "parquet", "webdataset")


def _write(fmt: str, photos: list[SamplePhoto], root: Path) -> None:
    if fmt == "folder":
        sampledata.write_folder(photos, root)
        (root / "README.md").write_text("not an image")  # ignored, and counted as such
        (root / "astronaut" / "notes.json").write_text("{}")
    elif fmt == "parquet":
        sampledata.write_parquet(photos, root, rows_per_file=10)
    else:
        sampledata.write_webdataset(photos, root, samples_per_tar=10)


def _upload(s3: SeaweedS3, local: Path) -> str:
    """Copy a local tree under a fresh S3 prefix; return its s3:// URI."""
    prefix = f"{BUCKET}/test-sources-{uuid.uuid4().hex}"
    bucket = s3.filesystem()
    for path in sorted(local.rglob("*")):
        if path.is_file():
            with bucket.open_output_stream(f"{prefix}/{path.relative_to(local)}") as out:
                out.write(path.read_bytes())
    return f"s3://{prefix}"


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[Path], Location]:
    """Turns a local input tree into a Location: the folder itself, or a copy on S3."""

    def locate(local: Path) -> Location:
        if request.param == "local":
            return open_location(str(local), StorageSpec(retries=1))
        s3 = request.getfixturevalue("s3")
        return open_location(_upload(s3, local), StorageSpec(retries=1))

    return locate


def _expected(fmt: str, photos: list[SamplePhoto]) -> dict[str, tuple[bytes, str]]:
    """source key -> (bytes, label), as each format must name its samples."""
    if fmt == "folder":
        return {p.key: (p.jpeg, p.label) for p in sorted(photos, key=lambda p: p.key)}
    if fmt == "parquet":
        return {
            f"part-{i // 10:05d}.parquet:{i % 10}": (p.jpeg, p.label) for i, p in enumerate(photos)
        }
    return {
        f"shard-{i // 10:05d}.tar/{p.key.removesuffix('.jpg')}": (p.jpeg, p.label)
        for i, p in enumerate(photos)
    }


# ---------------------------------------------------------------- the three formats


@pytest.mark.parametrize("fmt", FORMATS)
def test_list_and_read_every_format(
    fmt: str, photos: list[SamplePhoto], tmp_path: Path, place: Callable[[Path], Location]
) -> None:
    _write(fmt, photos, tmp_path / "input")
    location = place(tmp_path / "input")
    spec = InputSpec(uri=location.uri)  # format: auto
    shard_size = 4

    listing = list_input(location, spec, shard_size)
    assert listing.format == fmt
    assert listing == list_input(location, spec, shard_size)  # stable between runs
    assert [u.shard for u in listing.units] == [f"part-{i:05d}" for i in range(len(listing.units))]
    for unit in listing.units:
        if unit.planned is not None:
            assert 1 <= unit.planned <= shard_size
    if fmt == "folder":
        assert listing.ignored == 2
        assert [u.planned for u in listing.units] == [4] * 6
        assert len(listing.files) == len(photos) + 2
    elif fmt == "parquet":  # 10 + 10 + 4 rows: units never span two files
        assert listing.ignored == 0
        assert [u.planned for u in listing.units] == [4, 4, 2, 4, 4, 2, 4]
        assert [u.rows for u in listing.units][:3] == [(0, 4), (4, 8), (8, 10)]
        assert [f for f, _ in listing.files] == [f"part-{i:05d}.parquet" for i in range(3)]
    else:  # a tar shard is one unit, whatever its size
        assert listing.ignored == 0
        assert [u.files for u in listing.units] == [(f"shard-{i:05d}.tar",) for i in range(3)]

    samples = [s for unit in listing.units for s in read_unit(location, spec, fmt, unit)]
    expected = _expected(fmt, photos)
    if fmt == "folder":  # units drawn by the seed: every sample once, in a mixed order
        assert sorted(s.key for s in samples) == sorted(expected)
    else:
        assert [s.key for s in samples] == list(expected)  # stable order, every sample once
    for sample in samples:
        data, label = expected[sample.key]
        assert sample.error is None
        assert sample.data == data
        assert sample.label == label
        assert isinstance(sample.key, str)
        assert sample.uri.startswith(location.uri + "/")
    again = [s for unit in listing.units for s in read_unit(location, spec, fmt, unit)]
    assert again == samples

    # read_one finds a sample again by its key (what replay does)
    for sample in (samples[0], samples[13], samples[-1]):
        assert read_one(location, spec, fmt, sample.uri, sample.key) == sample
    if fmt != "folder":  # a folder sample is its file: the key is the path itself
        with pytest.raises(UsageError, match="no longer"):
            read_one(location, spec, fmt, samples[-1].uri, samples[-1].key + "-gone")


@pytest.mark.parametrize("fmt", FORMATS)
def test_declared_format_is_used(fmt: str, photos: list[SamplePhoto], tmp_path: Path) -> None:
    root = tmp_path / "input"
    _write(fmt, photos[:3], root)
    location = open_location(str(root), StorageSpec(retries=0))
    listing = list_input(location, InputSpec(uri=str(root), format=fmt), shard_size=100)
    assert listing.format == fmt
    assert len(listing.units) == 1


def test_folder_key_is_the_relative_path_and_label_the_top_folder(
    photos: list[SamplePhoto], tmp_path: Path
) -> None:
    root = tmp_path / "input"
    (root / "cats" / "indoor").mkdir(parents=True)
    (root / "cats" / "indoor" / "a.JPG").write_bytes(photos[0].jpeg)
    (root / "loose.jpeg").write_bytes(photos[1].jpeg)
    location = open_location(str(root), StorageSpec(retries=0))
    spec = InputSpec(uri=str(root))
    listing = list_input(location, spec, shard_size=10)
    (unit,) = listing.units
    samples = read_unit(location, spec, "folder", unit)
    assert [(s.key, s.label, s.data) for s in samples] == [
        ("cats/indoor/a.JPG", "cats", photos[0].jpeg),
        ("loose.jpeg", None, photos[1].jpeg),
    ]


def test_a_listing_never_sees_a_rayaug_output_inside_the_input(
    photos: list[SamplePhoto], tmp_path: Path
) -> None:
    """Another job's output (or one made inside its input before rayaug refused that) is
    neither read nor counted as ignored: its data, manifests and records are not sources."""
    root = tmp_path / "input"
    sampledata.write_folder(photos[:3], root)
    for record in (
        "_job/spec.yaml",
        "_job/lock",
        "data/part-00000.parquet",
        "manifests/part-00000.parquet",
        "_SUCCESS",
    ):
        (root / "old-out" / record).parent.mkdir(parents=True, exist_ok=True)
        (root / "old-out" / record).write_bytes(b"x")
    (root / "old-out" / "data" / "stray.jpg").write_bytes(photos[3].jpeg)
    location = open_location(str(root), StorageSpec(retries=0))
    listing = list_input(location, InputSpec(uri=str(root)), shard_size=10)
    assert listing.format == "folder" and listing.ignored == 0
    assert [path for path, _ in listing.files] == sorted(
        p.relative_to(root).as_posix() for p in root.rglob("*.jpg") if "old-out" not in p.parts
    )
    out = open_location(str(root / "old-out"), StorageSpec(retries=0))
    with pytest.raises(
        UsageError,
        match=r"is a rayaug output: .* set input.uri to its data "
        r"folder \(.*/old-out/data\)",
    ):
        list_input(out, InputSpec(uri=out.uri), shard_size=10)


def test_empty_input_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    location = open_location(str(tmp_path / "empty"), StorageSpec(retries=0))
    with pytest.raises(UsageError, match="holds no files"):
        list_input(location, InputSpec(uri=location.uri), shard_size=4)


# ---------------------------------------------------------------- Parquet specifics


def _parquet(
    root: Path, name: str, table: pa.Table, row_group_size: int | None = None, **options: object
) -> None:
    root.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, root / name, row_group_size=row_group_size, **options)


def test_parquet_without_the_image_column_names_the_columns(tmp_path: Path) -> None:
    _parquet(tmp_path / "in", "a.parquet", pa.table({"picture": [b"x"], "caption": ["a cat"]}))
    location = open_location(str(tmp_path / "in"), StorageSpec(retries=0))
    with pytest.raises(UsageError) as caught:
        list_input(location, InputSpec(uri=location.uri), shard_size=4)
    message = str(caught.value)
    assert "'image'" in message and "picture" in message and "caption" in message
    assert "a.parquet" in message and "image_column" in message
    # naming the column fixes it
    spec = InputSpec(uri=location.uri, image_column="picture", label_column="caption")
    (unit,) = list_input(location, spec, shard_size=4).units
    (sample,) = read_unit(location, spec, "parquet", unit)
    assert (sample.key, sample.data, sample.label) == ("a.parquet:0", b"x", "a cat")


def test_parquet_units_cut_across_row_groups(photos: list[SamplePhoto], tmp_path: Path) -> None:
    table = pa.table(
        {
            "image": pa.array([p.jpeg for p in photos[:11]], pa.binary()),
            "label": pa.array([i for i in range(11)], pa.int64()),  # a non-string label
            "key": pa.array([p.key for p in photos[:11]]),
        }
    )
    _parquet(tmp_path / "in", "only.parquet", table, row_group_size=3)
    location = open_location(str(tmp_path / "in"), StorageSpec(retries=0))
    spec = InputSpec(uri=location.uri, key_column="key")
    listing = list_input(location, spec, shard_size=5)
    assert [u.rows for u in listing.units] == [(0, 5), (5, 10), (10, 11)]
    samples = [s for u in listing.units for s in read_unit(location, spec, "parquet", u)]
    assert [(s.key, s.data, s.label) for s in samples] == [
        (p.key, p.jpeg, str(i)) for i, p in enumerate(photos[:11])
    ]


def corrupt_one_page(path: Path, group: int, column: int) -> None:
    """Overwrite bytes inside one data page of one column chunk; the footer stays valid."""
    chunk = pq.ParquetFile(path).metadata.row_group(group).column(column)
    page = chunk.data_page_offset
    chunk_end = min(page, chunk.dictionary_page_offset or page) + chunk.total_compressed_size
    with open(path, "r+b") as handle:
        handle.seek(page + 2)  # the page header: its type and sizes
        handle.write(b"\xff" * 8)
        middle = (page + chunk_end) // 2  # and the middle of the page's data
        handle.seek(middle)
        handle.write(b"\x00" * min(32, chunk_end - middle))


def test_a_corrupt_page_quarantines_only_its_row_group(
    photos: list[SamplePhoto], tmp_path: Path
) -> None:
    table = pa.table(
        {
            "key": pa.array([p.key for p in photos[:12]]),
            "image": pa.array([p.jpeg for p in photos[:12]], pa.binary()),
        }
    )
    # No dictionary: each column chunk is one data page holding the values.
    _parquet(tmp_path / "in", "only.parquet", table, row_group_size=4, use_dictionary=False)
    corrupt_one_page(tmp_path / "in" / "only.parquet", group=1, column=1)
    with pytest.raises(OSError):  # what a plain read of the file does: the whole file fails
        pq.read_table(tmp_path / "in" / "only.parquet")
    location = open_location(str(tmp_path / "in"), StorageSpec(retries=0))
    spec = InputSpec(uri=location.uri, key_column="key")
    listing = list_input(location, spec, shard_size=6)  # units cut across the bad group
    samples = [s for u in listing.units for s in read_unit(location, spec, "parquet", u)]
    # Every row is accounted for under its own key (the key column still decodes).
    assert [s.key for s in samples] == [p.key for p in photos[:12]]
    for row, (sample, photo) in enumerate(zip(samples, photos, strict=False)):
        if 4 <= row < 8:
            assert sample.data is None
            assert sample.error.startswith("unreadable Parquet row group 1 (rows 4-7): ")
        else:
            assert (sample.data, sample.error) == (photo.jpeg, None)

    # Without a key column (or with the key's page corrupt too) the rows are `file:row`.
    corrupt_one_page(tmp_path / "in" / "only.parquet", group=1, column=0)
    samples = read_unit(location, InputSpec(uri=location.uri), "parquet", listing.units[0])
    assert [s.key for s in samples[4:]] == ["only.parquet:4", "only.parquet:5"]
    assert all(s.error and s.data is None for s in samples[4:])


def test_hugging_face_struct_image_column(photos: list[SamplePhoto], tmp_path: Path) -> None:
    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    images = pa.array(
        [
            {"bytes": photos[0].jpeg, "path": "a.jpg"},
            None,
            {"bytes": photos[2].jpeg, "path": "c.jpg"},
        ],
        image_type,
    )
    _parquet(
        tmp_path / "in",
        "train-00000-of-00001.parquet",
        pa.table({"image": images, "label": ["x", "y", "z"]}),
    )
    location = open_location(str(tmp_path / "in"), StorageSpec(retries=0))
    spec = InputSpec(uri=location.uri)
    (unit,) = list_input(location, spec, shard_size=8).units
    first, missing, third = read_unit(location, spec, "parquet", unit)
    assert (first.data, first.label, first.error) == (photos[0].jpeg, "x", None)
    assert (third.data, third.label, third.error) == (photos[2].jpeg, "z", None)
    assert missing.data is None and "null image" in missing.error
    assert missing.key == "train-00000-of-00001.parquet:1"


def test_null_image_row_becomes_an_error_sample(photos: list[SamplePhoto], tmp_path: Path) -> None:
    _parquet(
        tmp_path / "in",
        "p.parquet",
        pa.table(
            {
                "image": pa.array([photos[0].jpeg, None, photos[1].jpeg], pa.binary()),
                "label": ["a", "b", None],
            }
        ),
    )
    location = open_location(str(tmp_path / "in"), StorageSpec(retries=0))
    spec = InputSpec(uri=location.uri)
    (unit,) = list_input(location, spec, shard_size=8).units
    samples = read_unit(location, spec, "parquet", unit)
    assert [s.key for s in samples] == ["p.parquet:0", "p.parquet:1", "p.parquet:2"]
    assert samples[1] == SourceSample(
        "p.parquet:1",
        location.uri_of("p.parquet"),
        None,
        "b",
        "null image in column 'image'",
    )
    assert samples[0].error is None and samples[2].error is None and samples[2].label is None


def _repeated_keys(photos: list[SamplePhoto], root: Path) -> tuple[Location, InputSpec]:
    """Four Parquet rows keyed x, y, x, z by their `id` column."""
    _parquet(
        root,
        "d.parquet",
        pa.table(
            {
                "image": pa.array([p.jpeg for p in photos[:4]], pa.binary()),
                "id": ["x", "y", "x", "z"],
            }
        ),
    )
    location = open_location(str(root), StorageSpec(retries=0))
    return location, InputSpec(uri=location.uri, key_column="id")


def test_duplicate_parquet_keys_are_marked_not_dropped(
    photos: list[SamplePhoto], tmp_path: Path
) -> None:
    location, spec = _repeated_keys(photos, tmp_path / "in")
    (unit,) = list_input(location, spec, shard_size=8).units
    samples = read_unit(location, spec, "parquet", unit)
    assert len(samples) == 4
    assert [s.error for s in samples[:2]] == [None, None] and samples[3].error is None
    assert samples[0].key == "x" and samples[0].data == photos[0].jpeg
    assert "duplicate source key" in samples[2].error and "'x'" in samples[2].error
    assert samples[2].key != "x"  # one id per sample, even for the quarantined copy
    assert len({s.key for s in samples}) == 4
    # replay finds the first copy, the one that was processed
    assert read_one(location, spec, "parquet", samples[0].uri, "x").data == photos[0].jpeg


@pytest.mark.parametrize("fmt", ["folder", "parquet"])
def test_the_source_index_reads_every_source_as_the_read_stage_does(
    fmt: str, photos: list[SamplePhoto], tmp_path: Path, place: Callable[[Path], Location]
) -> None:
    _write(fmt, photos, tmp_path / "in")
    if fmt == "parquet":  # small row groups, units cutting across them and across files
        for path in (tmp_path / "in").glob("*.parquet"):
            pq.write_table(pq.read_table(path), path, row_group_size=5)
    location = place(tmp_path / "in")  # local, and on S3
    spec = InputSpec(uri=location.uri)
    listing = list_input(location, spec, shard_size=7)
    index = SourceIndex(location, spec, listing.format, listing.units)
    every = [s for unit in listing.units for s in read_unit(location, spec, fmt, unit)]
    assert len(index) == len(every) == len(photos)
    for number in [*range(len(index)), 3, 0, len(index) - 1]:  # revisits hit the cache
        assert index.read(number) == every[number]
    assert index.find(every[5].uri, every[5].key) == every[5]


def test_the_source_index_marks_duplicate_keys_like_the_read_stage(
    photos: list[SamplePhoto], tmp_path: Path
) -> None:
    location, spec = _repeated_keys(photos, tmp_path / "in")
    listing = list_input(location, spec, shard_size=3)
    index = SourceIndex(location, spec, "parquet", listing.units)
    assert [index.read(i).key for i in range(4)] == ["x", "y", "x~dup1", "z"]
    assert "duplicate source key" in index.read(2).error


@pytest.mark.parametrize("fmt", ["folder", "parquet", "webdataset"])
def test_a_split_unit_reads_the_units_sources_in_parts(
    fmt: str, photos: list[SamplePhoto], tmp_path: Path
) -> None:
    """The plan cuts small parts from a run's first and last units (rayaug.plan.with_small_ends):
    the parts read the unit's samples, in order, each once. A tar is read whole: it stays whole."""
    _write(fmt, photos[:10], tmp_path / "in")
    location = open_location(str(tmp_path / "in"), StorageSpec(retries=0))
    spec = InputSpec(uri=location.uri)
    (unit,) = list_input(location, spec, shard_size=10).units
    parts = input_format(fmt).split_unit(unit, [3, 3, 4])
    if fmt == "webdataset":
        assert parts == [unit]
        return
    assert [part.planned for part in parts] == [3, 3, 4]
    read = [s for part in parts for s in read_unit(location, spec, fmt, part)]
    assert read == read_unit(location, spec, fmt, unit)


def test_a_split_parquet_unit_keeps_its_duplicate_keys_marked(
    photos: list[SamplePhoto], tmp_path: Path
) -> None:
    location, spec = _repeated_keys(photos, tmp_path / "in")
    (unit,) = list_input(location, spec, shard_size=8).units
    parts = input_format("parquet").split_unit(unit, [2, 2])
    assert [part.rows for part in parts] == [(0, 2), (2, 4)]
    assert parts[1].duplicates == ((0, *unit.duplicates[0][1:]),)  # row 2, its part's first
    read = [s for part in parts for s in read_unit(location, spec, "parquet", part)]
    assert read == read_unit(location, spec, "parquet", unit)
    assert "duplicate source key" in read[2].error


def test_webdataset_has_no_source_index(photos: list[SamplePhoto], tmp_path: Path) -> None:
    _write("webdataset", photos[:3], tmp_path / "in")
    location = open_location(str(tmp_path / "in"), StorageSpec(retries=0))
    listing = list_input(location, InputSpec(uri=location.uri), shard_size=7)
    with pytest.raises(UsageError, match="needs random access"):
        SourceIndex(location, InputSpec(uri=location.uri), listing.format, listing.units)


# ---------------------------------------------------------------- WebDataset specifics


def _tar(path: Path, members: list[tuple[str, bytes]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w") as archive:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))


def test_hostile_member_names_are_read_not_extracted(
    photos: list[SamplePhoto], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = tmp_path / "a" / "b" / "c"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    _tar(
        work / "in" / "evil.tar",
        [
            ("../../escape.jpg", photos[0].jpeg),
            ("../../escape.txt", b"pwned"),
            ("/abs/path.jpg", photos[1].jpeg),
            ("fine.jpg", photos[2].jpeg),
        ],
    )
    before = sorted(p for p in tmp_path.rglob("*"))
    location = open_location(str(work / "in"), StorageSpec(retries=0))
    spec = InputSpec(uri=location.uri)
    (unit,) = list_input(location, spec, shard_size=8).units
    samples = read_unit(location, spec, "webdataset", unit)
    assert sorted(p for p in tmp_path.rglob("*")) == before  # nothing written anywhere
    assert [(s.key, s.data, s.label) for s in samples] == [
        ("evil.tar/../../escape", photos[0].jpeg, "pwned"),
        ("evil.tar//abs/path", photos[1].jpeg, None),
        ("evil.tar/fine", photos[2].jpeg, None),
    ]
    assert all(type(s.key) is str and s.error is None for s in samples)


def test_duplicate_tar_keys_are_marked_not_dropped(
    photos: list[SamplePhoto], tmp_path: Path
) -> None:
    _tar(
        tmp_path / "in" / "s.tar",
        [
            ("a.jpg", photos[0].jpeg),
            ("a.txt", b"first"),
            ("b.jpg", photos[1].jpeg),
            ("a.jpg", photos[2].jpeg),
            ("a.txt", b"again"),  # the key `a` again, not adjacent
            ("c.jpg", photos[3].jpeg),
            ("c.jpg", photos[4].jpeg),  # adjacent repeat
        ],
    )
    location = open_location(str(tmp_path / "in"), StorageSpec(retries=0))
    spec = InputSpec(uri=location.uri)
    (unit,) = list_input(location, spec, shard_size=8).units
    samples = read_unit(location, spec, "webdataset", unit)
    assert len(samples) == 5
    ok = [(s.key, s.data, s.label) for s in samples if s.error is None]
    assert ok == [
        ("s.tar/a", photos[0].jpeg, "first"),
        ("s.tar/b", photos[1].jpeg, None),
        ("s.tar/c", photos[3].jpeg, None),
    ]
    marked = [s for s in samples if s.error is not None]
    assert [s.key.split("~")[0] for s in marked] == ["s.tar/a", "s.tar/c"]
    assert all("duplicate source key" in s.error for s in marked)
    assert len({s.key for s in samples}) == 5


def test_tar_sample_without_an_image_is_an_error_sample(tmp_path: Path) -> None:
    _tar(tmp_path / "in" / "s.tar", [("x.txt", b"label only"), ("x.json", b"{}")])
    location = open_location(str(tmp_path / "in"), StorageSpec(retries=0))
    spec = InputSpec(uri=location.uri)
    (unit,) = list_input(location, spec, shard_size=8).units
    (sample,) = read_unit(location, spec, "webdataset", unit)
    assert sample.key == "s.tar/x" and sample.data is None
    assert "no image member" in sample.error and "json" in sample.error


def test_folder_units_mix_classes_by_the_seed(photos: list[SamplePhoto], tmp_path: Path) -> None:
    """A folder is listed class by class; its units are drawn by the job's seed instead, so no
    shard is one class, and the same seed draws the same units."""
    _write("folder", photos, tmp_path / "input")
    location = open_location(str(tmp_path / "input"), StorageSpec(retries=0))
    spec = InputSpec(uri=location.uri)
    units = list_input(location, spec, shard_size=4, seed=3).units
    assert units == list_input(location, spec, shard_size=4, seed=3).units
    assert units != list_input(location, spec, shard_size=4, seed=4).units
    for unit in units:
        assert len({path.split("/", 1)[0] for path in unit.files}) > 1, unit.files


def _counted(sizes: list[int], produced: list[int], fail_at: int | None = None):
    """Samples of the given byte sizes; `produced` counts those read so far."""
    for number, size in enumerate(sizes):
        if number == fail_at:
            raise OSError(f"storage gone at sample {number}")
        produced.append(number)
        yield SourceSample(f"s{number}", f"file:///s{number}", b"x" * size, None)


def _settled(produced: list[int], count: int) -> None:
    """Wait (up to 5 s) until the reader thread has read `count` samples, and a little more
    for any it should not read."""
    deadline = time.monotonic() + 5
    while len(produced) < count and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)


def test_read_ahead_gives_every_sample_in_order_and_reads_only_its_budget_ahead() -> None:
    produced: list[int] = []
    read = ReadAhead(_counted([100] * 10, produced), budget=300)
    _settled(produced, 4)
    assert produced == [0, 1, 2, 3]  # nothing taken: three fill 300 bytes, the fourth waits
    taken = iter(read)
    assert next(taken).key == "s0"
    _settled(produced, 5)
    assert len(produced) == 5  # one taken, one more read: the buffer is full again
    assert [sample.key for sample in taken] == [f"s{n}" for n in range(1, 10)]


def test_read_ahead_reads_a_sample_larger_than_its_budget_alone() -> None:
    produced: list[int] = []
    read = ReadAhead(_counted([500, 500, 10], produced), budget=300)
    _settled(produced, 2)
    assert produced == [0, 1]  # the first buffered alone, the second waits for room
    assert [sample.data and len(sample.data) for sample in read] == [500, 500, 10]


def test_a_read_error_reaches_the_consumer_after_the_samples_before_it() -> None:
    read = ReadAhead(_counted([10] * 5, [], fail_at=3), budget=1000)
    taken = []
    with pytest.raises(OSError, match="storage gone at sample 3"):
        for sample in read:
            taken.append(sample.key)
    assert taken == ["s0", "s1", "s2"]


def test_closing_a_read_ahead_stops_its_reads() -> None:
    produced: list[int] = []
    with ReadAhead(_counted([100] * 50, produced), budget=200) as read:
        assert next(iter(read)).key == "s0"
    _settled(produced, 4)
    assert len(produced) <= 5  # the budget's worth after the one taken, one in hand, no more


def test_a_folder_unit_streams_each_file_when_it_is_asked_for(
    photos: list[SamplePhoto], tmp_path: Path
) -> None:
    sampledata.write_folder(photos[:3], tmp_path)
    location = open_location(str(tmp_path), StorageSpec(retries=1))
    spec = InputSpec(uri=str(tmp_path), format="folder")
    (unit,) = list_input(location, spec, shard_size=10).units
    samples = stream_unit(location, spec, "folder", unit)
    first = next(samples)
    (tmp_path / unit.files[2]).write_bytes(b"rewritten after the first was read")
    rest = list(samples)
    assert first.data == (tmp_path / unit.files[0]).read_bytes()
    assert rest[-1].data == b"rewritten after the first was read"
