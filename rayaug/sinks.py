"""The write stage: an output shard (Parquet or WebDataset tar), its quarantine file, its manifest.

Order is the commit protocol: data, then errors, then the manifest, whose existence commits
the shard. Every object is deterministic in its content, so a retried shard overwrites the
same names with the same bytes.
"""

from __future__ import annotations

import io
import json
import tarfile
from collections import Counter
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from rayaug import commit
from rayaug.records import AugmentedSample, Quarantined, ShardOutput
from rayaug.spec import OutputSpec
from rayaug.storage import Location

# After a mix op: each label's share of the sample (null when no mix was applied).
SOFT_LABEL = pa.list_(pa.struct([("label", pa.string()), ("weight", pa.float64())]))
MANIFEST_SCHEMA = pa.schema(
    [
        ("sample_id", pa.string()),
        ("source_uri", pa.string()),
        ("source_key", pa.string()),
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
DATA_SCHEMA = pa.schema(
    [
        ("sample_id", pa.string()),
        ("image", pa.binary()),
        ("label", pa.string()),
        ("width", pa.int32()),
        ("height", pa.int32()),
        ("boxes", pa.list_(pa.list_(pa.float64()))),  # [x0, y0, x1, y1] per box
        ("classes", pa.list_(pa.int32())),
        ("keypoints", pa.list_(pa.list_(pa.float64()))),  # [x, y, visibility]
        ("mask", pa.binary()),  # PNG of class ids
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
    views: int
    versions: dict[str, str]


@dataclass(frozen=True)
class ShardCommit:
    """What the driver learns when a shard is committed."""

    shard: str
    samples: int
    quarantined: int
    reasons: dict[str, int]


def data_path(output: OutputSpec, shard: str) -> str:
    return f"data/{shard}.{'parquet' if output.format == 'parquet' else 'tar'}"


def committed_objects(output: OutputSpec, shards: set[str]) -> set[str]:
    """The data and quarantine objects that committed shards vouch for (all others are orphans)."""
    return {data_path(output, s) for s in shards} | {commit.errors_path(s) for s in shards}


def write_shard(
    out: Location, shard: str, result: ShardOutput, context: WriteContext
) -> ShardCommit:
    """Write one shard's objects in commit order; returns once the shard is committed."""
    out.write_bytes(data_path(context.output, shard), _data_bytes(result.samples, shard, context))
    if result.quarantined:
        errors = _table([_error_row(q, shard) for q in result.quarantined], ERRORS_SCHEMA)
        out.write_bytes(commit.errors_path(shard), _parquet_bytes(errors))
    rows = [
        _manifest_row(s, shard, i, result.device, context) for i, s in enumerate(result.samples)
    ]
    manifest = _table(rows, MANIFEST_SCHEMA).replace_schema_metadata(
        {SOURCES_KEY: str(result.sources), VIEWS_KEY: str(context.views)}
    )
    commit.commit_shard(out, shard, _parquet_bytes(manifest))
    reasons = Counter(f"{q.stage}: {q.error_class}" for q in result.quarantined)
    return ShardCommit(shard, len(result.samples), len(result.quarantined), dict(reasons))


def _data_bytes(samples: list[AugmentedSample], shard: str, context: WriteContext) -> bytes:
    if context.output.format == "parquet":
        rows = [
            {
                "sample_id": s.sample_id,
                "image": s.image,
                "label": s.label,
                "width": s.width,
                "height": s.height,
                **_target_columns(s),
                "soft_label": s.soft_label_rows,
            }
            for s in samples
        ]
        # Encoded images do not compress: zstd over them would only cost CPU.
        return _parquet_bytes(_table(rows, DATA_SCHEMA), compression="none")
    return _tar_bytes(samples, shard, context.output.extension)


def _target_columns(sample: AugmentedSample) -> dict:
    targets = sample.targets
    if targets is None:
        return {"boxes": None, "classes": None, "keypoints": None, "mask": None}
    return {
        "boxes": targets.boxes,
        "classes": targets.classes,
        "keypoints": targets.keypoints,
        "mask": targets.mask,
    }


def _tar_bytes(samples: list[AugmentedSample], shard: str, extension: str) -> bytes:
    """WebDataset members `<shard>-<index>.{ext,txt,json,mask.png}`; fixed metadata: same bytes."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as archive:
        for index, sample in enumerate(samples):
            stem = f"{shard}-{index:06d}"
            meta = {
                "sample_id": sample.sample_id,
                "source_key": sample.source_key,
                "view": sample.view,
                "label": sample.label,
            }
            if sample.soft_label is not None:
                meta["soft_label"] = sample.soft_label_rows
            if sample.targets is not None:
                meta |= {k: v for k, v in sample.targets.to_json().items() if k != "mask"}
            members = [(extension, sample.image), ("json", json.dumps(meta).encode())]
            if sample.label is not None:  # text, not `.cls`: webdataset would int() a `.cls`
                members.insert(1, ("txt", sample.label.encode()))
            if sample.targets is not None and sample.targets.mask is not None:
                members.append(("mask.png", sample.targets.mask))
            for suffix, payload in members:
                info = tarfile.TarInfo(f"{stem}.{suffix}")
                info.size, info.mode, info.mtime = len(payload), 0o644, 0
                archive.addfile(info, io.BytesIO(payload))
    return buffer.getvalue()


def _manifest_row(
    sample: AugmentedSample, shard: str, index: int, device: str, context: WriteContext
) -> dict:
    return {
        "sample_id": sample.sample_id,
        "source_uri": sample.source_uri,
        "source_key": sample.source_key,
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


def _parquet_bytes(table: pa.Table, compression: str = "zstd") -> bytes:
    buffer = io.BytesIO()
    pq.write_table(table, buffer, compression=compression)
    return buffer.getvalue()
