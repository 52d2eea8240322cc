"""RetinaNet: anchors against hand-computed values, the reference configuration (frozen BatchNorm,
trainable layers, head initialisation, tensor names the 2.0.0 closed rules list), the warmup, backbone
weights, the mini run end to end under ruleset 2.0.0, the full path on a tiny OpenImages-layout tree,
two processes against one, and the closed rules of the full recipes."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torchvision
from PIL import Image
from torchvision.models.detection.image_list import ImageList
from torchvision.ops.misc import FrozenBatchNorm2d

from tests.conftest import read_log, write_minimal_closed_log
from trainperf.cli import main
from trainperf.contract import Assets, RuntimeContext
from trainperf.errors import TrainperfError
from trainperf.results.compliance import check
from trainperf.workloads.common.coco import data as C
from trainperf.workloads.common.coco import matching
from trainperf.workloads.retinanet import FULL_RECIPES, MINI, RetinaNetWorkload, lr_factor
from trainperf.workloads.retinanet import model as M


@pytest.fixture(scope="module")
def reference() -> torch.nn.Module:
    return M.retinanet_resnext50(264)


def _anchors(model: torch.nn.Module, size: int) -> list[torch.Tensor]:
    strides = (8, 16, 32, 64, 128)
    features = [torch.zeros(1, 1, math.ceil(size / s), math.ceil(size / s)) for s in strides]
    return model.anchor_generator(ImageList(torch.zeros(1, 3, size, size), [(size, size)]), features)


# -- anchors ------------------------------------------------------------------------------------
def test_reference_anchors_by_hand(reference):
    anchors = _anchors(reference, 800)[0]
    # 9 per location on P3-P7 of an 800x800 image: 100^2 + 50^2 + 25^2 + 13^2 + 7^2 locations.
    assert anchors.shape == (9 * (100**2 + 50**2 + 25**2 + 13**2 + 7**2), 4) == (120_087, 4)
    # The first location (0, 0) of P3: sizes 32, int(32 * 2^(1/3)) = 40, int(32 * 2^(2/3)) = 50 at
    # ratio h/w 0.5 first: w = 32 * sqrt(2) = 45.25, h = 22.63, halves rounded: (-23, -11, 23, 11).
    torch.testing.assert_close(anchors[0], torch.tensor([-23.0, -11.0, 23.0, 11.0]))
    torch.testing.assert_close(anchors[3], torch.tensor([-16.0, -16.0, 16.0, 16.0]))  # ratio 1, size 32
    torch.testing.assert_close(anchors[5], torch.tensor([-25.0, -25.0, 25.0, 25.0]))  # ratio 1, size 50
    torch.testing.assert_close(anchors[9 + 3], torch.tensor([-8.0, -16.0, 24.0, 16.0]))  # next cell: x + 8
    # The first P7 anchor of ratio 1: size 512 at (0, 0).
    p7 = 9 * (100**2 + 50**2 + 25**2 + 13**2)
    torch.testing.assert_close(anchors[p7 + 3], torch.tensor([-256.0, -256.0, 256.0, 256.0]))


def test_mini_anchors_are_sized_to_the_objects():
    model = M.mini_retinanet(4)
    anchors = _anchors(model, 64)[0]
    # Square only (every mini box is square): 3 per location on 8x8, 4x4, 2x2, 1x1, 1x1.
    assert anchors.shape == (3 * (8 * 8 + 4 * 4 + 2 * 2 + 1 + 1), 4)
    sides = (anchors[:, 2] - anchors[:, 0])
    # P7: 64, int(64 * 2^(1/3)) = 80, int(64 * 2^(2/3)) = 101, whose half 50.5 rounds to 50 (half to even).
    assert sides[:3].tolist() == [8.0, 10.0, 12.0] and sides[-3:].tolist() == [64.0, 80.0, 100.0]
    assert torch.equal(anchors[:, 2] - anchors[:, 0], anchors[:, 3] - anchors[:, 1])
    assert isinstance(model.head.classification_head.conv[0][1], torch.nn.GroupNorm)


# -- the reference configuration ----------------------------------------------------------------
def _random_targets(generator: torch.Generator, counts: list[int], size: int, classes: int) -> list[dict]:
    targets = []
    for n in counts:
        corner = torch.rand(n, 2, generator=generator) * size * 0.8
        side = 4 + torch.rand(n, 2, generator=generator) * size * 0.4
        boxes = torch.cat([corner, (corner + side).clamp(max=size)], 1)
        targets.append({"boxes": boxes, "labels": torch.randint(0, classes, (n,), generator=generator)})
    return targets


@pytest.mark.parametrize(("which", "loss_type"), [("mini", "giou"), ("mini", "l1"), ("mini", "smooth_l1"),
                                                 ("reference", "l1")])
def test_batched_loss_equals_torchvisions_per_image_loss(loss_type, which, reference):
    """Same losses and gradients as torchvision's per-image loop, on batches with empty images, anchors
    between the thresholds and low-quality matches (the matcher's quirks are part of the loss)."""
    # The loss reads the class count from the logits: 8 keeps the reference's 120,087 anchors cheap.
    model, size, classes = (M.mini_retinanet(4), 64, 4) if which == "mini" else (reference, 800, 8)
    model.head.regression_head._loss_type = loss_type
    generator = torch.Generator().manual_seed(3)
    anchors = _anchors(model, size) * 4
    targets = _random_targets(generator, [3, 0, 1, 7], size, classes)
    count = anchors[0].shape[0]
    outputs = {"cls_logits": torch.randn(4, count, classes, generator=generator, requires_grad=True),
               "bbox_regression": (0.3 * torch.randn(4, count, 4, generator=generator)).requires_grad_()}

    def loss_and_grads(compute):
        losses = compute(model, targets, outputs, anchors)
        total = losses["classification"] + losses["bbox_regression"]
        grads = torch.autograd.grad(total, [outputs["cls_logits"], outputs["bbox_regression"]])
        return [losses["classification"], losses["bbox_regression"], *grads]

    batched = loss_and_grads(M.BatchedRetinaNet.compute_loss)
    looped = loss_and_grads(torchvision.models.detection.RetinaNet.compute_loss)
    for mine, theirs in zip(batched, looped, strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-6)
    # The batch exercised every matcher outcome.
    boxes = torch.nn.utils.rnn.pad_sequence([t["boxes"] for t in targets], batch_first=True)
    present = torch.nn.utils.rnn.pad_sequence([torch.ones(len(t["boxes"]), dtype=torch.bool) for t in targets],
                                              batch_first=True)
    matches = matching.match(model.proposal_matcher, boxes, present, torch.stack(anchors))
    assert {-2, -1}.issubset(set(matches.unique().tolist())) and (matches >= 0).any()
    assert (matches[1] == -1).all()  # the image without boxes
    strict = copy.copy(model.proposal_matcher)
    strict.allow_low_quality_matches = False
    try:
        assert (matching.match(strict, boxes, present, torch.stack(anchors)) != matches).any()  # low-quality matches
    finally:
        model.head.regression_head._loss_type = "l1" if which == "reference" else "giou"


@pytest.mark.slow
@pytest.mark.parametrize("which", ["mini", "reference"])
def test_static_shapes_give_the_same_losses_and_gradients(which, reference):
    """--static-shapes: images resized and boxes padded before the model (present marks the real ones) give
    the losses and parameter gradients of the model's own path, on a batch with an image without boxes; the
    padded form's shapes depend only on the bucket of the batch's largest box count."""
    model, size, classes = (M.mini_retinanet(4), 64, 4) if which == "mini" else (reference, 256, 8)
    transform = model.transform
    saved = (transform.min_size, transform.max_size, transform.fixed_size)
    transform.min_size, transform.max_size, transform.fixed_size = (size,), size, (size, size)  # restored below
    try:
        _static_equals_the_models_own_path(model, size, classes)
    finally:
        transform.min_size, transform.max_size, transform.fixed_size = saved


def _static_equals_the_models_own_path(model: torch.nn.Module, size: int, classes: int) -> None:
    from trainperf.contract import LengthBuckets

    model.train()
    generator = torch.Generator().manual_seed(5)
    images = [torch.rand(3, size + 16 * i, size, generator=generator) for i in range(3)]  # resized by the model
    targets = _random_targets(generator, [3, 0, 5], size, classes)
    params = [p for p in model.parameters() if p.requires_grad]

    def loss_and_grads(images, targets):
        torch.manual_seed(0)
        losses = model(images, targets)
        total = losses["classification"] + losses["bbox_regression"]
        return [losses["classification"], losses["bbox_regression"], *torch.autograd.grad(total, params)]

    buckets = LengthBuckets((4, 8))
    static_images, padded = model.static_inputs(images, targets, buckets)
    assert static_images.shape == (3, 3, size, size) and padded["boxes"].shape == (3, 8, 4)
    assert padded["present"].sum(1).tolist() == [3, 0, 5]
    for mine, theirs in zip(loss_and_grads(static_images, padded), loss_and_grads(images, targets), strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="longer than the longest bucket"):
        model.static_inputs(images, _random_targets(generator, [9, 0, 0], size, classes), buckets)


def test_reference_configuration(reference):
    body = reference.backbone.body
    # Trainable layers 3: the stem and layer1 frozen, layers 2-4 trained; every BatchNorm frozen.
    assert not any(p.requires_grad for p in body.conv1.parameters())
    assert not any(p.requires_grad for p in body.layer1.parameters())
    assert all(p.requires_grad for name in ("layer2", "layer3", "layer4") for p in getattr(body, name).parameters())
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in reference.modules())
    assert any(isinstance(m, FrozenBatchNorm2d) for m in body.modules())
    assert body.layer2[0].conv2.groups == 32  # ResNeXt 32x4d
    head = reference.head.classification_head
    assert head.cls_logits.out_channels == 9 * 264
    torch.testing.assert_close(head.cls_logits.bias, torch.full((9 * 264,), -math.log(99)))
    assert reference.proposal_matcher.high_threshold == 0.5 and reference.proposal_matcher.low_threshold == 0.4
    assert reference.transform.fixed_size == (800, 800)
    assert (reference.score_thresh, reference.nms_thresh, reference.detections_per_img) == (0.05, 0.5, 300)


