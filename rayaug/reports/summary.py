"""The summary of a committed output, and its verification against the commit protocol."""

from __future__ import annotations

import hashlib
import json
from collections import Counter, defaultdict

import pyarrow as pa

from rayaug import commit
from rayaug.formats import output_format
from rayaug.outputs import Output, errors_of, manifest_of, manifests, read_images, status_of
from rayaug.records import WorkUnit
from rayaug.sinks import SOURCES_KEY, orphans
from rayaug.sources import read_unit
from rayaug.storage import Location


def summary(output: Output, table: pa.Table, errors: pa.Table) -> dict:
    """Status, labels, devices, per-op statistics and the top quarantine reasons."""
    shards = len(commit.committed_shards(output.location))
    return {
        **status_of(output, shards, table.num_rows, errors.num_rows),  # counted from what was read
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


def applied_values(ops_json: list[str]) -> tuple[Counter, dict[str, dict[str, list[float]]]]:
    """How often each op was applied, and every value of each of its numeric parameters."""
    applied: Counter = Counter()
    values: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for record in ops_json:
        for step in json.loads(record):
            applied[step["op"]] += 1
            for name, value in _numbers(step["params"]):
                values[step["op"]][name].append(value)
    return applied, values


def op_statistics(ops_json: list[str], samples: int) -> dict:
    """Per op: how often it was applied, and the range of each numeric parameter."""
    applied, values = applied_values(ops_json)
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


def verify(output: Output) -> list[str]:
    """Every breach of the commit protocol; an empty list means the output is sound."""
    out, spec, plan = output.location, output.spec, output.plan
    committed = commit.committed_shards(out)
    breaches = [f"shard {u.shard} is not committed" for u in plan.units if u.shard not in committed]
    seen: Counter = Counter()
    units = {unit.shard: unit for unit in plan.units}
    for shard in sorted(committed):
        breaches += _verify_shard(output, shard, units.get(shard), seen)
    breaches += [f"sample {s} appears {n} times" for s, n in seen.items() if n > 1]
    breaches += [f"orphan object {p}" for p in orphans(out, spec.output, committed)]
    if not out.exists(commit.SUCCESS):
        breaches.append("no _SUCCESS: the job has not finished")
    else:
        breaches += output_format(spec.output.format).breaches(out, committed)
    return breaches


def _verify_shard(output: Output, shard: str, unit: WorkUnit | None, seen: Counter) -> list[str]:
    out, spec = output.location, output.spec
    if unit is None:
        return [f"manifest {shard} is not part of the plan"]
    planned, views = unit.planned, unit.view_count
    manifest = manifest_of(out, shard)
    errors = errors_of(out, shard)
    sources = int((manifest.schema.metadata or {}).get(SOURCES_KEY.encode(), b"-1"))
    breaches = []
    if planned is not None and sources != planned:
        breaches.append(f"shard {shard} read {sources} sources, planned {planned}")
    if manifest.num_rows + errors.num_rows != sources * views:
        breaches.append(
            f"shard {shard}: {manifest.num_rows} samples + {errors.num_rows} "
            f"quarantined != {sources} sources x {views} views"
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


def changed_sources(output: Output, source: Location) -> list[str]:
    """Each source whose bytes are no longer those the job read (its samples cannot replay to
    the same bytes), or that is gone: a change of the input, not a fault of the output."""
    table = manifests(output.location).select(["source_key", "source_sha256"])
    recorded = dict(zip(*(table.column(c).to_pylist() for c in table.column_names), strict=True))
    recorded = {key: digest for key, digest in recorded.items() if digest is not None}
    found = []
    for unit in output.plan.source_units:
        for sample in read_unit(source, output.spec.input, output.plan.format, unit):
            digest = recorded.pop(sample.key, None)
            if digest is None or sample.digest == digest:
                continue
            if sample.error is not None:
                found.append(f"source {sample.key} cannot be read now: {sample.error}")
            else:
                found.append(f"source {sample.key} changed since the job ran ({sample.uri})")
    return found + [f"source {key} is gone from the input" for key in sorted(recorded)]
