"""rayaug.epochs: the epoch reader for training, over outputs committed by the real write stage
(`sinks.write_shard`, every output format), read back as a training loop would: directly, and
through torch DataLoaders with worker processes, as ranks of one run.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import uuid
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import BUCKET
from PIL import Image
from torch.utils.data import DataLoader

import rayaug
from rayaug import commit
from rayaug.epochs import Split
from rayaug.errors import UsageError
from rayaug.plan import JobPlan
from rayaug.records import AugmentedSample, ShardOutput, WorkUnit, sample_seed
from rayaug.sinks import WriteContext, write_shard
from rayaug.spec import StorageSpec, dump_spec, parse_spec
from rayaug.storage import Location, open_location

VERSIONS = {"rayaug": "0.0-test", "kornia": "0.9.0"}
CLASSES = ("cat", "dog", "owl")
SOURCES = (10, 10, 9, 10, 10, 10, 8, 10)  # per shard: uneven, as quarantine leaves them
VIEWS = 3


def _jpeg(number: int) -> bytes:
    """A small image whose pixels (so bytes) are its own."""
    pixels = np.full((12, 16, 3), number % 251, np.uint8)
    pixels[0, : number % 16] = 255
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG", quality=95)
    return buffer.getvalue()


def _samples(shard: int, sources: int) -> list[AugmentedSample]:
    samples = []
    for i in range(sources):
        key = f"{CLASSES[(shard + i) % 3]}/{shard:02d}-{i:02d}.jpg"
        for view in range(VIEWS):
            samples.append(
                AugmentedSample(
                    source_key=key,
                    source_uri=f"mem://{key}",
                    view=view,
                    seed=sample_seed(5, key, view),
                    label=key.split("/")[0],
                    ops=[{"name": "hflip", "applied": view == 1, "params": {}}],
                    source_size=(12, 16),
                    encoded=_jpeg(1000 * shard + 10 * i + view),
                    height=12,
                    width=16,
                )
            )
    return samples


def write_output(
    out: Location,
    fmt: str,
    layout: str | None = None,
    finished: bool = True,
    sources: tuple[int, ...] = SOURCES,
    lost: frozenset[str] = frozenset(),
) -> None:
    """A committed output of len(sources) shards x VIEWS views, with its job's records;
    the samples `lost` (their ids) quarantined."""
    spec = parse_spec(
        {
            "input": {"uri": "/nowhere"},
            "output": {"uri": out.uri, "format": fmt, "layout": layout},
            "views": VIEWS,
            "seed": 5,
            "ops": [{"name": "horizontal_flip"}],
        }
    )
    out.write_bytes(commit.SPEC, dump_spec(spec).encode())
    units = [WorkUnit(f"part-{i:05d}", (f"{i}",), planned=n) for i, n in enumerate(sources)]
    commit.write_json(out, commit.PLAN, JobPlan("folder", units, 0, "f").to_json())
    commit.write_json(out, commit.FINGERPRINT, {"fingerprint": "f", "versions": VERSIONS})
    context = WriteContext(spec.output, VERSIONS, spec.seed, spec.layout)
    for i, n in enumerate(sources):
        kept = [sample for sample in _samples(i, n) if sample.sample_id not in lost]
        result = ShardOutput(views=range(VIEWS), sources=n, samples=kept)
        write_shard(out, f"part-{i:05d}", result, context)
    if finished:
        commit.write_json(out, commit.SUCCESS, {})


@pytest.fixture
def local(tmp_path: Path) -> Location:
    return open_location(str(tmp_path / "out"), StorageSpec(retries=0))


def _ids(items) -> list[str]:
    return [item["sample_id"] for item in items]


def _view_ids(view: int, sources: tuple[int, ...] = SOURCES) -> set[str]:
    return {s.sample_id for i, n in enumerate(sources) for s in _samples(i, n) if s.view == view}


def _sample_ids(batch: list[dict]) -> list[str]:
    return [item["sample_id"] for item in batch]


def _loader_ids(
    epoch, batch_size: int, workers: int, steps: int | None = None, context: str | None = None
) -> list[str]:
    """What a DataLoader over the epoch delivers (its first `steps` batches)."""
    loader = DataLoader(
        epoch,
        batch_size=batch_size,
        num_workers=workers,
        collate_fn=_sample_ids,
        multiprocessing_context=context,
    )
    ids = []
    for step, batch in enumerate(loader):
        if steps is not None and step == steps:
            break
        ids += batch
    return ids


@pytest.mark.parametrize("fmt", ["parquet", "webdataset", "lance"])
def test_two_ranks_of_two_workers_serve_every_sample_once(local: Location, fmt: str) -> None:
    write_output(local, fmt)
    out = rayaug.open_output(local.uri)
    ranks = [out.epoch(4, rank=r, world_size=2, batch_size=4, num_workers=2) for r in range(2)]
    context = "spawn" if fmt == "lance" else None  # Lance's runtime does not survive a fork
    served = [_loader_ids(epoch, 4, 2, context=context) for epoch in ranks]
    assert len(served[0]) == len(served[1]) == len(ranks[0]) == 39  # 77 samples, one padded
    counts = Counter(served[0] + served[1])
    assert set(counts) == _view_ids(4 % VIEWS)  # view epoch mod views, every sample
    assert sorted(counts.values()) == [1] * 76 + [2]  # the padding repeats one sample
    # decoded items: (H, W, 3) uint8 with their manifest columns
    item = next(iter(out.epoch(4, columns=("sample_id", "label", "ops", "targets"))))
    assert item["image"].shape == (12, 16, 3) and item["image"].dtype == np.uint8
    assert item["label"] == item["sample_id"].split("/")[0] and item["targets"] is None
    assert item["ops"] == [{"name": "hflip", "applied": True, "params": {}}]


def test_drop_last_gives_equal_ranks_without_repeats(local: Location) -> None:
    write_output(local, "webdataset")
    out = rayaug.open_output(local.uri)
    ranks = [_ids(out.epoch(0, rank=r, world_size=4, drop_last=True)) for r in range(4)]
    assert {len(ids) for ids in ranks} == {19}  # 77 // 4: one sample left out this epoch
    served = [s for ids in ranks for s in ids]
    assert len(set(served)) == len(served) == 76 and set(served) < _view_ids(0)


def test_the_order_is_the_seed_and_epoch_alone(local: Location) -> None:
    write_output(local, "parquet")
    out = rayaug.open_output(local.uri)
    first = _ids(out.epoch(0))
    assert first == _ids(out.epoch(0))
    assert _ids(out.epoch(3)) != first  # the next epoch over view 0 has another order
    assert sorted(s.removesuffix("#0") for s in _ids(out.epoch(3))) == sorted(
        s.removesuffix("#0") for s in first
    )
    assert _ids(out.epoch(0, seed=1)) != first
    # not one shard after another: the first 10 samples come from several shards and classes
    shards = {s.split("/")[1][:2] for s in first[:10]}
    assert len(shards) > 2 and len({s.split("/")[0] for s in first[:10]}) == 3
    in_order = _ids(out.epoch(0, shuffle=False))  # shards in name order, objects in order
    assert {s.split("/")[1][:2] for s in in_order[:10]} == {"00"}


def test_the_order_does_not_depend_on_world_size_or_workers(local: Location) -> None:
    write_output(local, "webdataset", sources=(10, 10, 10, 10, 10, 10, 10, 10))  # 80 = 4 x 20
    out = rayaug.open_output(local.uri)
    whole = _ids(out.epoch(2))
    for world in (2, 4):
        ranks = [out.epoch(2, rank=r, world_size=world) for r in range(world)]
        assert [s for epoch in ranks for s in _ids(epoch)] == whole
    # a rank's DataLoader workers, taken batch by batch in turn, cover its range in order
    ranks = [out.epoch(2, rank=r, world_size=2, batch_size=5, num_workers=2) for r in range(2)]
    served = [_loader_ids(epoch, 5, 2) for epoch in ranks]
    assert sorted(served[0] + served[1]) == sorted(whole)
    assert set(served[0]) == set(whole[:40])


def test_resume_at_a_third_from_two_ranks_onto_one(local: Location) -> None:
    write_output(local, "webdataset")
    out = rayaug.open_output(local.uri)
    ranks = [out.epoch(1, rank=r, world_size=2, batch_size=4, num_workers=2) for r in range(2)]
    steps = 3  # of 10: 12 of each rank's 39 samples, about a third
    before = [s for epoch in ranks for s in _loader_ids(epoch, 4, 2, steps)]
    assert len(before) == 24
    state = ranks[0].state_dict(samples=steps * 4)
    assert state == ranks[1].state_dict(samples=steps * 4)  # every rank saves the same
    resumed = out.epoch(1, world_size=1, batch_size=3, num_workers=2)
    resumed.load_state_dict(state)
    after = _loader_ids(resumed, 3, 2)
    assert len(after) == len(resumed) == 77 - 24
    assert sorted(before + after) == sorted(_view_ids(1))  # exactly the rest: none twice
    # and resumed directly, in this process, again onto two ranks
    again = [out.epoch(1, rank=r, world_size=2) for r in range(2)]
    for epoch in again:
        epoch.load_state_dict(state)
    rest = [s for epoch in again for s in _ids(epoch)]
    assert set(before + rest) == _view_ids(1) and len(rest) == 54  # 53 + one padded


def test_state_dict_counts_what_it_served_itself(local: Location) -> None:
    write_output(local, "parquet")
    out = rayaug.open_output(local.uri)
    epoch = out.epoch(0)
    items = iter(epoch)
    first = [next(items)["sample_id"] for _ in range(30)]
    resumed = out.epoch(0)
    resumed.load_state_dict(epoch.state_dict())
    assert first + _ids(resumed) == _ids(out.epoch(0))
    with pytest.raises(UsageError, match="state is of epoch=0, this epoch 3"):
        out.epoch(3).load_state_dict(epoch.state_dict())


@pytest.mark.parametrize("fmt", ["webdataset", "parquet"])
def test_a_by_view_epoch_reads_only_its_view_and_little_more(local: Location, fmt: str) -> None:
    write_output(local, fmt)
    out = rayaug.open_output(local.uri)
    view_bytes = sum(size for path, size in local.list("data/view=1", recursive=True))
    epoch = out.epoch(1, decode=False)
    delivered = sum(len(item["image"]) for item in epoch)
    assert epoch.stats.bytes_read == view_bytes  # whole objects of view 1, nothing else
    two = out.epoch(1, decode=False, num_workers=2, batch_size=4, window=3)  # a window is cut
    for worker in range(2):
        list(two.serve(worker))
    assert two.stats.ranged_reads > 0  # the windows cut between workers: only their samples
    assert delivered < two.stats.bytes_read < 1.05 * view_bytes


def test_lance_is_read_by_the_rows_an_epoch_serves(local: Location) -> None:
    """Lance records no byte spans but its reader takes rows: two workers sharing a cut window
    read only their own rows of its files, and by_source only the epoch's view."""
    write_output(local, "lance")
    two = rayaug.open_output(local.uri).epoch(
        1, decode=False, num_workers=2, batch_size=4, window=3
    )
    items = [item for worker in range(2) for item in two.serve(worker)]
    assert sorted(_ids(items)) == sorted(_view_ids(1))
    assert two.stats.ranged_reads > 0  # the cut window's files, by rows
    assert two.stats.bytes_read == sum(len(item["image"]) for item in items)  # each row once
    by_source = local.uri + "-by_source"
    write_output(open_location(by_source, StorageSpec(retries=0)), "lance", layout="by_source")
    with pytest.warns(UserWarning, match="reads each sample by a ranged read of its own"):
        epoch = rayaug.open_output(by_source).epoch(2, decode=False)
    items = list(epoch)
    assert sorted(_ids(items)) == sorted(_view_ids(2)) and epoch.stats.objects_read == 0
    assert epoch.stats.bytes_read == sum(len(item["image"]) for item in items)  # not 3x


