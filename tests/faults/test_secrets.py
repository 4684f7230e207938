"""Fault 9: storage credentials appear in no output object, manifest, log line or message.

A real job runs S3 to S3 with the session server's credentials in the environment (as on a
cluster node), through the CLI as a user runs it: `run -v` (through a proxy that fails the first
uploads, so retries are logged), `status`, `inspect --json --verify`, and a run with a wrong
secret. Then every object under the output prefix, everything each command printed and every
Ray log file written meanwhile are searched for the secret key (whole, or any 16 characters of
it) and for the wrong secret. The access key id is not a secret (S3 logs it with each request;
here it even equals the bucket's name), so it may appear.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pyarrow.fs as pafs
import pytest
import yaml
from conftest import BUCKET
from s3server import SeaweedS3

from faults.flaky_proxy import FlakyProxy
from rayaug import job, submit
from rayaug.spec import load_spec

pytestmark = [pytest.mark.s3, pytest.mark.slow]

OPS = [
    {"name": "random_resized_crop", "size": 40},
    {"name": "color_jitter", "brightness": 0.3, "hue": 0.05, "p": 0.7},
]
RAYAUG = Path(sys.executable).parent / "rayaug"
WINDOW = 16  # a leak of part of the secret counts too


def fragments(secret: str) -> set[str]:
    return {secret} | {secret[i : i + WINDOW] for i in range(len(secret) - WINDOW + 1)}


def leaks(blob: bytes, secrets: dict[str, str]) -> list[str]:
    """Which of the named secrets (or a fragment of one) the blob holds."""
    text = blob.decode("utf-8", "replace")
    return [name for name, value in secrets.items() if any(f in text for f in fragments(value))]


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(RAYAUG), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env or dict(os.environ),
    )


def ray_log_files(since: float) -> list[Path]:
    """Files of this session's Ray (and under RAY_TMPDIR) written since `since`."""
    import ray

    roots = {Path(ray._private.worker._global_node.get_session_dir_path())}
    if os.environ.get("RAY_TMPDIR"):
        roots.add(Path(os.environ["RAY_TMPDIR"]))
    found = set()
    for root in roots:
        for path in root.rglob("*"):
            try:
                if path.is_file() and not path.is_symlink() and path.stat().st_mtime >= since:
                    found.add(path)
            except OSError:  # a file Ray removed meanwhile
                continue
    return sorted(found)


