"""rayaug.changes: what differs between a recorded job and a new one, named with both values."""

from __future__ import annotations

from rayaug.changes import JobRecord, job_changes

VERSIONS = {"rayaug": "0.4.0", "kornia": "0.9.0"}
SPEC = {"seed": 5, "views": 2, "ops": [{"name": "rotation", "degrees": [-10.0, 10.0], "p": 1.0}]}
FILES = {"cat/1.jpg": 100, "cat/2.jpg": 200, "dog/1.jpg": 300}


def test_the_same_job_has_no_changes() -> None:
    found = job_changes(JobRecord(SPEC, FILES, VERSIONS), JobRecord(SPEC, dict(FILES), VERSIONS))
    assert found.none and found.lines() == []


def test_every_kind_of_change_is_named_with_the_recorded_and_the_new_value() -> None:
    spec = SPEC | {"seed": 6, "ops": [{"name": "rotation", "degrees": [-5.0, 5.0], "p": 1.0}]}
    files = {"cat/1.jpg": 100, "cat/2.jpg": 250, "dog/2.jpg": 1, "dog/3.jpg": 2}
    found = job_changes(
        JobRecord(SPEC, FILES, VERSIONS),
        JobRecord(spec, files, VERSIONS | {"kornia": "0.9.1"}),
    )
    assert not found.none
    assert (found.added, found.gone, found.resized) == (["dog/2.jpg", "dog/3.jpg"], ["dog/1.jpg"],
                                                        ["cat/2.jpg"])
    assert found.lines() == [
        "seed 5 recorded, 6 now",
        "ops[0].degrees [-10.0, 10.0] recorded, [-5.0, 5.0] now",
        "input listing: 2 files added (dog/2.jpg, dog/3.jpg), 1 file gone (dog/1.jpg), "
        "1 file changed in size (cat/2.jpg)",
        "kornia 0.9.0 recorded, 0.9.1 now",
    ]


def test_a_record_without_sizes_compares_paths_only() -> None:
    """Records of an older rayaug kept the files' paths (in the plan), not their sizes."""
    unsized = {path: None for path in FILES}
    found = job_changes(JobRecord(SPEC, unsized, VERSIONS), JobRecord(SPEC, FILES, VERSIONS))
    assert found.none


def test_many_changes_are_counted_beyond_the_first_few() -> None:
    spec = SPEC | {"seed": 1, "views": 3, "ops": [], "name": "x"}
    files = {f"new/{i}.jpg": i for i in range(5)}
    found = job_changes(JobRecord(SPEC, {}, VERSIONS), JobRecord(spec, files, VERSIONS))
    assert found.lines() == [
        "seed 5 recorded, 1 now",
        "views 2 recorded, 3 now",
        'ops [{"name": "rotation", "degrees": [-10.0, 10.0], "p": 1.0}] recorded, [] now',
        "1 more spec field",
        "input listing: 5 files added (new/0.jpg, new/1.jpg, new/2.jpg, …)",
    ]
