"""rayaug.sinks: output shards in the Parquet and WebDataset formats (rayaug.formats), quarantine
files, manifests, in commit order (Lance: tests/test_lance.py).

Everything is checked by reading the objects back with the readers a user would use
(pyarrow, the `webdataset` package), locally and on the session's S3 server.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import tarfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import webdataset as wds
from conftest import BUCKET
from PIL import Image

from rayaug import commit
from rayaug.formats import output_format
from rayaug.outputs import manifest_of
from rayaug.records import AugmentedSample, Quarantined, ShardOutput, placement, sample_seed
from rayaug.sampledata import SamplePhoto
from rayaug.sinks import WriteContext, write_shard
from rayaug.spec import OutputSpec, StorageSpec
from rayaug.spill import Spilled, SpillFile
from rayaug.storage import Location, open_location

VERSIONS = {"rayaug": "0.1.0-test", "kornia": "0.9.0"}
DESIGN_COLUMNS = [
    "sample_id",
    "source_uri",
    "source_key",
    "view",
    "label",
    "seed",
    "ops",
    "shard",
    "index",
    "width",
    "height",
    "format",
    "sha256",
    "device",
    "rayaug_version",
    "kornia_version",
]
SHARD = "part-00003"


def _augmented(photos: list[SamplePhoto], views: int = 2) -> list[AugmentedSample]:
    samples = []
    for photo in photos:
        width, height = Image.open(io.BytesIO(photo.jpeg)).size
        for view in range(views):
            samples.append(
                AugmentedSample(
                    source_key=photo.key,
                    source_uri=f"s3://in/{photo.key}",
                    view=view,
                    seed=sample_seed(7, photo.key, view),
                    label=None if photo.label == "coffee" else photo.label,
                    ops=[
                        {"name": "hflip", "applied": view == 1, "params": {}},
                        {"name": "rotation", "applied": True, "params": {"degrees": 12.5 * view}},
                    ],
                    source_size=(height, width),
                    encoded=photo.jpeg,  # real JPEG bytes stand in for the augmented ones
                    height=height,
                    width=width,
                )
            )
    return samples


def _context(output: OutputSpec, layout: str = "by_source") -> WriteContext:
    return WriteContext(output, VERSIONS, 7, layout)


def _written(samples: list[AugmentedSample]) -> list[AugmentedSample]:
    """The order by_source writes a shard in: sources placed by the job's seed (7), each
    source's views together."""
    return sorted(samples, key=lambda s: (placement(7, s.source_key), s.view))


def _result(photos: list[SamplePhoto]) -> ShardOutput:
    return ShardOutput(
        device="cuda:0",
        sources=len(photos) + 1,
        samples=_augmented(photos),
        quarantined=[
            Quarantined("broken/1.jpg", 0, "decode", "DecodeError", "cannot identify image"),
            Quarantined("broken/1.jpg", 1, "decode", "DecodeError", "cannot identify image"),
        ],
    )


@dataclass(frozen=True)
class RecordingLocation(Location):
    """A real location that also records the order of its writes."""

    writes: list[str] = field(default_factory=list, compare=False)

    def write_bytes(self, relative: str, data: bytes) -> None:
        super().write_bytes(relative, data)
        self.writes.append(relative)


def _recording(location: Location) -> RecordingLocation:
    fields = {f.name: getattr(location, f.name) for f in dataclasses.fields(Location)}
    return RecordingLocation(**fields)  # its deadline and atomic put (Azure) included


# URI scheme: the session's server fixture
SERVERS = {"s3": "s3", "gs": "gcs", "az": "azure", "abfss": "azure", "abfs": "azure"}


def output_at(where: str, request: pytest.FixtureRequest, tmp_path: Path) -> RecordingLocation:
    """A recording output location, "local" or on the session's server of a URI scheme
    (a key of SERVERS)."""
    if where == "local":
        return _recording(open_location(str(tmp_path / "out"), StorageSpec(retries=1)))
    request.getfixturevalue(SERVERS[where])
    uri = f"{where}://{BUCKET}/test-sinks-{uuid.uuid4().hex}"
    return _recording(open_location(uri, StorageSpec(retries=1)))


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def out(request: pytest.FixtureRequest, tmp_path: Path) -> RecordingLocation:
    return output_at(request.param, request, tmp_path)


def _read_table(location: Location, relative: str):
    return pq.read_table(io.BytesIO(location.read_bytes(relative)))


