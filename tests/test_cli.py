"""The `rayaug` command as a user runs it: exit codes, one-line errors, inspect, replay."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from click.testing import CliRunner, Result
from PIL import Image

from rayaug.cli import _exit_code, main

OPS = [
    {"name": "random_resized_crop", "size": 48},
    {"name": "horizontal_flip"},
    {"name": "color_jitter", "brightness": 0.3, "hue": 0.05, "p": 0.7},
]


# The prefix of an error-level line of Ray's C++ log: [date time,ms E pid tid].
RAY_ERROR_PREFIX = re.compile(r"\[\d{4}-\d\d-\d\d [\d:,]+ E \d+ \d+\]")


def write_spec(path: Path, source: Path | str, out: Path | str, **extra) -> Path:
    spec = {
        "input": {"uri": str(source)},
        "output": {"uri": str(out), "shard_size": 8},
        "views": 2,
        "seed": 5,
        "ops": OPS,
        "execution": {"batch_size": 16, "concurrency": 1},
    } | extra
    path.write_text(yaml.safe_dump(spec))
    return path


def rayaug(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def assert_one_line_error(result: Result, code: int, *words: str) -> None:
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    for word in words:
        assert word in result.output


@pytest.fixture(scope="module")
def finished(ray_cluster: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One finished job shared by the read-only commands below."""
    from rayaug import sampledata

    root = tmp_path_factory.mktemp("cli")
    sampledata.write_folder(
        list(sampledata.make_photos(16, seed=4, short_side=(80, 140))), root / "input"
    )
    spec = write_spec(root / "job.yaml", root / "input", root / "out")
    result = rayaug("run", str(spec))
    assert result.exit_code == 0, result.output
    assert "done: 32 samples in 2 shards, 0 quarantined" in result.output
    return root / "out"


def test_validate_accepts_the_examples() -> None:
    for spec in sorted(Path("jobs").glob("*.yaml")):
        result = rayaug("validate", str(spec))
        assert result.exit_code == 0 and "valid" in result.output, result.output


def test_validate_names_the_field_and_the_file(tmp_path: Path) -> None:
    spec = write_spec(
        tmp_path / "bad.yaml",
        "in",
        "out",
        ops=[{"name": "horizontal_flip"}, {"name": "rotation", "degrees": -3}, {"name": "blurr"}],
    )
    result = rayaug("validate", str(spec))
    assert_one_line_error(result, 2, str(spec), "ops[1].degrees: must be ≥ 0", "ops[2]", "blurr")


def test_validate_reports_yaml_and_missing_files(tmp_path: Path) -> None:
    (tmp_path / "broken.yaml").write_text("input: [unclosed")
    assert_one_line_error(rayaug("validate", str(tmp_path / "broken.yaml")), 2, "not valid YAML")
    assert_one_line_error(rayaug("validate", str(tmp_path / "absent.yaml")), 2, "cannot read")


@pytest.mark.parametrize(
    ("source", "words"),
    [
        ("hdfs://nn/images", ["unsupported URI scheme 'hdfs'"]),
        ("s3://", ["names no bucket"]),
        ("/nonexistent/rayaug/input", ["does not exist"]),
    ],
)
def test_run_refuses_bad_inputs_before_starting(tmp_path: Path, source: str, words) -> None:
    spec = write_spec(tmp_path / "job.yaml", source, tmp_path / "out")
    assert_one_line_error(rayaug("run", str(spec)), 2, *words)


def test_status_and_inspect(finished: Path, tmp_path: Path) -> None:
    status = json.loads(rayaug("status", str(finished), "--json").output)
    assert status["state"] == "done"
    assert status["samples_planned"] == status["samples_committed"] == 32
    result = rayaug("inspect", str(finished), "--verify", "--sheet", str(tmp_path / "sheet.png"))
    assert result.exit_code == 0, result.output
    assert "verify: OK" in result.output and "random_resized_crop" in result.output
    assert Image.open(tmp_path / "sheet.png").size[0] > 0
    report = json.loads(rayaug("inspect", str(finished), "--json").output)
    assert report["ops"]["random_resized_crop"]["applied"] == 32
    assert report["ops"]["horizontal_flip"]["rate"] == pytest.approx(0.5, abs=0.3)
    assert sum(report["labels"].values()) == 32


