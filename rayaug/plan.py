"""The plan: the input's work units, the job's fingerprint, its generations (the first run's
and each growth's, recorded under `_job/`), and what is left to do on resume."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from importlib.metadata import PackageNotFoundError, version

import yaml

import rayaug
from rayaug import commit, growth
from rayaug.errors import UsageError
from rayaug.formats import input_format, mix_refusal, output_format
from rayaug.formats.base import InputFormat, shard_name
from rayaug.records import Listing, WorkUnit
from rayaug.sources import list_input, without_outputs
from rayaug.spec import JobSpec, dump_spec, fingerprint, parse_spec
from rayaug.storage import Location

# A run's first and last shards are planned small. The first commit then waits for a
# sixteenth of a shard, not a whole one (256 sources × 8 views: about 3 s of a core on
# 300-600 px photos, 17 s on 12 MP ones): an actor holds two shards at once and may run
# either first, so the first END_PARTS (both calls of two actors) are small. At the end, small
# last shards go to whichever actors are free, where one actor would make a whole last shard
# while the others sit idle. A small part is 1/END_FRACTION of its unit's sources, and at
# least END_PART_SAMPLES samples (sources × views): a shard of few samples stays whole.
END_PARTS = 4
END_FRACTION = 16
END_PART_SAMPLES = 64


def versions() -> dict[str, str]:
    """Versions that change output bytes; a resume across them would mix two outputs.

    rayaug's own is the running package's: a submitted job's rayaug travels as `py_modules`,
    with no installed distribution (no metadata) on the cluster."""
    found = {name: _version_or_absent(name) for name in ("kornia", "torch", "pillow")}
    return {"rayaug": rayaug.__version__} | found | {"opencv": _opencv_version()}


def _version_or_absent(name: str) -> str:
    """torch and Kornia are the device path's (the `gpu` extra): a CPU install has neither."""
    try:
        return version(name)
    except PackageNotFoundError:
        return "absent"


def _opencv_version() -> str:
    """OpenCV ships under several distribution names; any of them provides `cv2`."""
    for name in ("opencv-python-headless", "opencv-python", "opencv-contrib-python-headless"):
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return "unknown"


@dataclass(frozen=True)
class JobPlan:
    format: str
    units: list[WorkUnit]
    ignored: int
    fingerprint: str

    @property
    def source_units(self) -> list[WorkUnit]:
        """The units that read each source first (with its view 0): every source once, in
        plan order. A growth's units of more views read their sources again."""
        return [unit for unit in self.units if unit.views[0] == 0]

    @property
    def planned_samples(self) -> int | None:
        """Known for folders and Parquet; a tar's member count is known only once read."""
        counts = [unit.planned for unit in self.units]
        if any(count is None for count in counts):
            return None
        return sum(unit.planned * unit.view_count for unit in self.units)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict, views: int) -> JobPlan:
        """`views`: of the job that recorded it, for plans recorded before units had views."""
        units = [
            WorkUnit(
                u["shard"],
                tuple(u["files"]),
                tuple(u["rows"]) if u["rows"] else None,
                u["planned"],
                tuple(tuple(d) for d in u.get("duplicates", ())),  # absent in older plans
                tuple(u["views"]) if u.get("views") else (0, views),
            )
            for u in data["units"]
        ]
        return cls(data["format"], units, data["ignored"], data["fingerprint"])


@dataclass(frozen=True)
class RecordedJob:
    """What an output's `_job/` records: each generation's spec and plan (the first run's,
    then each growth's), and the listing the last one planned from."""

    specs: list[JobSpec]
    plans: list[JobPlan]
    files: list[tuple[str, int]] | None  # None: recorded by rayaug < 0.5, which kept none
    versions: dict[str, str]

    @property
    def spec(self) -> JobSpec:
        """The spec of the latest generation: what a resume runs."""
        return self.specs[-1]

    @property
    def plan(self) -> JobPlan:
        """Every generation's units together; the fingerprint is the latest's."""
        units = [unit for plan in self.plans for unit in plan.units]
        latest = self.plans[-1]
        return JobPlan(self.plans[0].format, units, latest.ignored, latest.fingerprint)


