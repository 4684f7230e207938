"""The augment stage: decode, apply every sample's drawn ops in batches on a device, encode.

Engine-free: the driver wraps `Augmenter` for Ray Data; tests and replay call it directly.
A sample's pixels depend only on its source bytes and its plan, never on its batch-mates:
geometric ops are fused per sample into one warp, photometric ops take one parameter per
sample, and a batch that fails is retried sample by sample so one bad image costs only itself.
"""

from __future__ import annotations

import dataclasses
import functools
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from rayaug import codec, cpu_kernels, mixes, targets
from rayaug.ops import (
    NO_WARP,
    Applied,
    Canvas,
    GeometricOp,
    MixOp,
    Op,
    Tile,
    advance,
    composed_warp,
    decode_request,
    draw_ops,
    is_no_warp,
    reduction_for,
    scale_translate,
)
from rayaug.partners import NoPartner, Partners
from rayaug.records import (
    SHARED_VIEW,
    AugmentedSample,
    Quarantined,
    ShardOutput,
    SourceSample,
    Targets,
    sample_seed,
)
from rayaug.spec import JobSpec
from rayaug.spill import SpillFile
from rayaug.streams import Streams

if TYPE_CHECKING:
    import torch

    # A sample's pixels: (3, H, W) float in [0, 1] on the device, or, on the CPU, (H, W, 3)
    # uint8 RGB from decoder to encoder (OpenCV kernels; torch only where OpenCV cannot warp).
    Image = torch.Tensor | np.ndarray

# Float results depend on torch's intra-op thread count; one thread per actor keeps bytes
# identical between the job and a replay (actors scale out by count, not by threads).
TORCH_THREADS = 1
# Sources whose op streams are seeded in one `Streams` call: the seeding's numpy calls cost
# the same for one source as for many, so a source at one view paid ~40 % of its Python time
# for them alone. A group is held until its sources' views start, so it also stops at
# SEEDED_BYTES of source bytes: 64 phone photos are 190 MB, 64 web-size ones 4 MB.
SEEDED_TOGETHER = 64
SEEDED_BYTES = 16 << 20
# The device path (Kornia on float tensors) on the CPU, instead of the uint8 OpenCV kernels:
# how a machine without a GPU tests, end to end, the code a GPU runs.
KORNIA_ON_CPU = "cpu-kornia"


def pick_device(num_gpus: float) -> str:
    """CUDA when the actor was given a GPU and torch sees one; the CPU otherwise."""
    return "cuda" if num_gpus > 0 and _torch().cuda.is_available() else "cpu"


@functools.cache
def _torch() -> ModuleType:
    """torch, loaded by the first step that needs it: an actor whose ops all run on OpenCV
    never loads torch and Kornia (~2 s of start-up and ~400 MB each). Every path into torch
    (a tensor, a Kornia kernel) comes through here, so the thread count is set first."""
    try:
        import torch
    except ImportError:
        raise ModuleNotFoundError(
            "this needs the device path (torch and Kornia: pip install 'rayaug[gpu]'): a GPU, "
            "or an image OpenCV cannot warp (one pixel wide or high, or a side over 32,767 px)"
        ) from None

    torch.set_num_threads(TORCH_THREADS)
    return torch


class _Seeds(NamedTuple):
    """One source's seeds: each view's, and the one its `same_on_views` ops draw from."""

    views: dict[int, int]
    shared: int

    def all(self) -> list[int]:
        return [*self.views.values(), self.shared]

    def only(self, view: int) -> _Seeds:
        return _Seeds({view: self.views[view]}, self.shared)


