"""Faults 6 and 7: hostile and broken inputs, and the error budget.

Fault 6: a corpus generated here (see `hostile.py`) goes through real jobs on the session Ray,
as an image folder, as WebDataset tar shards and as Parquet files. Every input is either
processed correctly (right size, right colours in the right place) or quarantined with the
stage and reason it deserves; no input crashes the job, none is written outside the output
prefix, none is silently dropped: every source appears exactly `views` times among the
manifests and the quarantine, and `reports.summary.verify` finds the output sound.

Fault 7: `errors.max_error_rate` stops a job past it (exit 1, the reasons in the message) and
lets it finish under it (exit 0, the quarantine counted); a rerun with a raised budget resumes
the stopped job from its committed shards and finishes it.
"""

from __future__ import annotations

import io
import json
import os
import re
import tarfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from click.testing import CliRunner
from conftest import RecordingProgress
from PIL import Image

from faults import hostile
from faults.hostile import BLUE, GREEN, RED, WHITE, Expect
from rayaug import commit, outputs
from rayaug.cli import main
from rayaug.job import JobSummary, RunOptions, run_job
from rayaug.reports.summary import verify
from rayaug.spec import JobSpec, StorageSpec, parse_spec
from rayaug.storage import open_location

VIEWS = 2
SHORT_SIDE = 24  # every processed sample: shorter side resized to this, aspect kept
ESCAPES = ("escape.jpg", "escape.txt")  # what a naive tar extraction would create


def make_spec(source: Path, out: Path, **overrides) -> JobSpec:
    data = {
        "input": {"uri": str(source)},
        "output": {"uri": str(out), "shard_size": 5, "image_format": "png"},
        "views": VIEWS,
        "seed": 7,
        "ops": [{"name": "resize", "size": SHORT_SIDE}],
        "execution": {"batch_size": 4, "concurrency": 1},
        "errors": {"max_error_rate": 1.0},
    }
    for key, value in overrides.items():
        data[key] = data[key] | value if isinstance(value, dict) else value
    return parse_spec(data)


def run(spec: JobSpec) -> JobSummary:
    return run_job(spec, RunOptions(), RecordingProgress())


def outcome(out: Path) -> tuple[dict[str, dict], dict[str, dict], dict[str, bytes]]:
    """(manifest rows, quarantine rows, output images), each by sample id; ids never repeat."""
    location = open_location(str(out), StorageSpec())
    output = outputs.recorded_output(location)
    assert verify(output) == []
    rows = outputs.manifests(location).to_pylist()
    errors = outputs.quarantine(location).to_pylist()
    ids = [r["sample_id"] for r in rows + errors]
    assert len(ids) == len(set(ids)), "a sample id appears twice"
    images: dict[str, bytes] = {}
    for shard in sorted(commit.committed_shards(location)):
        images |= outputs.read_images(location, output.spec, shard)
    return {r["sample_id"]: r for r in rows}, {e["sample_id"]: e for e in errors}, images


def resized(size: tuple[int, int]) -> tuple[int, int]:
    """(height, width) after the `resize` op: the shorter side to SHORT_SIDE, aspect kept."""
    h, w = size
    scale = SHORT_SIDE / min(h, w)
    if h <= w:
        return SHORT_SIDE, max(1, round(w * scale))
    return max(1, round(h * scale)), SHORT_SIDE


