"""A real Google Cloud Storage emulator on loopback, for tests (not a test module).

`gcp-storage-emulator` (PyPI) serves GCS's JSON and upload APIs, keeping objects on disk under
`root/data` (so a stopped and restarted server has them all). It checks no credentials: the
clients connect anonymously through STORAGE_EMULATOR_HOST, as Google's own SDKs do.
"""

from __future__ import annotations

import shutil
import signal
import sys
from datetime import timedelta
from pathlib import Path

from procserver import ProcessServer
from pyarrow import fs


def emulator_binary() -> str:
    here = Path(sys.executable).parent / "gcp-storage-emulator"
    found = str(here) if here.exists() else shutil.which("gcp-storage-emulator")
    if not found:
        raise RuntimeError("gcp-storage-emulator not found: run scripts/bootstrap")
    return found


class GcsEmulator(ProcessServer):
    name = "gcp-storage-emulator"

    def command(self) -> list[str]:
        return [emulator_binary(), "start", "--host=127.0.0.1", f"--port={self.port}", "-q"]

    def env(self) -> dict[str, str]:
        """What a GCS client (pyarrow, Ray workers) needs for this server."""
        return {"STORAGE_EMULATOR_HOST": f"http://{self.endpoint}"}

    def filesystem(self, retry_time_limit: timedelta | None = None) -> fs.GcsFileSystem:
        return fs.GcsFileSystem(
            anonymous=True,
            endpoint_override=self.endpoint,
            scheme="http",
            project_id="test",
            retry_time_limit=retry_time_limit,
        )

    def answers(self) -> bool:
        """Whether the server answers now. The probe gives up within seconds: the client's own
        retry policy would keep a probe of a server that died at start waiting for minutes."""
        try:
            self.filesystem(retry_time_limit=timedelta(seconds=2)).get_file_info("probe-bucket")
            return True
        except OSError:
            return False

    def outage(self) -> None:
        """Stopped, not killed: the emulator rewrites its whole object index (`.meta`, one JSON
        file) in place on every write, so a SIGKILL during one leaves it truncated and the
        emulator cannot start again (seen: a JSONDecodeError at the restart, and the test
        waiting on it). On SIGINT it ends after the request in hand. That is the emulator's
        durability, not the service's; to the client, a stopped server is the same outage."""
        self._end(signal.SIGINT, 20.0)

    def create_bucket(self, name: str) -> None:
        self.filesystem().create_dir(name)
