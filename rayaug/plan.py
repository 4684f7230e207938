"""The plan: the input's work units, the job's fingerprint, and what is left to do on resume."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from importlib.metadata import PackageNotFoundError, version

import yaml

import rayaug
from rayaug import commit
from rayaug.changes import JobChanges, JobRecord, job_changes
from rayaug.errors import UsageError
from rayaug.formats import mix_refusal, output_format
from rayaug.records import Listing, WorkUnit
from rayaug.sources import list_input
from rayaug.spec import JobSpec, dump_spec, fingerprint, parse_spec
from rayaug.storage import Location


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
    def planned_sources(self) -> int | None:
        """Known for folders and Parquet; a tar's member count is known only once read."""
        counts = [unit.planned for unit in self.units]
        return None if any(c is None for c in counts) else sum(counts)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> JobPlan:
        units = [
            WorkUnit(
                u["shard"],
                tuple(u["files"]),
                tuple(u["rows"]) if u["rows"] else None,
                u["planned"],
                tuple(tuple(d) for d in u.get("duplicates", ())),  # absent in older plans
            )
            for u in data["units"]
        ]
        return cls(data["format"], units, data["ignored"], data["fingerprint"])


def make_plan(spec: JobSpec, source: Location) -> tuple[JobPlan, JobRecord]:
    """The job's work units, and the record of what decides its output (for the fingerprint
    and for naming what differs from a recorded job)."""
    output_format(spec.output.format)  # usable here (its package installed) before anything
    listing: Listing = list_input(source, spec.input, spec.output.shard_size)
    refusal = mix_refusal(listing.format) if spec.mixes else None
    if refusal is not None:
        raise UsageError(f"input {source.uri}: {refusal}")
    # Only the files the job reads: a README beside the images changes nothing it writes.
    read = {path for unit in listing.units for path in unit.files}
    record = JobRecord(
        spec.output_defining(),
        {path: size for path, size in listing.files if path in read},
        versions(),
    )
    files = [f"{path}:{size}" for path, size in record.files.items()]
    digest = fingerprint(spec, files, record.versions)
    return JobPlan(listing.format, listing.units, listing.ignored, digest), record


def prepare(spec: JobSpec, source: Location, out: Location) -> JobPlan:
    """Plan the job; on an existing output, refuse a different job, naming what differs
    (spec fields, input files, versions); a rerun of the same job records its run settings
    (`errors.max_error_rate`, `execution`, ...) in `_job/spec.yaml`, where resume reads them."""
    plan, record = make_plan(spec, source)
    recorded = commit.read_json(out, commit.FINGERPRINT)
    if recorded is None:
        out.write_bytes(commit.SPEC, dump_spec(spec).encode())
        commit.write_json(out, commit.PLAN, plan.to_json())
        commit.write_json(out, commit.FINGERPRINT, _fingerprint_record(plan, record))
        return plan
    if recorded["fingerprint"] != plan.fingerprint:
        found = job_changes(recorded_job(out, recorded), record)
        if not found.none:
            raise UsageError(_different_job(out, found))
        # Same spec, files and versions under another digest: recorded by an older rayaug,
        # whose digest also covered files the job does not read (rayaug's own among them).
        commit.write_json(out, commit.FINGERPRINT, _fingerprint_record(plan, record))
    resolved = dump_spec(spec).encode()
    if out.read_bytes(commit.SPEC) != resolved:
        out.write_bytes(commit.SPEC, resolved)
    return plan


def _fingerprint_record(plan: JobPlan, record: JobRecord) -> dict:
    return {"fingerprint": plan.fingerprint, "versions": record.versions, "files": record.files}


def recorded_job(out: Location, fingerprint_record: dict) -> JobRecord:
    """What decides the recorded job's output, from `_job/`: its spec, the files it read (with
    their sizes; from the plan's units, sizes unknown, in a record of an older rayaug) and the
    versions."""
    spec = recorded_spec(out)
    files = fingerprint_record.get("files")
    if files is None:  # the plan is written before the fingerprint: it is there
        plan = JobPlan.from_json(commit.read_json(out, commit.PLAN))
        files = {path: None for unit in plan.units for path in unit.files}
    return JobRecord(spec.output_defining(), files, fingerprint_record.get("versions", {}))


def _different_job(out: Location, found: JobChanges) -> str:
    if found.versions:
        fix = "install the recorded versions, or use a new output URI"
    elif found.added or found.gone or found.resized:
        fix = "put the input back as the job recorded it, or use a new output URI"
    else:
        fix = f"use a new output URI, or finish the recorded job unchanged: rayaug resume {out.uri}"
    return (
        f"{out.uri} holds the output of a different job: {'; '.join(found.lines())}. To go on, "
        f"{fix}"
    )


def recorded_spec(out: Location) -> JobSpec:
    """The spec a job recorded (`_job/spec.yaml`: written at its first start, its run settings
    refreshed by each later run of the same job): what resume runs."""
    if not out.exists(commit.SPEC):
        raise UsageError(f"{out.uri} is not a rayaug output (no {commit.SPEC})")
    return parse_spec(yaml.safe_load(out.read_bytes(commit.SPEC)), out.uri_of(commit.SPEC))


def pending_units(plan: JobPlan, committed: set[str]) -> list[WorkUnit]:
    return [unit for unit in plan.units if unit.shard not in committed]