@dataclass
class _Item:
    """One sample in flight through the pipeline."""

    source_key: str
    source_uri: str
    source_digest: str | None
    view: int
    seed: int
    label: str | None
    applied: list[Applied]
    source_size: Canvas
    image: Image
    canvas: Canvas  # the logical size once `pending` is warped
    pending: np.ndarray = field(default_factory=lambda: NO_WARP)
    targets: Targets | None = None  # as read, in source pixels
    steps_done: int = 0  # `applied[:steps_done]` already run (see _warp_next_geometric)
    # Each mix step's partners (by index in `applied`), fetched before the pixels run
    partners: dict[int, list[tuple[SourceSample, mixes.Layer]]] = field(default_factory=dict)
    # Where the targets stand: a mix moves them early, onto the canvas it mixes on; the ops
    # from `targets_from` on are still to be applied to them.
    targets_canvas: Canvas = field(init=False)
    targets_from: int = field(init=False)
    labels: mixes.SoftLabel = field(init=False)

    def __post_init__(self) -> None:
        # `applied` copied: a mix records its partners in it
        self._start = (self.image, self.canvas, self.pending, self.targets, list(self.applied))
        self.reset()

    def reset(self) -> None:
        """Back to the decoded source (ops return new tensors, so the original is intact)."""
        self.image, self.canvas, self.pending, self.targets, planned = self._start
        self.applied = list(planned)
        self.steps_done = 0
        self.targets_canvas, self.targets_from = self.source_size, 0
        self.labels = {self.label: 1.0}

    def targets_now(self, upto: int) -> Targets | None:
        """The targets moved through the geometric ops before `applied[upto]`."""
        if self.targets is None:
            return None
        matrix = composed_warp(self.applied[self.targets_from : upto], self.targets_canvas)
        return targets.move(self.targets, matrix, self.targets_canvas, self.canvas)