def test_orphans_and_uncommitted_shards_are_never_read(local: Location) -> None:
    write_output(local, "parquet")
    path = "data/view=0/part-00009.parquet"  # a crashed shard's object: no manifest
    local.write_bytes(path, local.read_bytes("data/view=0/part-00000.parquet"))
    local.write_bytes("data/view=0/part-00001.parquet", b"not parquet: never opened")
    local.delete(commit.manifest_path("part-00001"))  # its data is an orphan now
    ids = _ids(rayaug.open_output(local.uri).epoch(0))
    assert set(ids) == _view_ids(0) - {s.sample_id for s in _samples(1, 10)}


def test_a_running_jobs_committed_shards_are_served_with_a_warning(local: Location) -> None:
    write_output(local, "parquet", finished=False)
    with pytest.warns(UserWarning, match="has not finished .* its 8 committed shards only") as seen:
        epoch = rayaug.open_output(local.uri).epoch(0)
    assert len(_ids(epoch)) == 77
    assert seen[0].filename == __file__  # the warning points at the caller's line


@pytest.mark.parametrize("fmt", ["parquet", "webdataset"])
def test_a_by_source_output_is_read_at_the_stated_cost(local: Location, fmt: str) -> None:
    write_output(local, fmt, layout="by_source")
    assert local.list("data") and not local.list("data/view=0")
    with pytest.warns(UserWarning, match="reads each sample by a ranged read of its own"):
        epoch = rayaug.open_output(local.uri).epoch(2, decode=False)
    delivered = sum(len(item["image"]) for item in epoch)
    assert sorted(item["sample_id"] for item in epoch) == sorted(_view_ids(2))
    stored = sum(size for _, size in local.list("data"))
    # the recorded spans: the view's samples alone, one ranged read each (iterated twice)
    assert epoch.stats.ranged_reads == 2 * 77 and epoch.stats.objects_read == 0
    assert delivered < epoch.stats.bytes_read / 2 < 0.4 * stored
    if fmt == "parquet":  # a span is the image and its 4-byte length (tar: 512-byte headers)
        assert epoch.stats.bytes_read / 2 == delivered + 4 * 77


