"""Submit a job spec to a Ray cluster through the Ray Jobs API, and follow it to its end.

The job runs `python -m rayaug.preflight` (is every requirement importable? else one line and
exit 2), then `python -m rayaug.cli run <spec>` on the cluster. Its runtime_env carries:

- `working_dir`: a temporary folder holding the resolved spec (local paths made absolute) and
  the modules the preflight looks for (`preflight.REQUIREMENTS_FILE`);
- `py_modules`: this installed `rayaug` package, so the cluster runs the code the user has;
- `pip` (unless `ship_deps=False`): rayaug's runtime requirements (and the Azure SDK for a
  job that writes to az://) pinned to the versions installed here, so a cluster whose Python
  has only Ray can run the job. Never Ray itself
  (only its extras rayaug needs, at the cluster's own Ray version) and torch only on request
  (its build must match the cluster's CUDA). Ray builds this environment once per node, on top
  of the node's Python (a clone of its virtualenv, or `--system-site-packages`), and reuses it
  for later jobs with the same list;
- `env_vars`: the non-secret storage settings of `rayaug.job.FORWARDED_ENV` that are set here.

Credentials never travel: not in the runtime_env, the entrypoint, the metadata or any line
rayaug prints. Storage credentials come from the cluster nodes' own environment.

Token authentication (Ray 2.60): `ray start --head` turns it on when a token exists
(`~/.ray/auth_token`), `ray.init()` of a new local Ray always does (writing the file if missing),
and the dashboard then refuses requests without the token. Ray's job client sends the token only
when `RAY_AUTH_MODE=token` is set in the submitting process; connecting to an explicit address
never turns that on (so a plain `ray job submit` to such a head fails with 401). rayaug follows
the same rule with one addition that mirrors `ray start`: with `RAY_AUTH_MODE` unset, the local
token (loaded by Ray's own `AuthenticationTokenLoader`, which reads `RAY_AUTH_TOKEN`,
`RAY_AUTH_TOKEN_PATH` or `~/.ray/auth_token`) is sent to a loopback address only (a head on this
machine, or the tunnel `ray dashboard cluster.yaml` opens). `RAY_AUTH_MODE=disabled` never sends
it. The token is only ever placed in an HTTP header, never in an error or log line.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.metadata
import json
import logging
import os
import re
import secrets
import shlex
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from rayaug import clouds, preflight
from rayaug.errors import RayaugError, UsageError
from rayaug.local_ray import is_loopback_host
from rayaug.spec import JobSpec, dump_spec

TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
# Variables that make Ray's job client ignore the address it is given.
_ADDRESS_OVERRIDES = ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS")
# Defence in depth: even if FORWARDED_ENV grows, names like these never leave this machine.
_SECRET_MARKERS = ("SECRET", "TOKEN", "PASSWORD", "ACCESS_KEY", "CREDENTIAL", "SESSION")
_CONNECT_TIMEOUT_S = 10.0
_POLL_S = 1.0
# How long wait_for keeps retrying when the dashboard stops answering mid-job.
_LOST_CONTACT_S = 60.0
_RAY_LOGGERS = (
    "ray.dashboard.modules.dashboard_sdk",
    "ray.dashboard.modules.job.sdk",
    "ray._private.runtime_env.packaging",
)


def submit_job(
    spec: JobSpec,
    spec_file: Path,
    address: str,
    *,
    ship_deps: bool = True,
    ship_torch: bool = False,
) -> str:
    """Submit `spec` to the Ray cluster whose dashboard is at `address`; returns the job id.

    `ship_deps` puts rayaug's pinned requirements in the job's runtime_env (`pip`), `ship_torch`
    adds this machine's torch version to them. Raises UsageError (one line) when the address is
    malformed or unreachable, the cluster's Ray is older than rayaug's, the cluster refuses the
    token, or the cluster refuses the submission.
    """
    url = _dashboard_url(address)
    resolved = _absolute_local_uris(spec)
    client = _client(url)
    cluster_ray = _cluster_ray_version(client, url)
    spec_name = _spec_file_name(spec_file)
    with tempfile.TemporaryDirectory(prefix="rayaug-submit-") as working_dir:
        (Path(working_dir) / spec_name).write_text(dump_spec(resolved))
        (Path(working_dir) / preflight.REQUIREMENTS_FILE).write_text(
            json.dumps(
                required_modules(_needs_device_path(spec, ship_torch), _writes_azure(spec)),
                indent=1,
                sort_keys=True,
            )
        )
        runtime_env: dict = {
            "working_dir": working_dir,
            "py_modules": [str(_package_dir())],
            "excludes": ["__pycache__"],
        }
        if ship_deps:
            runtime_env["pip"] = {
                "packages": shipped_requirements(
                    cluster_ray, ship_torch=ship_torch, azure=_writes_azure(spec)
                ),
                # Ray's default adds --no-cache-dir: with the cache, a node whose Ray restarts
                # (a new session, so a new environment) rebuilds it from wheels it already has.
                "pip_install_options": ["--disable-pip-version-check"],
            }
        env_vars = forwarded_env()
        if env_vars:
            runtime_env["env_vars"] = env_vars
        try:
            with _quiet_ray():
                return client.submit_job(
                    entrypoint=entrypoint(spec_name),
                    submission_id=_submission_id(resolved.name),
                    runtime_env=runtime_env,
                    metadata={"rayaug_job": resolved.name, "spec_file": spec_file.name},
                )
        except Exception as error:  # the request reached the cluster, which said no
            raise _usage_error(url, error, "the cluster refused the job") from None


def wait_for(address: str, job_id: str, emit: Callable[[str], None]) -> str:
    """Stream the job's logs through `emit` until it ends; returns SUCCEEDED, FAILED or STOPPED.

    Logs are followed over the dashboard's websocket (`tail_job_logs`); if that stream breaks,
    polling `get_job_logs` resumes from the last character already emitted, so nothing is shown
    twice and nothing is lost.
    """
    url = _dashboard_url(address)
    client = _client(url)
    shown = _Counted(emit)
    try:
        _tail(client, job_id, shown)
    except KeyboardInterrupt:
        raise _detached(url, job_id) from None
    except Exception:  # a broken stream: carry on by polling from what was already shown
        logging.getLogger(__name__).info("log stream of %s broke; polling", job_id)
    try:
        return _poll(client, job_id, shown)
    except KeyboardInterrupt:
        raise _detached(url, job_id) from None


def entrypoint(spec_name: str) -> str:
    """The job's command: the requirements check first, so a missing one is one clear line."""
    return (
        f"python -m rayaug.preflight {preflight.REQUIREMENTS_FILE} && "
        f"python -m rayaug.cli run {shlex.quote(spec_name)}"
    )


