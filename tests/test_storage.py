"""rayaug.storage: URIs to locations, atomic writes, retries with backoff, clear usage errors.

Object-store tests run on each real server of the session (`cloud`: SeaweedFS for s3://, the
GCS emulator for gs://, Azurite for az://); the outage test starts, kills and restarts a server
of its own.
"""

from __future__ import annotations

import base64
import logging
import os
import socket
import threading
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
from azureserver import Azurite
from conftest import BUCKET, CLOUDS
from gcsserver import GcsEmulator
from ports import free_port
from s3server import SeaweedS3

from rayaug import storage
from rayaug.errors import StorageError, UsageError
from rayaug.spec import StorageSpec
from rayaug.storage import check_reachable, open_location, retrying

# ---------------------------------------------------------------- open_location


def test_relative_path_resolves_against_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    location = open_location("out/run1", StorageSpec())
    expected = tmp_path.resolve() / "out" / "run1"
    assert location.is_local
    assert location.root == str(expected)
    assert location.uri == str(expected)
    assert location.attempts == StorageSpec().retries
    location.write_bytes("data/a.bin", b"abc")
    assert (expected / "data" / "a.bin").read_bytes() == b"abc"
    assert location.uri_of("data/a.bin") == f"{expected}/data/a.bin"


def test_absolute_path_and_file_uri_name_the_same_place(tmp_path: Path) -> None:
    by_path = open_location(str(tmp_path / "out"), StorageSpec(retries=2))
    by_uri = open_location(f"file://{tmp_path}/out/", StorageSpec(retries=2))
    assert by_path.is_local and by_uri.is_local
    assert by_path.root == by_uri.root == str(tmp_path.resolve() / "out")
    assert by_path.attempts == 2
    by_uri.write_bytes("x.bin", b"via file://")
    assert by_path.read_bytes("x.bin") == b"via file://"


def test_s3_uri_names_bucket_and_prefix(s3: SeaweedS3) -> None:
    location = open_location(f"s3://{BUCKET}/some/prefix/", StorageSpec(retries=1))
    assert not location.is_local
    assert location.root == f"{BUCKET}/some/prefix"
    assert location.uri == f"s3://{BUCKET}/some/prefix"
    assert location.uri_of("data/x") == f"s3://{BUCKET}/some/prefix/data/x"
    bucket_only = open_location(f"s3://{BUCKET}", StorageSpec())
    assert bucket_only.root == BUCKET


@pytest.mark.parametrize(
    ("uri", "words"),
    [
        ("s3://", ["names no bucket", "s3://BUCKET/PREFIX"]),
        ("s3:///prefix/only", ["names no bucket"]),
        ("gs://", ["names no bucket", "gs://BUCKET/PREFIX"]),
        ("az:///x", ["names no container", "az://CONTAINER/PREFIX"]),
        ("abfs://@acct.dfs.core.windows.net/x", ["names no container"]),
        ("hdfs://x", ["unsupported URI scheme 'hdfs'", "s3://", "gs://", "az://"]),
        ("http://x", ["unsupported URI scheme 'http'"]),
    ],
)
def test_malformed_or_unsupported_uri_is_a_usage_error(uri: str, words: list[str]) -> None:
    with pytest.raises(UsageError) as caught:
        open_location(uri, StorageSpec())
    message = str(caught.value)
    assert repr(uri) in message  # the user sees what they typed
    for word in words:
        assert word in message
    assert caught.value.exit_code == 2


def test_endpoint_that_is_not_a_url_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="storage.endpoint"):
        open_location(f"s3://{BUCKET}/x", StorageSpec(endpoint="http://"))


# ---------------------------------------------------------------- local writes


def test_local_write_is_atomic_and_leaves_no_temporary_files(tmp_path: Path) -> None:
    location = open_location(str(tmp_path), StorageSpec(retries=0))
    location.write_bytes("deep/folder/obj.bin", b"first")
    location.write_bytes("deep/folder/obj.bin", b"second, longer")  # overwrite
    assert (tmp_path / "deep" / "folder" / "obj.bin").read_bytes() == b"second, longer"
    assert sorted(p.name for p in (tmp_path / "deep" / "folder").iterdir()) == ["obj.bin"]
    assert location.list(recursive=True) == [("deep/folder/obj.bin", 14)]


