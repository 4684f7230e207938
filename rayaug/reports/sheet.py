"""The contact sheet: a grid of samples spread over a committed output, labels drawn on."""

from __future__ import annotations

import io
import json

import numpy as np
from PIL import Image, ImageDraw

from rayaug.outputs import Output, manifests, read_images


def contact_sheet(output: Output, limit: int = 24, tile: int = 192) -> Image.Image:
    """A grid of samples spread over the output, each captioned with its source and ops, with
    its boxes, keypoints and mask drawn on it (labels must sit on their objects)."""
    table = manifests(output.location).sort_by("sample_id")
    picks = sorted({int(i) for i in np.linspace(0, max(table.num_rows - 1, 0), limit)})
    rows = table.take(picks).to_pylist() if table.num_rows else []
    images: dict[str, bytes] = {}
    masks: dict[str, bytes] = {}
    for shard in sorted({r["shard"] for r in rows}):
        images |= read_images(output.location, output.spec, shard)
        masks |= read_images(output.location, output.spec, shard, masks=True)
    columns = min(6, max(1, len(rows)))
    caption = 46
    sheet = Image.new(
        "RGB", (columns * tile, max(1, -(-len(rows) // columns)) * (tile + caption)), "white"
    )
    draw = ImageDraw.Draw(sheet)
    for i, row in enumerate(rows):
        x, y = (i % columns) * tile, (i // columns) * (tile + caption)
        picture = _annotated(images[row["sample_id"]], masks.get(row["sample_id"]), row)
        picture.thumbnail((tile - 4, tile - 4))
        sheet.paste(picture, (x + 2, y + 2))
        names = ",".join(step["op"] for step in json.loads(row["ops"]))
        text = f"{row['sample_id'][-30:]}\n{row['label'] or ''}\n{names[:34]}"
        draw.multiline_text((x + 2, y + tile), text, fill="black", spacing=1)
    return sheet


def _annotated(image: bytes, mask: bytes | None, row: dict) -> Image.Image:
    """The sample with its mask tinted, boxes outlined and visible keypoints dotted."""
    picture = Image.open(io.BytesIO(image)).convert("RGB")
    if mask is not None:
        ids = np.asarray(Image.open(io.BytesIO(mask)).convert("L"))
        tint = Image.new("RGB", picture.size, (0, 160, 255))
        picture = Image.composite(
            tint, picture, Image.fromarray(np.where(ids > 0, 110, 0).astype(np.uint8))
        )
    targets = json.loads(row["targets"]) if row.get("targets") else {}
    draw = ImageDraw.Draw(picture)
    for box in targets.get("boxes", []):
        draw.rectangle(box, outline=(255, 230, 0), width=2)
    for kx, ky, visibility in targets.get("keypoints", []):
        if visibility > 0:
            draw.ellipse((kx - 3, ky - 3, kx + 3, ky + 3), fill=(255, 0, 200))
    return picture