def test_logged_tensor_names_are_the_closed_rules_list(reference):
    import re

    import mlperf_logging

    rules = Path(mlperf_logging.__file__).parent / "compliance_checker" / "training_2.0.0" / "closed_ssd.yaml"
    listed = re.findall(r'"(module\.[^"]+)"', rules.read_text())
    assert len(listed) == 89 and sorted(M.reference_tensor_names(reference)) == sorted(listed)


@pytest.mark.slow
def test_backbone_weights_are_loaded_and_checked(tmp_path):
    from torchvision.models import resnext50_32x4d

    weights = resnext50_32x4d().state_dict()
    path = tmp_path / "resnext50.pt"
    torch.save(weights, path)
    recipe = FULL_RECIPES["rcp-256"]
    ctx = RuntimeContext(device=torch.device("cpu"))
    parts = RetinaNetWorkload().build(recipe, ctx, Assets({"backbone weights": path}))
    torch.testing.assert_close(parts.model.backbone.body.conv1.weight, weights["conv1.weight"])
    torch.testing.assert_close(parts.model.backbone.body.layer4[2].bn3.running_var, weights["layer4.2.bn3.running_var"])
    weights["layer3.0.conv2.weight"] = torch.zeros(3, 3)
    torch.save(weights, path)
    with pytest.raises(TrainperfError, match=r"resnext50.pt: layer3.0.conv2.weight has shape \(3, 3\)"):
        RetinaNetWorkload().build(recipe, ctx, Assets({"backbone weights": path}))


