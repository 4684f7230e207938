"""rayaug.commit: commit records, orphans, and the driver's lease on an output."""

from __future__ import annotations

import itertools
import json
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from conftest import BUCKET

from rayaug import commit
from rayaug.commit import LOCK, Lease
from rayaug.errors import UsageError
from rayaug.spec import StorageSpec
from rayaug.storage import Location, open_location


@pytest.fixture
def out(tmp_path: Path) -> Location:
    return open_location(str(tmp_path / "out"), StorageSpec(retries=0))


def _keep(out: Location, ext: str = "parquet") -> set[str]:
    """What the job keeps at the end: the data and errors of committed shards."""
    committed = commit.committed_shards(out)
    return {f"data/{s}.{ext}" for s in committed} | {commit.errors_path(s) for s in committed}


# ---------------------------------------------------------------- commit records and orphans


def test_committed_shards_are_exactly_the_manifests(out: Location) -> None:
    assert commit.committed_shards(out) == set()  # a fresh output has none
    for shard in ("part-00000", "part-00001", "part-00002"):
        out.write_bytes(f"data/{shard}.parquet", b"data")
    commit.commit_shard(out, "part-00000", b"manifest 0")
    commit.commit_shard(out, "part-00001", b"manifest 1")
    out.write_bytes("errors/part-00002.parquet", b"errors only")  # not a commit
    out.write_bytes("manifests/README.txt", b"not a manifest")
    out.write_bytes("manifests/part-00009.parquet.tmp-0123abcd", b"half a manifest")
    assert commit.committed_shards(out) == {"part-00000", "part-00001"}
    assert out.read_bytes(commit.manifest_path("part-00001")) == b"manifest 1"


def test_the_settled_count_takes_in_a_commit_that_lands_just_after_a_stop(out: Location) -> None:
    """A writer Ray was told to kill may still commit a moment later: the count waits for it."""
    commit.commit_shard(out, "part-00000", b"manifest 0")
    late = threading.Timer(0.3, commit.commit_shard, (out, "part-00001", b"manifest 1"))
    late.start()
    try:
        assert commit.settled_committed_shards(out, quiet_s=0.5) == {"part-00000", "part-00001"}
    finally:
        late.join()


def test_the_settled_count_ends_at_its_limit_while_commits_keep_arriving(out: Location) -> None:
    stop = threading.Event()

    def keep_committing() -> None:
        for number in itertools.count():
            if stop.wait(0.05):
                return
            commit.commit_shard(out, f"part-{number:05d}", b"manifest")

    writer = threading.Thread(target=keep_committing)
    writer.start()
    started = time.monotonic()
    try:
        assert commit.settled_committed_shards(out, quiet_s=0.2, limit_s=1.0)
    finally:
        stop.set()
        writer.join()
    assert time.monotonic() - started < 5.0  # the limit (1 s) ended it, not the writer


def test_orphans_are_data_and_errors_without_a_manifest(out: Location) -> None:
    for shard in ("part-00000", "part-00001"):
        out.write_bytes(f"data/{shard}.tar", b"data")
        out.write_bytes(commit.errors_path(shard), b"errors")
    commit.commit_shard(out, "part-00000", b"manifest")
    out.write_bytes("data/part-00002.tar", b"crashed before its manifest")
    # a local write killed mid-way leaves its temp file next to the target
    (Path(out.root) / "data" / "part-00003.tar.tmp-4f2a").write_bytes(b"partial")
    (Path(out.root) / "manifests" / "part-00004.parquet.tmp-9c1d").write_bytes(b"partial")
    out.write_bytes("_job/spec.yaml", b"spec")  # the job's own records are never orphans

    found = commit.orphans(out, _keep(out, "tar"))
    assert sorted(found) == [
        "data/part-00001.tar",
        "data/part-00002.tar",
        "data/part-00003.tar.tmp-4f2a",
        "errors/part-00001.parquet",
        "manifests/part-00004.parquet.tmp-9c1d",
    ]
    assert commit.committed_shards(out) == {"part-00000"}  # the temp manifest commits nothing
    for path in found:  # what the job does at the end of a successful run
        out.delete(path)
    assert commit.orphans(out, _keep(out, "tar")) == []
    assert sorted(p for p, _ in out.list(recursive=True)) == [
        "_job/spec.yaml",
        "data/part-00000.tar",
        "errors/part-00000.parquet",
        "manifests/part-00000.parquet",
    ]


@pytest.mark.s3
def test_commit_records_on_s3(s3: object) -> None:
    out = open_location(f"s3://{BUCKET}/test-commit-{uuid.uuid4().hex}", StorageSpec(retries=1))
    assert commit.committed_shards(out) == set() and commit.orphans(out, set()) == []
    out.write_bytes("data/part-00000.parquet", b"d0")
    out.write_bytes("data/part-00001.parquet", b"d1")
    commit.commit_shard(out, "part-00000", b"m0")
    assert commit.committed_shards(out) == {"part-00000"}
    assert commit.orphans(out, _keep(out)) == ["data/part-00001.parquet"]


