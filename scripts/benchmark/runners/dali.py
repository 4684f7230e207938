"""Child side of dali (--gpu, recipes a, b): NVIDIA DALI on the GPU, fused decode + random
crop, flip, colour twist, rotate; nvJPEG encode. DALI decodes per view (its crop is fused
into the decode), so each file is listed V times."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from .. import SEED, SHARD_SOURCES
from ..photos import list_images
from ..recipes import (
    BRIGHTNESS,
    CONTRAST,
    CROP_RATIO,
    CROP_SCALE,
    DEGREES,
    HUE,
    P_FLIP,
    SATURATION,
    Recipe,
)
from .pool import write_shard


def run_dali(recipe: Recipe, images: Path, out: Path, views: int, procs: int) -> int:
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.plugin.base_iterator import LastBatchPolicy
    from nvidia.dali.plugin.pytorch import DALIGenericIterator

    files = [str(path) for _, path in list_images(images)] * views

    @pipeline_def(batch_size=SHARD_SOURCES, num_threads=procs, device_id=0, seed=SEED)
    def pipeline():  # type: ignore[no-untyped-def]
        jpegs, _ = fn.readers.file(files=files, name="reader", random_shuffle=False)
        decoded = fn.decoders.image_random_crop(
            jpegs,
            device="mixed",
            output_type=types.RGB,
            random_area=list(CROP_SCALE),
            random_aspect_ratio=list(CROP_RATIO),
        )
        resized = fn.resize(decoded, size=[recipe.size, recipe.size])
        flipped = fn.flip(resized, horizontal=fn.random.coin_flip(probability=P_FLIP))
        coloured = fn.color_twist(
            flipped,
            brightness=fn.random.uniform(range=[1 - BRIGHTNESS, 1 + BRIGHTNESS]),
            contrast=fn.random.uniform(range=[1 - CONTRAST, 1 + CONTRAST]),
            saturation=fn.random.uniform(range=[1 - SATURATION, 1 + SATURATION]),
            hue=fn.random.uniform(range=[-HUE * 360, HUE * 360]),
        )
        return fn.rotate(
            coloured,
            angle=fn.random.uniform(range=[-DEGREES, DEGREES]),
            keep_size=True,
            fill_value=0,
        )

    pipe = pipeline()
    pipe.build()
    batches = DALIGenericIterator(
        pipe,
        ["images"],
        reader_name="reader",
        last_batch_policy=LastBatchPolicy.PARTIAL,
        auto_reset=False,
    )
    written = 0
    for index, batch in enumerate(batches):
        encoded = encode_gpu(batch[0]["images"], recipe.quality)
        keys = [f"dali/{written + i:08d}.jpg" for i in range(len(encoded))]
        write_shard(out / f"part-{index:05d}.parquet", keys, encoded)
        written += len(encoded)
    return written


def encode_gpu(batch: Any, quality: int) -> list[bytes]:
    """A batch of HWC uint8 CUDA tensors to JPEG: nvJPEG via torchvision, else Pillow."""
    try:
        from torchvision.io import encode_jpeg

        tensors = [image.permute(2, 0, 1).contiguous() for image in batch]
        return [bytes(t.cpu().numpy()) for t in encode_jpeg(tensors, quality=quality)]
    except (ImportError, RuntimeError, TypeError):
        from PIL import Image

        encoded = []
        for array in batch.cpu().numpy():
            buffer = io.BytesIO()
            Image.fromarray(array).save(buffer, "JPEG", quality=quality)
            encoded.append(buffer.getvalue())
        return encoded
