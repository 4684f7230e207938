"""`rayaug submit` through the Ray Jobs API, and the cluster-launcher config.

The end-to-end test starts its own Ray head (`ray start --head --block`, loopback only, in its own
session and temp dir), submits a tiny job with the CLI as a user would, waits for it, and reads the
output. Its output is on an Azurite of this module (az://): the node has the account's key in its
environment, the submitter forwards the account's name and the spec names the endpoint, so the
job writes only if each reached it, and no key is in what the cluster recorded. The head is stopped
by its own pids (every process of the session it leads), never with `ray stop`, which would end
every Ray on the machine.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
import yaml
from azureserver import Azurite
from ports import free_port, free_ports

from rayaug import sampledata, submit
from rayaug.errors import UsageError
from rayaug.job import FORWARDED_ENV
from rayaug.spec import load_spec

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent  # the venv's bin: .venv/bin when run as .venv/bin/python
RAYAUG = BIN / "rayaug"

SPEC = """\
version: 1
name: submit-test
input: {uri: in}
output: {uri: out, shard_size: 4}
views: 2
seed: 5
ops:
  - {name: horizontal_flip, p: 0.5}
  - {name: rotation, degrees: 10, p: 0.5}
execution: {concurrency: 1, batch_size: 8}
"""
FAKE_SECRETS = {
    "AWS_ACCESS_KEY_ID": "AKIAFAKEKEYFORTEST000",
    "AWS_SECRET_ACCESS_KEY": "fake-secret-access-key-for-the-test-0000",
    "AWS_SESSION_TOKEN": "fake-session-token-for-the-test-0000",
}


def _secrets_to_hide() -> list[str]:
    """The Ray token(s) this machine has, and the fake AWS credentials the tests set."""
    found = list(FAKE_SECRETS.values())
    token_file = Path(os.environ.get("RAY_AUTH_TOKEN_PATH", Path.home() / ".ray" / "auth_token"))
    if token_file.is_file() and token_file.read_text().strip():
        found.append(token_file.read_text().strip())
    if os.environ.get("RAY_AUTH_TOKEN"):
        found.append(os.environ["RAY_AUTH_TOKEN"])
    return found


def _environ_without_ray_address() -> dict[str, str]:
    hidden = ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")
    return {k: v for k, v in os.environ.items() if k not in hidden}


def _cli_env(**extra: str) -> dict[str, str]:
    """This process's environment without Ray's address and without Azure settings of other
    tests' servers (the session Azurite's connection string), plus `extra`."""
    env = {k: v for k, v in _environ_without_ray_address().items() if not k.startswith("AZURE")}
    env.update(AWS_EC2_METADATA_DISABLED="true", **extra)
    return env


# ---------------------------------------------------------------- a real head for this module


@dataclass
class Head:
    url: str
    pid: int
    temp_dir: Path


def _session_pids(sid: int) -> list[int]:
    """Every live process of the session the head leads (its services, workers, job drivers)."""
    out = subprocess.run(["ps", "-e", "-o", "pid=,sid=,stat="], capture_output=True, text=True)
    pids = []
    for line in out.stdout.splitlines():
        pid, session, stat = line.split(None, 2)
        if int(session) == sid and not stat.startswith("Z"):
            pids.append(int(pid))
    return pids


def _stop_head(process: subprocess.Popen) -> list[int]:
    """SIGTERM the `ray start --block` leader (it stops its services), then SIGKILL what is left."""
    sid = process.pid
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=20)
    deadline = time.monotonic() + 5
    while _session_pids(sid) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in _session_pids(sid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if process.poll() is None:
        process.kill()
    process.wait(timeout=10)
    deadline = time.monotonic() + 10
    while _session_pids(sid) and time.monotonic() < deadline:
        time.sleep(0.2)
    return _session_pids(sid)


def _wait_for_dashboard(url: str, process: subprocess.Popen, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"ray start exited {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/api/version", timeout=2):
                return
        except urllib.error.HTTPError:  # 401 with token auth: it answers, so it is up
            return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"the dashboard at {url} did not answer in {timeout}s")


@contextlib.contextmanager
def _head(
    bin_dir: Path, *, hide: tuple[str, ...] = (), node_env: dict[str, str] | None = None
) -> Iterator[Head]:
    """A Ray head on loopback with the dashboard (Jobs API), in its own session and temp dir,
    started from the Python of `bin_dir` (jobs run the `python` first on the head's PATH), with
    no Azure variable of this process and `node_env` (a node's own credentials) in its
    environment."""
    temp_dir = Path(tempfile.mkdtemp(prefix="rh-", dir="/tmp"))  # short: unix sockets < 107
    names = (
        "port",
        "dashboard-port",
        "object-manager-port",
        "node-manager-port",
        "ray-client-server-port",
        "dashboard-agent-listen-port",
        "dashboard-agent-grpc-port",
        "runtime-env-agent-port",
        "metrics-export-port",
    )
    ports = dict(zip(names, free_ports(len(names)), strict=True))
    command = [
        str(bin_dir / "ray"), "start", "--head", "--block",
        "--node-ip-address", "127.0.0.1",
        "--dashboard-host", "127.0.0.1",
        "--include-dashboard", "true",
        "--num-cpus", "2",
        "--temp-dir", str(temp_dir),
        "--min-worker-port", "0", "--max-worker-port", "0",  # workers take any free port
        "--disable-usage-stats",
    ]  # fmt: skip
    for name, port in ports.items():
        command += [f"--{name}", str(port)]
    env = {
        k: v
        for k, v in _environ_without_ray_address().items()
        if k not in hide and not k.startswith("AZURE")
    }
    env.update(
        **(node_env or {}),
        PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
        RAY_USAGE_STATS_ENABLED="0",
        RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="0",  # SIGTERM: stop now, not after a 30 s drain
        AWS_EC2_METADATA_DISABLED="true",
    )
    log = temp_dir / "ray-start.log"
    with log.open("w") as sink:
        process = subprocess.Popen(
            command, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )
    url = f"http://127.0.0.1:{ports['dashboard-port']}"
    try:
        _wait_for_dashboard(url, process, log, timeout=90)
        yield Head(url, process.pid, temp_dir)
    finally:
        left = _stop_head(process)
        shutil.rmtree(temp_dir, ignore_errors=True)
        assert not left, f"processes of the test head still running: {left}"


CONTAINER = "submitted"


@pytest.fixture(scope="module")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Azurite]:
    """An Azurite of this module (not the session's `azure`, which would group these tests
    with the session Ray's: two Rays side by side on two cores), with container CONTAINER."""
    server = Azurite(tmp_path_factory.mktemp("azurite"))
    server.start()
    try:
        server.create_bucket(CONTAINER)
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def ray_head(azurite: Azurite) -> Iterator[Head]:
    """A head whose Python is rayaug's own venv: a cluster image with rayaug installed, on a
    node whose environment holds the storage account's key (and nothing else of Azure)."""
    with _head(BIN, node_env={"AZURE_STORAGE_ACCOUNT_KEY": azurite.key}) as head:
        yield head


# A cluster image with Ray and nothing of rayaug's requirements, not even torch: a CPU job
# runs on OpenCV alone. Built once per version set under /tmp (from a warm pip cache), reused
# while its stamp exists.
PLAIN_REQUIREMENTS = ("ray[default]==2.60.0",)
# Variables that would let the plain head see rayaug's venv or this checkout.
NOT_FOR_THE_PLAIN_HEAD = ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")


def _plain_ray_venv() -> Path:
    key = hashlib.sha256(f"{sys.version_info[:2]} {PLAIN_REQUIREMENTS}".encode()).hexdigest()[:12]
    venv = Path(tempfile.gettempdir()) / f"rayaug-plain-ray-{key}"
    stamp = venv / ".complete"  # written last: a venv without it is a broken build
    if stamp.is_file():
        return venv
    shutil.rmtree(venv, ignore_errors=True)
    # Built at its final path: a venv's scripts (bin/ray) name their python by absolute path.
    env = {k: v for k, v in os.environ.items() if k not in NOT_FOR_THE_PLAIN_HEAD}
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=env)
    subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
         "--disable-pip-version-check", *PLAIN_REQUIREMENTS],
        check=True, env=env, capture_output=True, timeout=600,
    )  # fmt: skip
    stamp.touch()
    return venv