def test_json_records_round_trip(out: Location) -> None:
    assert commit.read_json(out, commit.FINGERPRINT) is None
    commit.write_json(out, commit.FINGERPRINT, {"hash": "abc", "n": 3})
    assert commit.read_json(out, commit.FINGERPRINT) == {"hash": "abc", "n": 3}


# ---------------------------------------------------------------- the lease


def _lock(out: Location) -> dict | None:
    return commit.read_json(out, LOCK)


def _write_lock(out: Location, host: str, pid: int, expires: float) -> None:
    record = {"run_id": "someone-else", "host": host, "pid": pid, "expires": expires}
    out.write_bytes(LOCK, json.dumps(record).encode())


def _dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_second_lease_is_refused_while_the_first_is_held(out: Location) -> None:
    first = Lease(out, seconds=30)
    first.acquire()
    try:
        lock = _lock(out)
        assert lock is not None and lock["run_id"] == first.run_id
        assert lock["host"] == socket.gethostname() and lock["expires"] > time.time()
        second = Lease(out, seconds=30)
        with pytest.raises(UsageError) as caught:
            second.acquire()
        assert first.run_id in str(caught.value)
        assert "another run" in str(caught.value)
        assert _lock(out)["run_id"] == first.run_id  # the refused run changed nothing
    finally:
        first.release()
    assert not out.exists(LOCK)

    second = Lease(out, seconds=30)  # once released, the next run gets it
    second.acquire()
    try:
        assert _lock(out)["run_id"] == second.run_id
    finally:
        second.release()
    assert not out.exists(LOCK)


@pytest.mark.parametrize(
    "holder",
    [
        lambda: (socket.gethostname(), _dead_pid(), time.time() + 3600),  # dead driver, this host
        lambda: ("other-host.example", 4242, time.time() - 5),  # expired, another host
    ],
    ids=["dead-driver-on-this-host", "expired-on-another-host"],
)
def test_a_stale_lease_is_taken_over(out: Location, holder) -> None:
    _write_lock(out, *holder())
    lease = Lease(out, seconds=30)
    lease.acquire()
    try:
        assert _lock(out)["run_id"] == lease.run_id
    finally:
        lease.release()


def test_a_live_lease_from_another_host_is_refused(out: Location) -> None:
    _write_lock(out, "other-host.example", 4242, time.time() + 600)
    lease = Lease(out, seconds=30)
    with pytest.raises(UsageError) as caught:
        lease.acquire()
    message = str(caught.value)
    assert "other-host.example" in message and "someone-else" in message
    assert out.uri in message
    assert _lock(out)["run_id"] == "someone-else"
    lease.release()  # releasing a lease never held leaves the other run's lock alone
    assert _lock(out)["run_id"] == "someone-else"


def test_release_leaves_a_lock_taken_over_by_another_run(out: Location) -> None:
    lease = Lease(out, seconds=30)
    lease.acquire()
    _write_lock(out, "other-host.example", 4242, time.time() + 600)
    lease.release()
    assert _lock(out)["run_id"] == "someone-else"


def test_renewal_keeps_extending_the_lease(out: Location) -> None:
    lease = Lease(out, seconds=1.2)  # renewed every 0.4 s
    lease.acquire()
    try:
        first_term = _lock(out)["expires"]
        seen = [first_term]
        for _ in range(3):
            deadline = time.monotonic() + 10
            while (record := _lock(out))["expires"] == seen[-1]:
                assert time.monotonic() < deadline, "the lease was not renewed"
                time.sleep(0.05)
            assert record["run_id"] == lease.run_id
            assert record["expires"] > seen[-1]
            assert record["expires"] > time.time()  # never lapses while the run is alive
            seen.append(record["expires"])
        while time.time() <= first_term + 0.1:
            time.sleep(0.05)
        # the first term has run out, yet a second driver is still refused
        with pytest.raises(UsageError):
            Lease(out, seconds=1.2).acquire()
    finally:
        lease.release()
    assert not out.exists(LOCK)
    time.sleep(0.5)  # the renewal thread is stopped: it does not write the lock back
    assert not out.exists(LOCK)


@pytest.mark.s3
def test_lease_on_s3(s3: object) -> None:
    out = open_location(f"s3://{BUCKET}/test-lease-{uuid.uuid4().hex}", StorageSpec(retries=1))
    first = Lease(out, seconds=30)
    first.acquire()
    try:
        with pytest.raises(UsageError):
            Lease(out, seconds=30).acquire()
    finally:
        first.release()
    assert not out.exists(LOCK)


def test_an_orphan_in_a_view_folder_is_found(tmp_path: Path) -> None:
    out = open_location(str(tmp_path / "out"), StorageSpec(retries=0))
    out.write_bytes("data/view=0/part-00000.tar", b"committed")
    out.write_bytes("data/view=1/part-00000.tar", b"crashed before its manifest")
    assert commit.orphans(out, {"data/view=0/part-00000.tar"}) == ["data/view=1/part-00000.tar"]
