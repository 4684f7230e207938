"""Shared fixtures: real SeaweedFS S3, GCS and Azure servers and one real local Ray, each
started once per test process.

Ray starts after the S3 server and the GCS and Azure emulators so that its workers inherit
their endpoints and credentials (as they would from a node's environment in production).

Under pytest-xdist (`scripts/test` runs `-n 3 --dist loadgroup`) the tests are put in four
groups, each run by one worker in its usual order: SESSION_RAY and SESSION_RAY_FAULTS, the tests
that need a session Ray (the fault tests in tests/faults/ in the second; each group's worker
starts a session Ray and servers of its own, so the two halves of the suite's longest part run
side by side); SESSION_STORAGE, the tests that need only the object-store servers (their worker
starts servers of its own); OWN_RAY, the tests that start a Ray of their own (the embedded Ray
of a `rayaug run` subprocess, test heads, the bench smoke run, the loopback proof in its network
namespace) or are otherwise marked slow, so two of those never start side by side. The rest
(kernels, ops, codec, spec, ...) fill in wherever a worker is free. Much of the suite waits (on
deadlines, stalled servers, subprocesses): a third worker fills those waits on two cores.
Without xdist nothing changes.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from azureserver import Azurite
from gcsserver import GcsEmulator
from procserver import ProcessServer
from s3server import SeaweedS3

from rayaug import codec, sampledata

BUCKET = "rayaug-test"
SESSION_RAY = "session-ray"  # xdist_group: tests on the session's Ray (and its servers)
SESSION_RAY_FAULTS = "session-ray-faults"  # the same for tests/faults/, on a Ray of its own
SESSION_STORAGE = "session-storage"  # xdist_group: tests on the servers alone, no Ray
OWN_RAY = "own-ray"  # xdist_group: tests that start a Ray of their own, and the other slow ones


class RecordingProgress:
    """A rayaug.job.Progress that records what the driver reported, for assertions."""

    def __init__(self) -> None:
        self.start = 0
        self.commits: list[int] = []

    def started(self, tally) -> None:
        self.start = tally.samples

    def committed(self, tally) -> None:
        self.commits.append(tally.samples)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--device",
        default="cpu",
        choices=["cpu", "cpu-kornia", "cuda"],
        help="device for the augment tests: cpu (uint8 OpenCV kernels; the augment tests also"
        " run cpu-kornia, the device path on the CPU), cpu-kornia alone, or cuda on a GPU",
    )


def _group(item: pytest.Item) -> str | None:
    fixtures = set(getattr(item, "fixturenames", ()))
    if "ray_cluster" in fixtures:
        return SESSION_RAY_FAULTS if item.path.parent.name == "faults" else SESSION_RAY
    if {"s3", "gcs", "azure", "cloud"} & fixtures or item.get_closest_marker("s3"):
        return SESSION_STORAGE
    if item.get_closest_marker("own_ray") or item.get_closest_marker("slow"):
        return OWN_RAY
    return None


# xdist 3.8's own loadgroup puts the group in the test id through an attribute pytest 9 no
# longer reads, so it groups nothing here. Instead the workers write each grouped test's group
# to GROUPS_FILE (a file the controller names in the environment they inherit), and the
# controller's scheduler reads it: same-group tests form one unit of work, like loadgroup's.
GROUPS_FILE = "RAYAUG_TEST_GROUPS_FILE"


def _grouping(config: pytest.Config) -> bool:
    return getattr(config.option, "dist", "no") == "loadgroup" and bool(
        getattr(config.option, "numprocesses", None)
    )


def pytest_configure(config: pytest.Config) -> None:
    if _grouping(config) and not os.environ.get("PYTEST_XDIST_WORKER"):  # the controller
        handle, path = tempfile.mkstemp(prefix="rayaug-test-groups.", suffix=".json")
        os.close(handle)
        os.environ[GROUPS_FILE] = path
        config.add_cleanup(lambda: Path(path).unlink(missing_ok=True))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In an xdist worker: record each test's group and order the tests SESSION_RAY,
    SESSION_RAY_FAULTS, SESSION_STORAGE, OWN_RAY, then the ungrouped ones (each keeping its
    order). The three workers take the first three units, so the two session Rays start side by
    side (`start_local_ray` took 2.8 s in each, three workers starting on a 2-core machine; Ray
    gives a raylet a fixed 30 s to register). The storage worker goes on to OWN_RAY, whose Rays
    so start after the session's; the quick ungrouped tests fill in whichever worker runs out
    first. Two workers, one session Ray: 605 s; three, this order: 461 and 502 s; three with
    OWN_RAY last: 521 s, its 226 s started after the ungrouped tests."""
    path = os.environ.get(GROUPS_FILE)
    if not (os.environ.get("PYTEST_XDIST_WORKER") and path):
        return
    rank = {SESSION_RAY: 0, SESSION_RAY_FAULTS: 1, SESSION_STORAGE: 2, OWN_RAY: 3, None: 4}
    groups = {item: _group(item) for item in items}
    items.sort(key=lambda item: rank[groups[item]])  # stable
    written = Path(f"{path}.{os.environ['PYTEST_XDIST_WORKER']}")  # every worker writes the same
    written.write_text(json.dumps({i.nodeid: g for i, g in groups.items() if g}))
    os.replace(written, path)


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):  # noqa: ANN201 (xdist's types)
    if not _grouping(config):
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        """loadgroup by GROUPS_FILE: a grouped test's unit is its group, any other its own."""

        groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:  # read once every worker has collected
                self.groups = json.loads(Path(os.environ[GROUPS_FILE]).read_text() or "{}")
            return self.groups.get(nodeid, nodeid)

    config.option.loadscopereorder = False  # keep the order above, not biggest unit first
    return GroupScheduling(config, log)


