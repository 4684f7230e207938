"""Side-by-side benchmark: rayaug against what a team would otherwise run, same input, same ops.

One invocation builds (or reuses) an ImageNet-like folder of N real-photo JPEGs under
bench-data/input/, then runs one runner after another on it, at N and at 4N images:

  floor           decode + resize to 224x224 + JPEG q90 only (Pillow, a process per core)
  albumentations  the four ops below with OpenCV codecs, a process per core
  naive-ray       Ray actors (one per core) calling Pillow per image, one JPEG file per image
  rayaug          `rayaug run SPEC --json` in a subprocess, Ray start-up included
  rayaug-s3       the same, writing to S3 on a SeaweedFS server on loopback (--s3)
  dali            NVIDIA DALI on the GPU (--gpu, when nvidia.dali imports)

Ops, in this order for every runner: RandomResizedCrop to 224 (scale 0.08-1, ratio 3/4-4/3),
HorizontalFlip (p 0.5), Rotation +-15 degrees (p 1, black corners), ColorJitter(0.4, 0.4, 0.4,
0.1) (p 1; rayaug's fused colour map, see the README); JPEG q90 out; Parquet shards of
256 rows (naive-ray: one file per image) on local disk.

Every runner is its own process tree, timed end to end (interpreter start and imports
included, for rayaug as for the peers), with the RSS and PSS of the whole tree (Ray's GCS,
raylet and workers included) sampled every 0.2 s. It is a benchmark, not a test: nothing
here asserts a time.

    scripts/bench [--n 10000] [--quick] [--only floor,rayaug] [--s3] [--gpu] [--json FILE]
"""

from __future__ import annotations

import argparse
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
from collections.abc import Iterator, Sequence
from contextlib import suppress
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "bench-data"
SEED = 0
SIZE = 224
QUALITY = 90
SHARD_ROWS = 256
RAY_CHUNK = 32  # images per naive-ray actor call
PSS_EVERY = 5  # PSS on every 5th memory sample (every ~1 s): reading it costs CPU
P_FLIP, P_JITTER, P_ROTATE = 0.5, 1.0, 1.0
BRIGHTNESS = CONTRAST = SATURATION = 0.4
HUE = 0.1
DEGREES = 15.0
CROP_SCALE, CROP_RATIO = (0.08, 1.0), (3 / 4, 4 / 3)

PEERS = ("floor", "albumentations", "naive-ray", "dali")
RUNNERS = ("floor", "albumentations", "naive-ray", "rayaug", "rayaug-s3", "dali")
DEFAULT_RUNNERS = ("floor", "albumentations", "naive-ray", "rayaug")
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


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def shard_rows(n: int, procs: int | None = None) -> int:
    """SHARD_ROWS, or fewer when N is small, so that every core gets a shard (all runners)."""
    return max(1, min(SHARD_ROWS, math.ceil(n / (procs or cores()))))


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
    packages = ("torch", "kornia", "ray", "pillow", "albumentations", "opencv-python-headless",
                "pyarrow", "nvidia-dali-cuda120", "nvidia-dali-cuda110")
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


# --------------------------------------------------------------------------- input


def input_folder(n: int, seed: int) -> Path:
    """The cached image folder of `n` photos for `seed`; built aside and renamed when done."""
    target = DATA / "input" / f"n{n}-seed{seed}"
    if (target / "COUNT").exists():
        return target
    from rayaug import sampledata

    for stale in target.parent.glob(f"{target.name}.partial-*"):  # left by a killed build
        if not psutil.pid_exists(int(stale.name.rsplit("-", 1)[1])):
            shutil.rmtree(stale, ignore_errors=True)
    partial = target.with_name(f"{target.name}.partial-{os.getpid()}")
    print(f"building {n} photos in {target} ...", flush=True)
    started = time.monotonic()
    photos = sampledata.make_photos(n, seed, short_side=(300, 600), quality=(75, 95))
    count = sampledata.write_folder(photos, partial / "images")
    (partial / "COUNT").write_text(f"{count}\n")
    try:
        partial.rename(target)
    except OSError:  # another invocation finished it first
        shutil.rmtree(partial, ignore_errors=True)
    print(f"built {count} photos in {time.monotonic() - started:.1f}s", flush=True)
    return target


def images_of(folder: Path) -> Path:
    return folder / "images"


