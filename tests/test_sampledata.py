"""rayaug.sampledata: real photos, deterministic, readable by the usual readers."""

from __future__ import annotations

import io
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import webdataset as wds
from PIL import Image

from rayaug import sampledata
from rayaug.sampledata import SamplePhoto, make_photos

N = 23  # more than the number of classes, not a multiple of the shard sizes used below


@pytest.fixture(scope="module")
def photos() -> list[SamplePhoto]:
    return list(make_photos(N, seed=7))


def _check_image(jpeg: bytes, short_side: tuple[int, int] = (300, 600)) -> None:
    image = Image.open(io.BytesIO(jpeg))
    image.load()
    assert (image.format, image.mode) == ("JPEG", "RGB")
    assert short_side[0] <= min(image.size) <= short_side[1]


def test_photos_are_real_labelled_and_in_range(photos: list[SamplePhoto]) -> None:
    classes = set(sampledata.source_photos())
    assert {"astronaut", "coffee", "chelsea", "rocket"} <= classes
    assert {p.label for p in photos} == classes  # round-robin: every class appears
    assert len({p.key for p in photos}) == N
    for photo in photos:
        assert photo.key.startswith(f"{photo.label}/") and photo.key.endswith(".jpg")
        _check_image(photo.jpeg)


def test_deterministic_for_a_seed(photos: list[SamplePhoto]) -> None:
    assert list(make_photos(N, seed=7)) == photos
    assert list(make_photos(5, seed=7)) == photos[:5]  # sample i depends on (seed, i) only
    assert [p.jpeg for p in make_photos(5, seed=8)] != [p.jpeg for p in photos[:5]]


def test_custom_ranges() -> None:
    for photo in make_photos(6, seed=1, short_side=(64, 80), quality=(50, 50)):
        _check_image(photo.jpeg, (64, 80))


def test_write_folder(photos: list[SamplePhoto], tmp_path: Path) -> None:
    assert sampledata.write_folder(photos, tmp_path) == N
    files = sorted(tmp_path.rglob("*.jpg"))
    assert len(files) == N
    for photo in photos:
        path = tmp_path / photo.label / Path(photo.key).name
        assert path.read_bytes() == photo.jpeg
        _check_image(path.read_bytes())


def test_write_parquet(photos: list[SamplePhoto], tmp_path: Path) -> None:
    assert sampledata.write_parquet(photos, tmp_path, rows_per_file=10) == N
    assert [p.name for p in sorted(tmp_path.iterdir())] == [
        "part-00000.parquet",
        "part-00001.parquet",
        "part-00002.parquet",
    ]
    table = pq.read_table(sorted(tmp_path.glob("*.parquet")))  # keeps file order
    assert str(table.schema.field("image").type) == "binary"
    assert [str(table.schema.field(c).type) for c in ("key", "label")] == ["string", "string"]
    rows = [SamplePhoto(r["key"], r["label"], r["image"]) for r in table.to_pylist()]
    assert rows == photos


def test_write_webdataset(photos: list[SamplePhoto], tmp_path: Path) -> None:
    assert sampledata.write_webdataset(photos, tmp_path, samples_per_tar=10) == N
    shards = sorted(str(p) for p in tmp_path.glob("shard-*.tar"))
    assert [Path(s).name for s in shards] == [
        "shard-00000.tar",
        "shard-00001.tar",
        "shard-00002.tar",
    ]
    # The label is text (`.txt`): webdataset's decoder would int() a `.cls` member.
    samples = list(wds.WebDataset(shards, shardshuffle=False).decode("pil"))
    assert [s["__key__"] for s in samples] == [p.key.removesuffix(".jpg") for p in photos]
    for sample, photo in zip(samples, photos, strict=True):
        assert sample["txt"] == photo.label
        assert sample["jpg"].size == Image.open(io.BytesIO(photo.jpeg)).size


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sampledata.main([str(tmp_path / "out"), "--n", "3", "--format", "webdataset", "--seed", "2"])
    assert "wrote 3 photos" in capsys.readouterr().out
    assert (tmp_path / "out" / "shard-00000.tar").exists()
