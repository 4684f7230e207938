"""Each cloud's filesystem, endpoint and credentials, found the way that cloud's SDK users set them.

- `s3://BUCKET/PREFIX`: pyarrow's S3FileSystem (the AWS SDK's environment, config files and
  chain; endpoint from storage.endpoint or AWS_ENDPOINT_URL[_S3], region from storage.region
  or AWS_REGION).
- `gs://BUCKET/PREFIX`: pyarrow's GcsFileSystem (Google's default credential chain:
  GOOGLE_APPLICATION_CREDENTIALS, gcloud's application-default login, the metadata server).
  STORAGE_EMULATOR_HOST (google-cloud-storage's variable) points at an emulator and, as there,
  connects anonymously; storage.endpoint points elsewhere with the default credentials.
- `az://CONTAINER/PREFIX`, `abfs[s]://CONTAINER/PREFIX` or
  `abfs[s]://CONTAINER@ACCOUNT.dfs.core.windows.net/PREFIX`: pyarrow's AzureFileSystem for
  reads and listings, and the Azure SDK's `upload_blob` for writes (pyarrow's output stream
  truncates the blob to empty when it opens, so a reader or a killed writer would see an empty
  object; one Put Blob / Put Block List appears whole or not at all). The account comes from
  the abfs host, storage.account, AZURE_STORAGE_ACCOUNT_NAME (or the Azure CLI's
  AZURE_STORAGE_ACCOUNT) or the connection string; the secret from
  AZURE_STORAGE_CONNECTION_STRING, AZURE_STORAGE_ACCOUNT_KEY (AZURE_STORAGE_KEY),
  AZURE_STORAGE_SAS_TOKEN, else DefaultAzureCredential (service principal variables, workload
  or managed identity, `az login`).

Secrets are read from the environment by the process that uses them and are never stored in
a Location, so nothing that pickles or prints one carries them.
"""

from __future__ import annotations

import datetime
import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlparse

import pyarrow.fs as pafs

from rayaug.errors import UsageError
from rayaug.spec import StorageSpec

AZURE_SCHEMES = ("az", "abfs", "abfss")
SCHEMES = ("s3", "gs", *AZURE_SCHEMES)


@dataclass(frozen=True)
class Backend:
    """What one cloud URI opens: its filesystem and how rayaug must call it."""

    fs: pafs.FileSystem
    root: str  # BUCKET/PREFIX or CONTAINER/PREFIX, as the filesystem names paths
    # Endpoint, region, account for engines that open URIs themselves (Lance's object store, in
    # its option names); no secret: `object_store_secrets` adds those in the process that calls.
    storage_options: dict[str, str]
    # A whole-call deadline (s) where the SDK enforces none itself (a stalled call would hang).
    deadline: float | None = None
    # An atomic whole-object write, where the filesystem's output stream is not one.
    put: Callable[[str, bytes], None] | None = None


def is_cloud(uri: str) -> bool:
    """Whether `uri` names cloud storage (one of SCHEMES), not a local path or file:// URI."""
    return urlparse(uri).scheme in SCHEMES


def open_cloud(uri: str, storage: StorageSpec) -> Backend:
    """The backend of an s3, gs, az or abfs URI. Raises UsageError when malformed."""
    scheme = urlparse(uri).scheme
    root = path_of(uri)
    host = urlparse(uri).netloc.partition("@")[2]
    if scheme == "s3":
        return _s3(root, storage)
    if scheme == "gs":
        return _gcs(root, storage)
    return _azure(root, host.split(".", 1)[0] or None, storage)


def path_of(uri: str) -> str:
    """BUCKET/PREFIX (CONTAINER/PREFIX) of a cloud URI, as its filesystem names it."""
    parsed = urlparse(uri)
    if not parsed.netloc or parsed.netloc.startswith("@"):
        form = "CONTAINER" if parsed.scheme in AZURE_SCHEMES else "BUCKET"
        raise UsageError(f"{uri!r} names no {form.lower()}: use {parsed.scheme}://{form}/PREFIX")
    bucket = parsed.netloc.partition("@")[0]
    return f"{bucket}/{parsed.path.strip('/')}".rstrip("/")


def credential_hint(scheme: str) -> str:
    """What a user sets to give rayaug credentials for `scheme`."""
    if scheme == "gs":
        return (
            "set GOOGLE_APPLICATION_CREDENTIALS to a service-account key file (or run "
            "`gcloud auth application-default login`)"
        )
    if scheme in AZURE_SCHEMES:
        return (
            "set AZURE_STORAGE_ACCOUNT_KEY, AZURE_STORAGE_SAS_TOKEN or "
            "AZURE_STORAGE_CONNECTION_STRING (or AZURE_CLIENT_ID / AZURE_TENANT_ID / "
            "AZURE_CLIENT_SECRET, a managed identity, `az login`)"
        )
    return "set AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY"