def list_images(root: Path) -> list[tuple[str, Path]]:
    """(relative key, path) of every JPEG under root, sorted."""
    return sorted((p.relative_to(root).as_posix(), p) for p in root.rglob("*.jpg"))


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
    wall_seconds: float
    peak_rss_bytes: int
    peak_pss_bytes: int
    peak_processes: int
    stdout: str


@dataclass
class Result:
    runner: str
    n: int
    outputs: int = 0
    complete: bool = False
    wall_seconds: float | None = None
    images_per_second: float | None = None
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
        started = time.monotonic()
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
    return Measured(proc.returncode, wall, monitor.peak_rss, monitor.peak_pss,
                    monitor.peak_procs, stdout)


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def finish(result: Result, measured: Measured, log: Path) -> Result:
    result.wall_seconds = round(measured.wall_seconds, 3)
    result.peak_rss_bytes, result.peak_pss_bytes = measured.peak_rss_bytes, measured.peak_pss_bytes
    result.peak_processes = measured.peak_processes
    if measured.returncode != 0:
        result.error = f"exit {measured.returncode}; log {log}:\n{_tail(log)}"
    result.complete = result.outputs == result.n
    if result.outputs:
        result.images_per_second = round(result.outputs / measured.wall_seconds, 2)
    return result


def _last_json(stdout: str) -> dict[str, Any]:
    """The JSON document a child printed last (rayaug --json prints an indented one)."""
    start = stdout.rfind("\n{")
    text = stdout[start + 1:] if start >= 0 else stdout
    try:
        return json.loads(text)
    except ValueError:
        return {}


# --------------------------------------------------------------------------- counting


def parquet_rows(filesystem: Any, base: str) -> int:
    """Rows in every .parquet file under `base` (footers only)."""
    import pyarrow.parquet as pq
    from pyarrow import fs

    infos = filesystem.get_file_info(fs.FileSelector(base, recursive=True, allow_not_found=True))
    rows = 0
    for info in infos:
        if info.type == fs.FileType.File and info.path.endswith(".parquet"):
            with filesystem.open_input_file(info.path) as handle:
                rows += pq.ParquetFile(handle).metadata.num_rows
    return rows


def local_parquet_rows(base: Path) -> int:
    from pyarrow import fs

    return parquet_rows(fs.LocalFileSystem(), str(base))


def jpeg_files(base: Path) -> int:
    return sum(1 for _ in base.rglob("*.jpg"))


# --------------------------------------------------------------------------- peers (driver side)


def run_peer(name: str, images: Path, n: int, work: Path, ray_tmp: Path) -> Result:
    """Run one peer in its own process (`bench.py _worker ...`) and check its outputs."""
    out = work / "out"
    out.mkdir(parents=True)
    log = work / "stderr.log"
    command = [sys.executable, str(Path(__file__).resolve()), "_worker", name, str(images),
               str(out), "--cores", str(cores())]
    measured = measure(command, child_env(ray_tmp), log)
    result = Result(name, n)
    result.outputs = jpeg_files(out) if name == "naive-ray" else local_parquet_rows(out)
    result.extra = {"work_seconds": _last_json(measured.stdout).get("work_seconds")}
    return finish(result, measured, log)


# --------------------------------------------------------------------------- rayaug (driver side)


def rayaug_spec(images: Path, output_uri: str, n: int, gpu: bool, storage: dict[str, str]
                ) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "version": 1,
        "name": "bench",
        "input": {"uri": str(images), "format": "folder"},
        "output": {"uri": output_uri, "format": "parquet", "image_format": "jpeg",
                   "quality": QUALITY, "shard_size": shard_rows(n)},
        "views": 1,
        "seed": SEED,
        "ops": [
            {"name": "random_resized_crop", "size": SIZE, "scale": list(CROP_SCALE),
             "ratio": list(CROP_RATIO)},
            {"name": "horizontal_flip", "p": P_FLIP},
            {"name": "rotation", "degrees": DEGREES, "p": P_ROTATE},
            {"name": "color_jitter", "brightness": BRIGHTNESS, "contrast": CONTRAST,
             "saturation": SATURATION, "hue": HUE, "p": P_JITTER, "fused": True},
        ],
        "execution": {"num_gpus": 1 if gpu else 0},
    }
    if storage:
        spec["storage"] = storage
    return spec


def rayaug_binary() -> str:
    here = Path(sys.executable).with_name("rayaug")
    return str(here) if here.exists() else shutil.which("rayaug") or "rayaug"


