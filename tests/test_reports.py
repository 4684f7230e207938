"""`rayaug inspect --query / --stats / --plot` on a real finished job (the session Ray)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pyarrow.dataset as ds
import pytest
from PIL import Image
from test_cli import assert_one_line_error, rayaug, write_spec

OPS = [
    {"name": "rotation", "degrees": 30, "p": 0.7},
    {"name": "horizontal_flip"},
    {"name": "color_jitter", "brightness": 0.3, "saturation": 0.2, "p": 0.8},
    {"name": "resize", "size": 40},
]
SQL_ROTATED = (
    "SELECT count(*) AS rotated FROM applied_ops "
    "WHERE op = 'rotation' AND abs(CAST(params->>'angle' AS DOUBLE)) > 10"
)


@pytest.fixture(scope="module")
def finished(ray_cluster: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """12 photos and one undecodable file, 2 views each: 24 samples, 2 quarantined."""
    from rayaug import sampledata

    root = tmp_path_factory.mktemp("inspect")
    photos = list(sampledata.make_photos(12, seed=7, short_side=(64, 96)))
    sampledata.write_folder(photos, root / "input")
    (root / "input" / photos[0].label / "zz-broken.jpg").write_bytes(b"not a jpeg")
    spec = write_spec(
        root / "job.yaml", root / "input", root / "out", ops=OPS, errors={"max_error_rate": 0.5}
    )
    result = rayaug("run", str(spec))
    assert result.exit_code == 0, result.output
    assert "done: 24 samples in 2 shards, 2 quarantined" in result.output
    return root / "out"


def manifest_rows(out: Path) -> list[dict]:
    return ds.dataset(out / "manifests", format="parquet").to_table().to_pylist()


def rotated_in_python(out: Path, threshold: float = 10) -> int:
    return sum(
        1
        for row in manifest_rows(out)
        for step in json.loads(row["ops"])
        if step["op"] == "rotation" and abs(step["params"]["angle"]) > threshold
    )


def query_json(out: Path | str, sql: str) -> dict:
    result = rayaug("inspect", str(out), "--query", sql, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_query_answers_like_python_over_the_manifest(finished: Path) -> None:
    expected = rotated_in_python(finished)
    assert 0 < expected < 24  # the question has a non-trivial answer
    assert query_json(finished, SQL_ROTATED) == {
        "columns": ["rotated"],
        "rows": [[expected]],
        "truncated": False,
    }
    # The same question straight over the manifest's ops JSON.
    raw = (
        "SELECT count(*) FROM manifest, json_each(ops) AS o WHERE o.value->>'op' = 'rotation' "
        "AND abs(CAST(o.value->'params'->>'angle' AS DOUBLE)) > 10"
    )
    assert query_json(finished, raw)["rows"] == [[expected]]
    # Per label, errors, and the printed table.
    labels = query_json(finished, "SELECT label, count(*) FROM manifest GROUP BY 1 ORDER BY 1")
    in_python = Counter(r["label"] for r in manifest_rows(finished))
    assert {r[0]: r[1] for r in labels["rows"]} == in_python
    errors = query_json(finished, "SELECT sample_id, stage FROM errors ORDER BY 1")
    assert [r[0].split("/")[-1] for r in errors["rows"]] == ["zz-broken.jpg#0", "zz-broken.jpg#1"]
    table = rayaug("inspect", str(finished), "--query", SQL_ROTATED)
    assert table.exit_code == 0 and "rotated" in table.output and str(expected) in table.output
    assert table.output.rstrip().endswith("1 row")
    capped = query_json(finished, "SELECT * FROM applied_ops")
    assert len(capped["rows"]) == sum(len(json.loads(r["ops"])) for r in manifest_rows(finished))
    few = rayaug("inspect", str(finished), "--query", "SELECT * FROM manifest", "--max-rows", "3")
    assert "3 rows (more rows not shown" in few.output


@pytest.mark.s3
def test_query_reads_an_s3_output(finished: Path, s3) -> None:
    import pyarrow.fs as pafs
    from conftest import BUCKET

    pafs.copy_files(str(finished), f"{BUCKET}/inspect-copy", destination_filesystem=s3.filesystem())
    remote = f"s3://{BUCKET}/inspect-copy"
    assert query_json(remote, SQL_ROTATED)["rows"] == [[rotated_in_python(finished)]]


@pytest.mark.parametrize(
    ("sql", "words"),
    [
        ("SELEC 1", ["query failed: Parser Error", "SELEC"]),
        ("SELECT nope FROM manifest", ["query failed: Binder Error", "nope"]),
        ("SELECT * FROM manifests", ["query failed: Catalog Error", "manifests"]),
    ],
)
def test_a_bad_query_is_one_line_and_exit_2(finished: Path, sql: str, words: list[str]) -> None:
    result = rayaug("inspect", str(finished), "--query", sql)
    assert_one_line_error(result, 2, *words)
    assert len(result.output.strip().splitlines()) == 1, result.output


def test_query_does_not_mix_with_the_summary_options(finished: Path) -> None:
    result = rayaug("inspect", str(finished), "--query", "SELECT 1", "--stats")
    assert_one_line_error(result, 2, "--query cannot be combined")


def test_stats_text_json_and_plot(finished: Path, tmp_path: Path) -> None:
    rows = manifest_rows(finished)
    result = rayaug("inspect", str(finished), "--stats", "--plot", str(tmp_path / "stats.png"))
    assert result.exit_code == 0, result.output
    for op in ("rotation", "horizontal_flip", "color_jitter", "resize", "angle", "brightness"):
        assert op in result.output
    for label in {r["label"] for r in rows}:
        assert label in result.output
    assert any(block in result.output for block in "▁▂▃▄▅▆▇█")
    assert f"plot: {tmp_path / 'stats.png'}" in result.output
    with Image.open(tmp_path / "stats.png") as png:
        assert png.format == "PNG" and png.size[0] > 800 and png.size[1] > 400

    stats = json.loads(rayaug("inspect", str(finished), "--stats", "--json").output)["stats"]
    rotated = sum(any(s["op"] == "rotation" for s in json.loads(r["ops"])) for r in rows)
    rotation = stats["ops"]["rotation"]
    assert rotation["applied"] == rotated and rotation["expected_rate"] == 0.7
    assert rotation["rate"] == pytest.approx(rotated / 24, abs=1e-4)
    angle = rotation["params"]["angle"]
    assert sum(angle["counts"]) == rotated and len(angle["counts"]) == 10
    assert -30 <= angle["min"] <= angle["max"] <= 30
    assert stats["ops"]["resize"]["rate"] == 1.0
    balance = {c["label"]: c for c in stats["labels"]["classes"]}
    broken = next((finished.parent / "input").glob("*/zz-broken.jpg")).parent.name
    assert balance[broken]["sources"] * 2 - 2 == balance[broken]["samples"]
    assert balance[broken]["kept"] < 1
    assert sum(c["samples"] for c in balance.values()) == 24
    assert sum(c["sources"] for c in balance.values()) == 13
