"""The `rayaug` command: the only place that prints and picks exit codes.

Exit codes: 0 done, 1 the job failed, 2 a usage or spec error.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from rayaug.errors import RayaugError, SpecError
from rayaug.spec import StorageSpec, load_spec

if TYPE_CHECKING:
    from rayaug.api import OutputView
    from rayaug.job import JobSummary

console = Console(stderr=True, soft_wrap=True)
out_console = Console(highlight=False, soft_wrap=True)


class _Group(click.Group):
    """Turns rayaug's own errors into one line and their exit code, never a traceback."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except SpecError as error:  # one self-contained line per problem
            for message in error.messages:
                _report("invalid job spec", f"{error.source}: {message}")
            sys.exit(error.exit_code)
        except RayaugError as error:
            _report("error:", str(error))
            sys.exit(error.exit_code)


def _report(prefix: str, message: str) -> None:
    """One line on stderr: the message's own line breaks (YAML's, a server's) are folded, and
    nothing in it is read as rich markup (a path may hold brackets such as `[/]`)."""
    line = re.sub(r"\s*\n\s*", " ", message.strip())
    console.print(Text.assemble((prefix, "red"), " ", line), highlight=False)


@click.group(cls=_Group)
@click.version_option(package_name="rayaug")
@click.option("-v", "--verbose", is_flag=True, help="Log retries and Ray's own messages.")
def main(verbose: bool) -> None:
    """Offline image augmentation as a resumable Ray Data job."""
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )


def entry() -> None:
    """The `rayaug` console script: `main`, then an exit without Python's module teardown.

    After a run, the interpreter's teardown of Ray's modules (the native state of its core
    worker and gRPC) kept the shell waiting 0.3–0.5 s on a finished job. By then everything
    rayaug writes is committed and closed, Ray is shut down, and only the main thread is left;
    the atexit handlers (Ray's, logging's) and the flush of stdout and stderr still run. With
    another thread still going, the exit is Python's own, which waits for it.
    """
    try:
        main()
        code = 0
    except SystemExit as done:
        code = _exit_code(done.code)
    if any(
        t.is_alive() and not t.daemon
        for t in threading.enumerate()
        if t is not threading.main_thread()
    ):
        sys.exit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except OSError:  # a closed pipe: Python's own exit reports it with status 120
            code = code or 120
    os._exit(code)


def _exit_code(code: object) -> int:
    """sys.exit's argument as a process's exit status: None is 0, a message is 1 (printed)."""
    if code is None or isinstance(code, int):
        return code or 0
    print(code, file=sys.stderr)
    return 1


def _endpoint_option(command):
    return click.option("--endpoint", help="S3 endpoint (else the spec's, or AWS_ENDPOINT_URL).")(
        command
    )


class _LiveProgress:
    """A progress bar of committed samples over planned, with images/s."""

    def __init__(self) -> None:
        self.bar = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]}"),
            TimeElapsedColumn(),
            console=console,
            transient=False,
            refresh_per_second=2,  # the driver shares its CPU with the workers
        )
        self.task = None
        self.tally = None  # the job's count of committed shards, once it has one
        self.start_time = time.monotonic()

    def started(self, tally) -> None:
        self.tally = tally
        self.bar.start()
        done = tally.samples + tally.quarantined
        self.task = self.bar.add_task(
            "samples", total=tally.planned_samples, completed=done, rate=""
        )
        self.start_time = time.monotonic()

    def committed(self, tally) -> None:
        self.tally = tally  # a recount after the run stopped is a new tally
        rate = tally.new_samples / max(time.monotonic() - self.start_time, 1e-6)
        self.bar.update(
            self.task, completed=tally.samples + tally.quarantined, rate=f"{rate:,.1f} img/s"
        )

    def stop(self) -> None:
        """A bar that never started prints nothing (rich's stop would print an empty line
        before the one-line error of a run refused before it started)."""
        if self.task is not None:
            self.bar.stop()