def run_rayaug(name: str, images: Path, n: int, work: Path, ray_tmp: Path, gpu: bool,
               s3: Any = None) -> Result:
    """`rayaug run SPEC --json` in a subprocess, to local disk or to the S3 server `s3`."""
    import yaml

    work.mkdir(parents=True)
    log = work / "stderr.log"
    if s3 is None:
        output_uri, storage, env = str(work / "out"), {}, child_env(ray_tmp)
    else:
        prefix = f"{work.parent.parent.name}/{work.parent.name}"  # unique per invocation and N
        output_uri = f"s3://{S3_BUCKET}/{prefix}"
        storage = {"endpoint": f"http://{s3.endpoint}", "region": s3.region}
        env = child_env(ray_tmp, s3.env())
    spec_path = work / "job.yaml"
    spec_path.write_text(yaml.safe_dump(rayaug_spec(images, output_uri, n, gpu, storage),
                                        sort_keys=False))
    measured = measure([rayaug_binary(), "run", str(spec_path), "--json"], env, log)
    summary = _last_json(measured.stdout)
    result = Result(name, n)
    if s3 is None:
        result.outputs = local_parquet_rows(work / "out" / "data")
    else:
        result.outputs = parquet_rows(s3.filesystem(), f"{output_uri[5:]}/data")
    result.extra = {k: summary.get(k) for k in
                    ("startup_seconds", "wall_seconds", "samples_per_second", "quarantined")}
    return finish(result, measured, log)


# --------------------------------------------------------------------------- workers (child side)


def _chunks(items: Sequence[Any], size: int) -> Iterator[tuple[int, Sequence[Any]]]:
    for index, start in enumerate(range(0, len(items), size)):
        yield index, items[start:start + size]


def write_shard(path: Path, keys: list[str], images: list[bytes]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    labels = [key.split("/", 1)[0] for key in keys]
    pq.write_table(pa.table({"key": pa.array(keys, pa.string()),
                             "image": pa.array(images, pa.binary()),
                             "label": pa.array(labels, pa.string())}), path)


def _floor_shard(task: tuple[int, Sequence[tuple[str, Path]], Path]) -> int:
    """Decode, resize to SIZE x SIZE, encode: the codec's share of any augmentation job."""
    from PIL import Image

    index, items, out = task
    encoded = []
    for _, path in items:
        with Image.open(path) as image:
            small = image.convert("RGB").resize((SIZE, SIZE), Image.Resampling.BILINEAR)
        buffer = io.BytesIO()
        small.save(buffer, "JPEG", quality=QUALITY)
        encoded.append(buffer.getvalue())
    write_shard(out / f"part-{index:05d}.parquet", [k for k, _ in items], encoded)
    return len(items)


_ALBU: Any = None


def _albu_init() -> None:
    """Per process: OpenCV on one thread (one process per core) and the Compose."""
    global _ALBU
    import albumentations as A
    import cv2

    cv2.setNumThreads(1)
    _ALBU = A.Compose([
        A.RandomResizedCrop(size=(SIZE, SIZE), scale=CROP_SCALE, ratio=CROP_RATIO),
        A.HorizontalFlip(p=P_FLIP),
        A.Rotate(limit=DEGREES, border_mode=cv2.BORDER_CONSTANT, fill=0, p=P_ROTATE),
        A.ColorJitter(BRIGHTNESS, CONTRAST, SATURATION, HUE, p=P_JITTER),
    ], seed=SEED + os.getpid())


def _albu_shard(task: tuple[int, Sequence[tuple[str, Path]], Path]) -> int:
    import cv2
    import numpy as np

    index, items, out = task
    encoded = []
    for _, path in items:
        bgr = cv2.imdecode(np.fromfile(path, np.uint8), cv2.IMREAD_COLOR)
        rgb = _ALBU(image=cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB))["image"]
        ok, jpeg = cv2.imencode(".jpg", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR),
                                [cv2.IMWRITE_JPEG_QUALITY, QUALITY])
        if ok:
            encoded.append(jpeg.tobytes())
    write_shard(out / f"part-{index:05d}.parquet", [k for k, _ in items][:len(encoded)], encoded)
    return len(encoded)