def endpoint_hint(scheme: str) -> str:
    """Where the endpoint of `scheme` is set."""
    if scheme == "gs":
        return "storage.endpoint / STORAGE_EMULATOR_HOST"
    if scheme in AZURE_SCHEMES:
        return "storage.endpoint / the BlobEndpoint of AZURE_STORAGE_CONNECTION_STRING"
    return "storage.endpoint / AWS_ENDPOINT_URL"


def _endpoint(value: str) -> tuple[str, str]:
    """(scheme, host:port) of an endpoint URL; a bare host:port means https."""
    parsed = urlparse(value if "://" in value else f"https://{value}")
    if not parsed.hostname:
        raise UsageError(
            f"the storage endpoint {value!r} (storage.endpoint, or its environment variable) "
            "is not a URL like http://host:port"
        )
    return parsed.scheme, parsed.netloc


# ---------------------------------------------------------------- S3


def _s3(root: str, storage: StorageSpec) -> Backend:
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
        scheme, netloc = _endpoint(endpoint)
        options |= {"endpoint_override": netloc, "scheme": scheme}
        store |= {"endpoint": f"{scheme}://{netloc}"}
        if scheme == "http":
            store |= {"allow_http": "true"}
    return Backend(pafs.S3FileSystem(**options), root, store)


# ---------------------------------------------------------------- Google Cloud Storage


def _gcs(root: str, storage: StorageSpec) -> Backend:
    emulator = os.environ.get("STORAGE_EMULATOR_HOST")
    endpoint = storage.endpoint or emulator
    options: dict = {
        # Google's client retries inside one call for this long at most (it would retry a
        # refused connection for 15 minutes); past it the error reaches `retrying`, which
        # owns the backoff, as after the AWS SDK's three attempts.
        "retry_time_limit": datetime.timedelta(seconds=storage.connect_timeout),
    }
    if endpoint:
        scheme, netloc = _endpoint(endpoint)
        options |= {"endpoint_override": netloc, "scheme": scheme}
    filesystem = pafs.GcsFileSystem(anonymous=bool(emulator), **options)
    # Google's C++ client has no stall timeout: a call that gets no answer would hang.
    return Backend(filesystem, root, {}, deadline=_deadline(storage))


def _deadline(storage: StorageSpec) -> float:
    return storage.connect_timeout + storage.request_timeout


# ---------------------------------------------------------------- Azure Blob Storage


def _connection_string() -> dict[str, str]:
    """AZURE_STORAGE_CONNECTION_STRING's fields (AccountName, AccountKey, BlobEndpoint, ...)."""
    text = os.environ.get("AZURE_STORAGE_CONNECTION_STRING", "")
    pairs = (part.partition("=") for part in text.split(";") if "=" in part)
    return {key.strip(): value.strip() for key, _, value in pairs}


def _azure_secret() -> tuple[str, str] | None:
    """("key" or "sas", value) from the environment, or None for the default credential."""
    connection = _connection_string()
    for kind, value in (
        ("key", connection.get("AccountKey")),
        ("sas", connection.get("SharedAccessSignature")),
        ("key", os.environ.get("AZURE_STORAGE_ACCOUNT_KEY")),
        ("key", os.environ.get("AZURE_STORAGE_KEY")),
        ("sas", os.environ.get("AZURE_STORAGE_SAS_TOKEN")),
    ):
        if value:
            return kind, value
    return None


def _azure(root: str, uri_account: str | None, storage: StorageSpec) -> Backend:
    connection = _connection_string()
    account = (
        uri_account
        or storage.account
        or os.environ.get("AZURE_STORAGE_ACCOUNT_NAME")
        or os.environ.get("AZURE_STORAGE_ACCOUNT")
        or connection.get("AccountName")
    )
    if not account:
        raise UsageError(
            f"az://{root}: no Azure storage account; set AZURE_STORAGE_ACCOUNT_NAME (or "
            "storage.account, or use abfs://CONTAINER@ACCOUNT.dfs.core.windows.net/PREFIX)"
        )
    endpoint = storage.endpoint or connection.get("BlobEndpoint")
    scheme, authority = _endpoint(endpoint) if endpoint else ("https", ".blob.core.windows.net")
    options: dict = {"account_name": account}
    if endpoint:
        options |= {
            "blob_storage_authority": authority,
            "blob_storage_scheme": scheme,
            "dfs_storage_authority": authority,
            "dfs_storage_scheme": scheme,
        }
    secret = _azure_secret()
    if secret is not None:
        options["account_key" if secret[0] == "key" else "sas_token"] = secret[1]
    # pyarrow's own URL rule: an authority with a leading dot follows the account's name.
    base = f"{account}{authority}" if authority.startswith(".") else f"{authority}/{account}"
    put = AzurePut(f"{scheme}://{base}", account, storage.connect_timeout, storage.request_timeout)
    # object_store's names. Its own environment lookup knows neither the connection string nor
    # AZURE_STORAGE_KEY, so the account and the endpoint are spelt out here and the secret is
    # added per call (object_store_secrets); with no secret, its chain (service principal
    # variables, managed identity) applies.
    store = {"azure_storage_account_name": account}
    if endpoint:
        store |= {"azure_endpoint": f"{scheme}://{base}"}
        if scheme == "http":
            store |= {"allow_http": "true"}
    fs = pafs.AzureFileSystem(**options)
    return Backend(fs, root, store, deadline=_deadline(storage), put=put)