def test_a_missing_or_corrupt_data_object_is_named_with_its_shard(local: Location) -> None:
    write_output(local, "webdataset")
    out = rayaug.open_output(local.uri)
    local.delete("data/view=0/part-00003.tar")
    with pytest.raises(
        UsageError,
        match=r"data object data/view=0/part-00003.tar of committed "
        r"shard part-00003 cannot be read",
    ):
        list(out.epoch(0, decode=False))
    local.write_bytes("data/view=1/part-00004.tar", b"\x00garbage" * 40)
    with pytest.raises(UsageError, match="part-00004.tar of committed shard part-00004"):
        list(out.epoch(1, decode=False))


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"epoch": -1}, "epoch must be ≥ 0"),
        ({"epoch": 0, "rank": 2, "world_size": 2}, "rank 2 is out of range for world_size 2"),
        ({"epoch": 0, "world_size": 0}, "world_size must be ≥ 1"),
        ({"epoch": 0, "columns": ("sample_id", "nope")}, "no manifest column nope"),
        ({"epoch": 0, "views_per_item": 0}, r"views_per_item must be in \[1, 3\]"),
        ({"epoch": 0, "views_per_item": 4}, r"views_per_item must be in \[1, 3\] .*, not 4"),
    ],
)
def test_out_of_range_arguments_are_refused(local: Location, arguments: dict, message: str) -> None:
    write_output(local, "parquet", sources=(3,))
    with pytest.raises(UsageError, match=message):
        rayaug.open_output(local.uri).epoch(**arguments)


