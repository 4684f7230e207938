"""Mix partners: the other sources a mix op (MixUp, CutMix, Mosaic) combines a sample with.

The augment stage does no I/O: it asks this provider for a step's partners, and the provider
reads them through the input's random access (`sources.SourceIndex`) and hands them back
decoded, by the stage's own `decode`. The rules of what a partner may cost live here:
- an image that cannot be read or decoded gives way to the next source (up to PARTNER_TRIES,
  then the sample has no partner: `NoPartner`, quarantined as the sample's own failure);
- a storage failure is raised as it is: it is not the image's fault, so the shard fails whole,
  uncommitted, and a retry or `rayaug resume` redoes it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from rayaug.ops import Params
from rayaug.records import SourceSample
from rayaug.sources import SourceIndex

# After this many unusable candidates in a row, the sample is quarantined.
PARTNER_TRIES = 8

Decoded = TypeVar("Decoded")


class NoPartner(ValueError):
    """No usable partner among the candidates a pick allows."""


class Partners:
    """The job's whole source list, by position, as mix partners."""

    def __init__(self, index: SourceIndex) -> None:
        self.index = index

    def of_step(
        self,
        params: Params,
        count: int,
        exclude: str,
        decode: Callable[[SourceSample, int], Decoded],
    ) -> list[tuple[SourceSample, Decoded]]:
        """A mix step's `count` partners: those recorded in its params (a replay reads exactly
        them), else those its `picks` choose. `decode(source, number)` turns partner `number`
        (1-based) into what the stage mixes."""
        recorded = params.get("partners")
        if recorded is not None:
            found = [self.index.find(record["uri"], record["key"]) for record in recorded]
            return [(source, decode(source, n)) for n, source in enumerate(found, 1)]
        return [
            self._pick(pick, exclude, lambda source, n=n: decode(source, n))
            for n, pick in enumerate(params["picks"][:count], 1)
        ]

    def _pick(
        self, pick: float, exclude: str, decode: Callable[[SourceSample], Decoded]
    ) -> tuple[SourceSample, Decoded]:
        """Source ⌊pick·N⌋, never the sample itself; an unusable one gives way to the next."""
        total = len(self.index)
        first, failures = int(pick * total), []
        for position in range(first, first + PARTNER_TRIES):
            candidate = self.index.read(position % total)  # a storage failure propagates
            if candidate.key == exclude and total > 1:
                continue
            try:
                if candidate.error is not None:
                    raise ValueError(candidate.error)
                return candidate, decode(candidate)
            except Exception as error:  # noqa: BLE001 - a bad partner is the next one's turn
                failures.append(f"{candidate.key}: {error}")
        raise NoPartner(
            f"no usable mix partner among sources {first}..{first + PARTNER_TRIES - 1}: "
            + "; ".join(failures[:3])
        )
