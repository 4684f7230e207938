"""The SeaweedFS helper itself: real S3 on loopback, credentials checked, data survives kill -9."""

from __future__ import annotations

import os
import socket
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


def test_ports_lie_below_the_ephemeral_range_in_this_workers_own_class(tmp_path: Path) -> None:
    """No process binding port 0 can take them, nor another pytest worker's server."""
    first_ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
    server = SeaweedS3(tmp_path / "weed")
    assert len(set(server.ports.values())) == len(server.ports)
    assert all(20000 <= port < first_ephemeral for port in server.ports.values())
    assert {port % 16 for port in server.ports.values()} == {worker % 16}


def test_a_port_taken_before_weed_binds_it_fails_start_with_weeds_reason(tmp_path: Path) -> None:
    server = SeaweedS3(tmp_path / "weed")
    port = server.ports["s3.port"]
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        # weed checks its ports first ("not available"); a port taken later kills it in bind
        reason = f"port {port} for S3 .* not available|127.0.0.1:{port}: bind: address already"
        with pytest.raises(RuntimeError, match=f"weed exited: .*({reason})"):
            server.start(timeout=30)
    assert not server.running
