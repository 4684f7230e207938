"""rayaug.augment: the determinism promise (same bytes whatever the batch size or order),
exact replay, per-sample quarantine, mixed inputs, views and manifests' recorded ops."""

from __future__ import annotations

import copy
import gc
import io
import json
import subprocess
import sys
import weakref

import numpy as np
import pytest
from PIL import Image

from rayaug import augment, codec, sampledata
from rayaug.augment import KORNIA_ON_CPU, Augmenter
from rayaug.ops import CATALOGUE, draw_ops, from_records
from rayaug.records import ShardOutput, SourceSample, sample_seed
from rayaug.spec import JobSpec, parse_spec
from rayaug.spill import Spilled, SpillFile

# Every op of the catalogue at p=0.5, after a random resized crop (the usual training setup).
ALL_OPS = [
    {"name": "random_resized_crop", "size": [72, 88], "scale": [0.3, 1.0]},
    {"name": "resize", "size": 80, "p": 0.5},
    {"name": "center_crop", "size": [70, 76], "p": 0.5},
    {"name": "random_crop", "size": [64, 72], "p": 0.5},
    {"name": "horizontal_flip", "p": 0.5},
    {"name": "vertical_flip", "p": 0.5},
    {"name": "rotation", "degrees": 20, "p": 0.5},
    {
        "name": "affine",
        "degrees": 10,
        "translate": [0.1, 0.1],
        "scale": [0.8, 1.2],
        "shear": 5,
        "p": 0.5,
    },
    {"name": "perspective", "distortion_scale": 0.3, "p": 0.5},
    {
        "name": "color_jitter",
        "brightness": 0.4,
        "contrast": 0.4,
        "saturation": 0.4,
        "hue": 0.1,
        "p": 0.5,
    },
    {
        "name": "color_jitter",
        "brightness": 0.3,
        "contrast": 0.3,
        "saturation": 0.3,
        "hue": 0.05,
        "fused": True,
        "p": 0.5,
    },
    {"name": "grayscale", "p": 0.5},
    {"name": "gaussian_blur", "kernel_size": 5, "sigma": [0.1, 2.0], "p": 0.5},
    {"name": "gaussian_noise", "std": [0.01, 0.05], "p": 0.5},
    {"name": "salt_and_pepper", "amount": [0.01, 0.05], "p": 0.5},
    {"name": "erasing", "p": 0.5},
    {"name": "sharpness", "p": 0.5},
    {"name": "posterize", "bits": [3, 7], "p": 0.5},
    {"name": "solarize", "threshold": [0.4, 0.9], "p": 0.5},
    {"name": "equalize", "p": 0.5},
    {"name": "autocontrast", "p": 0.5},
    {"name": "invert", "p": 0.3},
    {"name": "one_of", "p": 0.5, "ops": [{"name": "vertical_flip", "p": 1}, {"name": "equalize"}]},
    {
        "name": "some_of",
        "n": 2,
        "p": 0.5,
        "ops": [{"name": "solarize"}, {"name": "posterize"}, {"name": "rotation", "degrees": 5}],
    },
    {"name": "rand_augment", "p": 0.5},
    {"name": "trivial_augment", "p": 0.5},
    {"name": "auto_augment", "p": 0.5},
    {"name": "random_crop", "size": 40, "p": 0.5, "same_on_views": True},
]


def _spec(ops: list[dict] | None = None, **changes) -> JobSpec:
    data = {
        "input": {"uri": "in"},
        "output": {"uri": "out", "image_format": "png"},  # lossless: bytes show every pixel
        "views": 2,
        "seed": 2026,
        "ops": copy.deepcopy(ALL_OPS if ops is None else ops),
        "execution": {"batch_size": 32},
    }
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = data[key] | value
        else:
            data[key] = value
    return parse_spec(data)


def _sources(photos) -> list[SourceSample]:
    return [SourceSample(p.key, f"mem://{p.key}", p.jpeg, p.label) for p in photos]


def _hashes(output: ShardOutput) -> dict[str, str]:
    return {s.sample_id: s.sha256 for s in output.samples}


