"""rayaug.formats.lance: the Lance output, read back with Lance and Ray Data as a user would.

Shards write fragments, their manifests record them, and the driver commits the dataset version
of exactly the committed shards' fragments: locally, on the session's S3 server and on its
Azurite (az://, abfss://, abfs://), after a retried shard, and after a driver killed between a
shard's fragment and its manifest. gs:// is refused at validation (tests/test_spec.py says why);
the GCS emulator case below is skipped with the calls it lacks.
"""

from __future__ import annotations

import hashlib
import uuid
from pathlib import Path

import lance
import pyarrow as pa
import pytest
from click.testing import CliRunner
from conftest import BUCKET, RecordingProgress
from faults import injection
from test_sinks import SERVERS, VERSIONS, _augmented, _result, output_at

import rayaug
from rayaug import commit, outputs
from rayaug.cli import main
from rayaug.formats import output_format
from rayaug.formats.lance import DATASET
from rayaug.job import RunOptions, run_job
from rayaug.replay import replay
from rayaug.reports.summary import verify
from rayaug.sampledata import SamplePhoto
from rayaug.sinks import WriteContext, finish_output, orphans, write_shard
from rayaug.spec import OutputSpec, StorageSpec, parse_spec
from rayaug.storage import Location, open_location

SHARDS = ("part-00000", "part-00001", "part-00002")


def _rows(dataset: lance.LanceDataset) -> list[tuple[str, str]]:
    """(sample_id, sha256 of the image) of every row, in the dataset's order."""
    table = dataset.to_table(columns=["sample_id", "image"])
    return [
        (sample, hashlib.sha256(image).hexdigest())
        for sample, image in zip(
            table["sample_id"].to_pylist(), table["image"].to_pylist(), strict=True
        )
    ]


def _manifest_rows(out: Location) -> list[tuple[str, str]]:
    manifest = outputs.manifests(out)
    return list(zip(manifest["sample_id"].to_pylist(), manifest["sha256"].to_pylist(), strict=True))


# gcp-storage-emulator 2026.7.19 answers 501 Not Implemented to the XML API calls Lance's
# object store makes on gs:// (checked: GET /BUCKET?list-type=2, HEAD /BUCKET/OBJECT, POST
# /BUCKET/OBJECT?uploads; it serves only the XML API's plain PUT and GET of one object). Lance's
# OpenDAL store (use_opendal) speaks the JSON API it serves, but its first upload fails: the
# emulator answers an upload sent without Content-Type with "contentType": null.
GCS_EMULATOR_LACKS = (
    "gcp-storage-emulator answers 501 to the GCS XML API calls Lance's object store makes "
    "(list GET /BUCKET?list-type=2, HEAD /BUCKET/OBJECT, multipart POST ?uploads), and "
    "Lance's use_opendal store rejects its upload answer (contentType null); "
    "output.format lance is refused on gs:// at validation"
)
STORES = [
    pytest.param(scheme, marks=[pytest.mark.s3, *skips])
    for scheme, skips in (
        ("s3", []),
        ("az", []),
        ("gs", [pytest.mark.skip(reason=GCS_EMULATOR_LACKS)]),
    )
]
# Azurite's containers by the other Azure schemes; Lance itself opens no abfs:// URI.
ABFS = pytest.param("abfs", marks=pytest.mark.s3)


