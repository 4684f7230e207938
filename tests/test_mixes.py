"""rayaug.mixes: MixUp, CutMix and Mosaic — partners from the whole source list, the pixels and
labels they produce, and the determinism and replay promises with partners in play."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from rayaug import targets as label_targets
from rayaug.augment import Augmenter
from rayaug.errors import SpecError, StorageError
from rayaug.ops import CutMix, MixUp, Mosaic, Tile, draw_ops, from_records
from rayaug.partners import Partners
from rayaug.records import ShardOutput, SourceSample, Targets
from rayaug.sources import SourceIndex, list_input, read_unit
from rayaug.spec import JobSpec, parse_spec
from rayaug.storage import open_location

MIXED_PIPELINE = [
    {"name": "random_resized_crop", "size": [64, 80], "scale": [0.4, 1.0]},
    {"name": "mosaic", "p": 0.5},
    {"name": "horizontal_flip", "p": 0.5},
    {"name": "cutmix", "p": 0.5},
    {"name": "rotation", "degrees": 10, "p": 0.5},
    {"name": "mixup", "alpha": 0.4, "p": 0.5},
    {"name": "color_jitter", "brightness": 0.3, "hue": 0.05, "p": 0.5},
]


def _spec(folder: Path, ops: list[dict], **changes) -> JobSpec:
    data = {
        "input": {"uri": str(folder)},
        "output": {"uri": "unused", "image_format": "png"},  # lossless: bytes show every pixel
        "views": 2,
        "seed": 11,
        "ops": ops,
        "execution": {"batch_size": 32},
    }
    return parse_spec(data | changes)


class Input:
    """An image folder read as the job reads it: its units, and the index partners come from."""

    def __init__(self, folder: Path, spec: JobSpec, shard_size: int = 6) -> None:
        self.location = open_location(str(folder), spec.storage)
        self.spec = spec
        listing = list_input(self.location, spec.input, shard_size, spec.seed)
        self.units = listing.units
        self.index = SourceIndex(self.location, spec.input, listing.format, listing.units)

    def unit(self, number: int) -> list[SourceSample]:
        return read_unit(self.location, self.spec.input, "folder", self.units[number])

    def augment(self, sources: list[SourceSample], **execution) -> ShardOutput:
        spec = self.spec.model_copy(
            update={"execution": self.spec.execution.model_copy(update=execution)}
        )
        return Augmenter(spec, "cpu", Partners(self.index)).augment(sources)


def _hashes(output: ShardOutput) -> dict[str, str]:
    return {s.sample_id: s.sha256 for s in output.samples}


def _mix_records(output: ShardOutput) -> list[tuple[str, dict]]:
    return [
        (s.source_key, r)
        for s in output.samples
        for r in s.ops
        if r["op"] in ("mixup", "cutmix", "mosaic")
    ]


@pytest.fixture(scope="module")
def mixed_folder(photos, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rayaug import sampledata

    root = tmp_path_factory.mktemp("mixes") / "input"
    sampledata.write_folder(photos, root)
    return root


@pytest.fixture(scope="module")
def mixed(mixed_folder: Path) -> tuple[Input, ShardOutput]:
    """The first shard (6 of 24 sources), every mix at p=0.5 among other ops, batch 32."""
    source = Input(mixed_folder, _spec(mixed_folder, MIXED_PIPELINE))
    return source, source.augment(source.unit(0))


# ---------------------------------------------------------------- determinism and replay


@pytest.mark.parametrize("batch_size", [1, 5])
def test_same_bytes_whatever_the_batch_size_and_order(mixed, batch_size: int) -> None:
    source, reference = mixed
    assert reference.quarantined == []
    assert {r["op"] for _, r in _mix_records(reference)} == {"mixup", "cutmix", "mosaic"}
    shuffled = source.unit(0)[::-1]
    output = source.augment(shuffled, batch_size=batch_size)
    assert _hashes(output) == _hashes(reference)
    by_id = {s.sample_id: s.ops for s in output.samples}
    assert all(by_id[s.sample_id] == s.ops for s in reference.samples)


def test_every_mixed_sample_replays_to_identical_bytes(mixed) -> None:
    source, reference = mixed
    by_key = {s.key: s for s in source.unit(0)}
    augmenter = Augmenter(source.spec, "cpu", Partners(source.index))
    for sample in reference.samples:
        records = json.loads(json.dumps(sample.ops))  # as read back from a manifest
        replayed = augmenter.replay(
            by_key[sample.source_key], sample.view, sample.seed, from_records(records)
        )
        assert replayed == sample.image, sample.sample_id


def test_partners_come_from_all_sources_and_are_recorded(mixed) -> None:
    source, reference = mixed
    every_key = {source.index.read(i).key for i in range(len(source.index))}
    in_shard = {s.key for s in source.unit(0)}
    partners = []
    for key, record in _mix_records(reference):
        params = record["params"]
        count = {"mixup": 1, "cutmix": 1, "mosaic": 3}[record["op"]]
        assert len(params["picks"]) == len(params["partners"]) == count
        assert len(params["weights"]) == count + 1
        assert sum(params["weights"]) == pytest.approx(1.0)
        for partner in params["partners"]:
            assert partner["key"] in every_key and partner["key"] != key
            assert partner["uri"] == source.location.uri_of(partner["key"])
            partners.append(partner["key"])
    assert set(partners) - in_shard, "partners are not only the shard's own sources"
    assert len(set(partners)) > 10


def test_the_soft_label_is_the_weighted_sum_of_the_labels(mixed_folder: Path) -> None:
    spec = _spec(mixed_folder, [{"name": "resize", "size": 32}, {"name": "mixup"}])
    source = Input(mixed_folder, spec)
    output = source.augment(source.unit(1))
    labels = {source.index.read(i).key: source.index.read(i).label for i in range(24)}
    for sample in output.samples:
        (record,) = [r for r in sample.ops if r["op"] == "mixup"]
        lam, partner = record["params"]["weights"][0], record["params"]["partners"][0]["key"]
        expected: dict = {}
        for label, weight in ((sample.label, lam), (labels[partner], 1 - lam)):
            expected[label] = expected.get(label, 0.0) + weight
        assert sample.soft_label == pytest.approx(expected)
        assert sample.soft_label_rows == [
            {"label": k, "weight": v} for k, v in sample.soft_label.items()
        ]


def test_unmixed_samples_have_no_soft_label(mixed) -> None:
    _, reference = mixed
    for sample in reference.samples:
        mixed_ops = [r for r in sample.ops if r["op"] in ("mixup", "cutmix", "mosaic")]
        assert (sample.soft_label is None) == (not mixed_ops)


# ---------------------------------------------------------------- the pixels and the targets

SIZE = (40, 60)  # (height, width) of the solid-colour sources below
COLOURS = [(220, 30, 30), (30, 30, 220), (30, 200, 30), (230, 230, 40), (200, 40, 200)]


def _png(colour: tuple[int, int, int], size: tuple[int, int] = SIZE) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (size[1], size[0]), colour).save(buffer, "PNG")
    return buffer.getvalue()


def _mask(class_id: int, size: tuple[int, int] = SIZE) -> bytes:
    return label_targets.mask_png(np.full(size, class_id, np.uint8))


def _solid_folder(root: Path) -> Path:
    """Five sources, each one colour, labelled by colour name."""
    for number, colour in enumerate(COLOURS):
        folder = root / f"c{number}"
        folder.mkdir(parents=True)
        (folder / "a.png").write_bytes(_png(colour))
    return root


class Solid:
    """The solid-colour sources with a whole-image box (class = number) and a mask of it."""

    def __init__(self, root: Path, ops: list[dict]) -> None:
        self.spec = _spec(_solid_folder(root), ops, views=4)
        self.input = Input(root, self.spec, shard_size=5)
        self.index = _WithTargets(self.input.index)

    def run(self) -> ShardOutput:
        sources = [self.index.read(i) for i in range(len(self.index))]
        return Augmenter(self.spec, "cpu", Partners(self.index)).augment(sources)


class _WithTargets:
    """The index, each source with a whole-image box and a mask of its number."""

    def __init__(self, index: SourceIndex) -> None:
        self.index = index

    def __len__(self) -> int:
        return len(self.index)

    def read(self, number: int) -> SourceSample:
        found = self.index.read(number)
        cls = int(found.key[1])
        box = Targets([[0.0, 0.0, float(SIZE[1]), float(SIZE[0])]], [cls], [], _mask(cls + 1))
        return SourceSample(found.key, found.uri, found.data, found.label, targets=box)

    def find(self, uri: str, key: str) -> SourceSample:
        return self.read(next(i for i in range(len(self)) if self.index.read(i).key == key))


def _pixels(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).astype(int)


def _colour_of(key: str) -> np.ndarray:
    return np.array(COLOURS[int(key[1])])


def test_mixup_blends_the_two_images_with_its_weight(tmp_path: Path) -> None:
    solid = Solid(tmp_path, [{"name": "mixup"}])
    for sample in _without_masks(solid).samples:
        params = sample.ops[0]["params"]
        lam, partner = params["weights"][0], params["partners"][0]["key"]
        expected = lam * _colour_of(sample.source_key) + (1 - lam) * _colour_of(partner)
        assert np.abs(_pixels(sample.image) - expected).max() <= 1.0
        assert sample.targets.classes == [int(sample.source_key[1]), int(partner[1])]


def _without_masks(solid: Solid) -> ShardOutput:
    """MixUp cannot blend masks: the same sources with boxes only."""

    class BoxesOnly(_WithTargets):
        def read(self, number: int) -> SourceSample:
            found = super().read(number)
            boxes = Targets(found.targets.boxes, found.targets.classes)
            return SourceSample(found.key, found.uri, found.data, found.label, targets=boxes)

    solid.index = BoxesOnly(solid.input.index)
    return solid.run()


def test_mixup_of_masks_is_quarantined_with_the_reason(tmp_path: Path) -> None:
    output = Solid(tmp_path, [{"name": "mixup"}]).run()
    assert output.samples == [] and len(output.quarantined) == 20
    assert {q.stage for q in output.quarantined} == {"augment"}
    assert "mixup cannot blend segmentation masks" in output.quarantined[0].message


def test_cutmix_pastes_the_partner_inside_its_box(tmp_path: Path) -> None:
    output = Solid(tmp_path, [{"name": "cutmix"}]).run()
    assert len(output.samples) == 20
    for sample in output.samples:
        params = sample.ops[0]["params"]
        x0, y0, x1, y1 = params["box"]
        partner = params["partners"][0]["key"]
        pixels = _pixels(sample.image)
        inside = np.zeros(SIZE, bool)
        inside[y0:y1, x0:x1] = True
        assert np.abs(pixels[inside] - _colour_of(partner)).max() <= 1
        assert np.abs(pixels[~inside] - _colour_of(sample.source_key)).max() <= 1
        share = (x1 - x0) * (y1 - y0) / (SIZE[0] * SIZE[1])
        assert params["weights"] == pytest.approx([1 - share, share])
        # Both boxes cover their whole image: the partner's is cut to the pasted region and
        # the sample's is kept whole; each stays while MIN_VISIBLE of it can be seen.
        boxes = dict(zip(sample.targets.classes, sample.targets.boxes, strict=True))
        visible = label_targets.MIN_VISIBLE
        assert (int(partner[1]) in boxes) == (share >= visible and min(x1 - x0, y1 - y0) >= 1)
        if int(partner[1]) in boxes:
            assert boxes[int(partner[1])] == [x0, y0, x1, y1]
        assert (int(sample.source_key[1]) in boxes) == (1 - share >= visible)
        mask = label_targets.mask_ids(sample.targets.mask)
        assert (mask[inside] == int(partner[1]) + 1).all()
        assert (mask[~inside] == int(sample.source_key[1]) + 1).all()


def test_mosaic_fills_four_cells_with_four_images(tmp_path: Path) -> None:
    output = Solid(tmp_path, [{"name": "mosaic", "centre": [0.4, 0.6]}]).run()
    assert len(output.samples) == 20
    for sample in output.samples:
        params = sample.ops[0]["params"]
        keys = [sample.source_key] + [p["key"] for p in params["partners"]]
        cells = Mosaic.tiles(params, SIZE)
        assert [tile.image for tile in cells] == [0, 1, 2, 3]
        pixels, mask = _pixels(sample.image), label_targets.mask_ids(sample.targets.mask)
        for tile in cells:
            x0, y0, x1, y1 = tile.rect
            # away from the seams (bilinear edges), each cell is its image's colour
            core = pixels[y0 + 1 : y1 - 1, x0 + 1 : x1 - 1]
            assert np.abs(core - _colour_of(keys[tile.image])).max() <= 1
            assert (mask[y0:y1, x0:x1] == int(keys[tile.image][1]) + 1).all()
        # every image's whole-image box becomes its cell
        placed = list(zip(sample.targets.classes, sample.targets.boxes, strict=True))
        assert placed == [(int(keys[t.image][1]), pytest.approx(list(t.rect))) for t in cells]
        areas = [(t.rect[2] - t.rect[0]) * (t.rect[3] - t.rect[1]) / 2400 for t in cells]
        assert params["weights"] == pytest.approx(areas)


def test_an_unreadable_partner_gives_way_to_the_next_source(mixed_folder: Path) -> None:
    spec = _spec(mixed_folder, [{"name": "resize", "size": 32}, {"name": "cutmix"}], views=8)
    source = Input(mixed_folder, spec, shard_size=24)
    corrupt = source.index.read(3)
    original = source.index.read

    def read(number: int) -> SourceSample:
        found = original(number)
        return (
            SourceSample(found.key, found.uri, b"not an image", found.label)
            if number == 3
            else found
        )

    source.index.read = read  # one source of the input is corrupt
    output = source.augment([original(i) for i in range(24) if i != 3])
    assert output.quarantined == []
    picked_at = [int(r["params"]["picks"][0] * 24) for _, r in _mix_records(output)]
    assert 3 in picked_at, "no pick landed on the corrupt source: choose another seed"
    for (key, record), at in zip(_mix_records(output), picked_at, strict=True):
        partner = record["params"]["partners"][0]["key"]
        assert partner != corrupt.key
        if at == 3 and key != original(4).key:
            assert partner == original(4).key  # the next source, deterministically


def test_a_storage_failure_on_a_partner_fails_the_shard_instead_of_quarantining(
    mixed_folder: Path,
) -> None:
    spec = _spec(mixed_folder, [{"name": "resize", "size": 32}, {"name": "mixup"}])
    source = Input(mixed_folder, spec)

    def read(number: int) -> SourceSample:
        raise StorageError("reading s3://in/x.jpg: the storage kept failing")

    source.index.read = read
    with pytest.raises(StorageError):  # not quarantine rows: `rayaug resume` redoes the shard
        source.augment(source.unit(0))


# ---------------------------------------------------------------- the ops' geometry


def test_tiles_cover_the_canvas_once_and_fit_their_images() -> None:
    for seed in range(50):
        canvas = (int(30 + seed), int(90 - seed))
        params = Mosaic().layout(np.random.default_rng(seed), canvas)
        covered = np.zeros(canvas, int)
        for tile in Mosaic.tiles(params, canvas):
            x0, y0, x1, y1 = tile.rect
            covered[y0:y1, x0:x1] += 1
            # cover fit: the source's centre lands on the cell's centre, its corners outside
            corners = np.array([[-0.5, -0.5, 1], [99.5, 49.5, 1]]) @ tile.placement((50, 100)).T
            assert corners[0, 0] <= x0 - 0.5 + 1e-9 and corners[1, 0] >= x1 - 0.5 - 1e-9
            assert corners[0, 1] <= y0 - 0.5 + 1e-9 and corners[1, 1] >= y1 - 0.5 - 1e-9
        assert (covered == 1).all()
        assert sum(params["weights"]) == pytest.approx(1.0)


def test_cutmix_weights_match_the_box_area() -> None:
    for seed in range(50):
        params = CutMix().layout(np.random.default_rng(seed), (48, 64))
        x0, y0, x1, y1 = params["box"]
        assert 0 <= x0 <= x1 <= 64 and 0 <= y0 <= y1 <= 48
        assert params["weights"][1] == pytest.approx((x1 - x0) * (y1 - y0) / (48 * 64))
        assert CutMix.tiles(params, (48, 64)) == (
            [Tile(1, (0, 0, 64, 48), (x0, y0, x1, y1))] if x1 > x0 and y1 > y0 else []
        )


def test_mix_draws_are_per_sample_and_seeded() -> None:
    pipeline = [MixUp(), CutMix(p=0.5), Mosaic(p=0.5)]
    plans = [draw_ops(pipeline, seed, (64, 64)) for seed in range(20)]
    assert plans == [draw_ops(pipeline, seed, (64, 64)) for seed in range(20)]
    assert len({json.dumps([s.record() for s in plan]) for plan in plans}) == 20
    assert all(0 <= pick < 1 for plan in plans for s in plan for pick in s.params["picks"])


# ---------------------------------------------------------------- the spec, and a real job


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"input": {"uri": "in", "format": "webdataset"}}, "ops[0]: mosaic picks partners"),
        ({"input": {"uri": "in", "masks": "masks"}, "ops": [{"name": "mixup"}]}, "cannot blend"),
        ({"ops": [{"name": "mosaic", "centre": [0.2, 1.0]}]}, "ops[0].centre: must be [low, high]"),
        ({"ops": [{"name": "mixup", "alpha": 0}]}, "ops[0].alpha"),
        ({"ops": [{"name": "one_of", "ops": [{"name": "mixup"}]}]}, "ops[0].ops[0]"),
    ],
)
def test_spec_refuses_mixes_it_cannot_run(changes: dict, words: str) -> None:
    data = {"input": {"uri": "in"}, "output": {"uri": "out"}, "ops": [{"name": "mosaic"}]}
    with pytest.raises(SpecError) as caught:
        parse_spec(data | changes)
    assert words in str(caught.value)


def test_a_mixed_job_end_to_end_from_the_cli(ray_cluster: str, tmp_path: Path, photos) -> None:
    from click.testing import CliRunner

    from rayaug import sampledata
    from rayaug.cli import main

    sampledata.write_parquet(photos, tmp_path / "input", rows_per_file=8)
    job = {
        "input": {"uri": str(tmp_path / "input")},
        "output": {"uri": str(tmp_path / "out"), "shard_size": 8, "size": 48},
        "views": 2,
        "seed": 3,
        "ops": [{"name": "resize", "size": 64}, {"name": "mosaic"}, {"name": "mixup", "p": 0.5}],
        "execution": {"batch_size": 8, "concurrency": 1},
    }
    (tmp_path / "job.yaml").write_text(json.dumps(job))

    def rayaug(*args: str):
        return CliRunner().invoke(main, list(args), catch_exceptions=False)

    result = rayaug("run", str(tmp_path / "job.yaml"))
    assert result.exit_code == 0, result.output
    assert "done: 48 samples in 3 shards, 0 quarantined" in result.output
    manifest = pq.read_table(tmp_path / "out" / "manifests").to_pylist()
    data = pq.read_table(tmp_path / "out" / "data" / "view=1" / "part-00001.parquet").to_pylist()
    for row in data:
        assert row["soft_label"] and sum(e["weight"] for e in row["soft_label"]) == pytest.approx(1)
    files = {row["source_uri"] for row in manifest}
    partner_files = set()
    for row in manifest:
        for record in json.loads(row["ops"]):
            partner_files |= {p["uri"] for p in record["params"].get("partners", [])}
    assert len(files) == 3 and partner_files == files  # partners from every Parquet file
    for row in manifest[::7]:
        replayed = rayaug("replay", str(tmp_path / "out"), row["sample_id"])
        assert replayed.exit_code == 0 and "identical" in replayed.output, replayed.output
    stats = rayaug("inspect", str(tmp_path / "out"), "--stats")
    assert stats.exit_code == 0 and "soft share" in stats.output
    verify = rayaug("inspect", str(tmp_path / "out"), "--verify")
    assert verify.exit_code == 0 and "verify: OK" in verify.output

    sampledata.write_webdataset(photos[:4], tmp_path / "tars")
    job |= {"input": {"uri": str(tmp_path / "tars")}, "output": {"uri": str(tmp_path / "o2")}}
    (tmp_path / "wds.yaml").write_text(json.dumps(job))
    refused = rayaug("run", str(tmp_path / "wds.yaml"))
    assert refused.exit_code == 2 and "needs random access" in refused.output
    assert len(refused.output.strip().splitlines()) == 1