def missing_requirements_line(log: str) -> str | None:
    """The preflight's line in a job's log, if the job stopped for lack of requirements."""
    for line in log.splitlines():
        if line.startswith(preflight.MISSING_PREFIX):
            return line.strip()
    return None


def shipped_requirements(
    cluster_ray: str, *, ship_torch: bool = False, azure: bool = False
) -> list[str]:
    """pip requirement lines for the job's runtime_env: rayaug's runtime requirements, each
    pinned to the version installed here (the job computes what a local run computes).

    Ray itself is never installed: its extras rayaug needs (`ray[data]`) are asked for at the
    cluster's own version, which pip finds installed, so it adds only the extras' packages.
    The device path's torch and Kornia (the `gpu` extra) only with `ship_torch`, torch without
    a local build label (`2.13.0+cpu` → `2.13.0`): the cluster's index decides the build.
    The Azure SDK (the `azure` extra) with `azure`: a job that writes to az:// needs it.
    """
    lines = []
    for requirement in _runtime_requirements(ship_torch, azure):
        name = canonicalize_name(requirement.name)
        installed = Version(importlib.metadata.version(requirement.name)).public
        if name == "ray":
            if requirement.extras:
                lines.append(f"ray[{','.join(sorted(requirement.extras))}]=={cluster_ray}")
        else:
            lines.append(f"{requirement.name}=={installed}")
    return lines


