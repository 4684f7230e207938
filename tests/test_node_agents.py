"""The local node's two agents as rayaug runs them: the ports the raylet waits for, a runtime-env
agent that refuses in plain words, and an end with the raylet."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from ray import _raylet

from rayaug import node_agents

NODE_ID = "ab12"
DEADLINE_S = 30.0  # for a process to start or end on a busy machine: liveness, not speed


def start(agent: str, folder: Path, *arguments: str) -> subprocess.Popen:
    """The agent as the raylet starts it (`python -u` + `command()` + Ray's script + flags),
    without PYTHONPATH (an agent does not get the driver's path) and with its imports listed."""
    argv = [
        sys.executable,
        "-u",
        "-X",
        "importtime",
        *node_agents.command(agent),
        "/ray/dashboard/agent.py",
        f"--node-id={NODE_ID}",
        f"--session-dir={folder}",
        f"--stdout-filepath={folder / 'agent.out'}",
        "--logging-rotate-bytes=536870912",
        *arguments,
    ]
    environment = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    return subprocess.Popen(
        argv, cwd=folder, env=environment, stderr=subprocess.PIPE, text=True, start_new_session=True
    )


def port_file(folder: Path, name: str) -> str:
    path = folder / f"{name}_{NODE_ID}"
    deadline = time.monotonic() + DEADLINE_S
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} was never written"
        time.sleep(0.05)
    return path.read_text()


def stopped(process: subprocess.Popen) -> tuple[int, list[str]]:
    """SIGTERM, as the raylet stops its agents: the exit code and the modules it imported."""
    process.send_signal(signal.SIGTERM)
    _, imports = process.communicate(timeout=DEADLINE_S)
    modules = [line.rsplit("|", 1)[-1].strip() for line in imports.splitlines() if "|" in line]
    return process.returncode, modules


def test_the_port_names_are_the_installed_rays() -> None:
    assert node_agents.DASHBOARD_PORTS == (
        _raylet.METRICS_AGENT_PORT_NAME,
        _raylet.METRICS_EXPORT_PORT_NAME,
        _raylet.DASHBOARD_AGENT_LISTEN_PORT_NAME,
    )
    assert node_agents.RUNTIME_ENV_PORT == _raylet.RUNTIME_ENV_AGENT_PORT_NAME


def test_the_dashboard_agent_writes_its_ports_as_not_served_without_importing_ray(
    tmp_path: Path,
) -> None:
    """What Ray's own agent wrote on a node without a dashboard or metrics, without the half
    second of `import ray` before it; stopped by the raylet, it ends cleanly."""
    agent = start(node_agents.DASHBOARD, tmp_path)
    ports = {name: port_file(tmp_path, name) for name in node_agents.DASHBOARD_PORTS}
    code, modules = stopped(agent)
    assert set(ports.values()) == {"-1"}
    assert code == 0
    assert not [m for m in modules if m.partition(".")[0] in ("ray", "rayaug")]
    assert not list(tmp_path.glob("*.partial-*"))
    assert "no dashboard" in (tmp_path / "agent.out").read_text()


def test_the_runtime_env_agent_refuses_every_request_on_loopback(tmp_path: Path) -> None:
    agent = start(
        node_agents.RUNTIME_ENV,
        tmp_path,
        "--node-ip-address=127.0.0.1",
        "--runtime-env-agent-port=0",
    )
    port = int(port_file(tmp_path, node_agents.RUNTIME_ENV_PORT))
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/get_or_create_runtime_env", data=b"\x0a\x02ab", method="POST"
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=DEADLINE_S)
    body = refused.value.read().decode()
    code, modules = stopped(agent)
    assert refused.value.code == 501
    assert body == node_agents.REFUSAL
    assert "/get_or_create_runtime_env" in (tmp_path / "agent.out").read_text()
    assert code == 0
    assert not [m for m in modules if m.partition(".")[0] in ("ray", "rayaug")]


def test_an_agent_ends_once_the_raylet_that_started_it_is_gone(tmp_path: Path) -> None:
    """A raylet killed outright sends no SIGTERM: its agents, reparented, end on their own."""
    psutil = pytest.importorskip("psutil")
    argv = [*node_agents.command("dashboard"), "agent.py", f"--node-id={NODE_ID}"]
    argv.append(f"--session-dir={tmp_path}")
    raylet = (  # starts the agent as the raylet does, and is gone at once
        "import os, subprocess, sys; "
        "env = dict(os.environ, RAY_RAYLET_PID=str(os.getpid())); "
        f"agent = subprocess.Popen([sys.executable, *{argv!r}], env=env, "
        "stdout=subprocess.DEVNULL); print(agent.pid)"
    )
    done = subprocess.run(
        [sys.executable, "-c", raylet], capture_output=True, text=True, check=True, timeout=60
    )
    orphan = int(done.stdout)
    try:
        port_file(tmp_path, node_agents.DASHBOARD_PORTS[0])
        deadline = time.monotonic() + DEADLINE_S
        while running(psutil, orphan):
            assert time.monotonic() < deadline, "the agent outlived its raylet"
            time.sleep(0.1)
    finally:
        if running(psutil, orphan):
            os.kill(orphan, signal.SIGKILL)


def running(psutil: Any, pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_an_agent_it_has_no_stand_in_for_is_refused(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            node_agents.__file__,
            "metrics",
            "x.py",
            f"--node-id={NODE_ID}",
            f"--session-dir={tmp_path}",
        ],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
    )
    assert done.returncode != 0
    assert "no stand-in for the agent 'metrics'" in done.stderr
