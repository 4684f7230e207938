"""The read stage: input formats → work units (what one output shard covers) → source samples.

Formats (`rayaug.formats`): an image folder (sub-folder name = label), Parquet with an
image-bytes column, WebDataset tar shards. Every sample has a stable key: its relative path,
`file:row` (or the key column), or `shard.tar/member-key`. A sample that cannot be read becomes
a SourceSample with `error`; a key seen twice in a unit is quarantined from its second copy on.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import queue
import threading
from collections.abc import Iterable, Iterator, Sequence

from rayaug import commit
from rayaug.errors import UsageError
from rayaug.formats import detect, input_format, mix_refusal
from rayaug.records import Listing, SourceSample, WorkUnit
from rayaug.spec import InputSpec
from rayaug.storage import Location


def list_input(location: Location, spec: InputSpec, shard_size: int, seed: int = 0) -> Listing:
    """Plan the input into work units of at most `shard_size` source images (a tar: one unit);
    where the format decides which sources share a unit (a folder), the job's `seed` draws it."""
    files = location.list(recursive=True)
    if not files:
        raise UsageError(f"input {location.uri} holds no files")
    files = _listed_sources(location, files)
    name = detect(spec.format, location.uri, [path for path, _ in files])
    return input_format(name).plan(location, spec, files, shard_size, seed)


# The records every rayaug output holds under `_job/` (one is enough to know one).
_JOB_RECORDS = (commit.SPEC, commit.LOCK, commit.FINGERPRINT, commit.PLAN)


def _outputs_in(files: list[tuple[str, int]]) -> set[str]:
    """The prefixes ("" for the listed root itself, else "folder/") of every rayaug output in
    a listing (this job's or another's): a folder holding a `_job/` record is one."""
    return {
        path.removesuffix(record)
        for path, _ in files
        for record in _JOB_RECORDS
        if path == record or path.endswith(f"/{record}")
    }


