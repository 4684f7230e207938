"""rayaug.policies: OneOf, SomeOf, RandAugment, TrivialAugment, AutoAugment, same_on_views."""

from __future__ import annotations

from collections import Counter

import pytest

from rayaug.errors import SpecError
from rayaug.ops import CATALOGUE, draw_ops
from rayaug.policies import IMAGENET_POLICY
from rayaug.spec import parse_spec

CANVAS = (224, 224)


def pipeline(*ops: dict):
    return parse_spec({"input": {"uri": "i"}, "output": {"uri": "o"}, "ops": list(ops)}).ops


def plans(ops, seeds=range(300)):
    return [draw_ops(ops, seed, CANVAS) for seed in seeds]


def test_one_of_applies_exactly_one_op_by_weight() -> None:
    ops = pipeline(
        {
            "name": "one_of",
            "weights": [3, 1, 0],
            "ops": [
                {"name": "rotation", "degrees": 10},
                {"name": "grayscale", "p": 1},
                {"name": "equalize"},
            ],
        }
    )
    counts = Counter(step.name for plan in plans(ops) for step in plan)
    assert all(len(plan) == 1 for plan in plans(ops))
    assert counts["equalize"] == 0 and counts["rotation"] > 2 * counts["grayscale"] > 0
    assert all(step.params["via"] == "one_of" for plan in plans(ops) for step in plan)


def test_some_of_applies_n_distinct_ops_in_listed_order() -> None:
    names = ["equalize", "solarize", "posterize", "invert"]
    ops = pipeline({"name": "some_of", "n": 2, "ops": [{"name": n} for n in names]})
    for plan in plans(ops):
        chosen = [step.name for step in plan]
        assert len(set(chosen)) == 2 and chosen == sorted(chosen, key=names.index)
        assert [step.position for step in plan] == [(0, 0), (0, 1)]


def test_rand_augment_uses_torchvisions_space_at_a_fixed_magnitude() -> None:
    ops = pipeline({"name": "rand_augment", "num_ops": 2, "magnitude": 9})
    drawn = [step for plan in plans(ops) for step in plan]
    assert all(len(plan) <= 2 for plan in plans(ops))
    assert {step.params["via"] for step in drawn} == {"rand_augment"}
    angles = {abs(round(s.params["angle"], 6)) for s in drawn if s.name == "rotation"}
    assert angles == {9.0}  # bin 9 of linspace(0, 30, 31), either sign
    bits = {s.params["bits"] for s in drawn if s.name == "posterize"}
    assert bits == {7}  # 8 - round(9 / 7.5)
    assert {s.name for s in drawn} <= set(CATALOGUE)


def test_trivial_augment_applies_at_most_one_op_at_a_random_magnitude() -> None:
    ops = pipeline({"name": "trivial_augment"})
    all_plans = plans(ops)
    assert all(len(plan) <= 1 for plan in all_plans)
    angles = {round(s.params["angle"], 3) for p in all_plans for s in p if s.name == "rotation"}
    assert len(angles) > 3 and max(abs(a) for a in angles) <= 135


def test_auto_augment_follows_the_imagenet_sub_policies() -> None:
    allowed = {
        "Posterize": "posterize",
        "Rotate": "rotation",
        "Solarize": "solarize",
        "AutoContrast": "autocontrast",
        "Equalize": "equalize",
        "Color": "color_jitter",
        "Contrast": "color_jitter",
        "Invert": "invert",
        "Sharpness": "sharpness",
        "ShearX": "affine",
    }
    names = {allowed[op] for sub in IMAGENET_POLICY for op, _, _ in sub}
    ops = pipeline({"name": "auto_augment"})
    for plan in plans(ops):
        assert len(plan) <= 2 and {step.name for step in plan} <= names


def test_same_on_views_shares_one_draw_between_views() -> None:
    ops = pipeline(
        {"name": "random_resized_crop", "size": 64, "same_on_views": True},
        {"name": "rotation", "degrees": 30},
    )
    views = [draw_ops(ops, seed, CANVAS, source_seed=42) for seed in (1, 2, 3)]
    assert len({str(plan[0].params) for plan in views}) == 1
    assert len({plan[1].params["angle"] for plan in views}) == 3


@pytest.mark.parametrize(
    ("op", "message"),
    [
        ({"name": "some_of", "n": 3, "ops": [{"name": "equalize"}]}, "larger than the number"),
        ({"name": "one_of", "ops": [{"name": "rotation", "degrees": -1}]}, "ops[0].ops[0].degrees"),
        (
            {"name": "one_of", "weights": [1], "ops": [{"name": "equalize"}, {"name": "invert"}]},
            "one non-negative weight per op",
        ),
        ({"name": "rand_augment", "magnitude": 40}, "below num_magnitude_bins"),
    ],
)
def test_composite_specs_are_validated(op: dict, message: str) -> None:
    with pytest.raises(SpecError) as error:
        pipeline(op)
    assert message in str(error.value)
