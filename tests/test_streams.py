"""rayaug.streams: an op's stream is numpy's `default_rng([seed, position])`, draw for draw."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from rayaug.records import sample_seed
from rayaug.streams import Streams


def _seeds() -> list[tuple[int, int]]:
    rng = np.random.default_rng(2026)
    pairs = [(sample_seed(7, f"class/{i:06d}.jpg", i % 9), i % 40) for i in range(2000)]
    # Small and zero seeds and positions: one 32-bit word, or the zero word, instead of two
    pairs += [(int(rng.integers(0, 2**63)) >> int(rng.integers(0, 64)), 0) for _ in range(500)]
    return pairs + [(0, 0), (0, 5), (1, 0), (2**32, 1), (2**63 - 1, 40)]


def test_every_stream_is_numpys_default_rng_of_seed_and_position() -> None:
    pairs = _seeds()
    streams = Streams({seed for seed, _ in pairs}, 41)
    for seed, position in pairs:
        expected = np.random.default_rng([seed, position]).bit_generator.state
        assert streams(seed, position).bit_generator.state == expected, (seed, position)


def test_the_streams_of_many_sources_seeded_at_once_are_numpys() -> None:
    """What the augment stage seeds for a group of sources: every view's seed and the shared
    one, at every position, in one call (seeds of one and of two words mixed)."""
    views = [[sample_seed(3, f"s{i}", view) for view in [-1, *range(8)]] for i in range(64)]
    seeds = [seed for source in views for seed in source] + [5, 2**32 + 5]
    streams = Streams(seeds, 7)
    for seed in seeds[::5] + [5, 2**32 + 5]:
        for position in range(7):
            expected = np.random.default_rng([seed, position]).random(3)
            np.testing.assert_array_equal(streams(seed, position).random(3), expected)


def test_a_position_beyond_the_seeded_ones_is_no_other_seeds_stream() -> None:
    streams = Streams([1, 2], 3)
    with pytest.raises(KeyError):
        streams(1, 3)
    with pytest.raises(KeyError):
        streams(3, 0)


@pytest.mark.parametrize("draw", ["random", "uniform", "integers", "permutation", "normal"])
def test_the_draws_are_numpys(draw: str) -> None:
    calls = {
        "random": lambda g: g.random(3),
        "uniform": lambda g: g.uniform(0.1, 2.0, 3),
        "integers": lambda g: g.integers(0, 1000, 3),
        "permutation": lambda g: g.permutation(["a", "b", "c", "d"]),
        "normal": lambda g: g.standard_normal(3),
    }
    for seed, position in _seeds()[::50]:
        expected = calls[draw](np.random.default_rng([seed, position]))
        actual = calls[draw](Streams([seed], position + 1)(seed, position))
        np.testing.assert_array_equal(actual, expected)


def test_threads_do_not_share_a_stream() -> None:
    """Two actors' threads (a Ray actor runs two calls at once) each get their own."""
    results: dict[int, list[float]] = {}
    barrier = threading.Barrier(2)

    def draw(seed: int) -> None:
        stream = Streams([seed], 1)(seed, 0)
        barrier.wait()  # the other thread seeds its stream now
        results[seed] = list(stream.random(4))

    threads = [threading.Thread(target=draw, args=(seed,)) for seed in (11, 12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for seed in (11, 12):
        assert results[seed] == list(np.random.default_rng([seed, 0]).random(4))