# Lance 14 has object stores for az:// and abfss:// but not abfs://. object_store reads abfs and
# abfss URIs alike (the container, and the account of a CONTAINER@ACCOUNT host; the endpoint, not
# the scheme, decides TLS, as in rayaug's own clients), so an abfs URI is handed over as abfss.
_OBJECT_STORE_SCHEMES = {"abfs": "abfss"}


def object_store_uri(uri: str) -> str:
    """`uri` as an engine on object_store (Lance) opens it: the same container and path."""
    scheme, separator, rest = uri.partition("://")
    return f"{_OBJECT_STORE_SCHEMES.get(scheme, scheme)}{separator}{rest}"


def object_store_secrets(scheme: str) -> dict[str, str]:
    """The credential of `scheme` from this process's environment, in object_store's option
    names, for an engine that opens URIs itself (Lance): the same lookup as rayaug's own
    clients, made per call so that no Location, spec or log holds it. S3 and GCS: nothing,
    object_store reads the AWS and Google variables itself."""
    if scheme not in AZURE_SCHEMES:
        return {}
    secret = _azure_secret()
    if secret is None:
        return {}
    kind, value = secret
    return {"azure_storage_account_key" if kind == "key" else "azure_storage_sas_token": value}


@dataclass(frozen=True)
class AzurePut:
    """Write one whole blob through the Azure SDK (Put Blob, or Put Block List for large ones:
    the blob changes only when the upload commits). Credentials are looked up per process."""

    account_url: str
    account: str
    connect_timeout: float
    read_timeout: float

    def __call__(self, path: str, data: bytes) -> None:
        from azure.core.exceptions import (
            AzureError,
            ClientAuthenticationError,
            ResourceNotFoundError,
        )

        container, _, blob = path.partition("/")
        client = _blob_service(
            self.account_url, self.account, self.connect_timeout, self.read_timeout, _azure_secret()
        )
        try:
            client.get_blob_client(container, blob).upload_blob(
                data, overwrite=True, timeout=int(self.read_timeout)
            )
        except ResourceNotFoundError as error:  # the container: no retry can create it
            raise FileNotFoundError(2, f"{_azure_code(error)}: {path}") from None
        except ClientAuthenticationError as error:
            raise OSError(f"AuthenticationFailed ({_azure_code(error)}) writing {path}") from None
        except AzureError as error:  # connection lost, timeout, 5xx: `retrying` retries
            raise OSError(f"Azure error writing {path}: {error}") from None


def _azure_code(error: Exception) -> str:
    return str(getattr(error, "error_code", None) or type(error).__name__)


@functools.cache
def _blob_service(
    account_url: str,
    account: str,
    connect_timeout: float,
    read_timeout: float,
    secret: tuple[str, str] | None,
):
    """One Azure SDK client per account, credential and process (it holds a connection pool);
    `secret` as the environment gives it now (_azure_secret)."""
    try:
        from azure.storage.blob import BlobServiceClient
    except ImportError:
        raise UsageError("az:// outputs need the Azure SDK: pip install 'rayaug[azure]'") from None
    if secret is None:
        from azure.identity import DefaultAzureCredential

        credential = DefaultAzureCredential()
    elif secret[0] == "key":
        credential = {"account_name": account, "account_key": secret[1]}
    else:
        credential = secret[1]
    # No retries of its own: the storage SDK's policy waits 15 s, then 18 s (a refused
    # connection took 42 s to report); `retrying` owns the backoff, as with the other clouds.
    # Its read timeout is a stall timeout (seconds without a byte), like the AWS SDK's.
    return BlobServiceClient(
        account_url,
        credential=credential,
        retry_total=0,
        connection_timeout=connect_timeout,
        read_timeout=read_timeout,
    )