def test_failed_local_write_leaves_neither_a_partial_target_nor_temporaries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    location = open_location(str(tmp_path), StorageSpec(retries=0))
    location.write_bytes("data/obj.bin", b"old complete content")

    def disk_full(fd: int) -> None:  # the bytes are in the temp file, the sync fails
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(storage.os, "fsync", disk_full)
    with pytest.raises(StorageError, match="No space left"):
        location.write_bytes("data/obj.bin", b"new content that never lands")
    with pytest.raises(StorageError):
        location.write_bytes("data/fresh.bin", b"x" * 1000)
    monkeypatch.undo()

    assert (tmp_path / "data" / "obj.bin").read_bytes() == b"old complete content"
    assert not (tmp_path / "data" / "fresh.bin").exists()
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["obj.bin"]


def test_local_round_trip(tmp_path: Path) -> None:
    location = open_location(str(tmp_path / "root"), StorageSpec(retries=0))
    assert location.list("nothing") == []
    assert not location.exists("a.bin")
    location.write_bytes("a.bin", b"A")
    location.write_bytes("sub/b.bin", b"BB")
    assert location.exists("a.bin") and location.exists("sub")
    assert location.list() == [("a.bin", 1)]
    assert location.list(recursive=True) == [("a.bin", 1), ("sub/b.bin", 2)]
    assert location.list("sub") == [("sub/b.bin", 2)]
    location.delete("a.bin")
    assert not location.exists("a.bin")
    with pytest.raises(StorageError, match="a.bin"):
        location.read_bytes("a.bin")


# ---------------------------------------------------------------- S3


def test_cloud_uri_names_bucket_and_prefix(cloud) -> None:
    scheme, _ = cloud
    location = open_location(f"{scheme}://{BUCKET}/some/prefix/", StorageSpec(retries=1))
    assert location.root == f"{BUCKET}/some/prefix"
    assert location.scheme == scheme
    assert location.uri_of("data/x") == f"{scheme}://{BUCKET}/some/prefix/data/x"


def test_abfs_uri_names_container_and_account(azure: Azurite) -> None:
    """abfs://CONTAINER@ACCOUNT.dfs.core.windows.net/PREFIX, the ADLS Gen2 form, names its
    account itself; it is the same store as az://CONTAINER/PREFIX."""
    by_abfs = open_location(
        f"abfs://{BUCKET}@{azure.account}.dfs.core.windows.net/p/", StorageSpec()
    )
    by_az = open_location(f"az://{BUCKET}/p", StorageSpec())
    assert by_abfs.root == by_az.root == f"{BUCKET}/p"
    by_abfs.write_bytes(f"x-{uuid.uuid4().hex}.bin", b"via abfs")
    assert [n for n, _ in by_az.list() if n.startswith("x-")]


def test_write_read_list_exists_delete(cloud) -> None:
    scheme, server = cloud
    prefix = f"test-storage-{uuid.uuid4().hex}"
    location = open_location(f"{scheme}://{BUCKET}/{prefix}", StorageSpec(retries=1))
    check_reachable(location, must_exist=False)
    assert location.list(recursive=True) == []
    payload = os.urandom(300_000)
    location.write_bytes("data/part-00000.bin", payload)
    location.write_bytes("manifests/part-00000.parquet", b"m")
    location.write_bytes("top.json", b"{}")
    assert location.read_bytes("data/part-00000.bin") == payload
    assert location.exists("data/part-00000.bin")
    assert location.exists("data")  # a prefix with objects under it
    assert not location.exists("data/part-00001.bin")
    assert location.list(recursive=True) == [
        ("data/part-00000.bin", len(payload)),
        ("manifests/part-00000.parquet", 1),
        ("top.json", 2),
    ]
    assert location.list("manifests") == [("manifests/part-00000.parquet", 1)]
    assert location.list() == [("top.json", 2)]
    check_reachable(location, must_exist=True)
    # The objects are really there, seen by a plain client of the server.
    with server.filesystem().open_input_stream(f"{BUCKET}/{prefix}/data/part-00000.bin") as f:
        assert f.read() == payload

    location.delete("data/part-00000.bin")
    assert not location.exists("data/part-00000.bin")
    with pytest.raises(StorageError, match="part-00000.bin"):
        location.read_bytes("data/part-00000.bin")


