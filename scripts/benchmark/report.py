"""The report: the machine, one line per run, a table per recipe with the ratios rayaug ÷ each
peer (end to end / steady state) side by side over views and sizes, a summary against issue
17's targets, and everything as JSON. With several rounds, a ratio is the median over the
rounds of each round's ratio, and each round's is printed under it."""

from __future__ import annotations

import json
import platform
import statistics
import time
from dataclasses import asdict
from importlib import metadata
from pathlib import Path
from typing import Any

import psutil

from . import cores
from .measuring import Result
from .recipes import Recipe
from .runners import PEERS

# recipe, views, samples, runner: each round's run
Results = dict[str, dict[int, dict[int, dict[str, list[Result]]]]]
# recipe, views, samples, peer (as str): {"end_to_end": median, "steady_state": median,
# "rounds": [{"end_to_end": ..., "steady_state": ...} for each round, None where a run failed]}
Ratios = dict[str, dict[str, dict[str, dict[str, dict[str, Any]]]]]
MIN_COMMITS = 8  # fewer commits than this: the steady-state figure is noise (a note says so)
# Issue 17's targets, rayaug ÷ Albumentations, every recipe at every views (same run, same
# machine); stated at 20,000 samples, checked at every size run.
TARGETS = {"end_to_end": 1.0, "steady_state": 1.2}
TARGET_SAMPLES = 20_000
RATES = {"end_to_end": "samples_per_second", "steady_state": "steady_samples_per_second"}


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "-"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info(gpu_name: str | None) -> dict[str, Any]:
    packages = (
        "torch",
        "torchvision",
        "kornia",
        "ray",
        "pillow",
        "albumentations",
        "opencv-python-headless",
        "opencv-python",
        "pyarrow",
        "pydantic",
        "nvidia-dali-cuda120",
        "nvidia-dali-cuda110",
    )
    versions = {p: v for p in packages if (v := _version(p)) != "-"}
    return {
        "cpu": _cpu_model(),
        "cores": cores(),
        "ram_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "gpu": gpu_name,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "versions": versions,
    }


def print_machine(info: dict[str, Any]) -> None:
    print(
        f"machine: {info['cpu']}, {info['cores']} cores, {info['ram_gib']} GiB RAM"
        + (f", GPU {info['gpu']}" if info["gpu"] else ", no GPU")
    )
    print(f"python {info['python']} on {info['platform']}")
    print("versions: " + ", ".join(f"{k} {v}" for k, v in info["versions"].items()))


def _mib(value: int | None) -> str:
    return "-" if not value else f"{value / 2**20:,.0f}"


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def print_result(result: Result, round_number: int = 1, rounds: int = 1) -> None:
    if result.error:
        print(f"  {result.runner}: FAILED ({result.error})", flush=True)
    print(
        (f"  round {round_number}/{rounds}" if rounds > 1 else "")
        + f"  {result.recipe} {result.runner:15} views {result.views:<3} {result.samples:>7} "
        f"samples  {_num(result.samples_per_second):>8} samples/s end to end  "
        f"{_num(result.steady_samples_per_second):>8} steady  "
        f"start-up {_num(result.startup_seconds, 2):>6} s  "
        f"wall {_num(result.wall_seconds):>6} s  "
        f"PSS {_mib(result.peak_pss_bytes):>6} MiB",
        flush=True,
    )
    if not result.complete:
        print(
            f"  WARNING: {result.runner} produced {result.outputs} samples, expected "
            f"{result.samples}",
            flush=True,
        )


def _ratio(ours: float | None, theirs: float | None) -> float | None:
    return round(ours / theirs, 3) if ours and theirs else None


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(statistics.median(known), 3) if known else None


