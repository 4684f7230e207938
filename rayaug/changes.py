"""What differs between two jobs: the spec fields, the input files read, the versions.

One comparison serves every caller: the refusal of a different job on an existing output
(`plan.prepare` names what differs, with the recorded and the new value) and `rayaug diff`
(spec fields by path). Engine-free and storage-free: it compares records already read.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

ABSENT: Any = object()  # a field one side lacks
# Changes named one by one in a message; the rest are counted.
SHOWN = 3


@dataclass(frozen=True)
class SpecChange:
    """One field of a spec that differs; `ABSENT` where one side lacks it."""

    path: str
    a: Any
    b: Any

    def sides(self) -> dict:
        return {side: v for side, v in (("a", self.a), ("b", self.b)) if v is not ABSENT}


def spec_changes(a: dict, b: dict) -> list[SpecChange]:
    """Every differing field as a path (`seed`, `ops[1].degrees`), in the order of the specs."""
    return list(_walk(a, b, ""))


def _walk(a: Any, b: Any, path: str, item: bool = False) -> Iterator[SpecChange]:
    if _same(a, b):
        return
    # An op replaced by another (a list item of another name) is one change, not field by field.
    both = isinstance(a, dict) and isinstance(b, dict)
    if both and (not item or a.get("name") == b.get("name")):
        for key in dict.fromkeys([*a, *b]):
            yield from _walk(a.get(key, ABSENT), b.get(key, ABSENT), _join(path, str(key)))
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
    return items[index] if index < len(items) else ABSENT


# ---------------------------------------------------------------- a recorded job and a new one


@dataclass(frozen=True)
class JobRecord:
    """What decides a job's output: the spec's output-defining fields (`output_defining()`),
    the input files it reads (path → size; None where an older record kept no size) and the
    versions of the libraries that make the bytes."""

    spec: dict
    files: dict[str, int | None]
    versions: dict[str, str]


@dataclass(frozen=True)
class JobChanges:
    """A new job against the recorded one: `added` and `gone` input files, files `resized`
    (same path, other size), spec fields and versions (name → (recorded, new))."""

    spec: list[SpecChange]
    added: list[str]
    gone: list[str]
    resized: list[str]
    versions: dict[str, tuple[str, str]]

    @property
    def none(self) -> bool:
        """Nothing that decides the output differs."""
        return not (self.spec or self.added or self.gone or self.resized or self.versions)

    def lines(self) -> list[str]:
        """One phrase per kind of change, naming the recorded and the new value."""
        lines = [f"{c.path} {_value(c.a)} recorded, {_value(c.b)} now" for c in self.spec[:SHOWN]]
        more = len(self.spec) - SHOWN
        if more > 0:
            lines.append(f"{more} more spec field{'s' * (more != 1)}")
        listing = [
            _files(self.added, "added"),
            _files(self.gone, "gone"),
            _files(self.resized, "changed in size"),
        ]
        if any(listing):
            lines.append("input listing: " + ", ".join(part for part in listing if part))
        lines += [f"{name} {old} recorded, {new} now" for name, (old, new) in self.versions.items()]
        return lines


def _value(value: Any) -> str:
    return "(absent)" if value is ABSENT else json.dumps(value)


def _files(paths: list[str], what: str) -> str:
    if not paths:
        return ""
    examples = ", ".join(paths[:SHOWN]) + (", …" if len(paths) > SHOWN else "")
    return f"{len(paths)} file{'s' * (len(paths) != 1)} {what} ({examples})"


def job_changes(recorded: JobRecord, new: JobRecord) -> JobChanges:
    """Everything that decides the output and differs between the recorded job and a new one."""
    names = dict.fromkeys([*recorded.versions, *new.versions])
    versions = {
        name: (recorded.versions.get(name, "absent"), new.versions.get(name, "absent"))
        for name in names
        if recorded.versions.get(name) != new.versions.get(name)
    }
    common = recorded.files.keys() & new.files.keys()
    return JobChanges(
        spec=spec_changes(recorded.spec, new.spec),
        added=sorted(new.files.keys() - recorded.files.keys()),
        gone=sorted(recorded.files.keys() - new.files.keys()),
        resized=sorted(
            path
            for path in common
            if recorded.files[path] is not None and recorded.files[path] != new.files[path]
        ),
        versions=versions,
    )
