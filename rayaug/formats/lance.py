"""Output: one Lance dataset, `data.lance/` under the output, with the rows of DATA_SCHEMA.

Each shard's actor writes the shard's rows as Lance fragment(s), new data files under
`data.lance/data/` (by_view: fragments of one view each; every row has its `view` column), and
the shard's manifest records their metadata and which view each data file holds: the manifest
stays the shard's commit record. Only the driver commits a dataset version, at the end of a run (a
resume's too): the version of exactly the committed shards' fragments, in shard order
(`Overwrite`, so a resume re-commits the whole set and never a fragment twice). A shard that
was retried wrote new files; only those its manifest records are referenced, and the others
are orphans, removed with the job's other orphans.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING

import lance
from lance.file import LanceFileReader, ReaderResults
from lance.fragment import FragmentMetadata, write_fragments

from rayaug.commit import manifest_metadata
from rayaug.formats.base import (
    DATA_SCHEMA,
    DataObject,
    OutputFormat,
    data_table,
    images_of,
    objects_record,
    recorded_objects,
    view_groups,
)
from rayaug.records import AugmentedSample
from rayaug.storage import retrying

if TYPE_CHECKING:
    import pyarrow as pa

    from rayaug.spec import OutputSpec
    from rayaug.storage import Location

DATASET = "data.lance"
FRAGMENTS_KEY = "rayaug.lance_fragments"  # in a manifest's file metadata: JSON list


class LanceOutput(OutputFormat):
    name = "lance"
    folder = f"{DATASET}/data"

    def write(
        self,
        out: Location,
        shard: str,
        samples: list[AugmentedSample],
        output: OutputSpec,
        by_view: bool,
    ) -> dict[str, str]:
        fragments, objects = [], []
        for view, group in view_groups(samples, by_view):
            written = self._write_fragments(out, shard, group)
            fragments += written
            objects += [  # a fragment of one table written whole is one data file
                DataObject(f"{self.folder}/{f.files[0].path}", view, f.physical_rows)
                for f in written
            ]
        return {FRAGMENTS_KEY: json.dumps([f.to_json() for f in fragments])} | objects_record(
            objects
        )

    def _write_fragments(
        self, out: Location, shard: str, samples: list[AugmentedSample]
    ) -> list[FragmentMetadata]:
        return retrying(
            lambda: write_fragments(
                data_table(samples),
                out.object_store_uri(DATASET),
                schema=DATA_SCHEMA,
                # "overwrite" only assigns field ids from the schema alone (the same in every
                # shard, existing dataset or not); it commits nothing.
                mode="overwrite",
                storage_options=out.object_store_options(),
            ),
            f"writing {out.uri_of(DATASET)} (shard {shard})",
            out.attempts,
        )

    def objects(self, shard: str, metadata: dict[str, str]) -> list[DataObject]:
        recorded = recorded_objects(metadata)
        if recorded is not None:
            return recorded
        fragments = _parsed(metadata[FRAGMENTS_KEY])
        return [DataObject(f"{self.folder}/{p}", None, None) for p in _files(fragments)]

    def read_object(
        self, out: Location, output: OutputSpec, data: DataObject, masks: bool = False
    ) -> dict[str, bytes]:
        """A data file read with Lance's file reader: a shard committed by a running job is
        readable before the driver commits the dataset version."""
        return images_of(_read_file(out, data, masks, lambda reader: reader.read_all()), masks)

    def picks_rows(self, data: DataObject) -> bool:
        # A data file's rows are its samples in the manifest's `index` order wherever the
        # manifest records the shard's objects (one fragment, so one file, per object).
        return data.samples is not None

    def read_rows(
        self, out: Location, output: OutputSpec, data: DataObject, rows: list[int]
    ) -> dict[str, bytes]:
        """Only those rows: Lance fetches just their pages, so DataLoader workers that share a
        cut window do not each read its files whole."""
        return images_of(_read_file(out, data, False, lambda reader: reader.take_rows(rows)), False)

    def finish(self, out: Location, shards: set[str]) -> None:
        fragments = [f for shard in sorted(shards) for f in _fragments(out, shard)]
        if self._version_files(out) == _files(fragments):
            return  # a resume of a finished job: that version is committed already
        operation = lance.LanceOperation.Overwrite(DATA_SCHEMA, fragments)
        retrying(
            lambda: lance.LanceDataset.commit(
                out.object_store_uri(DATASET),
                operation,
                storage_options=out.object_store_options(),
            ),
            f"committing {out.uri_of(DATASET)}",
            out.attempts,
        )

    def breaches(self, out: Location, shards: set[str]) -> list[str]:
        wanted = _files([f for shard in sorted(shards) for f in _fragments(out, shard)])
        found = self._version_files(out)
        if found == wanted:
            return []
        held = "no version" if found is None else f"{len(found)} data files"
        return [
            f"Lance dataset {out.uri_of(DATASET)}: its latest version holds {held}, the "
            f"committed shards {len(wanted)}"
        ]

    def _version_files(self, out: Location) -> list[str] | None:
        """The data files of the dataset's latest version, in order; None before the first."""
        if not out.exists(f"{DATASET}/_versions"):
            return None
        dataset = retrying(
            lambda: lance.dataset(
                out.object_store_uri(DATASET), storage_options=out.object_store_options()
            ),
            f"reading {out.uri_of(DATASET)}",
            out.attempts,
        )
        return _files([fragment.metadata for fragment in dataset.get_fragments()])


OUTPUT = LanceOutput()


def _read_file(
    out: Location, data: DataObject, masks: bool, read: Callable[[LanceFileReader], ReaderResults]
) -> pa.Table:
    """The sample ids and images (or masks) of a data file, as `read` takes them from it."""
    uri = out.object_store_uri(data.path)  # abfs:// as Lance knows it (abfss://)
    columns = ["sample_id", "mask" if masks else "image"]
    return retrying(
        lambda: read(LanceFileReader(uri, out.object_store_options(), columns=columns)).to_table(),
        f"reading {out.uri_of(data.path)}",
        out.attempts,
    )


def _fragments(out: Location, shard: str) -> list[FragmentMetadata]:
    """The fragments a committed shard's manifest records."""
    return _parsed(manifest_metadata(out, shard)[FRAGMENTS_KEY])


def _parsed(recorded: str) -> list[FragmentMetadata]:
    return [FragmentMetadata.from_json(json.dumps(fragment)) for fragment in json.loads(recorded)]


def _files(fragments: list[FragmentMetadata]) -> list[str]:
    """The data files of fragments (relative to the dataset's `data/`), in order."""
    return [data_file.path for fragment in fragments for data_file in fragment.files]