def test_overwrite_replaces_an_object_whole(cloud) -> None:
    """A second write of the same object (a retried shard) leaves the new bytes only."""
    scheme, _ = cloud
    location = open_location(f"{scheme}://{BUCKET}/over-{uuid.uuid4().hex}", StorageSpec())
    location.write_bytes("obj.bin", b"first, longer content")
    location.write_bytes("obj.bin", b"second")
    assert location.read_bytes("obj.bin") == b"second"
    assert location.list() == [("obj.bin", 6)]


def test_missing_bucket_is_a_usage_error_naming_it(cloud) -> None:
    scheme, _ = cloud
    bucket = f"absent-{uuid.uuid4().hex[:12]}"
    location = open_location(f"{scheme}://{bucket}/in", StorageSpec(retries=0))
    with pytest.raises(UsageError, match=f"no (bucket|container) '{bucket}'"):
        check_reachable(location, must_exist=True)


def test_missing_input_is_a_usage_error(cloud) -> None:
    scheme, _ = cloud
    location = open_location(f"{scheme}://{BUCKET}/absent-{uuid.uuid4().hex}", StorageSpec())
    check_reachable(location, must_exist=False)
    with pytest.raises(UsageError, match="does not exist"):
        check_reachable(location, must_exist=True)


# ---------------------------------------------------------------- retrying


