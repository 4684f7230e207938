"""Label targets end to end: the three input conventions in, moved targets out (shards,
manifest, contact sheet), on a real local Ray."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import RecordingProgress
from PIL import Image
from test_targets import iou, red_box

from rayaug import outputs
from rayaug.job import RunOptions, run_job
from rayaug.reports.sheet import contact_sheet
from rayaug.reports.summary import verify
from rayaug.spec import parse_spec
from rayaug.storage import open_location

OPS = [
    {"name": "horizontal_flip"},
    {"name": "rotation", "degrees": 10},
    {"name": "random_resized_crop", "size": 96, "scale": [0.6, 1.0]},
]


def png(array: np.ndarray, mode: str | None = None) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array, mode).save(buffer, "PNG")
    return buffer.getvalue()


def scenes(count: int = 4) -> list[tuple[str, bytes, bytes, list[int]]]:
    """(name, image PNG, mask PNG, red box xyxy): a red rectangle at a different place each."""
    made = []
    for i in range(count):
        pixels = np.full((120, 160, 3), 110, dtype=np.uint8)
        mask = np.zeros((120, 160), dtype=np.uint8)
        box = [20 + 15 * i, 20 + 8 * i, 80 + 15 * i, 70 + 8 * i]
        pixels[box[1] : box[3], box[0] : box[2]] = (250, 10, 10)
        mask[box[1] : box[3], box[0] : box[2]] = 5
        made.append((f"scene{i}", png(pixels), png(mask, "L"), box))
    return made


def run(source: Path | str, out: Path, **inputs) -> outputs.Output:
    spec = parse_spec(
        {
            "input": {"uri": str(source), **inputs},
            "output": {"uri": str(out), "image_format": "png", "shard_size": 2},
            "views": 3,
            "seed": 8,
            "ops": OPS,
            "execution": {"batch_size": 4, "concurrency": 1},
        }
    )
    run_job(spec, RunOptions(), RecordingProgress())
    output = outputs.recorded_output(open_location(str(out), spec.storage))
    assert verify(output) == []
    return output


def check_boxes_follow_objects(output: outputs.Output) -> None:
    rows = outputs.manifests(output.location).to_pylist()
    assert len(rows) == 12
    for row in rows:
        image = outputs.read_images(output.location, output.spec, row["shard"])[row["sample_id"]]
        targets = json.loads(row["targets"])
        found = red_box(image)
        if found is None or not targets["boxes"]:
            continue
        assert targets["classes"] == [2]
        assert iou(targets["boxes"][0], found) > 0.7, (row["sample_id"], targets, found)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    root = tmp_path / "folder"
    (root / "images").mkdir(parents=True)
    (root / "masks" / "images").mkdir(parents=True)
    coco = {"images": [], "annotations": [], "categories": [{"id": 2, "name": "thing"}]}
    for i, (name, image, mask, (x0, y0, x1, y1)) in enumerate(scenes()):
        (root / "images" / f"{name}.png").write_bytes(image)
        (root / "masks" / "images" / f"{name}.png").write_bytes(mask)
        coco["images"].append({"id": i, "file_name": f"images/{name}.png"})
        coco["annotations"].append(
            {
                "image_id": i,
                "bbox": [x0, y0, x1 - x0, y1 - y0],
                "category_id": 2,
                "keypoints": [x0, y0, 2],
            }
        )
    (root / "coco.json").write_text(json.dumps(coco))
    return root


def test_folder_with_coco_annotations_and_masks(ray_cluster, folder: Path, tmp_path: Path):
    output = run(
        folder,
        tmp_path / "out",
        format="folder",
        annotations="coco.json",
        masks=str(folder / "masks"),
    )
    check_boxes_follow_objects(output)
    data = pq.read_table(tmp_path / "out" / "data")  # every view's objects, one dataset
    for mask, image in zip(
        data.column("mask").to_pylist(), data.column("image").to_pylist(), strict=True
    ):
        ids = np.asarray(Image.open(io.BytesIO(mask)))
        assert set(np.unique(ids)) <= {0, 5}
        red = np.asarray(Image.open(io.BytesIO(image)).convert("RGB"))[..., 0] > 180
        assert ((ids == 5) == red).mean() > 0.95
    sheet = contact_sheet(output, limit=6)
    pixels = np.asarray(sheet)
    yellow = (pixels[..., 0] > 230) & (pixels[..., 1] > 200) & (pixels[..., 2] < 40)
    assert yellow.sum() > 50  # the box outlines are drawn


def test_parquet_columns(ray_cluster, tmp_path: Path) -> None:
    rows = [
        {
            "image": image,
            "label": "thing",
            "boxes": [box],
            "classes": [2],
            "keypoints": [[box[0], box[1], 2]],
            "mask": mask,
        }
        for _, image, mask, box in scenes()
    ]
    (tmp_path / "pq").mkdir()
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "pq" / "part.parquet")
    check_boxes_follow_objects(run(tmp_path / "pq", tmp_path / "out", box_format="xyxy"))


def test_webdataset_members(ray_cluster, tmp_path: Path) -> None:
    (tmp_path / "wds").mkdir()
    with tarfile.open(tmp_path / "wds" / "shard.tar", "w") as archive:
        for name, image, mask, box in scenes():
            meta = json.dumps({"boxes": [box], "classes": [2]}).encode()
            for suffix, payload in (("png", image), ("json", meta), ("mask.png", mask)):
                info = tarfile.TarInfo(f"{name}.{suffix}")
                info.size = len(payload)
                archive.addfile(info, io.BytesIO(payload))
    output = run(tmp_path / "wds", tmp_path / "out")
    check_boxes_follow_objects(output)
    masks = outputs.read_images(output.location, output.spec, "part-00000", masks=True)
    assert len(masks) == 12  # every output sample carries its moved mask


def test_unparseable_targets_quarantine_the_sample(ray_cluster, folder: Path, tmp_path: Path):
    coco = json.loads((folder / "coco.json").read_text())
    coco["annotations"][0]["bbox"] = [1, 2, 3]  # three numbers
    (folder / "coco.json").write_text(json.dumps(coco))
    spec = parse_spec(
        {
            "input": {"uri": str(folder), "annotations": "coco.json"},
            "output": {"uri": str(tmp_path / "out")},
            "views": 1,
            "ops": OPS,
            "errors": {"max_error_rate": 0.5},
            "execution": {"concurrency": 1},
        }
    )
    run_job(spec, RunOptions(), RecordingProgress())
    errors = outputs.quarantine(open_location(spec.output.uri, spec.storage)).to_pylist()
    assert [(e["sample_id"], e["stage"]) for e in errors] == [("images/scene0.png#0", "read")]
    assert "bad label targets" in errors[0]["message"]
