"""A storage emulator run as a child process on one loopback port, for tests (not a test module).

The base of tests/gcsserver.py and tests/azureserver.py: start (and wait until the server
answers), kill (SIGKILL, as in a crash), an outage (each emulator's own way down that keeps its
data), stop, restart on the same port and data directory.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from ports import free_port
from s3server import _die_with_parent, exited


def _server_process() -> None:
    """In the server's process, before it runs the server: it dies with the test process, and
    SIGINT is its own (a shell that starts the suite in the background passes SIGINT on
    ignored, and a server that shuts down on SIGINT would not)."""
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class ProcessServer:
    """One emulator process under `root` on `port`; subclasses give `command` and `answers`."""

    name = "emulator"

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.port = free_port()
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def command(self) -> list[str]:
        raise NotImplementedError

    def answers(self) -> bool:
        """Whether the server serves requests yet."""
        raise NotImplementedError

    def child_env(self) -> dict[str, str]:
        return dict(os.environ)

    def start(self, timeout: float = 60.0) -> None:
        if self.running:
            return
        (self.root / "data").mkdir(parents=True, exist_ok=True)
        log = self.root / f"{self.name}.log"
        with open(log, "ab") as out:
            self._proc = subprocess.Popen(
                self.command(),
                cwd=self.root / "data",
                env=self.child_env(),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_server_process,
            )
        try:
            self._wait(self.answers, timeout, log)
        except BaseException:
            self.kill()
            raise

    def _wait(self, ready: Callable[[], bool], timeout: float, log: Path) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if not self.running:
                raise exited(self.name, log)
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name} not ready after {timeout:g} s; see {log}")
            time.sleep(0.1)

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

    def stop(self, timeout: float = 20.0) -> None:
        """Graceful shutdown; the data stays under root."""
        self._end(signal.SIGTERM, timeout)

    def kill(self) -> None:
        """SIGKILL, as in a crash or an outage."""
        self._end(signal.SIGKILL, 10.0)

    def outage(self) -> None:
        """Go down as in an outage (start() brings it back with its data)."""
        self.kill()

    def restart(self, timeout: float = 60.0) -> None:
        self.stop()
        self.start(timeout)
