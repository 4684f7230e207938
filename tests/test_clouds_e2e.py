"""A job from gs:// to gs:// and from az:// to az:// on the real emulators, end to end.

Each cloud: the driver (a subprocess on the session Ray, as `rayaug run` is) is SIGKILLed
mid-job, and the job resumed, giving the uninterrupted local run's output byte for byte;
`inspect --verify`, `replay` and `diff` read the output where it lies. Then an emulator of the test
alone is killed mid-job and restarted: the writes retry and the job completes, the same again.
The session Ray's workers found the emulators the way a node's workers do: from their
environment (STORAGE_EMULATOR_HOST; AZURE_STORAGE_CONNECTION_STRING, key included).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path

import pytest
import yaml
from azureserver import Azurite
from click.testing import CliRunner
from conftest import BUCKET, RecordingProgress
from faults import injection
from faults.test_storage_outage import (
    PHOTOS,
    SHARDS,
    VIEWS,
    assert_same_as_clean,
    spec_data,
    worker_retries,
)
from gcsserver import GcsEmulator

from rayaug import sampledata
from rayaug.cli import main
from rayaug.diff import CATEGORIES
from rayaug.job import RunOptions, run_job
from rayaug.spec import StorageSpec, parse_spec
from rayaug.storage import Location, open_location

pytestmark = [pytest.mark.s3, pytest.mark.slow]

SCHEMES = ["gs", "az"]


@pytest.fixture(scope="module")
def photos(photos: list[sampledata.SamplePhoto]) -> list[sampledata.SamplePhoto]:
    return photos[:PHOTOS]


@pytest.fixture(scope="module")
def clean(ray_cluster: str, photos: list, tmp_path_factory: pytest.TempPathFactory) -> Location:
    """The same job's output from an uninterrupted local run."""
    root = tmp_path_factory.mktemp("clouds-clean")
    sampledata.write_folder(photos, root / "input")
    run_job(
        parse_spec(spec_data(str(root / "input"), str(root / "out"))),
        RunOptions(),
        RecordingProgress(),
    )
    return open_location(str(root / "out"), StorageSpec())


def upload(photos: list, uri: str, storage: StorageSpec) -> None:
    location = open_location(uri, storage)
    for photo in photos:
        location.write_bytes(photo.key, photo.jpeg)


def committed(out: Location) -> int:
    return len(out.list("manifests"))


def wait_for(condition, alive, what: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert alive(), f"the job ended before {what}"
        assert time.monotonic() < deadline, f"no {what} in {timeout:g} s"
        time.sleep(0.1)


def cli(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_job_killed_and_resumed_equals_an_uninterrupted_run(
    scheme: str,
    request: pytest.FixtureRequest,
    ray_cluster: str,
    photos: list,
    clean: Location,
    tmp_path: Path,
) -> None:
    request.getfixturevalue("gcs" if scheme == "gs" else "azure")
    prefix = f"{scheme}://{BUCKET}/e2e-{uuid.uuid4().hex[:8]}"
    upload(photos, f"{prefix}/in", StorageSpec())
    data = spec_data(f"{prefix}/in", f"{prefix}/out")
    spec = injection.write_spec(tmp_path / "job.yaml", data)
    out = open_location(f"{prefix}/out", StorageSpec())

    driver = injection.start_driver(
        spec, ray_cluster, tmp_path / "driver.log", {"slow_augment": {"seconds": 0.5}}
    )
    try:
        wait_for(lambda: committed(out) >= 2, driver.alive, "two committed shards")
    finally:
        driver.kill()
    at_kill = committed(out)
    assert at_kill < SHARDS, "the kill must land mid-job"

    progress = RecordingProgress()
    summary = run_job(parse_spec(data), RunOptions(), progress)  # `rayaug run` on its output
    assert progress.start >= at_kill * 2 * VIEWS  # committed shards kept, not redone
    assert progress.start + summary.tally.new_samples == PHOTOS * VIEWS
    assert_same_as_clean(out, clean, photos)

    verified = cli("inspect", out.uri, "--verify")
    assert verified.exit_code == 0, verified.output
    assert "verify: OK" in verified.output
    sample = f"{photos[3].key}#1"
    replayed = cli("replay", out.uri, sample, "-o", str(tmp_path / "replayed.jpg"))
    assert replayed.exit_code == 0, replayed.output
    assert "identical" in replayed.output
    # Against the local run: the same samples, parameters and bytes; only the input's URI
    # differs (which `diff` counts as a spec difference).
    diffed = json.loads(cli("diff", out.uri, clean.uri, "--json").output)
    assert diffed["in_both"] == PHOTOS * VIEWS
    assert all(diffed[name]["count"] == 0 for name in CATEGORIES), diffed
    assert [change["path"] for change in diffed["spec"]] == ["input.uri"], diffed["spec"]


def own_emulator(scheme: str, request: pytest.FixtureRequest, root: Path):
    """An emulator of this test alone, reachable with the session's settings but for the
    endpoint (the spec names it): Azurite with the session's account key."""
    if scheme == "gs":
        server = GcsEmulator(root)
    else:
        session: Azurite = request.getfixturevalue("azure")
        server = Azurite(root)
        server.key = session.key
    server.start()
    server.create_bucket("outage")
    return server


@pytest.mark.parametrize("scheme", SCHEMES)
def test_job_survives_an_emulator_outage_mid_job(
    scheme: str,
    request: pytest.FixtureRequest,
    ray_cluster: str,
    photos: list,
    clean: Location,
    tmp_path: Path,
) -> None:
    request.getfixturevalue("gcs" if scheme == "gs" else "azure")
    began = time.time() - 1
    server = own_emulator(scheme, request, tmp_path / "server")
    try:
        storage = {"endpoint": f"http://{server.endpoint}", "retries": 10}
        prefix = f"{scheme}://outage/job-{uuid.uuid4().hex[:8]}"
        upload(photos, f"{prefix}/in", StorageSpec(**storage))
        spec = parse_spec(spec_data(f"{prefix}/in", f"{prefix}/out", storage))
        out = open_location(spec.output.uri, spec.storage)
        outcome: dict = {}

        def job() -> None:
            try:
                outcome["summary"] = run_job(spec, RunOptions(), RecordingProgress())
            except BaseException as error:  # reported below
                outcome["error"] = error

        worker = threading.Thread(target=job, name="rayaug-job", daemon=True)
        worker.start()
        try:
            wait_for(lambda: committed(out) >= 2, worker.is_alive, "two committed shards")
            server.outage()
            killed = time.monotonic()
            retried: list[str] = []
            while time.monotonic() < killed + 4 or (not retried and time.monotonic() < killed + 90):
                time.sleep(0.5)
                retried = worker_retries(f"{prefix}/", began)
            assert worker.is_alive(), f"the job ended during the outage: {outcome}"
            server.start()
        finally:
            worker.join(timeout=300)
        assert not worker.is_alive(), "the job did not finish within 300 s of the restart"
        assert "error" not in outcome, repr(outcome.get("error"))
        assert retried, "no worker logged a retry during the outage"
        assert outcome["summary"].tally.samples == PHOTOS * VIEWS
        assert_same_as_clean(out, clean, photos)
    finally:
        server.stop()


def test_example_specs_for_both_clouds_validate() -> None:
    for name in ("gcs-to-gcs.yaml", "azure-to-azure.yaml"):
        path = Path(__file__).resolve().parents[1] / "jobs" / name
        result = cli("validate", str(path))
        assert result.exit_code == 0, result.output
        assert yaml.safe_load(path.read_text())["input"]["uri"].split("://")[0] in ("gs", "az")
