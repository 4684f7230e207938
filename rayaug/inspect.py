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

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from PIL import Image, ImageDraw

from rayaug import commit
from rayaug.errors import UsageError
from rayaug.plan import JobPlan, recorded_spec
from rayaug.sinks import (
    ERRORS_SCHEMA,
    MANIFEST_SCHEMA,
    SOURCES_KEY,
    ShardCommit,
    committed_objects,
    data_path,
)
from rayaug.spec import JobSpec
from rayaug.storage import Location


@dataclass(frozen=True)
class Output:
    """An output prefix with its recorded job."""

    location: Location
    spec: JobSpec
    plan: JobPlan


def open_output(out: Location) -> Output:
    spec = recorded_spec(out)
    plan = commit.read_json(out, commit.PLAN)
    if plan is None:
        raise UsageError(
            f"{out.uri} was stopped while planning (no {commit.PLAN}): run "
            f"`rayaug resume {out.uri}` to finish it"
        )
    return Output(out, spec, JobPlan.from_json(plan))


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
    committed = commit.committed_shards(output.location)
    counts = shard_commits(output.location, committed)
    samples, quarantined = sum(c.samples for c in counts), sum(c.quarantined for c in counts)
    return _status(output, len(committed), samples, quarantined)


def _status(output: Output, shards: int, samples: int, quarantined: int) -> dict:
    out = output.location
    lock = commit.read_json(out, commit.LOCK)
    running = lock is not None and commit.LeaseRecord(**lock).held_by_live_driver(time.time())
    state = "done" if out.exists(commit.SUCCESS) else "running" if running else "incomplete"
    planned = output.plan.planned_sources
    return {
        "output": out.uri,
        "state": state,
        "shards_planned": len(output.plan.units),
        "shards_committed": shards,
        "samples_planned": None if planned is None else planned * output.spec.views,
        "samples_committed": samples,
        "quarantined": quarantined,
    }


def committed_tables(output: Output) -> tuple[pa.Table, pa.Table]:
    """Every committed manifest row and quarantine row: read once, shared by the reports."""
    return manifests(output.location), quarantine(output.location)