def run_pool(images: Path, out: Path, procs: int, kind: str) -> int:
    """A process per core over Parquet shards of shard_rows(N) images."""
    import multiprocessing

    items = list_images(images)
    tasks = [(i, chunk, out) for i, chunk in _chunks(items, shard_rows(len(items), procs))]
    shard = _floor_shard if kind == "floor" else _albu_shard
    initializer = _albu_init if kind == "albumentations" else None
    with multiprocessing.get_context("fork").Pool(procs, initializer=initializer) as pool:
        return sum(pool.imap_unordered(shard, tasks))


# naive-ray: what a team writes by hand with Pillow, one image at a time.


def pil_random_resized_crop(image: Any, rng: random.Random) -> Any:
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
    return image.resize((SIZE, SIZE), Image.Resampling.BILINEAR, box=box)


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


def pil_augment(image: Any, rng: random.Random) -> Any:
    from PIL import Image

    image = pil_random_resized_crop(image.convert("RGB"), rng)
    if rng.random() < P_FLIP:
        image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    if rng.random() < P_ROTATE:
        image = image.rotate(rng.uniform(-DEGREES, DEGREES), Image.Resampling.BILINEAR)
    if rng.random() < P_JITTER:
        image = pil_color_jitter(image, rng)
    return image


class NaiveAugmenter:
    """The Ray actor of the naive script: read, augment and save each image as its own file."""

    def __init__(self, out: str) -> None:
        self.out = Path(out)
        self.rng = random.Random(os.getpid())

    def process(self, items: list[tuple[str, str]]) -> int:
        from PIL import Image

        for key, path in items:
            with Image.open(path) as image:
                augmented = pil_augment(image, self.rng)
            target = self.out / key
            target.parent.mkdir(parents=True, exist_ok=True)
            augmented.save(target, "JPEG", quality=QUALITY)
        return len(items)


def run_naive_ray(images: Path, out: Path, procs: int) -> int:
    import ray
    from ray.util import ActorPool

    ray.init(address="local", num_cpus=procs, include_dashboard=False,
             _node_ip_address="127.0.0.1", log_to_driver=False)
    try:
        actor = ray.remote(num_cpus=0.5)(NaiveAugmenter)  # fractional: no 2-CPU deadlock
        pool = ActorPool([actor.remote(str(out)) for _ in range(procs)])
        items = [(key, str(path)) for key, path in list_images(images)]
        chunks = [chunk for _, chunk in _chunks(items, RAY_CHUNK)]
        return sum(pool.map_unordered(lambda a, chunk: a.process.remote(chunk), chunks))
    finally:
        ray.shutdown()


def run_dali(images: Path, out: Path, procs: int) -> int:
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
        resized = fn.resize(decoded, size=[SIZE, SIZE])
        flipped = fn.flip(resized, horizontal=fn.random.coin_flip(probability=P_FLIP))
        rotated = fn.rotate(flipped, angle=fn.random.uniform(range=[-DEGREES, DEGREES]),
                            keep_size=True, fill_value=0)
        return fn.color_twist(
            rotated,
            brightness=fn.random.uniform(range=[1 - BRIGHTNESS, 1 + BRIGHTNESS]),
            contrast=fn.random.uniform(range=[1 - CONTRAST, 1 + CONTRAST]),
            saturation=fn.random.uniform(range=[1 - SATURATION, 1 + SATURATION]),
            hue=fn.random.uniform(range=[-HUE * 360, HUE * 360]))

    pipe = pipeline()
    pipe.build()
    batches = DALIGenericIterator(pipe, ["images"], reader_name="reader",
                                  last_batch_policy=LastBatchPolicy.PARTIAL, auto_reset=False)
    written = 0
    for index, batch in enumerate(batches):
        encoded = _encode_gpu(batch[0]["images"])
        keys = [f"dali/{written + i:08d}.jpg" for i in range(len(encoded))]
        write_shard(out / f"part-{index:05d}.parquet", keys, encoded)
        written += len(encoded)
    return written


def _encode_gpu(batch: Any) -> list[bytes]:
    """A batch of HWC uint8 CUDA tensors to JPEG: nvJPEG via torchvision, else Pillow."""
    try:
        from torchvision.io import encode_jpeg

        tensors = [image.permute(2, 0, 1).contiguous() for image in batch]
        return [bytes(t.cpu().numpy()) for t in encode_jpeg(tensors, quality=QUALITY)]
    except (ImportError, RuntimeError, TypeError):
        from PIL import Image

        encoded = []
        for array in batch.cpu().numpy():
            buffer = io.BytesIO()
            Image.fromarray(array).save(buffer, "JPEG", quality=QUALITY)
            encoded.append(buffer.getvalue())
        return encoded