def make_plan(spec: JobSpec, source: Location) -> tuple[JobPlan, Listing]:
    output_format(spec.output.format)  # usable here (its package installed) before anything
    listing: Listing = list_input(source, spec.input, spec.output.shard_size, spec.seed)
    refusal = mix_refusal(listing.format) if spec.mixes else None
    if refusal is not None:
        raise UsageError(f"input {source.uri}: {refusal}")
    units = [replace(unit, views=(0, spec.views)) for unit in listing.units]
    units = with_small_ends(units, input_format(listing.format))
    plan = JobPlan(listing.format, units, listing.ignored, _fingerprint(spec, listing))
    return plan, listing


def with_small_ends(units: list[WorkUnit], fmt: InputFormat) -> list[WorkUnit]:
    """The units with END_PARTS small parts cut from the start of the first and the end of
    the last (see END_PARTS), all renamed in order. A sample's bytes do not depend on which
    shard holds it: only the layout moves."""
    last = len(units) - 1
    split = [
        part
        for index, unit in enumerate(units)
        for part in (
            fmt.split_unit(unit, _end_cut(unit, at_start=index == 0))
            if index in (0, last)
            else [unit]
        )
    ]
    if len(split) == len(units):
        return units
    return [replace(unit, shard=shard_name(index)) for index, unit in enumerate(split)]