class Augmenter:
    """Turns source samples into augmented views, on one device, with the spec's ops."""

    def __init__(
        self, spec: JobSpec, device: str = "cpu", partners: Partners | None = None
    ) -> None:
        """`device`: "cpu" (uint8 OpenCV kernels), a torch device such as "cuda:0" (Kornia),
        or KORNIA_ON_CPU."""
        cpu_kernels.use_one_thread()
        if spec.mixes and partners is None:
            raise ValueError("a job with mix ops needs its sources' partners provider")
        self.spec = spec
        self.pipeline: list[Op] = spec.pipeline()
        self.uint8_path = device == "cpu"
        self.device = "cpu" if device == KORNIA_ON_CPU else device
        self.partners = partners
        if not self.uint8_path:
            _torch()

    def augment(
        self,
        sources: Iterable[SourceSample],
        views: range | None = None,
        spill: SpillFile | None = None,
    ) -> ShardOutput:
        """The `views` (default: all of the spec's) of every source, in order; failures become
        quarantine rows. With `spill`, the encoded samples wait there for the sink, not in
        memory."""
        views = range(self.spec.views) if views is None else views
        output = ShardOutput(device=self.device.partition(":")[0], views=views, spill=spill)
        batch_size = self.spec.execution.batch_size
        pending: list[_Item] = []
        for group, streams in self._seeded_groups(sources, views):
            while group:  # taken out of the group: a source's bytes go once its views start
                source, seeds = group.popleft()
                output.sources += 1
                pending += self._start(source, seeds, streams, output)
                while len(pending) >= batch_size:
                    self._run_chunk(pending[:batch_size], output)
                    del pending[:batch_size]
        if pending:
            self._run_chunk(pending, output)
        return output

    def _seeded_groups(
        self, sources: Iterable[SourceSample], views: Iterable[int]
    ) -> Iterator[tuple[deque[tuple[SourceSample, _Seeds]], Streams]]:
        """The sources in groups of up to SEEDED_TOGETHER sources or SEEDED_BYTES, each source
        with its seeds, each group with the op streams of all its sources' seeds, seeded in one
        call. Only the caller's deque holds a group's sources, so each goes once taken out."""
        seeded: deque[tuple[SourceSample, _Seeds]] = deque()
        held = 0
        for source in sources:
            seeded.append((source, self._seeds(source, views)))
            held += source.size
            if len(seeded) == SEEDED_TOGETHER or held >= SEEDED_BYTES:
                yield seeded, self._streams(seeded)
                seeded, held = deque(), 0
        if seeded:
            yield seeded, self._streams(seeded)

    def _streams(self, seeded: deque[tuple[SourceSample, _Seeds]]) -> Streams:
        every_seed = [seed for _, seeds in seeded for seed in seeds.all()]
        return Streams(every_seed, len(self.pipeline))

    def _seeds(self, source: SourceSample, views: Iterable[int]) -> _Seeds:
        key, job_seed = source.key, self.spec.seed
        return _Seeds(
            {view: sample_seed(job_seed, key, view) for view in views},
            sample_seed(job_seed, key, SHARED_VIEW),
        )

    def replay(self, source: SourceSample, view: int, seed: int, applied: list[Applied]) -> bytes:
        """The encoded bytes of one sample from its recorded plan (seed only for the record)."""
        opened = codec.open_image(source.data or b"", self.spec.errors.max_pixels)
        (item,) = self._load(source, opened, [(view, seed, applied)])
        self._fetch_partners(item)
        self._run_items([item])
        return self._encode(item).image

    # ------------------------------------------------------------ stages

    def _run_chunk(self, items: list[_Item], output: ShardOutput) -> None:
        try:
            self._run_items(items)
        except Exception:  # isolate the culprit: rerun alone, quarantine only what fails alone
            items = [item for item in items if self._run_alone(item, output)]
        for item in items:
            encoded = _attempt(
                output, item.source_key, item.view, "encode", lambda i=item: self._encode(i)
            )
            if encoded is not None:
                output.add(encoded)

    def _start(
        self, source: SourceSample, seeds: _Seeds, streams: Streams, output: ShardOutput
    ) -> list[_Item]:
        """The unit's views of one source, decoded (sharing what the views share) and with its
        partners; what fails is quarantined per view. `streams`: seeded for `seeds`."""
        views = output.views
        if source.error is not None:
            output.quarantined += [
                Quarantined(source.key, view, "read", "ReadError", source.error) for view in views
            ]
            return []
        try:
            items = self._views(source, seeds, streams)
        except Exception:  # noqa: BLE001 - each view alone words its own failure, as replay would
            items = []
            for view in views:
                alone = _attempt(
                    output,
                    source.key,
                    view,
                    "decode",
                    lambda v=view: self._views(source, seeds.only(v), streams),
                )
                items += alone or []
        return [
            item
            for item in items
            if self._with_partners(item, output) and self._with_leading_warp(item, output)
        ]

    def _with_leading_warp(self, item: _Item, output: ShardOutput) -> bool:
        """On the CPU path, the view's leading geometric ops warped now, right after its decode
        (see `_warp_next_geometric`); the device warps a batch's samples of one size in one
        call. False when that fails: the view is quarantined."""
        if not self.uint8_path:
            return True
        done = _attempt(
            output, item.source_key, item.view, "augment", lambda: _warp_next_geometric(item)
        )
        return done is not None

    def _views(self, source: SourceSample, seeds: _Seeds, streams: Streams) -> list[_Item]:
        """The source opened once, each view's ops drawn from its own seed (the streams seeded
        beforehand in `streams`), then decoded."""
        opened = codec.open_image(source.data or b"", self.spec.errors.max_pixels)
        plans = [
            (view, seed, draw_ops(self.pipeline, seed, opened.canvas, seeds.shared, streams))
            for view, seed in seeds.views.items()
        ]
        return self._load(source, opened, plans)

    def _load(
        self,
        source: SourceSample,
        opened: codec.Opened,
        plans: Sequence[tuple[int, int, list[Applied]]],
    ) -> list[_Item]:
        """Items of one source's views — (view, seed, applied ops) each — decoded together."""
        canvas = opened.canvas
        wanted = [decode_request(applied, canvas) for _, _, applied in plans]
        decoded = self._decode(opened, wanted)
        return [
            _Item(
                source.key,
                source.uri,
                source.digest,
                view,
                seed,
                source.label,
                applied,
                canvas,
                image,
                canvas,
                pending,
                source.targets,
            )
            for (view, seed, applied), (image, pending) in zip(plans, decoded, strict=True)
        ]

    def _decode(
        self, opened: codec.Opened, wanted: Sequence[codec.Wanted]
    ) -> list[tuple[Image, np.ndarray]]:
        """Each view's pixels (see `Image`) and the matrix from them to the canvas, from as few
        decodes as the views allow. On the CPU only the window of the source that a view's
        `needed` box says its first warp reads (see `codec.decode_parts`)."""
        if self.uint8_path:
            return [
                (part.pixels, _rescale(part.size, opened.canvas) @ _translation(part.origin))
                for part in codec.decode_parts(opened, wanted)
            ]
        decoded: dict[int, tuple[Image, np.ndarray]] = {}
        for reduction, _ in wanted:
            if reduction not in decoded:
                decoded[reduction] = self._decode_on_device(opened, reduction)
        return [decoded[reduction] for reduction, _ in wanted]

    def _decode_on_device(self, opened: codec.Opened, reduction: int) -> tuple[Image, np.ndarray]:
        image = codec.decode_on_device(opened, reduction, self.device)
        if image is None:
            image = _upload(codec.decode(opened, reduction), self.device)
        return image, _rescale(_size(image), opened.canvas) if reduction > 1 else NO_WARP

    def _run_alone(self, item: _Item, output: ShardOutput) -> bool:
        item.reset()
        done = _attempt(
            output, item.source_key, item.view, "augment", lambda: self._run_items([item])
        )
        return done is not None

    def _run_items(self, items: list[_Item]) -> None:
        # Each sample's steps by position and op, in one pass; a sample has one op a position,
        # so the ops of one position may run in any order.
        by_step: dict[tuple[tuple[int, int], str], list[tuple[_Item, int]]] = defaultdict(list)
        for item in items:
            for index in range(item.steps_done, len(item.applied)):
                step = item.applied[index]
                by_step[step.position, step.name].append((item, index))
        for key in sorted(by_step):
            self._run_step(by_step[key])
        _warp(items)

    def _run_step(self, steps: list[tuple[_Item, int]]) -> None:
        """One op at one position, on every sample that drew it (each sample with the step's
        index in its `applied`)."""
        first, index = steps[0]
        op = first.applied[index].op
        if issubclass(op, GeometricOp):  # composed now, warped before the next other op
            for item, index in steps:
                if index >= item.steps_done:  # else warped already, after the op before it
                    _compose(item, item.applied[index])
            return
        _warp([item for item, _ in steps])
        if issubclass(op, MixOp):
            for item, index in steps:
                self._mix(item, index)
        else:
            self._photometric(steps)

    # ------------------------------------------------------------ mixes

    def _with_partners(self, item: _Item, output: ShardOutput) -> bool:
        """Fetch the item's partners, or quarantine it when a pick finds none usable. Outside
        the per-sample isolation: a storage failure fails the shard (see `partners`)."""
        if self.partners is None:  # a job without mix ops
            return True
        try:
            self._fetch_partners(item)
        except NoPartner as error:
            output.quarantined.append(
                Quarantined(item.source_key, item.view, "augment", "NoPartner", str(error)[:500])
            )
            return False
        return True

    def _fetch_partners(self, item: _Item) -> None:
        canvas = item.source_size
        for at, step in enumerate(item.applied):
            if step.op.kind == "mix":
                tiles = {tile.image: tile for tile in step.op.tiles(step.params, canvas)}
                item.partners[at] = self.partners.of_step(
                    step.params,
                    step.op.partner_count,
                    item.source_key,
                    lambda source, number, t=tiles: self._partner_layer(source, t.get(number)),
                )
            canvas = advance(step.name, step.params, canvas)

    def _mix(self, item: _Item, at: int) -> None:
        """Mix the sample with its partners; the step gets their keys, for the record."""
        step = item.applied[at]
        tiles = {tile.image: tile for tile in step.op.tiles(step.params, item.canvas)}
        partners = item.partners[at]
        records = [{"key": sample.key, "uri": sample.uri} for sample, _ in partners]
        item.applied[at] = dataclasses.replace(step, params=step.params | {"partners": records})
        sample = mixes.Layer(item.image, NO_WARP, item.canvas, item.targets_now(at), item.labels)
        layers = _same_form([sample, *(layer for _, layer in partners)], tiles)
        mixed = mixes.mix(step.op, step.params, item.canvas, layers)
        item.image, item.targets, item.labels = mixed.image, mixed.targets, mixed.labels
        item.targets_canvas, item.targets_from = item.canvas, at + 1

    def _partner_layer(self, source: SourceSample, tile: Tile | None) -> mixes.Layer:
        opened = codec.open_image(source.data or b"", self.spec.errors.max_pixels)
        reduction = 1 if tile is None else reduction_for(tile.matrix(opened.canvas))
        ((image, to_canvas),) = self._decode(opened, [(reduction, None)])
        return mixes.Layer(image, to_canvas, opened.canvas, source.targets, {source.label: 1.0})

    @staticmethod
    def _photometric(steps: list[tuple[_Item, int]]) -> None:
        """One photometric op on every sample that drew it: on the CPU path each sample's kernel,
        then at once the geometric ops that follow it (see `_warp_next_geometric`); on a device,
        one kernel call for each group of samples of one shape and batch key."""
        groups: dict[object, list[tuple[_Item, Applied]]] = defaultdict(list)
        for item, index in steps:
            step = item.applied[index]
            if isinstance(item.image, np.ndarray):  # the CPU path: every op has a uint8 kernel
                item.image = cpu_kernels.KERNELS[step.name](item.image, step.params)
                item.steps_done = index + 1
                _warp_next_geometric(item)
                continue
            groups[(tuple(item.image.shape), step.op.batch_key(step.params))].append((item, step))
        if not groups:
            return
        from rayaug.kernels import KERNELS

        for group in groups.values():
            kernel = KERNELS[group[0][1].name]
            images = _torch().stack([item.image for item, _ in group])
            result = kernel(images, [s.params for _, s in group])
            for (item, _), image in zip(group, result, strict=True):
                item.image = image

    def _encode(self, item: _Item) -> AugmentedSample:
        output = self.spec.output
        if isinstance(item.image, np.ndarray):  # the CPU path: already 8-bit HWC
            height, width = item.image.shape[:2]
            data = codec.encode(item.image, output.image_format, output.quality)
        else:
            pixels = (item.image * 255).round().clamp(0, 255).to(_torch().uint8)
            height, width = pixels.shape[1], pixels.shape[2]
            data = codec.encode_on_device(pixels, output.image_format, output.quality)
            if data is None:
                array = pixels.permute(1, 2, 0).contiguous().cpu().numpy()
                data = codec.encode(array, output.image_format, output.quality)
        return AugmentedSample(
            source_key=item.source_key,
            source_uri=item.source_uri,
            source_digest=item.source_digest,
            view=item.view,
            seed=item.seed,
            label=item.label,
            ops=[step.record() for step in item.applied],
            source_size=item.source_size,
            encoded=data,
            height=height,
            width=width,
            targets=item.targets_now(len(item.applied)),
            soft_label=item.labels if any(s.op.kind == "mix" for s in item.applied) else None,
        )


