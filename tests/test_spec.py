"""Recipes (typed overrides) and evaluation schedules."""

from __future__ import annotations

import pytest
import torch

from trainperf.contract import Cadence, Metric, RuntimeContext, batch_share, count_samples, split_batch
from trainperf.errors import TrainperfError
from trainperf.workloads.resnet import MINI_RECIPE, ResNetWorkload


def test_resnet_cadence_every_four_with_offset():
    c = Cadence(every=4, first=3, max_epochs=12)
    assert [e for e in range(1, 20) if c.due_after_epoch(e)] == [3, 7, 11, 15, 19]
    assert list(c.blocks()) == [(1, 3), (4, 4), (8, 4), (12, 1)]


def test_every_epoch_cadence():
    c = Cadence(every=1, first=1, max_epochs=3)
    assert list(c.blocks()) == [(1, 1), (2, 1), (3, 1)]
    assert all(c.due_after_epoch(e) for e in range(1, 10))


def test_listed_epochs_cadence_as_ssd_v0_7():
    c = Cadence(epochs=(40, 50, 55, 60, 65, 70, 75, 80), max_epochs=80)
    assert [e for e in range(1, 81) if c.due_after_epoch(e)] == [40, 50, 55, 60, 65, 70, 75, 80]
    assert list(c.blocks())[:3] == [(1, 40), (41, 10), (51, 5)]
    assert c.next_eval_epoch(81) is None


def test_sample_cadence_as_bert():
    c = Cadence(every_samples=150_000, first_samples=150_000, max_samples=4_500_000)
    assert c.by_samples and not c.due_after_epoch(1)
    points = c.sample_evals()
    assert [next(points) for _ in range(3)] == [150_000, 300_000, 450_000]


def test_reference_epoch_cadence_as_unet3d():
    """3D U-Net: first evaluation at epoch ceil(1000*168/S), then every ceil(20*168/S), budget
    ceil(10000*168/S), S = samples per epoch."""
    rules = Cadence(every=20, first=1000, max_epochs=10000, reference_epoch_samples=168)
    assert rules.resolve(168) == Cadence(every=20, first=1000, max_epochs=10000)
    doubled = rules.resolve(336)
    assert (doubled.first, doubled.every, doubled.max_epochs) == (500, 10, 5000)
    odd = rules.resolve(170)
    assert (odd.first, odd.every, odd.max_epochs) == (989, 20, 9883)


def test_marks_inside_an_epoch():
    assert Cadence(per_epoch=4, max_epochs=1).marks(8) == {2, 4, 6}
    assert Cadence(per_epoch=20, max_epochs=1).marks(4) == {1, 2, 3}  # short epochs get fewer
    assert Cadence(per_epoch=4, max_epochs=1).marks(None) == set()


@pytest.mark.parametrize("kwargs, message", [
    ({"every": 0}, r"eval cadence: every=0: expected a finite value in \[1, inf\)"),
    ({"epochs": (0, 3)}, r"epochs=\(0, 3\): expected a finite value in \[1, inf\)"),
    ({"epochs": (5, 3)}, "increasing epoch numbers"),
    ({"max_epochs": 0}, "max_epochs or max_samples must be > 0"),
])
def test_cadence_rejects_nonsense(kwargs, message):
    with pytest.raises(TrainperfError, match=message):
        Cadence(**{"max_epochs": 1, **kwargs})


def test_sample_cadence_logs_samples_and_only_it_does():
    with pytest.raises(TrainperfError, match="log_epoch_num=samples"):
        MINI_RECIPE.with_overrides(["eval_every_samples=1000"])
    assert MINI_RECIPE.with_overrides(["eval_every_samples=1000", "log_epoch_num=samples"]).cadence.by_samples


def test_composite_metric_targets_and_verdict():
    m = Metric("ap", parts=("BBOX", "SEGM"))
    assert m.targets((0.377, 0.339)) == {"BBOX": 0.377, "SEGM": 0.339}
    assert m.reached({"BBOX": 0.38, "SEGM": 0.34}, (0.377, 0.339))
    assert not m.reached({"BBOX": 0.40, "SEGM": 0.33}, (0.377, 0.339))  # both must be met
    assert m.logged({"SEGM": 0.34, "BBOX": 0.38}) == {"BBOX": 0.38, "SEGM": 0.34}
    assert m.describe_target((0.377, 0.339)) == "BBOX >= 0.377 and SEGM >= 0.339"
    with pytest.raises(TrainperfError, match="one value for each of BBOX, SEGM"):
        m.targets(0.3)
    with pytest.raises(TrainperfError, match="expected values for BBOX, SEGM"):
        m.values(0.3)
    lower = Metric("wer", higher_is_better=False)
    assert lower.reached(0.05, 0.058) and not lower.reached(0.06, 0.058)