def test_warmup_from_the_factor_then_constant():
    recipe = FULL_RECIPES["rcp-256"]
    f = lr_factor(recipe, 100)
    assert f(0) == pytest.approx(1e-3) and f(50) == pytest.approx(1e-3 * 0.5 + 0.5)
    assert f(100) == 1.0 and f(10_000) == 1.0
    mini = lr_factor(MINI, 62)
    assert mini(62) == pytest.approx(0.5 * (1 + math.cos(math.pi / MINI.max_epochs)))
    assert mini(MINI.max_epochs * 62) == pytest.approx(0.0, abs=1e-12)


def test_the_closed_rules_refuse_a_log_missing_one_initialised_tensor(tmp_path, reference):
    """Every full recipe passing the closed rules is the conformance test's; the 89 tensors are RetinaNet's own."""
    recipe = next(iter(FULL_RECIPES.values()))
    workload = RetinaNetWorkload()
    ctx = RuntimeContext(device=torch.device("cpu"), world_size=8)
    log = tmp_path / "closed.txt"
    write_minimal_closed_log(log, "ssd", recipe.global_batch_size, workload.mlperf_hyperparameters(recipe, ctx),
                             accuracy=0.341, epoch_num=4,
                             initialized=workload.initialized_tensors(recipe, reference)[1:])
    assert not check(log, "2.0.0").valid


