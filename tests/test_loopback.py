"""The embedded Ray of `rayaug run` listens on loopback only, seen from outside during a run.

The run happens in a network namespace of its own (`unshare --net`) that has, besides `lo`,
a non-loopback address (198.51.100.1, TEST-NET-2) and a default route through it: exactly
what Ray 2.60 would pick as "the machine's address" and listen on. Nothing can leave the
namespace. `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER` (which would also keep Ray on loopback) is
removed from the run's environment: rayaug must manage by itself.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from rayaug import sampledata

pytestmark = pytest.mark.own_ray  # a Ray of its own, in a network namespace

NETWORK_ADDRESS = "198.51.100.1"
# Inside the namespace: bring up lo, give it a network address and a default route, run the
# job in the background and list the listening sockets every 0.3 s until it ends.
SCRIPT = f"""
set -u
ip link set lo up
ip addr add {NETWORK_ADDRESS}/32 dev lo
ip route add default dev lo src {NETWORK_ADDRESS}
"$@" >"$RUN_LOG" 2>&1 &
job=$!
n=0
while kill -0 "$job" 2>/dev/null; do
  ss -ltnpH >"$SNAPSHOTS/$n.txt" 2>&1
  n=$((n + 1))
  sleep 0.3
done
wait "$job"
"""


def _namespace_problem() -> str | None:
    for tool in ("unshare", "ip", "ss"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed"
    probe = subprocess.run(["unshare", "--net", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"`unshare --net` is not permitted here: {probe.stderr.strip()[:200]}"
    return None


def _local_address(column: str) -> str:
    return column.rsplit(":", 1)[0]


def test_embedded_ray_listens_on_loopback_only(tmp_path: Path) -> None:
    problem = _namespace_problem()
    if problem:
        pytest.skip(f"cannot prove the listening sockets in a network namespace: {problem}")
    source, out = tmp_path / "input", tmp_path / "out"
    sampledata.write_folder(list(sampledata.make_photos(8, seed=2, short_side=(64, 96))), source)
    spec = tmp_path / "job.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "input": {"uri": str(source)},
                "output": {"uri": str(out), "shard_size": 4},
                "views": 1,
                "seed": 1,
                "ops": [{"name": "horizontal_flip"}],
                "execution": {"concurrency": 1},
            }
        )
    )
    snapshots = tmp_path / "ss"
    snapshots.mkdir()
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "RAY_ADDRESS")
    }
    # Short: Ray's unix socket paths must stay under 107 characters.
    ray_dir = Path(tempfile.mkdtemp(prefix="rl.", dir="/tmp"))
    env.update(
        SNAPSHOTS=str(snapshots),
        RUN_LOG=str(tmp_path / "run.log"),
        RAY_TMPDIR=str(ray_dir),
        AWS_EC2_METADATA_DISABLED="true",
    )
    rayaug = Path(sys.executable).parent / "rayaug"
    try:
        done = subprocess.run(
            ["unshare", "--net", "bash", "-c", SCRIPT, "namespace", str(rayaug), "run", str(spec)],
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
        )
        # Ray's own logs (GCS, raylet, agents) name the address the node registered under.
        logs = [
            path
            for path in ray_dir.rglob("*")
            if path.is_file() and path.suffix in (".out", ".err", ".log")
        ]
        naming_network = sorted(
            path.name for path in logs if NETWORK_ADDRESS in path.read_text(errors="replace")
        )
        naming_loopback = [
            path.name for path in logs if "127.0.0.1" in path.read_text(errors="replace")
        ]
    finally:
        shutil.rmtree(ray_dir, ignore_errors=True)
    log = (tmp_path / "run.log").read_text()
    assert done.returncode == 0, f"{done.stderr}\n{log}"
    assert "done: 8 samples" in log, log

    listening: dict[str, set[str]] = {}  # local address -> the processes seen on it
    for snapshot in snapshots.glob("*.txt"):
        for line in snapshot.read_text().splitlines():
            fields = line.split()
            if len(fields) >= 4:
                owner = fields[5] if len(fields) > 5 else "?"
                listening.setdefault(_local_address(fields[3]), set()).add(owner)
    owners = " ".join(sorted({o for found in listening.values() for o in found}))
    # The run was seen with Ray up: its GCS and raylet were listening.
    assert "gcs_server" in owners and "raylet" in owners, listening
    assert set(listening) <= {"127.0.0.1", "[::ffff:127.0.0.1]", "[::1]"}, listening
    # And the node registered itself under loopback: no Ray log names the network address.
    assert naming_loopback and not naming_network, naming_network