def test_credentials_leak_nowhere(
    ray_cluster: str, s3: SeaweedS3, photos: list, tmp_path: Path
) -> None:
    started = time.time() - 1
    secret = s3.secret_key
    assert os.environ["AWS_SECRET_ACCESS_KEY"] == secret  # what the job and Ray's workers use
    wrong = "wrong-" + uuid.uuid4().hex
    secrets = {"secret key": secret, "wrong secret": wrong}
    assert leaks(f"...{secret[7 : 7 + WINDOW]}...".encode(), secrets) == ["secret key"]  # it bites
    direct = f"http://{s3.endpoint}"

    prefix = f"{BUCKET}/faults-secrets-{uuid.uuid4().hex[:8]}"
    filesystem = s3.filesystem()
    for photo in photos[:10]:
        with filesystem.open_output_stream(f"{prefix}/in/{photo.key}") as stream:
            stream.write(photo.jpeg)
    with filesystem.open_output_stream(f"{prefix}/in/broken/not-a-photo.jpg") as stream:
        stream.write(b"not a jpeg: its error message lands in errors/")
    out_uri = f"s3://{prefix}/out"
    texts: dict[str, str] = {}

    with FlakyProxy(
        s3.endpoint, every=1, limit=5, kinds=("internal", "slowdown"), methods=("PUT",)
    ) as proxy:
        spec = {
            "input": {"uri": f"s3://{prefix}/in"},
            "output": {"uri": out_uri, "shard_size": 4},
            "views": 2,
            "seed": 9,
            "ops": OPS,
            "execution": {"batch_size": 4, "concurrency": 1},
            "errors": {"max_error_rate": 0.2},
            "storage": {"endpoint": proxy.url, "region": s3.region},
        }
        spec_file = tmp_path / "job.yaml"
        spec_file.write_text(yaml.safe_dump(spec))
        run = cli("-v", "run", str(spec_file), "--address", ray_cluster, "--json")
        texts["run -v"] = run.stdout + run.stderr
        assert run.returncode == 0, run.stderr
        assert proxy.counts["internal"] and proxy.counts["slowdown"]  # retried, and logged:
        assert "retry 1/" in run.stderr, run.stderr

        refused = cli(
            "-v",
            "run",
            str(spec_file),
            "--address",
            ray_cluster,
            env=os.environ | {"AWS_SECRET_ACCESS_KEY": wrong},
        )
        texts["run with a wrong secret"] = refused.stdout + refused.stderr
        assert refused.returncode == 2, refused.stderr
        assert "credentials refused" in refused.stderr and "Traceback" not in refused.stderr
    summary = json.loads(run.stdout)
    assert summary["samples"] == 20 and summary["quarantined"] == 2

    status = cli("status", out_uri, "--endpoint", direct)
    texts["status"] = status.stdout + status.stderr
    assert status.returncode == 0, status.stderr
    assert "done" in status.stdout

    report = cli("-v", "inspect", out_uri, "--json", "--verify", "--endpoint", direct)
    texts["inspect"] = report.stdout + report.stderr
    assert report.returncode == 0, report.stdout + report.stderr
    assert json.loads(report.stdout)["breaches"] == []

    # Every object under the output prefix, downloaded whole.
    selector = pafs.FileSelector(f"{prefix}/out", recursive=True)
    objects = {
        info.path.removeprefix(f"{prefix}/out/"): filesystem.open_input_stream(info.path).read()
        for info in filesystem.get_file_info(selector)
        if info.type == pafs.FileType.File
    }
    kinds = {path.split("/")[0] for path in objects}
    assert {"data", "manifests", "errors", "_job", "_SUCCESS"} <= kinds, sorted(objects)
    assert {"_job/spec.yaml", "_job/plan.json", "_job/fingerprint.json"} <= set(objects)

    logs = ray_log_files(started)
    assert logs, "no Ray log file was written during the test"

    found = [
        f"object {path}: {leaks(blob, secrets)}"
        for path, blob in objects.items()
        if leaks(blob, secrets)
    ]
    found += [
        f"output of `rayaug {name}`: {leaks(text.encode(), secrets)}"
        for name, text in texts.items()
        if leaks(text.encode(), secrets)
    ]
    found += [
        f"Ray log {path}: {leaks(path.read_bytes(), secrets)}"
        for path in logs
        if leaks(path.read_bytes(), secrets)
    ]
    assert found == [], "credentials leaked:\n" + "\n".join(found)


def test_submit_would_not_ship_credentials(
    s3: SeaweedS3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`rayaug submit` with the session's credentials in the environment: nothing it sends to
    the cluster (runtime_env, entrypoint, metadata, shipped spec) holds the secret."""
    secret = s3.secret_key
    assert os.environ["AWS_SECRET_ACCESS_KEY"] == secret
    monkeypatch.setenv("AWS_SESSION_TOKEN", "session-" + uuid.uuid4().hex)
    token = os.environ["AWS_SESSION_TOKEN"]

    forwarded = submit.forwarded_env()
    assert forwarded  # the endpoint and region do travel
    assert set(forwarded) <= set(job.FORWARDED_ENV)
    assert not leaks(json.dumps(forwarded).encode(), {"secret": secret, "token": token})
    # Defence in depth: even a FORWARDED_ENV that named them would not ship them.
    monkeypatch.setattr(
        job,
        "FORWARDED_ENV",
        (*job.FORWARDED_ENV, "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID"),
    )
    assert set(submit.forwarded_env()) == set(forwarded)

    spec_file = tmp_path / "job.yaml"
    spec_file.write_text(
        yaml.safe_dump(
            {
                "input": {"uri": f"s3://{BUCKET}/in"},
                "output": {"uri": f"s3://{BUCKET}/out"},
                "ops": OPS,
                "storage": {"endpoint": f"http://{s3.endpoint}", "region": s3.region},
            }
        )
    )
    sent: dict = {}

    class Recorder:
        def submit_job(self, **kwargs: object) -> str:
            working_dir = Path(kwargs["runtime_env"]["working_dir"])  # type: ignore[index]
            sent["files"] = {p.name: p.read_text() for p in working_dir.rglob("*") if p.is_file()}
            sent["kwargs"] = kwargs
            return "raysubmit_secrets"

    monkeypatch.setattr(submit, "_client", lambda url: Recorder())
    submit.submit_job(load_spec(spec_file), spec_file, "http://127.0.0.1:8265")
    everything = json.dumps(sent, default=str).encode()
    assert sent["kwargs"]["runtime_env"]["env_vars"] == forwarded
    assert not leaks(everything, {"secret": secret, "token": token})