def _end_cut(unit: WorkUnit, at_start: bool) -> list[int]:
    """The sizes, in sources, of the parts of an end unit: END_PARTS small ones first (the
    first unit) or last (the last unit) and the rest of the unit in one, or, where the rest
    would be smaller than a small part, equal parts; [all] where two parts would be too few."""
    sources = unit.planned or 0  # unknown (a tar): read whole
    small = max(
        math.ceil(END_PART_SAMPLES / max(unit.view_count, 1)), math.ceil(sources / END_FRACTION)
    )
    count = min(END_PARTS, sources // small)
    if count < 2:
        return [sources]
    rest = sources - count * small
    if rest < small:
        return [sources * (part + 1) // count - sources * part // count for part in range(count)]
    return [small] * count + [rest] if at_start else [rest] + [small] * count


def _fingerprint(spec: JobSpec, listing: Listing) -> str:
    return fingerprint(spec, [f"{path}:{size}" for path, size in listing.files], versions())


def prepare(spec: JobSpec, source: Location, out: Location, grow: bool = True) -> JobPlan:
    """Plan the job; on an existing output, the recorded job's plan, grown by the new views
    and sources of `spec` where `grow` allows (see rayaug.growth); any other change refused."""
    plan, listing = make_plan(spec, source)
    recorded = recorded_job(out)
    if recorded is None:
        out.write_bytes(commit.SPEC, dump_spec(spec).encode())
        commit.write_json(out, commit.PLAN, plan.to_json())
        record = {"fingerprint": plan.fingerprint, "versions": versions(), "files": listing.files}
        commit.write_json(out, commit.FINGERPRINT, record)
        return plan
    if recorded.plan.fingerprint == plan.fingerprint:
        _record_run_settings(out, recorded, spec)
        return recorded.plan
    if _same_unsized(recorded, spec, plan):  # its record upgraded: it can grow from now on
        commit.write_json(out, commit.PLAN, plan.to_json())
        record = {"fingerprint": plan.fingerprint, "versions": versions(), "files": listing.files}
        commit.write_json(out, commit.FINGERPRINT, record)
        _record_run_settings(out, recorded, spec)
        return plan
    return _grown(recorded, spec, plan, listing, source, out, grow)


def _grown(
    recorded: RecordedJob,
    spec: JobSpec,
    plan: JobPlan,
    listing: Listing,
    source: Location,
    out: Location,
    grow: bool,
) -> JobPlan:
    """The recorded job's plan with the units of its growth (new views, new sources) added and
    recorded as a generation; refused where `spec` is another job (see rayaug.growth)."""
    added = growth.plan_growth(recorded, spec, listing, source, versions(), grow)
    added = with_small_ends(added, input_format(recorded.plan.format))
    if not added:  # nothing to grow (the input gained a README, say): the same job
        _record_run_settings(out, recorded, spec)
        return recorded.plan
    # Not finished any more: gone before the growth is recorded, so no reader sees both.
    if out.exists(commit.SUCCESS):
        out.delete(commit.SUCCESS)
    number = len(recorded.plans)
    units = [replace(unit, shard=f"g{number}-{unit.shard}") for unit in added]
    grown = replace(plan, units=units)
    record = {
        "spec": dump_spec(spec),
        "plan": grown.to_json(),
        "versions": versions(),
        "files": listing.files,
    }
    commit.write_json(out, commit.generation_path(number), record)
    return replace(recorded.plan, units=recorded.plan.units + units, fingerprint=plan.fingerprint)


def _same_unsized(recorded: RecordedJob, spec: JobSpec, plan: JobPlan) -> bool:
    """Whether a job recorded by rayaug < 0.5 (no listing kept, its digest over every file
    listed, rayaug's own among them when the output was inside its input) is this job: the
    same spec, versions and work units. Sizes were not recorded: a file of the same name
    whose size changed is not seen."""
    return (
        recorded.files is None
        and len(recorded.plans) == 1
        and recorded.spec.output_defining() == spec.output_defining()
        and recorded.versions == versions()
        and recorded.plan.units == plan.units
    )


def _record_run_settings(out: Location, recorded: RecordedJob, spec: JobSpec) -> None:
    """A rerun of the same job with other run settings (`errors.max_error_rate` raised, say)
    records them where its latest spec is: what resume runs and diff reads."""
    text = dump_spec(spec)
    if dump_spec(recorded.spec) == text:
        return
    growths = list(_growths(out))
    if not growths:
        out.write_bytes(commit.SPEC, text.encode())
        return
    record = growths[-1][1] | {"spec": text}
    commit.write_json(out, commit.generation_path(len(growths)), record)


def recorded_job(out: Location) -> RecordedJob | None:
    """The job recorded in `out`, every generation; None on a fresh output."""
    first = commit.read_json(out, commit.FINGERPRINT)
    if first is None:
        return None
    spec = recorded_spec(out, latest=False)
    plan = _recorded_first_plan(out, spec)
    specs, plans, files = [spec], [plan], first.get("files")
    for where, record in _growths(out):
        specs.append(_parse_recorded(record["spec"], where))
        plans.append(JobPlan.from_json(record["plan"], specs[-1].views))
        files = record["files"]
    # Never rayaug's own objects: an older rayaug listed the lease of an output made inside
    # its input (which is refused now) among the input's files.
    listed = None if files is None else without_outputs([(path, size) for path, size in files])
    return RecordedJob(specs, plans, listed, first["versions"])


def _recorded_first_plan(out: Location, spec: JobSpec) -> JobPlan:
    recorded = commit.read_json(out, commit.PLAN)
    if recorded is None:
        raise UsageError(
            f"{out.uri} was stopped while planning (no {commit.PLAN}): run "
            f"`rayaug resume {out.uri}` to finish it"
        )
    return JobPlan.from_json(recorded, spec.views)


def recorded_spec(out: Location, latest: bool = True) -> JobSpec:
    """The spec a job recorded (`_job/spec.yaml` at its first start, a growth's in its record
    under `_job/generations/`): by default the latest generation's, what resume runs."""
    if not out.exists(commit.SPEC):
        raise UsageError(f"{out.uri} is not a rayaug output (no {commit.SPEC})")
    growths = list(_growths(out)) if latest else []
    if growths:
        where, record = growths[-1]
        return _parse_recorded(record["spec"], where)
    return _parse_recorded(out.read_bytes(commit.SPEC), out.uri_of(commit.SPEC))


def _growths(out: Location) -> Iterator[tuple[str, dict]]:
    """(where, record) of each growth of the job, oldest first."""
    for number in itertools.count(1):
        record = commit.read_json(out, commit.generation_path(number))
        if record is None:
            return
        yield out.uri_of(commit.generation_path(number)), record


def _parse_recorded(text: str | bytes, where: str) -> JobSpec:
    return parse_spec(yaml.safe_load(text), where)


def pending_units(plan: JobPlan, committed: set[str]) -> list[WorkUnit]:
    return [unit for unit in plan.units if unit.shard not in committed]
