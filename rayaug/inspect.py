"""Reading committed output: counts, summary, verification, contact sheet, replay.

Only committed shards (those with a manifest) are ever read as output.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import yaml
from PIL import Image, ImageDraw

from rayaug import commit
from rayaug.errors import UsageError
from rayaug.plan import JobPlan
from rayaug.sinks import (
    ERRORS_SCHEMA,
    MANIFEST_SCHEMA,
    SOURCES_KEY,
    ShardCommit,
    committed_objects,
    data_path,
)
from rayaug.spec import JobSpec, parse_spec
from rayaug.storage import Location


@dataclass(frozen=True)
class Output:
    """An output prefix with its recorded job."""

    location: Location
    spec: JobSpec
    plan: JobPlan


def open_output(out: Location) -> Output:
    if not out.exists(commit.SPEC) or not out.exists(commit.PLAN):
        raise UsageError(f"{out.uri} is not a rayaug output (no {commit.SPEC})")
    spec = parse_spec(yaml.safe_load(out.read_bytes(commit.SPEC)), out.uri_of(commit.SPEC))
    plan = JobPlan.from_json(commit.read_json(out, commit.PLAN))
    return Output(out, spec, plan)


def _parquet(out: Location, path: str) -> pa.Table:
    return pq.read_table(io.BytesIO(out.read_bytes(path)))


def shard_commits(out: Location, shards: set[str]) -> list[ShardCommit]:
    """What each committed shard holds, from its manifest and quarantine file."""
    commits = []
    for shard in sorted(shards):
        manifest = _parquet(out, commit.manifest_path(shard))
        errors = _errors_of(out, shard)
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


def _errors_of(out: Location, shard: str) -> pa.Table:
    path = commit.errors_path(shard)
    return _parquet(out, path) if out.exists(path) else ERRORS_SCHEMA.empty_table()


def manifests(out: Location) -> pa.Table:
    """Every committed manifest row, as one table."""
    shards = sorted(commit.committed_shards(out))
    tables = [_parquet(out, commit.manifest_path(s)) for s in shards]
    return pa.concat_tables(tables) if tables else MANIFEST_SCHEMA.empty_table()


def quarantine(out: Location) -> pa.Table:
    shards = sorted(commit.committed_shards(out))
    tables = [_errors_of(out, s) for s in shards]
    return pa.concat_tables(tables) if tables else ERRORS_SCHEMA.empty_table()


# ---------------------------------------------------------------- status and summary


def status(output: Output) -> dict:
    out = output.location
    committed = commit.committed_shards(out)
    counts = shard_commits(out, committed)
    lock = commit.read_json(out, commit.LOCK)
    running = lock is not None and commit.LeaseRecord(**lock).held_by_live_driver(time.time())
    state = "done" if out.exists(commit.SUCCESS) else "running" if running else "incomplete"
    planned = output.plan.planned_sources
    return {
        "output": out.uri,
        "state": state,
        "shards_planned": len(output.plan.units),
        "shards_committed": len(committed),
        "samples_planned": None if planned is None else planned * output.spec.views,
        "samples_committed": sum(c.samples for c in counts),
        "quarantined": sum(c.quarantined for c in counts),
    }


def summary(output: Output) -> dict:
    table = manifests(output.location)
    errors = quarantine(output.location)
    return {
        **status(output),
        "labels": dict(Counter(table.column("label").to_pylist()).most_common()),
        "devices": dict(Counter(table.column("device").to_pylist())),
        "ops": op_statistics(table.column("ops").to_pylist(), table.num_rows),
        "quarantine_reasons": dict(
            Counter(
                f"{s}: {m}"
                for s, m in zip(
                    errors.column("stage").to_pylist(),
                    errors.column("message").to_pylist(),
                    strict=True,
                )
            ).most_common(20)
        ),
    }


def op_statistics(ops_json: list[str], samples: int) -> dict:
    """Per op: how often it was applied, and the range of each numeric parameter."""
    applied: Counter = Counter()
    values: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for record in ops_json:
        for step in json.loads(record):
            applied[step["op"]] += 1
            for name, value in _numbers(step["params"]):
                values[step["op"]][name].append(value)
    return {
        op: {
            "applied": count,
            "rate": round(count / samples, 4) if samples else 0.0,
            "params": {
                name: {"min": min(v), "max": max(v), "mean": sum(v) / len(v)}
                for name, v in sorted(values[op].items())
            },
        }
        for op, count in sorted(applied.items())
    }


def _numbers(params: dict) -> list[tuple[str, float]]:
    found = []
    for name, value in params.items():
        if isinstance(value, bool) or name == "noise_seed":
            continue
        if isinstance(value, int | float):
            found.append((name, float(value)))
        elif isinstance(value, list) and all(isinstance(v, int | float) for v in value):
            found += [(f"{name}[{i}]", float(v)) for i, v in enumerate(value)]
    return found


# ---------------------------------------------------------------- verification


def read_images(out: Location, spec: JobSpec, shard: str) -> dict[str, bytes]:
    """sample_id → encoded image of one data shard, read as an ordinary reader would."""
    data = out.read_bytes(data_path(spec.output, shard))
    if spec.output.format == "parquet":
        table = pq.read_table(io.BytesIO(data), columns=["sample_id", "image"])
        return dict(
            zip(
                table.column("sample_id").to_pylist(),
                table.column("image").to_pylist(),
                strict=True,
            )
        )
    members: dict[str, dict[str, bytes]] = defaultdict(dict)
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        for member in archive:
            stem, _, extension = member.name.partition(".")
            members[stem][extension] = archive.extractfile(member).read()
    image_ext = {"jpeg": "jpg", "png": "png", "webp": "webp"}[spec.output.image_format]
    return {json.loads(m["json"])["sample_id"]: m[image_ext] for m in members.values()}


def verify(output: Output) -> list[str]:
    """Every breach of the commit protocol; an empty list means the output is sound."""
    out, spec, plan = output.location, output.spec, output.plan
    committed = commit.committed_shards(out)
    breaches = [f"shard {u.shard} is not committed" for u in plan.units if u.shard not in committed]
    seen: Counter = Counter()
    planned = {u.shard: u.planned for u in plan.units}
    for shard in sorted(committed):
        breaches += _verify_shard(output, shard, planned.get(shard), seen)
    breaches += [f"sample {s} appears {n} times" for s, n in seen.items() if n > 1]
    keep = committed_objects(spec.output, committed)
    breaches += [f"orphan object {p}" for p in commit.orphans(out, keep)]
    if not out.exists(commit.SUCCESS):
        breaches.append("no _SUCCESS: the job has not finished")
    return breaches


def _verify_shard(output: Output, shard: str, planned: int | None, seen: Counter) -> list[str]:
    out, spec = output.location, output.spec
    if shard not in {u.shard for u in output.plan.units}:
        return [f"manifest {shard} is not part of the plan"]
    manifest = pq.read_table(io.BytesIO(out.read_bytes(commit.manifest_path(shard))))
    errors = _errors_of(out, shard)
    sources = int((manifest.schema.metadata or {}).get(SOURCES_KEY.encode(), b"-1"))
    breaches = []
    if planned is not None and sources != planned:
        breaches.append(f"shard {shard} read {sources} sources, planned {planned}")
    if manifest.num_rows + errors.num_rows != sources * spec.views:
        breaches.append(
            f"shard {shard}: {manifest.num_rows} samples + {errors.num_rows} "
            f"quarantined != {sources} sources x {spec.views} views"
        )
    seen.update(manifest.column("sample_id").to_pylist() + errors.column("sample_id").to_pylist())
    images = read_images(out, spec, shard)
    if len(images) != manifest.num_rows:
        breaches.append(
            f"shard {shard}: data holds {len(images)} images, manifest {manifest.num_rows}"
        )
    for sample, digest in zip(
        manifest.column("sample_id").to_pylist(), manifest.column("sha256").to_pylist(), strict=True
    ):
        image = images.get(sample)
        if image is None or hashlib.sha256(image).hexdigest() != digest:
            breaches.append(f"sample {sample}: bytes missing or sha256 mismatch")
    return breaches


# ---------------------------------------------------------------- contact sheet


def contact_sheet(output: Output, limit: int = 24, tile: int = 192) -> Image.Image:
    """A grid of the first `limit` samples, each captioned with its source and ops."""
    table = manifests(output.location).sort_by("sample_id").slice(0, limit)
    rows = table.to_pylist()
    images: dict[str, bytes] = {}
    for shard in sorted({r["shard"] for r in rows}):
        images |= read_images(output.location, output.spec, shard)
    columns = min(6, max(1, len(rows)))
    caption = 46
    sheet = Image.new(
        "RGB", (columns * tile, max(1, -(-len(rows) // columns)) * (tile + caption)), "white"
    )
    draw = ImageDraw.Draw(sheet)
    for i, row in enumerate(rows):
        x, y = (i % columns) * tile, (i // columns) * (tile + caption)
        picture = Image.open(io.BytesIO(images[row["sample_id"]])).convert("RGB")
        picture.thumbnail((tile - 4, tile - 4))
        sheet.paste(picture, (x + 2, y + 2))
        names = ",".join(step["op"] for step in json.loads(row["ops"]))
        text = f"{row['sample_id'][-30:]}\n{row['label'] or ''}\n{names[:34]}"
        draw.multiline_text((x + 2, y + tile), text, fill="black", spacing=1)
    return sheet


def find_row(out: Location, sample: str) -> dict:
    table = manifests(out)
    matches = table.filter(pc.equal(table.column("sample_id"), sample))
    if matches.num_rows == 0:
        raise UsageError(f"no committed sample {sample!r} in {out.uri}")
    return matches.to_pylist()[0]
