"""`rayaug diff OUT_A OUT_B` on real outputs (the session Ray): exit 0 identical, 1 different."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_cli import assert_one_line_error, rayaug, write_spec

from rayaug.diff import spec_changes


@pytest.fixture(scope="module")
def outputs(ray_cluster: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """a: 10 photos, seed 5; same: a again with another batch size; seed6; fewer: 6 photos."""
    from rayaug import sampledata

    root = tmp_path_factory.mktemp("diff")
    photos = list(sampledata.make_photos(10, seed=3, short_side=(64, 96)))
    sampledata.write_folder(photos, root / "input")
    sampledata.write_folder(photos[:6], root / "fewer-input")
    runs = {
        "a": ("input", {}),
        "same": ("input", {"execution": {"batch_size": 3, "concurrency": 1}}),
        "seed6": ("input", {"seed": 6}),
        "fewer": ("fewer-input", {}),
    }
    for name, (source, extra) in runs.items():
        spec = write_spec(root / f"{name}.yaml", root / source, root / name, **extra)
        result = rayaug("run", str(spec))
        assert result.exit_code == 0, result.output
    return {name: root / name for name in runs}


def diff_json(a: Path, b: Path, *options: str) -> tuple[int, dict]:
    result = rayaug("diff", str(a), str(b), "--json", *options)
    return result.exit_code, json.loads(result.output)


def test_an_output_is_identical_to_itself(outputs: dict[str, Path]) -> None:
    result = rayaug("diff", str(outputs["a"]), str(outputs["a"]))
    assert result.exit_code == 0, result.output
    assert "IDENTICAL" in result.output and "spec: no differences" in result.output


def test_a_rerun_elsewhere_with_other_run_settings_is_identical(outputs: dict[str, Path]) -> None:
    code, report = diff_json(outputs["a"], outputs["same"])
    assert code == 0 and report["identical"], report
    assert report["in_both"] == 20
    # Listed, but neither the location nor how it ran changes what was written.
    paths = {c["path"]: c for c in report["spec"]}
    assert paths["execution.batch_size"] == {
        "path": "execution.batch_size",
        "a": 16,
        "b": 3,
        "kind": "setting",
        "affects_output": False,
    }
    assert "output.uri" not in paths


def test_another_seed_differs_in_spec_parameters_and_bytes(outputs: dict[str, Path]) -> None:
    code, report = diff_json(outputs["a"], outputs["seed6"], "--limit", "2")
    assert code == 1 and not report["identical"]
    assert report["spec"] == [
        {"path": "seed", "a": 5, "b": 6, "kind": "recipe", "affects_output": True}
    ]
    assert report["only_in_a"]["count"] == report["only_in_b"]["count"] == 0
    assert report["params_differ"]["count"] == 20  # random_resized_crop redraws every box
    assert 0 < report["bytes_differ"]["count"] <= 20
    assert len(report["params_differ"]["examples"]) == 2
    text = rayaug("diff", str(outputs["a"]), str(outputs["seed6"]), "--limit", "1")
    assert text.exit_code == 1
    assert "seed: 5 → 6" in text.output and "parameters differ: 20" in text.output
    assert "… 19 more" in text.output and "DIFFERENT" in text.output


def test_fewer_inputs_show_samples_only_in_one_side(outputs: dict[str, Path]) -> None:
    code, report = diff_json(outputs["a"], outputs["fewer"], "--limit", "100")
    assert code == 1
    assert [c["path"] for c in report["spec"]] == ["input.uri"]
    assert report["only_in_a"]["count"] == 8 and report["only_in_b"]["count"] == 0
    assert report["in_both"] == 12
    assert report["params_differ"]["count"] == report["bytes_differ"]["count"] == 0
    kept = {s.rsplit("#", 1)[0] for s in report["only_in_a"]["examples"]}
    fewer = {
        p.relative_to(outputs["fewer"].parent / "fewer-input").as_posix()
        for p in (outputs["fewer"].parent / "fewer-input").rglob("*.jpg")
    }
    assert len(kept) == 4 and not kept & fewer
    code, reverse = diff_json(outputs["fewer"], outputs["a"])
    assert code == 1 and reverse["only_in_b"]["count"] == 8


def test_diff_of_something_that_is_not_an_output(outputs: dict[str, Path], tmp_path: Path) -> None:
    assert_one_line_error(
        rayaug("diff", str(outputs["a"]), str(tmp_path)), 2, "is not a rayaug output"
    )


def test_spec_changes_name_the_field_path() -> None:
    a = {
        "name": "x",
        "seed": 1,
        "output": {"uri": "a", "size": None},
        "ops": [{"name": "rotation", "degrees": 10}, {"name": "horizontal_flip", "p": 0.5}],
    }
    b = {
        "name": "x",
        "seed": 1,
        "output": {"uri": "b", "size": [32, 32]},
        "ops": [
            {"name": "rotation", "degrees": 12},
            {"name": "vertical_flip", "p": 0.5},
            {"name": "grayscale"},
        ],
    }
    changes = [(c.path, c.to_json().get("a"), c.to_json().get("b")) for c in spec_changes(a, b)]
    assert changes == [
        ("output.size", None, [32, 32]),
        ("ops[0].degrees", 10, 12),
        ("ops[1]", {"name": "horizontal_flip", "p": 0.5}, {"name": "vertical_flip", "p": 0.5}),
        ("ops[2]", None, {"name": "grayscale"}),
    ]