def _rescale(reduced: tuple[int, int], canvas: Canvas) -> np.ndarray:
    """Pixel centres of a reduced decode → the full-size canvas they stand for."""
    sx, sy = canvas[1] / reduced[1], canvas[0] / reduced[0]
    return scale_translate(sx, sy, 0.5 * sx - 0.5, 0.5 * sy - 0.5)


def _translation(origin: tuple[int, int]) -> np.ndarray:
    """A window's pixels → the whole decode's, the window's corner at `origin` (x, y)."""
    return scale_translate(1, 1, *origin)


def _size(image: Image) -> Canvas:
    """(height, width) of a CHW tensor or an HWC array."""
    return image.shape[:2] if isinstance(image, np.ndarray) else tuple(image.shape[1:])


def _upload(pixels: np.ndarray, device: str) -> torch.Tensor:
    """(H, W, 3) uint8 → (3, H, W) float in [0, 1] on the device."""
    torch = _torch()
    tensor = torch.from_numpy(pixels)
    if device != "cpu":  # pinned: the copy overlaps the next decode
        tensor = tensor.pin_memory()
    tensor = tensor.to(device, non_blocking=True)
    return tensor.permute(2, 0, 1).to(torch.float32) / 255


def _same_form(layers: list[mixes.Layer], tiles: dict[int, Tile]) -> list[mixes.Layer]:
    """A mix's images all as CPU-path arrays (when OpenCV can fit every one to its tile) or
    all as tensors: the sample's form decides, unless an image only Kornia can warp."""

    def warpable(layer: mixes.Layer, number: int) -> bool:
        tile = tiles.get(number)
        return tile is None or cpu_kernels.can_warp(_size(layer.image), tile.size)

    arrays = all(
        isinstance(layer.image, np.ndarray) and warpable(layer, number)
        for number, layer in enumerate(layers)
    )
    if arrays:
        return layers
    return [dataclasses.replace(layer, image=_as_tensor(layer.image)) for layer in layers]


