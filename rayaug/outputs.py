"""Reading a committed output: its recorded job, manifests, quarantine, images and status.

What the driver, replay, diff, the reports and the Python API share. Only committed shards
(those with a manifest) are ever read as output.
"""

from __future__ import annotations

import io
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rayaug import commit
from rayaug.errors import UsageError
from rayaug.formats import output_format
from rayaug.plan import JobPlan, recorded_job, recorded_spec
from rayaug.sinks import ERRORS_SCHEMA, MANIFEST_SCHEMA, ShardCommit
from rayaug.spec import JobSpec
from rayaug.storage import Location


@dataclass(frozen=True)
class Output:
    """An output prefix with its recorded job."""

    location: Location
    spec: JobSpec
    plan: JobPlan


def recorded_output(out: Location) -> Output:
    """The output at `out` with the spec and plan its job recorded in `_job/` (the latest
    spec, and the units of every generation: one dataset, however often it grew)."""
    recorded = recorded_job(out)
    if recorded is None:
        recorded_spec(out)  # refuses what is no rayaug output at all
        raise UsageError(
            f"{out.uri} was stopped while planning (no {commit.FINGERPRINT}): run "
            f"`rayaug resume {out.uri}` to finish it"
        )
    return Output(out, recorded.spec, recorded.plan)


def _parquet(out: Location, path: str) -> pa.Table:
    return pq.read_table(io.BytesIO(out.read_bytes(path)))


def manifest_of(out: Location, shard: str) -> pa.Table:
    """The manifest of one committed shard."""
    return _parquet(out, commit.manifest_path(shard))


def errors_of(out: Location, shard: str) -> pa.Table:
    """The quarantine of one committed shard (empty when it quarantined nothing)."""
    path = commit.errors_path(shard)
    return _parquet(out, path) if out.exists(path) else ERRORS_SCHEMA.empty_table()


def shard_commits(out: Location, shards: set[str]) -> list[ShardCommit]:
    """What each committed shard holds, from its manifest and quarantine file."""
    commits = []
    for shard in sorted(shards):
        manifest = manifest_of(out, shard)
        errors = errors_of(out, shard)
        reasons = Counter(
            f"{s}: {c}"
            for s, c in zip(
                errors.column("stage").to_pylist(),
                errors.column("error_class").to_pylist(),
                strict=True,
            )
        )
        commits.append(ShardCommit(shard, manifest.num_rows, errors.num_rows, dict(reasons)))
    return commits


def manifests(out: Location) -> pa.Table:
    """Every committed manifest row, as one table."""
    shards = sorted(commit.committed_shards(out))
    tables = [manifest_of(out, s) for s in shards]
    return pa.concat_tables(tables) if tables else MANIFEST_SCHEMA.empty_table()


def quarantine(out: Location) -> pa.Table:
    """Every quarantine row of the committed shards, as one table."""
    shards = sorted(commit.committed_shards(out))
    tables = [errors_of(out, s) for s in shards]
    return pa.concat_tables(tables) if tables else ERRORS_SCHEMA.empty_table()


def committed_tables(output: Output) -> tuple[pa.Table, pa.Table]:
    """Every committed manifest row and quarantine row: read once, shared by the reports."""
    return manifests(output.location), quarantine(output.location)


def find_row(out: Location, sample: str) -> dict:
    """The manifest row of one committed sample; UsageError if there is none."""
    table = manifests(out)
    matches = table.filter(pc.equal(table.column("sample_id"), sample))
    if matches.num_rows == 0:
        raise UsageError(_not_committed(out, sample))
    return matches.to_pylist()[0]


def _not_committed(out: Location, sample: str) -> str:
    """Why a sample has no manifest row: quarantined (where and why), or unknown."""
    errors = quarantine(out)
    found = errors.filter(pc.equal(errors.column("sample_id"), sample)).to_pylist()
    if not found:
        return f"no committed sample {sample!r} in {out.uri}"
    row = found[0]
    return (
        f"sample {sample!r} was quarantined at the {row['stage']} stage ({row['error_class']}: "
        f"{row['message']}), so it has no output to replay; `rayaug inspect {out.uri}` lists "
        "the quarantine"
    )


# ---------------------------------------------------------------- status


def status(output: Output) -> dict:
    """Planned, committed and quarantined counts, and the state: done, running or incomplete."""
    committed = commit.committed_shards(output.location)
    counts = shard_commits(output.location, committed)
    samples, quarantined = sum(c.samples for c in counts), sum(c.quarantined for c in counts)
    return status_of(output, len(committed), samples, quarantined)


def status_of(output: Output, shards: int, samples: int, quarantined: int) -> dict:
    """The status report for counts already taken."""
    out = output.location
    lock = commit.read_json(out, commit.LOCK)
    running = lock is not None and commit.LeaseRecord(**lock).held_by_live_driver(time.time())
    state = "done" if out.exists(commit.SUCCESS) else "running" if running else "incomplete"
    planned = output.plan.planned_samples
    return {
        "output": out.uri,
        "state": state,
        "shards_planned": len(output.plan.units),
        "shards_committed": shards,
        "samples_planned": planned,
        "samples_committed": samples,
        "quarantined": quarantined,
    }


# ---------------------------------------------------------------- images


def read_images(out: Location, spec: JobSpec, shard: str, masks: bool = False) -> dict[str, bytes]:
    """sample_id → encoded image (or mask PNG) of one committed shard's data, read as an
    ordinary reader of its format would (the Parquet column, the WebDataset member, ...)."""
    return output_format(spec.output.format).read_images(out, spec.output, shard, masks)


def samples(output: Output) -> Iterator[tuple[dict, bytes]]:
    """Every committed sample's manifest row with its encoded image, shard by shard in shard
    and manifest order: one data shard is held at a time."""
    for shard in sorted(commit.committed_shards(output.location)):
        images = read_images(output.location, output.spec, shard)
        for row in manifest_of(output.location, shard).to_pylist():
            if row["sample_id"] not in images:
                raise UsageError(
                    f"{output.location.uri}: sample {row['sample_id']} is committed but missing "
                    f"from its data shard {shard} (`rayaug inspect --verify` lists every breach)"
                )
            yield row, images[row["sample_id"]]
