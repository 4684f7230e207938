"""Growing an output: what a new run may add to the job its output records.

A sample's bytes are a function of (job seed, source key, view, ops, versions) alone, so an
output can gain views of its sources and new sources without one committed byte moving: the
growth plans only the new samples, as new work units. Anything else that would change bytes
already written is refused, naming what changed.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from rayaug.errors import UsageError
from rayaug.formats import input_format
from rayaug.formats.base import shard_name
from rayaug.records import Listing, WorkUnit
from rayaug.spec import JobSpec
from rayaug.storage import Location

if TYPE_CHECKING:
    from rayaug.plan import RecordedJob

_EXAMPLES = 3  # of the files named in a message


def plan_growth(
    recorded: RecordedJob,
    spec: JobSpec,
    listing: Listing,
    source: Location,
    now: dict[str, str],
    grow: bool,
) -> list[WorkUnit]:
    """The units that grow the recorded job into `spec` over `listing` (with the versions
    `now`): more views of the recorded sources, every view of the sources added. UsageError
    naming each change that is not growth, or any growth where `grow` is false (a resume)."""
    out = spec.output.uri
    versions = _changed_versions(recorded.versions, now)
    changes = _version_changes(recorded.versions, now, versions)
    changes += _spec_changes(recorded.spec, spec) + _listing_changes(recorded, listing)
    if changes:
        finish = "finish the recorded one with"
        if versions:  # other versions write other bytes: only the recorded ones can finish it
            finish += " the versions it recorded" + _known_versions(recorded.versions, versions)
        raise UsageError(
            f"{out} holds the output of a different job: {'; '.join(changes)}. An output can "
            "only grow (more views, new input files); use a new output URI for another job, or "
            f"{finish}: rayaug resume {out}"
        )
    old_views = recorded.spec.views
    added = _added_files(recorded, listing)
    fmt = input_format(recorded.plan.format)
    sources_added = any(fmt.claims(path) for path, _ in added)
    if not (sources_added or spec.views > old_views):
        return []  # files the job does not read (a README) change nothing
    if not grow:
        raise UsageError(
            f"{out}: the input gained {len(added)} files since the job was recorded; resume "
            "finishes the recorded job only. To add them, run the job again (`rayaug run`), "
            f"or `rayaug extend {out}`"
        )
    if added and spec.mixes:
        raise UsageError(
            f"{out}: the input gained {len(added)} files, but mix ops draw their partners from "
            "the whole input, so new sources would change the samples already written; "
            "use a new output URI"
        )
    units = [replace(u, views=(old_views, spec.views)) for u in recorded.plan.source_units]
    units = units if spec.views > old_views else []
    if sources_added:
        new = fmt.plan_added(
            source, spec.input, recorded.files, added, spec.output.shard_size, spec.seed
        )
        units += [replace(unit, views=(0, spec.views)) for unit in new]
    return [replace(unit, shard=shard_name(i)) for i, unit in enumerate(units)]


def _changed_versions(recorded: dict[str, str], now: dict[str, str]) -> list[str]:
    """The names whose version now is not the recorded one (or none was recorded)."""
    return [name for name in sorted(now) if recorded.get(name) != now[name]]


def _version_changes(recorded: dict[str, str], now: dict[str, str], names: list[str]) -> list[str]:
    return [f"{name} {recorded.get(name, 'absent')} recorded, {now[name]} now" for name in names]


def _known_versions(recorded: dict[str, str], names: list[str]) -> str:
    """` (name version, ...)` of the recorded versions of `names`; empty if none were recorded."""
    known = ", ".join(f"{name} {recorded[name]}" for name in names if name in recorded)
    return f" ({known})" if known else ""


def _spec_changes(recorded: JobSpec, spec: JobSpec) -> list[str]:
    """Every output-deciding field that changed (as `rayaug diff` words it), but views that
    only grow; the input may have moved (its listing says whether it is the same)."""
    from rayaug.diff import spec_changes  # diff reads outputs, which plan: not at import

    changes = [
        change.worded("recorded", "now")
        for change in spec_changes(recorded.model_dump(mode="json"), spec.model_dump(mode="json"))
        if change.affects_output and change.path not in ("views", "input.uri")
    ]
    if spec.views < recorded.views:
        changes.append(f"views: {recorded.views} recorded, {spec.views} now (views only grow)")
    return changes


def _listing_changes(recorded: RecordedJob, listing: Listing) -> list[str]:
    if recorded.files is None:
        return ["the job was recorded by rayaug < 0.5, which kept no input listing to grow from"]
    now = dict(listing.files)
    gone = [path for path, _ in recorded.files if path not in now]
    changed = [path for path, size in recorded.files if now.get(path, size) != size]
    return [
        f"{len(paths)} input files {what} since the job ran "
        f"(e.g. {', '.join(paths[:_EXAMPLES])}){hint}"
        for paths, what, hint in (
            (gone, "are gone", ": put them back to grow this output"),
            (changed, "changed size", ": their samples could not be replayed"),
        )
        if paths
    ]


def _added_files(recorded: RecordedJob, listing: Listing) -> list[tuple[str, int]]:
    known = {path for path, _ in recorded.files or []}
    return [(path, size) for path, size in listing.files if path not in known]
