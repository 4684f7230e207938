"""Shared fixtures: one real SeaweedFS S3 server and one real local Ray for the whole session.

Ray starts after the S3 server so that its workers inherit the S3 credentials (as they
would from a node's environment in production).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from s3server import SeaweedS3

from rayaug import sampledata

BUCKET = "rayaug-test"


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


@pytest.fixture(scope="session")
def device(request: pytest.FixtureRequest) -> str:
    chosen = request.config.getoption("--device")
    if chosen == "cuda":
        import torch

        if not torch.cuda.is_available():
            pytest.skip("--device cuda, but torch sees no GPU")
    return chosen


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    """A real S3 server on loopback; its credentials are in os.environ for the session."""
    server = SeaweedS3(tmp_path_factory.mktemp("seaweed"))
    server.start()
    server.create_bucket(BUCKET)
    saved = {key: os.environ.get(key) for key in server.env()}
    os.environ.update(server.env())
    yield server
    server.stop()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def ray_cluster(s3: SeaweedS3) -> Iterator[str]:
    """A local Ray on loopback shared by every test; yields its address for subprocess drivers."""
    import ray

    from rayaug.job import start_local_ray

    start_local_ray(  # the product's own way: loopback only, without any variable set
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"AWS_EC2_METADATA_DISABLED": "true"}},
    )
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


@pytest.fixture(scope="session")
def photos() -> list[sampledata.SamplePhoto]:
    """Real photographs (crops of scikit-image / scikit-learn samples), small for speed."""
    return list(sampledata.make_photos(24, seed=1, short_side=(96, 160)))


@pytest.fixture
def photo_folder(photos: list[sampledata.SamplePhoto], tmp_path: Path) -> Path:
    root = tmp_path / "input"
    sampledata.write_folder(photos, root)
    return root