def test_an_epoch_opened_for_workers_refuses_other_counts(local: Location) -> None:
    write_output(local, "parquet", sources=(3, 3))
    epoch = rayaug.open_output(local.uri).epoch(0, num_workers=2)
    with pytest.raises(UsageError, match="opened for 2 DataLoader workers"):
        list(epoch)
    with pytest.raises(Exception, match="the DataLoader has 1 workers"):
        list(DataLoader(epoch, batch_size=None, num_workers=1))


@pytest.mark.s3
def test_an_epoch_on_s3(s3) -> None:
    out = open_location(f"s3://{BUCKET}/epochs-{uuid.uuid4().hex[:8]}", StorageSpec(retries=1))
    write_output(out, "webdataset", sources=(6, 5, 6))
    view = rayaug.open_output(out.uri)
    ranks = [view.epoch(5, rank=r, world_size=2, num_workers=2, batch_size=2) for r in range(2)]
    served = [s for epoch in ranks for s in _loader_ids(epoch, 2, 2)]
    assert set(served) == _view_ids(2, (6, 5, 6)) and len(served) == 18  # 17, one padded
    epoch = view.epoch(5, num_workers=2, batch_size=2)
    items = [item for worker in range(2) for item in epoch.serve(worker)]
    assert len(items) == 17 and epoch.stats.ranged_reads > 0  # ranged GETs of the cut window
    manifest = {r["sample_id"]: r["sha256"] for r in view.manifest().to_pylist()}
    for item in view.epoch(5, decode=False):
        assert hashlib.sha256(item["image"]).hexdigest() == manifest[item["sample_id"]]