@pytest.fixture(scope="session")
def device(request: pytest.FixtureRequest) -> str:
    chosen = request.config.getoption("--device")
    if chosen == "cuda":
        import torch

        if not torch.cuda.is_available():
            pytest.skip("--device cuda, but torch sees no GPU")
    return chosen


def _serve(server: SeaweedS3 | ProcessServer) -> Iterator[SeaweedS3 | ProcessServer]:
    """Start a session's server with its bucket; its client settings are in os.environ."""
    server.start()
    saved = {key: os.environ.get(key) for key in server.env()}
    try:
        server.create_bucket(BUCKET)
        os.environ.update(server.env())
        yield server
    finally:
        server.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    """A real S3 server on loopback; its credentials are in os.environ for the session."""
    yield from _serve(SeaweedS3(tmp_path_factory.mktemp("seaweed")))


@pytest.fixture(scope="session")
def gcs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GcsEmulator]:
    """A real GCS emulator on loopback; STORAGE_EMULATOR_HOST names it for the session."""
    yield from _serve(GcsEmulator(tmp_path_factory.mktemp("gcs")))


@pytest.fixture(scope="session")
def azure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Azurite]:
    """A real Azurite on loopback; AZURE_STORAGE_CONNECTION_STRING names it for the session."""
    yield from _serve(Azurite(tmp_path_factory.mktemp("azurite")))


CLOUDS = ["s3", "gs", "az"]
SERVER_FIXTURE = {"s3": "s3", "gs": "gcs", "az": "azure"}


@pytest.fixture(params=[pytest.param(scheme, marks=pytest.mark.s3) for scheme in CLOUDS])
def cloud(request: pytest.FixtureRequest) -> tuple[str, SeaweedS3 | ProcessServer]:
    """Each object store in turn: (URI scheme, its session server)."""
    return request.param, request.getfixturevalue(SERVER_FIXTURE[request.param])


@pytest.fixture(scope="session")
def ray_cluster(s3: SeaweedS3, gcs: GcsEmulator, azure: Azurite) -> Iterator[str]:
    """A local Ray on loopback shared by every test; yields its address for subprocess drivers."""
    import ray

    from rayaug.local_ray import start_local_ray

    start_local_ray(  # the product's own way: loopback only, without any variable set
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"AWS_EC2_METADATA_DISABLED": "true"}},
        # Ray's default again (the product's node reports none): test_job reads which actor
        # ran which shard from Ray's own task events, not from anything rayaug writes.
        _system_config={"task_events_report_interval_ms": 1000},
    )
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


@pytest.fixture(scope="session")
def photos() -> list[sampledata.SamplePhoto]:
    """Real photographs (crops of scikit-image / scikit-learn samples), small for speed."""
    return list(sampledata.make_photos(24, seed=1, short_side=(96, 160)))


@pytest.fixture
def counted_decodes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry per JPEG decode that gave pixels: windowed (libturbojpeg) or whole (OpenCV).
    Without libturbojpeg the windowed call returns None and the whole decode follows: one."""
    decodes: list[int] = []

    def counted(decoder):
        def decode(*args):
            pixels = decoder(*args)
            decodes.extend([] if pixels is None else [1])
            return pixels

        return decode

    monkeypatch.setattr(codec.jpeg_window, "decode", counted(codec.jpeg_window.decode))
    monkeypatch.setattr(codec, "_decode_plain_jpeg", counted(codec._decode_plain_jpeg))
    return decodes


@pytest.fixture
def photo_folder(photos: list[sampledata.SamplePhoto], tmp_path: Path) -> Path:
    root = tmp_path / "input"
    sampledata.write_folder(photos, root)
    return root
