"""The Python API, for notebooks and pipelines; the `rayaug` command is built on it.

    import rayaug

    summary = rayaug.run("jobs/demo.yaml")         # or a dict, or a JobSpec
    out = rayaug.open_output(summary.output)
    out.status()["state"]                          # 'done'
    out.manifest().to_pandas()                     # one row per sample
    for row, image in out.samples(limit=4): ...    # manifest row, PIL image
    loader = DataLoader(out.epoch(3, rank=r, world_size=w), batch_size=None)  # training

Nothing here prints. Every problem a user can act on is raised as one of the typed errors of
`rayaug.errors` (`SpecError` naming the field path, `UsageError`, `StorageError`, `JobFailed`),
the same the command turns into one line and an exit code. Ray is imported only when a job runs.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator, Mapping, Sequence
from itertools import islice
from typing import TYPE_CHECKING

import pyarrow as pa
from PIL import Image

from rayaug import outputs
from rayaug.plan import recorded_spec
from rayaug.reports import summary as summary_report
from rayaug.spec import JobSpec, StorageSpec, load_spec, parse_spec
from rayaug.storage import open_location

if TYPE_CHECKING:
    import ray.data

    from rayaug.epochs import Epoch
    from rayaug.job import JobSummary, Progress, RunOptions, Tally
    from rayaug.reports.query import QueryResult

Job = str | os.PathLike | Mapping | JobSpec
Uri = str | os.PathLike  # a local path, file:// or s3://bucket/prefix


def load_job(job: Job) -> JobSpec:
    """A job spec from a YAML file's path, a mapping (as the YAML would hold) or a JobSpec."""
    if isinstance(job, JobSpec):
        return job
    if isinstance(job, Mapping):
        return parse_spec(dict(job), "<job dict>")
    return load_spec(job)


class _Silent:
    """The progress of a job run without a listener."""

    def started(self, tally: Tally) -> None:
        pass

    def committed(self, tally: Tally) -> None:
        pass


def run(job: Job, *, address: str | None = None, progress: Progress | None = None) -> JobSummary:
    """Run a job to completion, or resume it when its output already holds it, or grow the
    job the output holds where `job` only asks for more views or the input gained files.

    `address`: a Ray cluster to join (default: an embedded local Ray, or the cluster of
    `RAY_ADDRESS`; a Ray this process already started is used as it is). `progress`: an object
    with `started(tally)` and `committed(tally)`, called as shards commit. Returns the summary
    that `_SUCCESS` records (`.to_json()`).
    """
    from rayaug.job import RunOptions, run_job

    return run_job(load_job(job), RunOptions(address=address), progress or _Silent())


def _run_recorded(
    uri: Uri, storage: StorageSpec | None, update: dict, options: RunOptions, progress
) -> JobSummary:
    from rayaug.job import run_job

    # Only the recorded spec: a driver killed while planning left no plan, and run re-plans.
    location = open_location(os.fspath(uri), storage or StorageSpec())
    recorded = recorded_spec(location)
    # The output where it is now (an absolute path, whatever the workers' working directory):
    # one moved since (out of its input, say) is finished there.
    output = recorded.output.model_copy(update={"uri": location.uri})
    changed = {"storage": _storage(recorded, storage), "output": output} | update
    return run_job(recorded.model_copy(update=changed), options, progress or _Silent())


def resume(
    uri: Uri,
    *,
    storage: StorageSpec | None = None,
    address: str | None = None,
    progress: Progress | None = None,
) -> JobSummary:
    """Finish the job recorded in the output `uri` (`_job/spec.yaml`), where `uri` is now: only
    uncommitted shards are processed; on a finished output nothing is redone (its `_SUCCESS`
    records this run).

    `storage`: the fields set here (an endpoint, say) replace those the job recorded.
    Files added to the input since are not processed (that is `extend`).
    """
    from rayaug.job import RunOptions

    return _run_recorded(uri, storage, {}, RunOptions(address, grow=False), progress)


def extend(
    uri: Uri,
    *,
    views: int | None = None,
    storage: StorageSpec | None = None,
    address: str | None = None,
    progress: Progress | None = None,
) -> JobSummary:
    """Grow the job recorded in the output `uri`: up to `views` views of every source (more
    than recorded), and every view of the files the input gained since. Only the new samples
    are made, as new shards; nothing committed is rewritten. `storage`: as for `resume`."""
    from rayaug.job import RunOptions

    update = {} if views is None else {"views": views}
    return _run_recorded(uri, storage, update, RunOptions(address), progress)


def _storage(spec: JobSpec, storage: StorageSpec | None) -> StorageSpec:
    if storage is None:
        return spec.storage
    return spec.storage.model_copy(update=storage.model_dump(exclude_unset=True))


def open_output(uri: Uri, storage: StorageSpec | None = None) -> OutputView:
    """A committed output (finished or not) at `uri`, for reading; UsageError if `uri` holds
    no rayaug output. `storage`: as for `resume`."""
    output = outputs.recorded_output(open_location(os.fspath(uri), storage or StorageSpec()))
    return OutputView(output, _storage(output.spec, storage))


