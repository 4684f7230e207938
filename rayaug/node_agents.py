"""Stand-ins for the two agents Ray's raylet starts beside it, on rayaug's own local node:
`python node_agents.py dashboard|runtime_env AGENT_SCRIPT ARGS...` takes the place of Ray's
agent (AGENT_SCRIPT is not run) with the arguments the raylet gave it.

The raylet registers only once both agents have written their ports; until then the driver's
`ray.init` waits, and so do the workers the raylet starts ahead. Each of Ray's agents imports
Ray first: half a second of a core each while the GCS, the raylet and the driver start on the
same two cores, then 44 and 52 MiB (PSS) for the rest of the run. The local node has work
for neither:
- the dashboard agent serves the dashboard and Ray's metrics, and the node runs with neither
  (no dashboard, metrics collection off): Ray's own agent, started there as in Ray's minimal
  install, wrote -1 ("not served") for its three ports, loaded no module and waited;
- the runtime-env agent installs `runtime_env`s, and the raylet asks it only for a job or
  task that has one: the local node's driver has none (`start_local_ray` keeps Ray's own
  agent when it is given one).
So each stand-in is a few standard-library calls. The dashboard's writes its three ports as
-1. The runtime-env one listens on the node's address and answers any request with an error
in plain words, which the raylet gives the task as its runtime env's failure (an answer is
not retried). Both end when the raylet stops them (SIGTERM) or is gone.

Run by its path, not as `-m rayaug.node_agents`: an agent does not get the driver's sys.path,
so rayaug may not be importable there. Nothing here imports Ray or rayaug.
"""

from __future__ import annotations

import os
import sys

# Run by its path, this file's folder comes first on sys.path, where rayaug's module names
# would shadow any standard module of the same name imported below.
if __name__ == "__main__" and os.path.dirname(os.path.abspath(__file__)) in map(
    os.path.abspath, sys.path[:1]
):
    del sys.path[0]

import argparse  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from http.server import BaseHTTPRequestHandler, HTTPServer  # noqa: E402

DASHBOARD = "dashboard"
RUNTIME_ENV = "runtime_env"

# The port files the raylet waits for, `<name>_<node id>` in the session folder (Ray's
# ray._raylet.*_PORT_NAME; tests/test_node_agents.py checks them against the installed Ray).
DASHBOARD_PORTS = ("metrics_agent_port", "metrics_export_port", "dashboard_agent_listen_port")
RUNTIME_ENV_PORT = "runtime_env_agent_port"
NOT_SERVED = -1

REFUSAL = (
    "rayaug's local Ray node sets up no runtime_env: its workers inherit the environment of "
    "the process that started it. Run on a Ray cluster (rayaug run --address) for one."
)

# How often a stand-in looks whether the raylet that started it is still there.
PARENT_POLL_S = 0.5


def command(agent: str) -> list[str]:
    """What follows the Python executable (and its flags) to start `agent` through here."""
    return [os.path.abspath(__file__), agent]


def main() -> None:
    agent, _ray_script, *arguments = sys.argv[1:]
    options = _options(arguments)
    if options.stdout_filepath:  # logs/<agent>.out, as Ray's agent has it (else raylet.out)
        sys.stdout = open(options.stdout_filepath, "a", buffering=1)  # noqa: SIM115 - to the end
    # Set by the raylet for its agents (Ray's own watch it too); the parent for a stand-in run
    # by hand. Read from the environment, it names the raylet even if it was gone by now.
    raylet = int(os.environ.get("RAY_RAYLET_PID") or os.getppid())
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    if agent == DASHBOARD:
        for name in DASHBOARD_PORTS:
            persist_port(options.session_dir, options.node_id, name, NOT_SERVED)
        print("rayaug: no dashboard and no metrics on this node; their ports are -1", flush=True)
    elif agent == RUNTIME_ENV:
        server = _runtime_env_server(options.node_ip_address, options.runtime_env_agent_port)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        port = server.server_address[1]
        persist_port(options.session_dir, options.node_id, RUNTIME_ENV_PORT, port)
        print(f"rayaug: no runtime_env on this node; refusing requests on port {port}", flush=True)
    else:
        sys.exit(f"node_agents.py: no stand-in for the agent {agent!r}")
    while os.getppid() == raylet:  # reparented: the raylet is gone, and so is the node
        time.sleep(PARENT_POLL_S)


def _options(arguments: list[str]) -> argparse.Namespace:
    """The raylet's arguments a stand-in uses; the others (logging, GCS) it has no use for."""
    parser = argparse.ArgumentParser(prog="node_agents.py")
    parser.add_argument("--node-id", required=True)
    parser.add_argument("--session-dir", required=True)
    parser.add_argument("--node-ip-address", default="127.0.0.1")
    parser.add_argument("--runtime-env-agent-port", type=int, default=0)
    parser.add_argument("--stdout-filepath", default="")
    return parser.parse_known_args(arguments)[0]


def persist_port(folder: str, node_id: str, name: str, port: int) -> None:
    """Write a port file as Ray's agents do, whole or not at all (the raylet polls for it)."""
    path = os.path.join(folder, f"{name}_{node_id}")
    partial = f"{path}.partial-{os.getpid()}"
    with open(partial, "w") as file:
        file.write(str(port))
    os.replace(partial, path)


def _runtime_env_server(address: str, port: int) -> HTTPServer:
    """An HTTP server on `address` (the node's own: loopback) that refuses every request."""
    family = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)[0][0]
    server_class = type("RefusingServer", (HTTPServer,), {"address_family": family})
    return server_class((address, port), _Refusal)


class _Refusal(BaseHTTPRequestHandler):
    """The raylet POSTs a protobuf request; any answer other than 2xx fails the runtime env
    with this body in its message."""

    protocol_version = "HTTP/1.1"  # the raylet keeps its connections open for the next call

    def do_POST(self) -> None:  # noqa: N802 - the name http.server calls
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = REFUSAL.encode()
        self.send_response(501)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - http.server's
        print(f"rayaug: refused {format % args}", flush=True)


if __name__ == "__main__":
    main()