def required_modules(device_path: bool = False, azure: bool = False) -> dict[str, str]:
    """Distribution → the top-level module the preflight looks for, for every runtime
    requirement of rayaug (with `device_path`, torch and Kornia too) and of the Ray extras it
    asks for, except Ray. A distribution that provides no module here (a tool such as py-spy)
    is not looked for."""
    wanted: list[Requirement] = []
    for requirement in _runtime_requirements(device_path, azure):
        if canonicalize_name(requirement.name) == "ray":
            for extra in sorted(requirement.extras):
                wanted += _requirements_of("ray", extra)
        else:
            wanted.append(requirement)
    modules = {canonicalize_name(r.name): _module_of(r.name) for r in wanted}
    return {dist: module for dist, module in modules.items() if module is not None}


def _runtime_requirements(device_path: bool, azure: bool = False) -> list[Requirement]:
    """rayaug's declared requirements that apply here: its own, with `device_path` its `gpu`
    extra (torch, Kornia), with `azure` its `azure` extra (the Azure SDK that writes blobs);
    never the tools of its other extras."""
    extras = [name for name, wanted in (("gpu", device_path), ("azure", azure)) if wanted]
    return _requirements_of("rayaug", "") + [
        r for e in extras for r in _requirements_of("rayaug", e)
    ]


def _writes_azure(spec: JobSpec) -> bool:
    """Whether the job writes to Azure Blob Storage (reads need only pyarrow)."""
    return urlsplit(spec.output.uri).scheme in clouds.AZURE_SCHEMES


def _needs_device_path(spec: JobSpec, ship_torch: bool) -> bool:
    """Whether the job's actors need torch and Kornia: GPUs asked for by number (with `auto`
    the cluster decides, and an actor given a GPU without torch says so itself), or shipped."""
    return ship_torch or (spec.execution.num_gpus != "auto" and spec.execution.num_gpus > 0)


def _requirements_of(distribution: str, extra: str) -> list[Requirement]:
    """The requirements `distribution` declares for `extra` ("" = its own), markers applied."""
    found = []
    for line in importlib.metadata.requires(distribution) or []:
        requirement = Requirement(line)
        marker = requirement.marker
        of_an_extra = marker is not None and "extra" in str(marker)
        if of_an_extra == bool(extra) and (marker is None or marker.evaluate({"extra": extra})):
            found.append(requirement)
    return found


def _module_of(distribution: str) -> str | None:
    """The importable top-level module a distribution provides (`opencv-python-headless` →
    `cv2`, `pyyaml` → `yaml`, `pillow` → `PIL`), read from what is installed here."""
    provided = sorted(_modules_by_distribution().get(canonicalize_name(distribution), ()))
    plain = distribution.replace("-", "_").lower()
    return plain if plain in provided else (provided[0] if provided else None)


@functools.cache
def _modules_by_distribution() -> dict[str, set[str]]:
    """Installed distribution (canonical name) → its public top-level modules."""
    modules: dict[str, set[str]] = {}
    for module, dists in importlib.metadata.packages_distributions().items():
        if not module.startswith("_"):
            for dist in dists:
                modules.setdefault(canonicalize_name(dist), set()).add(module)
    return modules


def _cluster_ray_version(client, url: str) -> str:
    """The cluster's Ray version (the client read it from /api/version when it connected);
    refused in one line when older than the Ray rayaug needs."""
    import ray

    version = getattr(client, "_server_ray_version", None) or ray.__version__
    rays = (r for r in _runtime_requirements(False) if canonicalize_name(r.name) == "ray")
    needed = next(rays, None)
    floor = min((Version(s.version) for s in needed.specifier), default=None) if needed else None
    if floor is not None and Version(version) < floor:
        raise UsageError(
            f"the Ray cluster at {url} runs Ray {version}; rayaug needs Ray >= {floor}"
        )
    return version


def setup_failure(address: str, job_id: str) -> str | None:
    """One line when the cluster could not build the job's environment (the pip install of the
    shipped requirements failed, so the job never started); None for any other end."""
    url = _dashboard_url(address)
    try:
        info = _client(url).get_job_info(job_id)
    except Exception:  # the job's own end is already known; this only adds a reason
        return None
    if _status_name(info.error_type) != "RUNTIME_ENV_SETUP_FAILURE":
        return None
    return (
        f"the cluster could not install rayaug's requirements for {job_id} "
        f"({_one_line(RuntimeError(info.message or ''), 400)}); fix the node's package index, "
        "or install rayaug into the cluster's image and submit with --no-ship-deps"
    )