def _run(start: Callable[[_LiveProgress], JobSummary], out_uri: str, as_json: bool) -> None:
    """Run `start(progress)` (a call of the API) with a progress bar; print its summary."""
    progress = _LiveProgress()
    try:
        summary = start(progress)
    except KeyboardInterrupt:
        # run_job has shut its Ray down and released the lease on the way out; what is
        # committed stays (click would print a bare "Aborted!").
        progress.stop()
        # A lower bound: a writer may commit as the driver stops, before its row arrives.
        shards = progress.tally.shards if progress.tally is not None else 0
        _report(
            "interrupted:",
            f"every committed shard is kept ({shards} counted before the stop); "
            f"`rayaug resume {out_uri}` finishes the job",
        )
        sys.exit(130)
    finally:
        progress.stop()
    if as_json:
        click.echo(json.dumps(summary.to_json(), indent=2))
        return
    tally = summary.tally
    out_console.print(
        f"done: {tally.samples} samples in {tally.shards} shards, {tally.quarantined} quarantined; "
        f"{tally.new_samples} this run in {summary.wall_seconds:.1f}s "
        f"({summary.throughput:,.1f} samples/s, start-up {summary.startup_seconds:.1f}s)"
    )
    if summary.ignored_inputs:
        out_console.print(f"note: {summary.ignored_inputs} input files were not images; ignored")
    out_console.print(f"output: {summary.output}\ninspect: rayaug inspect {summary.output}")