@pytest.fixture(scope="module")
def plain_ray_head() -> Iterator[Head]:
    """A head whose Python has Ray only."""
    venv = _plain_ray_venv()
    for module in ("rich", "torch"):
        probe = subprocess.run(
            [str(venv / "bin" / "python"), "-c", f"import ray, {module}"],
            env={k: v for k, v in os.environ.items() if k not in NOT_FOR_THE_PLAIN_HEAD},
            capture_output=True,
        )
        assert probe.returncode != 0, f"the plain venv must not have {module}"
    with _head(venv / "bin", hide=NOT_FOR_THE_PLAIN_HEAD) as head:
        yield head


def _job(tmp_path: Path, spec: str = SPEC) -> None:
    sampledata.write_folder(sampledata.make_photos(8, short_side=(64, 96)), tmp_path / "in")
    (tmp_path / "job.yaml").write_text(spec)


def _submit(tmp_path: Path, url: str, *options: str, timeout: float = 300, **env: str):
    return subprocess.run(
        [str(RAYAUG), "submit", "job.yaml", "--address", url, "--wait", *options],
        cwd=tmp_path,  # relative input/output: resolved here, not in the job's working_dir
        env=_cli_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _read_back(out: str, printed: str, fs: pafs.FileSystem | None = None, **env: str) -> list[str]:
    """The committed output's sample ids, from its manifests; `inspect --verify` (run with
    `env`) must pass. `fs` reads a cloud URI's objects (default: `out` is a local path)."""
    path = out.split("://", 1)[1] if fs else out
    fs = fs or pafs.LocalFileSystem()
    assert fs.get_file_info(f"{path}/_SUCCESS").type == pafs.FileType.File, printed
    manifests = sorted(
        info.path
        for info in fs.get_file_info(pafs.FileSelector(f"{path}/manifests"))
        if info.path.endswith(".parquet")
    )
    verify = subprocess.run(
        [str(RAYAUG), "inspect", out, "--verify"],
        env=_cli_env(**env), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert verify.returncode == 0 and "verify: OK" in verify.stdout, verify.stdout + verify.stderr
    return [
        s
        for manifest in manifests
        for s in pq.read_table(manifest, filesystem=fs).column("sample_id").to_pylist()
    ]


@pytest.mark.slow
def test_submit_and_wait_on_a_real_head(ray_head: Head, azurite: Azurite, tmp_path: Path) -> None:
    """A cluster whose image has rayaug: only the package and the spec travel. The job writes
    to az://: the account's name travels as a forwarded setting, the endpoint in the spec, the
    key only on the node (the submitter's own key, set here too, must not travel)."""
    out = f"az://{CONTAINER}/{tmp_path.name}/out"
    storage = f"storage: {{endpoint: 'http://{azurite.endpoint}'}}\n"
    _job(tmp_path, SPEC.replace("{uri: out,", f"{{uri: '{out}',") + storage)
    started = time.monotonic()
    result = _submit(
        tmp_path, ray_head.url, "--no-ship-deps",
        RAY_ADDRESS="127.0.0.1:1", **FAKE_SECRETS,  # --address must win
        AZURE_STORAGE_ACCOUNT_NAME=azurite.account, AZURE_STORAGE_ACCOUNT_KEY=azurite.key,
    )  # fmt: skip
    printed = result.stdout + result.stderr
    assert result.returncode == 0, printed
    assert time.monotonic() - started < 240, printed

    reader = {"AZURE_STORAGE_CONNECTION_STRING": azurite.connection_string()}
    sample_ids = _read_back(out, printed, azurite.filesystem(), **reader)
    assert len(sample_ids) == len(set(sample_ids)) == 16, printed
    assert "SUCCEEDED" in result.stdout
    assert "done: 16 samples" in printed  # the job's own log, streamed back
    hidden = [*_secrets_to_hide(), azurite.key]
    for secret in hidden:
        assert secret not in printed

    # What the cluster recorded of the submission: the forwarded settings, no credential.
    job_id = re.search(r"submitted (\S+) to ", result.stdout).group(1)
    info = submit._client(ray_head.url).get_job_info(job_id)
    recorded = json.dumps({"env": info.runtime_env, "entrypoint": info.entrypoint,
                           "metadata": info.metadata})  # fmt: skip
    env_vars = info.runtime_env["env_vars"]
    assert env_vars["AWS_EC2_METADATA_DISABLED"] == "true"
    assert env_vars["AZURE_STORAGE_ACCOUNT_NAME"] == azurite.account
    assert set(env_vars) <= set(FORWARDED_ENV)
    assert "pip" not in info.runtime_env
    assert info.entrypoint == submit.entrypoint("job.yaml")
    for secret in hidden:
        assert secret not in recorded
    # Nor in any object the job wrote (its resolved spec included).
    fs = azurite.filesystem()
    for item in fs.get_file_info(pafs.FileSelector(out.split("://", 1)[1], recursive=True)):
        if item.type == pafs.FileType.File:
            with fs.open_input_stream(item.path) as stream:
                assert azurite.key.encode() not in stream.read(), item.path


@pytest.mark.slow
def test_a_plain_ray_head_without_shipped_requirements_says_what_is_missing(
    plain_ray_head: Head, tmp_path: Path
) -> None:
    _job(tmp_path)
    result = _submit(tmp_path, plain_ray_head.url, "--no-ship-deps")
    printed = result.stdout + result.stderr
    assert result.returncode == 2, printed
    assert "Traceback" not in printed
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: rayaug: this Ray cluster's Python lacks "), printed
    missing = last.split(":")[2]
    # Ray brings click, pydantic and pyyaml itself; the rest is rayaug's alone.
    for dist in ("rich", "opencv-python-headless", "pillow", "pyarrow", "pandas"):
        assert dist in missing, last
    assert "torch" not in missing and "kornia" not in missing  # a CPU job needs neither
    assert "--no-ship-deps" in last and "cluster's image" in last
    assert not (tmp_path / "out").exists()


WEBDATASET_SPEC = SPEC.replace("output: {uri: out, ", "output: {uri: out, format: webdataset, ")


@pytest.mark.slow
def test_a_plain_ray_head_runs_the_job_with_shipped_requirements(
    plain_ray_head: Head, tmp_path: Path
) -> None:
    """By default rayaug's pinned requirements travel with the job: a Ray-only image runs it."""
    _job(tmp_path, WEBDATASET_SPEC)
    started = time.monotonic()
    result = _submit(tmp_path, plain_ray_head.url, timeout=480)
    printed = result.stdout + result.stderr
    assert result.returncode == 0, printed
    # The first job on a node builds its environment (pip, from the warm cache here).
    print(f"first job on a plain Ray head, environment included: {time.monotonic() - started:.0f}s")

    out = tmp_path / "out"
    sample_ids = _read_back(str(out), printed)
    assert len(sample_ids) == len(set(sample_ids)) == 16, printed
    import webdataset

    tars = sorted(str(p) for p in (out / "data").rglob("*.tar"))  # data/view=E/ (by_view)
    samples = list(webdataset.WebDataset(tars, shardshuffle=False, empty_check=False))
    assert len(samples) == 16
    assert all(sample["jpg"][:2] == b"\xff\xd8" for sample in samples)  # JPEG bytes

    job_id = re.search(r"submitted (\S+) to ", result.stdout).group(1)
    pip = submit._client(plain_ray_head.url).get_job_info(job_id).runtime_env["pip"]
    names = [re.split(r"[\[=]", line)[0] for line in pip["packages"]]
    assert "rich" in names and "torch" not in names and "kornia" not in names
    assert "ray[data,default]==2.60.0" in pip["packages"]  # the cluster's own Ray: never installed


def test_submit_to_nothing_exits_2_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "job.yaml").write_text(SPEC)
    port = free_port()  # closed again: nothing listens there
    result = subprocess.run(
        [str(RAYAUG), "submit", "job.yaml", "--address", f"http://127.0.0.1:{port}", "--wait"],
        cwd=tmp_path,
        env=_cli_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "nothing answers" in lines[0] and f"127.0.0.1:{port}" in lines[0]
    assert "Traceback" not in result.stdout + result.stderr


# ---------------------------------------------------------------- without a cluster


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("http://127.0.0.1:8265", "http://127.0.0.1:8265"),
        ("127.0.0.1:9000", "http://127.0.0.1:9000"),
        ("http://head/", "http://head:8265"),
        ("https://ray.example.com", "https://ray.example.com:443"),
        ("http://[::1]:8265", "http://[::1]:8265"),
    ],
)
def test_dashboard_url(given: str, expected: str) -> None:
    assert submit._dashboard_url(given) == expected


