"""Replay: regenerate one sample from its manifest row and its source bytes alone."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from rayaug import sources
from rayaug.augment import Augmenter, pick_device
from rayaug.ops import from_records
from rayaug.outputs import Output, find_row
from rayaug.partners import Partners
from rayaug.spec import StorageSpec
from rayaug.storage import open_location


@dataclass(frozen=True)
class Replay:
    row: dict
    image: bytes
    source_digest: str | None  # of the source as read now

    @property
    def matches(self) -> bool:
        return hashlib.sha256(self.image).hexdigest() == self.row["sha256"]

    @property
    def source_changed(self) -> bool:
        """The source's bytes are not those the job read: the replay cannot match, and says
        nothing of the output. (Outputs of rayaug < 0.5 recorded no source digest.)"""
        recorded = self.row.get("source_sha256")
        return recorded is not None and recorded != self.source_digest


def replay(output: Output, sample: str, storage: StorageSpec) -> Replay:
    """Regenerate one sample from its manifest row and its source bytes alone."""
    row = find_row(output.location, sample)
    source_location = open_location(output.spec.input.uri, storage)
    source = sources.read_one(
        source_location, output.spec.input, output.plan.format, row["source_uri"], row["source_key"]
    )
    partners = None
    if output.spec.mixes:
        partners = Partners(
            sources.SourceIndex(
                source_location, output.spec.input, output.plan.format, output.plan.units
            )
        )
    device = pick_device(1 if row["device"] == "cuda" else 0)
    augmenter = Augmenter(output.spec, device, partners)
    image = augmenter.replay(source, row["view"], row["seed"], from_records(json.loads(row["ops"])))
    return Replay(row, image, source.digest)
