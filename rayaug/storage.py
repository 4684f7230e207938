"""URIs to filesystems (local disk, S3, Google Cloud Storage, Azure Blob Storage), with retries,
call deadlines and atomic writes: one storage layer for every scheme.

Credentials are never taken from the spec: each cloud's own SDK finds them the way its users
set them (rayaug.clouds says where). The endpoint (and S3's region, Azure's account) may come
from the spec or from that cloud's usual environment variables.
"""

from __future__ import annotations

import logging
import os
import random
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.fs as pafs

from rayaug import clouds
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
    # Google Cloud Storage (google-cloud-cpp's status codes)
    "PERMISSION_DENIED",
    "UNAUTHENTICATED",
    # Azure Blob Storage (its error codes)
    "AuthenticationFailed",
    "AuthorizationFailure",
    "AuthorizationPermissionMismatch",
    "ContainerNotFound",
    "InvalidAuthenticationInfo",
)


def _is_sdk_status(error: BaseException) -> bool:
    """A storage SDK's status that pyarrow raised as a non-OSError Arrow error (Google's client
    reports a credential it cannot load as UNKNOWN or INVALID_ARGUMENT)."""
    return "google::cloud::Status(" in str(error)


def _is_permanent(error: BaseException) -> bool:
    if isinstance(error, FileNotFoundError | IsADirectoryError | NotADirectoryError):
        return True
    if not isinstance(error, OSError):  # an SDK status that is no I/O error: a setting is wrong
        return True
    return any(marker in str(error) for marker in _PERMANENT)


def retrying(
    work: Callable[[], T],
    what: str,
    attempts: int,
    base_delay: float = 0.5,
    deadline: float | None = None,
) -> T:
    """Run `work`, retrying transient OSErrors with exponential backoff and jitter. With a
    `deadline` (seconds), a try that has not ended by then counts as a transient failure."""
    for attempt in range(attempts + 1):
        try:
            return _within(work, deadline)
        except (OSError, pa.ArrowException) as error:
            if not isinstance(error, OSError) and not _is_sdk_status(error):
                raise  # an Arrow error of the data (a corrupt Parquet file), not of storage
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


def _within(work: Callable[[], T], deadline: float | None) -> T:
    """`work()`, or TimeoutError once `deadline` seconds pass without its end. A native call
    cannot be cancelled: a stalled one is left to its daemon thread (an object write it may
    still finish carries the same bytes as the retry's)."""
    if deadline is None:
        return work()
    outcome: dict[str, object] = {}
    ended = threading.Event()

    def call() -> None:
        try:
            outcome["value"] = work()
        except BaseException as error:  # handed to the caller below
            outcome["error"] = error
        finally:
            ended.set()

    threading.Thread(target=call, name="rayaug-storage-call", daemon=True).start()
    if not ended.wait(deadline):
        raise TimeoutError(f"no answer within {deadline:g} s (storage.request_timeout)")
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome["value"]  # type: ignore[return-value]


# Google's statuses bury their reason in a long retry-policy message.
_GOOGLE_REASON = re.compile(r"underlying error message was: (.*?)(?: error_info=|$)")


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    reason = _GOOGLE_REASON.search(text)
    return (reason.group(1) if reason else text)[:300] or type(error).__name__


@dataclass(frozen=True)
class Location:
    """A root on one filesystem (an output prefix, an input prefix) and how to call it."""

    uri: str
    fs: pafs.FileSystem
    root: str
    attempts: int
    # The same endpoint, region and account for an engine that opens `uri` itself (Lance's
    # object store, in its option names); no credential (see object_store_options).
    storage_options: dict[str, str] = field(default_factory=dict, compare=False)
    # Seconds a call may take where the SDK bounds none itself (rayaug.clouds); None: no bound.
    deadline: float | None = field(default=None, compare=False)
    # An atomic write of a whole object where the filesystem's output stream is not one.
    put: Callable[[str, bytes], None] | None = field(default=None, compare=False)

    @property
    def is_local(self) -> bool:
        return isinstance(self.fs, pafs.LocalFileSystem)

    @property
    def scheme(self) -> str:
        """The URI scheme ("file" for a local path): what its hints and messages name."""
        return "file" if self.is_local else self.uri.split("://", 1)[0]

    def object_store_options(self) -> dict[str, str]:
        """`storage_options` with this process's credentials for the scheme (rayaug.clouds):
        what Lance opens `uri` with. Built per call and held nowhere."""
        if self.is_local:
            return dict(self.storage_options)
        return self.storage_options | clouds.object_store_secrets(self.scheme)

    def object_store_uri(self, relative: str) -> str:
        """`uri_of(relative)` as Lance opens it (rayaug.clouds.object_store_uri); messages
        keep naming `uri_of`, the user's spelling."""
        return clouds.object_store_uri(self.uri_of(relative))

    def path(self, relative: str) -> str:
        return f"{self.root}/{relative}" if relative else self.root

    def uri_of(self, relative: str) -> str:
        return f"{self.uri.rstrip('/')}/{relative}"

    def holds(self, other: Location) -> bool:
        """Whether `other` is this location or lies under it (on the same kind of store)."""
        if type(self.fs) is not type(other.fs):
            return False
        return other.root == self.root or other.root.startswith(f"{self.root.rstrip('/')}/")

    def retrying(self, work: Callable[[], T], what: str) -> T:
        """`work` with this location's retries and call deadline."""
        return retrying(work, what, self.attempts, deadline=self.deadline)

    def read_bytes(self, relative: str) -> bytes:
        def read() -> bytes:
            with self.fs.open_input_stream(self.path(relative)) as stream:
                return stream.read()

        return self.retrying(read, f"reading {self.uri_of(relative)}")

    def write_bytes(self, relative: str, data: bytes) -> None:
        """Write whole or not at all: S3 and GCS objects appear atomically when their upload
        completes, Azure blobs when their Put Blob commits; local files are renamed."""
        self.retrying(lambda: self._write_once(relative, data), f"writing {self.uri_of(relative)}")

    def _write_once(self, relative: str, data: bytes) -> None:
        target = self.path(relative)
        if self.put is not None:
            self.put(target, data)
            return
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

        return self.retrying(probe, f"checking {self.uri_of(relative)}")

    def list(self, relative: str = "", recursive: bool = False) -> list[tuple[str, int]]:
        """(path relative to the root, size) of the files under a folder, sorted; [] if none."""
        base = self.path(relative)

        def scan() -> list[pafs.FileInfo]:
            selector = pafs.FileSelector(base, allow_not_found=True, recursive=recursive)
            return self.fs.get_file_info(selector)

        infos = self.retrying(scan, f"listing {self.uri_of(relative)}")
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

        self.retrying(remove, f"deleting {self.uri_of(relative)}")