def _as_tensor(image: Image) -> torch.Tensor:
    """The torch form of an image (a CPU-path array becomes a CPU tensor)."""
    return _upload(image, "cpu") if isinstance(image, np.ndarray) else image


def _compose(item: _Item, step: Applied) -> None:
    """A geometric step joins the item's pending warp (and moves its logical canvas)."""
    matrix, item.canvas = step.op.matrix(step.params, item.canvas)
    item.pending = matrix @ item.pending


def _warp_next_geometric(item: _Item) -> None:
    """The view's geometric ops from `steps_done` up to its next other op, warped now, while
    its pixels are still in the cache: the decoded window (the leading ops) or a CPU kernel's
    output. Warped with the rest of its batch, after the batch's other decodes or kernels,
    they were read back from memory, where a rotation's taps, which cross the rows, wait on
    line after line: a 224 px rotation took 170-210 µs in the stage, 140 µs right after its
    kernel. The same bytes either way: a warp is per sample."""
    for step in item.applied[item.steps_done :]:
        if not issubclass(step.op, GeometricOp):
            break
        _compose(item, step)
        item.steps_done += 1
    _warp([item])


def _warp(items: list[_Item]) -> None:
    """Apply each item's pending homography: CPU-path arrays one by one with OpenCV, tensors
    of equal shapes in one Kornia call."""
    groups: dict[tuple, list[_Item]] = defaultdict(list)
    for item in items:
        if _size(item.image) == item.canvas and is_no_warp(item.pending):
            continue  # nothing to warp
        if isinstance(item.image, np.ndarray):
            if cpu_kernels.can_warp(_size(item.image), item.canvas):
                item.image = cpu_kernels.warp(item.image, item.pending, item.canvas)
                item.pending = NO_WARP
                continue
            item.image = _as_tensor(item.image)
        groups[(tuple(item.image.shape), item.canvas)].append(item)
    if not groups:
        return
    from rayaug.kernels import warp

    for (_, canvas), group in groups.items():
        images = _torch().stack([item.image for item in group])
        warped = warp(images, np.stack([item.pending for item in group]), canvas)
        for item, image in zip(group, warped, strict=True):
            item.image, item.pending = image, NO_WARP


def _attempt(output: ShardOutput, key: str, view: int, stage: str, work: Callable):
    """Run one sample's step; a failure is recorded as a quarantine row, never raised."""
    try:
        result = work()
        return True if result is None else result
    except Exception as error:  # noqa: BLE001 - any per-image failure is data, not a crash
        message = str(error) or repr(error)
        output.quarantined.append(
            Quarantined(key, view, stage, type(error).__name__, message[:500])
        )
        return None
