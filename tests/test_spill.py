"""rayaug.spill: a shard's encoded output held in memory up to a budget, the rest on local disk,
read back as it was written."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from rayaug.errors import RayaugError
from rayaug.records import AugmentedSample
from rayaug.spill import Spilled, SpillFile


def test_what_is_held_reads_back_byte_for_byte_in_any_order_and_from_any_thread(
    tmp_path: Path,
) -> None:
    blobs = [os.urandom(n) for n in (0, 1, 4096, 70_001, 3)]
    with SpillFile(str(tmp_path), in_memory=0) as spill:
        held = [spill.hold(blob) for blob in blobs]
        assert [h.length for h in held] == [len(b) for b in blobs]
        assert [h.read() for h in reversed(held)] == blobs[::-1]
        read_elsewhere: list[bytes] = []
        reader = threading.Thread(target=lambda: read_elsewhere.extend(h.read() for h in held))
        reader.start()
        reader.join()
        assert read_elsewhere == blobs


def test_what_fits_the_memory_budget_stays_as_it_is_and_the_rest_goes_to_the_file(
    tmp_path: Path,
) -> None:
    """A blob that fits what is left of the budget is kept as it is (no write, no copy); one
    that does not is appended to the file."""
    blobs = [os.urandom(n) for n in (600, 500, 300, 120, 200)]
    with SpillFile(str(tmp_path), in_memory=1_000) as spill:
        held = [spill.hold(blob) for blob in blobs]
        assert held[0] is blobs[0] and held[2] is blobs[2]
        assert all(isinstance(held[i], Spilled) for i in (1, 3, 4))
        assert [held[i].read() for i in (1, 3, 4)] == [blobs[i] for i in (1, 3, 4)]
        assert [held[i].offset for i in (1, 3, 4)] == [0, 500, 620]


def test_a_held_sample_reports_the_sha256_of_its_bytes(tmp_path: Path) -> None:
    """The manifest's sha256 of a spilled sample is taken as it is held, of the same bytes."""
    image = os.urandom(20_000)
    sample = AugmentedSample("k", "/in/k", 0, 1, None, [], (2, 2), image, 2, 2)
    with SpillFile(str(tmp_path), in_memory=0) as spill:
        held = dataclasses.replace(sample, encoded=spill.hold(image))
        assert held.sha256 == sample.sha256 == hashlib.sha256(image).hexdigest()
        assert held.image == image


def test_the_file_has_no_name_so_a_killed_actor_leaves_nothing(tmp_path: Path) -> None:
    with SpillFile(str(tmp_path), in_memory=0) as spill:
        spill.hold(b"x" * 100_000)
        assert list(tmp_path.iterdir()) == []
    assert list(tmp_path.iterdir()) == []


def test_a_full_disk_is_a_clear_error_naming_the_folder(tmp_path: Path) -> None:
    """A real write failure: the child process may write no file larger than 1 KiB."""
    child = f"""
import resource, signal
from rayaug.errors import RayaugError
from rayaug.spill import SpillFile
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))
with SpillFile({str(tmp_path)!r}, in_memory=0) as spill:
    spill.hold(b"x" * 1000)
    try:
        spill.hold(b"y" * 4096)
    except RayaugError as error:
        print(error)
"""
    done = subprocess.run(
        [sys.executable, "-c", child], capture_output=True, text=True, timeout=60, check=True
    )
    message = done.stdout.strip()
    assert message.startswith(f"the actor's local disk ({tmp_path}, set by TMPDIR) could not hold")
    assert "File too large" in message


def test_a_folder_that_cannot_be_written_is_the_same_clear_error(tmp_path: Path) -> None:
    missing = tmp_path / "gone"
    with pytest.raises(RayaugError, match=rf"local disk \({missing}, set by TMPDIR\) could not"):
        SpillFile(str(missing))


@pytest.mark.parametrize("size", [1, 10_000])
def test_a_short_read_is_an_error_not_truncated_bytes(tmp_path: Path, size: int) -> None:
    with SpillFile(str(tmp_path), in_memory=0) as spill:
        spill.hold(b"z" * size)
        with pytest.raises(OSError, match="bytes at"):
            spill.read(0, size + 1)
