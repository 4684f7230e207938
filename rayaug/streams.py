"""Each op's random stream for one sample: exactly `numpy.random.default_rng([seed, position])`,
seeded for the views and ops of many sources at once.

A plan seeds one stream per op of every sample (seven for `jobs/imagenet.yaml`, 56 a source at
eight views), and numpy's seeding (a SeedSequence hashing the entropy, then PCG64 seeded from
it) took a fifth of a CPU actor's time. The hash is plain 32-bit arithmetic whose constants do
not depend on the data, so it runs here as numpy array operations over every (seed, position)
at once, and each stream is set into one reused PCG64 per thread: the very same streams
(`tests/test_streams.py` checks them against numpy on thousands of seeds). The algorithm is
numpy's (`numpy/random/bit_generator.pyx`, after O'Neill's `seed_seq`, and PCG64's
`pcg_setseq_128_srandom_r`), stable since numpy 1.17.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Iterable

import numpy as np

_WORD = 0xFFFFFFFF
_PCG_MODULUS = (1 << 128) - 1
_PCG_MULTIPLIER = 0x2360ED051FC65DA44385DF649FCCF645
# SeedSequence's hash constants; it mixes the entropy into a pool of four 32-bit words
_INIT_A, _MULT_A, _INIT_B, _MULT_B = 0x43B0D7E5, 0x931E8875, 0x8B51F9DD, 0x58F38DED
_MIX_L, _MIX_R = np.uint32(0xCA01F9DD), np.uint32(0x4973F715)
_POOL = range(4)
_POOL_MIXES = [(source, target) for source in _POOL for target in _POOL if source != target]
_SHIFT = np.uint32(16)

_local = threading.local()


class Streams:
    """The streams of some samples' ops: `streams(seed, position)` is
    `np.random.default_rng([seed, position])`, valid until the thread's next stream."""

    def __init__(self, seeds: Iterable[int], positions: int) -> None:
        self._positions = positions
        # The streams of a seed are consecutive, position 0 first, at self._first[seed].
        self._first: dict[int, int] = {}
        self._states: list[tuple[int, int]] = []
        # Seeds grouped by their count of words: one entropy array (and one hash) per count.
        by_width: dict[int, list[int]] = defaultdict(list)
        for seed in dict.fromkeys(seeds):
            by_width[len(_words(seed))].append(seed)
        for group in by_width.values():
            self._first |= {
                seed: len(self._states) + index * positions for index, seed in enumerate(group)
            }
            self._states += _pcg64_seeded(_entropy(group, positions))

    def __call__(self, seed: int, position: int) -> np.random.Generator:
        if not 0 <= position < self._positions:
            raise KeyError((seed, position))
        state, increment = self._states[self._first[seed] + position]
        generator = getattr(_local, "generator", None)
        if generator is None:
            generator = _local.generator = np.random.Generator(np.random.PCG64(0))
        generator.bit_generator.state = {
            "bit_generator": "PCG64",
            "state": {"state": state, "inc": increment},
            "has_uint32": 0,
            "uinteger": 0,
        }
        return generator


def _entropy(seeds: list[int], positions: int) -> np.ndarray:
    """The entropy words of [seed, position] for each seed (all of one width), then each
    position: (seeds x positions, width + 1) uint32. A position is one word (0 is [0])."""
    if positions > _WORD + 1:
        raise ValueError(f"{positions} positions: a position must fit one 32-bit word")
    seed_words = np.array([_words(seed) for seed in seeds], dtype=np.uint32)
    entropy = np.empty((len(seeds), positions, seed_words.shape[1] + 1), dtype=np.uint32)
    entropy[:, :, :-1] = seed_words[:, None, :]
    entropy[:, :, -1] = np.arange(positions, dtype=np.uint32)
    return entropy.reshape(len(seeds) * positions, -1)


def _words(value: int) -> list[int]:
    """An integer as SeedSequence takes it: 32-bit words, least significant first; 0 is [0]."""
    words = [value & _WORD]
    value >>= 32
    while value:
        words.append(value & _WORD)
        value >>= 32
    return words


def _pcg64_seeded(entropy: np.ndarray) -> list[tuple[int, int]]:
    """PCG64's (state, increment) once seeded from SeedSequence(row), for each row of
    `entropy` (n, words) uint32. numpy's uint32 arrays wrap as the C code's integers do."""
    hash_const = _INIT_A

    def hashmix(values: np.ndarray) -> np.ndarray:
        nonlocal hash_const
        values = values ^ np.uint32(hash_const)
        hash_const = hash_const * _MULT_A & _WORD
        values = values * np.uint32(hash_const)
        return values ^ (values >> _SHIFT)

    def mix(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        mixed = _MIX_L * x - _MIX_R * y
        return mixed ^ (mixed >> _SHIFT)

    width = entropy.shape[1]
    zeros = np.zeros(len(entropy), np.uint32)
    pool = [hashmix(entropy[:, i] if i < width else zeros) for i in _POOL]
    for source, target in _POOL_MIXES:
        pool[target] = mix(pool[target], hashmix(pool[source]))
    for source in range(len(_POOL), width):
        for target in _POOL:
            pool[target] = mix(pool[target], hashmix(entropy[:, source]))
    words = []
    hash_const = _INIT_B
    for index in range(8):  # generate_state(4, uint64): eight 32-bit words
        values = pool[index % len(_POOL)] ^ np.uint32(hash_const)
        hash_const = hash_const * _MULT_B & _WORD
        values = values * np.uint32(hash_const)
        words.append(values ^ (values >> _SHIFT))
    halves = np.stack(words, axis=1).astype("<u4").view("<u8").tolist()
    return [_pcg64_start(*row) for row in halves]


def _pcg64_start(state_high: int, state_low: int, sequence_high: int, sequence_low: int):
    """PCG64's srandom: the increment from the sequence, one step from 0, the seed added, one
    more step."""
    increment = ((sequence_high << 64 | sequence_low) << 1 | 1) & _PCG_MODULUS
    state = ((state_high << 64 | state_low) + increment) & _PCG_MODULUS
    return (state * _PCG_MULTIPLIER + increment) & _PCG_MODULUS, increment