def test_verify_catches_a_tampered_shard(finished: Path, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(finished, copy)
    data = copy / "data" / "view=0" / "part-00001.parquet"  # by_view: the default with 2 views
    table = pq.read_table(data)
    pq.write_table(table.slice(1), data)  # one image lost after commit
    (copy / "data" / "view=0" / "part-00009.parquet").write_bytes(b"orphan")
    result = rayaug("inspect", str(copy), "--verify")
    assert_one_line_error(
        result,
        1,
        "verify: FAILED",
        "orphan object data/view=0/part-00009.parquet",
        "part-00001: data holds 15 images, manifest 16",
    )


def test_replay_matches_and_writes_the_image(finished: Path, tmp_path: Path) -> None:
    sample = pq.read_table(finished / "manifests" / "part-00000.parquet")["sample_id"][3].as_py()
    result = rayaug("replay", str(finished), sample, "-o", str(tmp_path / "x.jpg"))
    assert result.exit_code == 0, result.output
    assert "identical" in result.output
    assert Image.open(tmp_path / "x.jpg").size == (48, 48)
    assert_one_line_error(rayaug("replay", str(finished), "nope#0"), 2, "no committed sample")


def test_resume_of_something_that_is_not_an_output(tmp_path: Path) -> None:
    assert_one_line_error(rayaug("resume", str(tmp_path)), 2, "is not a rayaug output")


def test_resume_finishes_a_job_from_its_output(finished: Path) -> None:
    result = rayaug("resume", str(finished))
    assert result.exit_code == 0, result.output
    assert "0 this run" in result.output  # everything was committed already


@pytest.mark.slow
def test_run_as_a_subprocess_with_embedded_ray(tmp_path: Path) -> None:
    """What a user types: the installed `rayaug` script, its own local Ray, real photos."""
    from rayaug import sampledata

    sampledata.write_folder(
        list(sampledata.make_photos(6, seed=9, short_side=(64, 96))), tmp_path / "input"
    )
    spec = write_spec(tmp_path / "job.yaml", tmp_path / "input", tmp_path / "out")
    rayaug_bin = Path(sys.executable).parent / "rayaug"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    # A killed rayaug leaves Ray's record of its (dead) cluster behind; the next run must
    # start its own Ray, not hang trying to join that one.
    record = Path("/tmp/ray/ray_current_cluster")
    before = record.read_text() if record.exists() else None
    record.parent.mkdir(exist_ok=True)
    record.write_text("127.0.0.1:9")  # nothing listens there
    try:
        done = subprocess.run(
            [str(rayaug_bin), "run", str(spec), "--json"],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )
    finally:
        if before is None:
            record.unlink(missing_ok=True)
        else:
            record.write_text(before)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["samples"] == 12 and summary["quarantined"] == 0
    assert (tmp_path / "out" / "_SUCCESS").exists()
    # The user reads rayaug's own lines, not Ray's start-up log and deprecation warnings.
    for chatter in ("Started a local Ray instance", "Token authentication", "Warning"):
        assert chatter not in done.stderr
    # A healthy run has no error-level line: neither Python's ("ERROR name: ...") nor one of
    # Ray's C++ components ("[2026-01-02 03:04:05,678 E 123 456] core_worker.cc:...").
    for line in done.stderr.splitlines():
        assert "ERROR" not in line and not RAY_ERROR_PREFIX.search(line), done.stderr


def _session_processes(sid: int) -> list[str]:
    out = subprocess.run(["ps", "-e", "-o", "sid=,stat=,args="], capture_output=True, text=True)
    rows = [line.split(None, 2) for line in out.stdout.splitlines()]
    return [row[2] for row in rows if int(row[0]) == sid and not row[1].startswith("Z")]


@pytest.mark.slow
def test_ctrl_c_keeps_committed_shards_and_says_how_to_resume(tmp_path: Path) -> None:
    """Ctrl-C in a terminal (SIGINT to the whole process group) once a shard is committed:
    one line, exit 130, the embedded Ray gone, and `rayaug resume` finishes the job."""
    import signal
    import time

    from rayaug import sampledata

    sources, views, shard_size = 96, 16, 4
    sampledata.write_folder(
        list(sampledata.make_photos(sources, seed=3, short_side=(64, 96))), tmp_path / "input"
    )
    out = tmp_path / "out"
    # 24 shards of 64 views of 384 px, blurred: about 4 s of work after the first commit here,
    # well beyond the time the driver takes to act on a SIGINT (Ray looks for signals once a
    # second while the driver waits on it). With 24 shards of 4 small views (0.6 s) a loaded
    # CI machine once saw every shard committed before the stop took effect.
    blur = {"name": "gaussian_blur", "kernel_size": 23, "sigma": [1, 2]}
    ops = [{**OPS[0], "size": 384}, *OPS[1:], blur]
    spec = write_spec(
        tmp_path / "job.yaml",
        tmp_path / "input",
        out,
        output={"uri": str(out), "shard_size": shard_size},
        views=views,
        ops=ops,
    )
    rayaug_bin = Path(sys.executable).parent / "rayaug"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    run = subprocess.Popen(
        [str(rayaug_bin), "run", str(spec)],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own group: a terminal's Ctrl-C
        # SIGINT as a terminal leaves it: the tests may run where it is ignored (a background
        # job, nohup), which children inherit, and rayaug rightly keeps ignoring it then
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 120
        while not list((out / "manifests").glob("*.parquet")):
            assert run.poll() is None and time.monotonic() < deadline, run.communicate()
            time.sleep(0.05)
        os.killpg(run.pid, signal.SIGINT)
        stdout, stderr = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    assert run.returncode == 130, stdout + stderr
    assert "Aborted!" not in stderr and "Traceback" not in stderr
    last = stderr.strip().splitlines()[-1]
    committed = len(list((out / "manifests").glob("*.parquet")))
    assert 1 <= committed < sources // shard_size, last
    assert last.startswith("interrupted: ") and f"rayaug resume {out}" in last, stderr
    counted = re.search(r"\((\d+) counted before the stop\)", last)
    assert counted and int(counted.group(1)) <= committed  # a writer may commit as it stops
    deadline = time.monotonic() + 30  # the embedded Ray shut down with the driver
    while _session_processes(run.pid) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _session_processes(run.pid)

    resumed = subprocess.run(
        [str(rayaug_bin), "resume", str(out), "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr
    summary = json.loads(resumed.stdout)
    total = sources * views
    assert summary["samples"] == total and summary["samples_this_run"] < total
    assert (out / "_SUCCESS").exists()


def test_the_console_script_exits_with_what_sys_exit_was_given(capsys) -> None:
    """`rayaug` leaves through os._exit (no teardown of Ray's modules): the status is still
    what the command asked for, and a message passed to sys.exit is printed."""
    assert _exit_code(None) == 0
    assert _exit_code(2) == 2 and _exit_code(130) == 130
    assert _exit_code("stopped: no output") == 1
    assert "stopped: no output" in capsys.readouterr().err