# ---------------------------------------------------------------- k views per item


def _expected_image(sample_id: str) -> bytes:
    """The bytes `_samples` stored for a sample id (`<class>/<shard>-<i>.jpg#<view>`)."""
    key, view = sample_id.rsplit("#", 1)
    shard, i = key.split("/")[1].removesuffix(".jpg").split("-")
    return _jpeg(1000 * int(shard) + 10 * int(i) + int(view))


def _pairs(batch: list[dict]) -> list[tuple[str, list[str], list[bytes]]]:
    return [(item["source_key"], item["sample_id"], item["image"]) for item in batch]


def _check_pairs(items, views: list[int]) -> list[str]:
    """Each item's views are `views` of one source, with that source's stored bytes; returns
    the items' source keys."""
    keys = []
    for key, ids, images in items:
        assert ids == [f"{key}#{v}" for v in views]
        assert images == [_expected_image(i) for i in ids]
        keys.append(key)
    return keys


@pytest.mark.parametrize(("fmt", "layout"), [("webdataset", "by_source"), ("parquet", "by_view")])
def test_two_views_per_item_over_two_ranks_of_two_workers(
    local: Location, fmt: str, layout: str
) -> None:
    write_output(local, fmt, layout=layout)
    out = rayaug.open_output(local.uri)
    columns = ("sample_id", "source_key", "label", "view")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # by_source's cost, stated
        ranks = [
            out.epoch(
                1,  # views 2 and 0 (1 * 2 = 2, 3 mod 3 = 0)
                rank=r,
                world_size=2,
                batch_size=4,
                num_workers=2,
                views_per_item=2,
                columns=columns,
                decode=False,
            )
            for r in range(2)
        ]
    served = []
    for epoch in ranks:
        loader = DataLoader(epoch, batch_size=4, num_workers=2, collate_fn=_pairs)
        served.append([item for batch in loader for item in batch])
    assert len(served[0]) == len(served[1]) == len(ranks[0]) == 39  # 77 sources, one padded
    keys = _check_pairs(served[0] + served[1], [2, 0])
    counts = Counter(keys)
    assert set(counts) == {i.removesuffix("#0") for i in _view_ids(0)}  # every source
    assert sorted(counts.values()) == [1] * 76 + [2]
    # a decoded item: the label once, per-view columns as lists, k decoded images
    item = next(iter(out.epoch(4, views_per_item=2, columns=columns)))  # views 2 and 0
    assert item["label"] == item["source_key"].split("/")[0] and item["view"] == [2, 0]
    assert [image.shape for image in item["image"]] == [(12, 16, 3)] * 2
    # the order is the seed's and epoch's: another epoch, another order; none by rank count
    whole = [key for key, *_ in _pairs(out.epoch(1, views_per_item=2, columns=columns))]
    assert sorted(whole) == sorted(set(keys)) and whole != [
        key for key, *_ in _pairs(out.epoch(4, views_per_item=2, columns=columns))
    ]