def summary(output: Output, table: pa.Table, errors: pa.Table) -> dict:
    shards = len(commit.committed_shards(output.location))
    return {
        **_status(output, shards, table.num_rows, errors.num_rows),  # counted from what was read
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


def _applied_values(ops_json: list[str]) -> tuple[Counter, dict[str, dict[str, list[float]]]]:
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
    applied, values = _applied_values(ops_json)
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


def read_images(out: Location, spec: JobSpec, shard: str, masks: bool = False) -> dict[str, bytes]:
    """sample_id → encoded image (or mask PNG) of one data shard, read as an ordinary reader
    would: the Parquet column, or the WebDataset member."""
    data = out.read_bytes(data_path(spec.output, shard))
    if spec.output.format == "parquet":
        column = "mask" if masks else "image"
        table = pq.read_table(io.BytesIO(data), columns=["sample_id", column])
        pairs = zip(
            table.column("sample_id").to_pylist(), table.column(column).to_pylist(), strict=True
        )
        return {sample: value for sample, value in pairs if value is not None}
    suffix = "mask.png" if masks else spec.output.extension
    members: dict[str, dict[str, bytes]] = defaultdict(dict)
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        for member in archive:
            stem, _, extension = member.name.partition(".")
            members[stem][extension] = archive.extractfile(member).read()
    return {json.loads(m["json"])["sample_id"]: m[suffix] for m in members.values() if suffix in m}


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
    """A grid of samples spread over the output, each captioned with its source and ops, with
    its boxes, keypoints and mask drawn on it (labels must sit on their objects)."""
    table = manifests(output.location).sort_by("sample_id")
    picks = sorted({int(i) for i in np.linspace(0, max(table.num_rows - 1, 0), limit)})
    rows = table.take(picks).to_pylist() if table.num_rows else []
    images: dict[str, bytes] = {}
    masks: dict[str, bytes] = {}
    for shard in sorted({r["shard"] for r in rows}):
        images |= read_images(output.location, output.spec, shard)
        masks |= read_images(output.location, output.spec, shard, masks=True)
    columns = min(6, max(1, len(rows)))
    caption = 46
    sheet = Image.new(
        "RGB", (columns * tile, max(1, -(-len(rows) // columns)) * (tile + caption)), "white"
    )
    draw = ImageDraw.Draw(sheet)
    for i, row in enumerate(rows):
        x, y = (i % columns) * tile, (i // columns) * (tile + caption)
        picture = _annotated(images[row["sample_id"]], masks.get(row["sample_id"]), row)
        picture.thumbnail((tile - 4, tile - 4))
        sheet.paste(picture, (x + 2, y + 2))
        names = ",".join(step["op"] for step in json.loads(row["ops"]))
        text = f"{row['sample_id'][-30:]}\n{row['label'] or ''}\n{names[:34]}"
        draw.multiline_text((x + 2, y + tile), text, fill="black", spacing=1)
    return sheet


def _annotated(image: bytes, mask: bytes | None, row: dict) -> Image.Image:
    """The sample with its mask tinted, boxes outlined and visible keypoints dotted."""
    picture = Image.open(io.BytesIO(image)).convert("RGB")
    if mask is not None:
        ids = np.asarray(Image.open(io.BytesIO(mask)).convert("L"))
        tint = Image.new("RGB", picture.size, (0, 160, 255))
        picture = Image.composite(
            tint, picture, Image.fromarray(np.where(ids > 0, 110, 0).astype(np.uint8))
        )
    targets = json.loads(row["targets"]) if row.get("targets") else {}
    draw = ImageDraw.Draw(picture)
    for box in targets.get("boxes", []):
        draw.rectangle(box, outline=(255, 230, 0), width=2)
    for kx, ky, visibility in targets.get("keypoints", []):
        if visibility > 0:
            draw.ellipse((kx - 3, ky - 3, kx + 3, ky + 3), fill=(255, 0, 200))
    return picture


def find_row(out: Location, sample: str) -> dict:
    table = manifests(out)
    matches = table.filter(pc.equal(table.column("sample_id"), sample))
    if matches.num_rows == 0:
        raise UsageError(f"no committed sample {sample!r} in {out.uri}")
    return matches.to_pylist()[0]


# ---------------------------------------------------------------- SQL over the manifest

# One row per applied op of every sample: position in its ops list, name, drawn params (JSON).
APPLIED_OPS_VIEW = """
CREATE VIEW applied_ops AS
SELECT m.sample_id, m.source_key, m.view, m.label,
       CAST(o.key AS INTEGER) AS position,
       o.value ->> 'op' AS op,
       o.value -> 'params' AS params
FROM manifest AS m, json_each(m.ops) AS o
"""


# Manifest columns that hold JSON text: typed JSON in SQL, so `->` and `->>` apply directly.
_JSON_COLUMNS = ("ops", "targets")


@dataclass(frozen=True)
class QueryResult:
    columns: list[str]
    rows: list[tuple]
    truncated: bool  # more rows than max_rows were produced


def query(out: Location, sql: str, max_rows: int | None = None) -> QueryResult:
    """Run `sql` with DuckDB over the committed output.

    Tables: `manifest` (the manifest rows; `ops`, `targets` typed JSON), `errors` (the
    quarantine) and the view `applied_ops` (sample_id, source_key, view, label, position, op,
    params JSON).
    A bad query raises UsageError with DuckDB's message on one line.
    """
    import duckdb

    if not sql.strip():
        raise UsageError("empty query")
    # No replacement scans: an unknown table name must not resolve to a Python variable here.
    con = duckdb.connect(config={"python_enable_replacements": False})
    try:
        _register(con, manifests(out), quarantine(out))
        cursor = con.execute(sql)
        if cursor.description is None:  # a statement without a result (SET, CREATE ...)
            return QueryResult([], [], False)
        columns = [d[0] for d in cursor.description]
        rows = cursor.fetchall() if max_rows is None else cursor.fetchmany(max_rows + 1)
    except duckdb.Error as error:
        raise UsageError(f"query failed: {_one_line(str(error))}") from None
    finally:
        con.close()
    truncated = max_rows is not None and len(rows) > max_rows
    return QueryResult(columns, rows[:max_rows] if truncated else rows, truncated)


def _register(con, manifest: pa.Table, errors: pa.Table) -> None:
    con.register("_manifest_arrow", manifest)
    con.register("_errors_arrow", errors)
    as_json = ", ".join(f"{c}::JSON AS {c}" for c in _JSON_COLUMNS if c in manifest.column_names)
    replace = f" REPLACE ({as_json})" if as_json else ""
    con.execute(f"CREATE VIEW manifest AS SELECT *{replace} FROM _manifest_arrow")
    con.execute("CREATE VIEW errors AS SELECT * FROM _errors_arrow")
    con.execute(APPLIED_OPS_VIEW)


def _one_line(message: str) -> str:
    """DuckDB's message without its source excerpt ('LINE 1: ...' and the caret line)."""
    head = message.split("\n\nLINE ", 1)[0]
    return " ".join(line.strip() for line in head.splitlines() if line.strip())


# ---------------------------------------------------------------- statistics for audits


def statistics(output: Output, table: pa.Table, errors: pa.Table, bins: int = 10) -> dict:
    """Per-op application rates with parameter histograms, and label balance before/after."""
    samples = table.num_rows
    return {
        "samples": samples,
        "quarantined": errors.num_rows,
        "ops": _op_histograms(table.column("ops").to_pylist(), samples, output.spec, bins),
        "labels": label_balance(output, table, errors),
    }


def _expected_rates(spec: JobSpec) -> dict[str, float]:
    """The spec's probability of each op that appears once in the pipeline under its own name."""
    pairs = [(getattr(op, "name", None), getattr(op, "p", None)) for op in spec.pipeline()]
    names = Counter(name for name, _ in pairs)
    return {
        name: float(p)
        for name, p in pairs
        if name is not None and names[name] == 1 and isinstance(p, float | int)
    }


def _op_histograms(ops_json: list[str], samples: int, spec: JobSpec, bins: int) -> dict:
    applied, values = _applied_values(ops_json)
    expected = _expected_rates(spec)
    # Ops of the spec that no sample got are listed too: a rate of 0 is a finding.
    names = list(dict.fromkeys([*(getattr(op, "name", "") for op in spec.pipeline()), *applied]))
    return {
        op: {
            "applied": applied[op],
            "rate": round(applied[op] / samples, 4) if samples else 0.0,
            "expected_rate": expected.get(op),
            "params": {name: _histogram(v, bins) for name, v in sorted(values[op].items())},
        }
        for op in names
        if op
    }


def _histogram(values: list[float], bins: int) -> dict:
    """min/max/mean and `bins` equal-width counts over [min, max] (one bin if constant)."""
    import numpy as np

    array = np.asarray(values, dtype=np.float64)
    low, high = float(array.min()), float(array.max())
    counts, edges = np.histogram(array, bins=bins if high > low else 1)
    return {
        "count": len(values),
        "min": low,
        "max": high,
        "mean": float(array.mean()),
        "edges": [float(e) for e in edges],
        "counts": [int(c) for c in counts],
    }


def label_balance(output: Output, table: pa.Table, errors: pa.Table) -> dict:
    """Class counts of the source images (before) against those of the output samples (after).

    Sources: for an image folder, every planned file's sub-folder (the input listing); else the
    distinct source keys of the manifest and the quarantine (a source quarantined in every view
    has no known label: `null`). `kept` is samples / (sources x views).
    """
    views = output.spec.views
    if output.plan.format == "folder":
        files = [path for unit in output.plan.units for path in unit.files]
        before = Counter(path.split("/", 1)[0] if "/" in path else None for path in files)
        basis = "folder labels of the input listing"
    else:
        before = _source_labels(table, errors)
        basis = "source keys in manifests and quarantine"
    after = Counter(table.column("label").to_pylist())
    sources, samples = sum(before.values()), sum(after.values())
    soft = _soft_label_mass(table)
    classes = [
        {
            "label": label,
            "sources": before[label],
            "source_share": round(before[label] / sources, 4) if sources else 0.0,
            "samples": after[label],
            "sample_share": round(after[label] / samples, 4) if samples else 0.0,
            "kept": round(after[label] / (before[label] * views), 4) if before[label] else None,
        }
        | ({"soft_share": round(soft[label] / samples, 4)} if soft else {})
        for label in sorted(set(before) | set(after), key=lambda x: (x is None, str(x)))
    ]
    return {
        "basis": basis,
        "views": views,
        "sources": sources,
        "samples": samples,
        "mixed": bool(soft),
        "classes": classes,
    }


def _soft_label_mass(table: pa.Table) -> Counter:
    """Each label's share of the training signal once mixes are counted (a mixed sample gives
    each of its labels its weight; an unmixed one gives its label 1); empty without mixes."""
    if "soft_label" not in table.column_names:  # written before mixes existed
        return Counter()
    soft_labels = table.column("soft_label")
    if soft_labels.null_count == len(soft_labels):
        return Counter()
    mass: Counter = Counter()
    for label, soft in zip(table.column("label").to_pylist(), soft_labels.to_pylist(), strict=True):
        for entry in soft or [{"label": label, "weight": 1.0}]:
            mass[entry["label"]] += entry["weight"]
    return mass


def _source_labels(table: pa.Table, errors: pa.Table) -> Counter:
    labels: dict[str, str | None] = {}
    for key in errors.column("source_key").to_pylist():
        labels.setdefault(key, None)
    for key, label in zip(
        table.column("source_key").to_pylist(), table.column("label").to_pylist(), strict=True
    ):
        labels[key] = label
    return Counter(labels.values())


def plot_statistics(stats: dict, path: str) -> None:
    """A PNG: op application rates, one histogram per varying parameter, label balance."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        (op, name, hist)
        for op, entry in stats["ops"].items()
        for name, hist in entry["params"].items()
        if hist["max"] > hist["min"]
    ]
    columns = 4
    rows = -(-len(panels) // columns) + 2
    figure = plt.figure(figsize=(4 * columns, 2.6 * rows + 0.6), layout="constrained")
    grid = figure.add_gridspec(rows, columns)
    _plot_rates(figure.add_subplot(grid[0, :]), stats["ops"])
    for i, (op, name, hist) in enumerate(panels):
        axes = figure.add_subplot(grid[1 + i // columns, i % columns])
        axes.stairs(hist["counts"], hist["edges"], fill=True, color="tab:blue", alpha=0.8)
        axes.set_title(f"{op}.{name}  (n={hist['count']})", fontsize=9)
        axes.set_ylabel("samples", fontsize=8)
        axes.tick_params(labelsize=8)
    _plot_labels(figure.add_subplot(grid[rows - 1, :]), stats["labels"])
    figure.suptitle(
        f"rayaug: {stats['samples']} samples, {stats['quarantined']} quarantined", fontsize=11
    )
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _plot_rates(axes, ops: dict) -> None:
    import numpy as np
    from matplotlib.ticker import PercentFormatter

    names = list(ops)
    x = np.arange(len(names))
    expected = [ops[n]["expected_rate"] for n in names]
    axes.bar(x - 0.2, [ops[n]["rate"] for n in names], 0.4, label="applied")
    axes.bar(x + 0.2, [np.nan if e is None else e for e in expected], 0.4, label="spec p")
    axes.set_xticks(x, names, rotation=15, ha="right", fontsize=8)
    axes.yaxis.set_major_formatter(PercentFormatter(1.0))
    axes.set_title("op application rate", fontsize=9)
    axes.legend(fontsize=8)


def _plot_labels(axes, labels: dict, limit: int = 40) -> None:
    import numpy as np
    from matplotlib.ticker import PercentFormatter

    classes = sorted(labels["classes"], key=lambda c: -c["sources"])[:limit]
    x = np.arange(len(classes))
    axes.bar(x - 0.2, [c["source_share"] for c in classes], 0.4, label="sources (before)")
    axes.bar(x + 0.2, [c["sample_share"] for c in classes], 0.4, label="samples (after)")
    axes.set_xticks(x, [str(c["label"]) for c in classes], rotation=30, ha="right", fontsize=8)
    axes.yaxis.set_major_formatter(PercentFormatter(1.0))
    axes.set_ylabel("share of all")
    more = len(labels["classes"]) - len(classes)
    suffix = f" (top {limit} of {len(labels['classes'])})" if more > 0 else ""
    axes.set_title(f"label balance{suffix}", fontsize=9)
    axes.legend(fontsize=8)