@main.command()
@click.argument("job_file", type=click.Path(dir_okay=False))
@click.option("--address", help="Ray cluster address (default: an embedded local Ray).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def run(job_file: str, address: str | None, as_json: bool) -> None:
    """Run JOB_FILE (resuming if its output already holds this job)."""
    from rayaug import api

    spec = load_spec(job_file)
    _run(
        lambda progress: api.run(spec, address=address, progress=progress), spec.output.uri, as_json
    )


@main.command()
@click.argument("job_file", type=click.Path(dir_okay=False))
def validate(job_file: str) -> None:
    """Check JOB_FILE without running it."""
    spec = load_spec(job_file)
    ops = ", ".join(op.name for op in spec.pipeline())
    out_console.print(f"{job_file}: valid (version {spec.version}); {spec.views} views; ops: {ops}")


def _output(out_uri: str, endpoint: str | None) -> OutputView:
    from rayaug.api import open_output

    return open_output(out_uri, _storage(endpoint))


def _storage(endpoint: str | None) -> StorageSpec | None:
    """--endpoint replaces the recorded job's endpoint (its other storage settings stay)."""
    return None if endpoint is None else StorageSpec(endpoint=endpoint)


@main.command()
@click.argument("out_uri")
@click.option("--address", help="Ray cluster address (default: an embedded local Ray).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@_endpoint_option
def resume(out_uri: str, address: str | None, as_json: bool, endpoint: str | None) -> None:
    """Finish the job recorded in OUT_URI, processing only uncommitted shards."""
    from rayaug import api

    def start(progress: _LiveProgress) -> JobSummary:
        return api.resume(out_uri, storage=_storage(endpoint), address=address, progress=progress)

    _run(start, out_uri, as_json)


@main.command()
@click.argument("out_uri")
@click.option("--views", type=click.IntRange(min=1), help="Views of every source from now on.")
@click.option("--address", help="Ray cluster address (default: an embedded local Ray).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@_endpoint_option
def extend(
    out_uri: str, views: int | None, address: str | None, as_json: bool, endpoint: str | None
) -> None:
    """Grow the job in OUT_URI: more views of every source, and the input's new files.

    Only the new samples are made, as new shards; nothing committed is rewritten."""
    from rayaug import api

    def start(progress: _LiveProgress) -> JobSummary:
        storage = _storage(endpoint)
        return api.extend(out_uri, views=views, storage=storage, address=address, progress=progress)

    _run(start, out_uri, as_json)


@main.command()
@click.argument("out_uri")
@click.option("--json", "as_json", is_flag=True)
@_endpoint_option
def status(out_uri: str, as_json: bool, endpoint: str | None) -> None:
    """Planned, committed and quarantined samples, and whether the job runs or is done."""
    report = _output(out_uri, endpoint).status()
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    for key, value in report.items():
        out_console.print(f"{key:18} {value}")


@main.command(name="inspect")
@click.argument("out_uri")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable summary.")
@click.option("--sheet", type=click.Path(dir_okay=False), help="Write a contact sheet PNG.")
@click.option("--limit", default=24, show_default=True, help="Samples on the contact sheet.")
@click.option(
    "--verify",
    is_flag=True,
    help="Check the commit protocol and that every source is still the one read; exit 1 if not.",
)
@click.option(
    "--query", "sql", help="Run SQL (DuckDB) over tables manifest, errors and view applied_ops."
)
@click.option(
    "--max-rows",
    default=1000,
    show_default=True,
    type=click.IntRange(min=0),
    help="Rows of a --query result to print (0: all).",
)
@click.option("--stats", is_flag=True, help="Op rates, parameter histograms, label balance.")
@click.option("--plot", type=click.Path(dir_okay=False), help="Write the --stats plots as a PNG.")
@_endpoint_option
def inspect_command(
    out_uri: str,
    as_json: bool,
    sheet: str | None,
    limit: int,
    verify: bool,
    sql: str | None,
    max_rows: int,
    stats: bool,
    plot: str | None,
    endpoint: str | None,
) -> None:
    """Summary of OUT_URI: samples, labels, per-op statistics, quarantine.

    With --query, only the query's result (a table, or --json); with --stats (or --plot),
    histograms of every drawn parameter and the label balance before and after.
    """
    if sql is not None and (stats or plot or sheet or verify):
        raise click.UsageError("--query cannot be combined with --stats, --plot, --sheet, --verify")
    view = _output(out_uri, endpoint)
    if sql is not None:
        _print_query(view.query(sql, max_rows or None), as_json)
        return
    report = view.summary(stats=stats or bool(plot))
    if plot:
        from rayaug.reports.stats import plot_statistics

        plot_statistics(report["stats"], plot)
        report["plot"] = str(Path(plot))
    if verify:
        report["breaches"] = view.verify()
        report["sources_changed"] = view.changed_sources()
    if sheet:
        view.contact_sheet(limit).save(sheet)
        report["sheet"] = str(Path(sheet))
    if as_json:
        click.echo(json.dumps(report, indent=2, default=str))
    else:
        _print_summary(report)
    if verify and (report["breaches"] or report["sources_changed"]):
        sys.exit(1)


def _print_summary(report: dict) -> None:
    for key in ("output", "state", "shards_committed", "samples_committed", "quarantined"):
        out_console.print(f"{key:18} {report[key]}")
    labels = ", ".join(f"{k}: {v}" for k, v in list(report["labels"].items())[:12])
    out_console.print(f"{'labels':18} {labels}")
    if "stats" in report:
        _print_stats(report["stats"])
    else:
        table = Table(title="ops", show_edge=False)
        for column in ("op", "applied", "rate", "parameter ranges"):
            table.add_column(column)
        for name, stats in report["ops"].items():
            ranges = "; ".join(
                f"{p} {v['min']:.3g}..{v['max']:.3g}" for p, v in stats["params"].items()
            )
            table.add_row(name, str(stats["applied"]), f"{stats['rate']:.2f}", ranges)
        out_console.print(table)
    for reason, count in report["quarantine_reasons"].items():
        out_console.print(f"quarantined ×{count}: {reason}", markup=False)
    if "plot" in report:
        out_console.print(f"plot: {report['plot']}")
    if "sheet" in report:
        out_console.print(f"contact sheet: {report['sheet']}")
    if "breaches" in report:
        verdict = "verify: OK" if not report["breaches"] else "verify: FAILED"
        out_console.print(verdict)
        for breach in report["breaches"]:
            out_console.print(f"  {breach}", markup=False)
        if report["sources_changed"]:
            out_console.print(
                f"sources: {len(report['sources_changed'])} changed since the job ran (their "
                "samples no longer replay to the stored bytes; the output itself is as written)"
            )
        for change in report["sources_changed"]:
            out_console.print(f"  {change}", markup=False)


_BLOCKS = " ▁▂▃▄▅▆▇█"


def _sparkline(counts: list[int]) -> str:
    """One character per bin, its height proportional to the count (any non-zero bin shows)."""
    top = max(counts) or 1
    steps = len(_BLOCKS) - 1
    return "".join(_BLOCKS[-(-c * steps // top)] for c in counts)


def _print_stats(stats: dict) -> None:
    samples = stats["samples"]
    out_console.print(
        "ops: applied / samples, rate (the spec's p); parameters: min ▕histogram▏ max",
        markup=False,
    )
    width = max([len(op) for op in stats["ops"]] + [0])
    pad = max([len(p) for e in stats["ops"].values() for p in e["params"]] + [0])
    for op, entry in stats["ops"].items():
        p = "" if entry["expected_rate"] is None else f" (p {entry['expected_rate']:.2f})"
        out_console.print(
            f"  {op:{width}} {entry['applied']:>7}/{samples} {entry['rate']:6.1%}{p}", markup=False
        )
        for name, hist in entry["params"].items():
            out_console.print(f"      {name:{pad}} {_histogram_line(hist)}", markup=False)
    _print_labels(stats["labels"])


def _histogram_line(hist: dict) -> str:
    if hist["max"] == hist["min"]:
        return f"{hist['min']:>9.4g}  (constant)"
    bars = _sparkline(hist["counts"])
    return f"{hist['min']:>9.4g} ▕{bars}▏ {hist['max']:<9.4g} mean {hist['mean']:.4g}"


def _print_labels(labels: dict, limit: int = 30) -> None:
    out_console.print(
        f"labels: sources ({labels['basis']}) vs output samples; "
        f"kept = samples / (sources × {labels['views']} views)",
        markup=False,
    )
    table = Table(show_edge=False)
    columns = ["label", "sources", "share", "samples", "share", "kept"]
    if labels["mixed"]:  # after mix ops, what each class weighs in the soft labels
        columns.append("soft share")
    for column in columns:
        table.add_column(column, justify="left" if column == "label" else "right")
    classes = labels["classes"]
    # Most skewed first when there are many classes, so the rows shown are the ones to look at.
    if len(classes) > limit:
        classes = sorted(classes, key=lambda c: -abs(c["sample_share"] - c["source_share"]))
    for c in classes[:limit]:
        kept = "" if c["kept"] is None else f"{c['kept']:.0%}"
        table.add_row(
            Text(str(c["label"])),
            str(c["sources"]),
            f"{c['source_share']:.1%}",
            str(c["samples"]),
            f"{c['sample_share']:.1%}",
            kept,
            *([f"{c['soft_share']:.1%}"] if labels["mixed"] else []),
        )
    out_console.print(table)
    if len(classes) > limit:
        out_console.print(f"… {len(classes) - limit} more labels (--json lists every one)")


def _print_query(result, as_json: bool) -> None:
    if as_json:
        rows = [list(row) for row in result.rows]
        payload = {"columns": result.columns, "rows": rows, "truncated": result.truncated}
        click.echo(json.dumps(payload, indent=2, default=str))
        return
    if not result.columns:
        out_console.print("ok (no result)")
        return
    table = Table(show_edge=False)
    for column in result.columns:
        table.add_column(Text(column), overflow="fold")  # long values wrap, never cut
    for row in result.rows:
        table.add_row(*(Text("NULL" if v is None else str(v)) for v in row))
    out_console.print(table)
    more = " (more rows not shown: raise --max-rows, 0 for all)" if result.truncated else ""
    out_console.print(f"{len(result.rows)} row{'s' * (len(result.rows) != 1)}{more}")


@main.command()
@click.argument("out_a")
@click.argument("out_b")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable report.")
@click.option(
    "--limit",
    default=5,
    show_default=True,
    type=click.IntRange(min=0),
    help="Example sample ids per category.",
)
@_endpoint_option
def diff(out_a: str, out_b: str, as_json: bool, limit: int, endpoint: str | None) -> None:
    """Compare the samples of two outputs: spec fields, samples only in one, parameters, bytes.

    Exit 0 when they hold the same samples (whatever their shards or format), 1 when not.
    """
    from rayaug.diff import diff_outputs

    result = diff_outputs(_output(out_a, endpoint).output, _output(out_b, endpoint).output)
    report = result.to_json(limit)
    if as_json:
        click.echo(json.dumps(report, indent=2, default=str))
    else:
        _print_diff(report)
    sys.exit(0 if result.identical else 1)


_DIFF_LINES = {
    "only_in_a": "samples only in A",
    "only_in_b": "samples only in B",
    "params_differ": "parameters differ",
    "bytes_differ": "bytes differ",
    "quarantined_only_in_a": "quarantined only in A",
    "quarantined_only_in_b": "quarantined only in B",
}


_DIFF_KINDS = {
    "recipe": "",
    "layout": "   (layout: the same samples, stored otherwise)",
    "setting": "   (run setting: does not change the output)",
}


def _print_diff(report: dict) -> None:
    for side in ("a", "b"):
        info = report[side]
        done = "done" if info["complete"] else "incomplete"
        out_console.print(
            f"{side.upper()}: {info['uri']}  ({info['samples']} samples, {done})", markup=False
        )
    changes = report["spec"]
    out_console.print(f"spec: {len(changes) or 'no'} difference{'s' * (len(changes) != 1)}")
    for change in changes:
        a, b = (json.dumps(change[k]) if k in change else "(absent)" for k in ("a", "b"))
        note = _DIFF_KINDS[change["kind"]]
        out_console.print(f"  {change['path']}: {a} → {b}{note}", markup=False)
    out_console.print(f"samples in both: {report['in_both']}")
    for key, title in _DIFF_LINES.items():
        entry = report[key]
        out_console.print(f"{title}: {entry['count']}")
        for example in entry["examples"]:
            out_console.print(f"  {example}", markup=False)
        if entry["count"] > len(entry["examples"]) > 0:
            out_console.print(f"  … {entry['count'] - len(entry['examples'])} more (--limit)")
    out_console.print("IDENTICAL" if report["identical"] else "DIFFERENT")


@main.command()
@click.argument("out_uri")
@click.argument("sample_id")
@click.option("-o", "--output", "target", type=click.Path(dir_okay=False), help="Write the image.")
@_endpoint_option
def replay(out_uri: str, sample_id: str, target: str | None, endpoint: str | None) -> None:
    """Regenerate SAMPLE_ID from its manifest row; exit 1 if its bytes differ."""
    from rayaug.replay import replay as replay_sample

    view = _output(out_uri, endpoint)
    result = replay_sample(view.output, sample_id, view.storage)
    if target:
        Path(target).write_bytes(result.image)
    if result.source_changed:
        out_console.print(
            f"{sample_id}: SOURCE CHANGED since the job ran — {result.row['source_key']} in "
            f"{result.row['source_uri']} was sha256 {result.row['source_sha256'][:16]}…, is "
            f"{result.source_digest[:16]}… now. The replay cannot reproduce the stored sample; "
            "this says nothing against the output.",
            markup=False,
        )
        sys.exit(1)
    verdict = "identical" if result.matches else "DIFFERENT"
    out_console.print(
        f"{sample_id}: replayed bytes are {verdict} to the stored sample "
        f"(sha256 {result.row['sha256'][:16]}…, device {result.row['device']})"
    )
    if not result.matches:
        sys.exit(1)


@main.command()
@click.argument("job_file", type=click.Path(dir_okay=False))
@click.option("--address", required=True, help="Ray dashboard address, http://HEAD:8265.")
@click.option("--wait", is_flag=True, help="Stream the job's logs and exit with its status.")
@click.option(
    "--ship-deps/--no-ship-deps",
    default=True,
    show_default=True,
    help="Install rayaug's requirements (pinned to this machine's versions; never Ray, and torch "
    "only with --ship-torch) with the job; --no-ship-deps for a cluster whose image has rayaug.",
)
@click.option(
    "--ship-torch",
    is_flag=True,
    help="Ship the device path too: this machine's torch and kornia versions (the cluster's "
    "index picks the torch build). CPU jobs need neither.",
)
def submit(job_file: str, address: str, wait: bool, ship_deps: bool, ship_torch: bool) -> None:
    """Submit JOB_FILE to a Ray cluster through the Ray Jobs API."""
    from rayaug.submit import missing_requirements_line, setup_failure, submit_job, wait_for

    if ship_torch and not ship_deps:
        raise click.UsageError("--ship-torch ships with the requirements: drop --no-ship-deps")
    spec = load_spec(job_file)
    job_id = submit_job(spec, Path(job_file), address, ship_deps=ship_deps, ship_torch=ship_torch)
    out_console.print(f"submitted {job_id} to {address}")
    if wait:
        log: list[str] = []

        def show(text: str) -> None:
            log.append(text)
            click.echo(text, nl=False)

        final = wait_for(address, job_id, show)
        out_console.print(f"job {job_id}: {final}")
        if final == "FAILED":
            # The job could not start: say why as the last line, a usage error (exit 2).
            reason = missing_requirements_line("".join(log)) or setup_failure(address, job_id)
            if reason:
                _report("error:", reason)
                sys.exit(2)
        sys.exit(0 if final == "SUCCEEDED" else 1)
    out_console.print(
        f"follow it with: RAY_AUTH_MODE=token ray job logs --address {address} -f {job_id}"
    )


if __name__ == "__main__":
    main()
