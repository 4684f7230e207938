"""--augment-only: `rayaug.augment.Augmenter` alone, in this process, no Ray (importing Ray here
fails on purpose): the sources read into memory first (not timed), then decode -> ops ->
encode per recipe and views, shard by shard as an actor gets them, timed; prints samples/s.
The GPU check (scripts/gpu-check) runs this on a lent GPU machine with --device cuda."""

from __future__ import annotations

import argparse
import dataclasses
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


def run_augment_only(args: argparse.Namespace) -> int:
    sys.modules["ray"] = None  # type: ignore[assignment]  # proof: importing Ray here fails
    gpu_name = cuda_name(args.device)
    if gpu_name == "":
        print(f"--device {args.device}: torch sees no CUDA device", file=sys.stderr)
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
    result = time_augmenter(spec, args.device, args.repeat)
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
    return result


def time_augmenter(spec: Any, device: str, repeat: int) -> dict[str, Any]:
    """Read every unit (untimed), one warm-up batch (timed apart), then every unit, timed."""
    from rayaug import allocator, sources, storage
    from rayaug.augment import Augmenter

    allocator.keep_freed_buffers()  # as in the job's actors
    started = time.monotonic()
    location = storage.open_location(spec.input.uri, spec.storage)
    listing = sources.list_input(location, spec.input, spec.output.shard_size, spec.seed)
    units = [
        sources.read_unit(location, spec.input, listing.format, unit) for unit in listing.units
    ]
    if repeat > 1:  # each source again under another key: other seeds, other parameters
        units = [
            [dataclasses.replace(s, key=f"{s.key}~{k}") for s in unit]
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
    samples = quarantined = 0
    started = time.monotonic()
    for unit in units:  # one unit = one output shard, as an actor gets them
        output = augmenter.augment(unit)
        samples += len(output.samples)
        quarantined += len(output.quarantined)
    synchronize(device)
    seconds = time.monotonic() - started
    return {
        "samples": samples,
        "quarantined": quarantined,
        "seconds": round(seconds, 3),
        "samples_per_second": round(samples / seconds, 2),
        "warmup_seconds": round(warmup, 3),
        "read_seconds": round(read, 3),
        "shards": len(units),
    }


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
            "recipes": {k: RECIPES[k].describe() for k in args.recipes},
        },
        "results": results,
    }
    args.json.write_text(json.dumps(document, indent=2) + "\n")
    print(f"wrote {args.json}")
