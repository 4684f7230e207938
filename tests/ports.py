"""Free loopback ports for the servers the tests start (not a test module).

A port found free is closed again before its server binds it. If it came from the kernel's
ephemeral range (bind to port 0), any process that binds port 0 in that gap can take it: a Ray
worker in the other pytest worker did, and weed died on "bind: address already in use". So
ports are drawn from below the ephemeral range and above Ray's default worker ports
(10002-19999), where nothing binds without naming its port. The servers' own draws are kept
apart too: a port handed to `ray start` is bound seconds later, so each pytest-xdist worker
draws only ports of its own residue modulo 16 (16 divides 10,000, so a port's `+ 10000`
partner stays in its worker's class).
"""

from __future__ import annotations

import os
import random
import socket
from contextlib import ExitStack
from pathlib import Path

_LOWEST = 20000  # above Ray's default worker ports
_CLASSES = 16
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _highest() -> int:
    """The last port below the kernel's ephemeral range (Linux's default range starts at
    32768; elsewhere, or if unreadable, assume that)."""
    try:
        first_ephemeral = int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        first_ephemeral = 32768
    return max(first_ephemeral - 1, _LOWEST + 1000)


def _own_class() -> int:
    """This process's residue class: its pytest-xdist worker's number ("gw2" → 2), else 0."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(worker.removeprefix("gw") or 0) % _CLASSES


def free_ports(count: int, *, also_free_at: int = 0) -> list[int]:
    """`count` distinct free loopback ports of this worker's class, each held open until all
    are chosen (so one call never returns a port twice). With `also_free_at` (a multiple of
    16), port + also_free_at is free too for every port returned (and below the ephemeral
    range)."""
    if also_free_at % _CLASSES:
        raise ValueError(f"also_free_at must be a multiple of {_CLASSES}: {also_free_at}")
    highest = _highest() - also_free_at
    first = _LOWEST + (_own_class() - _LOWEST) % _CLASSES
    candidates = range(first, highest + 1, _CLASSES)
    if len(candidates) < 10 * count:
        raise RuntimeError(f"too few ports between {_LOWEST} and the ephemeral range")
    chosen: list[int] = []
    with ExitStack() as held:

        def hold(port: int) -> bool:
            sock = held.enter_context(socket.socket())
            try:
                sock.bind(("127.0.0.1", port))
                return True
            except OSError:
                return False

        for port in random.sample(candidates, len(candidates)):
            if hold(port) and (not also_free_at or hold(port + also_free_at)):
                chosen.append(port)
                if len(chosen) == count:
                    return chosen
    raise RuntimeError(f"fewer than {count} free ports between {_LOWEST} and {highest}")


def free_port() -> int:
    return free_ports(1)[0]
