"""The write stage: a shard's data (through its output format), quarantine file and manifest.

Order is the commit protocol: data, then errors, then the manifest, whose existence commits
the shard; the manifest's file metadata keeps the layout and what the format recorded of the
data (its objects; Lance: its fragments). Parquet and WebDataset data are deterministic in
content, so a retried shard overwrites the same names with the same bytes.

A shard's samples are written in an order drawn from the job's seed (a source's place:
`records.placement`), never in the input's order: a shard cut from one Parquet file or tar
would otherwise hold that file's order, often one class after another. by_view writes each
view's samples as one object (view-major); by_source keeps a source's views back to back.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass

import pyarrow as pa

from rayaug import commit
from rayaug.formats import output_format
from rayaug.formats.base import BY_VIEW, LAYOUT_KEY, SOFT_LABEL, parquet_bytes
from rayaug.records import AugmentedSample, Quarantined, ShardOutput, placement
from rayaug.spec import OutputSpec
from rayaug.storage import Location

MANIFEST_SCHEMA = pa.schema(
    [
        ("sample_id", pa.string()),
        ("source_uri", pa.string()),
        ("source_key", pa.string()),
        ("source_sha256", pa.string()),  # the source's bytes as read: replay tells a changed one
        ("view", pa.int32()),
        ("label", pa.string()),
        ("seed", pa.int64()),
        ("ops", pa.string()),
        ("shard", pa.string()),
        ("index", pa.int32()),
        ("width", pa.int32()),
        ("height", pa.int32()),
        ("source_width", pa.int32()),
        ("source_height", pa.int32()),
        ("format", pa.string()),
        ("sha256", pa.string()),
        ("device", pa.string()),
        ("rayaug_version", pa.string()),
        ("kornia_version", pa.string()),
        ("targets", pa.string()),
        ("soft_label", SOFT_LABEL),
    ]
)
# Manifest file metadata: how many sources the shard read, so verify can account for each view.
SOURCES_KEY, VIEWS_KEY = "rayaug.sources", "rayaug.views"
ERRORS_SCHEMA = pa.schema(
    [
        ("sample_id", pa.string()),
        ("source_key", pa.string()),
        ("view", pa.int32()),
        ("shard", pa.string()),
        ("stage", pa.string()),
        ("error_class", pa.string()),
        ("message", pa.string()),
    ]
)


@dataclass(frozen=True)
class WriteContext:
    """What every manifest row of a run shares."""

    output: OutputSpec
    versions: dict[str, str]
    seed: int  # the job's: it draws the order of a shard's samples
    layout: str  # by_view | by_source (JobSpec.layout)


@dataclass(frozen=True)
class ShardCommit:
    """What the driver learns when a shard is committed."""

    shard: str
    samples: int
    quarantined: int
    reasons: dict[str, int]


def orphans(out: Location, output: OutputSpec, shards: set[str]) -> list[str]:
    """The data and quarantine objects that no committed shard of `shards` vouches for."""
    fmt = output_format(output.format)
    keep = {path for shard in shards for path in fmt.data_objects(out, shard)}
    keep |= {commit.errors_path(s) for s in shards}
    return commit.orphans(out, keep, fmt.folder)


def write_shard(
    out: Location, shard: str, result: ShardOutput, context: WriteContext
) -> ShardCommit:
    """Write one shard's objects in commit order; returns once the shard is committed."""
    by_view = context.layout == BY_VIEW
    samples = _in_shard_order(result.samples, context.seed, by_view)
    record = output_format(context.output.format).write(
        out, shard, samples, context.output, by_view
    )
    if result.quarantined:
        errors = _table([_error_row(q, shard) for q in result.quarantined], ERRORS_SCHEMA)
        out.write_bytes(commit.errors_path(shard), parquet_bytes(errors))
    rows = [
        _manifest_row(s, shard, i, result.device, context)
        for s, i in zip(samples, _object_indices(samples, by_view), strict=True)
    ]
    metadata = {SOURCES_KEY: str(result.sources), VIEWS_KEY: str(len(result.views))}
    manifest = _table(rows, MANIFEST_SCHEMA).replace_schema_metadata(
        metadata | {LAYOUT_KEY: context.layout} | record
    )
    commit.commit_shard(out, shard, parquet_bytes(manifest))
    reasons = Counter(f"{q.stage}: {q.error_class}" for q in result.quarantined)
    return ShardCommit(shard, len(result.samples), len(result.quarantined), dict(reasons))


def _in_shard_order(
    samples: list[AugmentedSample], seed: int, by_view: bool
) -> list[AugmentedSample]:
    """The order a shard's samples are written in: sources placed by the seed; by_view,
    view by view (each view's object in that order), by_source, a source's views together."""
    if by_view:
        return sorted(samples, key=lambda s: (s.view, placement(seed, s.source_key)))
    return sorted(samples, key=lambda s: (placement(seed, s.source_key), s.view))


def _object_indices(samples: list[AugmentedSample], by_view: bool) -> list[int]:
    """Each sample's position in its data object (the manifest's `index`)."""
    if not by_view:
        return list(range(len(samples)))
    seen: Counter = Counter()
    indices = []
    for sample in samples:
        indices.append(seen[sample.view])
        seen[sample.view] += 1
    return indices


def finish_output(out: Location, output: OutputSpec, shards: set[str]) -> None:
    """The driver, once every shard is committed: the format's last step (Lance commits the
    dataset version of exactly these shards' fragments)."""
    output_format(output.format).finish(out, shards)


def _manifest_row(
    sample: AugmentedSample, shard: str, index: int, device: str, context: WriteContext
) -> dict:
    return {
        "sample_id": sample.sample_id,
        "source_uri": sample.source_uri,
        "source_key": sample.source_key,
        "source_sha256": sample.source_digest,
        "view": sample.view,
        "label": sample.label,
        "seed": sample.seed,
        "ops": json.dumps(sample.ops, sort_keys=True, separators=(",", ":")),
        "shard": shard,
        "index": index,
        "width": sample.width,
        "height": sample.height,
        "source_width": sample.source_size[1],
        "source_height": sample.source_size[0],
        "format": context.output.image_format,
        "sha256": sample.sha256,
        "device": device,
        "rayaug_version": context.versions["rayaug"],
        "kornia_version": context.versions["kornia"],
        "targets": None if sample.targets is None else json.dumps(sample.targets.to_json()),
        "soft_label": sample.soft_label_rows,
    }


def _error_row(quarantined: Quarantined, shard: str) -> dict:
    return {
        "sample_id": quarantined.sample_id,
        "source_key": quarantined.source_key,
        "view": quarantined.view,
        "shard": shard,
        "stage": quarantined.stage,
        "error_class": quarantined.error_class,
        "message": quarantined.message,
    }


def _table(rows: list[dict], schema: pa.Schema) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=schema)
