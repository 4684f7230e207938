"""--augment-only: `rayaug.augment.Augmenter` alone, in this process, no Ray (importing Ray here
fails on purpose): the sources read into memory first (not timed), then decode -> ops ->
encode per recipe and views, shard by shard as an actor gets them, timed; prints samples/s.
With --loop, each shard's sources then go through Albumentations' loop in this process too
(`pool.albu_samples`, the pool runner's own code), timed apart: the two per core, side by side.
The GPU check (scripts/gpu-check) runs this on a lent GPU machine with --device cuda."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import math
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ..photos import Photos, describe, own_photos, photos_for
from ..recipes import RECIPES, Recipe, rayaug_spec
from ..report import machine_info, print_machine
from . import pool


def run_augment_only(args: argparse.Namespace) -> int:
    sys.modules["ray"] = None  # type: ignore[assignment]  # proof: importing Ray here fails
    gpu_name = cuda_name(args.device)
    if gpu_name == "":
        print(f"--device {args.device}: torch sees no CUDA device", file=sys.stderr)
        return 2
    if args.loop and importlib.util.find_spec("albumentations") is None:
        print("--loop: albumentations is not installed (the bench extra)", file=sys.stderr)
        return 2
    info = machine_info(gpu_name)
    print_machine(info)
    scratch = Path(tempfile.mkdtemp(prefix="rayaug-bench-augment."))
    results: dict[str, dict[str, dict[str, Any]]] = {}
    inputs: dict[str, str] = {}
    try:
        for views in args.views:
            photos = source_photos(args, views, scratch)
            inputs[str(views)] = describe(photos)
            print(
                f"augment stage alone on {args.device}, no Ray, views {views}: "
                f"{inputs[str(views)]} x {args.repeat}, batch size {args.batch_size}",
                flush=True,
            )
            results[str(views)] = {
                key: augment_recipe(RECIPES[key], photos, views, args, scratch)
                for key in args.recipes
            }
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if args.json:
        write_json(args, info, inputs, results)
    return (
        1
        if any(
            r["quarantined"] or r["samples"] != r["expected"]
            for by_recipe in results.values()
            for r in by_recipe.values()
        )
        else 0
    )


def cuda_name(device: str) -> str | None:
    """None on the CPU; the GPU's name, or "" when torch sees no CUDA device."""
    if device == "cpu":
        return None
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else ""


def source_photos(args: argparse.Namespace, views: int, scratch: Path) -> Photos:
    """N samples = sources x views x repeat: the sources, or the user's whole folder."""
    if args.input:
        return own_photos(args.input, scratch)
    return photos_for(math.ceil(args.n / (views * args.repeat)), args.photos)


def augment_recipe(
    recipe: Recipe, photos: Photos, views: int, args: argparse.Namespace, scratch: Path
) -> dict[str, Any]:
    from rayaug.spec import parse_spec

    spec_data = rayaug_spec(
        recipe,
        photos.images,
        str(scratch / "out"),
        photos.sources,
        views,
        args.device != "cpu",
        {},
        photos.annotations,
    )
    spec_data["execution"]["batch_size"] = args.batch_size
    spec = parse_spec(spec_data, f"recipe {recipe.key}")
    if args.loop:
        pool.start_albumentations(recipe, views, str(photos.annotations) if recipe.boxes else None)
    result = time_augmenter(spec, args.device, args.repeat, args.loop)
    result |= {
        "recipe": recipe.key,
        "views": views,
        "sources": photos.sources,
        "expected": photos.sources * views * args.repeat,
    }
    print(
        f"  {recipe.key} views {views:<3} {recipe.title:58} "
        f"{result['samples_per_second']:>9,.1f} samples/s  ({result['samples']} in "
        f"{result['seconds']:.2f} s; warm-up {result['warmup_seconds']:.2f} s, read "
        f"{result['read_seconds']:.2f} s untimed, {result['quarantined']} quarantined)",
        flush=True,
    )
    if args.loop:
        loop = result["loop"]
        print(
            f"  {recipe.key} views {views:<3} {'Albumentations, each source decoded once':58} "
            f"{loop['samples_per_second']:>9,.1f} samples/s  ({loop['samples']} in "
            f"{loop['seconds']:.2f} s, shard by shard after rayaug's); rayaug ÷ loop "
            f"{result['ratio']:.2f}",
            flush=True,
        )
    return result