def forwarded_env() -> dict[str, str]:
    """The non-secret storage settings (of FORWARDED_ENV) that are set in this environment."""
    from rayaug.job import FORWARDED_ENV

    return {
        name: os.environ[name]
        for name in FORWARDED_ENV
        if name in os.environ and not any(marker in name.upper() for marker in _SECRET_MARKERS)
    }


# ---------------------------------------------------------------- the spec as it travels


def _absolute_local_uris(spec: JobSpec) -> JobSpec:
    """Local input/output paths made absolute: on the cluster the job's cwd is its working_dir."""
    updates = {}
    for field in ("input", "output"):
        section = getattr(spec, field)
        uri = _absolute_uri(section.uri)
        if uri != section.uri:
            updates[field] = section.model_copy(update={"uri": uri})
    return spec.model_copy(update=updates) if updates else spec


def _absolute_uri(uri: str) -> str:
    parsed = urlsplit(uri)
    if parsed.scheme == "":
        return str(Path(uri).expanduser().resolve())
    if parsed.scheme == "file" and not parsed.netloc and not Path(parsed.path).is_absolute():
        return f"file://{Path(parsed.path).expanduser().resolve()}"
    return uri


def _spec_file_name(spec_file: Path) -> str:
    name = spec_file.name
    return name if re.fullmatch(r"[\w.-]+\.ya?ml", name) else "job.yaml"


def _submission_id(name: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:40] or "job"
    return f"rayaug-{slug}-{secrets.token_hex(4)}"


def _package_dir() -> Path:
    import rayaug

    return Path(rayaug.__file__).resolve().parent


# ---------------------------------------------------------------- talking to the dashboard


def _dashboard_url(address: str) -> str:
    """http(s)://host:port of a Ray dashboard; a bare host:port means http."""
    text = address.strip()
    if not text:
        raise UsageError("--address is empty: give the Ray dashboard, e.g. http://HEAD:8265")
    if "://" not in text:
        text = f"http://{text}"
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as error:
        raise UsageError(f"malformed --address {address!r}: {error}") from None
    if parts.scheme not in ("http", "https"):
        raise UsageError(
            f"--address {address!r}: use the Ray dashboard's http://HOST:8265 "
            f"(not {parts.scheme}://)"
        )
    if not parts.hostname:
        raise UsageError(f"malformed --address {address!r}: no host")
    if parts.path.strip("/") or parts.query or parts.fragment:
        raise UsageError(f"--address {address!r}: give only http://HOST:PORT, no path")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    default = 443 if parts.scheme == "https" else 8265
    return f"{parts.scheme}://{host}:{port or default}"


def _reachable(url: str) -> None:
    """Fail fast and in one line when nothing answers (Ray's client would wait forever)."""
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname, parts.port), timeout=_CONNECT_TIMEOUT_S):
            pass
    except socket.gaierror:
        raise UsageError(f"cannot resolve the host of {url}") from None
    except OSError as error:
        reason = error.strerror or type(error).__name__
        raise UsageError(
            f"nothing answers at {url} ({reason}): is the cluster up? For a cluster started "
            "with `ray up cluster.yaml`, run `ray dashboard cluster.yaml` and use "
            "http://127.0.0.1:8265"
        ) from None


def _client(url: str):
    """A JobSubmissionClient for exactly `url`, authenticated the way Ray would be."""
    _reachable(url)
    from ray.job_submission import JobSubmissionClient

    try:
        headers = _auth_headers(url)
        with _quiet_ray(), _without_address_overrides():
            return JobSubmissionClient(url, headers=headers)
    except Exception as error:
        if isinstance(error, ConnectionError | OSError):  # it accepts TCP, but speaks no HTTP
            error = RuntimeError(f"no HTTP answer ({_one_line(error)})")
        raise _usage_error(
            url, error, f"{url} does not answer as a Ray dashboard (its port is 8265 by default)"
        ) from None


