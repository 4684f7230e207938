"""rayaug.spec: the example jobs validate; mistakes are reported by path with the file name;
the fingerprint covers exactly what decides the output."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from rayaug.errors import SpecError, UsageError
from rayaug.ops import (
    Affine,
    CenterCrop,
    GaussianBlur,
    RandomResizedCrop,
    Resize,
    Rotation,
    Solarize,
    draw_ops,
)
from rayaug.spec import JobSpec, dump_spec, fingerprint, load_spec, parse_spec

JOBS = sorted((Path(__file__).resolve().parent.parent / "jobs").glob("*.yaml"))

BASE: dict = {
    "version": 1,
    "name": "unit",
    "input": {"uri": "data/in"},
    "output": {"uri": "data/out"},
    "views": 2,
    "seed": 11,
    "ops": [
        {"name": "random_resized_crop", "size": 64},
        {"name": "horizontal_flip", "p": 0.5},
        {"name": "rotation", "degrees": 15, "p": 0.5},
        {"name": "gaussian_blur", "kernel_size": 5, "sigma": [0.1, 1.5], "p": 0.2},
    ],
}
LISTING = ["cat/001.jpg:1234", "dog/002.jpg:5678"]
VERSIONS = {"rayaug": "0.1.0", "kornia": "0.9.0", "torch": "2.13.0", "pillow": "13.0.0"}


def _spec(**changes) -> dict:
    data = copy.deepcopy(BASE)
    data.update(changes)
    return data


def _write(tmp_path: Path, data: object, name: str = "job.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _errors(tmp_path: Path, data: object) -> SpecError:
    path = _write(tmp_path, data)
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    error = caught.value
    assert error.source == str(path)
    assert str(error).startswith(f"{path}: ")  # the one line the CLI prints names the file
    assert isinstance(error, UsageError) and error.exit_code == 2
    return error


# ---------------------------------------------------------------- the example jobs


def test_the_example_jobs_are_there() -> None:
    assert {p.name for p in JOBS} >= {"demo.yaml", "imagenet.yaml", "s3-to-s3.yaml"}


@pytest.mark.parametrize("path", JOBS, ids=lambda p: p.name)
def test_example_job_validates_and_round_trips(path: Path) -> None:
    spec = load_spec(path)
    raw = yaml.safe_load(path.read_text())
    assert spec.name == raw["name"] and spec.seed == raw["seed"]
    assert [op.name for op in spec.ops] == [op["name"] for op in raw["ops"]]
    # `_job/spec.yaml` is read back on resume: it must give the same job, same fingerprint.
    again = parse_spec(yaml.safe_load(dump_spec(spec)), "spec.yaml")
    assert again == spec
    assert fingerprint(again, LISTING, VERSIONS) == fingerprint(spec, LISTING, VERSIONS)


def test_defaults_are_filled_in() -> None:
    spec = parse_spec({"input": {"uri": "in"}, "output": {"uri": "out"}, "ops": [BASE["ops"][1]]})
    assert spec.version == 1 and spec.views == 1 and spec.seed == 0
    assert spec.output.format == "parquet" and spec.output.image_format == "jpeg"
    assert spec.output.quality == 90 and spec.output.size is None
    assert spec.execution.batch_size == 32 and spec.execution.concurrency == "auto"
    assert spec.errors.max_pixels == 100_000_000


# ---------------------------------------------------------------- errors by path


def _with(path: tuple, value: object) -> dict:
    data = copy.deepcopy(BASE)
    node = data
    for key in path[:-1]:
        node = node.setdefault(key, {}) if isinstance(key, str) else node[key]
    node[path[-1]] = value
    return data


BAD_FIELDS = [
    pytest.param(("ops", 2, "degrees"), -15, "ops[2].degrees: must be ≥ 0", id="negative-degrees"),
    pytest.param(
        ("ops", 2, "degrees"),
        [10, -10],
        "ops[2].degrees: range must be [low, high] with low ≤ high",
        id="range-order",
    ),
    pytest.param(
        ("ops", 3, "sigma"),
        [2.0, 0.5],
        "ops[3].sigma: range must be [low, high] with low ≤ high",
        id="sigma-order",
    ),
    pytest.param(("ops", 3, "kernel_size"), 4, "ops[3].kernel_size: must be odd", id="even-kernel"),
    pytest.param(("ops", 0, "size"), [0, 64], "ops[0].size: sizes must be ≥ 1", id="op-size"),
    pytest.param(("output", "size"), 0, "output.size: must be positive", id="output-size"),
    pytest.param(("output", "size"), [256, -1], "output.size: must be positive", id="output-size2"),
    pytest.param(("ops", 1, "p"), 1.5, "ops[1].p: ", id="probability"),
    pytest.param(
        ("ops", 2, "degreez"),
        15,
        "ops[2].degreez: unknown field; did you mean 'degrees'?",
        id="unknown-op-field",
    ),
    pytest.param(("output", "quality"), 0, "output.quality: ", id="quality"),
    pytest.param(("views",), 0, "views: ", id="views"),
    pytest.param(("execution", "batch_size"), 0, "execution.batch_size: ", id="batch-size"),
    pytest.param(("storage", "request_timeout"), 0, "storage.request_timeout: ", id="deadline"),
    pytest.param(("storage", "connect_timeout"), -1, "storage.connect_timeout: ", id="connect"),
    pytest.param(
        ("tranforms",), [], "tranforms: unknown field; known here: errors, ", id="top-level"
    ),
    pytest.param(
        ("input", "format"),
        "tfrecord",
        "input.format: unknown format 'tfrecord'; use one of: auto, parquet, webdataset, folder",
        id="input-format",
    ),
    pytest.param(
        ("output", "format"),
        "tar",
        "output.format: unknown format 'tar'; use one of: parquet, webdataset, lance",
        id="output-format",
    ),
]


@pytest.mark.parametrize(("path", "value", "expected"), BAD_FIELDS)
def test_a_wrong_field_is_reported_by_its_path(
    tmp_path: Path, path: tuple, value: object, expected: str
) -> None:
    data = _with(path, value) if len(path) > 1 else _spec(**{path[0]: value})
    messages = _errors(tmp_path, data).messages
    assert any(m.startswith(expected) for m in messages), messages
    assert len(messages) == 1 or path == ("ops", 2, "degreez"), messages


def test_unknown_op_name_is_reported_at_its_index(tmp_path: Path) -> None:
    data = _with(("ops", 1), {"name": "horizontal_flipp", "p": 0.5})
    messages = _errors(tmp_path, data).messages
    assert len(messages) == 1
    assert messages[0].startswith("ops[1]: ") and "'horizontal_flipp'" in messages[0]
    assert "'horizontal_flip'" in messages[0]  # the valid names are listed


def test_a_mix_on_an_input_without_random_access_is_refused(tmp_path: Path) -> None:
    data = _spec(input={"uri": "data/in", "format": "webdataset"})
    data["ops"].append({"name": "mixup"})
    messages = _errors(tmp_path, data).messages
    assert messages == [
        "<root>: ops[4]: mixup picks partners from all sources, which needs random access; "
        "webdataset input is read in sequence (use parquet or folder input)"
    ]
    data["input"]["format"] = "auto"  # judged once the input is listed (rayaug.plan)
    assert parse_spec(data).mixes


def test_missing_input_uri(tmp_path: Path) -> None:
    messages = _errors(tmp_path, _spec(input={"format": "folder"})).messages
    assert messages == ["input.uri: Field required"]


def test_every_mistake_is_reported_at_once(tmp_path: Path) -> None:
    data = _with(("ops", 2, "degrees"), -1)
    data["ops"][3]["kernel_size"] = 6
    data["output"]["size"] = 0
    messages = _errors(tmp_path, data).messages
    assert sorted(m.split(":")[0] for m in messages) == [
        "ops[2].degrees",
        "ops[3].kernel_size",
        "output.size",
    ]


@pytest.mark.parametrize("text", ["- a\n- b\n", "just a string\n", "", "42\n"])
def test_a_yaml_that_is_not_a_mapping(tmp_path: Path, text: str) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    assert caught.value.source == str(path)
    assert caught.value.messages == ["<root>: a job spec is a YAML mapping"]


def test_an_unreadable_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(SpecError) as caught:
        load_spec(missing)
    assert caught.value.source == str(missing)
    assert caught.value.messages == ["cannot read: No such file or directory"]
    with pytest.raises(SpecError, match="cannot read"):
        load_spec(tmp_path)  # a directory


def test_invalid_yaml(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("input: {uri: in\nops: [\n")
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    assert caught.value.source == str(path)
    assert len(caught.value.messages) == 1
    assert caught.value.messages[0].startswith("not valid YAML: ")
    assert "line" in caught.value.messages[0]  # where it went wrong


def test_parse_spec_names_its_source() -> None:
    with pytest.raises(SpecError) as caught:
        parse_spec(_with(("ops", 2, "degrees"), -1), "from-api")
    assert str(caught.value) == "from-api: ops[2].degrees: must be ≥ 0"


# ---------------------------------------------------------------- scalars and pipeline


def test_scalars_expand_to_ranges() -> None:
    spec = parse_spec(
        _spec(
            ops=[
                {"name": "rotation", "degrees": 15},
                {"name": "affine", "degrees": 10, "shear": 5, "scale": [0.9, 1.1]},
                {"name": "solarize", "threshold": 0.7},
                {"name": "random_resized_crop", "size": 224},
                {"name": "center_crop", "size": 100},
                {"name": "resize", "size": 256},
            ],
            output={"uri": "out", "size": 128},
        )
    )
    rotation, affine, solarize, rrc, crop, resize = spec.ops
    assert isinstance(rotation, Rotation) and rotation.degrees == (-15.0, 15.0)
    assert isinstance(affine, Affine)
    assert affine.degrees == (-10.0, 10.0) and affine.shear == (-5.0, 5.0)
    assert isinstance(solarize, Solarize) and solarize.threshold == (0.7, 0.7)
    assert isinstance(rrc, RandomResizedCrop) and rrc.size == (224, 224)
    assert isinstance(crop, CenterCrop) and crop.size == (100, 100)
    assert isinstance(resize, Resize) and resize.size == 256  # one number: the shorter side
    assert spec.output.size == (128, 128)


def test_output_size_appends_a_resize_to_the_pipeline() -> None:
    plain = parse_spec(_spec())
    assert plain.pipeline() == list(plain.ops)
    sized = parse_spec(_spec(output={"uri": "out", "size": [96, 128]}))
    pipeline = sized.pipeline()
    assert pipeline[:-1] == list(sized.ops) and len(sized.ops) == len(BASE["ops"])
    assert pipeline[-1] == Resize(size=(96, 128))
    # Every sample ends at that size, whatever the random crop did.
    for seed in range(5):
        applied = draw_ops(pipeline, seed, (300, 451))
        assert applied[-1].name == "resize" and applied[-1].params == {"size": [96, 128]}


def test_ops_keep_their_order_and_type() -> None:
    spec = parse_spec(_spec())
    assert [type(op) for op in spec.ops][::3] == [RandomResizedCrop, GaussianBlur]
    assert [op.p for op in spec.ops] == [1.0, 0.5, 0.5, 0.2]


# ---------------------------------------------------------------- fingerprint


def _fingerprint(data: dict, listing=LISTING, versions=VERSIONS) -> str:
    return fingerprint(parse_spec(data), list(listing), dict(versions))


def test_fingerprint_is_stable() -> None:
    assert _fingerprint(_spec()) == _fingerprint(_spec())
    reordered = _spec()
    reordered["ops"][3] = dict(reversed(list(reordered["ops"][3].items())))
    reordered = dict(reversed(list(reordered.items())))
    assert _fingerprint(reordered) == _fingerprint(_spec())
    # the same values written differently (scalar vs range) are the same job
    explicit = _with(("ops", 2, "degrees"), [-15, 15])
    assert _fingerprint(explicit) == _fingerprint(_spec())


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"execution": {"batch_size": 7}}, id="batch_size"),
        pytest.param({"execution": {"concurrency": 5, "num_gpus": 0.5}}, id="concurrency"),
        pytest.param({"execution": {"cpus_per_actor": 2}}, id="cpus"),
        pytest.param({"storage": {"endpoint": "http://minio:9000", "region": "eu"}}, id="storage"),
        pytest.param({"storage": {"retries": 20}}, id="retries"),
        pytest.param({"storage": {"connect_timeout": 3, "request_timeout": 5}}, id="deadlines"),
        pytest.param({"name": "renamed"}, id="name"),
        pytest.param({"errors": {"max_error_rate": 0.5}}, id="error-budget"),
    ],
)
def test_fingerprint_ignores_how_the_job_runs(changes: dict) -> None:
    assert _fingerprint(_spec(**changes)) == _fingerprint(_spec())


def _ops_with(index: int, **changes) -> list[dict]:
    ops = copy.deepcopy(BASE["ops"])
    ops[index].update(changes)
    return ops


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"seed": 12}, id="seed"),
        pytest.param({"views": 3}, id="views"),
        pytest.param({"ops": _ops_with(2, degrees=20)}, id="op-param"),
        pytest.param({"ops": _ops_with(1, p=0.6)}, id="op-p"),
        pytest.param({"ops": BASE["ops"][:3]}, id="op-removed"),
        pytest.param({"ops": [BASE["ops"][i] for i in (0, 2, 1, 3)]}, id="op-order"),
        pytest.param({"output": {"uri": "data/out", "image_format": "png"}}, id="image-format"),
        pytest.param({"output": {"uri": "data/out", "quality": 80}}, id="quality"),
        pytest.param({"output": {"uri": "data/out", "size": 64}}, id="size"),
        pytest.param({"output": {"uri": "data/out", "format": "webdataset"}}, id="format"),
        pytest.param({"errors": {"max_pixels": 1000}}, id="max-pixels"),
    ],
)
def test_fingerprint_changes_with_what_decides_the_output(changes: dict) -> None:
    assert _fingerprint(_spec(**changes)) != _fingerprint(_spec())


def test_fingerprint_changes_with_the_input_listing_and_versions() -> None:
    base = _fingerprint(_spec())
    assert _fingerprint(_spec(), listing=[*LISTING, "cat/003.jpg:99"]) != base
    assert _fingerprint(_spec(), listing=["cat/001.jpg:1235", LISTING[1]]) != base
    assert _fingerprint(_spec(), listing=LISTING[:1]) != base
    assert _fingerprint(_spec(), versions=VERSIONS | {"kornia": "0.9.1"}) != base
    assert _fingerprint(_spec(), versions=VERSIONS | {"rayaug": "0.2.0"}) != base


def test_jobspec_is_frozen() -> None:
    spec = parse_spec(_spec())
    assert isinstance(spec, JobSpec)
    with pytest.raises(Exception):  # noqa: B017 - pydantic's frozen error type varies
        spec.seed = 3  # type: ignore[misc]


def test_lance_on_google_is_refused_naming_the_calls_its_emulator_lacks() -> None:
    output = {"uri": "gs://bucket/out", "format": "lance"}
    data = {"input": {"uri": "in"}, "output": output, "ops": [{"name": "horizontal_flip"}]}
    with pytest.raises(SpecError) as refused:
        parse_spec(data)
    (message,) = refused.value.messages
    assert message.startswith(
        "output: format lance is not available on gs:// yet "
        "(local disk, s3://, az://, abfss://, abfs:// only: "
    )
    assert "GET /BUCKET?list-type=2" in message and "gcp-storage-emulator" in message
    assert "use_opendal" in message and "contentType null" in message
    assert message.endswith("use format parquet or webdataset there")


@pytest.mark.parametrize(
    "uri",
    [
        "az://container/out",
        "abfss://c@acct.dfs.core.windows.net/out",
        "abfs://c/out",
        "abfs://c@acct.dfs.core.windows.net/out",
    ],
)
def test_lance_on_azure_is_accepted(uri: str) -> None:
    output = {"uri": uri, "format": "lance"}
    data = {"input": {"uri": "in"}, "output": output, "ops": [{"name": "horizontal_flip"}]}
    assert parse_spec(data).output.format == "lance"