@pytest.mark.parametrize("layout", ["by_source", "by_view"])
@pytest.mark.parametrize(
    "where", ["local", *STORES, pytest.param("abfss", marks=pytest.mark.s3), ABFS]
)
def test_the_dataset_version_holds_exactly_the_committed_shards(
    where: str,
    layout: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    photos: list[SamplePhoto],
) -> None:
    out = output_at(where, request, tmp_path)
    output = OutputSpec(uri=out.uri, format="lance")
    context = WriteContext(output, VERSIONS, 7, layout)
    results = [_result(photos[3 * i : 3 * i + 3]) for i in range(len(SHARDS))]
    for shard, result in zip(SHARDS, results, strict=True):
        write_shard(out, shard, result, context)
    # The fragments go to Lance's own files, before the shard's errors and manifest.
    assert out.writes[:2] == [commit.errors_path(SHARDS[0]), commit.manifest_path(SHARDS[0])]
    lance_output = output_format("lance")
    first_try = lance_output.data_objects(out, SHARDS[1])
    write_shard(out, SHARDS[1], results[1], context)  # a retry writes new fragment files
    never = lance_output.write(  # never committed
        out, "part-00009", _augmented(photos[:1]), output, layout == "by_view"
    )
    committed = commit.committed_shards(out)
    assert committed == set(SHARDS)
    # A running job's committed shard reads back before any dataset version exists.
    images = lance_output.read_images(out, output, SHARDS[2])
    assert sorted(images) == sorted(s.sample_id for s in results[2].samples)

    finish_output(out, output, committed)
    uri = out.object_store_uri(DATASET)  # abfs:// is opened at abfss://, as a user must
    dataset = lance.dataset(uri, storage_options=out.object_store_options())
    assert dataset.count_rows() == 3 * 6
    assert _rows(dataset) == _manifest_rows(out)  # shard order, each sample once
    if layout == "by_view":  # fragments of one view each, in the manifest's (view-major) order
        views = dataset.to_table(columns=["view"]).column("view").to_pylist()
        assert views == [0, 0, 0, 1, 1, 1] * 3
    assert lance_output.breaches(out, committed) == []
    # Orphans: the retried shard's first fragment and the uncommitted shard's.
    lost = orphans(out, output, committed)
    unvouched = output_format("lance").objects("part-00009", never)
    assert set(lost) == set(first_try) | {o.path for o in unvouched}
    # Finishing again (a resume of a finished job) commits no new version.
    finish_output(out, output, committed)
    assert lance.dataset(uri, storage_options=out.object_store_options()).version == dataset.version


def _reader_options(scheme: str, server) -> dict[str, str]:
    """What a user passes Lance to read the dataset on this server; the AWS keys come from the
    environment, the Azure key is given (object_store knows no connection string)."""
    if scheme == "s3":
        return {
            "endpoint": f"http://{server.endpoint}",
            "region": server.region,
            "allow_http": "true",
        }
    return {
        "azure_storage_account_name": server.account,
        "azure_storage_account_key": server.key,
        "azure_endpoint": f"http://{server.endpoint}/{server.account}",
        "allow_http": "true",
    }


def _job_uri(scheme: str, server) -> str:
    """A fresh output URI; abfs:// in its CONTAINER@ACCOUNT.dfs.core.windows.net form."""
    prefix = f"{uuid.uuid4().hex[:8]}/out"
    if scheme == "abfs":
        return f"abfs://{BUCKET}@{server.account}.dfs.core.windows.net/{prefix}"
    return f"{scheme}://{BUCKET}/{prefix}"


