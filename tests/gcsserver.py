"""A real Google Cloud Storage emulator on loopback, for tests (not a test module).

`gcp-storage-emulator` (PyPI) serves GCS's JSON and upload APIs, keeping objects on disk under
`root/data` (so a killed and restarted server has them all). It checks no credentials: the
clients connect anonymously through STORAGE_EMULATOR_HOST, as Google's own SDKs do.
"""

from __future__ import annotations

import shutil
import sys
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

    def filesystem(self) -> fs.GcsFileSystem:
        return fs.GcsFileSystem(
            anonymous=True, endpoint_override=self.endpoint, scheme="http", project_id="test"
        )

    def answers(self) -> bool:
        try:
            self.filesystem().get_file_info("probe-bucket")
            return True
        except OSError:
            return False

    def create_bucket(self, name: str) -> None:
        self.filesystem().create_dir(name)