# -- data ----------------------------------------------------------------------------------------
def _openimages_tree(root: Path, images: int = 5) -> Path:
    """A tiny OpenImages-MLPerf tree (`<split>/data/*.jpg`, `<split>/labels/openimages-mlperf.json`):
    images of 48x40, the last without boxes, a group (crowd) box, category ids 0 and 7."""
    for split in C.OPENIMAGES_MLPERF.splits:
        folder = C.OPENIMAGES_MLPERF.image_dir(root, split)
        folder.mkdir(parents=True)
        entries, anns = [], []
        for i in range(1, images + 1):
            name = f"{i:016x}.jpg"
            Image.fromarray(np.full((40, 48, 3), 40 * i, np.uint8)).save(folder / name)
            entries.append({"id": i, "file_name": name, "width": 48, "height": 40})
            if i < images:
                anns.append({"id": 10 * i, "image_id": i, "category_id": 0 if i % 2 else 7, "iscrowd": 0,
                             "bbox": [5, 5, 10 + i, 8], "area": 80.0})
        anns.append({"id": 999, "image_id": 1, "category_id": 7, "iscrowd": 1, "bbox": [0, 0, 20, 20], "area": 400})
        labels = C.OPENIMAGES_MLPERF.annotation_file(root, split)
        labels.parent.mkdir(parents=True)
        labels.write_text(json.dumps({"images": entries, "annotations": anns,
                                      "categories": [{"id": 0, "name": "Apple"}, {"id": 7, "name": "Boat"}]}))
    return root


