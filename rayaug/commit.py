"""The commit protocol and the job's own records under `_job/`.

A shard is committed when `manifests/<shard>.parquet` exists: readers, resume and inspect
trust nothing else. `_job/` holds the resolved spec, the fingerprint, the plan, each growth's
record and the lease of the running driver.
"""

from __future__ import annotations

import io
import json
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import asdict, dataclass

import pyarrow.parquet as pq

from rayaug.errors import RayaugError, UsageError
from rayaug.storage import Location

log = logging.getLogger(__name__)

SPEC = "_job/spec.yaml"
FINGERPRINT = "_job/fingerprint.json"
PLAN = "_job/plan.json"
LOCK = "_job/lock"
SUCCESS = "_SUCCESS"
LEASE_SECONDS = 60.0


def manifest_path(shard: str) -> str:
    return f"manifests/{shard}.parquet"


def errors_path(shard: str) -> str:
    return f"errors/{shard}.parquet"


def generation_path(number: int) -> str:
    """The record of the job's `number`th growth (the first run's is spec, plan, fingerprint)."""
    return f"_job/generations/{number:04d}.json"


def commit_shard(out: Location, shard: str, manifest: bytes) -> None:
    """The last write of a shard: from here on it counts as done."""
    out.write_bytes(manifest_path(shard), manifest)


def manifest_metadata(out: Location, shard: str) -> dict[str, str]:
    """The file metadata of a committed shard's manifest: what its write recorded there."""
    schema = pq.read_schema(io.BytesIO(out.read_bytes(manifest_path(shard))))
    return {k.decode(): v.decode() for k, v in (schema.metadata or {}).items()}


def committed_shards(out: Location) -> set[str]:
    return {
        path.removeprefix("manifests/").removesuffix(".parquet")
        for path, _ in out.list("manifests")
        if path.endswith(".parquet")
    }


def settled_committed_shards(
    out: Location, quiet_s: float = 1.0, limit_s: float = 10.0
) -> set[str]:
    """The committed shards once none has arrived for `quiet_s` (or after `limit_s`).

    Ray kills a stopped run's writers asynchronously: a commit already under way when the
    driver stopped them can land a moment later, after a single listing."""
    deadline = time.monotonic() + limit_s
    committed = committed_shards(out)
    while time.monotonic() + quiet_s <= deadline:
        time.sleep(quiet_s)
        again = committed_shards(out)
        if again == committed:
            break
        committed = again
    return committed


def orphans(out: Location, keep: set[str], data: str = "data") -> list[str]:
    """Objects under the `data` folder (and its view folders, `data/view=E/`) and errors/
    that no manifest vouches for: left by a crash (or a partial local write), never counted,
    removed once the job succeeds."""
    found = [
        path
        for folder in (data, "errors")
        for path, _ in out.list(folder, recursive=True)
        if path not in keep
    ]
    # A local write killed mid-way leaves its temp file (a manifest's commits nothing).
    return found + [
        p for folder in ("manifests", "_job") for p, _ in out.list(folder) if ".tmp-" in p
    ]


def read_json(out: Location, path: str) -> dict | None:
    return json.loads(out.read_bytes(path)) if out.exists(path) else None


def write_json(out: Location, path: str, value: dict) -> None:
    out.write_bytes(path, json.dumps(value, indent=2, sort_keys=True).encode())


# ---------------------------------------------------------------- the driver's lease


@dataclass(frozen=True)
class LeaseRecord:
    run_id: str
    host: str
    pid: int
    expires: float

    def held_by_live_driver(self, now: float) -> bool:
        if self.expires < now:
            return False
        if self.host == socket.gethostname():
            return _pid_alive(self.pid)
        return True


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Lease:
    """`_job/lock`: one driver per output. Renewed in the background while the job runs.

    A lease of a dead driver on this host, or an expired one, is taken over; S3 has no
    compare-and-swap, so the check is write-then-read-back (two drivers started in the same
    instant could both pass: the lease guards against mistakes, not adversaries).
    """

    def __init__(self, out: Location, seconds: float = LEASE_SECONDS) -> None:
        self.out = out
        self.seconds = seconds
        self.run_id = uuid.uuid4().hex[:12]
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lost_to: LeaseRecord | None = None  # set if another run took the lease over

    def _record(self) -> LeaseRecord:
        return LeaseRecord(
            self.run_id, socket.gethostname(), os.getpid(), time.time() + self.seconds
        )

    def holder(self) -> LeaseRecord | None:
        try:
            current = read_json(self.out, LOCK)
            return None if current is None else LeaseRecord(**current)
        except (ValueError, TypeError) as error:
            raise UsageError(
                f"{self.out.uri_of(LOCK)} is unreadable ({error}); if no run is writing this "
                "output, delete it"
            ) from None

    def acquire(self) -> None:
        holder = self.holder()
        if holder and holder.run_id != self.run_id and holder.held_by_live_driver(time.time()):
            raise UsageError(
                f"{self.out.uri} is being written by another run ({holder.run_id} on "
                f"{holder.host}, pid {holder.pid}); wait for it, or for its lease to expire "
                f"in {holder.expires - time.time():.0f}s"
            )
        write_json(self.out, LOCK, asdict(self._record()))
        if getattr(self.holder(), "run_id", None) != self.run_id:
            raise UsageError(f"{self.out.uri}: another run took the lease at the same moment")
        self._thread = threading.Thread(target=self._renew, name="rayaug-lease", daemon=True)
        self._thread.start()

    def _renew(self) -> None:
        while not self._stop.wait(self.seconds / 3):
            try:
                holder = self.holder()
                if holder is not None and holder.run_id != self.run_id:
                    self.lost_to = holder  # the driver stops; overwriting would fight it
                    return
                write_json(self.out, LOCK, asdict(self._record()))
            except RayaugError as error:  # an outage must not kill the job; retry next round
                log.warning("could not renew the lease: %s", error)

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if getattr(self.holder(), "run_id", None) == self.run_id:
            self.out.delete(LOCK)
