"""Side-by-side benchmark of recipes: rayaug against what a team would otherwise run, same
input, same ops, in the order users write them.

One invocation builds (or reuses) a folder of N real-photo JPEGs under bench-data/input/ (plus
a COCO annotations.json with a few boxes per photo), then, for each recipe and at N and 4N
images, runs one runner after another on it:

  floor           decode + resize to the recipe's size + JPEG encode only (Pillow, a process
                  per core): the codec's share of any augmentation job
  albumentations  the recipe's ops with Albumentations 2, OpenCV codecs, a process per core,
                  Parquet shards out (recipe d: bbox_params, boxes serialized as JSON per row)
  rayaug          `rayaug run SPEC --json` in a subprocess, the spec generated from the same op
                  list, Ray start-up included; Parquet shards + manifests out
  naive-ray       (--only; recipes a, b) Ray actors calling Pillow per image, a file per image
  rayaug-s3       (--only or --s3) rayaug writing to S3 on a SeaweedFS server on loopback
  dali            (--only with --gpu; recipes a, b) NVIDIA DALI on the GPU

Recipes (--recipe, default all four; one op list each, translated to both rayaug and
Albumentations from the table RECIPES below):

  a  RandomResizedCrop 224 (scale 0.08-1, ratio 3/4-4/3), HorizontalFlip p .5,
     ColorJitter(0.4, 0.4, 0.4, 0.1) p 1 (rayaug's default, exact Kornia jitter),
     Rotation +-15 deg p 1 (black corners); JPEG q90
  b  the same with rayaug's `fused: true` colour jitter (one affine colour map per sample)
  c  the ops of jobs/imagenet.yaml, views 1: RRC 224 0.08-1, flip .5, jitter(.4,.4,.4,.1) p .8,
     grayscale .2, gaussian blur kernel 23 sigma 0.1-2 p .5, solarize 0.5 p .2,
     erasing scale 0.02-0.25 p .25; JPEG q90
  d  detection, jobs/detection.yaml without the mosaic, views 1: COCO boxes in, RRC 512 scale
     0.3-1, flip .5, affine (5 deg, translate 0.05, scale 0.9-1.1) p .5,
     jitter(.3,.3,.3,.02) p .8, gaussian blur 5 sigma 0.1-1 p .1; boxes dropped under 30 %
     visible (Albumentations: BboxParams(format="coco", min_visibility=0.3)); JPEG q92

Photos (--photos): `bundled` = seed 0, shorter side 300-600 px, JPEG quality 75-95 (the set of
earlier figures); `varied` = seed 1, other crops of the same photographs, shorter side
200-900 px, quality 60-98; --input DIR = your own image folder (all of it, one size, no 4N).
Photos come from rayaug.sampledata (scikit-image's and scikit-learn's bundled photographs).

Every runner is its own process tree, timed end to end (interpreter start and imports
included, for rayaug as for the peers), with the RSS and PSS of the whole tree (Ray's GCS,
raylet and workers included) sampled every 0.2 s. Commit times are the modification times of
the committed files (rayaug: manifests/*.parquet; pool peers: each Parquet shard; naive-ray:
each image file): start-up = process start to first commit; steady state = images committed
after the first commit / (last commit - first commit). It is a benchmark, not a test: nothing
here asserts a time.

    scripts/bench.py [--recipe a,b,c,d] [--n 10000] [--quick] [--photos bundled|varied]
                     [--input DIR] [--only floor,albumentations,rayaug] [--s3] [--gpu]
                     [--json FILE] [--keep]
    scripts/bench.py --augment-only [--device cpu|cuda] [--recipe ...] [--n N] [--repeat K]
                     [--batch-size B] [--json FILE]    # the augment stage alone, no Ray
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import math
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import suppress
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "bench-data"
SEED = 0
SHARD_ROWS = 256
RAY_CHUNK = 32  # images per naive-ray actor call
PSS_EVERY = 5  # PSS on every 5th memory sample (every ~1 s): reading it costs CPU
MIN_COMMITS = 8  # fewer commits than this: the steady-state figure is noise (a note says so)
MIN_VISIBLE = 0.3  # a box less visible than this is dropped (rayaug's rule, see the README)

PEERS = ("floor", "albumentations", "naive-ray", "dali")
RUNNERS = ("floor", "albumentations", "naive-ray", "rayaug", "rayaug-s3", "dali")
DEFAULT_RUNNERS = ("floor", "albumentations", "rayaug")
FOUR_OPS_ONLY = ("naive-ray", "dali")  # hand-written for the four ops: recipes a and b only
S3_BUCKET = "bench"
# Targets of issue 11 (same run, this 2-core machine): rayaug ÷ Albumentations.
TARGETS = {"large_end_to_end": 1.0, "large_steady_state": 1.3, "small_floor": 0.8}
# Keep every child on loopback and quiet (see /work/shared/ENVIRONMENT.md).
CHILD_ENV = {
    "AWS_EC2_METADATA_DISABLED": "true",
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
    "NO_ALBUMENTATIONS_UPDATE": "1",  # albumentations 2.x asks PyPI for updates on import
    "NO_PROXY": "127.0.0.1,localhost",
    "no_proxy": "127.0.0.1,localhost",
}


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def shard_rows(n: int, procs: int | None = None) -> int:
    """SHARD_ROWS, or fewer when N is small, so that every core gets a shard (all runners)."""
    return max(1, min(SHARD_ROWS, math.ceil(n / (procs or cores()))))


# --------------------------------------------------------------------------- recipes
# One op list per recipe. Each step holds the rayaug spec op and the Albumentations transform
# doing the same thing, made from the same numbers; both runners take the list in order.


@dataclass(frozen=True)
class Step:
    op: dict[str, Any]  # the rayaug spec op, as a job YAML would hold it
    albu: Callable[[Any, Any], Any]  # (albumentations, cv2) -> the same transform


def random_resized_crop(size: int, scale: tuple[float, float],
                        ratio: tuple[float, float] = (3 / 4, 4 / 3)) -> Step:
    return Step({"name": "random_resized_crop", "size": size, "scale": list(scale),
                 "ratio": list(ratio)},
                lambda A, cv2: A.RandomResizedCrop(size=(size, size), scale=scale, ratio=ratio))


def horizontal_flip(p: float = 0.5) -> Step:
    return Step({"name": "horizontal_flip", "p": p}, lambda A, cv2: A.HorizontalFlip(p=p))


def color_jitter(b: float, c: float, s: float, h: float, p: float, fused: bool = False) -> Step:
    op = {"name": "color_jitter", "brightness": b, "contrast": c, "saturation": s, "hue": h,
          "p": p} | ({"fused": True} if fused else {})
    return Step(op, lambda A, cv2: A.ColorJitter(b, c, s, h, p=p))


def rotation(degrees: float, p: float = 1.0) -> Step:
    return Step({"name": "rotation", "degrees": degrees, "p": p},
                lambda A, cv2: A.Rotate(limit=degrees, border_mode=cv2.BORDER_CONSTANT, fill=0,
                                        p=p))


def affine(degrees: float, translate: float, scale: tuple[float, float], p: float) -> Step:
    return Step({"name": "affine", "degrees": degrees, "translate": [translate, translate],
                 "scale": list(scale), "p": p},
                lambda A, cv2: A.Affine(rotate=(-degrees, degrees), scale=scale,
                                        translate_percent=(-translate, translate),
                                        border_mode=cv2.BORDER_CONSTANT, fill=0, p=p))


def grayscale(p: float) -> Step:
    return Step({"name": "grayscale", "p": p},
                lambda A, cv2: A.ToGray(num_output_channels=3, method="weighted_average", p=p))


def gaussian_blur(kernel: int, sigma: tuple[float, float], p: float) -> Step:
    return Step({"name": "gaussian_blur", "kernel_size": kernel, "sigma": list(sigma), "p": p},
                lambda A, cv2: A.GaussianBlur(blur_limit=(kernel, kernel), sigma_limit=sigma,
                                              p=p))


def solarize(threshold: float, p: float) -> Step:
    return Step({"name": "solarize", "threshold": threshold, "p": p},
                lambda A, cv2: A.Solarize(threshold_range=(threshold, threshold), p=p))


def erasing(scale: tuple[float, float], p: float,
            ratio: tuple[float, float] = (0.3, 3.3)) -> Step:
    return Step({"name": "erasing", "scale": list(scale), "ratio": list(ratio), "p": p},
                lambda A, cv2: A.Erasing(scale=scale, ratio=ratio, fill=0, p=p))


@dataclass(frozen=True)
class Recipe:
    key: str
    title: str
    size: int  # output side, pixels (the floor resizes to it)
    quality: int  # JPEG quality out
    steps: tuple[Step, ...]
    boxes: bool = False  # COCO boxes in, moved boxes out

    def rayaug_ops(self) -> list[dict[str, Any]]:
        return [dict(step.op) for step in self.steps]

    def albumentations(self, seed: int) -> Any:
        import albumentations as A
        import cv2

        bbox = A.BboxParams(format="coco", label_fields=["classes"],
                            min_visibility=MIN_VISIBLE) if self.boxes else None
        return A.Compose([step.albu(A, cv2) for step in self.steps], bbox_params=bbox, seed=seed)

    def describe(self) -> dict[str, Any]:
        described = {"title": self.title, "size": self.size, "quality": self.quality,
                     "boxes": self.boxes, "rayaug_ops": self.rayaug_ops()}
        with suppress(ImportError):  # not on the GPU machine (augment-only needs no peers)
            import albumentations as A
            import cv2

            described["albumentations"] = [repr(step.albu(A, cv2)) for step in self.steps]
        return described


# The four ops, their numbers shared with the hand-written naive-ray and DALI runners.
CROP_SCALE, CROP_RATIO = (0.08, 1.0), (3 / 4, 4 / 3)
P_FLIP, P_JITTER, P_ROTATE = 0.5, 1.0, 1.0
BRIGHTNESS = CONTRAST = SATURATION = 0.4
HUE = 0.1
DEGREES = 15.0


def four_ops(fused: bool) -> tuple[Step, ...]:
    return (random_resized_crop(224, CROP_SCALE, CROP_RATIO), horizontal_flip(P_FLIP),
            color_jitter(BRIGHTNESS, CONTRAST, SATURATION, HUE, P_JITTER, fused),
            rotation(DEGREES, P_ROTATE))


RECIPES = {
    "a": Recipe("a", "four ops, exact colour jitter", 224, 90, four_ops(fused=False)),
    "b": Recipe("b", "four ops, fused colour jitter", 224, 90, four_ops(fused=True)),
    "c": Recipe("c", "jobs/imagenet.yaml ops", 224, 90, (
        random_resized_crop(224, (0.08, 1.0), (0.75, 1.3333)),
        horizontal_flip(0.5),
        color_jitter(0.4, 0.4, 0.4, 0.1, p=0.8),
        grayscale(0.2),
        gaussian_blur(23, (0.1, 2.0), 0.5),
        solarize(0.5, 0.2),
        erasing((0.02, 0.25), 0.25),
    )),
    "d": Recipe("d", "detection with COCO boxes (jobs/detection.yaml, no mosaic)", 512, 92, (
        random_resized_crop(512, (0.3, 1.0)),
        horizontal_flip(0.5),
        affine(5.0, 0.05, (0.9, 1.1), 0.5),
        color_jitter(0.3, 0.3, 0.3, 0.02, p=0.8),
        gaussian_blur(5, (0.1, 1.0), 0.1),
    ), boxes=True),
}


# --------------------------------------------------------------------------- machine


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "-"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info(gpu_name: str | None) -> dict[str, Any]:
    packages = ("torch", "torchvision", "kornia", "ray", "pillow", "albumentations",
                "opencv-python-headless", "opencv-python", "pyarrow", "pydantic",
                "nvidia-dali-cuda120", "nvidia-dali-cuda110")
    versions = {p: v for p in packages if (v := _version(p)) != "-"}
    return {
        "cpu": _cpu_model(),
        "cores": cores(),
        "ram_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "gpu": gpu_name,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "versions": versions,
    }


def print_machine(info: dict[str, Any]) -> None:
    print(f"machine: {info['cpu']}, {info['cores']} cores, {info['ram_gib']} GiB RAM"
          + (f", GPU {info['gpu']}" if info["gpu"] else ", no GPU"))
    print(f"python {info['python']} on {info['platform']}")
    print("versions: " + ", ".join(f"{k} {v}" for k, v in info["versions"].items()))


# --------------------------------------------------------------------------- photos


@dataclass(frozen=True)
class PhotoSet:
    seed: int
    short_side: tuple[int, int]
    quality: tuple[int, int]
    help: str


PHOTO_SETS = {
    "bundled": PhotoSet(0, (300, 600), (75, 95),
                        "seed 0, shorter side 300-600 px, JPEG quality 75-95 (earlier figures)"),
    "varied": PhotoSet(1, (200, 900), (60, 98),
                       "seed 1: other crops of the same photographs, shorter side 200-900 px, "
                       "quality 60-98"),
}


@dataclass(frozen=True)
class Photos:
    """An input for one size: the image folder, its COCO boxes, and what it is."""

    images: Path
    annotations: Path
    n: int
    name: str


def input_folder(n: int, photo_set: str) -> Path:
    """The cached image folder of `n` photos of a set; built aside and renamed when done."""
    chosen = PHOTO_SETS[photo_set]
    name = f"n{n}-seed{chosen.seed}" if photo_set == "bundled" else f"{photo_set}-n{n}"
    target = DATA / "input" / name
    if (target / "COUNT").exists():
        return target
    from rayaug import sampledata

    for stale in target.parent.glob(f"{target.name}.partial-*"):  # left by a killed build
        if not psutil.pid_exists(int(stale.name.rsplit("-", 1)[1])):
            shutil.rmtree(stale, ignore_errors=True)
    partial = target.with_name(f"{target.name}.partial-{os.getpid()}")
    print(f"building {n} {photo_set} photos in {target} ...", flush=True)
    started = time.monotonic()
    photos = sampledata.make_photos(n, chosen.seed, short_side=chosen.short_side,
                                    quality=chosen.quality)
    count = sampledata.write_folder(photos, partial / "images")
    write_annotations(partial / "images", partial / "annotations.json", chosen.seed)
    (partial / "COUNT").write_text(f"{count}\n")
    try:
        partial.rename(target)
    except OSError:  # another invocation finished it first
        shutil.rmtree(partial, ignore_errors=True)
    print(f"built {count} photos in {time.monotonic() - started:.1f}s", flush=True)
    return target


def photos_for(n: int, photo_set: str) -> Photos:
    folder = input_folder(n, photo_set)
    annotations = folder / "annotations.json"
    if not annotations.exists():  # a folder cached before boxes were added
        write_annotations(folder / "images", annotations, PHOTO_SETS[photo_set].seed)
    return Photos(folder / "images", annotations, n, photo_set)


def own_photos(images: Path, scratch: Path) -> Photos:
    """--input DIR: the user's image folder as it is; boxes generated beside the run."""
    images = images.resolve()
    count = len(list_images(images))
    if not count:
        raise SystemExit(f"--input {images}: no .jpg/.jpeg/.png images under it")
    annotations = scratch / "annotations.json"
    write_annotations(images, annotations, SEED)
    return Photos(images, annotations, count, "own")


