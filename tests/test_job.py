"""The driver end to end on a real local Ray: layout, determinism, resume, refusals, S3."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import webdataset as wds
import yaml
from conftest import BUCKET, RecordingProgress

from rayaug import commit, outputs, sampledata
from rayaug.errors import JobFailed, UsageError
from rayaug.job import (
    CALLS_PER_ACTOR,
    RunOptions,
    calls_per_actor,
    noted_interrupts,
    overlaps_shards,
    pool_shape,
    run_job,
    waits_for_every_actor,
)
from rayaug.local_ray import LOCAL_SYSTEM_CONFIG
from rayaug.replay import replay
from rayaug.reports.summary import verify
from rayaug.spec import ExecutionSpec, JobSpec, StorageSpec, parse_spec
from rayaug.storage import open_location

OPS = [
    {"name": "random_resized_crop", "size": 64, "scale": [0.3, 1.0]},
    {"name": "horizontal_flip"},
    {"name": "color_jitter", "brightness": 0.4, "contrast": 0.4, "saturation": 0.4, "hue": 0.1},
    {"name": "rotation", "degrees": 15, "p": 0.5},
    {"name": "gaussian_noise", "p": 0.3},
]


def make_spec(source: str, out: str, **overrides) -> JobSpec:
    data = {
        "input": {"uri": source},
        "output": {"uri": out, "shard_size": 5},
        "views": 2,
        "seed": 11,
        "ops": OPS,
        "execution": {"batch_size": 8, "concurrency": 1},
    }
    for key, value in overrides.items():
        data[key] = data[key] | value if isinstance(value, dict) and key in data else value
    return parse_spec(data)


def run(spec: JobSpec) -> RecordingProgress:
    progress = RecordingProgress()
    run_job(spec, RunOptions(), progress)
    return progress


def manifest_digests(uri: str) -> dict[str, tuple[str, str]]:
    table = outputs.manifests(open_location(uri, StorageSpec()))
    rows = table.select(["sample_id", "sha256", "ops"]).to_pylist()
    return {r["sample_id"]: (r["sha256"], r["ops"]) for r in rows}


def test_pool_shape_leaves_cpu_for_the_driver() -> None:
    shape = pool_shape(ExecutionSpec(), cpus=2, gpus=0)
    assert shape.size == 2 and shape.size * shape.cpus_per_actor <= 1.5
    assert pool_shape(ExecutionSpec(), cpus=16, gpus=4).size == 4
    assert pool_shape(ExecutionSpec(), cpus=16, gpus=4).gpus_per_actor == 1.0
    assert pool_shape(ExecutionSpec(concurrency=3, num_gpus=0), cpus=64, gpus=8).size == 3


def test_the_driver_leaves_the_decoders_to_the_actors() -> None:
    """OpenCV's import (0.2 s) would come before the driver starts its Ray, and the driver
    decodes nothing: the stage's modules are the actors', preloaded by the workers they take."""
    code = (
        "import sys, rayaug.cli, rayaug.api, rayaug.job; "
        "loaded = {'cv2', 'rayaug.augment'} & set(sys.modules); assert not loaded, loaded"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    assert "rayaug.augment" in LOCAL_SYSTEM_CONFIG["preload_python_modules"]


def test_a_ctrl_c_that_python_drops_in_a_finalizer_still_stops_the_driver(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Python drops a KeyboardInterrupt raised inside `__del__`; the driver, which runs Ray's
    finalizers all the time, must still stop at its next committed row, with no traceback."""
    reported = []
    monkeypatch.setattr(sys, "unraisablehook", reported.append)
    default = signal.signal(signal.SIGINT, signal.default_int_handler)  # xdist may ignore it
    try:
        with noted_interrupts() as ctrl_c:

            class Finalized:
                def __del__(self) -> None:
                    deadline = time.monotonic() + 10
                    while not ctrl_c.noted.is_set() and time.monotonic() < deadline:
                        time.sleep(0.001)  # the Ctrl-C's KeyboardInterrupt is raised here

            threading.Timer(0.1, os.kill, (os.getpid(), signal.SIGINT)).start()
            finalized = Finalized()
            del finalized  # returns: Python printed "Exception ignored" and went on
            with pytest.raises(KeyboardInterrupt):
                ctrl_c.check()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        assert sys.unraisablehook == reported.append and not reported
    finally:
        signal.signal(signal.SIGINT, default)