def test_default_batch_rules_split_lists_as_samples():
    images = [torch.zeros(3, 8 + i, 8) for i in range(5)]
    batch = (images, torch.arange(5))
    assert count_samples(batch) == 5  # not the 3 channels of the first image
    micro = split_batch(batch, 2)
    assert [len(m[0]) for m in micro] == [3, 2] and [m[1].tolist() for m in micro] == [[0, 1, 2], [3, 4]]
    assert micro[0][0][0].shape == (3, 8, 8)  # images stay whole


def test_generators_are_explicit_and_stable():
    a = RuntimeContext(device=torch.device("cpu"), seed=5)
    b = RuntimeContext(device=torch.device("cpu"), seed=5, rank=1, world_size=2)
    assert torch.equal(torch.rand(3, generator=a.generator("order")), torch.rand(3, generator=b.generator("order")))
    assert not torch.equal(torch.rand(3, generator=a.generator("order")), torch.rand(3, generator=a.generator("x")))
    assert a.stream_seed("aug", per_rank=True) != b.stream_seed("aug", per_rank=True)
    assert RuntimeContext(device=torch.device("cpu"), seed=6).stream_seed("order") != a.stream_seed("order")
    # The same in another process (no reliance on Python's salted hash).
    assert RuntimeContext(device=torch.device("cpu"), seed=5).stream_seed("order") == a.stream_seed("order")


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
    ("max_epochs=0", "at least one budget must be > 0"),
    ("max_epochs=-1", "max_epochs=-1: expected a finite value in [0, inf)"),
    ("log_epoch_num=steps", "log_epoch_num='steps' is not one of: epochs, 1+epochs, samples"),
    ("max_grad_norm=-1", "max_grad_norm=-1: expected a finite value in [0, inf)"),
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


def test_every_recipe_says_what_moves_with_the_batch():
    """`Recipe.for_batch` (tune-batch): learning rates scale by the rule, step-counted schedule points
    keep their place in samples; every workload declares its fields, and they exist."""
    import dataclasses
    import math

    from trainperf import registry

    for name in registry.names():
        workload = registry.get(name)
        recipe = workload.recipe(workload.scales[0])
        fields = {f.name for f in dataclasses.fields(recipe)}
        assert recipe.LR_FIELDS and set(recipe.LR_FIELDS) <= fields, name
        assert set(recipe.STEP_FIELDS) <= fields, name
        base = recipe.global_batch_size
        for rule, factor in (("linear", 4.0), ("sqrt", 2.0), ("none", 1.0)):
            scaled, said = recipe.for_batch(base * 4, rule)
            assert scaled.global_batch_size == base * 4 and said[0] == f"global_batch_size {base} -> {base * 4}"
            for key in recipe.LR_FIELDS:
                old, new = getattr(recipe, key), getattr(scaled, key)
                pairs = zip(old, new, strict=True) if isinstance(old, tuple) else [(old, new)]
                assert all(math.isclose(b, a * factor) for a, b in pairs), (name, rule, key)
            for key in recipe.STEP_FIELDS:
                old, new = getattr(recipe, key), getattr(scaled, key)
                pairs = zip(old, new, strict=True) if isinstance(old, tuple) else [(old, new)]
                assert all(b == (max(1, round(a / 4)) if a else 0) for a, b in pairs), (name, key)
        # The warmup keeping its steps: a step count stays, an epoch count grows with the batch.
        steps, _ = recipe.for_batch(base * 4, "linear", "steps")
        for key in recipe.WARMUP_FIELDS:
            expected = getattr(recipe, key) * (1 if key in recipe.STEP_FIELDS else 4)
            assert getattr(steps, key) == pytest.approx(expected), (name, key)
    with pytest.raises(TrainperfError, match="--lr-rule 'cubic'"):
        registry.get("resnet").recipe("mini").for_batch(64, "cubic")


@pytest.mark.parametrize("item", ["label_smoothing=2", "momentum=-5", "stem_width=0", "base_lr=nan", "base_lr=inf",
                                  "base_lr=1e400", "base_lr=0", "widths=8,0", "weight_decay=-1e-4"])
def test_values_out_of_their_range_are_refused_in_one_line(item):
    key = item.split("=")[0]
    with pytest.raises(TrainperfError, match=rf"^recipe field {key}=[^\n]*: expected a finite value in [\[(]"):
        MINI_RECIPE.with_overrides([item])


def _numeric_fields(obj, prefix=""):
    import dataclasses

    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            yield from _numeric_fields(value, f"{prefix}{f.name}.")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            yield prefix + f.name, f.name, value