@pytest.mark.parametrize(
    "given",
    ["", "ray://head:10001", "ftp://head:21", "http://head:port", "http://h:1/api", "http://:80"],
)
def test_dashboard_url_rejects(given: str) -> None:
    with pytest.raises(UsageError):
        submit._dashboard_url(given)


class _RecordingClient:
    """Stands in for JobSubmissionClient: records the submission, reads the shipped spec."""

    def __init__(self) -> None:
        self.kwargs: dict = {}
        self.shipped: dict[str, str] = {}

    def submit_job(self, **kwargs) -> str:
        self.kwargs = kwargs
        working_dir = Path(kwargs["runtime_env"]["working_dir"])
        self.shipped = {p.name: p.read_text() for p in working_dir.iterdir()}
        return "raysubmit_test"


def test_submission_has_absolute_paths_and_no_credentials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "job.yaml").write_text(SPEC)
    monkeypatch.chdir(tmp_path)
    for name, value in {**FAKE_SECRETS, "RAY_AUTH_TOKEN": "fake-ray-token-0000"}.items():
        monkeypatch.setenv(name, value)
    for name in FORWARDED_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    client = _RecordingClient()
    monkeypatch.setattr(submit, "_client", lambda url: client)

    job_id = submit.submit_job(load_spec("job.yaml"), Path("job.yaml"), "http://127.0.0.1:8265")

    assert job_id == "raysubmit_test"
    runtime_env = client.kwargs["runtime_env"]
    assert client.kwargs["entrypoint"] == submit.entrypoint("job.yaml")
    assert runtime_env["py_modules"] == [str(Path(submit.__file__).resolve().parent)]
    assert runtime_env["env_vars"] == {
        "AWS_REGION": "eu-west-1",
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    shipped = yaml.safe_load(client.shipped["job.yaml"])
    assert shipped["input"]["uri"] == str(tmp_path.resolve() / "in")
    assert shipped["output"]["uri"] == str(tmp_path.resolve() / "out")
    everything = json.dumps(client.kwargs) + "".join(client.shipped.values())
    for secret in [*FAKE_SECRETS.values(), "fake-ray-token-0000"]:
        assert secret not in everything


CLOUD_SECRETS = {
    "AZURE_STORAGE_ACCOUNT_KEY": "ZmFrZS1henVyZS1hY2NvdW50LWtleS0wMDAw",
    "AZURE_STORAGE_CONNECTION_STRING": "AccountName=acct;AccountKey=ZmFrZS1jb25uLWtleS0wMDAw",
    "AZURE_STORAGE_SAS_TOKEN": "sv=2024&sig=fake-sas-signature-0000",
    "AZURE_CLIENT_SECRET": "fake-azure-client-secret-0000",
    "GOOGLE_APPLICATION_CREDENTIALS": "/secret/fake-google-key-0000.json",
}


def test_a_cloud_job_ships_its_sdk_and_settings_but_no_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gs:// to az://: the Azure SDK that writes blobs travels (pinned), and so do the account's
    name and the GCS emulator's address; no key, SAS, connection string or key file path."""
    spec = SPEC.replace("{uri: in}", "{uri: gs://bucket/in}")
    (tmp_path / "job.yaml").write_text(spec.replace("{uri: out,", "{uri: az://container/out,"))
    monkeypatch.chdir(tmp_path)
    for name in FORWARDED_ENV:
        monkeypatch.delenv(name, raising=False)
    for name, value in CLOUD_SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_NAME", "acct")
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9023")
    client = _RecordingClient()
    monkeypatch.setattr(submit, "_client", lambda url: client)

    submit.submit_job(load_spec("job.yaml"), Path("job.yaml"), "http://127.0.0.1:8265")

    runtime_env = client.kwargs["runtime_env"]
    assert runtime_env["env_vars"] == {
        "AZURE_STORAGE_ACCOUNT_NAME": "acct",
        "STORAGE_EMULATOR_HOST": "http://127.0.0.1:9023",
    }
    packages = runtime_env["pip"]["packages"]
    assert [p.split("==")[0] for p in packages if p.startswith("azure")] == [
        "azure-storage-blob",
        "azure-identity",
    ]
    from rayaug import preflight

    assert "azure-storage-blob" in json.loads(client.shipped[preflight.REQUIREMENTS_FILE])
    everything = json.dumps(client.kwargs) + "".join(client.shipped.values())
    for secret in CLOUD_SECRETS.values():
        assert secret not in everything


class _FlakyLogClient:
    """A job whose log stream breaks after two chunks; polling must finish it, no line twice."""

    LOG = "line 1\nline 2\nline 3\nline 4\n"

    def __init__(self) -> None:
        self.polls = 0

    async def tail_job_logs(self, job_id: str):
        yield self.LOG[:7]
        yield self.LOG[7:14]
        raise RuntimeError("WebSocket connection closed unexpectedly with close code 1006")

    def get_job_status(self, job_id: str) -> str:
        self.polls += 1
        return "RUNNING" if self.polls < 3 else "SUCCEEDED"

    def get_job_logs(self, job_id: str) -> str:
        return self.LOG[: 14 + 7 * self.polls]

    def get_address(self) -> str:
        return "http://127.0.0.1:8265"


def test_wait_for_resumes_a_broken_log_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    client = _FlakyLogClient()
    monkeypatch.setattr(submit, "_client", lambda url: client)
    monkeypatch.setattr(submit, "_POLL_S", 0.01)
    shown: list[str] = []

    status = submit.wait_for("http://127.0.0.1:8265", "raysubmit_x", shown.append)

    assert status == "SUCCEEDED"
    assert "".join(shown) == _FlakyLogClient.LOG


def test_remote_uris_are_left_alone() -> None:
    for uri in ("s3://bucket/prefix", "file:///data/x", "/abs/path"):
        assert submit._absolute_uri(uri) == uri


# ---------------------------------------------------------------- the cluster-launcher config


def test_cluster_yaml_is_a_valid_ray_cluster_config() -> None:
    config = yaml.safe_load((REPO / "cluster.yaml").read_text())
    required = ("cluster_name", "provider", "available_node_types", "head_node_type")
    commands = ("setup_commands", "head_start_ray_commands", "worker_start_ray_commands")
    for key in required + commands:
        assert key in config, key

    import ray.autoscaler

    schema_path = Path(ray.autoscaler.__file__).parent / "ray-schema.json"
    if schema_path.is_file():
        jsonschema = pytest.importorskip("jsonschema")
        jsonschema.validate(config, json.loads(schema_path.read_text()))
    # Ray's own checks after merging the provider's defaults, as `ray up` does (offline).
    from ray.autoscaler._private.util import prepare_config, validate_config

    validate_config(prepare_config(copy.deepcopy(config)))

    types = config["available_node_types"]
    head = types[config["head_node_type"]]
    workers = [t for name, t in types.items() if name != config["head_node_type"]]
    assert head["resources"].get("GPU", 0) == 0
    assert any(
        w["resources"].get("GPU", 0) >= 1 and w["min_workers"] == 0 and w["max_workers"] > 0
        for w in workers
    )
    commands = " ".join(
        config["setup_commands"]
        + config.get("head_setup_commands", [])
        + config.get("worker_setup_commands", [])
    )
    assert "pip install" in commands and "torch" in commands and "rayaug" in commands
    assert any("ray start --head" in c for c in config["head_start_ray_commands"])
    assert any("--address=$RAY_HEAD_IP:6379" in c for c in config["worker_start_ray_commands"])


# ---------------------------------------------------------------- what travels with the job


def test_shipped_requirements_are_pinned_and_leave_out_ray_and_torch() -> None:
    from importlib.metadata import version

    lines = submit.shipped_requirements("2.61.0")
    assert f"opencv-python-headless=={version('opencv-python-headless')}" in lines
    assert "ray[data,default]==2.61.0" in lines  # the cluster's Ray: pip finds it installed
    unwanted = ("torch", "kornia", "ray=", "pytest", "ruff")
    assert not [line for line in lines if line.startswith(unwanted)]  # CPU jobs: OpenCV only
    with_torch = submit.shipped_requirements("2.60.0", ship_torch=True)
    assert f"torch=={version('torch').split('+')[0]}" in with_torch  # the cluster's index picks
    assert f"kornia=={version('kornia')}" in with_torch


def test_required_modules_map_distributions_to_imports() -> None:
    modules = submit.required_modules()
    assert modules["opencv-python-headless"] == "cv2"
    assert modules["pyyaml"] == "yaml" and modules["pillow"] == "PIL"
    assert modules["pandas"] == "pandas"  # ray[data]'s
    assert "ray" not in modules and "torch" not in modules and "kornia" not in modules
    device_path = submit.required_modules(device_path=True)
    assert device_path["torch"] == "torch" and device_path["kornia"] == "kornia"


def test_preflight_names_what_is_missing(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from rayaug import preflight

    listing = tmp_path / preflight.REQUIREMENTS_FILE
    listing.write_text(json.dumps({"click": "click", "no-such-dist": "no_such_module_x"}))
    assert preflight.main([str(listing)]) == 2
    line = capsys.readouterr().out.strip()
    assert line.startswith(preflight.MISSING_PREFIX + "no-such-dist: ")
    assert submit.missing_requirements_line(f"log\n{line}\nmore") == line
    listing.write_text(json.dumps({"click": "click"}))
    assert preflight.main([str(listing)]) == 0