def region(pixels: np.ndarray, where: str) -> np.ndarray:
    """The whole image, or one corner block (a quarter of each side, off the border pixel)."""
    if where == "all":
        return pixels
    h, w = pixels.shape[:2]
    dh, dw = max(1, h // 4), max(1, w // 4)
    rows = slice(1, 1 + dh) if where.startswith("top") else slice(h - 1 - dh, h - 1)
    cols = slice(1, 1 + dw) if where.endswith("left") else slice(w - 1 - dw, w - 1)
    return pixels[rows, cols]


def assert_processed(key: str, expect: Expect, rows: dict, images: dict, label=None) -> None:
    for view in range(VIEWS):
        sample = f"{key}#{view}"
        assert sample in rows, f"{sample} was not processed"
        row = rows[sample]
        assert (row["source_height"], row["source_width"]) == expect.size, sample
        assert (row["height"], row["width"]) == resized(expect.size), sample
        assert row["label"] == label, sample
        pixels = np.asarray(Image.open(io.BytesIO(images[sample])).convert("RGB"), np.float64)
        assert pixels.shape[:2] == resized(expect.size), sample
        for where, colour in expect.colours.items():
            mean = region(pixels, where).reshape(-1, 3).mean(axis=0)
            assert np.abs(mean - colour).max() < 24, f"{sample} {where}: {mean} != {colour}"


def assert_quarantined(
    key: str, stage: str, words: tuple[str, ...], errors: dict, error_class: str | None = None
) -> None:
    for view in range(VIEWS):
        sample = f"{key}#{view}"
        assert sample in errors, f"{sample} was not quarantined"
        row = errors[sample]
        assert row["stage"] == stage, (sample, row)
        assert row["source_key"] == key and row["view"] == view
        if error_class is not None:
            assert row["error_class"] == error_class, (sample, row)
        for word in words:
            assert word in row["message"], (sample, word, row["message"])
        assert "\n" not in row["message"] and not re.search(r"0x[0-9a-f]{6,}", row["message"])


def assert_accounted(keys: list[str], rows: dict, errors: dict) -> None:
    """Every source, exactly `views` times, in the manifests or the quarantine; nothing else."""
    expected = sorted(f"{key}#{view}" for key in keys for view in range(VIEWS))
    assert sorted([*rows, *errors]) == expected
    assert len(rows) + len(errors) == len(keys) * VIEWS


# ---------------------------------------------------------------- nothing escapes the output


def _names_under(root: Path, depth: int) -> set[Path]:
    found: set[Path] = set()
    for folder, dirs, files in os.walk(root, onerror=lambda error: None):
        if len(Path(folder).relative_to(root).parts) >= depth:
            dirs[:] = []
        found.update(Path(folder) / name for name in files + dirs)
    return found


@pytest.fixture(scope="module")
def worker_cwd(ray_cluster: str) -> Path:
    """Where a Ray worker's relative paths land (a naive extraction of `../../x` goes there)."""
    import ray

    @ray.remote(num_cpus=0)
    def cwd() -> str:
        return os.getcwd()

    return Path(ray.get(cwd.remote(), timeout=120))


@contextmanager
def written_only_under(tmp_path: Path, allowed: list[Path], elsewhere: list[Path]) -> Iterator:
    """Nothing new in tmp_path but under `allowed`; no escaped file near tmp_path, the test's
    and the workers' working directories, or their parents (the paths `../../` reaches)."""
    before = _names_under(tmp_path, depth=12)
    yield
    new = _names_under(tmp_path, depth=12) - before
    stray = sorted(p for p in new if not any(p.is_relative_to(a) for a in allowed))
    assert stray == [], f"written outside the output prefix: {stray}"
    roots: dict[Path, int] = {}  # folder → how deep to look
    for base, depth in [(tmp_path.parent, 4), *((b, 2) for b in elsewhere)]:
        for folder, levels in [(base, depth), *((p, 1) for p in base.parents)]:
            roots[folder] = max(roots.get(folder, 0), levels)
    escaped = sorted(
        p for root, depth in roots.items() for p in _names_under(root, depth) if p.name in ESCAPES
    )
    assert escaped == [], f"a hostile member name escaped: {escaped}"


# ---------------------------------------------------------------- fault 6: an image folder


def test_hostile_files_in_an_image_folder(
    ray_cluster: str, worker_cwd: Path, tmp_path: Path
) -> None:
    corpus = hostile.image_corpus()
    source = tmp_path / "in"
    (source / "hostile").mkdir(parents=True)
    for name, (data, _) in corpus.items():
        (source / "hostile" / name).write_bytes(data)
    (source / "notes.txt").write_text("not an image: listed as ignored, never read")
    outs = [tmp_path / "out", tmp_path / "again"]
    with written_only_under(tmp_path, outs, [worker_cwd, Path.cwd()]):
        summary = run(make_spec(source, outs[0]))
        # The same job, batched otherwise: the quarantine is as reproducible as the samples.
        run(make_spec(source, outs[1], execution={"batch_size": 32}))

    rows, errors, images = outcome(outs[0])
    keys = [f"hostile/{name}" for name in corpus]
    assert_accounted(keys, rows, errors)
    for name, (_, expect) in corpus.items():
        if expect.quarantined:
            assert_quarantined(f"hostile/{name}", expect.stage, expect.words, errors, "DecodeError")
        else:
            assert_processed(f"hostile/{name}", expect, rows, images, label="hostile")
    quarantined = sum(e.quarantined for _, e in corpus.values()) * VIEWS
    assert summary.tally.quarantined == quarantined and summary.ignored_inputs == 1
    success = json.loads((outs[0] / "_SUCCESS").read_text())
    assert success["quarantined"] == quarantined
    assert success["reasons"] == {"decode: DecodeError": quarantined}

    for folder in ("errors", "manifests", "data"):  # data/view=E/ with several views
        first = {p.relative_to(outs[0]): p.read_bytes() for p in (outs[0] / folder).rglob("*.*")}
        second = {p.relative_to(outs[1]): p.read_bytes() for p in (outs[1] / folder).rglob("*.*")}
        assert first == second, f"{folder}/ differs between batch sizes 4 and 32"


# ---------------------------------------------------------------- fault 6: WebDataset shards


def _tar_bytes(members: list[tuple[str, bytes | None]]) -> bytes:
    """Members in order; a None payload makes `name` a symlink to /etc/passwd."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as archive:
        for name, data in members:
            if data is None:
                hostile.add_symlink(archive, name, "/etc/passwd")
            else:
                hostile.add_member(archive, name, data)
    return buffer.getvalue()


def _cut_inside(data: bytes, member: str) -> bytes:
    """The tar cut in the middle of `member`'s data: a shard that broke off mid-download."""
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        info = archive.getmember(member)
    return data[: info.offset_data + info.size // 2]


def test_hostile_webdataset_shards(ray_cluster: str, worker_cwd: Path, tmp_path: Path) -> None:
    source = tmp_path / "deep" / "er" / "in"
    source.mkdir(parents=True)
    size = (32, 48)
    bomb = hostile.bomb_png()
    (source / "hostile.tar").write_bytes(
        _tar_bytes(
            [
                ("good.jpg", hostile.good_jpeg(BLUE)),
                ("good.txt", b"blue"),
                ("../../escape.jpg", hostile.good_jpeg(GREEN)),
                ("../../escape.txt", b"escaped"),
                ("/abs/escape.jpg", hostile.good_jpeg(WHITE)),
                ("a.jpg", hostile.good_jpeg(RED)),
                ("b.jpg", hostile.good_jpeg(GREEN)),
                ("a.jpg", hostile.good_jpeg(BLUE)),  # key `a` again, not adjacent
                ("empty.jpg", b""),
                ("labelonly.txt", b"a label and no image"),
                ("link.jpg", None),
                ("bomb.png", bomb),
            ]
        )
    )
    noise = hostile.noise_jpeg(1)
    whole = _tar_bytes(
        [(f"t{i}.jpg", hostile.good_jpeg(RED) if i != 2 else noise) for i in range(4)]
    )
    (source / "truncated.tar").write_bytes(_cut_inside(whole, "t2.jpg"))
    (source / "garbage.tar").write_bytes(b"this is not a tar archive\n" * 64)

    out = tmp_path / "out"
    with written_only_under(tmp_path, [out], [worker_cwd, Path.cwd()]):
        run(make_spec(source, out, output={"format": "webdataset"}))

    rows, errors, images = outcome(out)
    processed = {
        "hostile.tar/good": (Expect(size, {"all": BLUE}), "blue"),
        "hostile.tar/../../escape": (Expect(size, {"all": GREEN}), "escaped"),
        "hostile.tar//abs/escape": (Expect(size, {"all": WHITE}), None),
        "hostile.tar/a": (Expect(size, {"all": RED}), None),
        "hostile.tar/b": (Expect(size, {"all": GREEN}), None),
        "truncated.tar/t0": (Expect(size, {"all": RED}), None),
        "truncated.tar/t1": (Expect(size, {"all": RED}), None),
    }
    quarantined = {
        "hostile.tar/a~dup1": ("read", ("duplicate source key 'hostile.tar/a' (copy 2)",)),
        "hostile.tar/empty": ("decode", ("empty input (0 bytes)",)),
        "hostile.tar/labelonly": ("read", ("no image member (found: txt)",)),
        "hostile.tar/link": (
            "read",
            ("tar member 'link.jpg' is a symbolic link (to '/etc/passwd'), not a file",),
        ),
        "hostile.tar/bomb": ("decode", ("exceeds max_pixels=100000000",)),
        # The member being read when the shard broke off; what followed it is unknowable.
        "truncated.tar/t2": ("read", ("unreadable tar shard truncated.tar: unexpected end",)),
        "garbage.tar": ("read", ("unreadable tar shard garbage.tar", "invalid header")),
    }
    assert_accounted([*processed, *quarantined], rows, errors)
    for key, (expect, label) in processed.items():
        assert_processed(key, expect, rows, images, label)
    for key, (stage, words) in quarantined.items():
        assert_quarantined(key, stage, words, errors)

    # The output tars name their members by shard and index, never by a source key.
    names = []
    for tar in (out / "data").rglob("*.tar"):  # data/view=E/ with several views
        with tarfile.open(tar) as archive:
            names += archive.getnames()
    assert len(names) == 2 * len(rows)  # image + json each; a label lives in the json
    assert all(re.fullmatch(r"part-\d{5}-\d{6}\.(png|json)", name) for name in names)


# ---------------------------------------------------------------- fault 6: Parquet rows


def test_hostile_parquet_rows_and_duplicate_keys_across_units(
    ray_cluster: str, tmp_path: Path
) -> None:
    source = tmp_path / "in"
    source.mkdir()
    red, green = hostile.good_jpeg(RED), hostile.good_jpeg(GREEN)
    text = b"GIF89a? no: plain text in an image column"
    pq.write_table(
        pa.table(
            {
                "id": ["k0", "kx", "k0", "ky", "kn", "kx", "kt"],
                "image": pa.array(
                    [red, hostile.cmyk_jpeg(), green, green, None, red, text], pa.binary()
                ),
                "label": ["a", "b", "c", "d", "e", "f", "g"],
            }
        ),
        source / "a.parquet",
        row_group_size=3,
    )
    pq.write_table(
        pa.table(
            {
                "id": ["kz", "ky", None, "k0"],
                "image": pa.array([green, red, red, green], pa.binary()),
                "label": ["h", "i", "j", "k"],
            }
        ),
        source / "b.parquet",
    )
    out = tmp_path / "out"
    # shard_size 4: a.parquet is two units (rows 0-3, 4-6), b.parquet a third.
    spec = make_spec(source, out, input={"key_column": "id"}, output={"shard_size": 4})
    with written_only_under(tmp_path, [out], []):
        run(spec)

    rows, errors, images = outcome(out)
    size = (32, 48)
    processed = {
        "k0": (Expect(size, {"all": RED}), "a"),
        "kx": (Expect(size, {"all": (0, 255, 255)}), "b"),  # the CMYK JPEG
        "ky": (Expect(size, {"all": GREEN}), "d"),
        "kz": (Expect(size, {"all": GREEN}), "h"),
        "b.parquet:2": (Expect(size, {"all": RED}), "j"),  # a null key: file and row instead
    }
    dup = "duplicate source key {!r} (copy {}; the first is row {} of a.parquet)".format
    quarantined = {
        "k0~dup1": ("read", (dup("k0", 2, 0),)),  # within one unit
        "kx~dup1": ("read", (dup("kx", 2, 1),)),  # across two units of one file
        "ky~dup1": ("read", (dup("ky", 2, 3),)),  # across two files
        "k0~dup2": ("read", (dup("k0", 3, 0),)),  # a third copy, in the other file
        "kn": ("read", ("null image in column 'image'",)),
        "kt": ("decode", ("not a readable image",)),
    }
    assert_accounted([*processed, *quarantined], rows, errors)
    for key, (expect, label) in processed.items():
        assert_processed(key, expect, rows, images, label)
    for key, (stage, words) in quarantined.items():
        assert_quarantined(key, stage, words, errors)

    # The plan records the duplicates (JSON in _job/plan.json) and reads them back intact.
    plan = outputs.recorded_output(open_location(str(out), StorageSpec())).plan
    assert [u.duplicates for u in plan.units] == [
        ((2, 2, "a.parquet", 0),),
        ((1, 2, "a.parquet", 1),),
        ((1, 2, "a.parquet", 3), (3, 3, "a.parquet", 0)),
    ]
    # A rerun resumes nothing and changes nothing.
    assert run(spec).tally.new_samples == 0
    assert outcome(out)[:2] == (rows, errors)


def test_a_corrupt_parquet_page_quarantines_its_row_group_and_counts_in_the_budget(
    ray_cluster: str, tmp_path: Path
) -> None:
    """A real file, footer intact, one data page overwritten: that row group's rows are
    quarantined (stage read), the unit's other rows are written, the budget counts them."""
    from test_sources import corrupt_one_page

    source = tmp_path / "in"
    source.mkdir()
    colours = [RED, GREEN, BLUE] * 4
    pq.write_table(
        pa.table(
            {
                "id": [f"r{i:02d}" for i in range(12)],
                "image": pa.array([hostile.good_jpeg(c) for c in colours], pa.binary()),
            }
        ),
        source / "a.parquet",
        row_group_size=4,
        use_dictionary=False,
    )
    corrupt_one_page(source / "a.parquet", group=1, column=1)
    out = tmp_path / "out"
    spec = make_spec(source, out, input={"key_column": "id"}, output={"shard_size": 6})
    summary = run(spec)
    assert summary.tally.quarantined == 4 * VIEWS  # counted, as any quarantined sample is
    rows, errors, images = outcome(out)
    bad = [f"r{i:02d}" for i in range(4, 8)]
    good = [f"r{i:02d}" for i in range(12) if f"r{i:02d}" not in bad]
    assert_accounted([*good, *bad], rows, errors)
    for key in bad:
        assert_quarantined(key, "read", ("unreadable Parquet row group 1 (rows 4-7)",), errors)
    # Over budget: the same input stops the job, naming the reason.
    strict = make_spec(
        source,
        tmp_path / "strict",
        input={"key_column": "id"},
        output={"shard_size": 6},
        errors={"max_error_rate": 0.1},
    )
    with pytest.raises(Exception, match="error budget exceeded"):
        run(strict)


# ---------------------------------------------------------------- fault 7: the error budget


def _budget_input(root: Path) -> tuple[Path, int, int]:
    """20 good photos and 5 broken files; the broken ones sort first (one shard of five)."""
    for i in range(20):
        path = root / "good" / f"{i:03d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(hostile.jpeg(hostile.solid((10 * i, 100, 200))))
    broken = {
        "0-zero.jpg": b"",
        "1-text.jpg": b"plain text",
        "2-cut.jpg": hostile.truncated_jpeg(),
        "3-bomb.png": hostile.bomb_png(),
        "4-text.png": b"more text",
    }
    for name, data in broken.items():
        path = root / "bad" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root, 20, len(broken)


def _cli(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def test_error_budget_stops_the_job_and_a_raised_budget_resumes_it(
    ray_cluster: str, tmp_path: Path
) -> None:
    source, good, bad = _budget_input(tmp_path / "in")
    out = tmp_path / "out"
    data = {
        "input": {"uri": str(source)},
        "output": {"uri": str(out), "shard_size": 5},
        "views": 1,
        "ops": [{"name": "resize", "size": 16}],
        "execution": {"batch_size": 8, "concurrency": 1},
        "errors": {"max_error_rate": 0.1},  # 5 of 25 is 20%
    }
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(data))

    over = _cli("run", str(job))
    assert over.exit_code == 1, over.output
    assert "Traceback" not in over.output
    (line,) = _error_lines(over.stderr)
    # Shards mix their sources (drawn by the seed): the bad files spread over several shards,
    # and the job stops at the first count over 10 % of 25.
    stopped = re.search(r"error budget exceeded: (\d) of 25 samples quarantined", line)
    assert stopped and int(stopped.group(1)) >= 3 and "(max_error_rate 0.1)" in line
    assert f"decode: DecodeError ×{stopped.group(1)}" in line  # the reasons, counted
    assert "errors.max_error_rate" in line and f"rayaug inspect {out}" in line
    assert not (out / "_SUCCESS").exists() and not (out / "_job" / "lock").exists()
    status = json.loads(_cli("status", str(out), "--json").stdout)
    assert status["state"] == "incomplete" and status["quarantined"] >= int(stopped.group(1))
    manifests = out / "manifests"
    kept = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in manifests.iterdir()}
    assert kept  # the shards committed before the stop are kept...

    data["errors"]["max_error_rate"] = 0.25  # a run setting: the same job, resumed
    job.write_text(yaml.safe_dump(data))
    under = _cli("run", str(job), "--json")
    assert under.exit_code == 0, under.output
    summary = json.loads(under.stdout)
    assert summary["samples"] == good and summary["quarantined"] == bad
    assert summary["samples_this_run"] <= good + bad - 5 * len(kept)  # shards of 5 sources
    for name, stamp in kept.items():  # ...and not redone (a rewrite is a new file)
        path = manifests / name
        assert (path.stat().st_ino, path.stat().st_mtime_ns) == stamp, name
    assert summary["reasons"] == {"decode: DecodeError": bad}
    success = json.loads((out / "_SUCCESS").read_text())
    assert success["quarantined"] == bad and success["samples"] == good
    verify = _cli("inspect", str(out), "--verify")
    assert verify.exit_code == 0 and "verify: OK" in verify.stdout
    assert "quarantined ×1: decode: empty input (0 bytes)" in verify.stdout