def _auth_headers(url: str) -> dict[str, str] | None:
    """Headers carrying the local Ray token, or None to let Ray decide (see module doc)."""
    if os.environ.get("RAY_AUTH_MODE"):  # "token": Ray's client adds it; "disabled": never
        return None
    if not is_loopback_host(urlsplit(url).hostname or ""):
        return None
    from ray._raylet import AuthenticationTokenLoader

    loader = AuthenticationTokenLoader.instance()
    if not loader.has_token(ignore_auth_mode=True):
        return None
    return dict(loader.get_token_for_http_header(ignore_auth_mode=True)) or None


def _usage_error(url: str, error: Exception, fallback: str) -> UsageError:
    """One line a user can act on; never the request headers (they may hold the token)."""
    from ray.exceptions import AuthenticationError

    if isinstance(error, UsageError):
        return error
    if isinstance(error, AuthenticationError):
        text = str(error)
        if "Authentication required" in text:
            return UsageError(
                f"the Ray cluster at {url} requires token authentication: set RAY_AUTH_MODE=token "
                "and provide its token (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token)"
            )
        return UsageError(
            f"the Ray cluster at {url} refused the authentication token: use that cluster's "
            "token (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token)"
        )
    if isinstance(error, ConnectionError | OSError):
        return UsageError(f"lost the connection to {url}: {_one_line(error)}")
    return UsageError(f"{fallback}: {_one_line(error)}")


def _one_line(error: BaseException, limit: int = 300) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"


@contextmanager
def _without_address_overrides() -> Iterator[None]:
    """Ray's client prefers RAY_API_SERVER_ADDRESS / RAY_ADDRESS to its argument: hide them."""
    saved = {name: os.environ.pop(name) for name in _ADDRESS_OVERRIDES if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


@contextmanager
def _quiet_ray() -> Iterator[None]:
    """Ray's job client logs every upload at INFO; keep that for `rayaug -v` only."""
    if logging.getLogger().getEffectiveLevel() <= logging.INFO:
        yield
        return
    loggers = [logging.getLogger(name) for name in _RAY_LOGGERS]
    levels = [log.level for log in loggers]
    for log in loggers:
        log.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for log, level in zip(loggers, levels, strict=True):
            log.setLevel(level)


# ---------------------------------------------------------------- following a job


class _Counted:
    """`emit`, counting the characters of the job's log shown so far."""

    def __init__(self, emit: Callable[[str], None]) -> None:
        self.emit = emit
        self.chars = 0

    def __call__(self, text: str) -> None:
        self.emit(text)
        self.chars += len(text)


def _tail(client, job_id: str, emit: _Counted) -> None:
    """Follow the websocket log stream to its end (the server closes it when the job ends)."""

    async def follow() -> None:
        async for chunk in client.tail_job_logs(job_id):
            emit(chunk)

    with _quiet_ray():
        asyncio.run(follow())


def _poll(client, job_id: str, emit: _Counted) -> str:
    """Poll status and logs until the job ends, emitting only what was not shown yet."""
    last_contact = time.monotonic()
    while True:
        try:
            status = _status_name(client.get_job_status(job_id))
            logs = client.get_job_logs(job_id)
        except Exception as error:
            if _is_refusal(error):
                raise _usage_error(client.get_address(), error, f"cannot follow {job_id}") from None
            if time.monotonic() - last_contact > _LOST_CONTACT_S:
                raise RayaugError(
                    f"lost contact with the cluster while following {job_id} "
                    f"({_one_line(error)}); it may still be running"
                ) from None
            time.sleep(_POLL_S)
            continue
        last_contact = time.monotonic()
        if len(logs) > emit.chars:
            emit(logs[emit.chars :])
        if status in TERMINAL:
            return status
        time.sleep(_POLL_S)


def _is_refusal(error: Exception) -> bool:
    """An answer that retrying cannot change: no such job, or the token refused."""
    from ray.exceptions import AuthenticationError

    text = str(error)
    return isinstance(error, AuthenticationError) or (
        isinstance(error, RuntimeError) and "status code 404" in text
    )


def _status_name(status) -> str:
    return str(getattr(status, "value", status))


def _detached(url: str, job_id: str) -> RayaugError:
    return RayaugError(
        f"stopped following {job_id}; it keeps running on the cluster. Follow it with "
        f"`ray job logs --address {url} -f {job_id}`, stop it with "
        f"`ray job stop --address {url} {job_id}`"
    )