@pytest.mark.slow
def test_every_numeric_field_of_every_recipe_has_a_range_that_is_enforced():
    """Just outside each field's interval (or NaN) is refused with one line naming the field, for every
    number of every recipe, nested model configs included."""
    import re

    from trainperf import registry

    interval = re.compile(r"([\[(])(-?inf|-?[\d.]+), (-?inf|-?[\d.]+)([\])])")
    checked = 0
    for name in registry.names():
        workload = registry.get(name)
        minis = [workload.recipe("mini")] if "mini" in workload.scales else []
        for recipe in (*minis, *workload.recipes("full").values()):
            intervals = recipe.intervals()
            for path, leaf, value in _numeric_fields(recipe):
                left, lo, hi, right = interval.fullmatch(intervals[path]).groups()
                outside = [float(lo) - 1 if left == "[" else float(lo)] if lo != "-inf" else []
                outside += [float(hi) + 1 if right == "]" else float(hi)] if hi != "inf" else []
                for bad in [*outside, "nan"]:
                    raw = str(int(bad)) if isinstance(value, int) and bad != "nan" else str(bad)
                    if isinstance(value, int) and raw == "nan":
                        continue  # an integer field refuses "nan" as a type error
                    with pytest.raises(TrainperfError, match=rf"^[^\n]*{leaf}[^\n]*$"):
                        recipe.with_overrides([f"{path}={raw}"])
                    checked += 1
    assert checked > 500


def test_no_base_class_names_a_field_of_its_subclasses():
    """Each interval is declared with its field: the contract's classes hold no table of workloads' fields."""
    import inspect

    from trainperf import spec

    source = inspect.getsource(spec.recipe) + inspect.getsource(spec.cadence) + inspect.getsource(spec.workload)
    for name in ("board_size", "rois", "label_smoothing", "joint_chunks", "min_crop_area", "RANGES"):
        assert name not in source


def test_a_nested_model_field_is_set_by_its_path_or_its_own_name():
    from trainperf.workloads.rnnt import MINI

    assert MINI.with_overrides(["model.enc_hidden=32"]).model.enc_hidden == 32
    assert MINI.with_overrides(["enc_hidden=48"]).model.enc_hidden == 48
    with pytest.raises(TrainperfError, match=r"unknown recipe field 'model.nope'.*model\.enc_hidden"):
        MINI.with_overrides(["model.nope=1"])
    with pytest.raises(TrainperfError, match=r"recipe field model.features=100: the featurizer gives 240"):
        MINI.with_overrides(["model.features=100"])


def test_the_evaluations_inside_an_epoch_are_a_pure_function_of_the_step_and_the_samples():
    marks = Cadence(per_epoch=4, max_epochs=2)
    assert [s for s in range(1, 9) if marks.due_after_step(s, 8, (s - 1) * 10, s * 10)] == [2, 4, 6]
    samples = Cadence(every_samples=25, first_samples=40, max_samples=100, max_epochs=0)
    due = [s for s in range(1, 12) if samples.due_after_step(s, None, (s - 1) * 10, s * 10)]
    assert due == [4, 7, 9, 10]  # points 40, 65, 90; the budget spent at 100
    assert [samples.next_sample_eval(n) for n in (0, 39, 40, 64, 65)] == [40, 40, 65, 65, 90]
    plain = Cadence(every_samples=30, max_epochs=0, max_samples=1000)
    assert plain.next_sample_eval(0) == 30 and plain.next_sample_eval(30) == 60
    assert Cadence(max_epochs=3).next_sample_eval(5) is None
    assert not Cadence(max_epochs=3).due_after_step(3, 8, 20, 30)
    for cadence in (samples, plain):  # the same points as the sample cadence's own list
        listed = []
        for point in cadence.sample_evals():
            if point > 300:
                break
            listed.append(point)
        walked, n = [], 0
        while (n := cadence.next_sample_eval(n)) <= 300:
            walked.append(n)
        assert walked == listed


def test_a_global_batch_is_dealt_out_in_one_place():
    # Four processes in tensor-parallel pairs: two data shards, each pair sharing its rows.
    ctx = RuntimeContext(device=torch.device("cpu"), rank=3, world_size=4, replicas=2)
    assert ctx.batch_share(8) == 4 and ctx.batch_share(8, accum=2) == 2
    with pytest.raises(TrainperfError, match="global_batch_size 6 is not divisible by 4 data-parallel processes x 2 "
                                             "accumulation steps"):
        ctx.batch_share(6, accum=2)
    with pytest.raises(TrainperfError, match="^--nproc 3: global_batch_size 8 is not divisible by 3 processes$"):
        batch_share(8, 3, where="--nproc 3")


def test_no_workload_divides_the_global_batch_by_hand():
    """The per-process batch comes from RuntimeContext.batch_share: a workload dividing by the processes itself
    would skip the check (and the tensor-parallel groups that share rows)."""
    import ast
    from pathlib import Path

    import trainperf

    found = []
    for path in (Path(trainperf.__file__).parent / "workloads").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.FloorDiv, ast.Mod)):
                left, right = ast.unparse(node.left), ast.unparse(node.right)
                if "global_batch_size" in left and right.endswith(("world_size", "data_world")):
                    found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    assert found == []
