"""rayaug.ops: per-sample parameters drawn from the seed alone, and the right geometry."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest

from rayaug import ops
from rayaug.ops import (
    CATALOGUE,
    NO_WARP,
    Applied,
    CenterCrop,
    ColorJitter,
    GeometricOp,
    HorizontalFlip,
    MixOp,
    Op,
    Perspective,
    PhotometricOp,
    RandomCrop,
    RandomResizedCrop,
    Resize,
    Rotation,
    VerticalFlip,
    decode_request,
    draw_ops,
    from_records,
    leading_warp,
)

# Every op with non-trivial settings. A new op must be added here (see the first test).
CONFIGS: dict[str, dict] = {
    "resize": {"size": 48},
    "center_crop": {"size": [40, 50]},
    "random_crop": {"size": [40, 50]},
    "random_resized_crop": {"size": [32, 40], "scale": [0.2, 1.0]},
    "horizontal_flip": {},
    "vertical_flip": {},
    "rotation": {"degrees": 30},
    "affine": {"degrees": 10, "translate": [0.1, 0.2], "scale": [0.8, 1.2], "shear": 8},
    "perspective": {"distortion_scale": 0.4},
    "color_jitter": {"brightness": 0.4, "contrast": 0.4, "saturation": 0.4, "hue": 0.1},
    "grayscale": {},
    "gaussian_blur": {"kernel_size": 5, "sigma": [0.1, 2.0]},
    "gaussian_noise": {"std": [0.01, 0.1]},
    "salt_and_pepper": {"amount": [0.01, 0.1]},
    "erasing": {"scale": [0.02, 0.3]},
    "sharpness": {"factor": [0.2, 3.0]},
    "posterize": {"bits": [2, 8]},
    "solarize": {"threshold": [0.3, 0.9]},
    "equalize": {},
    "autocontrast": {},
    "invert": {},
    "mixup": {"alpha": 0.4},
    "cutmix": {"alpha": 1.0},
    "mosaic": {"centre": [0.3, 0.7]},
}
# Ops whose parameters do not depend on the random stream at all.
FIXED = {
    "resize",
    "center_crop",
    "horizontal_flip",
    "vertical_flip",
    "grayscale",
    "equalize",
    "autocontrast",
    "invert",
}
CANVAS = (96, 128)  # (height, width)
SEEDS = range(40)


def _op(name: str, **overrides) -> Op:
    return CATALOGUE[name](**(CONFIGS[name] | overrides))


def _apply(matrix: np.ndarray, x: float, y: float) -> tuple[float, float]:
    u, v, w = matrix @ np.array([x, y, 1.0])
    return u / w, v / w


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def _inside(box: list[int], canvas: tuple[int, int]) -> bool:
    x0, y0, w, h = box
    return min(x0, y0) >= 0 and x0 + w <= canvas[1] and y0 + h <= canvas[0]


def test_every_catalogue_op_is_covered() -> None:
    assert set(CONFIGS) == set(CATALOGUE)
    for name, cls in CATALOGUE.items():
        assert issubclass(cls, GeometricOp | PhotometricOp | MixOp), name
        assert _op(name).name == name


# ---------------------------------------------------------------- drawing


@pytest.mark.parametrize("name", sorted(CATALOGUE))
def test_draw_is_deterministic_and_json_serialisable(name: str) -> None:
    op = _op(name)
    drawn = [op.draw(_rng(seed), CANVAS) for seed in SEEDS]
    for seed, params in zip(SEEDS, drawn, strict=True):
        assert op.draw(_rng(seed), CANVAS) == params  # same seed, same params
        text = json.dumps(params, allow_nan=False)  # plain JSON: the manifest stores it
        assert json.loads(text) == params  # no tuples, numpy scalars or other lossy types
    distinct = {json.dumps(p, sort_keys=True) for p in drawn}
    if name in FIXED:
        assert len(distinct) == 1
    else:
        assert len(distinct) >= 5, f"{name}: seeds hardly change the params"


def _full_pipeline(p: float) -> list[Op]:
    """Every op of the catalogue; the canvas-changing ones keep a canvas every op can use."""
    return [_op(name, p=p) for name in CONFIGS]


def test_draw_ops_depends_on_the_seed_alone() -> None:
    pipeline = _full_pipeline(p=0.5)
    plans = [draw_ops(pipeline, seed, CANVAS) for seed in SEEDS]
    for seed, plan in zip(SEEDS, plans, strict=True):
        assert draw_ops(pipeline, seed, CANVAS) == plan
        records = [step.record() for step in plan]
        assert json.loads(json.dumps(records)) == records
        # applied ops come in pipeline order, each at its own position, with its own name
        positions = [step.position for step in plan]
        assert positions == sorted(set(positions))
        assert all(pipeline[s.position[0]].name == s.name for s in plan)
    assert len({json.dumps([s.record() for s in plan]) for plan in plans}) == len(plans)
    counts = {name: sum(s.name == name for plan in plans for s in plan) for name in CONFIGS}
    assert all(0 < n < len(plans) for n in counts.values()), counts  # p=0.5 both ways


def test_probability_zero_and_one() -> None:
    never = draw_ops([_op("rotation", p=0.0), _op("erasing", p=0.0)], 3, CANVAS)
    always = draw_ops([_op("rotation", p=1.0), _op("erasing", p=1.0)], 3, CANVAS)
    assert never == [] and [s.name for s in always] == ["rotation", "erasing"]


def _canvases(pipeline: list[Op], plan: list[Applied], canvas: tuple[int, int]) -> dict:
    """The canvas each applied op was drawn on."""
    seen = {}
    for step in plan:
        seen[step.position[0]] = canvas
        if isinstance(pipeline[step.position[0]], GeometricOp):
            canvas = step.op.matrix(step.params, canvas)[1]
    return seen


def test_each_op_has_its_own_random_stream() -> None:
    """Turning op k on or off never changes op j's decision or parameters (j != k), except
    through the canvas size that a geometric op k hands on to the ops after it."""
    compared = canvas_dependent = 0
    for seed in range(8):
        for k in range(len(CONFIGS)):
            plans, canvases = [], []
            for p in (0.0, 1.0):
                pipeline = _full_pipeline(p=1.0)
                pipeline[k] = pipeline[k].model_copy(update={"p": p})
                plan = draw_ops(pipeline, seed, CANVAS)
                plans.append({s.position[0]: s for s in plan})
                canvases.append(_canvases(pipeline, plan, CANVAS))
            without, with_k = plans
            assert k not in without and k in with_k
            assert set(with_k) - {k} == set(without)  # nobody else's decision moved
            for j in without:
                if canvases[0][j] == canvases[1][j]:
                    assert without[j] == with_k[j], (seed, k, j)
                    compared += 1
                else:
                    canvas_dependent += 1
                    assert isinstance(_full_pipeline(1.0)[k], GeometricOp)
                    assert j > k
    assert compared > 1000 and canvas_dependent > 0


def test_a_photometric_op_sees_the_canvas_left_by_the_geometric_ops_before_it() -> None:
    pipeline = [Resize(size=(30, 40)), _op("erasing", p=1.0)]
    for seed in SEEDS:
        assert _inside(draw_ops(pipeline, seed, (480, 640))[1].params["box"], (30, 40))


def test_records_replay_to_the_same_plan() -> None:
    plan = draw_ops(_full_pipeline(p=0.5), 5, CANVAS)
    replayed = from_records(json.loads(json.dumps([s.record() for s in plan])))
    assert [(s.name, s.params) for s in replayed] == [(s.name, s.params) for s in plan]
    assert [s.position for s in replayed] == [(i, 0) for i in range(len(plan))]  # the order applied
    assert decode_request(replayed, (960, 1280))[0] == decode_request(plan, (960, 1280))[0]


# ---------------------------------------------------------------- geometry


@pytest.mark.parametrize(
    "name", sorted(n for n, cls in CATALOGUE.items() if issubclass(cls, GeometricOp))
)
@pytest.mark.parametrize("canvas", [CANVAS, (7, 300), (480, 64)])
def test_the_canvas_after_an_op_is_its_matrixs_without_the_matrix(name: str, canvas) -> None:
    op = _op(name)
    for seed in SEEDS:
        params = op.draw(_rng(seed), canvas)
        _, after = op.matrix(params, canvas)
        assert op.canvas_after(params, canvas) == after
        if op.keeps_canvas:
            assert after == canvas


def test_no_warp_is_the_identity_and_read_only() -> None:
    np.testing.assert_array_equal(NO_WARP, np.eye(3))
    with pytest.raises(ValueError):
        NO_WARP[0, 0] = 2.0
    matrix, canvas = leading_warp([], CANVAS)
    assert matrix is NO_WARP and canvas == CANVAS


def test_horizontal_flip_maps_the_left_column_to_the_right() -> None:
    matrix, canvas = HorizontalFlip.matrix({}, (30, 40))
    assert canvas == (30, 40)
    for y in (0, 7, 29):
        assert _apply(matrix, 0, y) == pytest.approx((39, y))
        assert _apply(matrix, 39, y) == pytest.approx((0, y))
    assert _apply(matrix, 19.5, 3) == pytest.approx((19.5, 3))  # the centre column stays


def test_vertical_flip_maps_the_top_row_to_the_bottom() -> None:
    matrix, canvas = VerticalFlip.matrix({}, (30, 40))
    assert canvas == (30, 40)
    assert _apply(matrix, 5, 0) == pytest.approx((5, 29))
    assert _apply(matrix, 5, 29) == pytest.approx((5, 0))


def test_a_90_degree_rotation_maps_corners_to_corners() -> None:
    size = 33
    matrix, canvas = Rotation.matrix({"angle": 90.0}, (size, size))
    assert canvas == (size, size)
    last = size - 1
    corners = [(0, 0), (last, 0), (last, last), (0, last)]
    mapped = [_apply(matrix, *c) for c in corners]
    for got, want in zip(mapped, corners[-1:] + corners[:-1], strict=True):
        # counter-clockwise as displayed (y down): top-right → top-left → bottom-left → ...
        assert got == pytest.approx(want, abs=1e-9)
    assert _apply(matrix, last / 2, last / 2) == pytest.approx((last / 2, last / 2))
    back, _ = Rotation.matrix({"angle": -90.0}, (size, size))
    assert back @ matrix == pytest.approx(np.eye(3), abs=1e-12)


def test_rotation_keeps_the_canvas_and_its_centre() -> None:
    matrix, canvas = Rotation.matrix({"angle": 33.0}, (30, 41))
    assert canvas == (30, 41)
    assert _apply(matrix, 20, 14.5) == pytest.approx((20, 14.5))


def test_affine_identity_and_translation() -> None:
    op = CATALOGUE["affine"]
    identity = {"angle": 0.0, "translate": [0.0, 0.0], "scale": 1.0, "shear": [0.0, 0.0]}
    matrix, canvas = op.matrix(identity, (30, 40))
    assert canvas == (30, 40) and matrix == pytest.approx(np.eye(3))
    moved, _ = op.matrix(identity | {"translate": [3.0, -2.0], "scale": 2.0}, (31, 41))
    assert _apply(moved, 20, 15) == pytest.approx((23, 13))  # the centre moves by translate
    assert _apply(moved, 21, 15) == pytest.approx((25, 13))  # and distances double


@pytest.mark.parametrize("canvas", [(96, 128), (40, 50), (41, 51), (300, 45)])
def test_crop_boxes_lie_inside_the_canvas(canvas: tuple[int, int]) -> None:
    for op in (CenterCrop(size=(40, 45)), RandomCrop(size=(40, 45))):
        lefts = set()
        for seed in SEEDS:
            params = op.draw(_rng(seed), canvas)
            x0, y0, w, h = params["box"]
            assert (w, h) == (45, 40)
            assert _inside(params["box"], canvas)
            matrix, out = op.matrix(params, canvas)
            assert out == (40, 45)
            assert _apply(matrix, x0, y0) == pytest.approx((0, 0))
            assert _apply(matrix, x0 + w - 1, y0 + h - 1) == pytest.approx((44, 39))
            lefts.add((x0, y0))
        if isinstance(op, CenterCrop):
            x0, y0 = lefts.pop()
            assert abs(x0 - (canvas[1] - 45 - x0)) <= 1 and abs(y0 - (canvas[0] - 40 - y0)) <= 1
        elif canvas[1] - 45 > 5:
            assert len(lefts) > 5  # random positions


@pytest.mark.parametrize("canvas", [(96, 128), (480, 640), (640, 480), (200, 200)])
def test_random_resized_crop_respects_its_bounds(canvas: tuple[int, int]) -> None:
    scale, ratio = (0.25, 0.8), (0.75, 1.5)
    op = RandomResizedCrop(size=(56, 72), scale=scale, ratio=ratio)
    area = canvas[0] * canvas[1]
    for seed in range(200):
        params = op.draw(_rng(seed), canvas)
        x0, y0, w, h = params["box"]
        assert params["size"] == [56, 72]
        assert _inside(params["box"], canvas)
        if [x0, y0, w, h] == [0, 0, canvas[1], canvas[0]]:
            continue  # the documented fallback: the whole image
        # within the bounds, up to the rounding of w and h to whole pixels
        assert (w + 0.5) * (h + 0.5) >= scale[0] * area
        assert (w - 0.5) * (h - 0.5) <= scale[1] * area
        assert (w + 0.5) / (h - 0.5) >= ratio[0] and (w - 0.5) / (h + 0.5) <= ratio[1]
        matrix, out = op.matrix(params, canvas)
        assert out == (56, 72)
        # the box's pixel edges become the output's pixel edges
        assert _apply(matrix, x0 - 0.5, y0 - 0.5) == pytest.approx((-0.5, -0.5))
        assert _apply(matrix, x0 + w - 0.5, y0 + h - 0.5) == pytest.approx((71.5, 55.5))


@pytest.mark.parametrize(
    ("canvas", "expected"),
    [
        ((300, 400), (150, 200)),
        ((400, 300), (200, 150)),
        ((333, 500), (150, 225)),
        ((150, 150), (150, 150)),
        ((75, 1000), (150, 2000)),
    ],
)
def test_resize_with_one_number_sets_the_shorter_side(canvas, expected) -> None:
    op = Resize(size=150)
    params = op.draw(_rng(0), canvas)
    matrix, out = op.matrix(params, canvas)
    assert tuple(params["size"]) == out == expected
    assert _apply(matrix, -0.5, -0.5) == pytest.approx((-0.5, -0.5))
    assert _apply(matrix, canvas[1] - 0.5, canvas[0] - 0.5) == pytest.approx(
        (expected[1] - 0.5, expected[0] - 0.5)
    )


def test_resize_with_two_numbers_is_exact() -> None:
    op = Resize(size=(64, 32))
    assert op.matrix(op.draw(_rng(0), (300, 400)), (300, 400))[1] == (64, 32)


def test_perspective_maps_start_points_to_end_points() -> None:
    op = Perspective(distortion_scale=0.5)
    h, w = CANVAS
    for seed in SEEDS:
        params = op.draw(_rng(seed), CANVAS)
        assert params["start"] == [[0, 0], [w - 1, 0], [w - 1, h - 1], [0, h - 1]]
        for x, y in params["end"]:
            assert 0 <= x <= w - 1 and 0 <= y <= h - 1
        matrix, out = op.matrix(params, CANVAS)
        assert out == CANVAS
        for start, end in zip(params["start"], params["end"], strict=True):
            assert _apply(matrix, *start) == pytest.approx(end, abs=1e-6)


@pytest.mark.parametrize("k", [2, 3, 4, 5, 8])
def test_decode_reduction_of_a_k_times_downscale(k: int) -> None:
    canvas = (120 * k, 160 * k)
    assert decode_request(draw_ops([Resize(size=(120, 160))], 0, canvas), canvas)[0] == k
    # later geometric ops that keep the scale keep the reduction
    for angle in range(0, 360, 15):  # float noise must not turn an exact k into k - 1
        pipeline = [Resize(size=120), HorizontalFlip(p=1), Rotation(degrees=(angle, angle))]
        assert decode_request(draw_ops(pipeline, 0, canvas), canvas)[0] == k, angle


def test_decode_reduction_is_one_without_a_downscale() -> None:
    canvas = (300, 400)
    assert decode_request([], canvas)[0] == 1
    assert decode_request(draw_ops([Resize(size=(600, 800))], 0, canvas), canvas)[0] == 1
    assert decode_request(draw_ops([HorizontalFlip(p=1)], 0, canvas), canvas)[0] == 1
    small_crop = draw_ops([RandomResizedCrop(size=64, scale=(0.01, 0.02))], 0, canvas)
    assert decode_request(small_crop, canvas)[0] == 1  # a small box blown up: full detail


def test_decode_reduction_keeps_the_least_shrunk_axis() -> None:
    # 1200x1600 squeezed to 600 high and 100 wide: only 2x fewer rows may be decoded,
    # however much the columns shrink (a mean scale would decode 240 rows for 600).
    canvas = (1200, 1600)
    assert decode_request(draw_ops([Resize(size=(600, 100))], 0, canvas), canvas)[0] == 2
    assert decode_request(draw_ops([Resize(size=(224, 224))], 0, (400, 1600)), (400, 1600))[0] == 1


def test_decode_reduction_stops_at_the_first_photometric_op() -> None:
    canvas = (1200, 1600)
    plan = draw_ops([_op("gaussian_blur"), Resize(size=(300, 400))], 0, canvas)
    assert [s.name for s in plan] == ["gaussian_blur", "resize"]
    assert decode_request(plan, canvas)[0] == 1  # the blur is meant for full-size pixels


@pytest.mark.parametrize(
    "geometry",
    [
        [RandomResizedCrop(size=(224, 224), scale=(0.08, 1.0))],
        [RandomResizedCrop(size=(224, 224)), HorizontalFlip(), Rotation(degrees=15, p=1)],
        [RandomCrop(size=(100, 120)), Perspective(distortion_scale=0.5, p=1)],
        [Rotation(degrees=180, p=1)],
    ],
)
def test_the_needed_box_holds_every_position_the_first_warp_samples(geometry) -> None:
    canvas = (480, 640)
    for seed in range(20):
        plan = draw_ops([*geometry, _op("gaussian_blur"), Rotation(degrees=30, p=1)], seed, canvas)
        box = decode_request(plan, canvas)[1]
        matrix, (height, width) = leading_warp(plan, canvas)
        ys, xs = np.mgrid[0:height, 0:width]
        points = np.linalg.inv(matrix) @ np.stack([xs.ravel(), ys.ravel(), np.ones(xs.size)])
        sampled = points[:2] / points[2]
        assert box is not None
        x0, y0, x1, y1 = box
        assert x0 - 1e-6 <= sampled[0].min() and sampled[0].max() <= x1 + 1e-6
        assert y0 - 1e-6 <= sampled[1].min() and sampled[1].max() <= y1 + 1e-6
        assert (x0, y0, x1, y1) == pytest.approx(  # the least such box
            (sampled[0].min(), sampled[1].min(), sampled[0].max(), sampled[1].max())
        )


def test_no_box_where_the_first_op_is_not_geometric() -> None:
    canvas = (480, 640)
    plan = draw_ops([_op("gaussian_blur"), RandomResizedCrop(size=(224, 224))], 0, canvas)
    assert decode_request(plan, canvas)[1] is None
    assert decode_request([], canvas)[1] is None


# ---------------------------------------------------------------- colour jitter


@pytest.mark.parametrize(
    "enabled",
    [
        ("brightness",),
        ("brightness", "hue"),
        ("contrast", "saturation", "hue"),
        ("brightness", "contrast", "saturation", "hue"),
        (),
    ],
)
def test_color_jitter_order_is_a_permutation_of_the_enabled_steps(enabled: tuple) -> None:
    settings = {"brightness": 0.4, "contrast": 0.3, "saturation": 0.2, "hue": 0.1}
    op = ColorJitter(**{k: v for k, v in settings.items() if k in enabled})
    orders = set()
    for seed in SEEDS:
        params = op.draw(_rng(seed), CANVAS)
        assert sorted(params["order"]) == sorted(enabled)
        assert set(params) - {"order"} == set(enabled)  # a factor for each enabled step only
        for step in enabled:
            low, high = (
                (-settings[step], settings[step])
                if step == "hue"
                else (max(0.0, 1 - settings[step]), 1 + settings[step])
            )
            assert low <= params[step] <= high
        orders.add(tuple(params["order"]))
    assert len(orders) >= min(math.factorial(len(enabled)), 6)  # drawn per sample


def test_color_jitter_draws_what_a_permutation_of_its_step_names_drew() -> None:
    """The order comes from a permutation of indices: the same order, and the same numbers
    drawn after it, as numpy's permutation of the four names."""
    op = ColorJitter(brightness=0.4, contrast=0.3, saturation=0.2, hue=0.1)
    names = ["brightness", "contrast", "saturation", "hue"]
    for seed in range(2000):
        names_rng = _rng(seed)
        expected = [str(name) for name in names_rng.permutation(names)]
        params = op.draw(_rng(seed), CANVAS)
        assert params["order"] == expected
        assert params["brightness"] == float(names_rng.uniform(0.6, 1.4))


@pytest.mark.parametrize("name", sorted(CATALOGUE))
def test_every_op_draws_what_numpys_uniform_drew(name: str, monkeypatch) -> None:
    """Draws are numpy's `Generator.uniform`, double for double: a job resumed or grown with
    this version plans the samples an earlier version would have planned."""
    op, canvas = _op(name), (480, 640)
    drawn = [op.steps(_rng(seed), canvas) for seed in range(300)]
    monkeypatch.setattr(ops, "_uniform", lambda rng, bounds: float(rng.uniform(*bounds)))
    assert drawn == [op.steps(_rng(seed), canvas) for seed in range(300)]


def test_params_on_a_tiny_canvas_are_plain_json() -> None:
    for name, seed in itertools.product(sorted(CATALOGUE), range(3)):
        params = _op(name).draw(_rng(seed), (7, 9))  # a tiny canvas too
        assert json.loads(json.dumps(params)) == params
