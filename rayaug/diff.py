"""Comparing two outputs: their resolved specs and their committed samples.

Engine-free: reads each output's recorded spec, committed manifests and quarantine.
`diff` compares the samples, not how they are stored: two outputs are identical when they hold
the same samples (ids) with the same parameters and bytes, the same quarantine, and specs that
agree on the recipe (every field that decides a sample). Layout fields (shard size, output
format) and run settings are listed, and count for nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from rayaug import commit
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

_ABSENT: Any = object()


@dataclass(frozen=True)
class SpecChange:
    """One field of the resolved spec that differs; `_ABSENT` where one side lacks it."""

    path: str
    a: Any
    b: Any

    @property
    def affects_output(self) -> bool:
        return not _under(self.path, SETTINGS)

    @property
    def kind(self) -> str:
        """'setting' (how it ran), 'layout' (how the samples are stored) or 'recipe' (what the
        samples are): only a recipe change makes two outputs' samples differ."""
        if not self.affects_output:
            return "setting"
        return "layout" if _under(self.path, LAYOUT) else "recipe"

    def worded(self, a: str, b: str) -> str:
        """`seed: 1 recorded, 2 now` for sides named `a` and `b`."""
        shown = ["absent" if v is _ABSENT else repr(v) for v in (self.a, self.b)]
        return f"{self.path}: {shown[0]} {a}, {shown[1]} {b}"

    def to_json(self) -> dict:
        sides = {side: v for side, v in (("a", self.a), ("b", self.b)) if v is not _ABSENT}
        return {
            "path": self.path,
            **sides,
            "kind": self.kind,
            "affects_output": self.affects_output,
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
        recipe_same = all(change.kind != "recipe" for change in self.spec)
        return recipe_same and not any(getattr(self, name) for name in CATEGORIES)

    def to_json(self, limit: int) -> dict:
        return {
            "a": {"uri": self.a, "samples": self.samples[0], "complete": self.complete[0]},
            "b": {"uri": self.b, "samples": self.samples[1], "complete": self.complete[1]},
            "in_both": self.samples[0] - len(self.only_in_a),
            "identical": self.identical,
            "spec": [change.to_json() for change in self.spec],
            **{
                name: {"count": len(getattr(self, name)), "examples": getattr(self, name)[:limit]}
                for name in CATEGORIES
            },
        }


def _under(path: str, prefixes: tuple[str, ...]) -> bool:
    return any(path == p or path.startswith((f"{p}.", f"{p}[")) for p in prefixes)


# ---------------------------------------------------------------- specs


def resolved_spec(output: Output) -> dict:
    """The spec as the job recorded it (its latest growth's, where it grew)."""
    return output.spec.model_dump(mode="json")


def spec_changes(a: dict, b: dict) -> list[SpecChange]:
    """Every differing field as a path (`seed`, `ops[1].degrees`), in the order of the specs."""
    return [change for change in _walk(a, b, "") if not _under(change.path, IGNORED)]


def _walk(a: Any, b: Any, path: str, item: bool = False) -> Iterator[SpecChange]:
    if _same(a, b):
        return
    # An op replaced by another (a list item of another name) is one change, not field by field.
    both = isinstance(a, dict) and isinstance(b, dict)
    if both and (not item or a.get("name") == b.get("name")):
        for key in dict.fromkeys([*a, *b]):
            yield from _walk(a.get(key, _ABSENT), b.get(key, _ABSENT), _join(path, str(key)))
    elif _is_record_list(a) and _is_record_list(b):  # the op list: compare op by op
        for i in range(max(len(a), len(b))):
            yield from _walk(_at(a, i), _at(b, i), f"{path}[{i}]", item=True)
    else:  # scalars, ranges like [0.08, 1.0], a replaced op: the whole value
        yield SpecChange(path or "<root>", a, b)


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _is_record_list(value: Any) -> bool:
    return isinstance(value, list) and any(isinstance(item, dict) for item in value)


def _at(items: list, index: int) -> Any:
    return items[index] if index < len(items) else _ABSENT


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
