"""The epoch reader for training: one view of every committed sample, shuffled, split over
ranks and DataLoader workers, resumable mid-epoch (README "Training on the output").

The order of an epoch is a pure function of (seed, epoch, the committed manifests):

1. the shards holding the epoch's view (`epoch mod views`) are permuted by (seed, epoch);
2. consecutive shards of that order form windows of `window` shards; each window's samples
   are permuted by (seed, epoch, window): a block shuffle, so no rank ever holds a permutation
   of the whole dataset, only one window's;
3. the epoch's sequence is the windows one after another: position p is one sample.

What is left of an epoch is a list of position intervals (the whole epoch at first). A run of
`world_size` ranks cuts what is left into equal contiguous ranges, one per rank (padded by
repeating the first positions left, or with `drop_last` cut, to equal length); a rank's range
is cut into contiguous parts, one per DataLoader worker, read in batches of `batch_size`.
Contiguous ranges keep reads large and sequential: a worker reads whole data objects of the
windows inside its part, and only the samples it needs (by ranged reads where the format
records where they lie, by row takes where its reader has them: Lance) of the one or two
windows its part cuts. Because a DataLoader takes the workers' batches in turn, what a rank has
delivered after `samples` is known from (samples, batch_size, num_workers) alone: `state_dict`
turns it into the positions left, which any world size and worker count can resume from.

With `views_per_item=k` an item is k views of one source: epoch e serves views e*k ... e*k+k-1
(mod the job's views) of every source that has all k, the positions above counting sources
instead of samples. A catalogue entry is then the shards that read the same work unit (a
grown output's views of one source lie in one shard per generation); a source lacking one of
the k views is left out and counted (`Epoch.left_out`).
"""

from __future__ import annotations

import bisect
import concurrent.futures
import dataclasses
import hashlib
import itertools
import json
import os
import tarfile
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rayaug import codec, commit
from rayaug.errors import RayaugError, UsageError
from rayaug.formats import output_format
from rayaug.formats.base import DataObject, OutputFormat, ShardFile
from rayaug.outputs import Output
from rayaug.sinks import MANIFEST_SCHEMA, SOURCES_KEY
from rayaug.spec import StorageSpec
from rayaug.storage import open_location, retrying

STATE_VERSION = 1
DEFAULT_WINDOW = 4  # shards per shuffle window: what one worker holds of a window at most
DEFAULT_COLUMNS = ("sample_id", "label", "soft_label", "targets")
JSON_COLUMNS = ("ops", "targets")  # manifest columns that hold JSON text: parsed in items
# With several views per item: the columns a source has once (the others, one per view).
SOURCE_COLUMNS = (
    "source_key",
    "source_uri",
    "source_sha256",
    "label",
    "source_width",
    "source_height",
)
# An object is read whole (one sequential read) once a reader needs this share of its bytes;
# below, only its samples, by ranged reads: only the windows cut between two parts need them.
WHOLE_OBJECT = 0.9

Interval = tuple[int, int]  # [start, stop) of epoch positions
# What parsing an object's bytes raises when they are not what its format wrote.
_CORRUPT = (tarfile.TarError, pa.ArrowException, ValueError, KeyError, OSError, EOFError)


# ---------------------------------------------------------------- the catalogue


@dataclass(frozen=True)
class ShardView:
    """One entry of an epoch's catalogue: the committed shards that hold the epoch's views of
    one set of sources (one shard; with several views per item on a grown output, the shard of
    each generation that made some of them), the objects that hold those views (each with its
    shard), how many items it serves (samples; sources with all their views when an item is
    several views), and how many of its sources are left out (a view quarantined or missing)."""

    shards: tuple[str, ...]
    objects: tuple[tuple[str, DataObject], ...]
    samples: int
    left_out: int = 0

    @property
    def name(self) -> str:
        return "+".join(self.shards)