def peer_ratios(by_runner: dict[str, list[Result]]) -> dict[str, dict[str, Any]]:
    """rayaug ÷ each peer, end to end and in steady state: each round's (None where either
    run failed) and their median; no peer without a good round ({} without rayaug)."""
    ours = by_runner.get("rayaug", [])
    table: dict[str, dict[str, Any]] = {}
    for peer, theirs in by_runner.items() if ours else ():
        rounds = [_round_ratios(o, t) for o, t in zip(ours, theirs, strict=True)]
        if peer in PEERS and any(r["end_to_end"] is not None for r in rounds):
            table[peer] = {kind: _median([r[kind] for r in rounds]) for kind in RATES}
            table[peer]["rounds"] = rounds
    return table


def _round_ratios(ours: Result, theirs: Result) -> dict[str, float | None]:
    good = ours.good and theirs.good
    return {
        kind: _ratio(getattr(ours, rate), getattr(theirs, rate)) if good else None
        for kind, rate in RATES.items()
    }


def ratios(results: Results) -> Ratios:
    return {
        recipe: {
            str(views): {str(n): peer_ratios(by_runner) for n, by_runner in by_n.items()}
            for views, by_n in by_views.items()
        }
        for recipe, by_views in results.items()
    }


def targets(table: Ratios) -> dict[str, dict[str, bool | None]]:
    """Issue 17's targets against Albumentations, per recipe, at every views and size run:
    `<kind>_views_<V>_at_<N>_ge_<bound>`: True, False, or None (not measured)."""
    return {
        recipe: {
            f"{kind}_views_{views}_at_{n}_ge_{bound}": _at_least(
                cells.get("albumentations", {}).get(kind), bound
            )
            for views, by_n in by_views.items()
            for n, cells in by_n.items()
            for kind, bound in TARGETS.items()
        }
        for recipe, by_views in table.items()
    }


def _at_least(value: float | None, bound: float) -> bool | None:
    return None if value is None else value >= bound


def print_recipe(
    recipe: Recipe, by_views: dict[int, dict[int, dict[str, list[Result]]]], table: Ratios
) -> None:
    print(f"\n{recipe.headline()}")
    print(
        f"  {'runner':15} {'round':>5} {'views':>5} {'samples':>7} {'e2e sam/s':>10} {'steady':>9}"
        f" {'start-up s':>10} {'wall s':>8} {'RSS MiB':>8} {'PSS MiB':>8} {'procs':>5}  ok"
    )
    for views, by_n in by_views.items():
        for n, by_runner in by_n.items():
            for number, r in (x for runs in by_runner.values() for x in enumerate(runs, 1)):
                ok = "yes" if r.complete and not r.error else f"NO ({r.outputs}/{r.samples})"
                print(
                    f"  {r.runner:15} {number:>5} {views:>5} {n:>7} "
                    f"{_num(r.samples_per_second):>10} "
                    f"{_num(r.steady_samples_per_second):>9} "
                    f"{_num(r.startup_seconds, 2):>10} {_num(r.wall_seconds):>8} "
                    f"{_mib(r.peak_rss_bytes):>8} {_mib(r.peak_pss_bytes):>8} "
                    f"{r.peak_processes or 0:>5}  {ok}"
                )
    print_ratios(table.get(recipe.key, {}))


def print_ratios(by_views: dict[str, dict[str, dict[str, dict[str, Any]]]]) -> None:
    """rayaug ÷ peer, one column per (views, size), side by side; under each median of
    several rounds, each round's ratio."""
    columns = [(views, n) for views, by_n in by_views.items() for n in by_n]
    peers = [p for p in PEERS if any(p in by_views[v][n] for v, n in columns)]
    if not peers:
        print("  no ratios: rayaug and at least one peer must both run")
        return
    rounds = max(len(c["rounds"]) for v, n in columns for c in by_views[v][n].values())
    print(
        "  rayaug ÷ peer, end to end / steady state"
        + (f", the median of {rounds} rounds, then each round's:" if rounds > 1 else ":")
    )
    print(f"  {'peer':15}" + "".join(f" {f'V={v} N={n}':>18}" for v, n in columns))
    for peer in peers:
        cells = [by_views[v][n].get(peer, {}) for v, n in columns]
        print(f"  {peer:15}" + "".join(_pair(c) for c in cells))
        each = [c.get("rounds", []) for c in cells]
        for number in range(rounds) if rounds > 1 else ():
            print(
                f"  {f'  round {number + 1}':15}"
                + "".join(_pair(r[number] if number < len(r) else {}) for r in each)
            )


