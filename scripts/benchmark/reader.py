"""--reader: the epoch reader for training against webdataset's own pipeline and a bare decode
loop, on outputs of N sources x 8 views written by rayaug's real write stage (no Ray).

One epoch (view `EPOCH mod 8`) is delivered through a torch DataLoader with 1 and 2 workers,
with and without JPEG decode:

- rayaug: `open_output(out).epoch(e, batch_size=, num_workers=)` on the by_view layout
  (WebDataset and Parquet), local disk, and with --s3 on the loopback S3 server;
- webdataset: `wds.WebDataset(shards, shardshuffle, split by node and worker)`, selecting view
  e from each sample's JSON, a shuffle buffer, decode `rgb8`: on today's layout (by_source,
  every view in each tar: what a webdataset user has without rayaug's layout) and on by_view's
  view-e tars;
- bare loop: the same JPEGs decoded one after another from memory (rayaug's decoder), no I/O.

It prints delivered samples/s and bytes read per delivered byte (rayaug counts what it fetched;
webdataset reads every byte of the tars it opens). Figures on a small shared machine are noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
import uuid
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

VIEWS = 8
EPOCH = 3  # view 3
BATCH = 64
SHUFFLE_BUFFER = 1000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--reader",
        action="store_true",
        help="the epoch reader for training vs webdataset and a bare decode loop "
        "(--reader-sources N, --s3)",
    )
    parser.add_argument(
        "--reader-sources",
        type=int,
        default=1200,
        help="--reader: sources of the output (x 8 views; default 1200)",
    )


def run_reader(args: argparse.Namespace) -> int:
    # Lance, loaded here to write its output, warns at every fork; only the other readers'
    # DataLoader workers are forked, and they never touch Lance (its own are spawned).
    warnings.filterwarnings("ignore", "lance is not fork-safe", UserWarning)
    scratch = Path(tempfile.mkdtemp(prefix="rayaug-bench-reader."))
    server = None
    try:
        sources = _sources(args.reader_sources)
        outputs = {}
        for fmt, layout in (
            ("webdataset", "by_view"),
            ("webdataset", "by_source"),
            ("parquet", "by_view"),
            ("parquet", "by_source"),
            ("lance", "by_view"),
        ):
            outputs[f"{fmt} {layout}"] = _write(
                str(scratch / f"{fmt}-{layout}"), fmt, layout, sources
            )
        if args.s3:
            from .runners import S3_BUCKET, start_s3

            server = start_s3(scratch)
            os.environ.update(server.env())  # credentials for this process and its workers
            uri = f"s3://{S3_BUCKET}/reader-{uuid.uuid4().hex[:8]}"
            outputs["webdataset by_view s3"] = _write(uri, "webdataset", "by_view", sources, server)
        print(
            f"reader: {len(sources)} sources x {VIEWS} views; epoch {EPOCH} = view "
            f"{EPOCH % VIEWS}, {len(sources)} samples; DataLoader batch {BATCH}",
            flush=True,
        )
        results = _measure(outputs, sources, server)
        if args.json:
            args.json.write_text(json.dumps(results, indent=2))
        return 0
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(scratch, ignore_errors=True)


def _sources(count: int) -> list[tuple[str, str, bytes]]:
    """(key, label, JPEG) of `count` sources: real photos at ImageNet-like sizes; past the
    distinct photos, their bytes again under other keys (a key makes a sample; the decode
    cost is the photo's)."""
    from rayaug.sampledata import make_photos

    photos = list(make_photos(min(count, 400), seed=7, short_side=(224, 320)))
    return [
        (f"{photo.key}~{i}", photo.label, photo.jpeg)
        for i, photo in ((i, photos[i % len(photos)]) for i in range(count))
    ]


def _storage(server: Any) -> dict:
    return (
        {} if server is None else {"endpoint": f"http://{server.endpoint}", "region": server.region}
    )


def _write(
    uri: str, fmt: str, layout: str, sources: list[tuple[str, str, bytes]], server: Any = None
) -> str:
    """A committed, finished output of len(sources) x VIEWS samples, through write_shard: the
    photos stand in for augmented views (the bytes a reader reads and decodes are real)."""
    from rayaug import commit
    from rayaug.plan import JobPlan
    from rayaug.records import AugmentedSample, ShardOutput, WorkUnit, sample_seed
    from rayaug.sinks import WriteContext, write_shard
    from rayaug.spec import StorageSpec, dump_spec, parse_spec
    from rayaug.storage import open_location

    size = 100
    storage = _storage(server)
    out = open_location(uri, StorageSpec(**storage))
    spec = parse_spec(
        {
            "input": {"uri": "/bench"},
            "output": {"uri": uri, "format": fmt, "layout": layout, "shard_size": size},
            "views": VIEWS,
            "ops": [{"name": "horizontal_flip"}],
            "storage": storage,
        }
    )
    out.write_bytes(commit.SPEC, dump_spec(spec).encode())
    chunks = [sources[i : i + size] for i in range(0, len(sources), size)]
    units = [
        WorkUnit(f"part-{i:05d}", (str(i),), planned=len(c), views=(0, VIEWS))
        for i, c in enumerate(chunks)
    ]
    commit.write_json(out, commit.PLAN, JobPlan("folder", units, 0, "bench").to_json())
    commit.write_json(out, commit.FINGERPRINT, {"fingerprint": "bench", "versions": {}})
    context = WriteContext(spec.output, {"rayaug": "bench", "kornia": "-"}, spec.seed, layout)
    for unit, chunk in zip(units, chunks, strict=True):
        samples = [
            AugmentedSample(
                key,
                f"bench://{key}",
                view,
                sample_seed(0, key, view),
                label,
                [],
                (1, 1),
                jpeg,
                1,
                1,
            )
            for key, label, jpeg in chunk
            for view in range(VIEWS)
        ]
        result = ShardOutput(views=range(VIEWS), sources=len(chunk), samples=samples)
        write_shard(out, unit.shard, result, context)
    commit.write_json(out, commit.SUCCESS, {})
    return uri


# ---------------------------------------------------------------- measuring


def _count(batch: list) -> int:
    return len(batch)


def _timed(loader: Any) -> tuple[int, float]:
    started, delivered = time.perf_counter(), 0
    for count in loader:
        delivered += count
    return delivered, time.perf_counter() - started


def _rayaug(uri: str, server: Any, workers: int, decode: bool) -> dict:
    """Samples/s through a DataLoader; bytes read per delivered byte, counted in this process
    over the same parts the workers serve."""
    from torch.utils.data import DataLoader

    import rayaug
    from rayaug.spec import StorageSpec

    out = rayaug.open_output(uri, StorageSpec(**_storage(server)))
    with warnings.catch_warnings():  # by_source is read on purpose: its cost is the figure
        warnings.simplefilter("ignore", UserWarning)
        epoch = out.epoch(EPOCH, batch_size=BATCH, num_workers=workers, decode=decode)
        counted = out.epoch(EPOCH, batch_size=BATCH, num_workers=workers, decode=False)
    # Lance's runtime does not survive a fork: its workers are spawned (README)
    context = "spawn" if out.spec.output.format == "lance" else None
    loader = DataLoader(
        epoch,
        batch_size=BATCH,
        num_workers=workers,
        collate_fn=_count,
        multiprocessing_context=context,
    )
    delivered, wall = _timed(loader)
    served = sum(len(item["image"]) for w in range(workers) for item in counted.serve(w))
    return {
        "samples": delivered,
        "samples_per_s": delivered / wall,
        "bytes_per_delivered_byte": counted.stats.bytes_read / served,
    }


def _in_process(uri: str, decode: bool) -> dict:
    """The epoch iterated in this process, no DataLoader: the reader's own cost per sample
    (without decode) and how close decoding through it comes to the bare loop."""
    import rayaug

    epoch = rayaug.open_output(uri).epoch(EPOCH, decode=decode)
    started, delivered, served = time.perf_counter(), 0, 0
    for item in epoch:
        delivered += 1
        served += len(item["image"]) if not decode else 0
    wall = time.perf_counter() - started
    return {
        "samples": delivered,
        "samples_per_s": delivered / wall,
        "us_per_sample": 1e6 * wall / delivered,
        "bytes_per_delivered_byte": epoch.stats.bytes_read / served if served else 0.0,
    }


def _webdataset(folder: str, workers: int, decode: bool) -> dict:
    """webdataset's pipeline doing the same job: shard shuffle, split by node and worker,
    view e selected from each sample's JSON, a shuffle buffer, decode."""
    import webdataset as wds
    from torch.utils.data import DataLoader

    shards = sorted(str(p) for p in Path(folder).rglob("*.tar"))
    view = EPOCH % VIEWS

    def of_view(sample: dict) -> bool:
        return json.loads(sample["json"])["view"] == view

    pipeline = (
        wds.WebDataset(
            shards,
            shardshuffle=len(shards),
            nodesplitter=wds.split_by_node,
            workersplitter=wds.split_by_worker,
            seed=EPOCH,
        )
        .select(of_view)
        .shuffle(SHUFFLE_BUFFER)
    )
    if decode:
        pipeline = pipeline.decode("rgb8")
    pipeline = pipeline.to_tuple("jpg", "json").batched(BATCH, collation_fn=_count)
    delivered, wall = _timed(DataLoader(pipeline, batch_size=None, num_workers=workers))
    stored = sum(Path(s).stat().st_size for s in shards)
    served = sum(
        len(jpeg)
        for jpeg, meta in wds.WebDataset(shards, shardshuffle=False)
        .select(of_view)
        .to_tuple("jpg", "json")
    )
    return {
        "samples": delivered,
        "samples_per_s": delivered / wall,
        "bytes_per_delivered_byte": stored / served,
    }


def _bare_loop(sources: list[tuple[str, str, bytes]]) -> dict:
    """The same JPEGs decoded one after another from memory, rayaug's decoder, no I/O."""
    from rayaug import codec

    started = time.perf_counter()
    for _, _, jpeg in sources:
        codec.decode(codec.open_image(jpeg, 100_000_000))
    wall = time.perf_counter() - started
    return {
        "samples": len(sources),
        "samples_per_s": len(sources) / wall,
        "bytes_per_delivered_byte": 0.0,
    }


def _measure(outputs: dict[str, str], sources: list, server: Any) -> dict:
    runs: list[tuple[str, Callable[[], dict]]] = [
        ("bare decode loop (1 process, memory)", lambda: _bare_loop(sources))
    ]
    for name in ("webdataset by_view", "parquet by_view"):
        for decode in (False, True):
            runs.append(
                (
                    f"rayaug epoch, {name}: in process, {'decode' if decode else 'bytes'}",
                    lambda u=outputs[name], d=decode: _in_process(u, d),
                )
            )
    for workers in (1, 2):
        for decode in (False, True):
            mode = f"{workers} worker{'s' * (workers > 1)}, {'decode' if decode else 'bytes'}"
            for name, uri in outputs.items():
                store = server if name.endswith("s3") else None
                runs.append(
                    (
                        f"rayaug epoch, {name}: {mode}",
                        lambda u=uri, s=store, w=workers, d=decode: _rayaug(u, s, w, d),
                    )
                )
            for layout in ("by_source", "by_view"):
                folder = outputs[f"webdataset {layout}"]
                if layout == "by_view":
                    folder = f"{folder}/data/view={EPOCH % VIEWS}"
                runs.append(
                    (
                        f"webdataset pipeline, {layout} tars: {mode}",
                        lambda f=folder, w=workers, d=decode: _webdataset(f, w, d),
                    )
                )
    results = {}
    for name, run in runs:
        figures = run()
        results[name] = figures
        us = figures.get("us_per_sample")
        extra = "" if us is None else f"   {us:6.0f} us/sample"
        print(
            f"  {name:58s} {figures['samples_per_s']:9.0f} samples/s   "
            f"{figures['bytes_per_delivered_byte']:5.2f} bytes read per delivered byte{extra}",
            flush=True,
        )
    return results