def shard_views(output: Output, views: Sequence[int]) -> list[ShardView]:
    """Every committed shard (or group of shards over the same sources) that holds items of
    `views` (one view per item, or several of one source), in shard order, from the manifests'
    footers (by_view) or their `view` and `source_key` columns (by_source, outputs from before
    layouts, and sources with a view quarantined)."""
    fmt, views = output_format(output.spec.output.format), tuple(views)
    found = []
    for shards in _source_groups(output, len(views) > 1):
        held: list[tuple[str, DataObject]] = []
        counted: dict[int, int] = {}  # view -> samples, where the footers tell
        sources: set[int | None] = set()
        whole = False  # some object holds every view (by_source): its manifest tells
        for shard in shards:
            metadata = _footer_metadata(output, shard)
            objects = fmt.objects(shard, metadata)
            recorded = metadata.get(SOURCES_KEY)
            sources.add(None if recorded is None else int(recorded))
            for data in objects:
                if data.view is None:
                    whole = True
                    held.append((shard, data))
                elif data.view in views:
                    held.append((shard, data))
                    counted[data.view] = counted.get(data.view, 0) + (data.samples or 0)
        if len(views) == 1 and not whole:  # one view per item, one object per view
            count = sum(counted.values())
            left = _complete_left(sources, count)
        elif not whole and _complete(counted, views, sources):
            count, left = counted[views[0]], 0  # every source has every view
        else:
            count, left = _count_items(output, shards, views, sources)
        if count or (left and len(views) > 1):
            found.append(ShardView(tuple(shards), tuple(held), count, left))
    return found


def _source_groups(output: Output, grouped: bool) -> list[tuple[str, ...]]:
    """The committed shards, one by one; `grouped`: those whose work units read the same
    sources together (a growth's shards of more views make other views of an earlier unit's
    sources), so that an item's views are found whatever generation made them."""
    committed = sorted(commit.committed_shards(output.location))
    if not grouped:
        return [(shard,) for shard in committed]
    unit_of = {u.shard: (u.files, u.rows) for u in output.plan.units}
    groups: dict[object, list[str]] = {}
    for shard in committed:
        groups.setdefault(unit_of.get(shard, shard), []).append(shard)
    return sorted((tuple(g) for g in groups.values()), key=lambda g: g[0])


def _sources_read(sources: set[int | None]) -> int | None:
    """The sources a group's shards read, where every footer records the same count."""
    return next(iter(sources)) if len(sources) == 1 and None not in sources else None


def _complete(counted: dict[int, int], views: tuple[int, ...], sources: set) -> bool:
    """Whether the footers alone show every source of a group with every view of `views`."""
    read = _sources_read(sources)
    return read is not None and all(counted.get(v) == read for v in views)


def _complete_left(sources: set, count: int) -> int:
    """Sources of a one-shard entry without the view served, where the footer tells."""
    read = _sources_read(sources)
    return 0 if read is None else max(read - count, 0)


def _count_items(
    output: Output, shards: Sequence[str], views: tuple[int, ...], sources: set
) -> tuple[int, int]:
    """(items, sources left out) of a group, from its manifests' `source_key` and `view`."""
    having: dict[str, set[int]] = {}
    for shard in shards:
        table = _manifest_columns(output, shard, ("source_key", "view"))
        for key, view in zip(
            table.column("source_key").to_pylist(), table.column("view").to_pylist(), strict=True
        ):
            got = having.setdefault(key, set())  # a source with none of the views counts
            if view in views:
                got.add(view)
    complete = sum(1 for got in having.values() if len(got) == len(views))
    read = max((s for s in sources if s is not None), default=len(having))
    return complete, max(read, len(having)) - complete


def _footer_metadata(output: Output, shard: str) -> dict[str, str]:
    """A manifest's file metadata, from its footer alone (ranged reads, not the whole file)."""
    out, path = output.location, commit.manifest_path(shard)

    def read() -> dict[str, str]:
        with out.fs.open_input_file(out.path(path)) as handle:
            metadata = pq.read_metadata(handle).metadata or {}
        return {k.decode(): v.decode() for k, v in metadata.items()}

    return retrying(read, f"reading {out.uri_of(path)}", out.attempts)