def test_run_writes_committed_layout(ray_cluster: str, photo_folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    progress = run(make_spec(str(photo_folder), str(out)))
    assert progress.commits[-1] == 48  # 24 photos x 2 views
    shards = [f"part-{i:05d}" for i in range(5)]
    for shard in shards:
        for view in (0, 1):  # by_view, the default with 2 views
            assert (out / "data" / f"view={view}" / f"{shard}.parquet").exists()
        assert (out / "manifests" / f"{shard}.parquet").exists()
    for name in ("_job/spec.yaml", "_job/fingerprint.json", "_job/plan.json", "_SUCCESS"):
        assert (out / name).exists(), name
    assert not (out / "_job" / "lock").exists()
    manifest = pq.read_table(out / "manifests" / "part-00000.parquet")
    for column in (
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
    ):
        assert column in manifest.column_names
    assert set(manifest.column("width").to_pylist()) == {64}
    output = outputs.recorded_output(open_location(str(out), StorageSpec()))
    assert verify(output) == []


@pytest.mark.parametrize(
    ("input_uri", "output_uri", "chosen", "overlaps"),
    [
        ("/data/in", "/data/out", "auto", False),  # a local disk: no storage waits to hide
        ("s3://in/photos", "/data/out", "auto", True),
        ("/data/in", "gs://out/run", "auto", True),
        ("az://in/photos", "abfs://out/run", "auto", True),
        ("/data/in", "/data/out", True, True),
        ("s3://in/photos", "s3://out/run", False, False),
    ],
)
def test_shard_calls_overlap_where_they_wait_on_cloud_storage_unless_told(
    input_uri: str, output_uri: str, chosen: bool | str, overlaps: bool
) -> None:
    spec = make_spec(input_uri, output_uri, execution={"overlap_shards": chosen})
    assert overlaps_shards(spec) is overlaps


def test_calls_per_actor_overlap_only_when_every_actor_gets_that_many() -> None:
    assert calls_per_actor(2, 2) == 1  # 2 shards, 2 actors: one each
    assert calls_per_actor(3, 2) == 1
    assert calls_per_actor(2 * CALLS_PER_ACTOR, 2) == CALLS_PER_ACTOR
    assert calls_per_actor(1000, 2) == CALLS_PER_ACTOR  # large jobs keep storage waits overlapped
    assert calls_per_actor(1, 1) == 1


def test_few_units_wait_for_every_actor_many_do_not() -> None:
    assert waits_for_every_actor(2, 2)  # 2 shards, 2 actors: each its own
    assert waits_for_every_actor(4, 2)  # 4 shards: two each, not four to the first one up
    assert not waits_for_every_actor(1000, 2)  # a late actor still finds work
    assert not waits_for_every_actor(80, 20)


def _shard_actor_tasks() -> dict[str, set[str]]:
    """Per pool actor (by id) the ids of the shard calls it ran, from Ray's own task events
    (the GCS's record of every task: its actor, its state), not from anything rayaug writes."""
    import ray
    from ray._private.state import state
    from ray.core.generated import common_pb2, gcs_pb2

    finished = common_pb2.TaskStatus.Value("FINISHED")
    actor_of: dict[str, str] = {}
    done: set[str] = set()
    for raw in state._connect_and_get_accessor().get_task_events():
        event = gcs_pb2.TaskEvents.FromString(raw)  # one task's events (they may come apart)
        task, info = event.task_id.hex(), event.task_info
        if "_ShardStage" in info.name and "submit" in info.name and info.actor_id:
            actor_of[task] = ray.ActorID(info.actor_id).hex()
        if finished in event.state_updates.state_ts_ns:
            done.add(task)
    tasks: dict[str, set[str]] = {}
    for task, actor in actor_of.items():
        if task in done:
            tasks.setdefault(actor, set()).add(task)
    return tasks


@pytest.mark.parametrize("shard_size", [4, 2])
def test_every_actor_of_a_small_job_runs_shards(
    ray_cluster: str, photos, tmp_path: Path, shard_size: int
) -> None:
    """Two shards or four on two actors. Ray Data hands a unit to the first actor with a free
    call, and queues twice the calls on an actor unless told: the first actor up took both
    shards of a two-shard job, or all four of a four-shard one (the other, idle once every unit
    was handed out, was stopped). Both wait for the whole pool before the first is handed out:
    on a busy machine, four tiny shards all went to the first actor up."""
    sampledata.write_folder(photos[:8], tmp_path / "input")
    spec = make_spec(
        str(tmp_path / "input"),
        str(tmp_path / "out"),
        output={"shard_size": shard_size},
        views=1,
        execution={"batch_size": shard_size, "concurrency": 2},
    )
    from ray._private.state import state

    earlier = set(state.actor_table(None))  # the actors of earlier tests' jobs
    shards = len(run(spec).commits)
    assert shards == 8 // shard_size
    deadline = time.monotonic() + 60  # task events reach the GCS in periodic batches
    while True:
        ran = {a: calls for a, calls in _shard_actor_tasks().items() if a not in earlier}
        if sum(map(len, ran.values())) >= shards or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert len(ran) == 2 and sum(map(len, ran.values())) == shards, ran


def test_same_bytes_whatever_batch_size_actor_count_and_overlap(
    ray_cluster: str, photo_folder: Path, tmp_path: Path
) -> None:
    """One actor with its shard calls overlapping (reads and writes beside the augmenting) and
    two actors taking their calls one at a time write the same bytes."""
    one = make_spec(
        str(photo_folder),
        str(tmp_path / "a"),
        execution={"batch_size": 1, "concurrency": 1, "overlap_shards": True},
    )
    many = make_spec(
        str(photo_folder),
        str(tmp_path / "b"),
        execution={"batch_size": 32, "concurrency": 2, "overlap_shards": False},
    )
    run(one)
    run(many)
    first, second = manifest_digests(str(tmp_path / "a")), manifest_digests(str(tmp_path / "b"))
    assert len(first) == 48 and first == second
    for shard in ("part-00000", "part-00004"):
        data = [(tmp_path / d / "data/view=1" / f"{shard}.parquet").read_bytes() for d in "ab"]
        assert data[0] == data[1]


def test_existing_output_of_another_job_is_refused(
    ray_cluster: str, photo_folder: Path, tmp_path: Path
) -> None:
    out = str(tmp_path / "out")
    run(make_spec(str(photo_folder), out))
    with pytest.raises(UsageError, match="different job"):
        run(make_spec(str(photo_folder), out, seed=12))
    # Execution settings do not change the output, so they do not make it another job.
    run(make_spec(str(photo_folder), out, execution={"batch_size": 3}))


def test_second_driver_on_the_same_output_is_refused(photo_folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    lease = commit.Lease(open_location(str(out), StorageSpec()))
    lease.acquire()
    try:
        with pytest.raises(UsageError, match="another run"):
            run(make_spec(str(photo_folder), str(out)))
    finally:
        lease.release()


def test_broken_inputs_are_quarantined_and_counted(
    ray_cluster: str, photo_folder: Path, tmp_path: Path
) -> None:
    (photo_folder / "astronaut" / "broken.jpg").write_text("not a jpeg")
    (photo_folder / "astronaut" / "empty.jpg").write_bytes(b"")
    out = tmp_path / "out"
    spec = make_spec(str(photo_folder), str(out), errors={"max_error_rate": 0.2})
    run(spec)
    errors = outputs.quarantine(open_location(str(out), spec.storage)).to_pylist()
    assert sorted(e["sample_id"] for e in errors) == [
        "astronaut/broken.jpg#0",
        "astronaut/broken.jpg#1",
        "astronaut/empty.jpg#0",
        "astronaut/empty.jpg#1",
    ]
    assert {e["stage"] for e in errors} == {"decode"}
    assert json_of(out / "_SUCCESS")["quarantined"] == 4


def json_of(path: Path) -> dict:
    return json.loads(path.read_text())


def test_error_budget_stops_the_job(ray_cluster: str, photo_folder: Path, tmp_path: Path) -> None:
    for i in range(6):
        (photo_folder / "coffee" / f"bad{i}.jpg").write_bytes(b"\xff\xd8\xff truncated")
    out = tmp_path / "out"
    with pytest.raises(JobFailed, match="error budget exceeded"):
        run(make_spec(str(photo_folder), str(out), errors={"max_error_rate": 0.05}))
    assert not (out / "_SUCCESS").exists()


@pytest.mark.s3
def test_webdataset_from_s3_to_s3(ray_cluster: str, s3, photos, tmp_path: Path) -> None:
    prefix = f"{BUCKET}/{uuid.uuid4().hex[:8]}"
    local = tmp_path / "tars"
    sampledata.write_webdataset(photos, local, samples_per_tar=10)
    s3fs = s3.filesystem()
    for tar in sorted(local.glob("*.tar")):
        with s3fs.open_output_stream(f"{prefix}/in/{tar.name}") as stream:
            stream.write(tar.read_bytes())
    spec = make_spec(f"s3://{prefix}/in", f"s3://{prefix}/out", output={"format": "webdataset"})
    run(spec)
    out = open_location(f"s3://{prefix}/out", spec.storage)
    assert verify(outputs.recorded_output(out)) == []
    tar = out.read_bytes("data/view=0/part-00000.tar")  # by_view: the default with 2 views
    (tmp_path / "part.tar").write_bytes(tar)
    samples = list(wds.WebDataset(str(tmp_path / "part.tar"), shardshuffle=False).decode("pil"))
    assert len(samples) == 10 and samples[0]["jpg"].size == (64, 64)
    assert {s["json"]["view"] for s in samples} == {0}
    assert "txt" not in samples[0] and samples[0]["json"]["label"] is not None
    assert s3.secret_key not in out.read_bytes("_job/spec.yaml").decode()


def test_parquet_input(ray_cluster: str, photos, tmp_path: Path) -> None:
    sampledata.write_parquet(photos, tmp_path / "pq", rows_per_file=12)
    out = tmp_path / "out"
    spec = make_spec(str(tmp_path / "pq"), str(out), input={"key_column": "key"})
    run(spec)
    rows = outputs.manifests(open_location(str(out), spec.storage)).to_pylist()
    assert len(rows) == 48
    assert {r["source_key"] for r in rows} == {p.key for p in photos}  # the key column


@pytest.mark.slow
def test_killed_driver_resumes_to_the_same_output(ray_cluster: str, photos, tmp_path: Path) -> None:
    source = tmp_path / "input"
    sampledata.write_folder(list(sampledata.make_photos(60, seed=5, short_side=(200, 300))), source)
    spec_file = tmp_path / "job.yaml"
    killed, clean = tmp_path / "killed", tmp_path / "clean"
    spec_data = {
        "input": {"uri": str(source)},
        "output": {"uri": str(killed), "shard_size": 2},
        "views": 3,
        "seed": 3,
        "ops": OPS,
        "execution": {"batch_size": 6, "concurrency": 2},
    }
    spec_file.write_text(yaml.safe_dump(spec_data))
    rayaug = Path(sys.executable).parent / "rayaug"
    driver = subprocess.Popen(
        [str(rayaug), "run", str(spec_file), "--address", ray_cluster],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=os.environ | {"RAY_ADDRESS": ""},
    )
    manifests = killed / "manifests"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and len(list(manifests.glob("*.parquet"))) < 2:
        assert driver.poll() is None, driver.stderr.read().decode()
        time.sleep(0.05)
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    committed_at_kill = len(list(manifests.glob("*.parquet")))
    assert 2 <= committed_at_kill < 30, "the kill must land mid-job"
    assert (killed / "_job" / "lock").exists()  # the dead driver's lease, taken over below

    resumed = run(parse_spec(spec_data))
    assert resumed.start >= 2 * 3  # committed samples were counted, not redone
    run(parse_spec(spec_data | {"output": {"uri": str(clean), "shard_size": 2}}))
    assert manifest_digests(str(killed)) == manifest_digests(str(clean))
    assert len(manifest_digests(str(clean))) == 180
    output = outputs.recorded_output(open_location(str(killed), StorageSpec()))
    assert verify(output) == []


def test_replay_from_manifest(ray_cluster: str, photo_folder: Path, tmp_path: Path) -> None:
    spec = make_spec(str(photo_folder), str(tmp_path / "out"))
    run(spec)
    output = outputs.recorded_output(open_location(spec.output.uri, spec.storage))
    for sample in sorted(manifest_digests(spec.output.uri))[::17]:
        result = replay(output, sample, spec.storage)
        assert result.matches
        image = outputs.read_images(output.location, spec, result.row["shard"])[sample]
        assert io.BytesIO(image).getvalue() == result.image
