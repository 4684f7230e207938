"""The plan: a run's work units, with its first and last shards small."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import RecordingProgress

from rayaug import api, outputs, plan
from rayaug.job import RunOptions, run_job
from rayaug.reports.summary import verify
from rayaug.spec import JobSpec, StorageSpec, parse_spec
from rayaug.storage import open_location


def spec_of(source: Path, out: Path, views: int, shard_size: int) -> JobSpec:
    return parse_spec(
        {
            "input": {"uri": str(source)},
            "output": {"uri": str(out), "shard_size": shard_size},
            "views": views,
            "ops": [{"name": "random_resized_crop", "size": 32}, {"name": "horizontal_flip"}],
            "execution": {"batch_size": 8},
        }
    )


def units_of(spec: JobSpec) -> list[plan.WorkUnit]:
    units, _ = plan.make_plan(spec, open_location(spec.input.uri, spec.storage))
    return units.units


def test_the_first_and_last_shards_of_a_many_view_job_are_split(tmp_path: Path) -> None:
    """At eight views the first shard of 256 sources is 2,048 samples, which the first commit
    would wait for: the plan cuts four shards of a sixteenth (16 sources) from its start, and
    four from the end of the last. At one view a sixteenth would be under 64 samples: the
    parts are 64 sources, or equal parts where what is left would be smaller."""
    folder = tmp_path / "in"
    folder.mkdir()
    for number in range(700):  # planning lists the files; it reads none
        (folder / f"{number:04d}.jpg").write_bytes(b"listed only")
    eight = units_of(spec_of(folder, tmp_path / "out", views=8, shard_size=256))
    one = units_of(spec_of(folder, tmp_path / "out", views=1, shard_size=256))

    assert [u.planned for u in eight] == [16, 16, 16, 16, 192, 256, 140, 12, 12, 12, 12]
    assert [u.planned for u in one] == [64, 64, 64, 64, 256, 94, 94]
    assert [u.shard for u in eight] == [f"part-{i:05d}" for i in range(11)]
    # the same sources, in the same order, each once: only the shards' borders moved
    assert [f for u in eight for f in u.files] == [f for u in one for f in u.files]
    assert all(u.views == (0, 8) for u in eight)


def test_a_shard_of_few_samples_stays_whole(tmp_path: Path) -> None:
    """Parts are at least END_PART_SAMPLES samples: 12 sources × 8 views are 96, too few for
    two parts."""
    folder = tmp_path / "in"
    folder.mkdir()
    for number in range(30):
        (folder / f"{number:02d}.jpg").write_bytes(b"listed only")
    units = units_of(spec_of(folder, tmp_path / "out", views=8, shard_size=12))
    assert [u.planned for u in units] == [12, 12, 6]


def test_a_growths_new_sources_get_small_ends_too(tmp_path: Path) -> None:
    """New sources added to a recorded job are planned as a first run's are: small shards at
    both ends of what is added; the recorded units stay as recorded."""
    folder, out = tmp_path / "in", tmp_path / "out"
    folder.mkdir()
    for number in range(100):
        (folder / f"a{number:03d}.jpg").write_bytes(b"listed only")
    spec = spec_of(folder, out, views=8, shard_size=256)
    source, target = (open_location(uri, spec.storage) for uri in (str(folder), str(out)))
    first = plan.prepare(spec, source, target)
    assert [u.planned for u in first.units] == [8, 8, 8, 8, 68]
    for number in range(300):
        (folder / f"b{number:03d}.jpg").write_bytes(b"listed only")

    grown = plan.prepare(spec, source, target)
    added = grown.units[len(first.units) :]
    assert grown.units[: len(first.units)] == first.units
    assert [u.planned for u in added] == [16, 16, 16, 16, 192, 12, 8, 8, 8, 8]
    assert [u.shard for u in added] == [f"g1-part-{i:05d}" for i in range(10)]


def test_split_shards_hold_the_same_samples_as_whole_ones(
    ray_cluster: str, photo_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where a shard ends moves no sample: a job whose first and last shards are split (parts
    of 4 samples here) commits every sample of the job with whole shards, byte for byte."""
    whole, split = tmp_path / "whole", tmp_path / "split"
    monkeypatch.setattr(plan, "END_PART_SAMPLES", 1 << 30)
    run_job(spec_of(photo_folder, whole, views=2, shard_size=8), RunOptions(), RecordingProgress())
    monkeypatch.setattr(plan, "END_PART_SAMPLES", 4)
    run_job(spec_of(photo_folder, split, views=2, shard_size=8), RunOptions(), RecordingProgress())

    recorded = [
        outputs.recorded_output(open_location(str(p), StorageSpec())) for p in (whole, split)
    ]
    shards = [len(out.plan.units) for out in recorded]
    assert shards == [3, 9]  # 24 photos: 8 | 8 | 8, then 2+2+2+2 | 8 | 2+2+2+2
    rows = [
        sorted(
            (r["sample_id"], r["sha256"], r["ops"])
            for r in outputs.manifests(out.location).to_pylist()
        )
        for out in recorded
    ]
    assert rows[0] == rows[1] and len(rows[0]) == 48
    assert verify(recorded[1]) == []
    # the training reader serves each epoch's view from the split shards as from whole ones
    served = [
        sorted(
            item["sample_id"]
            for item in api.open_output(p).epoch(1, columns=("sample_id",), decode=False)
        )
        for p in (whole, split)
    ]
    assert served[0] == served[1] and len(served[0]) == 24
