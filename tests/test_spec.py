"""Recipes (typed overrides) and evaluation schedules."""

from __future__ import annotations

import pytest

from trainperf.errors import TrainperfError
from trainperf.spec import EvalSchedule
from trainperf.workloads.resnet import MINI_RECIPE, ResNetWorkload


def test_resnet_schedule_every_four_with_offset():
    s = EvalSchedule(every=4, first=3)
    assert [e for e in range(1, 20) if s.due(e)] == [3, 7, 11, 15, 19]
    assert list(s.blocks(12)) == [(1, 3), (4, 4), (8, 4), (12, 1)]


def test_every_epoch_schedule():
    s = EvalSchedule(every=1, first=1)
    assert list(s.blocks(3)) == [(1, 1), (2, 1), (3, 1)]
    assert all(s.due(e) for e in range(1, 10))


def test_schedule_rejects_nonsense():
    with pytest.raises(TrainperfError):
        EvalSchedule(every=0, first=1)


def test_overrides_are_typed():
    r = MINI_RECIPE.with_overrides(["base_lr=0.3", "max_epochs=3", "hflip=true", "widths=8,16", "blocks=1,2",
                                    "optimizer=lars"])
    assert (r.base_lr, r.max_epochs, r.hflip, r.widths, r.blocks, r.optimizer) == (0.3, 3, True, (8, 16), (1, 2),
                                                                                  "lars")
    assert MINI_RECIPE.base_lr != 0.3  # the original is untouched


@pytest.mark.parametrize("item, message", [
    ("nope=1", "unknown recipe field 'nope'; valid fields: "),
    ("max_epochs=ten", "expected an integer, got 'ten'"),
    ("base_lr=fast", "expected a number, got 'fast'"),
    ("hflip=maybe", "expected a boolean"),
    ("optimizer=adam", "optimizer='adam' is not one of: sgd, lars"),
    ("max_epochs=0", "max_epochs must be >= 1"),
    ("justakey", "expected key=value"),
])
def test_bad_overrides_name_the_option(item, message):
    with pytest.raises(TrainperfError) as err:
        MINI_RECIPE.with_overrides([item])
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_unknown_field_lists_valid_keys():
    with pytest.raises(TrainperfError) as err:
        MINI_RECIPE.with_overrides(["bacth_size=3"])
    assert "global_batch_size" in str(err.value) and "base_lr" in str(err.value)


def test_named_recipes():
    w = ResNetWorkload()
    assert w.recipe("full").name == "lars-3264"
    assert w.recipe("full", "lars-1632").base_lr == 7.4
    with pytest.raises(TrainperfError, match="unknown for resnet full; choose one of: lars-3264"):
        w.recipe("full", "lars-9999")