def _manifest_columns(output: Output, shard: str, columns: Sequence[str]):
    out, path = output.location, commit.manifest_path(shard)

    def read():
        with out.fs.open_input_file(out.path(path)) as handle:
            return pq.read_table(handle, columns=list(columns))

    return retrying(read, f"reading {out.uri_of(path)}", out.attempts)


def _view_rows(manifest: pa.Table, views: Sequence[int]) -> list[dict]:
    """The rows of the given views, filtered before any row becomes a Python dict: an
    epoch wants one view in eight of a manifest, and the dicts cost more than the read."""
    wanted = pa.array(views, manifest.schema.field("view").type)
    return manifest.filter(pc.is_in(manifest["view"], value_set=wanted)).to_pylist()


# ---------------------------------------------------------------- the order


def _rng(*words: int) -> np.random.Generator:
    return np.random.default_rng([int(w) for w in words])


class Order:
    """The sequence of one epoch: shards permuted, then each window of them block-shuffled."""

    def __init__(
        self, counts: Sequence[int], seed: int, epoch: int, shuffle: bool, window: int
    ) -> None:
        self.counts, self.seed, self.epoch = list(counts), seed, epoch
        self.shuffle, self.window = shuffle, window
        entries = range(len(self.counts))
        if shuffle:
            entries = _rng(seed, epoch).permutation(len(self.counts))
        self.entries = [int(e) for e in entries]  # catalogue entries in epoch order
        sizes = [
            sum(self.counts[e] for e in self.entries[i : i + window])
            for i in range(0, len(self.entries), window)
        ]
        self.starts = list(itertools.accumulate(sizes, initial=0))  # each window's first
        self._permutations: dict[int, np.ndarray] = {}  # the windows being read, at most two

    @property
    def total(self) -> int:
        return self.starts[-1]

    def window_of(self, position: int) -> int:
        return bisect.bisect_right(self.starts, position) - 1

    def members(self, window: int) -> list[int]:
        """The catalogue entries of one window, in epoch order."""
        return self.entries[window * self.window : (window + 1) * self.window]

    def locate(self, window: int, lo: int, hi: int) -> list[tuple[int, int]]:
        """(catalogue entry, row of the entry's view) of window positions [lo, hi) (offsets
        in the window)."""
        members = self.members(window)
        firsts = list(itertools.accumulate((self.counts[e] for e in members), initial=0))
        located = []
        for index in self._permutation(window)[lo:hi]:
            slot = bisect.bisect_right(firsts, index) - 1
            located.append((members[slot], int(index) - firsts[slot]))
        return located

    def _permutation(self, window: int) -> np.ndarray:
        found = self._permutations.get(window)
        if found is None:
            size = self.starts[window + 1] - self.starts[window]
            found = np.arange(size)
            if self.shuffle:
                found = _rng(self.seed, self.epoch, window).permutation(size)
            if len(self._permutations) >= 2:
                self._permutations.pop(next(iter(self._permutations)))
            self._permutations[window] = found
        return found


# ---------------------------------------------------------------- splitting what is left


def _length(intervals: Sequence[Interval]) -> int:
    return sum(stop - start for start, stop in intervals)


def _slice(intervals: Sequence[Interval], lo: int, hi: int) -> list[Interval]:
    """The positions at indices [lo, hi) of the intervals laid end to end, in order; indices
    past the end wrap around (padding repeats the first positions)."""
    total = _length(intervals)
    pieces: list[Interval] = []
    while total and lo < hi:
        base = lo // total * total
        first, last = lo - base, min(hi - base, total)
        offset = 0
        for start, stop in intervals:
            a, b = max(first, offset), min(last, offset + stop - start)
            if a < b:
                pieces.append((start + a - offset, start + b - offset))
            offset += stop - start
        lo = base + last
    return pieces


def _merged(intervals: Sequence[Interval]) -> list[Interval]:
    merged: list[Interval] = []
    for start, stop in intervals:
        if start >= stop:
            continue
        if merged and merged[-1][1] == start:
            merged[-1] = (merged[-1][0], stop)
        else:
            merged.append((start, stop))
    return merged