def open_location(uri: str, storage: StorageSpec) -> Location:
    """Resolve a local path, file:// or cloud URI (rayaug.clouds). UsageError if malformed."""
    parsed = urlparse(uri)
    attempts = storage.retries
    if clouds.is_cloud(uri):
        backend = clouds.open_cloud(uri, storage)
        return Location(
            uri.rstrip("/"),
            backend.fs,
            backend.root,
            attempts,
            backend.storage_options,
            deadline=backend.deadline,
            put=backend.put,
        )
    if parsed.scheme == "file" and parsed.netloc not in ("", "localhost"):
        raise UsageError(f"{uri!r}: file:// URIs name no host (use file:///path)")
    if parsed.scheme in ("", "file"):
        path = Path(unquote(parsed.path) if parsed.scheme == "file" else uri).expanduser().resolve()
        return Location(str(path), pafs.LocalFileSystem(), str(path), attempts)
    raise UsageError(
        f"{uri!r}: unsupported URI scheme {parsed.scheme!r} "
        "(use a path, s3://, gs://, az:// or abfs://)"
    )


def check_reachable(location: Location, must_exist: bool) -> None:
    """Fail fast, before Ray starts, on a wrong endpoint, credentials or missing input."""
    try:
        info = _within(lambda: location.fs.get_file_info(location.root), location.deadline)
    except (OSError, pa.ArrowException) as error:
        raise UsageError(f"cannot access {location.uri}: {_explain(location, error)}") from None
    role = "input" if must_exist else "output"
    if info.type == pafs.FileType.File:  # listing or writing under it would fail much later
        holds = "the images or shards" if must_exist else "the job's output"
        raise UsageError(
            f"{role} {location.uri} is a file, not a folder: set {role}.uri to the folder "
            f"(or bucket prefix) for {holds}"
        )
    if info.type == pafs.FileType.NotFound:
        bucket = _missing_bucket(location)
        if bucket is not None:
            kind = "container" if location.scheme in clouds.AZURE_SCHEMES else "bucket"
            raise UsageError(
                f"{role} {location.uri}: there is no {kind} {bucket!r} at this endpoint; "
                f"create it, or check {role}.uri and {clouds.endpoint_hint(location.scheme)}"
            )
        if must_exist:
            raise UsageError(f"input {location.uri} does not exist")


def _missing_bucket(location: Location) -> str | None:
    """The bucket (container) of a cloud location when the server says it does not exist."""
    if location.is_local:
        return None
    bucket = location.root.split("/", 1)[0]
    try:
        info = _within(lambda: location.fs.get_file_info(bucket), location.deadline)
    except OSError:
        return None
    return bucket if info.type == pafs.FileType.NotFound else None


# How each SDK words a refused credential, and a server that is not there.
_REFUSED = (
    "InvalidAccessKeyId",
    "INVALID_ACCESS_KEY",
    "SignatureDoesNotMatch",
    "SIGNATURE_DOES_NOT_MATCH",
    "ACCESS_DENIED",
    "PERMISSION_DENIED",
    "UNAUTHENTICATED",
    "AuthenticationFailed",
    "AuthorizationFailure",
    "InvalidAuthenticationInfo",
    "credential",  # Google's and Azure's credential chains: "Could not ... credentials"
    "Credential",
    "OAuth2",
)
_UNREACHABLE = ("NETWORK_CONNECTION", "Couldn't connect", "curlCode", "UNAVAILABLE", "no answer")


def _explain(location: Location, error: Exception) -> str:
    text = _one_line(error)
    if any(marker in text for marker in _REFUSED):
        unset = ""
        if location.scheme == "s3" and not os.environ.get("AWS_ACCESS_KEY_ID"):
            unset = "; AWS_ACCESS_KEY_ID is not set"
        hint = clouds.credential_hint(location.scheme)
        return f"{location.scheme}:// credentials refused or missing ({text}{unset}); {hint}"
    if any(marker in text for marker in _UNREACHABLE):
        hint = clouds.endpoint_hint(location.scheme)
        return f"endpoint unreachable ({text}); check {hint}"
    return text