def _check_manifest(out: Location, result: ShardOutput, images: list[bytes], fmt: str) -> None:
    manifest = _read_table(out, commit.manifest_path(SHARD))
    assert set(DESIGN_COLUMNS) <= set(manifest.column_names)
    rows = manifest.to_pylist()
    assert len(rows) == len(result.samples) == len(images)
    written = _written(result.samples)
    for index, (row, sample, image) in enumerate(zip(rows, written, images, strict=True)):
        assert row["sample_id"] == f"{sample.source_key}#{sample.view}"
        assert row["source_uri"] == sample.source_uri
        assert row["source_key"] == sample.source_key
        assert row["view"] == sample.view
        assert row["label"] == sample.label
        assert row["seed"] == sample.seed == sample_seed(7, sample.source_key, sample.view)
        assert json.loads(row["ops"]) == sample.ops
        assert (row["shard"], row["index"]) == (SHARD, index)
        assert (row["width"], row["height"]) == (sample.width, sample.height)
        assert row["format"] == fmt
        assert row["sha256"] == hashlib.sha256(image).hexdigest()  # of the bytes in data/
        assert row["device"] == "cuda:0"
        assert (row["rayaug_version"], row["kornia_version"]) == ("0.1.0-test", "0.9.0")


def _check_errors(out: Location, result: ShardOutput) -> None:
    errors = _read_table(out, commit.errors_path(SHARD)).to_pylist()
    assert errors == [
        {
            "sample_id": f"{q.source_key}#{q.view}",
            "source_key": q.source_key,
            "view": q.view,
            "shard": SHARD,
            "stage": q.stage,
            "error_class": q.error_class,
            "message": q.message,
        }
        for q in result.quarantined
    ]


def test_parquet_shard(out: RecordingLocation, photos: list[SamplePhoto]) -> None:
    output = OutputSpec(uri=out.uri, format="parquet")
    result = _result(photos[:5])
    committed = write_shard(out, SHARD, result, _context(output))

    assert out.writes == [
        f"data/{SHARD}.parquet",
        f"errors/{SHARD}.parquet",
        f"manifests/{SHARD}.parquet",
    ]
    assert (committed.shard, committed.samples, committed.quarantined) == (SHARD, 10, 2)
    assert committed.reasons == {"decode: DecodeError": 2}
    assert commit.committed_shards(out) == {SHARD}

    data = _read_table(out, output_format(output.format).data_path(SHARD))
    assert {"sample_id", "image", "label"} <= set(data.column_names)
    rows = data.to_pylist()
    written = _written(result.samples)
    assert [r["sample_id"] for r in rows] == [s.sample_id for s in written]
    assert [r["image"] for r in rows] == [s.image for s in written]
    assert [r["label"] for r in rows] == [s.label for s in written]
    for row in rows:
        assert Image.open(io.BytesIO(row["image"])).size == (row["width"], row["height"])
    _check_manifest(out, result, [r["image"] for r in rows], "jpeg")
    _check_errors(out, result)


def test_webdataset_shard(
    out: RecordingLocation, photos: list[SamplePhoto], tmp_path: Path
) -> None:
    output = OutputSpec(uri=out.uri, format="webdataset", image_format="jpeg")
    result = _result(photos[:5])
    write_shard(out, SHARD, result, _context(output))
    assert out.writes == [
        f"data/{SHARD}.tar",
        f"errors/{SHARD}.parquet",
        f"manifests/{SHARD}.parquet",
    ]

    local_copy = tmp_path / "copy" / f"{SHARD}.tar"  # webdataset reads it like any shard
    local_copy.parent.mkdir()
    local_copy.write_bytes(out.read_bytes(output_format(output.format).data_path(SHARD)))
    raw = list(wds.WebDataset(str(local_copy), shardshuffle=False))
    decoded = list(wds.WebDataset(str(local_copy), shardshuffle=False).decode("pil"))
    assert len(decoded) == len(result.samples)
    written = _written(result.samples)
    for index, (sample, item, plain) in enumerate(zip(written, decoded, raw, strict=True)):
        assert item["__key__"] == f"{SHARD}-{index:06d}"
        assert plain["jpg"] == sample.image
        assert item["jpg"].size == (sample.width, sample.height)
        assert item["json"] == {
            "sample_id": sample.sample_id,
            "source_key": sample.source_key,
            "view": sample.view,
            "label": sample.label,
        }
        assert "txt" not in item  # the label is the JSON's: no member of its own
    assert any(s.label is None for s in result.samples)
    _check_manifest(out, result, [item["jpg"] for item in raw], "jpeg")
    _check_errors(out, result)
    # rayaug reads its own output as WebDataset input: the label from the JSON
    from rayaug.formats import input_format
    from rayaug.spec import InputSpec

    read = list(
        input_format("webdataset").read_source(
            open_location(str(local_copy.parent), StorageSpec()),
            InputSpec(uri=str(local_copy.parent)),
            local_copy.name,
        )
    )
    assert [r.label for r in read] == [s.label for s in written]
    assert [r.data for r in read] == [s.image for s in written]


