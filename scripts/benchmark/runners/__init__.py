"""The runners, driver side: each runs as its own process tree, measured (measuring.py), and
its committed outputs are counted. The peers' child side is `python -m
benchmark.runners.worker`; rayaug's is a real `rayaug run SPEC --json`."""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import SCRIPTS, cores
from ..measuring import (
    Result,
    committed_files,
    finish,
    last_json,
    local_fs,
    measure,
    parquet_rows,
)
from ..photos import Photos
from ..recipes import FOUR_OPS, Recipe, rayaug_spec

PEERS = ("floor", "albumentations", "naive-ray", "dali")
RUNNERS = ("floor", "albumentations", "naive-ray", "rayaug", "rayaug-s3", "dali")
DEFAULT_RUNNERS = ("floor", "albumentations", "rayaug")
FOUR_OPS_ONLY = ("naive-ray", "dali")  # hand-written for the four ops: recipes a and b only
S3_BUCKET = "bench"
# Keep every child on loopback and quiet (see /work/shared/ENVIRONMENT.md).
CHILD_ENV = {
    "AWS_EC2_METADATA_DISABLED": "true",
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
    "NO_ALBUMENTATIONS_UPDATE": "1",  # albumentations 2.x asks PyPI for updates on import
    "NO_PROXY": "127.0.0.1,localhost",
    "no_proxy": "127.0.0.1,localhost",
}


@dataclass(frozen=True)
class Setting:
    """Where and how this invocation runs its runners."""

    run_dir: Path  # outputs and logs, bench-data/runs/<pid>-<time>
    ray_tmp: Path  # RAY_TMPDIR of every child (short: Ray's socket paths)
    gpu: bool
    keep: bool
    s3: Any = None  # the SeaweedFS server of rayaug-s3


def applies(runner: str, recipe: str) -> bool:
    return runner not in FOUR_OPS_ONLY or recipe in FOUR_OPS


def run_one(
    name: str, recipe: Recipe, photos: Photos, views: int, setting: Setting, round_number: int = 1
) -> Result:
    work = setting.run_dir / f"v{views}" / f"s{photos.sources}" / recipe.key / name
    work /= f"round{round_number}"
    shutil.rmtree(work, ignore_errors=True)
    if name in PEERS:
        result = run_peer(name, recipe, photos, views, work, setting.ray_tmp)
    else:
        s3 = setting.s3 if name == "rayaug-s3" else None
        result = run_rayaug(name, recipe, photos, views, work, setting, s3)
    if not setting.keep:
        shutil.rmtree(work / "out", ignore_errors=True)
    return result


def child_env(ray_tmp: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "AWS_PROFILE")}
    path = os.pathsep.join(filter(None, [str(SCRIPTS), env.get("PYTHONPATH")]))
    return env | CHILD_ENV | {"RAY_TMPDIR": str(ray_tmp), "PYTHONPATH": path} | (extra or {})


def run_peer(
    name: str, recipe: Recipe, photos: Photos, views: int, work: Path, ray_tmp: Path
) -> Result:
    """Run one peer in its own process (benchmark.runners.worker) and count its outputs."""
    out = work / "out"
    out.mkdir(parents=True)
    log = work / "stderr.log"
    command = [
        sys.executable,
        "-m",
        "benchmark.runners.worker",
        name,
        recipe.key,
        str(photos.images),
        str(out),
        "--views",
        str(views),
        "--cores",
        str(cores()),
        "--annotations",
        str(photos.annotations),
    ]
    measured = measure(command, child_env(ray_tmp), log)
    result = Result(name, recipe.key, views, photos.sources, photos.sources * views)
    result.workers = 1 if name == "dali" else cores()  # DALI: one pipeline, threads inside
    commits = committed_files(local_fs(), str(out), ".jpg" if name == "naive-ray" else ".parquet")
    result.outputs = sum(samples for _, samples in commits)
    result.extra = {"work_seconds": last_json(measured.stdout).get("work_seconds")}
    return finish(result, measured, log, commits)


def run_rayaug(
    name: str,
    recipe: Recipe,
    photos: Photos,
    views: int,
    work: Path,
    setting: Setting,
    s3: Any = None,
) -> Result:
    """`rayaug run SPEC --json` in a subprocess, to local disk or to the S3 server `s3`."""
    import yaml

    work.mkdir(parents=True)
    log = work / "stderr.log"
    if s3 is None:
        output_uri, storage, env = str(work / "out"), {}, child_env(setting.ray_tmp)
    else:  # unique per invocation, views, size and recipe
        output_uri = f"s3://{S3_BUCKET}/{work.relative_to(setting.run_dir.parent).as_posix()}"
        storage = {"endpoint": f"http://{s3.endpoint}", "region": s3.region}
        env = child_env(setting.ray_tmp, s3.env())
    spec = rayaug_spec(
        recipe,
        photos.images,
        output_uri,
        photos.sources,
        views,
        setting.gpu,
        storage,
        photos.annotations,
    )
    spec_path = work / "job.yaml"
    spec_path.write_text(yaml.safe_dump(spec, sort_keys=False))
    measured = measure([rayaug_binary(), "run", str(spec_path), "--json"], env, log)
    summary = last_json(measured.stdout)
    result = Result(name, recipe.key, views, photos.sources, photos.sources * views)
    result.workers = rayaug_actors(spec, setting.gpu)
    filesystem, base = (
        (local_fs(), str(work / "out"))
        if s3 is None
        else (s3.filesystem(), output_uri[len("s3://") :])
    )
    result.outputs = parquet_rows(filesystem, f"{base}/data")
    commits = committed_files(filesystem, f"{base}/manifests", ".parquet")
    result.extra = {
        f"summary_{k}": summary.get(k)
        for k in ("startup_seconds", "wall_seconds", "samples_per_second", "quarantined")
    }
    return finish(result, measured, log, commits)


def rayaug_actors(spec: dict[str, Any], gpu: bool) -> int:
    """The shard actors of the spec's run on this machine's embedded Ray (rayaug's own rule)."""
    from rayaug.job import pool_shape
    from rayaug.spec import ExecutionSpec

    execution = ExecutionSpec.model_validate(spec.get("execution", {}))
    return pool_shape(execution, cores(), 1.0 if gpu else 0.0).size


def rayaug_binary() -> str:
    here = Path(sys.executable).with_name("rayaug")
    return str(here) if here.exists() else shutil.which("rayaug") or "rayaug"


def start_s3(run_dir: Path) -> Any:
    """A SeaweedFS S3 server on loopback (tests/s3server.py) with the bench's bucket."""
    sys.path.insert(0, str(SCRIPTS.parent / "tests"))
    from s3server import SeaweedS3

    server = SeaweedS3(run_dir / "s3")
    server.start()
    server.create_bucket(S3_BUCKET)
    return server