@pytest.mark.parametrize("scheme", [*STORES, ABFS])
def test_a_job_writes_a_lance_dataset_to_object_storage(
    scheme: str, request: pytest.FixtureRequest, ray_cluster: str, photo_folder: Path
) -> None:
    """A job through the session Ray, whose workers found the store as a node's do (from their
    environment: the AWS variables; Azure's connection string, key included)."""
    import ray

    server = request.getfixturevalue(SERVERS[scheme])
    uri = _job_uri(scheme, server)
    spec = parse_spec(
        {
            "input": {"uri": str(photo_folder)},
            "output": {"uri": uri, "format": "lance", "shard_size": 10, "size": 48},
            "views": 2,
            "ops": [{"name": "horizontal_flip"}, {"name": "rotation", "degrees": 10}],
            "execution": {"batch_size": 8, "concurrency": 1},
        }
    )
    run_job(spec, RunOptions(), RecordingProgress())
    out = open_location(uri, spec.storage)
    assert verify(outputs.recorded_output(out)) == []
    verified = CliRunner().invoke(main, ["inspect", uri, "--verify"], catch_exceptions=False)
    assert verified.exit_code == 0 and "verify: OK" in verified.output, verified.output
    options = _reader_options(scheme, server)
    # A user reads an abfs:// output's dataset at abfss://, the same container and path.
    at = f"{uri}/{DATASET}".replace("abfs://", "abfss://", 1)
    dataset = lance.dataset(at, storage_options=options)
    assert dataset.count_rows() == 48 and _rows(dataset) == _manifest_rows(out)
    assert dataset.schema.field("image").type == pa.binary()
    rows = ray.data.read_lance(at, storage_options=options).take_all()
    assert sorted(r["sample_id"] for r in rows) == sorted(s for s, _ in _manifest_rows(out))
    # The epoch reader serves view 1's samples, each once, with the bytes the manifest records.
    view = rayaug.open_output(uri)
    served = {i["sample_id"]: i["image"] for i in view.epoch(1, decode=False)}
    recorded = dict(_manifest_rows(out))
    assert sorted(served) == sorted(s for s in recorded if s.endswith("#1"))
    assert all(hashlib.sha256(b).hexdigest() == recorded[s] for s, b in served.items())
    sample = rows[0]["sample_id"]
    assert replay(outputs.recorded_output(out), sample, spec.storage).matches
    # The key handed to Lance per call (Azure) is in no object of the output.
    secret = (server.secret_key if scheme == "s3" else server.key).encode()
    assert not any(secret in out.read_bytes(path) for path, _ in out.list(recursive=True))


@pytest.mark.slow
def test_a_killed_lance_job_resumes_to_the_uninterrupted_dataset(
    ray_cluster: str, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    import ray

    source, planned = injection.shared_input(tmp_path_factory)
    killed, clean = tmp_path / "killed", tmp_path / "clean"
    data = injection.spec_data(source, killed, concurrency=1)
    data["output"]["format"] = "lance"
    marker, shard = tmp_path / "paused.json", "part-00003"
    driver = injection.start_driver(
        injection.write_spec(tmp_path / "job.yaml", data),
        ray_cluster,
        tmp_path / "driver.log",
        worker_faults={"pause_before_manifest": {"shard": shard, "marker": str(marker)}},
    )
    try:
        # Killed between the shard's fragment and its manifest: an orphan fragment.
        injection.wait_for(marker.exists, driver, f"{shard} to pause before its manifest")
        assert list((killed / DATASET / "data").glob("*.lance"))
        assert not (killed / DATASET / "_versions").exists()  # no version before the end
    finally:
        driver.kill()
    assert shard not in commit.committed_shards(open_location(str(killed), StorageSpec()))

    run_job(parse_spec(data), RunOptions(), RecordingProgress())  # the resume
    run_job(
        parse_spec(data | {"output": data["output"] | {"uri": str(clean)}}),
        RunOptions(),
        RecordingProgress(),
    )
    resumed, uninterrupted = (lance.dataset(str(o / DATASET)) for o in (killed, clean))
    assert _rows(resumed) == _rows(uninterrupted)  # same rows, same bytes, same order
    assert sorted(s for s, _ in _rows(resumed)) == planned  # each planned sample once
    out = open_location(str(killed), StorageSpec())
    assert _rows(resumed) == _manifest_rows(out)
    assert orphans(out, parse_spec(data).output, commit.committed_shards(out)) == []
    read = ray.data.read_lance(str(killed / DATASET), columns=["sample_id"]).take_all()
    assert sorted(r["sample_id"] for r in read) == planned

    cli = CliRunner()
    verified = cli.invoke(main, ["inspect", str(killed), "--verify"], catch_exceptions=False)
    assert verified.exit_code == 0 and "verify: OK" in verified.output, verified.output
    replayed = cli.invoke(main, ["replay", str(killed), planned[5]], catch_exceptions=False)
    assert replayed.exit_code == 0 and "identical" in replayed.output, replayed.output