def without_outputs(files: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """A listing less every rayaug output in it (data, manifests, records): never a source."""
    outputs = tuple(_outputs_in(files))
    return [(path, size) for path, size in files if not path.startswith(outputs)]


def _listed_sources(location: Location, files: list[tuple[str, int]]) -> list[tuple[str, int]]:
    if "" in _outputs_in(files):
        raise UsageError(
            f"input {location.uri} is a rayaug output: to augment its samples, set input.uri "
            f"to its data folder ({location.uri_of('data')})"
        )
    return without_outputs(files)


def check_apart(source: Location, out: Location) -> None:
    """Refuse an output inside its input or an input inside its output, before anything is
    written: the job would list its own files as sources, or write among them."""
    if source.holds(out):
        where = "the same folder as" if out.root == source.root else "inside"
        held = ""
        if out.exists(commit.SPEC):  # made before rayaug refused this: how to finish it
            held = (
                "; it already holds a job: move it (every file under it) out of the input, "
                "then finish it with `rayaug resume NEW_URI`"
            )
        raise UsageError(
            f"output {out.uri} is {where} its input {source.uri}: the job would read its own "
            f"files as sources. Set output.uri to a folder outside the input{held}"
        )
    if out.holds(source):
        raise UsageError(
            f"input {source.uri} is inside the output {out.uri}: the job would write among its "
            "own sources. Set output.uri to a folder outside the input"
        )


def read_unit(location: Location, spec: InputSpec, fmt: str, unit: WorkUnit) -> list[SourceSample]:
    """Every source sample of one unit, in a stable order; duplicates are marked, not dropped."""
    return list(stream_unit(location, spec, fmt, unit))


def stream_unit(
    location: Location, spec: InputSpec, fmt: str, unit: WorkUnit
) -> Iterator[SourceSample]:
    """`read_unit`, each sample read when it is asked for (a tar is still one read)."""
    return _mark_duplicates(input_format(fmt).read_unit(location, spec, unit))


def _mark_duplicates(samples: Iterable[SourceSample]) -> Iterator[SourceSample]:
    """A repeated key would make two samples with one id: later copies are quarantined."""
    seen: dict[str, int] = {}
    for sample in samples:
        copies = seen.get(sample.key, 0)
        seen[sample.key] = copies + 1
        if copies:
            reason = f"duplicate source key {sample.key!r} (copy {copies + 1})"
            sample = SourceSample(
                f"{sample.key}~dup{copies}", sample.uri, None, sample.label, reason
            )
        yield sample


class ReadAhead:
    """Iterates over `samples` read on a thread of its own, at most `budget` bytes of source
    data ahead of the consumer (at least one sample), and the next one read, waiting for room.

    A shard actor runs two units at once so that one's reads overlap the other's augmenting;
    reading a whole unit first held 256 sources' bytes per unit (768 MB of 12 MP photos) while
    it waited for the device and while it was augmented. An error of the reads is raised to
    the consumer, in order, as the read itself would have raised it.
    """

    _END = object()

    def __init__(self, samples: Iterable[SourceSample], budget: int) -> None:
        self._budget = budget
        self._buffered = 0  # bytes read and not yet taken
        self._closed = False
        self._room = threading.Condition()
        self._ready: queue.SimpleQueue = queue.SimpleQueue()
        reader = threading.Thread(
            target=self._read, args=(samples,), name="rayaug-read-ahead", daemon=True
        )
        reader.start()

    def __iter__(self) -> Iterator[SourceSample]:
        while (item := self._ready.get()) is not self._END:
            if isinstance(item, BaseException):
                raise item
            sample, size = item
            with self._room:
                self._buffered -= size
                self._room.notify()
            yield sample

    def close(self) -> None:
        """Stop reading (a consumer that gave up); a read under way finishes on its own."""
        with self._room:
            self._closed = True
            self._room.notify()

    def __enter__(self) -> ReadAhead:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _read(self, samples: Iterable[SourceSample]) -> None:
        try:
            for sample in samples:
                size = sample.size
                with self._room:
                    self._room.wait_for(functools.partial(self._may_buffer, size))
                    if self._closed:
                        return
                    self._buffered += size
                self._ready.put((sample, size))
        except BaseException as error:  # noqa: BLE001 - handed to the consumer, raised there
            self._ready.put(error)
            return
        self._ready.put(self._END)

    def _may_buffer(self, size: int) -> bool:
        """Whether a sample of `size` bytes may join the buffer now (or reading should stop)."""
        return self._closed or not self._buffered or self._buffered + size <= self._budget


def read_one(
    location: Location, spec: InputSpec, fmt: str, source_uri: str, key: str
) -> SourceSample:
    """One source sample by key, for replay."""
    relative = source_uri[len(location.uri) :].lstrip("/")
    samples = input_format(fmt).read_source(location, spec, relative)
    found = next((s for s in samples if s.key == key), None)
    if found is None:
        raise UsageError(f"source {key!r} is no longer in {source_uri}")
    return found


class SourceIndex:
    """Every source of the job by position (in plan order): what mix ops pick partners from.
    Only an input format with random access has one (not WebDataset: a tar has no index)."""

    def __init__(
        self, location: Location, spec: InputSpec, fmt: str, units: Sequence[WorkUnit]
    ) -> None:
        refusal = mix_refusal(fmt)
        if refusal is not None:
            raise UsageError(refusal)
        self.location, self.spec, self.fmt, self.units = location, spec, fmt, list(units)
        self._starts = list(itertools.accumulate((u.planned or 0 for u in units), initial=0))
        self._read = input_format(fmt).positions(location, spec)

    def __len__(self) -> int:
        return self._starts[-1]

    def read(self, index: int) -> SourceSample:
        """The source at `index` (0 ≤ index < len), as the job's read stage would give it."""
        number = bisect.bisect_right(self._starts, index) - 1
        return self._read(self.units[number], index - self._starts[number])

    def find(self, uri: str, key: str) -> SourceSample:
        """A source by its recorded URI and key (what a replay of a mix reads)."""
        return read_one(self.location, self.spec, self.fmt, uri, key)