def test_the_reader_of_a_webdataset_shard_reads_what_tarfile_reads(
    photos: list[SamplePhoto],
) -> None:
    """An epoch reads rayaug's tars without tarfile (its hot path): whole, by span runs, and
    any tar that is not plain ustar through tarfile, which still refuses a broken one."""
    fmt, output = output_format("webdataset"), OutputSpec(uri="/o", format="webdataset")
    samples = _written(_augmented(photos[:4]))
    data, spans = fmt.encode(samples, SHARD, output)
    expected = {s.sample_id: s.image for s in samples}
    assert fmt.decode(data, output, masks=False) == expected
    assert fmt.split(data[spans[1] : spans[5]], spans[1:6], output) == [
        s.image for s in samples[1:5]
    ]

    pax = io.BytesIO()  # a name past ustar's 100 bytes needs a pax header
    with tarfile.open(fileobj=pax, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for suffix, payload in (("jpg", b"image"), ("json", b'{"sample_id": "s#0"}')):
            info = tarfile.TarInfo(f"{'k' * 120}.{suffix}")
            info.size = len(payload)
            archive.addfile(info, io.BytesIO(payload))
    assert fmt.decode(pax.getvalue(), output, masks=False) == {"s#0": b"image"}

    bad_checksum = bytearray(data)
    bad_checksum[0] ^= 1  # a member name's byte: the header's checksum no longer holds
    with pytest.raises(tarfile.TarError):
        fmt.decode(bytes(bad_checksum), output, masks=False)
    with pytest.raises(tarfile.TarError):
        fmt.split(data[spans[1] : spans[1] + 600], spans[1:3], output)  # cut in an image


def _tarfile_written(members: list[tuple[str, bytes]]) -> bytes:
    """The members as tarfile writes them, with the metadata rayaug gives every member."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as archive:
        for name, payload in members:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(payload), 0o644, 0
            archive.addfile(info, io.BytesIO(payload))
    return buffer.getvalue()


@pytest.mark.parametrize("count", [1, 2, 3, 7])
def test_a_webdataset_shard_has_the_bytes_tarfile_writes(
    photos: list[SamplePhoto], count: int
) -> None:
    """rayaug frames its tars itself (tarfile's header building was half of a shard's write):
    byte for byte what tarfile writes, at payload sizes on and around the 512-byte blocks and
    at member counts that end the archive at different points of its 10 KiB record."""
    fmt, output = output_format("webdataset"), OutputSpec(uri="/o", format="webdataset")
    sizes = [0, 1, 511, 512, 513, 10_240, len(photos[0].jpeg)]
    samples = [
        dataclasses.replace(sample, encoded=photos[0].jpeg[: sizes[i % len(sizes)]])
        for i, sample in enumerate(_written(_augmented(photos[:4]))[:count])
    ]
    data, spans = fmt.encode(samples, SHARD, output)
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        members = [(m.name, archive.extractfile(m).read()) for m in archive]
    assert [payload for name, payload in members if name.endswith(".jpg")] == [
        s.image for s in samples
    ]
    assert data == _tarfile_written(members)
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:  # a sample from its first header
        assert spans == [m.offset for m in archive if m.name.endswith(".jpg")] + [
            archive.getmembers()[-1].offset_data + -(-len(members[-1][1]) // 512) * 512
        ]


@pytest.mark.parametrize("fmt", ["parquet", "webdataset"])
def test_a_soft_label_reaches_the_shard_and_the_manifest(
    out: RecordingLocation, photos: list[SamplePhoto], tmp_path: Path, fmt: str
) -> None:
    output = OutputSpec(uri=out.uri, format=fmt)
    mixed, plain = _augmented(photos[:1], views=2)
    mixed = dataclasses.replace(mixed, soft_label={"cat": 0.75, None: 0.25})
    write_shard(out, SHARD, ShardOutput(samples=[mixed, plain]), _context(output))
    expected = [{"label": "cat", "weight": 0.75}, {"label": None, "weight": 0.25}]
    manifest = _read_table(out, f"manifests/{SHARD}.parquet").to_pylist()
    assert [row["soft_label"] for row in manifest] == [expected, None]
    if fmt == "parquet":
        data = _read_table(out, output_format(output.format).data_path(SHARD)).to_pylist()
        assert [row["soft_label"] for row in data] == [expected, None]
    else:
        local_copy = tmp_path / f"{SHARD}.tar"
        local_copy.write_bytes(out.read_bytes(output_format(output.format).data_path(SHARD)))
        shard = wds.WebDataset(str(local_copy), shardshuffle=False).decode()
        metas = [item["json"] for item in shard]
        assert metas[0]["soft_label"] == expected and "soft_label" not in metas[1]


@pytest.mark.parametrize("in_memory", ["none", "half"])
@pytest.mark.parametrize("layout", ["by_view", "by_source"])
@pytest.mark.parametrize("fmt", ["parquet", "webdataset", "lance"])
def test_a_shard_spilled_to_disk_is_written_as_one_held_in_memory(
    fmt: str, layout: str, in_memory: str, photos: list[SamplePhoto], tmp_path: Path
) -> None:
    """Every image on disk, or the first half in memory and the rest on disk: the same shard."""
    written = []
    samples = _augmented(photos[:4])
    budget = 0 if in_memory == "none" else sum(len(s.image) for s in samples[: len(samples) // 2])
    with SpillFile(str(tmp_path), budget) as spill:
        held, spilled = (ShardOutput(sources=4, views=range(2), spill=s) for s in (None, spill))
        for sample in samples:
            held.add(sample)
            spilled.add(sample)
        on_disk = [isinstance(s.encoded, Spilled) for s in spilled.samples]
        assert on_disk == [i >= len(samples) // 2 or budget == 0 for i in range(len(samples))]
        assert [s.image for s in spilled.samples] == [s.encoded for s in held.samples]
        for name, result in (("memory", held), ("spilled", spilled)):
            location = open_location(str(tmp_path / name), StorageSpec(retries=0))
            output = OutputSpec(uri=location.uri, format=fmt)
            write_shard(location, SHARD, result, _context(output, layout))
            files = {p: location.read_bytes(p) for p, _ in location.list(recursive=True)}
            rows = manifest_of(location, SHARD).to_pylist()
            written.append((output_format(fmt).read_images(location, output, SHARD), rows, files))
    assert written[0][0] == written[1][0]
    assert len(written[0][0]) == 8 and written[0][1] == written[1][1]
    if fmt != "lance":  # Lance names its fragments' files at random
        assert written[0][2] == written[1][2]


@pytest.mark.parametrize("fmt", ["parquet", "webdataset"])
def test_same_output_twice_gives_the_same_bytes(
    fmt: str, photos: list[SamplePhoto], tmp_path: Path
) -> None:
    result = _result(photos[:4])
    objects = []
    for attempt in ("first", "retry"):
        location = open_location(str(tmp_path / attempt), StorageSpec(retries=0))
        context = _context(OutputSpec(uri=location.uri, format=fmt))
        write_shard(location, SHARD, result, context)
        objects.append({p: location.read_bytes(p) for p, _ in location.list(recursive=True)})
    assert objects[0] == objects[1]
    assert len(objects[0]) == 3
    # and a retry over the first attempt's objects leaves the same bytes in place
    location = open_location(str(tmp_path / "first"), StorageSpec(retries=0))
    write_shard(location, SHARD, result, _context(OutputSpec(uri=location.uri, format=fmt)))
    assert {p: location.read_bytes(p) for p, _ in location.list(recursive=True)} == objects[0]


def test_no_errors_file_without_quarantine(photos: list[SamplePhoto], tmp_path: Path) -> None:
    out = _recording(open_location(str(tmp_path / "out"), StorageSpec(retries=0)))
    result = ShardOutput(device="cpu", sources=2, samples=_augmented(photos[:2], views=1))
    context = _context(OutputSpec(uri=out.uri, format="webdataset"))
    committed = write_shard(out, "part-00000", result, context)
    assert out.writes == ["data/part-00000.tar", "manifests/part-00000.parquet"]
    assert (committed.samples, committed.quarantined, committed.reasons) == (2, 0, {})


def test_a_shard_of_only_quarantined_samples_is_still_committed(tmp_path: Path) -> None:
    out = _recording(open_location(str(tmp_path / "out"), StorageSpec(retries=0)))
    result = ShardOutput(
        device="cpu",
        sources=1,
        quarantined=[
            Quarantined("a.jpg", 0, "read", "SourceError", "null image in column 'image'")
        ],
    )
    context = _context(OutputSpec(uri=out.uri, format="parquet"))
    write_shard(out, "part-00000", result, context)
    assert out.writes[-1] == "manifests/part-00000.parquet"
    assert commit.committed_shards(out) == {"part-00000"}
    manifest = _read_table(out, "manifests/part-00000.parquet")
    assert manifest.num_rows == 0 and set(DESIGN_COLUMNS) <= set(manifest.column_names)
    assert _read_table(out, "errors/part-00000.parquet").num_rows == 1


def test_a_failed_data_write_commits_nothing(photos: list[SamplePhoto], tmp_path: Path) -> None:
    @dataclass(frozen=True)
    class FailingData(RecordingLocation):
        def write_bytes(self, relative: str, data: bytes) -> None:
            if relative.startswith("data/"):
                raise OSError("disk on fire")
            super().write_bytes(relative, data)

    base = open_location(str(tmp_path / "out"), StorageSpec(retries=0))
    out = FailingData(base.uri, base.fs, base.root, base.attempts)
    context = _context(OutputSpec(uri=out.uri, format="parquet"))
    with pytest.raises(OSError, match="disk on fire"):
        write_shard(out, SHARD, _result(photos[:2]), context)
    assert out.writes == []
    assert commit.committed_shards(out) == set()


@pytest.mark.parametrize("fmt", ["parquet", "webdataset"])
def test_by_view_writes_one_object_per_view_committed_by_one_manifest(
    out: RecordingLocation, photos: list[SamplePhoto], fmt: str
) -> None:
    output = OutputSpec(uri=out.uri, format=fmt)
    result = _result(photos[:5])
    write_shard(out, SHARD, result, _context(output, "by_view"))
    ext = output_format(fmt).extension
    assert out.writes == [
        f"data/view=0/{SHARD}.{ext}",
        f"data/view=1/{SHARD}.{ext}",
        f"errors/{SHARD}.parquet",
        f"manifests/{SHARD}.parquet",
    ]
    metadata = commit.manifest_metadata(out, SHARD)
    assert metadata["rayaug.layout"] == "by_view"
    manifest = _read_table(out, commit.manifest_path(SHARD)).to_pylist()
    fmt_ = output_format(fmt)
    for view in (0, 1):
        (data,) = [o for o in fmt_.objects(SHARD, metadata) if o.view == view]
        images = fmt_.read_object(out, output, data)
        rows = [r for r in manifest if r["view"] == view]
        # the view's samples, sources in the seed's order, `index` their place in the object
        expected = sorted(
            (s for s in result.samples if s.view == view), key=lambda s: placement(7, s.source_key)
        )
        assert [r["sample_id"] for r in rows] == [s.sample_id for s in expected]
        assert [r["index"] for r in rows] == list(range(5))
        assert set(images) == {s.sample_id for s in expected} and data.samples == 5
        for row in rows:
            assert hashlib.sha256(images[row["sample_id"]]).hexdigest() == row["sha256"]
    assert len(fmt_.read_images(out, output, SHARD)) == 10


def test_a_shard_is_not_written_in_the_input_order(
    photos: list[SamplePhoto], tmp_path: Path
) -> None:
    """Sources sharing a shard come out in the seed's order: a unit cut from a Parquet file or
    a tar of one class after another would otherwise stay that way."""
    out = open_location(str(tmp_path / "out"), StorageSpec(retries=0))
    samples = _augmented(photos[:8], views=1)
    write_shard(
        out,
        SHARD,
        ShardOutput(samples=samples),
        _context(OutputSpec(uri=out.uri, format="parquet")),
    )
    keys = _read_table(out, commit.manifest_path(SHARD)).column("source_key").to_pylist()
    assert sorted(keys) == sorted(s.source_key for s in samples)
    assert keys != [s.source_key for s in samples]
    other = WriteContext(OutputSpec(uri=out.uri, format="parquet"), VERSIONS, 8, "by_source")
    write_shard(out, SHARD, ShardOutput(samples=samples), other)
    assert _read_table(out, commit.manifest_path(SHARD)).column("source_key").to_pylist() != keys