@dataclass(frozen=True)
class Split:
    """How one run (world size, workers, batch size) cuts what is left of an epoch."""

    left: tuple[Interval, ...]
    world_size: int
    num_workers: int
    batch_size: int
    drop_last: bool

    @property
    def per_rank(self) -> int:
        """Samples every rank delivers: equal, so that no DDP rank waits for another."""
        left = _length(self.left)
        return left // self.world_size if self.drop_last else -(-left // self.world_size)

    def parts(self) -> list[int]:
        """Samples of each worker's part of a rank's range (one part without workers)."""
        workers = max(self.num_workers, 1)
        base, extra = divmod(self.per_rank, workers)
        return [base + (w < extra) for w in range(workers)]

    def part(self, rank: int, worker: int) -> list[Interval]:
        """The positions one worker of one rank serves, in order."""
        parts = self.parts()
        lo = rank * self.per_rank + sum(parts[:worker])
        return _slice(self.left, lo, lo + parts[worker])

    def delivered(self, samples: int) -> list[int]:
        """How many samples of each worker's part a rank has delivered after `samples`: a
        DataLoader takes one batch from each worker in turn, skipping workers that are done."""
        parts = self.parts()
        if self.num_workers == 0:
            return [min(samples, parts[0])]
        taken = [0] * len(parts)
        while samples > 0 and any(t < p for t, p in zip(taken, parts, strict=True)):
            for w, size in enumerate(parts):
                if taken[w] < size and samples > 0:
                    batch = min(self.batch_size, size - taken[w], samples)
                    taken[w] += batch
                    samples -= batch
        return taken

    def left_after(self, samples: int) -> list[Interval]:
        """What is left of the epoch once every rank has delivered `samples` (the same count:
        ranks run in lockstep): each worker part's rest, and what `drop_last` left out."""
        per_rank, left = self.per_rank, _length(self.left)
        parts, taken = self.parts(), self.delivered(samples)
        pieces: list[Interval] = []
        for rank in range(self.world_size):
            lo = rank * per_rank
            for size, done in zip(parts, taken, strict=True):
                pieces += _slice(self.left, lo + done, min(lo + size, left))
                lo += size
        pieces += _slice(self.left, self.world_size * per_rank, left)  # dropped, not served
        return _merged(sorted(pieces))


# ---------------------------------------------------------------- reading


@dataclass
class ReadStats:
    """What a reader fetched from storage, for the benchmark's bytes per delivered byte."""

    bytes_read: int = 0
    objects_read: int = 0
    ranged_reads: int = 0