def _pair(cell: dict[str, Any]) -> str:
    return f" {_num(cell.get('end_to_end'), 2):>9} / {_num(cell.get('steady_state'), 2):<6}"


def print_summary(results: Results, table: Ratios, verdicts: dict) -> None:
    few = sorted(
        {
            f"{r.recipe}/{r.runner}/views {r.views}/N={r.samples}"
            for r in _every(results)
            if r.commits < MIN_COMMITS
        }
    )
    if few:
        print(
            f"\nnote: under {MIN_COMMITS} commits, steady state is noise, not a rate "
            f"({len(few)} runs, e.g. {few[0]}): use more samples (shards of up to 256 "
            "sources, V samples each)"
        )
    if not any(r.samples == TARGET_SAMPLES for r in _every(results)):
        print(
            f"note: issue 17 states its targets at {TARGET_SAMPLES:,} samples (--n "
            f"{TARGET_SAMPLES}); these are checked at the sizes run"
        )
    print(
        "\nsummary: rayaug ÷ Albumentations (end to end / steady state), rayaug ÷ floor "
        "(end to end), rayaug start-up s (medians where several rounds ran); targets "
        + ", ".join(f"{kind} ≥ {bound}" for kind, bound in TARGETS.items())
    )
    print(
        f"  {'recipe':7} {'views':>5} {'samples':>7} {'albu e2e / steady':>19} {'floor':>6}"
        f" {'start':>6}  targets"
    )
    for recipe, by_views in results.items():
        for views, by_n in by_views.items():
            for n, by_runner in by_n.items():
                cells = table[recipe][str(views)][str(n)]
                albu, floor = cells.get("albumentations", {}), cells.get("floor", {})
                starts = [r.startup_seconds for r in by_runner.get("rayaug", [])]
                print(
                    f"  {recipe:7} {views:>5} {n:>7} {_num(albu.get('end_to_end'), 2):>9} / "
                    f"{_num(albu.get('steady_state'), 2):<7} "
                    f"{_num(floor.get('end_to_end'), 2):>6} "
                    f"{_num(_median(starts)):>6}  "
                    f"{_verdict(verdicts[recipe], views, n)}"
                )


def _verdict(verdict: dict[str, bool | None], views: int, n: int) -> str:
    mine = {k: v for k, v in verdict.items() if f"_views_{views}_at_{n}_" in k}
    measured = [v for v in mine.values() if v is not None]
    if not measured:
        return "-"
    if all(measured):
        return "met"
    return "NOT met: " + ", ".join(k.split("_views_")[0] for k, v in mine.items() if v is False)


def _every(results: Results) -> list[Result]:
    return [
        r
        for by_views in results.values()
        for by_n in by_views.values()
        for by_runner in by_n.values()
        for runs in by_runner.values()
        for r in runs
    ]


def failed(results: Results) -> bool:
    return any(r.error or not r.complete for r in _every(results))


def report_json(
    path: Path,
    info: dict[str, Any],
    config: dict[str, Any],
    results: Results,
    table: Ratios,
    verdicts: dict,
) -> None:
    document = {
        "schema": 5,
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": info,
        "config": config,
        "results": {
            recipe: {
                str(views): {
                    str(n): {name: [asdict(r) for r in runs] for name, runs in rs.items()}
                    for n, rs in by_n.items()
                }
                for views, by_n in by_views.items()
            }
            for recipe, by_views in results.items()
        },
        "ratios": table,
        "targets": verdicts,
    }
    path.write_text(json.dumps(document, indent=2) + "\n")
    print(f"wrote {path}")
