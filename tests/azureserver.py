"""A real Azure Blob Storage emulator (Azurite, Microsoft's) on loopback, for tests.

Azurite comes from npm (`scripts/bootstrap` installs it under .venv/azurite; RAYAUG_AZURITE
names another `azurite-blob`). It runs with an account of this server alone (a random key,
through AZURITE_ACCOUNTS) and checks every request's Shared Key signature, so a wrong key is
refused as Azure refuses it. Blobs and their metadata live under `root/data`.
"""

from __future__ import annotations

import base64
import os
import secrets
from pathlib import Path

from procserver import ProcessServer
from pyarrow import fs

REPO = Path(__file__).resolve().parents[1]


def azurite_binary() -> str:
    found = Path(
        os.environ.get("RAYAUG_AZURITE") or REPO / ".venv/azurite/node_modules/.bin/azurite-blob"
    )
    if not found.exists():
        raise RuntimeError(f"{found} not found: run scripts/bootstrap (it installs Azurite)")
    return str(found)


class Azurite(ProcessServer):
    name = "azurite"
    account = "rayaugtest"

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.key = base64.b64encode(secrets.token_bytes(32)).decode()

    def command(self) -> list[str]:
        return [
            azurite_binary(),
            "--blobHost=127.0.0.1",
            f"--blobPort={self.port}",
            f"--location={self.root / 'data'}",
            f"--debug={self.root / 'azurite-debug.log'}",
            "--skipApiVersionCheck",
            "--disableProductStyleUrl",
            "--loose",
            # Azurite reports each start to Microsoft by default: off loopback, and it leaves
            # its unsent reports under /tmp.
            "--disableTelemetry",
        ]

    def child_env(self) -> dict[str, str]:
        return {
            **{k: v for k, v in os.environ.items() if not k.startswith("AZURE")},
            "AZURITE_ACCOUNTS": f"{self.account}:{self.key}",
        }

    def connection_string(self, key: str | None = None) -> str:
        return (
            f"DefaultEndpointsProtocol=http;AccountName={self.account};"
            f"AccountKey={key or self.key};BlobEndpoint=http://{self.endpoint}/{self.account};"
        )

    def env(self) -> dict[str, str]:
        """What an Azure client (rayaug, pyarrow, the Azure SDK) needs for this server."""
        return {"AZURE_STORAGE_CONNECTION_STRING": self.connection_string()}

    def filesystem(self) -> fs.AzureFileSystem:
        return fs.AzureFileSystem(
            account_name=self.account,
            account_key=self.key,
            blob_storage_authority=self.endpoint,
            dfs_storage_authority=self.endpoint,
            blob_storage_scheme="http",
            dfs_storage_scheme="http",
        )

    def answers(self) -> bool:
        try:
            self.filesystem().get_file_info("probe-container")
            return True
        except OSError:
            return False

    def outage(self) -> None:
        """Stopped, not killed: Azurite keeps its blob index in a LokiJS database it saves every
        few seconds, so a SIGKILL loses the blobs of its last seconds (seen: a committed
        manifest gone after the restart). That is the emulator's durability, not the
        service's; to the client, a stopped server is the same outage."""
        self.stop()

    def create_bucket(self, name: str) -> None:
        """Create container `name` (the same call as the other servers' buckets)."""
        self.filesystem().create_dir(name)