WORKERS = {
    "floor": lambda images, out, procs: run_pool(images, out, procs, "floor"),
    "albumentations": lambda images, out, procs: run_pool(images, out, procs, "albumentations"),
    "naive-ray": run_naive_ray,
    "dali": run_dali,
}


def worker_main(argv: list[str]) -> None:
    """Child side: `bench.py _worker RUNNER IMAGES OUT --cores K`; prints one JSON line."""
    parser = argparse.ArgumentParser(prog="bench.py _worker")
    parser.add_argument("runner", choices=sorted(WORKERS))
    parser.add_argument("images", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--cores", type=int, default=cores())
    args = parser.parse_args(argv)
    started = time.monotonic()
    written = WORKERS[args.runner](args.images, args.out, args.cores)
    print(json.dumps({"written": written, "work_seconds": round(time.monotonic() - started, 3)}))


# --------------------------------------------------------------------------- report


def _mib(value: int | None) -> str:
    return "-" if not value else f"{value / 2**20:,.0f}"


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def print_result(result: Result) -> None:
    if result.error:
        print(f"  {result.runner}: FAILED ({result.error})", flush=True)
    startup = result.extra.get("startup_seconds")
    print(f"  {result.runner:15} {result.n:>7} images  {_num(result.images_per_second):>9} img/s  "
          f"{_num(result.wall_seconds):>7} s  peak RSS {_mib(result.peak_rss_bytes):>6} MiB  "
          f"PSS {_mib(result.peak_pss_bytes):>6} MiB  {result.peak_processes or 0:>3} procs"
          + (f"  start-up {startup:.1f} s" if startup is not None else ""), flush=True)
    if not result.complete:
        print(f"  WARNING: {result.runner} produced {result.outputs} outputs, expected {result.n}",
              flush=True)


def ratios(results: dict[int, dict[str, Result]]) -> dict[str, dict[str, float]]:
    """rayaug img/s divided by each peer's img/s, per N."""
    def good(result: Result | None) -> bool:
        return bool(result and result.complete and not result.error and result.images_per_second)

    table: dict[str, dict[str, float]] = {}
    for n, by_runner in results.items():
        ours = by_runner.get("rayaug")
        if not good(ours):
            continue
        table[str(n)] = {
            peer: round(ours.images_per_second / r.images_per_second, 3)
            for peer, r in by_runner.items() if peer in PEERS and good(r)
        }
    return table


def print_summary(
    results: dict[int, dict[str, Result]], table: dict[str, dict[str, float]]
) -> None:
    print("\nall runs (images/s end to end, wall s, peak memory of the process tree):")
    print(f"  {'runner':15} {'N':>7} {'img/s':>9} {'wall s':>8} {'RSS MiB':>8} {'PSS MiB':>8}"
          f" {'procs':>5}  ok")
    for n, by_runner in results.items():
        for r in by_runner.values():
            ok = "yes" if r.complete and not r.error else f"NO ({r.outputs}/{r.n})"
            print(f"  {r.runner:15} {n:>7} {_num(r.images_per_second):>9} "
                  f"{_num(r.wall_seconds):>8} {_mib(r.peak_rss_bytes):>8} "
                  f"{_mib(r.peak_pss_bytes):>8} {r.peak_processes or 0:>5}  {ok}")
    sizes = [str(n) for n in results]
    peers = [p for p in PEERS if any(p in row for row in table.values())]
    if not peers:
        print("\nno ratios: rayaug and at least one peer must both run")
    else:
        print("\nrayaug img/s ÷ peer img/s:")
        print(f"  {'peer':15}" + "".join(f" {'N=' + n:>10}" for n in sizes))
        for peer in peers:
            cells = "".join(f" {_num(table.get(n, {}).get(peer), 2):>10}" for n in sizes)
            print(f"  {peer:15}{cells}")
    for n, by_runner in results.items():
        for name in ("rayaug", "rayaug-s3"):
            if name in by_runner and by_runner[name].extra.get("startup_seconds") is not None:
                print(f"{name} startup_seconds at N={n}: "
                      f"{by_runner[name].extra['startup_seconds']:.2f}")
    print_scaling(results)


def print_scaling(results: dict[int, dict[str, Result]]) -> None:
    if len(results) < 2:
        return
    small, large = (results[n].get("rayaug") for n in sorted(results)[:2])
    if not (small and large and small.complete and large.complete):
        return
    if small.wall_seconds and large.wall_seconds and small.peak_pss_bytes:
        print(f"rayaug 4N vs N: wall ×{large.wall_seconds / small.wall_seconds:.2f}, "
              f"peak PSS ×{(large.peak_pss_bytes or 0) / small.peak_pss_bytes:.2f}, "
              f"peak RSS ×{(large.peak_rss_bytes or 0) / (small.peak_rss_bytes or 1):.2f}")


def report_json(path: Path, info: dict[str, Any], config: dict[str, Any],
                results: dict[int, dict[str, Result]], table: dict[str, dict[str, float]]) -> None:
    document = {
        "schema": 1,
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": info,
        "config": config,
        "runs": {str(n): {name: asdict(r) for name, r in rs.items()} for n, rs in results.items()},
        "ratios": table,
        "rayaug_startup_seconds": {
            str(n): rs["rayaug"].extra.get("startup_seconds")
            for n, rs in results.items() if "rayaug" in rs
        },
    }
    path.write_text(json.dumps(document, indent=2) + "\n")
    print(f"wrote {path}")


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="scripts/bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, help="images at N (default 10000; 200 with --quick)")
    parser.add_argument("--quick", action="store_true", help="smoke run: N=200, no 4N run")
    parser.add_argument("--only", help=f"comma-separated runners of: {', '.join(RUNNERS)}")
    parser.add_argument("--s3", action="store_true", help="also run rayaug to S3 (SeaweedFS)")
    parser.add_argument("--gpu", action="store_true",
                        help="rayaug with num_gpus: 1, and DALI as a peer when it imports")
    parser.add_argument("--json", type=Path, metavar="FILE", help="write all figures as JSON")
    parser.add_argument("--keep", action="store_true",
                        help="keep this run's outputs and logs in bench-data/runs (until the next)")
    args = parser.parse_args(argv)
    args.n = args.n or (200 if args.quick else 10_000)
    if args.n < 1:
        parser.error("--n must be ≥ 1")
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


def run_one(name: str, n: int, images: Path, run_dir: Path, ray_tmp: Path,
            args: argparse.Namespace, s3: Any) -> Result:
    work = run_dir / f"n{n}" / name
    shutil.rmtree(work, ignore_errors=True)
    if name == "rayaug":
        result = run_rayaug(name, images, n, work, ray_tmp, args.gpu)
    elif name == "rayaug-s3":
        result = run_rayaug(name, images, n, work, ray_tmp, args.gpu, s3)
    else:
        result = run_peer(name, images, n, work, ray_tmp)
    if not args.keep:
        shutil.rmtree(work / "out", ignore_errors=True)
    return result


def run_all(args: argparse.Namespace, run_dir: Path, ray_tmp: Path, s3: Any
            ) -> dict[int, dict[str, Result]]:
    sizes = [args.n] if args.quick else [args.n, 4 * args.n]
    results: dict[int, dict[str, Result]] = {}
    for n in sizes:
        images = images_of(input_folder(n, SEED))
        print(f"\nN = {n} ({images})", flush=True)
        results[n] = {}
        for name in args.runners:
            results[n][name] = run_one(name, n, images, run_dir, ray_tmp, args, s3)
            print_result(results[n][name])
    return results


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_worker"]:
        worker_main(argv[1:])
        return 0
    args = parse_args(argv)
    gpu_name = gpu_check(args)
    info = machine_info(gpu_name)
    print_machine(info)
    print(f"runners: {', '.join(args.runners)}; N = {args.n}"
          + ("" if args.quick else f" and {4 * args.n}"), flush=True)
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
    print_summary(results, table)
    if args.json:
        config = {"n": args.n, "sizes": list(results), "quick": args.quick, "seed": SEED,
                  "runners": args.runners, "s3": args.s3, "gpu": args.gpu, "size": SIZE,
                  "quality": QUALITY, "shard_rows": {n: shard_rows(n) for n in results},
                  "ops": rayaug_spec(Path("."), ".", args.n, args.gpu, {})["ops"]}
        report_json(args.json, info, config, results, table)
    failed = any(r.error or not r.complete for rs in results.values() for r in rs.values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