def test_two_views_per_item_resume_mid_epoch(local: Location) -> None:
    write_output(local, "webdataset", layout="by_source")
    out = rayaug.open_output(local.uri)
    options = {"views_per_item": 2, "columns": ("sample_id", "source_key"), "decode": False}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        ranks = [
            out.epoch(2, rank=r, world_size=2, batch_size=4, num_workers=2, **options)
            for r in range(2)
        ]
        before = []
        for epoch in ranks:
            loader = DataLoader(epoch, batch_size=4, num_workers=2, collate_fn=_pairs)
            before += [item for batch in itertools.islice(loader, 3) for item in batch]
        state = ranks[0].state_dict(samples=3 * 4)
        assert state["views_per_item"] == 2
        resumed = out.epoch(2, batch_size=3, num_workers=2, **options)  # onto one rank
        resumed.load_state_dict(state)
        loader = DataLoader(resumed, batch_size=3, num_workers=2, collate_fn=_pairs)
        after = [item for batch in loader for item in batch]
        keys = _check_pairs(before + after, [1, 2])  # epoch 2: views 4, 5 mod 3
        assert len(before) == 24 and len(after) == 77 - 24
        assert sorted(keys) == sorted(i.removesuffix("#0") for i in _view_ids(0))
        with pytest.raises(UsageError, match="state is of views_per_item=2, this epoch 1"):
            out.epoch(2, decode=False).load_state_dict(state)


def test_a_source_lacking_one_of_its_views_is_left_out_and_counted(local: Location) -> None:
    lost = _samples(2, 9)[3 * 4 + 1]  # shard 2, source 4, view 1 quarantined
    write_output(local, "parquet", lost=frozenset({lost.sample_id}))
    out = rayaug.open_output(local.uri)
    with pytest.warns(UserWarning, match="leaves out 1 sources that lack one of views \\[0, 1\\]"):
        epoch = out.epoch(0, views_per_item=2, columns=("source_key", "sample_id"), decode=False)
    assert epoch.left_out == 1 and len(epoch) == 76
    keys = _check_pairs(_pairs(epoch), [0, 1])
    assert lost.source_key not in keys and len(set(keys)) == 76
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # views 2 and 0: that source has both, none left out
        assert out.epoch(1, views_per_item=2).left_out == 0


def test_an_items_views_are_found_in_a_growths_shards(local: Location) -> None:
    """A grown output keeps a source's new views in the growth's shards: an item of views 2
    and 0 joins them with the first run's, by the work unit both read."""
    write_output(local, "parquet", sources=(6, 5))
    plan = commit.read_json(local, commit.PLAN)
    spec = rayaug.open_output(local.uri).output.spec
    context = WriteContext(spec.output, VERSIONS, spec.seed, "by_view")
    for i, n in enumerate((6, 5)):  # rewrite: views 0-1 in part-, view 2 in g1-part-
        samples = _samples(i, n)
        for shard, views in ((f"part-{i:05d}", (0, 1)), (f"g1-part-{i:05d}", (2,))):
            kept = [sample for sample in samples if sample.view in views]
            result = ShardOutput(views=range(views[0], views[-1] + 1), sources=n, samples=kept)
            write_shard(local, shard, result, context)
        plan["units"].append({**plan["units"][i], "shard": f"g1-part-{i:05d}", "views": [2, 3]})
    for path, _ in local.list("data/view=2"):
        if not path.rsplit("/", 1)[-1].startswith("g1-"):
            local.delete(path)
    commit.write_json(local, commit.PLAN, plan)
    epoch = rayaug.open_output(local.uri).epoch(
        1, views_per_item=2, columns=("source_key", "sample_id"), decode=False
    )
    keys = _check_pairs(_pairs(epoch), [2, 0])
    assert len(keys) == len(set(keys)) == 11 and epoch.left_out == 0
    assert [len(entry.shards) for entry in epoch.catalogue] == [2, 2]  # part- and g1-part-


# ---------------------------------------------------------------- the split alone