def _encode(image: Image.Image, fmt: str = "PNG", **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


def _pixels(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


@pytest.fixture(scope="module", params=["cpu", KORNIA_ON_CPU])
def device(device: str, request: pytest.FixtureRequest) -> str:
    """A CPU run tests both kernel sets: the uint8 OpenCV path and the device path (Kornia)."""
    if device != "cpu":
        if request.param != "cpu":
            pytest.skip(f"--device {device}: one run, on that device")
        return device
    return request.param


@pytest.fixture(scope="module")
def reference(photos, device: str) -> ShardOutput:
    """Every op of the catalogue over all the photos, two views, batch size 32."""
    return Augmenter(_spec(), device).augment(_sources(photos))


# ---------------------------------------------------------------- determinism


def test_the_reference_run_exercises_every_op(reference: ShardOutput, photos) -> None:
    assert reference.quarantined == []
    assert reference.sources == len(photos)
    assert len(reference.samples) == 2 * len(photos)
    applied = {record["op"] for sample in reference.samples for record in sample.ops}
    mixes = {name for name, op in CATALOGUE.items() if op.kind == "mix"}  # tests/test_mixes.py
    assert applied == set(CATALOGUE) - mixes
    jitters = [r["params"] for s in reference.samples for r in s.ops if r["op"] == "color_jitter"]
    assert {p.get("fused", False) for p in jitters} == {False, True}  # both colour paths
    # p=0.5 really is per sample: the samples differ in the ops they got
    assert len({tuple(r["op"] for r in s.ops) for s in reference.samples}) > len(photos)


@pytest.mark.parametrize("batch_size", [1, 7, 32])
def test_same_bytes_whatever_the_batch_size(
    reference: ShardOutput, photos, device: str, batch_size: int
) -> None:
    spec = _spec(execution={"batch_size": batch_size})
    output = Augmenter(spec, device).augment(_sources(photos))
    assert output.quarantined == []
    assert _hashes(output) == _hashes(reference)
    assert [s.ops for s in output.samples] == [s.ops for s in reference.samples]


def test_same_bytes_whatever_the_order_of_the_sources(
    reference: ShardOutput, photos, device: str
) -> None:
    shuffled = _sources(photos)
    np.random.default_rng(5).shuffle(shuffled)
    shuffled = shuffled[::2] + shuffled[1::2]
    output = Augmenter(_spec(execution={"batch_size": 7}), device).augment(shuffled)
    assert [s.source_key for s in output.samples][::2] == [s.key for s in shuffled]
    assert _hashes(output) == _hashes(reference)


def test_same_bytes_whatever_the_sources_seeded_together(
    reference: ShardOutput, photos, device: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Streams are seeded for groups of SEEDED_TOGETHER sources: a group's edge changes
    nothing, nor does a read error inside a group."""
    monkeypatch.setattr(augment, "SEEDED_TOGETHER", 3)
    sources = _sources(photos)
    sources.insert(4, SourceSample("unread", "mem://unread", None, error="gone"))
    output = Augmenter(_spec(), device).augment(sources)
    assert [(q.source_key, q.stage) for q in output.quarantined] == [("unread", "read")] * 2
    assert output.sources == len(sources)
    assert _hashes(output) == _hashes(reference)
    assert [s.ops for s in output.samples] == [s.ops for s in reference.samples]


def test_sources_are_let_go_once_their_views_have_started(
    photos, device: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A unit's sources stream in (read ahead by bytes): the augmenter keeps no more of them
    than one seeding group, whatever the unit's length."""
    monkeypatch.setattr(augment, "SEEDED_TOGETHER", 4)
    alive: weakref.WeakSet[SourceSample] = weakref.WeakSet()
    most = 0

    def streamed():
        nonlocal most
        for number in range(24):
            gc.collect()
            most = max(most, len(alive))
            source = _sources(photos)[number % len(photos)]
            source = SourceSample(f"{number}-{source.key}", source.uri, source.data, source.label)
            alive.add(source)
            yield source

    output = Augmenter(_spec(views=1), device).augment(streamed())
    assert len(output.samples) + len(output.quarantined) == 24
    # One group's worth: the last source started and the next group's drawn so far (holding
    # each group until its end, as the augmenter did, kept 7 alive here).
    assert most <= 4


def test_a_seeding_group_holds_few_large_sources_and_the_same_bytes(
    photos, device: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Phone photos are megabytes each: a group stops at SEEDED_BYTES of source bytes as well
    as at SEEDED_TOGETHER sources, and how sources are grouped changes no output byte."""
    sources = _sources(photos)[:12]
    reference = Augmenter(_spec(views=2), device).augment(sources)
    groups: list[int] = []
    seeded_groups = Augmenter._seeded_groups

    def counted(self, *args):
        for seeded, streams in seeded_groups(self, *args):
            groups.append(len(seeded))
            yield seeded, streams

    monkeypatch.setattr(Augmenter, "_seeded_groups", counted)
    monkeypatch.setattr(augment, "SEEDED_BYTES", min(len(s.data) for s in sources))
    grouped = Augmenter(_spec(views=2), device).augment(sources)
    assert groups == [1] * 12  # each source reaches the bound alone
    assert [s.image for s in grouped.samples] == [s.image for s in reference.samples]


@pytest.mark.parametrize("in_memory", [0, 20_000])
def test_with_a_spill_file_the_samples_bytes_wait_on_disk_and_are_the_same(
    reference: ShardOutput, photos, device: str, tmp_path, in_memory: int
) -> None:
    """All of them on disk (no memory budget), or the first in memory and the rest on disk."""
    with SpillFile(str(tmp_path), in_memory) as spill:
        output = Augmenter(_spec(), device).augment(_sources(photos), spill=spill)
        on_disk = [isinstance(sample.encoded, Spilled) for sample in output.samples]
        assert all(on_disk) if in_memory == 0 else not on_disk[0] and on_disk[-1]
        assert _hashes(output) == _hashes(reference)
        assert [s.image for s in output.samples] == [s.image for s in reference.samples]


def test_every_sample_replays_to_identical_bytes(
    reference: ShardOutput, photos, device: str
) -> None:
    by_key = {source.key: source for source in _sources(photos)}
    augmenter = Augmenter(_spec(), device)
    for sample in reference.samples:
        records = json.loads(json.dumps(sample.ops))  # as read back from a manifest
        replayed = augmenter.replay(
            by_key[sample.source_key], sample.view, sample.seed, from_records(records)
        )
        assert replayed == sample.image, sample.sample_id


def test_a_different_job_seed_gives_different_samples(
    reference: ShardOutput, photos, device: str
) -> None:
    output = Augmenter(_spec(seed=2027), device).augment(_sources(photos[:6]))
    before = _hashes(reference)
    assert all(before[i] != h for i, h in _hashes(output).items())


# ---------------------------------------------------------------- views and records


def test_views_give_one_sample_each_with_its_own_seed(photos, device: str) -> None:
    spec = _spec(views=3)
    output = Augmenter(spec, device).augment(_sources(photos[:5]))
    assert len(output.samples) == 15 and output.sources == 5
    for source in photos[:5]:
        samples = [s for s in output.samples if s.source_key == source.key]
        assert [s.view for s in samples] == [0, 1, 2]
        assert [s.sample_id for s in samples] == [f"{source.key}#{v}" for v in range(3)]
        assert [s.seed for s in samples] == [sample_seed(2026, source.key, v) for v in range(3)]
        assert len({s.seed for s in samples}) == 3
        assert len({s.sha256 for s in samples}) == 3  # three different augmentations
        assert all(s.label == source.label for s in samples)
    assert len({s.seed for s in output.samples}) == 15


def test_recorded_ops_are_the_applied_ones_with_their_params(photos, device: str) -> None:
    ops = [
        {"name": "random_resized_crop", "size": 64},
        {"name": "horizontal_flip", "p": 0.5},
        {"name": "rotation", "degrees": 15, "p": 0.0},  # never applied: never recorded
        {"name": "color_jitter", "brightness": 0.3, "hue": 0.05, "p": 0.5},
        {"name": "gaussian_blur", "kernel_size": 3, "p": 1.0},
    ]
    spec = _spec(ops, output={"size": [48, 40]})
    pipeline = [op.name for op in spec.pipeline()]
    output = Augmenter(spec, device).augment(_sources(photos[:12]))
    seen = set()
    for sample in output.samples:
        names = [record["op"] for record in sample.ops]
        assert "rotation" not in names
        assert names[0] == "random_resized_crop" and names[-2:] == ["gaussian_blur", "resize"]
        assert names == [n for n in pipeline if n in names]  # pipeline order
        for record in sample.ops:
            assert set(record) == {"op", "params"} and isinstance(record["params"], dict)
            assert json.loads(json.dumps(record["params"])) == record["params"]
        # exactly what the seed draws for this source: nothing left out, nothing added
        planned = draw_ops(spec.pipeline(), sample.seed, sample.source_size)
        assert sample.ops == [step.record() for step in planned]
        assert (sample.height, sample.width) == (48, 40)
        assert _pixels(sample.image).shape == (48, 40, 3)
        seen |= set(names)
    assert {"horizontal_flip", "color_jitter"} <= seen  # p=0.5 ops do get applied


# ---------------------------------------------------------------- quarantine


def _truncated_jpeg(photo) -> bytes:
    return photo.jpeg[: len(photo.jpeg) // 2]


def test_decode_failures_are_quarantined_and_the_job_goes_on(
    reference: ShardOutput, photos, device: str
) -> None:
    good = _sources(photos[:6])
    bad = [
        SourceSample("bad/empty.jpg", "mem://e", b""),
        SourceSample("bad/readme.jpg", "mem://t", b"not an image, just text\n"),
        SourceSample("bad/truncated.jpg", "mem://c", _truncated_jpeg(photos[7])),
        SourceSample("bad/none.jpg", "mem://n", None),
    ]
    mixed = [good[0], bad[0], good[1], bad[1], good[2], bad[2], *good[3:], bad[3]]
    output = Augmenter(_spec(execution={"batch_size": 5}), device).augment(mixed)
    assert output.sources == len(mixed)
    # the good samples are all there, with the very bytes they have without bad batch-mates
    expected = {
        k: v for k, v in _hashes(reference).items() if k.split("#")[0] in {s.key for s in good}
    }
    assert _hashes(output) == expected
    quarantined = {(q.source_key, q.view): q for q in output.quarantined}
    assert set(quarantined) == {(s.key, v) for s in bad for v in (0, 1)}
    for row in output.quarantined:
        assert row.stage == "decode" and row.error_class == "DecodeError"
        assert row.sample_id == f"{row.source_key}#{row.view}"
    assert quarantined["bad/empty.jpg", 0].message == "empty input (0 bytes)"
    assert quarantined["bad/none.jpg", 0].message == "empty input (0 bytes)"
    assert quarantined["bad/readme.jpg", 0].message.startswith("not a readable image")
    assert quarantined["bad/truncated.jpg", 0].message.startswith("cannot decode")


def test_an_oversized_image_is_quarantined_by_max_pixels(photos, device: str) -> None:
    spec = _spec(errors={"max_pixels": 5_000})
    small = SourceSample("small.png", "mem://s", _encode(Image.new("RGB", (50, 40), "red")))
    output = Augmenter(spec, device).augment([small, *_sources(photos[:2])])
    assert len(output.samples) == 2
    assert {q.source_key for q in output.quarantined} == {p.key for p in photos[:2]}
    assert all("exceeds max_pixels=5000" in q.message for q in output.quarantined)


def test_a_read_error_is_quarantined_at_stage_read(photos, device: str) -> None:
    failed = SourceSample("lost.jpg", "s3://b/lost.jpg", None, error="NoSuchKey: gone")
    output = Augmenter(_spec(), device).augment([failed, *_sources(photos[:2])])
    assert len(output.samples) == 4 and output.sources == 3
    assert [
        (q.source_key, q.view, q.stage, q.error_class, q.message) for q in output.quarantined
    ] == [
        ("lost.jpg", 0, "read", "ReadError", "NoSuchKey: gone"),
        ("lost.jpg", 1, "read", "ReadError", "NoSuchKey: gone"),
    ]


@pytest.mark.parametrize("batch_size", [1, 4, 32])
def test_an_op_failing_for_one_sample_quarantines_only_that_sample(
    photos, device: str, batch_size: int
) -> None:
    # Sharpness needs a 3x3 neighbourhood: a 1x1 or 2x2 image cannot go through it.
    ops = [{"name": "color_jitter", "brightness": 0.3, "p": 1.0}, {"name": "sharpness", "p": 1.0}]
    spec = _spec(ops, views=1, execution={"batch_size": batch_size})
    tiny = [
        SourceSample(f"tiny/{n}x{n}.png", "mem://", _encode(Image.new("RGB", (n, n), (200, 9, 9))))
        for n in (1, 2, 3)
    ]
    good = _sources(photos[:5])
    sources = [good[0], tiny[0], good[1], good[2], tiny[1], tiny[2], *good[3:]]
    output = Augmenter(spec, device).augment(sources)
    assert output.sources == 8
    assert [(q.source_key, q.stage) for q in output.quarantined] == [
        ("tiny/1x1.png", "augment"),
        ("tiny/2x2.png", "augment"),
    ]
    # Kornia's conv2d raises a RuntimeError, the uint8 kernel a ValueError saying why
    assert all(q.error_class in ("RuntimeError", "ValueError") for q in output.quarantined)
    assert all(q.message for q in output.quarantined)
    kept = {s.source_key for s in output.samples}
    assert kept == {s.key for s in good} | {"tiny/3x3.png"}  # 3x3 is enough
    # the batch-mates are not disturbed: same bytes as a run without the tiny images
    alone = Augmenter(spec, device).augment(good)
    assert _hashes(alone).items() <= _hashes(output).items()


def test_a_failing_warp_quarantines_only_the_samples_it_fails(
    reference: ShardOutput, photos, device: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # On the CPU path a view's first warp runs as its source is decoded, outside its batch
    culprit = photos[1].key
    warp = augment._warp

    def failing(items: list) -> None:
        if any(item.source_key == culprit for item in items):
            raise RuntimeError("the warp failed")
        warp(items)

    monkeypatch.setattr(augment, "_warp", failing)
    output = Augmenter(_spec(), device).augment(_sources(photos))
    assert [(q.source_key, q.view, q.stage, q.error_class) for q in output.quarantined] == [
        (culprit, 0, "augment", "RuntimeError"),
        (culprit, 1, "augment", "RuntimeError"),
    ]
    others = {s.sample_id: s.sha256 for s in reference.samples if s.source_key != culprit}
    assert _hashes(output) == others


def test_perspective_on_a_one_pixel_high_image_is_quarantined_not_raised(device: str) -> None:
    line = SourceSample("line.png", "mem://", _encode(Image.new("RGB", (9, 1), "white")))
    square = SourceSample("square.png", "mem://", _encode(Image.new("RGB", (9, 9), "white")))
    output = Augmenter(_spec([{"name": "perspective", "p": 1.0}], views=1), device).augment(
        [line, square]
    )
    assert [s.source_key for s in output.samples] == ["square.png"]
    assert [q.source_key for q in output.quarantined] == ["line.png"]


# ---------------------------------------------------------------- mixed inputs and geometry


def _mixed_sources(photos) -> list[SourceSample]:
    rgb = np.asarray(Image.open(io.BytesIO(photos[0].jpeg)).convert("RGB"))
    base = Image.fromarray(rgb[:90, :120])
    rgba = np.concatenate([rgb[:50, :70], np.full((50, 70, 1), 128, np.uint8)], axis=2)
    wide = (np.asarray(base.convert("L")).astype(np.uint16) * 257)[:60, :80]
    exif = Image.Exif()
    exif[0x0112] = 6
    images = {
        "rgb.jpg": _encode(base, "JPEG", quality=90),
        "gray.png": _encode(base.convert("L")),
        "rgba.png": _encode(Image.fromarray(rgba, "RGBA")),
        "palette.png": _encode(base.convert("P")),
        "cmyk.jpg": _encode(base.convert("CMYK"), "JPEG"),
        "deep.png": _encode(Image.fromarray(wide)),
        "bits.png": _encode(base.convert("1")),
        "rotated.jpg": _encode(base, "JPEG", exif=exif),
        "anim.gif": _encode(
            base.convert("P"), "GIF", save_all=True, append_images=[base.convert("P").rotate(90)]
        ),
        "tall.webp": _encode(base.resize((33, 101)), "WEBP"),
    }
    sources = [SourceSample(k, f"mem://{k}", v, "mixed") for k, v in images.items()]
    return sources + _sources(photos[:3])


def test_mixed_sizes_and_modes_in_one_batch(photos, device: str) -> None:
    ops = [
        {"name": "horizontal_flip", "p": 0.5},
        {"name": "rotation", "degrees": 10, "p": 0.7},
        {"name": "color_jitter", "brightness": 0.3, "saturation": 0.3, "p": 0.7},
        {"name": "gaussian_blur", "kernel_size": 3, "p": 0.5},
        {"name": "erasing", "p": 0.5},
        {"name": "gaussian_noise", "p": 0.5},
    ]
    sources = _mixed_sources(photos)
    batched = Augmenter(_spec(ops, execution={"batch_size": 64}), device).augment(sources)
    assert batched.quarantined == []
    assert len(batched.samples) == 2 * len(sources)
    for sample in batched.samples:
        pixels = _pixels(sample.image)
        assert pixels.shape == (sample.height, sample.width, 3)
        # no size-changing op: each output has the (EXIF-oriented) size of its source
        assert (sample.height, sample.width) == sample.source_size
    sizes = {s.source_key: s.source_size for s in batched.samples}
    assert sizes["rotated.jpg"] == (120, 90) and sizes["tall.webp"] == (101, 33)
    assert len(set(sizes.values())) >= 6
    one_by_one = Augmenter(_spec(ops, execution={"batch_size": 1}), device).augment(sources)
    assert _hashes(one_by_one) == _hashes(batched)


def test_horizontal_flip_mirrors_the_pixels(photos, device: str) -> None:
    """Against the same device's decode (a flip drawn with p 0): nvJPEG's pixels are not
    libjpeg-turbo's (up to 39 levels apart at colour edges, seen on an H200)."""
    source = _sources(photos[:1])[0]
    flipped, unflipped = (
        Augmenter(_spec([{"name": "horizontal_flip", "p": p}], views=1), device)
        .augment([source])
        .samples[0]
        for p in (1.0, 0.0)
    )
    original = _pixels(unflipped.image).astype(int)
    assert np.abs(_pixels(flipped.image) - original[:, ::-1]).max() <= 1
    if device == "cpu":  # the CPU path decodes as Pillow does
        pillow = np.asarray(Image.open(io.BytesIO(source.data)).convert("RGB")).astype(int)
        assert np.array_equal(original, pillow)


def test_a_geometric_op_between_two_others_applies_between_them(device: str) -> None:
    """On the CPU path a flip after an erasing is warped as soon as the erasing is done (the
    pixels still in cache), not again with the batch: each box lands where the order puts it."""
    gray = SourceSample("gray.png", "mem://gray.png", _encode(Image.new("RGB", (48, 32), "gray")))
    ops = [
        {"name": "erasing", "value": 0.0, "p": 1},
        {"name": "horizontal_flip", "p": 1},
        {"name": "erasing", "value": 1.0, "p": 1},
    ]
    output = Augmenter(_spec(ops, views=3), device).augment([gray])
    assert output.quarantined == [] and len(output.samples) == 3
    for sample in output.samples:
        black, white = (sample.ops[at]["params"]["box"] for at in (0, 2))
        expected = np.full((32, 48), 128)
        x, y, w, h = black
        expected[y : y + h, x : x + w] = 0
        expected = expected[:, ::-1]
        x, y, w, h = white
        expected[y : y + h, x : x + w] = 255
        assert np.abs(_pixels(sample.image)[..., 0] - expected).max() <= 1


def test_a_reduced_decode_gives_the_same_picture(device: str) -> None:
    # 1600x1200 down to 400x300: decoded at 1/4 (JPEG DCT scaling), then warped to the size.
    y, x = np.mgrid[0:1200, 0:1600]
    picture = np.stack([x * 255 // 1599, y * 255 // 1199, (x // 100 + y // 100) % 2 * 255], -1)
    picture = picture.astype(np.uint8)
    source = SourceSample(
        "big.jpg", "mem://", _encode(Image.fromarray(picture), "JPEG", quality=95)
    )
    spec = _spec([{"name": "resize", "size": [300, 400]}], views=1)
    sample = Augmenter(spec, device).augment([source]).samples[0]
    assert (sample.height, sample.width) == (300, 400)
    expected = np.asarray(Image.fromarray(picture).resize((400, 300), Image.Resampling.BOX))
    difference = np.abs(_pixels(sample.image).astype(int) - expected)
    assert difference.mean() < 1.5  # aligned: a half-pixel shift would show at every square edge


# Crops of larger photos than the fixture's, as users have: what the decode can leave out.
_CROPS = [
    {"name": "random_resized_crop", "size": 96, "scale": [0.08, 1.0]},
    {"name": "horizontal_flip"},
    {"name": "rotation", "degrees": 15, "p": 0.5},
    {"name": "color_jitter", "brightness": 0.4, "contrast": 0.4, "saturation": 0.4, "hue": 0.1},
]


def test_decoding_only_the_needed_window_moves_no_pixel_beyond_rounding(monkeypatch) -> None:
    """On the CPU a plain JPEG is decoded only around the box its first warp reads; the warp
    then differs from a whole image's only by its fixed-point rounding (at most a level)."""
    photos = list(sampledata.make_photos(16, seed=4, short_side=(300, 500)))
    spec = _spec(_CROPS[:3], views=2)
    parts = []
    decode_part = codec.decode_part
    monkeypatch.setattr(codec, "decode_part", lambda *a: parts.append(decode_part(*a)) or parts[-1])
    windowed = Augmenter(spec, "cpu").augment(_sources(photos))
    cut = [p for p in parts if p.pixels.shape[:2] != p.size]
    assert len(cut) > len(parts) / 2  # most crops leave part of the photo out
    request = augment.decode_request
    monkeypatch.setattr(augment, "decode_request", lambda *a: (request(*a)[0], None))
    whole = Augmenter(spec, "cpu").augment(_sources(photos))
    for a, b in zip(windowed.samples, whole.samples, strict=True):
        assert a.ops == b.ops
        assert np.abs(_pixels(a.image).astype(int) - _pixels(b.image)).max() <= 1


def test_the_same_bytes_with_or_without_the_windowed_decoder(monkeypatch) -> None:
    """libturbojpeg's windowed decode is a speed-up only: without it (no wheel for the
    platform) the window is cut from a whole decode, and every byte is the same."""
    photos = list(sampledata.make_photos(12, seed=6, short_side=(300, 500)))
    spec = _spec(_CROPS, views=2)
    windowed = Augmenter(spec, "cpu").augment(_sources(photos))
    monkeypatch.setattr(codec.jpeg_window, "decode", lambda *args: None)
    sliced = Augmenter(spec, "cpu").augment(_sources(photos))
    assert _hashes(windowed) == _hashes(sliced)


def test_views_share_their_sources_decodes_without_moving_a_byte(counted_decodes) -> None:
    """Eight views of a source are cut from as few decodes as their scales allow, and every
    sample's bytes are those of its replay, which decodes for that view alone."""
    photos = list(sampledata.make_photos(6, seed=11, short_side=(500, 900)))
    spec = _spec(_CROPS, views=8, output={"image_format": "jpeg", "quality": 90})
    decodes = counted_decodes
    augmenter = Augmenter(spec, "cpu")
    output = augmenter.augment(_sources(photos))
    assert len(output.samples) == 48 and len(decodes) <= 3 * len(photos)
    by_key = {source.key: source for source in _sources(photos)}
    for sample in output.samples:
        replayed = augmenter.replay(
            by_key[sample.source_key], sample.view, sample.seed, from_records(sample.ops)
        )
        assert replayed == sample.image, sample.sample_id


def test_output_size_and_format(photos, device: str) -> None:
    for image_format, pil_format in (("jpeg", "JPEG"), ("webp", "WEBP"), ("png", "PNG")):
        spec = _spec(
            [{"name": "random_resized_crop", "size": 50}],
            views=1,
            output={"image_format": image_format, "quality": 80, "size": [40, 30]},
        )
        output = Augmenter(spec, device).augment(_sources(photos[:3]))
        for sample in output.samples:
            opened = Image.open(io.BytesIO(sample.image))
            assert opened.format == pil_format and opened.size == (30, 40)
            assert (sample.height, sample.width) == (40, 30)


def test_the_source_data_is_never_modified(photos, device: str) -> None:
    sources = _sources(photos[:4])
    before = [s.data for s in sources]
    Augmenter(_spec(), device).augment(sources)
    assert [s.data for s in sources] == before


# What a fresh CPU actor does: every op of the catalogue, the policies, the mixes and label
# targets run on uint8 OpenCV kernels, with torch and Kornia not even importable (a CPU
# install has neither; their import would be ~2 s of actor start-up and ~400 MB); only an
# image OpenCV cannot warp as Kornia does (one pixel wide or high, or a side over 32,767)
# loads them.
_FRESH_ACTOR = """
import io
import sys
if not {one_pixel}:  # as if torch and Kornia were not installed (no `gpu` extra)
    sys.modules["torch"] = sys.modules["kornia"] = None
from pathlib import Path
from PIL import Image
from rayaug.augment import Augmenter
from rayaug.partners import Partners
from rayaug.records import SourceSample, Targets
from rayaug.sources import SourceIndex
from rayaug.spec import parse_spec

ops = {ops}
spec = parse_spec({{"input": {{"uri": "in"}}, "output": {{"uri": "out"}}, "ops": ops}})
box = Targets([[2, 3, 30, 20]], [1])
sources = [
    SourceSample(p.name, "mem://" + p.name, p.read_bytes(), "x", targets=box)
    for p in sorted(Path({folder!r}).glob("*.jpg"))
]
if {one_pixel}:
    thin = io.BytesIO()
    Image.new("RGB", (1, 40), (200, 30, 90)).save(thin, "PNG")
    sources[0] = SourceSample("thin", "mem://thin", thin.getvalue(), "thin")


class AllSources(SourceIndex):
    def __init__(self):
        pass

    def __len__(self):
        return len(sources)

    def read(self, index):
        return sources[index]


output = Augmenter(spec, "cpu", Partners(AllSources())).augment(sources)
assert len(output.samples) == 4, output.quarantined
print(sys.modules.get("torch") is not None)
"""

RECIPE_OPS = [
    {"name": "random_resized_crop", "size": 48},
    {"name": "mosaic"},
    {"name": "horizontal_flip"},
    {"name": "color_jitter", "brightness": 0.4, "contrast": 0.4, "saturation": 0.4, "hue": 0.1},
    {"name": "color_jitter", "brightness": 0.4, "hue": 0.1, "fused": True},
    {"name": "rotation", "degrees": 15},
    {"name": "grayscale"},
    {"name": "gaussian_blur", "kernel_size": 5, "sigma": [0.1, 2.0]},
    {"name": "gaussian_noise"},
    {"name": "salt_and_pepper"},
    {"name": "sharpness"},
    {"name": "posterize"},
    {"name": "solarize"},
    {"name": "equalize"},
    {"name": "autocontrast"},
    {"name": "invert"},
    {"name": "erasing"},
    {"name": "rand_augment"},
    {"name": "trivial_augment"},
    {"name": "auto_augment"},
    {"name": "cutmix"},
    {"name": "mixup"},
]


@pytest.mark.parametrize(
    ("one_pixel", "loads_torch"), [(False, False), (True, True)], ids=["photos", "a-1px-image"]
)
def test_a_cpu_augmenter_loads_torch_only_for_what_opencv_cannot_warp(
    one_pixel: bool, loads_torch: bool, photos, tmp_path
) -> None:
    for number, photo in enumerate(photos[:4]):
        (tmp_path / f"{number}.jpg").write_bytes(photo.jpeg)
    ops = [op | {"p": 1.0} for op in RECIPE_OPS]
    script = _FRESH_ACTOR.format(ops=repr(ops), one_pixel=one_pixel, folder=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(loads_torch)]
