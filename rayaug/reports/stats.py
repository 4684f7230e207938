"""Statistics for audits (per-op rates and parameter histograms, label balance) and their plot."""

from __future__ import annotations

from collections import Counter

import pyarrow as pa

from rayaug.formats import input_format
from rayaug.outputs import Output
from rayaug.reports.summary import applied_values
from rayaug.spec import JobSpec


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
    applied, values = applied_values(ops_json)
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

    Sources: the labels the input listing tells (an image folder: every planned file's
    sub-folder); else the distinct source keys of the manifest and the quarantine (a source
    quarantined in every view has no known label: `null`). `kept` is samples / (sources x views).
    """
    views = output.spec.views
    listed = input_format(output.plan.format).listed_labels(output.plan.source_units)
    if listed is not None:
        before = Counter(listed)
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
