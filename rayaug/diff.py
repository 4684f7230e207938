"""Comparing two outputs: their resolved specs and their committed samples.

Engine-free: reads each output's `_job/spec.yaml`, committed manifests and quarantine.
`diff` compares the samples, not how they are stored: two outputs are identical when they hold
the same samples (ids) with the same parameters and bytes, the same quarantine, and specs that
agree on the recipe (every field that decides a sample). Layout fields (shard size, output
format) and run settings are listed, and count for nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import yaml

from rayaug import changes, commit
from rayaug.changes import SpecChange
from rayaug.outputs import Output, manifests, quarantine

# Spec fields that never change what is written (how it ran, where it went): listed, not counted.
SETTINGS = ("name", "execution", "storage", "errors.max_error_rate")
# Spec fields that change how the samples are stored, never a sample: listed, not counted.
LAYOUT = ("output.shard_size", "output.format")
# The output's own location differs between any two outputs: not a difference at all.
IGNORED = ("output.uri",)
CATEGORIES = (
    "only_in_a",
    "only_in_b",
    "params_differ",
    "bytes_differ",
    "quarantined_only_in_a",
    "quarantined_only_in_b",
)


def kind_of(change: SpecChange) -> str:
    """'setting' (how it ran), 'layout' (how the samples are stored) or 'recipe' (what the
    samples are): only a recipe change counts toward the verdict."""
    if _under(change.path, SETTINGS):
        return "setting"
    return "layout" if _under(change.path, LAYOUT) else "recipe"


def change_json(change: SpecChange) -> dict:
    kind = kind_of(change)
    return {
        "path": change.path,
        **change.sides(),
        "kind": kind,
        "affects_output": kind != "setting",
    }


@dataclass(frozen=True)
class OutputDiff:
    a: str
    b: str
    samples: tuple[int, int]
    complete: tuple[bool, bool]
    spec: list[SpecChange]
    only_in_a: list[str]
    only_in_b: list[str]
    params_differ: list[str]
    bytes_differ: list[str]
    quarantined_only_in_a: list[str]
    quarantined_only_in_b: list[str]

    @property
    def identical(self) -> bool:
        recipe_same = all(kind_of(change) != "recipe" for change in self.spec)
        return recipe_same and not any(getattr(self, name) for name in CATEGORIES)

    def to_json(self, limit: int) -> dict:
        return {
            "a": {"uri": self.a, "samples": self.samples[0], "complete": self.complete[0]},
            "b": {"uri": self.b, "samples": self.samples[1], "complete": self.complete[1]},
            "in_both": self.samples[0] - len(self.only_in_a),
            "identical": self.identical,
            "spec": [change_json(change) for change in self.spec],
            **{
                name: {"count": len(getattr(self, name)), "examples": getattr(self, name)[:limit]}
                for name in CATEGORIES
            },
        }


def _under(path: str, prefixes: tuple[str, ...]) -> bool:
    return any(path == p or path.startswith((f"{p}.", f"{p}[")) for p in prefixes)


# ---------------------------------------------------------------- specs


def resolved_spec(output: Output) -> dict:
    """The spec the job recorded (`_job/spec.yaml`, refreshed by each run of the same job)."""
    return yaml.safe_load(output.location.read_bytes(commit.SPEC)) or {}


def spec_changes(a: dict, b: dict) -> list[SpecChange]:
    """Every differing field but the outputs' own locations, which always differ."""
    return [change for change in changes.spec_changes(a, b) if not _under(change.path, IGNORED)]


# ---------------------------------------------------------------- samples


@dataclass(frozen=True)
class _Samples:
    ops: dict[str, str]  # sample_id -> ops JSON
    sha256: dict[str, str]
    quarantined: set[str]


def _samples(output: Output) -> _Samples:
    table = manifests(output.location).select(["sample_id", "ops", "sha256"])
    ids = table.column("sample_id").to_pylist()
    errors = quarantine(output.location).column("sample_id").to_pylist()
    return _Samples(
        dict(zip(ids, table.column("ops").to_pylist(), strict=True)),
        dict(zip(ids, table.column("sha256").to_pylist(), strict=True)),
        set(errors),
    )


def _same_ops(a: str, b: str) -> bool:
    """Manifests write canonical JSON; parse only when the text differs."""
    return a == b or json.loads(a) == json.loads(b)


def diff_outputs(a: Output, b: Output) -> OutputDiff:
    """Compare two committed outputs: specs, sample sets, parameters and bytes."""
    left, right = _samples(a), _samples(b)
    common = sorted(left.ops.keys() & right.ops.keys())
    return OutputDiff(
        a=a.location.uri,
        b=b.location.uri,
        samples=(len(left.ops), len(right.ops)),
        complete=(a.location.exists(commit.SUCCESS), b.location.exists(commit.SUCCESS)),
        spec=spec_changes(resolved_spec(a), resolved_spec(b)),
        only_in_a=sorted(left.ops.keys() - right.ops.keys()),
        only_in_b=sorted(right.ops.keys() - left.ops.keys()),
        params_differ=[s for s in common if not _same_ops(left.ops[s], right.ops[s])],
        bytes_differ=[s for s in common if left.sha256[s] != right.sha256[s]],
        quarantined_only_in_a=sorted(left.quarantined - right.quarantined),
        quarantined_only_in_b=sorted(right.quarantined - left.quarantined),
    )