def test_split_pads_or_drops_to_equal_ranks_and_knows_what_is_left() -> None:
    split = Split(((0, 10),), world_size=3, num_workers=2, batch_size=2, drop_last=False)
    assert split.per_rank == 4 and split.parts() == [2, 2]
    parts = [split.part(r, w) for r in range(3) for w in range(2)]
    assert parts == [[(0, 2)], [(2, 4)], [(4, 6)], [(6, 8)], [(8, 10)], [(0, 2)]]  # padded
    assert split.left_after(2) == [(2, 4), (6, 8)]  # each rank's first worker batch served
    dropped = Split(((0, 10),), world_size=3, num_workers=0, batch_size=1, drop_last=True)
    assert dropped.per_rank == 3 and dropped.left_after(3) == [(9, 10)]  # the left-out one
    resumed = Split(((2, 4), (6, 8)), world_size=1, num_workers=0, batch_size=1, drop_last=False)
    assert resumed.part(0, 0) == [(2, 4), (6, 8)]


def test_torch_sees_an_iterable_dataset(local: Location) -> None:
    write_output(local, "parquet", sources=(3,))
    epoch = rayaug.open_output(local.uri).epoch(0)
    assert isinstance(epoch, torch.utils.data.IterableDataset) and len(epoch) == 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a finished by_view output: no warning
        rayaug.open_output(local.uri).epoch(0)


def test_an_epoch_as_a_ray_dataset(ray_cluster: str, local: Location) -> None:
    write_output(local, "webdataset")
    out = rayaug.open_output(local.uri)
    dataset = out.epoch_dataset(1, parts=3)
    rows = dataset.take_all()
    assert sorted(r["sample_id"] for r in rows) == sorted(_view_ids(1))  # each once
    assert {r["label"] for r in rows} == set(CLASSES)
    assert rows[0]["image"].shape == (12, 16, 3) and rows[0]["image"].dtype == np.uint8
    # the parts are the epoch reader's, in its order
    parts = [r["sample_id"] for r in dataset.take_all()]
    reader = out.epoch(1, num_workers=3)
    assert sorted(parts) == sorted(_ids(item for w in range(3) for item in reader.serve(w)))


def test_two_views_per_item_as_a_ray_dataset(ray_cluster: str, local: Location) -> None:
    """Ray Train gets the items `epoch()` serves: one row per source, its k views stacked."""
    write_output(local, "parquet", layout="by_source")
    out = rayaug.open_output(local.uri)
    columns = ("sample_id", "source_key", "label", "view")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # by_source's cost, stated
        dataset = out.epoch_dataset(1, parts=3, views_per_item=2, columns=columns)  # views 2, 0
        items = {i["source_key"]: i for i in out.epoch(1, views_per_item=2, columns=columns)}
    rows = dataset.take_all()
    keys = [row["source_key"] for row in rows]
    assert sorted(keys) == sorted(i.removesuffix("#0") for i in _view_ids(0))  # each once
    for row in rows:
        item = items[row["source_key"]]
        views = [f"{row['source_key']}#{v}" for v in (2, 0)]
        assert list(row["sample_id"]) == item["sample_id"] == views
        assert list(row["view"]) == [2, 0] and row["label"] == item["label"]
        assert row["image"].shape == (2, 12, 16, 3) and row["image"].dtype == np.uint8
        assert np.array_equal(row["image"], np.stack(item["image"]))


@pytest.mark.parametrize("fmt", ["webdataset", "parquet"])
def test_an_output_from_before_layouts_is_read_whole(local: Location, fmt: str) -> None:
    """Manifests written before layouts name no objects (nor spans): the shard's one object
    of every view is read whole (the cost the warning states), and the epoch is still exact."""
    import pyarrow.parquet as pq

    write_output(local, fmt, layout="by_source")
    for shard in commit.committed_shards(local):
        path = commit.manifest_path(shard)
        table = pq.read_table(io.BytesIO(local.read_bytes(path)))
        metadata = {
            k: v
            for k, v in table.schema.metadata.items()
            if b"layout" not in k and b"objects" not in k
        }
        buffer = io.BytesIO()
        pq.write_table(table.replace_schema_metadata(metadata), buffer)
        local.write_bytes(path, buffer.getvalue())
    with pytest.warns(UserWarning, match="reads 3x the bytes it serves"):
        epoch = rayaug.open_output(local.uri).epoch(1, decode=False)
    assert sorted(_ids(epoch)) == sorted(_view_ids(1))
    assert epoch.stats.bytes_read == sum(size for _, size in local.list("data"))
