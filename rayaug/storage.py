"""URIs to filesystems (local disk or S3-compatible), with retries and atomic writes.

Credentials are never taken from the spec: pyarrow reads the standard AWS environment and
config files. The endpoint and region may come from the spec or AWS_ENDPOINT_URL / AWS_REGION.
"""

from __future__ import annotations

import logging
import os
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar
from urllib.parse import unquote, urlparse

import pyarrow.fs as pafs

from rayaug.errors import StorageError, UsageError
from rayaug.spec import StorageSpec

log = logging.getLogger(__name__)
T = TypeVar("T")

# Errors that no amount of waiting fixes: report at once instead of retrying.
_PERMANENT = (
    "ACCESS_DENIED",
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "SIGNATURE_DOES_NOT_MATCH",  # how pyarrow's AWS SDK spells the codes
    "NoSuchBucket",
    "NO_SUCH_BUCKET",
    "INVALID_ACCESS_KEY",
)


def _is_permanent(error: BaseException) -> bool:
    if isinstance(error, FileNotFoundError | IsADirectoryError | NotADirectoryError):
        return True
    return any(marker in str(error) for marker in _PERMANENT)


def retrying(work: Callable[[], T], what: str, attempts: int, base_delay: float = 0.5) -> T:
    """Run `work`, retrying transient OSErrors with exponential backoff and jitter."""
    for attempt in range(attempts + 1):
        try:
            return work()
        except OSError as error:
            if _is_permanent(error) or attempt == attempts:
                raise StorageError(f"{what}: {_one_line(error)}") from None
            delay = min(base_delay * 2**attempt, 15.0) * (0.5 + random.random())
            log.warning(
                "%s failed (%s); retry %d/%d in %.1fs",
                what,
                _one_line(error),
                attempt + 1,
                attempts,
                delay,
            )
            time.sleep(delay)
    raise AssertionError("unreachable")


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split())[:300] or type(error).__name__


@dataclass(frozen=True)
class Location:
    """A root on one filesystem (an output prefix, an input prefix) and how to retry on it."""

    uri: str
    fs: pafs.FileSystem
    root: str
    attempts: int
    # The same endpoint and region for an engine that opens `uri` itself (Lance's object store,
    # in its option names); credentials stay in the environment, as for pyarrow.
    storage_options: dict[str, str] = field(default_factory=dict, compare=False)

    @property
    def is_local(self) -> bool:
        return isinstance(self.fs, pafs.LocalFileSystem)

    def path(self, relative: str) -> str:
        return f"{self.root}/{relative}" if relative else self.root

    def uri_of(self, relative: str) -> str:
        return f"{self.uri.rstrip('/')}/{relative}"

    def holds(self, other: Location) -> bool:
        """Whether `other` is this location or lies under it (on the same kind of store)."""
        if type(self.fs) is not type(other.fs):
            return False
        return other.root == self.root or other.root.startswith(f"{self.root.rstrip('/')}/")

    def read_bytes(self, relative: str) -> bytes:
        def read() -> bytes:
            with self.fs.open_input_stream(self.path(relative)) as stream:
                return stream.read()

        return retrying(read, f"reading {self.uri_of(relative)}", self.attempts)

    def write_bytes(self, relative: str, data: bytes) -> None:
        """Write whole or not at all: S3 objects appear atomically; local files are renamed."""
        retrying(
            lambda: self._write_once(relative, data),
            f"writing {self.uri_of(relative)}",
            self.attempts,
        )

    def _write_once(self, relative: str, data: bytes) -> None:
        target = self.path(relative)
        if not self.is_local:
            with self.fs.open_output_stream(target) as stream:
                stream.write(data)
            return
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        temporary = f"{target}.tmp-{uuid.uuid4().hex}"
        try:
            with open(temporary, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temporary, target)
        except BaseException:  # a failed try must not leave its temp file (retries add more)
            Path(temporary).unlink(missing_ok=True)
            raise

    def exists(self, relative: str) -> bool:
        def probe() -> bool:
            return self.fs.get_file_info(self.path(relative)).type != pafs.FileType.NotFound

        return retrying(probe, f"checking {self.uri_of(relative)}", self.attempts)

    def list(self, relative: str = "", recursive: bool = False) -> list[tuple[str, int]]:
        """(path relative to the root, size) of the files under a folder, sorted; [] if none."""
        base = self.path(relative)

        def scan() -> list[pafs.FileInfo]:
            selector = pafs.FileSelector(base, allow_not_found=True, recursive=recursive)
            return self.fs.get_file_info(selector)

        infos = retrying(scan, f"listing {self.uri_of(relative)}", self.attempts)
        files = [
            (info.path[len(self.root) + 1 :], info.size or 0)
            for info in infos
            if info.type == pafs.FileType.File
        ]
        return sorted(files)

    def delete(self, relative: str) -> None:
        """Remove a file. A retry that finds it gone is done: the try whose answer was lost
        (a connection reset after the server acted) removed it. A first try still reports a
        missing file."""
        tries = 0

        def remove() -> None:
            nonlocal tries
            tries += 1
            try:
                self.fs.delete_file(self.path(relative))
            except FileNotFoundError:
                if tries == 1:
                    raise

        retrying(remove, f"deleting {self.uri_of(relative)}", self.attempts)


