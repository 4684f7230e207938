"""The `rayaug` command: the only place that prints and picks exit codes.

Exit codes: 0 done, 1 the job failed, 2 a usage or spec error.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from rayaug.errors import RayaugError, SpecError
from rayaug.spec import JobSpec, StorageSpec, load_spec

console = Console(stderr=True, soft_wrap=True)
out_console = Console(highlight=False, soft_wrap=True)


class _Group(click.Group):
    """Turns rayaug's own errors into one line and their exit code, never a traceback."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except SpecError as error:
            console.print(f"[red]invalid job spec[/] {error.source}:", highlight=False)
            for message in error.messages:
                console.print(f"  {message}", highlight=False, markup=False)
            sys.exit(error.exit_code)
        except RayaugError as error:
            console.print(f"[red]error:[/] {error}", highlight=False)
            sys.exit(error.exit_code)


@click.group(cls=_Group)
@click.version_option(package_name="rayaug")
@click.option("-v", "--verbose", is_flag=True, help="Log retries and Ray's own messages.")
def main(verbose: bool) -> None:
    """Offline image augmentation as a resumable Ray Data job."""
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )


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
        self.start_time = time.monotonic()

    def started(self, tally) -> None:
        self.bar.start()
        done = tally.samples + tally.quarantined
        self.task = self.bar.add_task(
            "samples", total=tally.planned_samples, completed=done, rate=""
        )
        self.start_time = time.monotonic()

    def committed(self, tally) -> None:
        rate = tally.new_samples / max(time.monotonic() - self.start_time, 1e-6)
        self.bar.update(
            self.task, completed=tally.samples + tally.quarantined, rate=f"{rate:,.1f} img/s"
        )

    def stop(self) -> None:
        self.bar.stop()


def _run(spec: JobSpec, address: str | None, as_json: bool) -> None:
    from rayaug.job import RunOptions, run_job

    progress = _LiveProgress()
    try:
        summary = run_job(spec, RunOptions(address=address), progress)
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
    _run(load_spec(job_file), address, as_json)


@main.command()
@click.argument("job_file", type=click.Path(dir_okay=False))
def validate(job_file: str) -> None:
    """Check JOB_FILE without running it."""
    spec = load_spec(job_file)
    ops = ", ".join(op.name for op in spec.pipeline())
    out_console.print(f"{job_file}: valid (version {spec.version}); {spec.views} views; ops: {ops}")


def _output(out_uri: str, endpoint: str | None):
    from rayaug.inspect import open_output
    from rayaug.storage import open_location

    output = open_output(open_location(out_uri, StorageSpec(endpoint=endpoint)))
    return output, _storage_of(output.spec, endpoint)


def _storage_of(spec: JobSpec, endpoint: str | None) -> StorageSpec:
    if endpoint is None:
        return spec.storage
    return spec.storage.model_copy(update={"endpoint": endpoint})


@main.command()
@click.argument("out_uri")
@click.option("--address", help="Ray cluster address (default: an embedded local Ray).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@_endpoint_option
def resume(out_uri: str, address: str | None, as_json: bool, endpoint: str | None) -> None:
    """Finish the job recorded in OUT_URI, processing only uncommitted shards."""
    output, storage = _output(out_uri, endpoint)
    spec = output.spec.model_copy(update={"storage": storage})
    _run(spec, address, as_json)


@main.command()
@click.argument("out_uri")
@click.option("--json", "as_json", is_flag=True)
@_endpoint_option
def status(out_uri: str, as_json: bool, endpoint: str | None) -> None:
    """Planned, committed and quarantined samples, and whether the job runs or is done."""
    from rayaug import inspect

    output, _ = _output(out_uri, endpoint)
    report = inspect.status(output)
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
@click.option("--verify", is_flag=True, help="Check the commit protocol; exit 1 on any breach.")
@_endpoint_option
def inspect_command(
    out_uri: str, as_json: bool, sheet: str | None, limit: int, verify: bool, endpoint: str | None
) -> None:
    """Summary of OUT_URI: samples, labels, per-op statistics, quarantine."""
    from rayaug import inspect

    output, _ = _output(out_uri, endpoint)
    report = inspect.summary(output)
    if verify:
        report["breaches"] = inspect.verify(output)
    if sheet:
        inspect.contact_sheet(output, limit).save(sheet)
        report["sheet"] = str(Path(sheet))
    if as_json:
        click.echo(json.dumps(report, indent=2, default=str))
    else:
        _print_summary(report)
    if verify and report["breaches"]:
        sys.exit(1)


def _print_summary(report: dict) -> None:
    for key in ("output", "state", "shards_committed", "samples_committed", "quarantined"):
        out_console.print(f"{key:18} {report[key]}")
    labels = ", ".join(f"{k}: {v}" for k, v in list(report["labels"].items())[:12])
    out_console.print(f"{'labels':18} {labels}")
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
    if "sheet" in report:
        out_console.print(f"contact sheet: {report['sheet']}")
    if "breaches" in report:
        verdict = "verify: OK" if not report["breaches"] else "verify: FAILED"
        out_console.print(verdict)
        for breach in report["breaches"]:
            out_console.print(f"  {breach}", markup=False)


@main.command()
@click.argument("out_uri")
@click.argument("sample_id")
@click.option("-o", "--output", "target", type=click.Path(dir_okay=False), help="Write the image.")
@_endpoint_option
def replay(out_uri: str, sample_id: str, target: str | None, endpoint: str | None) -> None:
    """Regenerate SAMPLE_ID from its manifest row; exit 1 if its bytes differ."""
    from rayaug.replay import replay as replay_sample

    output, storage = _output(out_uri, endpoint)
    result = replay_sample(output, sample_id, storage)
    if target:
        Path(target).write_bytes(result.image)
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
def submit(job_file: str, address: str, wait: bool) -> None:
    """Submit JOB_FILE to a Ray cluster through the Ray Jobs API."""
    from rayaug.submit import submit_job, wait_for

    spec = load_spec(job_file)
    job_id = submit_job(spec, Path(job_file), address)
    out_console.print(f"submitted {job_id} to {address}")
    if wait:
        final = wait_for(address, job_id, lambda line: click.echo(line, nl=False))
        out_console.print(f"job {job_id}: {final}")
        sys.exit(0 if final == "SUCCEEDED" else 1)
    out_console.print(
        f"follow it with: RAY_AUTH_MODE=token ray job logs --address {address} -f {job_id}"
    )


if __name__ == "__main__":
    main()
