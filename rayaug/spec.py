"""The job spec: one versioned, validated model, loaded once at the edge and passed down typed."""

from __future__ import annotations

import difflib
import hashlib
import json
import re
import typing
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from rayaug import formats
from rayaug.errors import SpecError
from rayaug.ops import MixOp, MixUp, Resize
from rayaug.policies import PipelineOp

SPEC_VERSION = 1


class Model(BaseModel):
    """Strict base: unknown fields are mistakes (a typo must not be silently ignored)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class InputSpec(Model):
    uri: str = Field(min_length=1)
    format: str = Field(formats.AUTO, description="an input format's name, or auto")
    image_column: str = "image"
    label_column: str | None = "label"
    key_column: str | None = None
    # Label targets (see the README): a COCO annotation file for an image folder, a tree of
    # mask PNGs beside it; Parquet columns boxes/classes/keypoints/mask; WebDataset .json and
    # .mask.png members.
    annotations: str | None = Field(None, description="COCO JSON, relative to uri or a URI")
    masks: str | None = Field(None, description="mask PNG tree mirroring the image folder")
    box_format: Literal["xyxy", "xywh"] = "xyxy"

    @field_validator("format")
    @classmethod
    def _known_format(cls, value: str) -> str:
        return formats.check_name(value, "input")


class OutputSpec(Model):
    uri: str = Field(min_length=1)
    format: str = Field("parquet", description="an output format's name")
    image_format: Literal["jpeg", "png", "webp"] = "jpeg"
    quality: int = Field(90, ge=1, le=100)
    size: tuple[int, int] | None = Field(
        None, description="final [height, width]; appends a resize"
    )
    shard_size: int = Field(256, ge=1, le=100_000, description="source images per output shard")
    # by_view: one data object per view per shard (an epoch reads one view's objects only);
    # by_source: one object per shard, a source's views back to back. Unset: by_view when the
    # job has several views (JobSpec.layout).
    layout: Literal["by_view", "by_source"] | None = None

    @property
    def extension(self) -> str:
        """The file extension of an output image (a WebDataset member's suffix)."""
        return {"jpeg": "jpg", "png": "png", "webp": "webp"}[self.image_format]

    @field_validator("format")
    @classmethod
    def _known_format(cls, value: str) -> str:
        return formats.check_name(value, "output")

    @field_validator("size", mode="before")
    @classmethod
    def _square(cls, value: object) -> object:
        return (value, value) if isinstance(value, int) else value

    @field_validator("size")
    @classmethod
    def _positive(cls, value: tuple[int, int] | None) -> tuple[int, int] | None:
        if value is not None and min(value) < 1:
            raise ValueError("must be positive")
        return value

    @model_validator(mode="after")
    def _format_where_wired(self) -> OutputSpec:
        refusal = formats.scheme_refusal(self.format, self.uri)
        if refusal is not None:
            raise ValueError(refusal)
        return self


class ExecutionSpec(Model):
    """How the job runs. Never changes what it writes, so it is left out of the fingerprint."""

    batch_size: int = Field(32, ge=1, le=4096)
    concurrency: int | Literal["auto"] = "auto"
    num_gpus: float | Literal["auto"] = "auto"
    cpus_per_actor: float | Literal["auto"] = "auto"
    # A second shard call per actor beside the augmenting one: its reads and the other's writes
    # wait on storage meanwhile. "auto": when the input or output is in cloud storage.
    overlap_shards: bool | Literal["auto"] = "auto"

    @field_validator("concurrency")
    @classmethod
    def _concurrency(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 1:
            raise ValueError("must be ≥ 1 or 'auto'")
        return value

    @field_validator("num_gpus", "cpus_per_actor")
    @classmethod
    def _non_negative(cls, value: float | str) -> float | str:
        if isinstance(value, float | int) and value < 0:
            raise ValueError("must be ≥ 0 or 'auto'")
        return value


class ErrorPolicy(Model):
    max_error_rate: float = Field(0.01, ge=0, le=1, description="quarantined / planned samples")
    max_pixels: int = Field(100_000_000, ge=1, description="larger images are quarantined")


class StorageSpec(Model):
    """Where the cloud storage is; credentials come only from each cloud's own environment and
    credential chain, never the spec (rayaug.clouds)."""

    endpoint: str | None = None  # the S3, GCS or Azure Blob endpoint (an emulator, say)
    region: str | None = None  # S3
    account: str | None = None  # the Azure storage account of az:// URIs
    retries: int = Field(6, ge=0, le=50)
    # Deadlines of every storage call: a server that accepts a connection and never answers (or
    # stalls mid-answer) would otherwise hold its shard's actor forever. Past either one the
    # call is a transient error, retried with the same backoff as any other.
    connect_timeout: float = Field(10.0, gt=0, le=600)  # seconds to open a connection
    request_timeout: float = Field(60.0, gt=0, le=3600)  # seconds without a byte received


class JobSpec(Model):
    version: Literal[1] = SPEC_VERSION
    name: str = "rayaug-job"
    input: InputSpec
    output: OutputSpec
    views: int = Field(1, ge=1, le=10_000)
    seed: int = Field(0, ge=0, lt=2**63)
    ops: list[PipelineOp] = Field(min_length=1)
    execution: ExecutionSpec = ExecutionSpec()
    errors: ErrorPolicy = ErrorPolicy()
    storage: StorageSpec = StorageSpec()

    @model_validator(mode="after")
    def _mixes_can_read_partners(self) -> JobSpec:
        for i, op in enumerate(self.ops):
            if isinstance(op, MixOp):
                refusal = formats.mix_refusal(self.input.format, f"{op.name} picks")
                if refusal is not None:
                    raise ValueError(f"ops[{i}]: {refusal}")
            if isinstance(op, MixUp) and self.input.masks:
                raise ValueError(
                    f"ops[{i}]: mixup cannot blend segmentation masks (input.masks is set); "
                    "use cutmix or mosaic"
                )
        return self

    @property
    def layout(self) -> str:
        """The output layout this job writes: output.layout, or by_view with several views."""
        if self.output.layout is not None:
            return self.output.layout
        return "by_view" if self.views > 1 else "by_source"

    @property
    def mixes(self) -> bool:
        """Whether the job reads partner sources (mix ops)."""
        return any(isinstance(op, MixOp) for op in self.ops)

    def pipeline(self) -> list[PipelineOp]:
        """The ops every sample goes through, the output size included."""
        if self.output.size is None:
            return list(self.ops)
        return [*self.ops, Resize(size=self.output.size)]

    def output_defining(self) -> dict:
        """Every field that decides the output's bytes: what the fingerprint covers.

        Not the URIs: the input listing identifies the data, so an input or output that moved
        (copied to another bucket, say) can still be resumed.
        """
        data = self.model_dump(mode="json", exclude={"name", "execution", "storage", "errors"})
        data["input"].pop("uri")
        data["output"].pop("uri")
        return data | {"max_pixels": self.errors.max_pixels}


# Pydantic names the member of a union it tried ('int', "literal['auto']"): noise to a user.
_UNION_MEMBER = re.compile(r"^(int|float|str|bool|none|[a-z]+\[.*\])$")


def _is_tag(loc: tuple[str | int, ...], i: int) -> bool:
    op_tag = i >= 2 and loc[i - 2] == "ops" and isinstance(loc[i - 1], int)
    return op_tag or bool(_UNION_MEMBER.match(str(loc[i])))


def _path_of(loc: tuple[str | int, ...]) -> str:
    """('ops', 2, 'rotation', 'degrees') -> 'ops[2].degrees' (the union tag is noise to a user)."""
    path = ""
    for i, part in enumerate(loc):
        if isinstance(part, int):
            path += f"[{part}]"
        elif _is_tag(loc, i):
            continue
        else:
            path += f".{part}" if path else part
    return path


def _messages(error: ValidationError) -> list[str]:
    errors = error.errors()
    # A misspelt field is also a missing one ("sise" unknown, "size" required): the suggestion
    # says both, so the "Field required" of the suggested field is left out.
    suggested = {
        (e["loc"][:-1], _closest(str(e["loc"][-1]), _fields_at(e["loc"][:-1])))
        for e in errors
        if e["type"] == "extra_forbidden"
    }
    return [
        f"{_path_of(e['loc']) or '<root>'}: {_message(e)}"
        for e in errors
        if not (e["type"] == "missing" and (e["loc"][:-1], e["loc"][-1]) in suggested)
    ]


def _message(error: Any) -> str:
    """Pydantic's message, or a shorter one that says what to write instead."""
    kind, loc = error["type"], error["loc"]
    if kind == "union_tag_invalid":  # an op name nobody knows
        return _unknown_op(
            error["ctx"]["tag"], re.findall(r"'([^']*)'", error["ctx"]["expected_tags"])
        )
    if kind == "union_tag_not_found":
        return "an op needs a name, e.g. {name: horizontal_flip}"
    if kind == "extra_forbidden":
        known = _fields_at(loc[:-1])
        best = _closest(str(loc[-1]), known)
        if best is not None:
            return f"unknown field; did you mean {best!r}?"
        return f"unknown field; known here: {', '.join(known)}"
    return error["msg"].removeprefix("Value error, ")


def _unknown_op(name: str, expected: list[str]) -> str:
    if name in _op_classes():  # a mix op inside a composite: known, not allowed there
        return f"{name!r} cannot be drawn by a composite op; list it among the top-level ops"
    best = _closest(name, expected)
    hint = f"did you mean {best!r}?" if best else "the README's op catalogue lists every op"
    return f"unknown op {name!r}; {hint}"


def _closest(word: str, candidates: list[str]) -> str | None:
    """The candidate nearest `word` in spelling, whole or by one of its parts ('blurr' is
    nearest 'gaussian_blur' by its 'blur')."""
    found = difflib.get_close_matches(word, candidates, n=1, cutoff=0.6)
    if found:
        return found[0]
    parts = {part: name for name in candidates for part in name.split("_") if len(part) > 2}
    found = difflib.get_close_matches(word, list(parts), n=1, cutoff=0.75)
    return parts[found[0]] if found else None


def _models_in(annotation: object) -> list[type[BaseModel]]:
    """The models a field holds, through list[...], X | None, unions and Annotated."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for arg in typing.get_args(annotation) for model in _models_in(arg)]


def _op_classes() -> dict[str, type[BaseModel]]:
    """Every op's model by its name (the tag of the ops list)."""
    return {
        m.model_fields["name"].default: m
        for m in _models_in(JobSpec.model_fields["ops"].annotation)
    }


def _fields_at(loc: tuple[str | int, ...]) -> list[str]:
    """The field names of the model at a pydantic error location (an op's by its tag)."""
    models: list[type[BaseModel]] = [JobSpec]
    for part in loc:
        if isinstance(part, int):  # an item of a list: the models stay those of the list
            continue
        tagged = [m for m in models if _op_tag(m) == part]
        if tagged:
            models = tagged
            continue
        models = [
            inner
            for m in models
            if part in m.model_fields
            for inner in _models_in(m.model_fields[part].annotation)
        ]
    return sorted({name for m in models for name in m.model_fields})


def _op_tag(model: type[BaseModel]) -> object:
    field = model.model_fields.get("name")
    return None if model is JobSpec or field is None else field.default


def parse_spec(data: object, source: str = "<spec>") -> JobSpec:
    """Validate a mapping into a JobSpec; a bad field raises SpecError naming its path and file."""
    if not isinstance(data, dict):
        raise SpecError(source, ["<root>: a job spec is a YAML mapping"])
    try:
        return JobSpec.model_validate(data)
    except ValidationError as error:
        raise SpecError(source, _messages(error)) from None


def load_spec(path: str | Path) -> JobSpec:
    """Read and validate a YAML job spec file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as error:
        raise SpecError(str(path), [f"cannot read: {error.strerror}"]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise SpecError(str(path), [f"not valid YAML: {error}"]) from None
    return parse_spec(data, str(path))


def dump_spec(spec: JobSpec) -> str:
    """The resolved spec as YAML (what `_job/spec.yaml` holds)."""
    return yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False)


def fingerprint(spec: JobSpec, listing: list[str], versions: dict[str, str]) -> str:
    """Hash of what decides the output: spec (less execution), the input listing, versions."""
    payload = {"spec": spec.output_defining(), "listing": listing, "versions": versions}
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True).encode())
    return digest.hexdigest()
