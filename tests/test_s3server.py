"""The SeaweedFS helper itself: real S3 on loopback, credentials checked, data survives kill -9."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyarrow import fs
from s3server import SeaweedS3

pytestmark = pytest.mark.s3


def test_objects_survive_kill_and_restart(tmp_path: Path) -> None:
    with SeaweedS3(tmp_path / "weed") as server:
        server.create_bucket("bkt")
        s3 = server.filesystem(retry_strategy=fs.AwsStandardS3RetryStrategy(max_attempts=1))
        with s3.open_output_stream("bkt/dir/a.bin") as out:
            out.write(b"x" * 100_000)

        server.kill()
        with pytest.raises(OSError):  # an outage is visible to clients, not hidden
            s3.open_input_stream("bkt/dir/a.bin").read()

        server.restart()
        assert s3.open_input_stream("bkt/dir/a.bin").read() == b"x" * 100_000
        assert server.env()["AWS_ENDPOINT_URL"] == f"http://{server.endpoint}"


def test_wrong_secret_key_is_refused(tmp_path: Path) -> None:
    with SeaweedS3(tmp_path / "weed") as server:
        server.create_bucket("bkt")
        with server.filesystem().open_output_stream("bkt/k") as out:
            out.write(b"secret")
        intruder = fs.S3FileSystem(
            endpoint_override=server.endpoint,
            scheme="http",
            region=server.region,
            access_key=server.access_key,
            secret_key=server.secret_key + "x",
        )
        with pytest.raises(OSError, match="SIGNATURE_DOES_NOT_MATCH|ACCESS_DENIED"):
            intruder.get_file_info(fs.FileSelector("bkt", recursive=True))
        with pytest.raises(OSError):
            intruder.open_input_stream("bkt/k").read()