def write_annotations(images: Path, path: Path, seed: int) -> int:
    """A COCO file with 1-4 random boxes (classes 1-5) inside each image; header reads only."""
    from PIL import Image

    categories = [{"id": c, "name": f"class{c}"} for c in range(1, 6)]
    document: dict[str, list] = {"images": [], "annotations": [], "categories": categories}
    box_id = 0
    for image_id, (key, file) in enumerate(list_images(images)):
        with Image.open(file) as image:
            width, height = image.size
        document["images"].append({"id": image_id, "file_name": key, "width": width,
                                   "height": height})
        rng = random.Random(f"{seed}/{key}")
        for _ in range(rng.randint(1, 4)):
            w, h = width * rng.uniform(0.1, 0.6), height * rng.uniform(0.1, 0.6)
            x, y = rng.uniform(0, width - w), rng.uniform(0, height - h)
            box = [round(x, 2), round(y, 2), round(w, 2), round(h, 2)]
            document["annotations"].append({"id": box_id, "image_id": image_id, "bbox": box,
                                            "category_id": rng.randint(1, 5), "iscrowd": 0,
                                            "area": round(box[2] * box[3], 2)})
            box_id += 1
    partial = path.with_name(f"{path.name}.{os.getpid()}")
    partial.write_text(json.dumps(document))
    partial.replace(path)
    return box_id


IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")


def list_images(root: Path) -> list[tuple[str, Path]]:
    """(relative key, path) of every image under root, sorted."""
    return sorted((p.relative_to(root).as_posix(), p) for p in root.rglob("*")
                  if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())


def fresh_run_dir() -> Path:
    """A new, empty directory for this invocation's outputs; stale ones of dead runs go."""
    runs = DATA / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    for old in runs.iterdir():
        pid = old.name.split("-", 1)[0]
        if not pid.isdigit() or not psutil.pid_exists(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    run = runs / f"{os.getpid()}-{int(time.time())}"
    run.mkdir()
    return run


# --------------------------------------------------------------------------- memory


def _pss(pid: int) -> int:
    """Proportional set size in bytes (shared pages split between sharers); 0 if unreadable."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as rollup:
            for line in rollup:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


class TreeMonitor:
    """Samples the RSS (and PSS) sum of a process and all its descendants in a thread.

    RSS counts shared pages (libraries, Ray's object store, fork copy-on-write) once per
    process that maps them, so a tree of many similar processes sums high; PSS splits them.
    """

    def __init__(self, pid: int, interval: float = 0.2) -> None:
        self.root = psutil.Process(pid)
        self.interval = interval
        self.seen: dict[int, Any] = {pid: self.root}
        self.peak_rss = self.peak_pss = self.peak_procs = self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> TreeMonitor:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _tree(self) -> list[Any]:
        try:
            return [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            return []

    def sample(self) -> None:
        """RSS every call; PSS (costly: ~1 ms per large process) every PSS_EVERY-th call."""
        with_pss = self.samples % PSS_EVERY == 0
        self.samples += 1
        rss = pss = 0
        tree = self._tree()
        for proc in tree:
            self.seen.setdefault(proc.pid, proc)
            try:
                rss += proc.memory_info().rss
            except psutil.Error:
                continue
            pss += _pss(proc.pid) if with_pss else 0
        self.peak_rss, self.peak_pss = max(self.peak_rss, rss), max(self.peak_pss, pss)
        self.peak_procs = max(self.peak_procs, len(tree))

    def _loop(self) -> None:
        while True:
            self.sample()
            if self._stop.wait(self.interval):
                return

    def reap(self, grace: float = 10.0) -> int:
        """Stop descendants still alive after the root exited (only processes it started)."""
        alive = [p for pid, p in self.seen.items() if pid != self.root.pid and p.is_running()]
        if not alive:
            return 0
        _, alive = psutil.wait_procs(alive, timeout=grace)
        for proc in alive:
            with suppress(psutil.Error, OSError):
                proc.terminate()
        _, alive = psutil.wait_procs(alive, timeout=5)
        for proc in alive:
            with suppress(psutil.Error, OSError):
                proc.kill()
        return len(alive)


# --------------------------------------------------------------------------- measuring


@dataclass
class Measured:
    returncode: int
    started_at: float  # epoch seconds, just before the process was started
    wall_seconds: float
    peak_rss_bytes: int
    peak_pss_bytes: int
    peak_processes: int
    stdout: str


@dataclass
class Result:
    runner: str
    recipe: str
    n: int
    outputs: int = 0
    complete: bool = False
    wall_seconds: float | None = None
    images_per_second: float | None = None  # end to end: outputs / (process start to exit)
    steady_images_per_second: float | None = None  # after the first commit / (last - first)
    startup_seconds: float | None = None  # process start to first commit
    steady_seconds: float | None = None  # first commit to last commit
    commits: int = 0
    peak_rss_bytes: int | None = None
    peak_pss_bytes: int | None = None
    peak_processes: int | None = None
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def child_env(ray_tmp: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "AWS_PROFILE")}
    return env | CHILD_ENV | {"RAY_TMPDIR": str(ray_tmp)} | (extra or {})


def measure(command: Sequence[str], env: dict[str, str], log: Path) -> Measured:
    """Run `command` to its end, timing it and sampling the memory of its process tree."""
    with open(log, "wb") as err, tempfile.TemporaryFile() as out:
        started_at, started = time.time(), time.monotonic()
        proc = subprocess.Popen(command, stdout=out, stderr=err, env=env, cwd=ROOT,
                                stdin=subprocess.DEVNULL)
        with TreeMonitor(proc.pid) as monitor:
            try:
                proc.wait()
            except BaseException:
                proc.kill()
                proc.wait()
                raise
            finally:
                wall = time.monotonic() - started
                monitor.reap()
        out.seek(0)
        stdout = out.read().decode(errors="replace")
    return Measured(proc.returncode, started_at, wall, monitor.peak_rss, monitor.peak_pss,
                    monitor.peak_procs, stdout)


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def finish(result: Result, measured: Measured, log: Path,
           commits: list[tuple[float, int]]) -> Result:
    result.wall_seconds = round(measured.wall_seconds, 3)
    result.peak_rss_bytes, result.peak_pss_bytes = measured.peak_rss_bytes, measured.peak_pss_bytes
    result.peak_processes = measured.peak_processes
    if measured.returncode != 0:
        result.error = f"exit {measured.returncode}; log {log}:\n{_tail(log)}"
    result.complete = result.outputs == result.n
    if result.outputs:
        result.images_per_second = round(result.outputs / measured.wall_seconds, 2)
    steady_state(result, commits, measured.started_at)
    return result


def steady_state(result: Result, commits: list[tuple[float, int]], started_at: float) -> None:
    """Start-up and steady-state figures from (commit time, images) pairs (epoch seconds)."""
    if not commits:
        return
    commits = sorted(commits)
    first, last = commits[0][0], commits[-1][0]
    result.commits = len(commits)
    result.startup_seconds = round(first - started_at, 3)
    result.steady_seconds = round(last - first, 3)
    if len(commits) >= 2 and last - first >= 0.01:
        after_first = sum(rows for _, rows in commits[1:])
        result.steady_images_per_second = round(after_first / (last - first), 2)


def _last_json(stdout: str) -> dict[str, Any]:
    """The JSON document a child printed last (rayaug --json prints an indented one)."""
    start = stdout.rfind("\n{")
    text = stdout[start + 1:] if start >= 0 else stdout
    try:
        return json.loads(text)
    except ValueError:
        return {}


# --------------------------------------------------------------------------- counting


def committed_files(filesystem: Any, base: str, suffix: str) -> list[tuple[float, int]]:
    """(modification time, images) of each file under `base` ending in `suffix`: a Parquet
    file's rows from its footer, an image file counts one. Commit times for steady state."""
    import pyarrow.parquet as pq
    from pyarrow import fs

    infos = filesystem.get_file_info(fs.FileSelector(base, recursive=True, allow_not_found=True))
    commits = []
    for info in infos:
        if info.type != fs.FileType.File or not info.path.endswith(suffix):
            continue
        rows = 1
        if suffix == ".parquet":
            with filesystem.open_input_file(info.path) as handle:
                rows = pq.ParquetFile(handle).metadata.num_rows
        commits.append((info.mtime.timestamp(), rows))
    return commits


def parquet_rows(filesystem: Any, base: str) -> int:
    """Rows in every .parquet file under `base` (footers only)."""
    return sum(rows for _, rows in committed_files(filesystem, base, ".parquet"))


def local_fs() -> Any:
    from pyarrow import fs

    return fs.LocalFileSystem()


# --------------------------------------------------------------------------- peers (driver side)


def run_peer(name: str, recipe: Recipe, photos: Photos, work: Path, ray_tmp: Path) -> Result:
    """Run one peer in its own process (`bench.py _worker ...`) and check its outputs."""
    out = work / "out"
    out.mkdir(parents=True)
    log = work / "stderr.log"
    command = [sys.executable, str(Path(__file__).resolve()), "_worker", name, recipe.key,
               str(photos.images), str(out), "--cores", str(cores()),
               "--annotations", str(photos.annotations)]
    measured = measure(command, child_env(ray_tmp), log)
    result = Result(name, recipe.key, photos.n)
    suffix = ".jpg" if name == "naive-ray" else ".parquet"
    commits = committed_files(local_fs(), str(out), suffix)
    result.outputs = sum(rows for _, rows in commits)
    result.extra = {"work_seconds": _last_json(measured.stdout).get("work_seconds")}
    return finish(result, measured, log, commits)


# --------------------------------------------------------------------------- rayaug (driver side)


def rayaug_spec(recipe: Recipe, images: Path, output_uri: str, n: int, gpu: bool,
                storage: dict[str, str], annotations: Path | None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "version": 1,
        "name": f"bench-{recipe.key}",
        "input": {"uri": str(images), "format": "folder"},
        "output": {"uri": output_uri, "format": "parquet", "image_format": "jpeg",
                   "quality": recipe.quality, "shard_size": shard_rows(n)},
        "views": 1,
        "seed": SEED,
        "ops": recipe.rayaug_ops(),
        "execution": {"num_gpus": 1 if gpu else 0},
    }
    if recipe.boxes and annotations is not None:
        spec["input"]["annotations"] = str(annotations.resolve())
    if storage:
        spec["storage"] = storage
    return spec


def rayaug_binary() -> str:
    here = Path(sys.executable).with_name("rayaug")
    return str(here) if here.exists() else shutil.which("rayaug") or "rayaug"


def run_rayaug(name: str, recipe: Recipe, photos: Photos, work: Path, ray_tmp: Path, gpu: bool,
               s3: Any = None) -> Result:
    """`rayaug run SPEC --json` in a subprocess, to local disk or to the S3 server `s3`."""
    import yaml

    work.mkdir(parents=True)
    log = work / "stderr.log"
    if s3 is None:
        output_uri, storage, env = str(work / "out"), {}, child_env(ray_tmp)
    else:  # unique per invocation, recipe and N
        prefix = f"{work.parent.parent.parent.name}/{work.parent.parent.name}/{work.parent.name}"
        output_uri = f"s3://{S3_BUCKET}/{prefix}"
        storage = {"endpoint": f"http://{s3.endpoint}", "region": s3.region}
        env = child_env(ray_tmp, s3.env())
    spec = rayaug_spec(recipe, photos.images, output_uri, photos.n, gpu, storage,
                       photos.annotations)
    spec_path = work / "job.yaml"
    spec_path.write_text(yaml.safe_dump(spec, sort_keys=False))
    measured = measure([rayaug_binary(), "run", str(spec_path), "--json"], env, log)
    summary = _last_json(measured.stdout)
    result = Result(name, recipe.key, photos.n)
    filesystem, base = (local_fs(), str(work / "out")) if s3 is None else (
        s3.filesystem(), output_uri[len("s3://"):])
    result.outputs = parquet_rows(filesystem, f"{base}/data")
    commits = committed_files(filesystem, f"{base}/manifests", ".parquet")
    result.extra = {f"summary_{k}": summary.get(k) for k in
                    ("startup_seconds", "wall_seconds", "samples_per_second", "quarantined")}
    return finish(result, measured, log, commits)


# --------------------------------------------------------------------------- workers (child side)


def _chunks(items: Sequence[Any], size: int) -> Iterator[tuple[int, Sequence[Any]]]:
    for index, start in enumerate(range(0, len(items), size)):
        yield index, items[start:start + size]


def write_shard(path: Path, keys: list[str], images: list[bytes],
                targets: list[str] | None = None) -> None:
    """A Parquet shard: key, image, label (+ targets: the moved boxes as JSON), written aside
    and renamed, so its modification time is its commit time."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns = {"key": pa.array(keys, pa.string()), "image": pa.array(images, pa.binary()),
               "label": pa.array([key.split("/", 1)[0] for key in keys], pa.string())}
    if targets is not None:
        columns["targets"] = pa.array(targets, pa.string())
    partial = path.with_name(f".{path.name}.partial")
    pq.write_table(pa.table(columns), partial)
    partial.rename(path)


_RECIPE: Recipe | None = None


def _floor_shard(task: tuple[int, Sequence[tuple[str, Path]], Path]) -> int:
    """Decode, resize to the recipe's size, encode: the codec's share of any augmentation job."""
    from PIL import Image

    index, items, out = task
    size, quality = _RECIPE.size, _RECIPE.quality
    encoded = []
    for _, path in items:
        with Image.open(path) as image:
            small = image.convert("RGB").resize((size, size), Image.Resampling.BILINEAR)
        buffer = io.BytesIO()
        small.save(buffer, "JPEG", quality=quality)
        encoded.append(buffer.getvalue())
    write_shard(out / f"part-{index:05d}.parquet", [k for k, _ in items], encoded)
    return len(items)


_ALBU: Any = None
_BOXES: dict[str, tuple[list[list[float]], list[int]]] | None = None


def _albu_init(annotations: str | None) -> None:
    """Per process: OpenCV on one thread (one process per core), the Compose, the boxes."""
    global _ALBU, _BOXES
    import cv2

    cv2.setNumThreads(1)
    _ALBU = _RECIPE.albumentations(seed=SEED + os.getpid())
    if _RECIPE.boxes and annotations:
        document = json.loads(Path(annotations).read_text())
        names = {image["id"]: image["file_name"] for image in document["images"]}
        _BOXES = {}
        for box in document["annotations"]:
            boxes, classes = _BOXES.setdefault(names[box["image_id"]], ([], []))
            boxes.append(box["bbox"])
            classes.append(box["category_id"])


def _albu_shard(task: tuple[int, Sequence[tuple[str, Path]], Path]) -> int:
    import cv2
    import numpy as np

    index, items, out = task
    keys, encoded, targets = [], [], []
    for key, path in items:
        bgr = cv2.imdecode(np.fromfile(path, np.uint8), cv2.IMREAD_COLOR)
        rgb = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
        if _BOXES is None:
            augmented = _ALBU(image=rgb)
        else:
            boxes, classes = _BOXES.get(key, ([], []))
            augmented = _ALBU(image=rgb, bboxes=np.array(boxes, np.float32).reshape(-1, 4),
                              classes=classes)
            xyxy = [[float(x), float(y), float(x + w), float(y + h)]
                    for x, y, w, h in augmented["bboxes"]]
            targets.append(json.dumps({"boxes": xyxy,
                                       "classes": [int(c) for c in augmented["classes"]]}))
        ok, jpeg = cv2.imencode(".jpg", cv2.cvtColor(augmented["image"], cv2.COLOR_RGB2BGR),
                                [cv2.IMWRITE_JPEG_QUALITY, _RECIPE.quality])
        if ok:
            keys.append(key)
            encoded.append(jpeg.tobytes())
        elif targets:
            targets.pop()
    write_shard(out / f"part-{index:05d}.parquet", keys, encoded,
                targets if _BOXES is not None else None)
    return len(encoded)


def run_pool(recipe: Recipe, images: Path, out: Path, procs: int, kind: str,
             annotations: str | None) -> int:
    """A process per core over Parquet shards of shard_rows(N) images."""
    import multiprocessing

    items = list_images(images)
    tasks = [(i, chunk, out) for i, chunk in _chunks(items, shard_rows(len(items), procs))]
    shard = _floor_shard if kind == "floor" else _albu_shard
    initializer, initargs = (_albu_init, (annotations,)) if kind == "albumentations" else (None, ())
    with multiprocessing.get_context("fork").Pool(procs, initializer, initargs) as pool:
        return sum(pool.imap_unordered(shard, tasks))


# naive-ray: what a team writes by hand with Pillow, one image at a time (the four ops).


def pil_random_resized_crop(image: Any, rng: random.Random, size: int) -> Any:
    from PIL import Image

    width, height = image.size
    box = (0, 0, width, height)
    for _ in range(10):
        area = width * height * rng.uniform(*CROP_SCALE)
        aspect = math.exp(rng.uniform(math.log(CROP_RATIO[0]), math.log(CROP_RATIO[1])))
        w, h = round(math.sqrt(area * aspect)), round(math.sqrt(area / aspect))
        if 0 < w <= width and 0 < h <= height:
            x, y = rng.randint(0, width - w), rng.randint(0, height - h)
            box = (x, y, x + w, y + h)
            break
    return image.resize((size, size), Image.Resampling.BILINEAR, box=box)


def pil_hue(image: Any, shift: float) -> Any:
    import numpy as np
    from PIL import Image

    hsv = np.array(image.convert("HSV"))
    hsv[..., 0] = (hsv[..., 0].astype(np.int16) + round(shift * 255)) % 256
    return Image.fromarray(hsv, "HSV").convert("RGB")


def pil_color_jitter(image: Any, rng: random.Random) -> Any:
    from PIL import ImageEnhance

    steps = [
        lambda im: ImageEnhance.Brightness(im).enhance(rng.uniform(1 - BRIGHTNESS, 1 + BRIGHTNESS)),
        lambda im: ImageEnhance.Contrast(im).enhance(rng.uniform(1 - CONTRAST, 1 + CONTRAST)),
        lambda im: ImageEnhance.Color(im).enhance(rng.uniform(1 - SATURATION, 1 + SATURATION)),
        lambda im: pil_hue(im, rng.uniform(-HUE, HUE)),
    ]
    rng.shuffle(steps)
    for step in steps:
        image = step(image)
    return image


def pil_augment(image: Any, rng: random.Random, size: int) -> Any:
    from PIL import Image

    image = pil_random_resized_crop(image.convert("RGB"), rng, size)
    if rng.random() < P_FLIP:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    if rng.random() < P_JITTER:
        image = pil_color_jitter(image, rng)
    if rng.random() < P_ROTATE:
        image = image.rotate(rng.uniform(-DEGREES, DEGREES), Image.Resampling.BILINEAR)
    return image


class NaiveAugmenter:
    """The Ray actor of the naive script: read, augment and save each image as its own file."""

    def __init__(self, out: str, size: int, quality: int) -> None:
        self.out, self.size, self.quality = Path(out), size, quality
        self.rng = random.Random(os.getpid())

    def process(self, items: list[tuple[str, str]]) -> int:
        from PIL import Image

        for key, path in items:
            with Image.open(path) as image:
                augmented = pil_augment(image, self.rng, self.size)
            target = self.out / key
            target.parent.mkdir(parents=True, exist_ok=True)
            augmented.save(target, "JPEG", quality=self.quality)
        return len(items)


def run_naive_ray(recipe: Recipe, images: Path, out: Path, procs: int) -> int:
    import ray
    from ray.util import ActorPool

    ray.init(address="local", num_cpus=procs, include_dashboard=False,
             _node_ip_address="127.0.0.1", log_to_driver=False)
    try:
        actor = ray.remote(num_cpus=0.5)(NaiveAugmenter)  # fractional: no 2-CPU deadlock
        pool = ActorPool([actor.remote(str(out), recipe.size, recipe.quality)
                          for _ in range(procs)])
        items = [(key, str(path)) for key, path in list_images(images)]
        chunks = [chunk for _, chunk in _chunks(items, RAY_CHUNK)]
        return sum(pool.map_unordered(lambda a, chunk: a.process.remote(chunk), chunks))
    finally:
        ray.shutdown()


def run_dali(recipe: Recipe, images: Path, out: Path, procs: int) -> int:
    """DALI on the GPU: fused decode + random crop, flip, colour twist, rotate; nvJPEG encode."""
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.plugin.base_iterator import LastBatchPolicy
    from nvidia.dali.plugin.pytorch import DALIGenericIterator

    @pipeline_def(batch_size=SHARD_ROWS, num_threads=procs, device_id=0, seed=SEED)
    def pipeline():  # type: ignore[no-untyped-def]
        jpegs, _ = fn.readers.file(file_root=str(images), name="reader", random_shuffle=False)
        decoded = fn.decoders.image_random_crop(jpegs, device="mixed", output_type=types.RGB,
                                                random_area=list(CROP_SCALE),
                                                random_aspect_ratio=list(CROP_RATIO))
        resized = fn.resize(decoded, size=[recipe.size, recipe.size])
        flipped = fn.flip(resized, horizontal=fn.random.coin_flip(probability=P_FLIP))
        coloured = fn.color_twist(
            flipped,
            brightness=fn.random.uniform(range=[1 - BRIGHTNESS, 1 + BRIGHTNESS]),
            contrast=fn.random.uniform(range=[1 - CONTRAST, 1 + CONTRAST]),
            saturation=fn.random.uniform(range=[1 - SATURATION, 1 + SATURATION]),
            hue=fn.random.uniform(range=[-HUE * 360, HUE * 360]))
        return fn.rotate(coloured, angle=fn.random.uniform(range=[-DEGREES, DEGREES]),
                         keep_size=True, fill_value=0)

    pipe = pipeline()
    pipe.build()
    batches = DALIGenericIterator(pipe, ["images"], reader_name="reader",
                                  last_batch_policy=LastBatchPolicy.PARTIAL, auto_reset=False)
    written = 0
    for index, batch in enumerate(batches):
        encoded = _encode_gpu(batch[0]["images"], recipe.quality)
        keys = [f"dali/{written + i:08d}.jpg" for i in range(len(encoded))]
        write_shard(out / f"part-{index:05d}.parquet", keys, encoded)
        written += len(encoded)
    return written


def _encode_gpu(batch: Any, quality: int) -> list[bytes]:
    """A batch of HWC uint8 CUDA tensors to JPEG: nvJPEG via torchvision, else Pillow."""
    try:
        from torchvision.io import encode_jpeg

        tensors = [image.permute(2, 0, 1).contiguous() for image in batch]
        return [bytes(t.cpu().numpy()) for t in encode_jpeg(tensors, quality=quality)]
    except (ImportError, RuntimeError, TypeError):
        from PIL import Image

        encoded = []
        for array in batch.cpu().numpy():
            buffer = io.BytesIO()
            Image.fromarray(array).save(buffer, "JPEG", quality=quality)
            encoded.append(buffer.getvalue())
        return encoded


WORKERS: dict[str, Callable[..., int]] = {
    "floor": lambda r, images, out, procs, ann: run_pool(r, images, out, procs, "floor", ann),
    "albumentations": lambda r, images, out, procs, ann: run_pool(r, images, out, procs,
                                                                   "albumentations", ann),
    "naive-ray": lambda r, images, out, procs, ann: run_naive_ray(r, images, out, procs),
    "dali": lambda r, images, out, procs, ann: run_dali(r, images, out, procs),
}


def worker_main(argv: list[str]) -> None:
    """Child side: `bench.py _worker RUNNER RECIPE IMAGES OUT --cores K`; prints one JSON line."""
    global _RECIPE
    parser = argparse.ArgumentParser(prog="bench.py _worker")
    parser.add_argument("runner", choices=sorted(WORKERS))
    parser.add_argument("recipe", choices=sorted(RECIPES))
    parser.add_argument("images", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--cores", type=int, default=cores())
    parser.add_argument("--annotations")
    args = parser.parse_args(argv)
    _RECIPE = RECIPES[args.recipe]  # before the pool forks: its processes inherit it
    started = time.monotonic()
    written = WORKERS[args.runner](_RECIPE, args.images, args.out, args.cores, args.annotations)
    print(json.dumps({"written": written, "work_seconds": round(time.monotonic() - started, 3)}))


# --------------------------------------------------------------------------- augment stage alone


def augment_only(args: argparse.Namespace) -> int:
    """`rayaug.augment.Augmenter` alone, in this process, no Ray: sources read into memory
    first (not timed), then decode -> ops -> encode per recipe, timed; prints images/s."""
    sys.modules["ray"] = None  # type: ignore[assignment]  # proof: importing Ray here fails
    from rayaug import sources, storage
    from rayaug.augment import Augmenter
    from rayaug.spec import parse_spec

    gpu_name = None
    if args.device != "cpu":
        import torch

        if not torch.cuda.is_available():
            print(f"--device {args.device}: torch sees no CUDA device", file=sys.stderr)
            return 2
        gpu_name = torch.cuda.get_device_name(0)
    info = machine_info(gpu_name)
    print_machine(info)
    scratch = Path(tempfile.mkdtemp(prefix="rayaug-bench-augment."))
    try:
        photos = own_photos(args.input, scratch) if args.input else photos_for(args.n, args.photos)
        print(f"augment stage alone on {args.device}, no Ray: {photos.n} {photos.name} photos "
              f"({photos.images}) x {args.repeat}, batch size {args.batch_size}", flush=True)
        results: dict[str, dict[str, Any]] = {}
        for key in args.recipes:
            recipe = RECIPES[key]
            spec_data = rayaug_spec(recipe, photos.images, str(scratch / "out"), photos.n,
                                    args.device != "cpu", {}, photos.annotations)
            spec_data["execution"]["batch_size"] = args.batch_size
            spec = parse_spec(spec_data, f"recipe {key}")
            results[key] = augment_recipe(spec, recipe, args.device, args.repeat, sources, storage,
                                          Augmenter)
            r = results[key]
            print(f"  {key} {recipe.title:58} {r['images_per_second']:>9,.1f} img/s  "
                  f"({r['samples']} in {r['seconds']:.2f} s; warm-up {r['warmup_seconds']:.2f} s,"
                  f" read {r['read_seconds']:.2f} s untimed, {r['quarantined']} quarantined)",
                  flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if args.json:
        document = {"schema": 2, "mode": "augment-only", "device": args.device,
                    "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": info,
                    "config": {"n": photos.n, "repeat": args.repeat, "photos": photos.name,
                               "batch_size": args.batch_size,
                               "recipes": {k: RECIPES[k].describe() for k in args.recipes}},
                    "results": results}
        args.json.write_text(json.dumps(document, indent=2) + "\n")
        print(f"wrote {args.json}")
    expected = photos.n * args.repeat
    return 1 if any(r["quarantined"] or r["samples"] != expected for r in results.values()) else 0


def augment_recipe(spec: Any, recipe: Recipe, device: str, repeat: int, sources: Any,
                   storage: Any, augmenter_class: Any) -> dict[str, Any]:
    started = time.monotonic()
    location = storage.open_location(spec.input.uri, spec.storage)
    listing = sources.list_input(location, spec.input, spec.output.shard_size)
    units = [sources.read_unit(location, spec.input, listing.format, unit)
             for unit in listing.units]
    if repeat > 1:  # each source again under another key: other seeds, other parameters
        units = [[dataclasses.replace(s, key=f"{s.key}~{k}") for s in unit]
                 for k in range(repeat) for unit in units]
    read = time.monotonic() - started
    augmenter = augmenter_class(spec, device)
    started = time.monotonic()  # first batch: imports, CUDA context, kernels; not counted
    augmenter.augment(units[0][:spec.execution.batch_size])
    _synchronize(device)
    warmup = time.monotonic() - started
    samples = quarantined = 0
    started = time.monotonic()
    for unit in units:  # one unit = one output shard, as an actor gets them
        output = augmenter.augment(unit)
        samples += len(output.samples)
        quarantined += len(output.quarantined)
    _synchronize(device)
    seconds = time.monotonic() - started
    return {"recipe": recipe.key, "samples": samples, "quarantined": quarantined,
            "seconds": round(seconds, 3), "images_per_second": round(samples / seconds, 2),
            "warmup_seconds": round(warmup, 3), "read_seconds": round(read, 3),
            "shards": len(units)}


def _synchronize(device: str) -> None:
    if device != "cpu":
        import torch

        torch.cuda.synchronize()


# --------------------------------------------------------------------------- report

Results = dict[str, dict[int, dict[str, Result]]]  # recipe -> N -> runner -> result


def _mib(value: int | None) -> str:
    return "-" if not value else f"{value / 2**20:,.0f}"


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _good(result: Result | None) -> bool:
    return bool(result and result.complete and not result.error and result.images_per_second)


def print_result(result: Result) -> None:
    if result.error:
        print(f"  {result.runner}: FAILED ({result.error})", flush=True)
    print(f"  {result.recipe} {result.runner:15} {result.n:>7} images  "
          f"{_num(result.images_per_second):>8} img/s end to end  "
          f"{_num(result.steady_images_per_second):>8} steady  "
          f"start-up {_num(result.startup_seconds, 2):>6} s  "
          f"wall {_num(result.wall_seconds):>6} s  "
          f"PSS {_mib(result.peak_pss_bytes):>6} MiB", flush=True)
    if not result.complete:
        print(f"  WARNING: {result.runner} produced {result.outputs} outputs, expected {result.n}",
              flush=True)


def _ratio(ours: float | None, theirs: float | None) -> float | None:
    return round(ours / theirs, 3) if ours and theirs else None


def ratios(results: Results) -> dict[str, dict[str, dict[str, dict[str, float | None]]]]:
    """rayaug ÷ each peer, end to end and in steady state, per recipe and N."""
    table: dict[str, dict[str, dict[str, dict[str, float | None]]]] = {}
    for recipe, by_n in results.items():
        table[recipe] = {}
        for n, by_runner in by_n.items():
            ours = by_runner.get("rayaug")
            if not _good(ours):
                continue
            table[recipe][str(n)] = {
                peer: {"end_to_end": _ratio(ours.images_per_second, r.images_per_second),
                       "steady_state": _ratio(ours.steady_images_per_second,
                                              r.steady_images_per_second)}
                for peer, r in by_runner.items() if peer in PEERS and _good(r)
            }
    return table


def targets(results: Results, table: dict) -> dict[str, dict[str, Any]]:
    """Issue 11's targets against Albumentations, per recipe: at the largest size (4N) ≥ 1.0×
    end to end and ≥ 1.3× steady; at every smaller size, neither below 0.8×. None: not run."""
    verdicts: dict[str, dict[str, Any]] = {}
    for recipe, by_n in results.items():
        sizes = sorted(by_n)
        cells = {n: table.get(recipe, {}).get(str(n), {}).get("albumentations", {})
                 for n in sizes}
        verdict: dict[str, Any] = {}
        if len(sizes) > 1:
            large = cells[sizes[-1]]
            verdict[f"end_to_end_at_{sizes[-1]}_ge_{TARGETS['large_end_to_end']}"] = _at_least(
                large.get("end_to_end"), TARGETS["large_end_to_end"])
            verdict[f"steady_state_at_{sizes[-1]}_ge_{TARGETS['large_steady_state']}"] = (
                _at_least(large.get("steady_state"), TARGETS["large_steady_state"]))
        for n in sizes[:-1] if len(sizes) > 1 else sizes:
            for kind in ("end_to_end", "steady_state"):
                verdict[f"{kind}_at_{n}_ge_{TARGETS['small_floor']}"] = _at_least(
                    cells[n].get(kind), TARGETS["small_floor"])
        verdicts[recipe] = verdict
    return verdicts


def _at_least(value: float | None, bound: float) -> bool | None:
    return None if value is None else value >= bound


def print_recipe(recipe: Recipe, by_n: dict[int, dict[str, Result]], table: dict) -> None:
    print(f"\nrecipe {recipe.key}: {recipe.title} — "
          + ", ".join(step.op["name"] for step in recipe.steps)
          + f"; {recipe.size}px JPEG q{recipe.quality}")
    print(f"  {'runner':15} {'N':>7} {'e2e img/s':>10} {'steady':>9} {'start-up s':>10}"
          f" {'wall s':>8} {'RSS MiB':>8} {'PSS MiB':>8} {'procs':>5}  ok")
    for n, by_runner in by_n.items():
        for r in by_runner.values():
            ok = "yes" if r.complete and not r.error else f"NO ({r.outputs}/{r.n})"
            print(f"  {r.runner:15} {n:>7} {_num(r.images_per_second):>10} "
                  f"{_num(r.steady_images_per_second):>9} {_num(r.startup_seconds, 2):>10} "
                  f"{_num(r.wall_seconds):>8} {_mib(r.peak_rss_bytes):>8} "
                  f"{_mib(r.peak_pss_bytes):>8} {r.peak_processes or 0:>5}  {ok}")
    cells = table.get(recipe.key, {})
    peers = [p for p in PEERS if any(p in row for row in cells.values())]
    if not peers:
        print("  no ratios: rayaug and at least one peer must both run")
        return
    sizes = [str(n) for n in by_n]
    print("  rayaug ÷ peer, end to end / steady state:")
    print(f"  {'peer':15}" + "".join(f" {'N=' + n:>16}" for n in sizes))
    for peer in peers:
        row = "".join(
            f" {_num(cells.get(n, {}).get(peer, {}).get('end_to_end'), 2):>7} / "
            f"{_num(cells.get(n, {}).get(peer, {}).get('steady_state'), 2):<6}" for n in sizes)
        print(f"  {peer:15}{row}")


def print_summary(results: Results, table: dict, verdicts: dict) -> None:
    few = sorted({f"{r.recipe}/{r.runner}/N={r.n}" for by_n in results.values()
                  for rs in by_n.values() for r in rs.values() if r.commits < MIN_COMMITS})
    if few:
        print(f"\nnote: under {MIN_COMMITS} commits, steady state is noise, not a rate "
              f"({len(few)} runs, e.g. {few[0]}): use N ≥ {MIN_COMMITS * SHARD_ROWS:,}")
    print("\nsummary: rayaug ÷ Albumentations (end to end / steady state), rayaug ÷ floor "
          "(end to end), rayaug start-up s")
    sizes = sorted({n for by_n in results.values() for n in by_n})
    print(f"  {'recipe':7}" + "".join(f" {'albu N=' + str(n):>17} {'floor':>6} {'start':>6}"
                                      for n in sizes) + "  targets")
    for recipe, by_n in results.items():
        cells = ""
        for n in sizes:
            albu = table.get(recipe, {}).get(str(n), {}).get("albumentations", {})
            floor = table.get(recipe, {}).get(str(n), {}).get("floor", {})
            ours = by_n.get(n, {}).get("rayaug")
            cells += (f" {_num(albu.get('end_to_end'), 2):>8} /"
                      f" {_num(albu.get('steady_state'), 2):<6}"
                      f" {_num(floor.get('end_to_end'), 2):>6}"
                      f" {_num(ours.startup_seconds if ours else None, 1):>6}")
        verdict = verdicts.get(recipe, {})
        met = [v for v in verdict.values() if v is not None]
        state = "-" if not met else ("met" if all(met) else
                                     "NOT met: " + ", ".join(k for k, v in verdict.items()
                                                             if v is False))
        print(f"  {recipe:7}{cells}  {state}")


def report_json(path: Path, info: dict[str, Any], config: dict[str, Any], results: Results,
                table: dict, verdicts: dict) -> None:
    document = {
        "schema": 2,
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": info,
        "config": config,
        "results": {recipe: {str(n): {name: asdict(r) for name, r in rs.items()}
                             for n, rs in by_n.items()} for recipe, by_n in results.items()},
        "ratios": table,
        "targets": verdicts,
    }
    path.write_text(json.dumps(document, indent=2) + "\n")
    print(f"wrote {path}")


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="scripts/bench.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", default=",".join(RECIPES),
                        help=f"comma-separated recipes of: {', '.join(RECIPES)} (default: all)")
    parser.add_argument("--n", type=int, help="images at N (default 10000; 200 with --quick)")
    parser.add_argument("--quick", action="store_true", help="smoke run: N=200, no 4N run")
    parser.add_argument("--photos", choices=sorted(PHOTO_SETS), default="bundled",
                        help="; ".join(f"{k}: {v.help}" for k, v in PHOTO_SETS.items()))
    parser.add_argument("--input", type=Path, metavar="DIR",
                        help="your own image folder instead (all its images, one size, no 4N; "
                             "boxes for recipe d are generated)")
    parser.add_argument("--only", help=f"comma-separated runners of: {', '.join(RUNNERS)} "
                                       f"(default: {', '.join(DEFAULT_RUNNERS)})")
    parser.add_argument("--s3", action="store_true", help="also run rayaug to S3 (SeaweedFS)")
    parser.add_argument("--gpu", action="store_true",
                        help="rayaug with num_gpus: 1, and DALI as a peer when it imports")
    parser.add_argument("--json", type=Path, metavar="FILE", help="write all figures as JSON")
    parser.add_argument("--keep", action="store_true",
                        help="keep this run's outputs and logs in bench-data/runs (until the next)")
    parser.add_argument("--augment-only", action="store_true",
                        help="the augment stage alone (rayaug.augment.Augmenter, no Ray, no "
                             "peers): decode -> ops -> encode per recipe, images/s")
    parser.add_argument("--device", default="cpu",
                        help="--augment-only: cpu or cuda (default cpu)")
    parser.add_argument("--batch-size", type=int, default=64,
                        help="--augment-only: samples per device batch (default 64)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="--augment-only: use each photo K times under K keys (other "
                             "parameters), N x K samples without building N x K photos")
    args = parser.parse_args(argv)
    args.n = args.n or (200 if args.quick else 10_000)
    if args.n < 1:
        parser.error("--n must be ≥ 1")
    args.recipes = [r.strip() for r in args.recipe.split(",") if r.strip()]
    unknown = [r for r in args.recipes if r not in RECIPES]
    if unknown or not args.recipes:
        parser.error(f"unknown recipe(s) {', '.join(unknown)}; choose from {', '.join(RECIPES)}")
    if args.input and not args.input.is_dir():
        parser.error(f"--input {args.input}: not a directory")
    args.runners = select_runners(parser, args)
    return args


def select_runners(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    if args.only:
        chosen = [name.strip() for name in args.only.split(",") if name.strip()]
        unknown = [name for name in chosen if name not in RUNNERS]
        if unknown:
            parser.error(f"unknown runner(s) {', '.join(unknown)}; "
                         f"choose from {', '.join(RUNNERS)}")
        if "dali" in chosen and not args.gpu:
            parser.error("dali needs --gpu")
        args.s3 = args.s3 or "rayaug-s3" in chosen
    else:
        chosen = list(DEFAULT_RUNNERS) + ["rayaug-s3"] * args.s3 + ["dali"] * args.gpu
    return [name for name in RUNNERS if name in chosen]


def gpu_check(args: argparse.Namespace) -> str | None:
    """The GPU's name under --gpu; exit 2 without CUDA; drop DALI when it does not import."""
    if not args.gpu:
        return None
    try:
        import torch

        available = torch.cuda.is_available()
    except ImportError:
        available = False
    if not available:
        print("bench --gpu: no CUDA device visible to torch (CPU-only torch build, or no GPU); "
              "run without --gpu", file=sys.stderr)
        sys.exit(2)
    if "dali" in args.runners:
        try:
            import nvidia.dali  # noqa: F401
        except ImportError:
            print("note: nvidia.dali does not import; DALI is left out "
                  "(pip install nvidia-dali-cuda120)")
            args.runners.remove("dali")
    return torch.cuda.get_device_name(0)


def start_s3(run_dir: Path) -> Any:
    sys.path.insert(0, str(ROOT / "tests"))
    from s3server import SeaweedS3

    server = SeaweedS3(run_dir / "s3")
    server.start()
    server.create_bucket(S3_BUCKET)
    return server


def run_one(name: str, recipe: Recipe, photos: Photos, run_dir: Path, ray_tmp: Path,
            args: argparse.Namespace, s3: Any) -> Result:
    work = run_dir / recipe.key / f"n{photos.n}" / name
    shutil.rmtree(work, ignore_errors=True)
    if name == "rayaug":
        result = run_rayaug(name, recipe, photos, work, ray_tmp, args.gpu)
    elif name == "rayaug-s3":
        result = run_rayaug(name, recipe, photos, work, ray_tmp, args.gpu, s3)
    else:
        result = run_peer(name, recipe, photos, work, ray_tmp)
    if not args.keep:
        shutil.rmtree(work / "out", ignore_errors=True)
    return result


def run_all(args: argparse.Namespace, run_dir: Path, ray_tmp: Path, s3: Any) -> Results:
    """Size by size (all recipes at N first), each recipe's runners back to back."""
    if args.input:
        inputs = [own_photos(args.input, run_dir)]
    else:
        sizes = [args.n] if args.quick else [args.n, 4 * args.n]
        inputs = [photos_for(n, args.photos) for n in sizes]
    results: Results = {key: {} for key in args.recipes}
    for photos in inputs:
        print(f"\nN = {photos.n} ({photos.name} photos in {photos.images})", flush=True)
        for key in args.recipes:
            recipe = RECIPES[key]
            results[key][photos.n] = {}
            for name in args.runners:
                if name in FOUR_OPS_ONLY and key not in ("a", "b"):
                    continue  # hand-written for the four ops only
                result = run_one(name, recipe, photos, run_dir, ray_tmp, args, s3)
                results[key][photos.n][name] = result
                print_result(result)
    return results


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_worker"]:
        worker_main(argv[1:])
        return 0
    args = parse_args(argv)
    if args.augment_only:
        return augment_only(args)
    gpu_name = gpu_check(args)
    info = machine_info(gpu_name)
    print_machine(info)
    print(f"recipes: {', '.join(args.recipes)}; runners: {', '.join(args.runners)}; "
          + (f"input {args.input}" if args.input else
             f"{args.photos} photos, N = {args.n}" + ("" if args.quick else f" and {4 * args.n}")),
          flush=True)
    run_dir = fresh_run_dir()
    ray_tmp = Path(tempfile.mkdtemp(prefix="rayaug-bench.", dir="/tmp"))  # short socket paths
    s3 = start_s3(run_dir) if args.s3 else None
    try:
        results = run_all(args, run_dir, ray_tmp, s3)
    finally:
        if s3 is not None:
            s3.stop()
        shutil.rmtree(ray_tmp, ignore_errors=True)
        if args.keep:
            print(f"outputs kept in {run_dir} (the next run removes them)")
        else:
            shutil.rmtree(run_dir, ignore_errors=True)
    table = ratios(results)
    verdicts = targets(results, table)
    for key in args.recipes:
        print_recipe(RECIPES[key], results[key], table)
    print_summary(results, table, verdicts)
    if args.json:
        sizes = sorted({n for by_n in results.values() for n in by_n})
        config = {"n": args.n, "sizes": sizes, "quick": args.quick, "seed": SEED,
                  "photos": str(args.input) if args.input else args.photos,
                  "photo_set": None if args.input else asdict(PHOTO_SETS[args.photos]),
                  "runners": args.runners, "s3": args.s3, "gpu": args.gpu, "views": 1,
                  "shard_rows": {n: shard_rows(n) for n in sizes},
                  "recipes": {k: RECIPES[k].describe() for k in args.recipes},
                  "targets": TARGETS}
        report_json(args.json, info, config, results, table, verdicts)
    failed = any(r.error or not r.complete
                 for by_n in results.values() for rs in by_n.values() for r in rs.values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