class _ObjectReader:
    """Reads the images of some samples of one data object: whole, in one sequential read,
    or just those samples, by ranged reads of their recorded spans or the format's row takes."""

    def __init__(self, output: Output, stats: ReadStats) -> None:
        self.output, self.stats = output, stats
        self.format: OutputFormat = output_format(output.spec.output.format)

    def read(self, shard: str, data: DataObject, wanted: dict[int, str]) -> dict[str, bytes]:
        """sample_id -> image of the wanted samples (their rows in the object -> their ids)."""
        try:
            return self._read(data, wanted)
        except RayaugError as error:
            raise UsageError(
                f"{self.output.location.uri}: data object {data.path} of committed shard "
                f"{shard} cannot be read ({error}); `rayaug inspect --verify` lists every breach"
            ) from None
        except _CORRUPT as error:  # bytes that do not parse: the object is corrupt
            raise UsageError(
                f"{self.output.location.uri}: data object {data.path} of committed shard "
                f"{shard} is corrupt ({type(error).__name__}: {error}); `rayaug inspect "
                "--verify` lists every breach"
            ) from None

    def _read(self, data: DataObject, wanted: dict[int, str]) -> dict[str, bytes]:
        out, spec = self.output.location, self.output.spec.output
        spans, rows = data.spans, sorted(wanted)
        if not isinstance(self.format, ShardFile):  # Lance: its own reader
            return self._read_own(data, rows)
        if spans is None or self._share(spans, rows) >= WHOLE_OBJECT:
            raw = out.read_bytes(data.path)
            self.stats.objects_read += 1
            self.stats.bytes_read += len(raw)
            return self.format.decode(raw, spec, masks=False)
        images: dict[str, bytes] = {}
        with out.fs.open_input_file(out.path(data.path)) as handle:
            for first, last in _runs(rows):
                begin, end = spans[first], spans[last + 1]
                raw = retrying(
                    lambda b=begin, e=end: handle.read_at(e - b, b),
                    f"reading {out.uri_of(data.path)}",
                    out.attempts,
                )
                self.stats.ranged_reads += 1
                self.stats.bytes_read += len(raw)
                run = self.format.split(raw, spans[first : last + 2], spec)
                for row, image in zip(range(first, last + 1), run, strict=True):
                    if row in wanted:
                        images[wanted[row]] = image
        return images

    def _read_own(self, data: DataObject, rows: list[int]) -> dict[str, bytes]:
        """Through the format's reader: only the rows wanted where it can take rows (the
        counts are of the images it returns, not of what it fetched)."""
        out, spec = self.output.location, self.output.spec.output
        if self.format.picks_rows(data) and len(rows) < data.samples:
            self.stats.ranged_reads += 1
            images = self.format.read_rows(out, spec, data, rows)
        else:
            self.stats.objects_read += 1
            images = self.format.read_object(out, spec, data)
        self.stats.bytes_read += sum(len(v) for v in images.values())
        return images

    @staticmethod
    def _share(spans: list[int], rows: Sequence[int]) -> float:
        needed = sum(spans[r + 1] - spans[r] for r in set(rows))
        return needed / max(spans[-1] - spans[0], 1)


def _runs(rows: Sequence[int]) -> list[tuple[int, int]]:
    """Consecutive rows as (first, last) runs: each is one ranged read."""
    runs: list[tuple[int, int]] = []
    for row in rows:
        if runs and runs[-1][1] + 1 == row:
            runs[-1] = (runs[-1][0], row)
        elif not runs or runs[-1][1] != row:
            runs.append((row, row))
    return runs


# ---------------------------------------------------------------- the epoch


def _torch_worker() -> tuple[int, int] | None:
    """(worker id, workers) inside a torch DataLoader worker; None elsewhere (or no torch)."""
    try:
        from torch.utils.data import get_worker_info
    except ImportError:
        return None
    info = get_worker_info()
    return None if info is None else (info.id, info.num_workers)


def _iterable_base() -> type:
    """torch's IterableDataset when torch is installed (a DataLoader then takes an epoch as
    it is); a plain object without it: torch stays optional."""
    try:
        from torch.utils.data import IterableDataset
    except ImportError:
        return object
    return IterableDataset