class OutputView:
    """What a job committed under one output URI. Every call reads the output anew, so a
    running job's progress shows; only committed shards are read."""

    def __init__(self, output: outputs.Output, storage: StorageSpec) -> None:
        self.output = output  # the location, the recorded spec and plan
        self.storage = storage  # the recorded storage settings with the caller's overrides

    @property
    def uri(self) -> str:
        return self.output.location.uri

    @property
    def spec(self) -> JobSpec:
        return self.output.spec

    def status(self) -> dict:
        """output, state ('done', 'running' or 'incomplete'), shards and samples planned and
        committed, quarantined: what `rayaug status --json` prints."""
        return outputs.status(self.output)

    def manifest(self) -> pa.Table:
        """Every committed manifest row (README "Manifest row")."""
        return outputs.manifests(self.output.location)

    def errors(self) -> pa.Table:
        """The quarantine: sample_id, source_key, stage, error_class, message per row."""
        return outputs.quarantine(self.output.location)

    def samples(
        self, decode: bool = True, limit: int | None = None
    ) -> Iterator[tuple[dict, Image.Image | bytes]]:
        """(manifest row, image) for each committed sample, in shard and manifest order; the
        image decoded (a PIL image) or, with `decode=False`, its stored bytes (whose sha256
        is the row's). Reads one data shard at a time."""
        for row, data in islice(outputs.samples(self.output), limit):
            yield row, _decoded(data) if decode else data

    def epoch(
        self,
        epoch: int,
        *,
        rank: int = 0,
        world_size: int = 1,
        seed: int | None = None,
        shuffle: bool = True,
        drop_last: bool = False,
        columns: Sequence[str] = ("sample_id", "label", "soft_label", "targets"),
        decode: bool = True,
        batch_size: int = 1,
        num_workers: int = 0,
        window: int = 4,
        views_per_item: int = 1,
    ) -> Epoch:
        """One rank's share of epoch `epoch` for training: view `epoch mod views` of every
        committed sample, once over all ranks and workers, in an order fixed by (seed, epoch,
        the committed manifests). A torch `IterableDataset` when torch is installed.

        `seed`: the order's (default: the job's). `drop_last`: equal ranks by leaving out up
        to world_size - 1 samples (default: by repeating as many). `columns`: the manifest
        columns each item carries (`ops` on request). `decode`: images as (H, W, 3) uint8
        arrays, else their stored bytes. `batch_size`, `num_workers`: the DataLoader's, which
        is what lets `state_dict(samples=...)` resume exactly. `window`: shards shuffled
        together (memory: one window of one view per worker). `views_per_item=k`: each item is
        k views of one source (views e*k ... e*k+k-1 mod views; images and per-view columns
        as lists, `label` once), for contrastive steps. README "Training on the output".
        """
        from rayaug.epochs import Epoch

        return Epoch(
            self.output,
            self.storage,
            epoch,
            rank=rank,
            world_size=world_size,
            seed=seed,
            shuffle=shuffle,
            drop_last=drop_last,
            columns=columns,
            decode=decode,
            batch_size=batch_size,
            num_workers=num_workers,
            window=window,
            views_per_item=views_per_item,
        )

    def epoch_dataset(
        self,
        epoch: int,
        *,
        seed: int | None = None,
        shuffle: bool = True,
        columns: Sequence[str] = ("sample_id", "label"),
        decode: bool = True,
        parts: int = 8,
        window: int = 4,
        views_per_item: int = 1,
    ) -> ray.data.Dataset:
        """The same epoch as a Ray Data dataset, for Ray Train (`datasets={"train": ...}`):
        each committed sample of view `epoch mod views` once, as rows of `image` and `columns`,
        read by `parts` tasks, each one contiguous part of the epoch's order. Ray Train splits
        it over its workers; the order and `state_dict` promises are the `epoch()` reader's.

        `views_per_item=k`: a row is one source's item as `epoch()` serves it, each source once:
        `image` its k views as one (k, H, W, 3) uint8 array (a list when their shapes differ,
        or with `decode=False`), per-view columns as lists of k, `label` and the other source
        columns once."""
        from rayaug.job import epoch_dataset

        reader = self.epoch(
            epoch,
            seed=seed,
            shuffle=shuffle,
            columns=columns,
            decode=decode,
            num_workers=parts,
            window=window,
            views_per_item=views_per_item,
        )
        return epoch_dataset(reader)

    def verify(self) -> list[str]:
        """Every breach of the commit protocol (missing shards, counts, sha256, orphans, no
        _SUCCESS); an empty list means the output is sound and finished."""
        return summary_report.verify(self.output)

    def changed_sources(self) -> list[str]:
        """Each source whose bytes differ from those the job read (by the sha256 each manifest
        row records), or that is gone: its samples no longer replay to their stored bytes,
        though the output is intact. Reads the whole input once."""
        source = open_location(self.output.spec.input.uri, self.storage)
        return summary_report.changed_sources(self.output, source)

    def summary(self, stats: bool = False) -> dict:
        """What `rayaug inspect --json` prints: status, labels, devices, per-op statistics and
        quarantine reasons; with `stats`, also under "stats" the histograms of every drawn
        parameter and the label balance (`rayaug inspect --stats`)."""
        from rayaug.reports.stats import statistics

        tables = outputs.committed_tables(self.output)
        report = summary_report.summary(self.output, *tables)
        if stats:
            report["stats"] = statistics(self.output, *tables)
        return report

    def query(self, sql: str, max_rows: int | None = None) -> QueryResult:
        """DuckDB SQL over tables `manifest`, `errors` and view `applied_ops` (README
        "Querying the manifest"); UsageError, on one line, for a bad query."""
        from rayaug.reports.query import query

        return query(self.output.location, sql, max_rows)

    def contact_sheet(self, limit: int = 24) -> Image.Image:
        """A grid of `limit` samples spread over the output, captioned, labels drawn on."""
        from rayaug.reports.sheet import contact_sheet

        return contact_sheet(self.output, limit)


def _decoded(data: bytes) -> Image.Image:
    image = Image.open(io.BytesIO(data))
    image.load()
    return image