@pytest.fixture
def no_sleep(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Record the backoff delays instead of sleeping; jitter fixed at its midpoint (x1.0)."""
    delays: list[float] = []
    monkeypatch.setattr(storage, "time", SimpleNamespace(sleep=delays.append))
    monkeypatch.setattr(storage, "random", SimpleNamespace(random=lambda: 0.5))
    return delays


def test_retrying_retries_transient_errors_with_growing_backoff(no_sleep: list[float]) -> None:
    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 4:
            raise ConnectionResetError("connection reset by peer")
        return "done"

    assert retrying(flaky, "writing thing", attempts=5, base_delay=0.5) == "done"
    assert len(calls) == 4
    assert no_sleep == [0.5, 1.0, 2.0]


def test_retrying_gives_up_with_storage_error_after_attempts(no_sleep: list[float]) -> None:
    calls = []

    def down() -> None:
        calls.append(1)
        raise OSError("AWS Error NETWORK_CONNECTION during PutObject operation: curlCode: 7")

    with pytest.raises(StorageError) as caught:
        retrying(down, "writing s3://b/x", attempts=3, base_delay=0.1)
    assert len(calls) == 4  # the first try and 3 retries
    assert no_sleep == pytest.approx([0.1, 0.2, 0.4])
    assert "writing s3://b/x" in str(caught.value)
    assert "NETWORK_CONNECTION" in str(caught.value)


def test_backoff_is_capped(no_sleep: list[float]) -> None:
    with pytest.raises(StorageError):
        retrying(lambda: (_ for _ in ()).throw(TimeoutError("slow")), "x", attempts=8)
    assert max(no_sleep) == 15.0
    assert no_sleep == sorted(no_sleep)


@pytest.mark.parametrize(
    "error",
    [
        FileNotFoundError(2, "No such file or directory"),
        OSError("AWS Error ACCESS_DENIED during HeadObject operation: No response body."),
        OSError("AWS Error SIGNATURE_DOES_NOT_MATCH during ListObjectsV2 operation"),
        OSError("AWS Error INVALID_ACCESS_KEY_ID during ListObjectsV2 operation"),
        OSError("AWS Error NO_SUCH_BUCKET during CreateMultipartUpload operation"),
    ],
    ids=["not-found", "access-denied", "bad-signature", "bad-key-id", "no-bucket"],
)
def test_permanent_errors_are_not_retried(no_sleep: list[float], error: OSError) -> None:
    calls = []

    def fail() -> None:
        calls.append(1)
        raise error

    with pytest.raises(StorageError):
        retrying(fail, "reading x", attempts=5)
    assert len(calls) == 1
    assert no_sleep == []


def test_non_storage_errors_pass_through_unretried(no_sleep: list[float]) -> None:
    calls = []

    def bug() -> None:
        calls.append(1)
        raise ValueError("a bug, not an outage")

    with pytest.raises(ValueError):
        retrying(bug, "x", attempts=5)
    assert len(calls) == 1


# ---------------------------------------------------------------- wrong settings, fast


# What each scheme's hint names for the secret to fix.
SECRET_VARIABLE = {"s3": "AWS_SECRET_ACCESS_KEY", "az": "AZURE_STORAGE_ACCOUNT_KEY"}


def _set_wrong_secret(scheme: str, server, monkeypatch: pytest.MonkeyPatch) -> str:
    """Put a wrong secret for `scheme` in the environment, the way its users set one."""
    if scheme == "gs":
        pytest.skip(
            "gcp-storage-emulator checks no credentials, so it cannot refuse a wrong one "
            "(test_unloadable_google_credentials_are_one_line covers gs://)"
        )
    if scheme == "az":
        wrong = base64.b64encode(os.urandom(32)).decode()
        monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", server.connection_string(wrong))
        return wrong
    wrong = "wrong-" + uuid.uuid4().hex
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", wrong)
    return wrong


def test_wrong_credentials_are_reported_without_the_secret(
    cloud, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    scheme, server = cloud
    wrong_secret = _set_wrong_secret(scheme, server, monkeypatch)
    location = open_location(f"{scheme}://{BUCKET}/creds-{uuid.uuid4().hex}", StorageSpec())
    with pytest.raises(UsageError) as caught:
        check_reachable(location, must_exist=False)
    message = str(caught.value)
    assert f"{scheme}:// credentials" in message
    assert SECRET_VARIABLE[scheme] in message  # what to fix
    assert wrong_secret not in message
    assert getattr(server, "secret_key", getattr(server, "key", "")) not in message

    # Every operation fails at once (no backoff on a refused signature), never leaking it.
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="rayaug.storage"):
        for work in (
            lambda: location.list(recursive=True),
            lambda: location.write_bytes("x", b"1"),
            lambda: location.read_bytes("x"),
        ):
            with pytest.raises(StorageError) as failed:
                work()
            assert wrong_secret not in str(failed.value)
    assert time.monotonic() - started < 10
    assert not [r for r in caplog.records if "retry" in r.getMessage()]


def test_unloadable_google_credentials_are_one_line(
    gcs: GcsEmulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without STORAGE_EMULATOR_HOST rayaug uses Google's default chain; a key file it cannot
    load is one line naming gs:// and what to set, and no call is retried."""
    monkeypatch.delenv("STORAGE_EMULATOR_HOST")
    for key_file in (tmp_path / "absent.json", tmp_path / "broken.json"):
        if key_file.name == "broken.json":
            key_file.write_text('{"type": "service_account"}')
        monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key_file))
        storage_spec = StorageSpec(endpoint=f"http://{gcs.endpoint}", retries=3)
        location = open_location(f"gs://{BUCKET}/x", storage_spec)
        with pytest.raises(UsageError) as caught:
            check_reachable(location, must_exist=True)
        message = str(caught.value)
        assert "gs:// credentials" in message and "GOOGLE_APPLICATION_CREDENTIALS" in message
        assert "\n" not in message and len(message) < 600
        started = time.monotonic()
        with pytest.raises(StorageError, match=key_file.name):
            location.read_bytes("x")
        assert time.monotonic() - started < 5


@pytest.mark.s3
def test_unknown_access_key_is_a_credentials_error(
    s3: SeaweedS3, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "nobody-" + uuid.uuid4().hex[:8])
    location = open_location(f"s3://{BUCKET}", StorageSpec())
    with pytest.raises(UsageError, match="credentials"):
        check_reachable(location, must_exist=True)
    with pytest.raises(StorageError, match="INVALID_ACCESS_KEY_ID"):
        location.list()