def time_augmenter(spec: Any, device: str, repeat: int, loop: bool = False) -> dict[str, Any]:
    """Read every unit (untimed), one warm-up batch (timed apart), then every unit, timed.
    With `loop` (this process set up by `pool.start_albumentations`), each unit's sources go
    through the Albumentations loop right after rayaug's stage, timed apart: the two take
    turns shard by shard, so a drift of the machine reaches both."""
    from rayaug import allocator, sources, storage
    from rayaug.augment import Augmenter

    allocator.keep_freed_buffers()  # as in the job's actors
    started = time.monotonic()
    location = storage.open_location(spec.input.uri, spec.storage)
    listing = sources.list_input(location, spec.input, spec.output.shard_size, spec.seed)
    units = [
        sources.read_unit(location, spec.input, listing.format, unit) for unit in listing.units
    ]
    # Each source again under another key for rayaug (other seeds, other parameters); the
    # loop draws other parameters anyway, and its boxes are found by the source's own key.
    pairs = [
        ([dataclasses.replace(s, key=f"{s.key}~{k}") for s in unit] if repeat > 1 else unit, unit)
        for k in range(repeat)
        for unit in units
    ]
    read = time.monotonic() - started
    augmenter = Augmenter(spec, device)
    allocator.exempt_loaded_objects()  # as in the job's actors
    started = time.monotonic()  # first batch: imports, CUDA context, kernels; not counted
    augmenter.augment(units[0][: spec.execution.batch_size])
    synchronize(device)
    warmup = time.monotonic() - started
    if loop:
        pool.albu_samples(_loop_sources(units[0][:2]))  # its first calls, not counted either
    samples = quarantined = loop_samples = 0
    seconds = loop_seconds = 0.0
    for unit, plain in pairs:  # one unit = one output shard, as an actor gets them
        started = time.monotonic()
        output = augmenter.augment(unit)
        synchronize(device)
        seconds += time.monotonic() - started
        samples += len(output.samples)
        quarantined += len(output.quarantined)
        if loop:
            started = time.monotonic()
            loop_samples += len(pool.albu_samples(_loop_sources(plain))[0])
            loop_seconds += time.monotonic() - started
    result = {
        "samples": samples,
        "quarantined": quarantined,
        "seconds": round(seconds, 3),
        "samples_per_second": round(samples / seconds, 2),
        "warmup_seconds": round(warmup, 3),
        "read_seconds": round(read, 3),
        "shards": len(pairs),
    }
    if loop:
        rate = loop_samples / loop_seconds
        loop_result = {"samples": loop_samples, "seconds": round(loop_seconds, 3)}
        result["loop"] = loop_result | {"samples_per_second": round(rate, 2)}
        result["ratio"] = round(samples / seconds / rate, 3)
    return result


def _loop_sources(unit: list[Any]) -> list[tuple[str, bytes]]:
    return [(source.key, source.data) for source in unit if source.data]


def synchronize(device: str) -> None:
    if device != "cpu":
        import torch

        torch.cuda.synchronize()


def write_json(
    args: argparse.Namespace,
    info: dict[str, Any],
    inputs: dict[str, str],
    results: dict[str, dict[str, dict[str, Any]]],
) -> None:
    document = {
        "schema": 3,
        "mode": "augment-only",
        "device": args.device,
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": info,
        "config": {
            "n": args.n,
            "views": args.views,
            "repeat": args.repeat,
            "photos": str(args.input) if args.input else args.photos,
            "inputs": inputs,
            "batch_size": args.batch_size,
            "loop": args.loop,
            "recipes": {k: RECIPES[k].describe() for k in args.recipes},
        },
        "results": results,
    }
    args.json.write_text(json.dumps(document, indent=2) + "\n")
    print(f"wrote {args.json}")