class Epoch(_iterable_base()):
    """One epoch of one rank: iterate it (or hand it to a DataLoader) for its items, dicts of
    `image` (an (H, W, 3) uint8 array, or the stored bytes with `decode=False`) and the manifest
    columns asked for (`sample_id`, `label`, `soft_label`, `targets` by default; `ops` parsed).

    Made by `OutputView.epoch`; README "Training on the output" says what it promises.
    """

    def __init__(
        self,
        output: Output,
        storage: StorageSpec,
        epoch: int,
        *,
        rank: int = 0,
        world_size: int = 1,
        seed: int | None = None,
        shuffle: bool = True,
        drop_last: bool = False,
        columns: Sequence[str] = DEFAULT_COLUMNS,
        decode: bool = True,
        batch_size: int = 1,
        num_workers: int = 0,
        window: int = DEFAULT_WINDOW,
        views_per_item: int = 1,
    ) -> None:
        _check(epoch >= 0, f"epoch must be ≥ 0, not {epoch}")
        _check(world_size >= 1, f"world_size must be ≥ 1, not {world_size}")
        _check(0 <= rank < world_size, f"rank {rank} is out of range for world_size {world_size}")
        _check(batch_size >= 1, f"batch_size must be ≥ 1, not {batch_size}")
        _check(num_workers >= 0, f"num_workers must be ≥ 0, not {num_workers}")
        _check(window >= 1, f"window must be ≥ 1 shard, not {window}")
        views = output.spec.views
        _check(
            1 <= views_per_item <= views,
            f"views_per_item must be in [1, {views}] (the job's views), not {views_per_item}",
        )
        unknown = sorted(set(columns) - set(MANIFEST_SCHEMA.names))
        _check(not unknown, f"no manifest column {', '.join(unknown)} (columns=)")
        self.output, self.storage, self.epoch, self.rank = output, storage, epoch, rank
        self._pid = os.getpid()  # the process whose storage clients `output` holds
        # Epoch e with k views per item: views e*k ... e*k+k-1 (mod the job's views).
        self.views_per_item = views_per_item
        self.views = tuple((epoch * views_per_item + j) % views for j in range(views_per_item))
        self.seed = output.spec.seed if seed is None else seed
        self.columns, self.decode = tuple(columns), decode
        self.catalogue = shard_views(output, self.views)
        # Sources not served: a view of the epoch's quarantined (or, for several views per
        # item, missing), where the manifests tell (counted, never silently dropped).
        self.left_out = sum(s.left_out for s in self.catalogue)
        self.order = Order(
            tuple(s.samples for s in self.catalogue), self.seed, epoch, shuffle, window
        )
        self.split = Split(((0, self.order.total),), world_size, num_workers, batch_size, drop_last)
        self.stats = ReadStats()
        self._delivered = 0  # samples this object handed out itself (no DataLoader workers)
        self.finished = output.location.exists(commit.SUCCESS)
        self._warn_of_what_it_serves()

    def _warn_of_what_it_serves(self) -> None:
        """What this epoch serves that its caller may not expect: an unfinished output's
        committed shards only, sources left out for a missing view, whole-shard reads."""
        uri, views = self.output.location.uri, self.output.spec.views
        caller = 4  # the code that asked OutputView.epoch for this epoch
        if not self.finished:
            warnings.warn(
                f"{uri} has not finished (its job is running or stopped): the "
                f"epoch serves its {len(self.catalogue)} committed shards only",
                stacklevel=caller,
            )
        if self.views_per_item > 1 and self.left_out:
            warnings.warn(
                f"{uri}: epoch {self.epoch} leaves out {self.left_out} sources "
                f"that lack one of views {list(self.views)} (quarantined or missing); "
                "`epoch.left_out` counts them",
                stacklevel=caller,
            )
        mixed = [o for s in self.catalogue for _, o in s.objects if o.view is None]
        picks_rows = output_format(self.output.spec.output.format).picks_rows
        if mixed:
            cost = (
                f"reads {views / self.views_per_item:.3g}x the bytes it serves"
                if not all(map(picks_rows, mixed))
                else "reads each sample by a ranged read of its own"
            )
            warnings.warn(
                f"{uri} keeps every view of a shard in one object (by_source, "
                f"or written before layouts): an epoch {cost} (README: Training on the output)",
                stacklevel=caller,
            )

    def __len__(self) -> int:
        """The samples this rank delivers (the same on every rank)."""
        return self.split.per_rank

    @property
    def total(self) -> int:
        """Samples in the epoch over all ranks (before padding or `drop_last`)."""
        return self.order.total

    def __iter__(self) -> Iterator[dict]:
        worker = _torch_worker()
        if worker is None:
            _check(
                self.split.num_workers == 0,
                f"this epoch was opened for {self.split.num_workers} DataLoader workers: "
                "iterate it through DataLoader(num_workers=...) with that count",
            )
            for item in self.serve(0):
                self._delivered += 1
                yield item
            return
        worker_id, workers = worker
        _check(
            workers == self.split.num_workers,
            f"the DataLoader has {workers} workers, the epoch was opened for "
            f"num_workers={self.split.num_workers}: pass the DataLoader's count to epoch()",
        )
        yield from self.serve(worker_id)

    def serve(self, worker: int) -> Iterator[dict]:
        """The items of one worker's part of this rank, in order: what a DataLoader worker
        runs (worker 0 is the whole rank without workers). Reads only this part's data."""
        _check(
            0 <= worker < max(self.split.num_workers, 1),
            f"worker {worker} is out of range for num_workers={self.split.num_workers}",
        )
        return self._serve(self.split.part(self.rank, worker))

    def _own_clients(self) -> None:
        """A DataLoader worker forked from the process that opened the output would share
        its storage connections (an S3 keep-alive socket answering two processes): each
        process opens the output anew."""
        if os.getpid() != self._pid:
            location = open_location(self.output.location.uri, self.storage)
            self.output = dataclasses.replace(self.output, location=location)
            self._pid = os.getpid()

    def positions(self) -> Iterator[int]:
        """The epoch positions this rank serves, in order (workers' parts one after another)."""
        for worker in range(max(self.split.num_workers, 1)):
            for start, stop in self.split.part(self.rank, worker):
                yield from range(start, stop)

    # ------------------------------------------------------------ resume

    def state_dict(self, samples: int | None = None) -> dict:
        """Where the epoch stands, to resume it later on any world size and worker count.

        `samples`: how many this rank has taken from the DataLoader (steps x batch size);
        every rank has taken the same. Without it, what this object handed out itself (right
        only when it is iterated directly, not through DataLoader workers)."""
        taken = self._delivered if samples is None else samples
        _check(0 <= taken <= len(self), f"samples must be in [0, {len(self)}], not {taken}")
        return {
            "version": STATE_VERSION,
            "epoch": self.epoch,
            "seed": self.seed,
            "shuffle": self.order.shuffle,
            "window": self.order.window,
            "views_per_item": self.views_per_item,
            "shards": _shards_digest(self.catalogue),
            "left": [list(i) for i in self.split.left_after(taken)],
        }

    def load_state_dict(self, state: dict) -> None:
        """Resume from `state_dict()` (of this epoch, on any world size): what is left is
        served, split over this run's ranks and workers."""
        _check(state.get("version") == STATE_VERSION, "not an epoch state of this rayaug")
        for key, mine in (
            ("epoch", self.epoch),
            ("seed", self.seed),
            ("shuffle", self.order.shuffle),
            ("window", self.order.window),
            ("views_per_item", self.views_per_item),
        ):
            theirs = state.get(key, 1) if key == "views_per_item" else state[key]
            _check(theirs == mine, f"the state is of {key}={theirs}, this epoch {mine}")
        _check(
            state["shards"] == _shards_digest(self.catalogue),
            f"{self.output.location.uri}: the committed shards changed since the state was "
            "saved (a job still running?); an epoch resumes over the same shards only",
        )
        left = tuple((int(a), int(b)) for a, b in state["left"])
        self.split = Split(
            left,
            self.split.world_size,
            self.split.num_workers,
            self.split.batch_size,
            self.split.drop_last,
        )
        self._delivered = 0

    # ------------------------------------------------------------ serving

    def _serve(self, part: list[Interval]) -> Iterator[dict]:
        """Items of a worker's part, window piece by window piece; the next piece is read
        while the current one is handed out."""
        pieces = list(self._pieces(part))
        if not pieces:
            return
        self._own_clients()
        reader = _ObjectReader(self.output, self.stats)
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rayaug-epoch") as pool:
            pending = pool.submit(self._read_piece, reader, *pieces[0])
            for following in [*pieces[1:], None]:
                items = pending.result()
                if following is not None:
                    pending = pool.submit(self._read_piece, reader, *following)
                yield from (self._item(rows, images) for rows, images in items)

    def _pieces(self, part: list[Interval]) -> Iterator[tuple[int, int, int]]:
        """(window, lo, hi) pieces of a part: no piece spans two windows."""
        for start, stop in part:
            while start < stop:
                window = self.order.window_of(start)
                base = self.order.starts[window]
                end = min(stop, self.order.starts[window + 1])
                yield window, start - base, end - base
                start = end

    def _read_piece(
        self, reader: _ObjectReader, window: int, lo: int, hi: int
    ) -> list[tuple[list[dict], list[bytes]]]:
        located = self.order.locate(window, lo, hi)
        rows_of: dict[int, list[int]] = {}
        for entry, row in located:
            rows_of.setdefault(entry, []).append(row)
        found: dict[tuple[int, int], tuple[list[dict], list[bytes]]] = {}
        for entry, rows in rows_of.items():
            shard = self.catalogue[entry]
            items = self._entry_items(shard)
            slots = {(name, data.view): slot for slot, (name, data) in enumerate(shard.objects)}
            wanted: dict[int, dict[int, str]] = {}  # object slot -> its row -> sample id
            for row in rows:
                for sample in items[row]:
                    slot = slots.get((sample["shard"], sample["view"]))
                    if slot is None:
                        slot = slots[(sample["shard"], None)]
                    wanted.setdefault(slot, {})[sample["index"]] = sample["sample_id"]
            images: dict[str, bytes] = {}
            for slot, samples in wanted.items():
                name, data = shard.objects[slot]
                images |= reader.read(name, data, samples)
            for row in rows:
                for sample in items[row]:
                    if sample["sample_id"] not in images:
                        raise UsageError(
                            f"{self.output.location.uri}: sample {sample['sample_id']} is "
                            f"committed but missing from the data of shard {sample['shard']} "
                            "(`rayaug inspect --verify` lists every breach)"
                        )
                found[(entry, row)] = (items[row], [images[m["sample_id"]] for m in items[row]])
        return [found[key] for key in located]

    def _entry_items(self, entry: ShardView) -> list[list[dict]]:
        """The manifest rows of each item of a catalogue entry, in data-object order: one row
        per item, or the k rows of a source's k views (sources lacking one are left out)."""
        wanted = sorted({*self.columns, "sample_id", "source_key", "view", "index", "shard"})
        rows = [
            r
            for shard in entry.shards
            for r in _view_rows(_manifest_columns(self.output, shard, wanted), self.views)
        ]
        if self.views_per_item == 1:
            items = [[r] for r in sorted(rows, key=lambda r: r["index"])]
        else:
            of_source: dict[str, dict[int, dict]] = {}
            for r in rows:
                of_source.setdefault(r["source_key"], {})[r["view"]] = r
            items = [
                [got[v] for v in self.views]
                for got in of_source.values()
                if len(got) == self.views_per_item
            ]
            items.sort(key=lambda item: (item[0]["shard"], item[0]["index"]))
        if len(items) != entry.samples:
            raise UsageError(
                f"{self.output.location.uri}: the manifests of {entry.name} hold "
                f"{len(items)} items of views {list(self.views)}, their records "
                f"{entry.samples} (`rayaug inspect --verify` lists every breach)"
            )
        return items

    def _item(self, rows: list[dict], images: list[bytes]) -> dict:
        """One item: a sample's image and columns; with several views per item, a list of the
        source's images and of each per-view column, its source columns (label...) once."""
        if self.views_per_item == 1:
            item = {c: _column_value(c, rows[0][c]) for c in self.columns}
            item["image"] = self._image(rows[0], images[0])
            return item
        item = {
            c: rows[0][c] if c in SOURCE_COLUMNS else [_column_value(c, r[c]) for r in rows]
            for c in self.columns
        }
        item["image"] = [self._image(r, image) for r, image in zip(rows, images, strict=True)]
        return item

    def _image(self, row: dict, image: bytes) -> object:
        if not self.decode:
            return image
        try:
            return codec.decode(codec.open_image(image, self._max_pixels))
        except codec.DecodeError as error:
            raise UsageError(
                f"{self.output.location.uri}: sample {row['sample_id']} does not decode ({error})"
            ) from None

    @property
    def _max_pixels(self) -> int:
        return self.output.spec.errors.max_pixels


def _column_value(column: str, value: object) -> object:
    if column in JSON_COLUMNS and isinstance(value, str):
        return json.loads(value)
    return value


def _shards_digest(catalogue: Sequence[ShardView]) -> str:
    names = "\n".join(f"{s.name}:{s.samples}" for s in catalogue)
    return hashlib.sha256(names.encode()).hexdigest()[:16]


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise UsageError(message)