def test_openimages_layout_is_read_and_its_problems_named(tmp_path, capsys):
    root = _openimages_tree(tmp_path / "oi")
    index = C.read_instances(root, "train", layout=C.OPENIMAGES_MLPERF)
    assert index.category_ids == [0, 7] and index.crowd == 1 and len(index.without_empty_images()) == 4
    assert index.files[0] == root / "train" / "data" / "0000000000000001.jpg"
    C.OPENIMAGES_MLPERF.annotation_file(root, "validation").unlink()
    assert main(["prepare", "retinanet", "--scale", "full", "--data", str(root)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "validation/labels/openimages-mlperf.json: missing" in err[0]


def test_mini_dataset_is_written_in_the_openimages_layout(tmp_path):
    root = tmp_path / "mini"
    C.generate_mini(root, C.OPENIMAGES_MLPERF, (4, 2), size=32, say=lambda s: None)
    assert sorted(p.name for p in (root / "validation" / "data").iterdir()) == ["000000000005.jpg", "000000000006.jpg"]
    val = C.read_instances(root, "validation", layout=C.OPENIMAGES_MLPERF)
    assert len(val) == 2 and all(len(b) >= 1 for b in val.boxes)


# -- end to end ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def retinanet_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("retinanet") / "run"
    assert main(["run", "retinanet", "--seed", "0", "--out", str(out), "--quiet"]) == 0
    return out


@pytest.mark.second_tier
def test_mini_reaches_target_and_log_passes_ruleset_2(retinanet_run):
    result = json.loads((retinanet_run / "result.json").read_text())
    assert result["status"] == "success" and result["final_metric"] >= MINI.target
    batch = MINI.global_batch_size
    assert result["train_samples"] == 2000 - 2000 % batch and result["eval_samples"] == 500
    verdict = check(retinanet_run / "mlperf_log.txt")  # chosen from the log's trainperf_workload record
    assert verdict.valid and verdict.ruleset == "2.0.0" and verdict.benchmark == "ssd", verdict.output
    records = read_log(retinanet_run / "mlperf_log.txt")
    assert {r["value"] for r in records if r["key"] == "opt_name"} == {"adam"}
    assert len([r for r in records if r["key"] == "weights_initialization"]) > 20


@pytest.mark.second_tier
def test_scoring_picks_ruleset_2_for_retinanet_logs(retinanet_run, tmp_path):
    from trainperf.results.scoring import score_folder

    folder = tmp_path / "results" / "cpu" / "ssd"
    folder.mkdir(parents=True)
    (folder / "result_0.txt").write_text((retinanet_run / "mlperf_log.txt").read_text())
    scored = score_folder(folder)
    assert scored.ruleset == "2.0.0" and scored.benchmark == "ssd" and scored.runs[0].converged


@pytest.mark.slow
def test_full_path_on_a_tiny_openimages_tree(tmp_path, capsys):
    """The reference RetinaNet (ResNeXt50-32x4d FPN, 264 classes; images resized to 128 to stay quick)
    on an OpenImages-layout tree with a group box and an image without boxes: prepare, one epoch, one
    evaluation; the closed rules check everything but the quality."""
    root = _openimages_tree(tmp_path / "oi")
    assert main(["prepare", "retinanet", "--scale", "full", "--data", str(root)]) == 0
    out = tmp_path / "run"
    code = main(["run", "retinanet", "--scale", "full", "--data", str(root), "--out", str(out), "--quiet",
                 "--set", "global_batch_size=2", "--set", "max_epochs=1", "--set", "num_workers=0",
                 "--set", "eval_batch_size=2", "--set", "image_size=128"])
    assert code == 1
    assert "note: no --set backbone_weights=PATH" in capsys.readouterr().out
    result = json.loads((out / "result.json").read_text())
    assert result["abort_reason"].startswith("target box_ap") and result["train_samples"] == 4
    assert result["eval_samples"] == 5 and len(result["evaluations"]) == 1
    closed = check(out / "mlperf_log.txt")
    assert closed.ruleset == "2.0.0" and not closed.valid
    failed = [line for line in closed.output.splitlines() if "Failed" in line or "ERROR" in line]
    assert failed and all("eval_accuracy" in line for line in failed if "Failed checks" in line), closed.output
    assert "weights_initialization" not in closed.output and "initialized_tensors" not in closed.output


def _short_run(tmp_path: Path, name: str, *extra: str) -> dict:
    """Three epochs of the mini recipe and one evaluation (an unreachable target: fixed work)."""
    out = tmp_path / name
    assert main(["run", "retinanet", "--seed", "3", "--out", str(out), "--quiet", "--set", "max_epochs=3",
                 "--set", "target=2", "--set", "eval_first=3", *extra]) == 1
    return json.loads((out / "result.json").read_text())


@pytest.mark.second_tier
def test_two_processes_reach_the_same_ap_as_one_with_one_log(tmp_path):
    one = _short_run(tmp_path, "one")
    two = _short_run(tmp_path, "two", "--nproc", "2", "--async-eval")
    assert two["environment"]["world_size"] == 2 and two["eval_samples"] == one["eval_samples"] == 500
    assert one["evaluations"][0]["value"] > 0.02  # it learnt something: the comparison means something
    # BatchNorm sees half batches and flips differ: the same AP within noise.
    assert abs(two["evaluations"][0]["value"] - one["evaluations"][0]["value"]) < 0.05
    records = read_log(tmp_path / "two" / "mlperf_log.txt")
    assert [r["key"] for r in records].count("run_start") == 1
