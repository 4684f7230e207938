"""A shard's encoded output, held until the sink writes it: in memory up to a budget, the rest
on the actor's local disk.

A shard's data objects can only be written once all of its views are made (by_view: each
view's object holds every source of the shard), so its encoded output is held whole: 2,048
views of 512 px are about 86 MB of JPEG, twice that with overlapping calls. The first
`IN_MEMORY_BYTES` of it stay in the heap; the rest goes to an unnamed temporary file, which
sits in the kernel's page cache while memory is free and goes to disk when it is not. So the
actor's own memory is what it decodes and augments plus that budget, whatever the shard's
size, its views or the output's size. The file has no name from the start, so a killed actor
leaves nothing behind.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from types import TracebackType

from rayaug.errors import RayaugError

# Encoded bytes of one shard call kept in memory before the rest goes to the file. A shard of
# 224 px views at eight views (2,048 JPEGs, about 40 MB) stays mostly in memory: writing each
# image to the file and reading it back for its object cost 2-3 % of a sample there. Per call:
# an actor with overlapping calls holds twice this.
IN_MEMORY_BYTES = 32 << 20


class SpillFile:
    """Append-only bytes of one shard call: the first `in_memory` bytes kept as they are, the
    rest in the file, read back by position, from any thread."""

    def __init__(self, folder: str | None = None, in_memory: int = IN_MEMORY_BYTES) -> None:
        """`folder`: where the unnamed file is made (default: TMPDIR, as `tempfile` picks)."""
        self.folder = folder or tempfile.gettempdir()
        self._memory_left = in_memory
        try:
            self._file = tempfile.TemporaryFile(dir=self.folder)  # noqa: SIM115 - see close()
        except OSError as error:
            raise self._cannot_hold(error) from error
        self._end = 0

    def hold(self, data: bytes) -> bytes | Spilled:
        """`data` itself while the memory budget lasts; else appended to the file, and where it
        is returned, with its sha256 (taken now, while the bytes are in memory: the manifest
        needs it, and a read back would cost a copy)."""
        if len(data) <= self._memory_left and self._memory_left:  # 0: everything on disk
            self._memory_left -= len(data)
            return data
        at, view = self._end, memoryview(data)
        try:
            while view:
                view = view[os.pwrite(self._file.fileno(), view, self._end) :]
                self._end = at + len(data) - len(view)
        except OSError as error:
            raise self._cannot_hold(error) from error
        return Spilled(self, at, len(data), hashlib.sha256(data).hexdigest())

    def _cannot_hold(self, error: OSError) -> RayaugError:
        return RayaugError(
            f"the actor's local disk ({self.folder}, set by TMPDIR) could not hold "
            f"a shard's output until it is written: {error}"
        )

    def read(self, offset: int, length: int) -> bytes:
        data = os.pread(self._file.fileno(), length, offset)
        if len(data) != length:
            raise OSError(f"spill file: {len(data)} of {length} bytes at {offset}")
        return data

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> SpillFile:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()


@dataclass(frozen=True)
class Spilled:
    """Where one encoded image is in a spill file: its bytes are read when asked for."""

    file: SpillFile
    offset: int
    length: int
    sha256: str

    def read(self) -> bytes:
        return self.file.read(self.offset, self.length)