def test_unreachable_endpoint_is_a_fast_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "nobody")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "nothing")
    port = free_port()  # nothing listens there
    endpoint = f"http://127.0.0.1:{port}"
    location = open_location(
        f"s3://{BUCKET}/in", StorageSpec(endpoint=endpoint, region="us-east-1", retries=0)
    )
    started = time.monotonic()
    with pytest.raises(UsageError) as caught:
        check_reachable(location, must_exist=True)
    elapsed = time.monotonic() - started
    message = str(caught.value)
    assert f"127.0.0.1:{port}" in message
    assert "endpoint" in message
    assert f"s3://{BUCKET}/in" in message
    assert elapsed < 15


# ---------------------------------------------------------------- a real outage


def _own_server(scheme: str, root: Path, monkeypatch: pytest.MonkeyPatch):
    """A server of `scheme` of this test alone (it gets killed); the environment names it."""
    if scheme == "s3":
        server = SeaweedS3(root)
        # `weed mini` adds an identity from AWS_* in its environment: the session server's
        # credentials (same access key, other secret) would lock this server's own out.
        for key in server.env():
            monkeypatch.delenv(key, raising=False)
    else:
        server = GcsEmulator(root) if scheme == "gs" else Azurite(root)
    server.start()
    try:
        server.create_bucket("outage")
    except BaseException:
        server.stop()
        raise
    for key, value in server.env().items():
        monkeypatch.setenv(key, value)
    return server


@pytest.fixture(params=[pytest.param(scheme, marks=pytest.mark.s3) for scheme in CLOUDS])
def own_server(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    server = _own_server(request.param, tmp_path / "server", monkeypatch)
    try:
        yield request.param, server
    finally:
        server.stop()


def test_write_survives_a_storage_outage_through_retries(
    own_server, caplog: pytest.LogCaptureFixture
) -> None:
    scheme, server = own_server
    location = open_location(f"{scheme}://outage/job", StorageSpec(retries=8))
    location.write_bytes("before.bin", b"before")
    payload = os.urandom(200_000)
    server.kill() if scheme == "s3" else server.outage()

    outcome: dict[str, object] = {}

    def write() -> None:
        try:
            location.write_bytes("data/part-00000.bin", payload)
            outcome["done"] = time.monotonic()
        except BaseException as error:  # reported below
            outcome["error"] = error

    def retries() -> list[logging.LogRecord]:
        return [r for r in caplog.records if "retry" in r.getMessage()]

    with caplog.at_level(logging.WARNING, logger="rayaug.storage"):
        writer = threading.Thread(target=write)
        writer.start()
        # The server stays down until rayaug has retried: the AWS SDK's own 3 attempts can
        # take up to 3 s (its backoff draws up to 1 s, then 2 s), which a fixed outage of
        # 2 s was sometimes shorter than.
        deadline = time.monotonic() + 30
        while not retries() and writer.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert retries(), f"the write was not retried during the outage: {outcome}"
        assert writer.is_alive(), f"the write ended during the outage: {outcome}"
        server.restart()
        writer.join(timeout=60)
    assert not writer.is_alive()
    assert "error" not in outcome, outcome.get("error")
    assert location.read_bytes("data/part-00000.bin") == payload
    assert location.read_bytes("before.bin") == b"before"


def test_a_call_that_gets_no_answer_is_retried_after_its_deadline(
    cloud, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A server that accepts connections and never answers: past storage.request_timeout the
    call is a transient failure (S3: the AWS SDK's own timeout; gs/az: rayaug's deadline)."""
    scheme, _ = cloud
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    endpoint = f"http://127.0.0.1:{silent.getsockname()[1]}"
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", endpoint)
    spec = StorageSpec(endpoint=endpoint, retries=1, connect_timeout=1, request_timeout=2)
    location = open_location(f"{scheme}://{BUCKET}/silent", spec)
    started = time.monotonic()
    try:
        with (
            caplog.at_level(logging.WARNING, logger="rayaug.storage"),
            pytest.raises(StorageError),
        ):
            location.read_bytes("x")
    finally:
        silent.close()
    assert [r for r in caplog.records if "retry 1/1" in r.getMessage()]
    assert time.monotonic() - started < 30