def _s3_filesystem(storage: StorageSpec) -> tuple[pafs.S3FileSystem, dict[str, str]]:
    """pyarrow's S3 filesystem, and the same endpoint and region as object-store options."""
    endpoint = (
        storage.endpoint
        or os.environ.get("AWS_ENDPOINT_URL_S3")
        or os.environ.get("AWS_ENDPOINT_URL")
    )
    region = (
        storage.region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    ) or "us-east-1"
    options: dict = {
        "region": region,
        # The AWS SDK applies request_timeout as "less than 1 byte/s for that long": a stalled
        # call (no answer, or an answer that stops) fails with curlCode 28, an OSError that
        # `retrying` treats as transient.
        "connect_timeout": storage.connect_timeout,
        "request_timeout": storage.request_timeout,
        "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=3),
    }
    store = {"region": region}
    if endpoint:
        parsed = urlparse(endpoint if "://" in endpoint else f"https://{endpoint}")
        if not parsed.hostname:
            raise UsageError(f"storage.endpoint {endpoint!r} is not a URL like http://host:port")
        options |= {"endpoint_override": parsed.netloc, "scheme": parsed.scheme}
        store |= {"endpoint": f"{parsed.scheme}://{parsed.netloc}"}
        if parsed.scheme == "http":
            store |= {"allow_http": "true"}
    return pafs.S3FileSystem(**options), store


def open_location(uri: str, storage: StorageSpec) -> Location:
    """Resolve a local path, file:// or s3://bucket/prefix URI. Raises UsageError if malformed."""
    parsed = urlparse(uri)
    attempts = storage.retries
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise UsageError(f"{uri!r} names no bucket: use s3://BUCKET/PREFIX")
        root = f"{parsed.netloc}/{parsed.path.strip('/')}".rstrip("/")
        filesystem, store = _s3_filesystem(storage)
        return Location(uri.rstrip("/"), filesystem, root, attempts, store)
    if parsed.scheme == "file" and parsed.netloc not in ("", "localhost"):
        raise UsageError(f"{uri!r}: file:// URIs name no host (use file:///path)")
    if parsed.scheme in ("", "file"):
        path = Path(unquote(parsed.path) if parsed.scheme == "file" else uri).expanduser().resolve()
        return Location(str(path), pafs.LocalFileSystem(), str(path), attempts)
    raise UsageError(f"{uri!r}: unsupported URI scheme {parsed.scheme!r} (use a path or s3://)")


def check_reachable(location: Location, must_exist: bool) -> None:
    """Fail fast, before Ray starts, on a wrong endpoint, credentials or missing input."""
    try:
        info = location.fs.get_file_info(location.root)
    except OSError as error:
        raise UsageError(f"cannot access {location.uri}: {_explain(error)}") from None
    role = "input" if must_exist else "output"
    if info.type == pafs.FileType.File:  # listing or writing under it would fail much later
        holds = "the images or shards" if must_exist else "the job's output"
        raise UsageError(
            f"{role} {location.uri} is a file, not a folder: set {role}.uri to the folder "
            f"(or S3 prefix) for {holds}"
        )
    if info.type == pafs.FileType.NotFound:
        bucket = _missing_bucket(location)
        if bucket is not None:
            raise UsageError(
                f"{role} {location.uri}: there is no bucket {bucket!r} at this endpoint; "
                f"create it, or check {role}.uri and storage.endpoint / AWS_ENDPOINT_URL"
            )
        if must_exist:
            raise UsageError(f"input {location.uri} does not exist")


def _missing_bucket(location: Location) -> str | None:
    """The bucket of an S3 location when the server says it does not exist; else None."""
    if location.is_local:
        return None
    bucket = location.root.split("/", 1)[0]
    try:
        missing = location.fs.get_file_info(bucket).type == pafs.FileType.NotFound
    except OSError:
        return None
    return bucket if missing else None


def _explain(error: OSError) -> str:
    text = _one_line(error)
    credentials = ("InvalidAccessKeyId", "INVALID_ACCESS_KEY", "SignatureDoesNotMatch")
    if any(m in text for m in (*credentials, "SIGNATURE_DOES_NOT_MATCH", "ACCESS_DENIED")):
        unset = "" if os.environ.get("AWS_ACCESS_KEY_ID") else "; AWS_ACCESS_KEY_ID is not set"
        return f"credentials refused ({text}{unset}); set AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY"
    if "NETWORK_CONNECTION" in text or "Couldn't connect" in text or "curlCode" in text:
        return f"endpoint unreachable ({text}); check storage.endpoint / AWS_ENDPOINT_URL"
    return text
