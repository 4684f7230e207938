"""rayaug.outputs: reading an output whose shards were committed by the real write stage
(`sinks.write_shard`), without Ray: recorded job, tables, images, samples, status."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from test_sinks import VERSIONS, _result

from rayaug import commit, outputs
from rayaug.errors import UsageError
from rayaug.formats import output_format
from rayaug.plan import JobPlan
from rayaug.sampledata import SamplePhoto
from rayaug.sinks import WriteContext, write_shard
from rayaug.sources import WorkUnit
from rayaug.spec import StorageSpec, dump_spec, parse_spec
from rayaug.storage import Location, open_location

SHARDS = ("part-00000", "part-00001")


def committed(tmp_path: Path, photos: list[SamplePhoto], fmt: str) -> Location:
    """Two committed shards of 3 photos (+1 broken source each), 2 views, and the job's
    records: planned 3 shards, so the job is incomplete."""
    out = open_location(str(tmp_path / "out"), StorageSpec(retries=1))
    spec = parse_spec(
        {
            "input": {"uri": str(tmp_path / "in")},
            "output": {"uri": out.uri, "format": fmt},
            "views": 2,
            "ops": [{"name": "horizontal_flip"}],
        }
    )
    out.write_bytes(commit.SPEC, dump_spec(spec).encode())
    units = [WorkUnit(f"part-0000{i}", (f"{i}.jpg",), planned=4) for i in range(3)]
    commit.write_json(out, commit.PLAN, JobPlan("folder", units, 0, "f").to_json())
    commit.write_json(out, commit.FINGERPRINT, {"fingerprint": "f", "versions": VERSIONS})
    context = WriteContext(spec.output, VERSIONS, spec.seed, spec.layout)  # by_view
    for i, shard in enumerate(SHARDS):
        write_shard(out, shard, _result(photos[3 * i : 3 * i + 3]), context)
    return out


@pytest.mark.parametrize("fmt", ["parquet", "webdataset", "lance"])
def test_reads_what_the_write_stage_committed(
    tmp_path: Path, photos: list[SamplePhoto], fmt: str
) -> None:
    out = committed(tmp_path, photos, fmt)
    output = outputs.recorded_output(out)
    assert output.spec.output.format == fmt and len(output.plan.units) == 3
    manifest = outputs.manifests(out)
    assert manifest["shard"].to_pylist() == [SHARDS[0]] * 6 + [SHARDS[1]] * 6
    assert outputs.quarantine(out).num_rows == 4
    commits = outputs.shard_commits(out, set(SHARDS))
    assert [(c.shard, c.samples, c.quarantined) for c in commits] == [
        (SHARDS[0], 6, 2),
        (SHARDS[1], 6, 2),
    ]
    images = outputs.read_images(out, output.spec, SHARDS[1])
    assert sorted(images) == sorted(manifest.slice(6)["sample_id"].to_pylist())
    pairs = list(outputs.samples(output))
    assert [row["sample_id"] for row, _ in pairs] == manifest["sample_id"].to_pylist()
    assert all(hashlib.sha256(data).hexdigest() == row["sha256"] for row, data in pairs)
    row = outputs.find_row(out, pairs[7][0]["sample_id"])
    assert row == pairs[7][0]
    with pytest.raises(UsageError, match="no committed sample"):
        outputs.find_row(out, "nope#0")
    assert outputs.status(output) | {"output": None} == {
        "output": None,
        "state": "incomplete",
        "shards_planned": 3,
        "shards_committed": 2,
        "samples_planned": 24,
        "samples_committed": 12,
        "quarantined": 4,
    }


def test_a_committed_sample_missing_from_its_data_is_an_error(
    tmp_path: Path, photos: list[SamplePhoto]
) -> None:
    out = committed(tmp_path, photos, "parquet")
    output = outputs.recorded_output(out)
    path = tmp_path / "out" / output_format("parquet").data_path(SHARDS[0], view=0)
    pq.write_table(pq.read_table(path).slice(1), path)  # one image lost after its commit
    with pytest.raises(UsageError, match="is committed but missing from its data shard"):
        list(outputs.samples(output))


def test_an_output_without_its_records_is_refused(
    tmp_path: Path, photos: list[SamplePhoto]
) -> None:
    out = committed(tmp_path, photos, "parquet")
    out.delete(commit.PLAN)
    with pytest.raises(UsageError, match="stopped while planning .*`rayaug resume "):
        outputs.recorded_output(out)
    out.delete(commit.SPEC)
    with pytest.raises(UsageError, match="is not a rayaug output"):
        outputs.recorded_output(out)
