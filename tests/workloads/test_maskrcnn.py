"""Mask R-CNN: the reference configuration of torchvision's blocks, the full recipes against the closed
rules and the RCP file, the LR policy and bias groups, the non-overlapping mini with its masks, the
evaluation's RLE-encoded detections, and the two-metric target end to end."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import mini_data, read_log, write_minimal_closed_log
from trainperf.contract import RuntimeContext
from trainperf.errors import TrainperfError
from trainperf.results.compliance import check
from trainperf.workloads.common.coco import data as C
from trainperf.workloads.common.coco import masks as K
from trainperf.workloads.maskrcnn import DATA, FULL_RECIPES, MINI, MaskRCNNWorkload, lr_factor, param_groups
from trainperf.workloads.maskrcnn import model as M
from trainperf.workloads.maskrcnn import syncfree as S


@pytest.fixture(scope="module")
def reference() -> torch.nn.Module:
    return M.maskrcnn_resnet50_fpn(81)


def test_the_reference_configuration(reference):
    rpn, heads = reference.rpn, reference.roi_heads
    assert rpn._pre_nms_top_n == {"training": 2000, "testing": 1000}
    assert rpn._post_nms_top_n == {"training": 1000, "testing": 1000} and rpn.nms_thresh == 0.7
    assert (rpn.proposal_matcher.high_threshold, rpn.proposal_matcher.low_threshold) == (0.7, 0.3)
    assert rpn.fg_bg_sampler.batch_size_per_image == 256 and rpn.fg_bg_sampler.positive_fraction == 0.5
    assert rpn.anchor_generator.sizes == ((32,), (64,), (128,), (256,), (512,))
    assert heads.fg_bg_sampler.batch_size_per_image == 512 and heads.fg_bg_sampler.positive_fraction == 0.25
    assert heads.box_coder.weights == (10.0, 10.0, 5.0, 5.0)
    assert (heads.score_thresh, heads.nms_thresh, heads.detections_per_img) == (0.05, 0.5, 100)
    assert heads.box_roi_pool.output_size == (7, 7) and heads.mask_roi_pool.output_size == (14, 14)
    assert heads.box_roi_pool.sampling_ratio == 2 and heads.mask_roi_pool.sampling_ratio == 2
    transform = reference.transform
    assert (transform.min_size, transform.max_size, transform.size_divisible) == ((800,), 1333, 32)
    assert transform.image_mean == list(M.BGR255_MEAN) and transform.image_std == [1.0, 1.0, 1.0]
    # FrozenBN everywhere in the body, stem and res2 frozen, res3-5 trained.
    body = reference.backbone.body
    assert not any(p.requires_grad for n, p in body.named_parameters() if n.startswith(("conv1", "layer1")))
    assert all(p.requires_grad for n, p in body.named_parameters() if n.startswith(("layer2", "layer3", "layer4")))
    assert sum(p.numel() for p in reference.parameters()) == 44_347_573
    # The MSRA body strides in the 1x1 convolution; the box head starts as the reference's.
    assert body.layer2[0].conv1.stride == (2, 2) and body.layer2[0].conv2.stride == (1, 1)
    assert body.layer1[0].conv1.stride == (1, 1)
    predictor = heads.box_predictor
    assert float(predictor.bbox_pred.weight.detach().std()) == pytest.approx(0.001, rel=0.05)
    assert float(predictor.cls_score.weight.detach().std()) == pytest.approx(0.01, rel=0.05)
    assert not predictor.cls_score.bias.any() and not heads.box_head.fc6.bias.any()
    with torch.no_grad():
        features = reference.backbone.body(torch.zeros(1, 3, 64, 64))
    assert [tuple(f.shape[-2:]) for f in features.values()] == [(16, 16), (8, 8), (4, 4), (2, 2)]


def test_logged_tensor_names_are_the_closed_rules_list(reference):
    import re

    import mlperf_logging

    rules = Path(mlperf_logging.__file__).parent / "compliance_checker" / "training_1.1.0" / "closed_maskrcnn.yaml"
    listed = re.findall(r'"((?:FPN|RPNHead|ROI)_[A-Za-z0-9_]+)"', rules.read_text())
    assert len(listed) == 21 and sorted(M.reference_tensor_names(reference)) == sorted(listed)


@pytest.mark.parametrize("name", sorted(FULL_RECIPES))
def test_the_closed_rules_refuse_a_short_mask_ap_and_a_learning_rate_off_the_rule(tmp_path, name, reference):
    """Every full recipe passing the closed rules is the conformance test's; these are Mask R-CNN's own."""
    recipe = FULL_RECIPES[name]
    workload = MaskRCNNWorkload()
    world = max(1, recipe.global_batch_size // 6) if recipe.global_batch_size > 16 else 8
    ctx = RuntimeContext(device=torch.device("cpu"), world_size=world)
    hyper = workload.mlperf_hyperparameters(recipe, ctx)
    ruleset = recipe.ruleset or workload.mlperf.ruleset
    tensors = M.reference_tensor_names(reference)  # 2.0.0 asks for them

    def verdict(hyperparameters: dict, accuracy: dict, rules: str = ruleset) -> bool:
        log = tmp_path / "closed.txt"
        write_minimal_closed_log(log, "maskrcnn", recipe.global_batch_size, hyperparameters, accuracy, 14,
                                 initialized=tensors)
        result = check(log, rules)
        return result.valid

    assert not verdict(hyper, {"BBOX": 0.378, "SEGM": 0.33})  # mask AP short of 0.339: not converged
    assert not verdict({**hyper, "opt_base_learning_rate": 0.05}, {"BBOX": 0.378, "SEGM": 0.342})  # not 0.02*K
    if recipe.ruleset:  # the 2.0.0 point: LR 0.02/2, which the workload's own 1.0.0 rules refuse
        assert recipe.global_batch_size == 8 and not verdict(hyper, {"BBOX": 0.378, "SEGM": 0.342}, "1.0.0")


@pytest.mark.parametrize("ruleset", ["1.0.0", "2.0.0"])
def test_full_recipes_are_the_rcp_points(ruleset):
    import mlperf_logging

    path = Path(mlperf_logging.__file__).parent / "rcp_checker" / f"training_{ruleset}" / "rcps_maskrcnn.json"
    for point in json.loads(path.read_text()).values():
        recipe = FULL_RECIPES[f"rcp-{point['BS']}"]
        assert recipe.ruleset in ("", ruleset)
        hyper = point["Hyperparams"]
        assert recipe.base_lr == hyper["opt_base_learning_rate"]
        assert list(recipe.decay_steps) == hyper["opt_learning_decay_steps"]
        assert recipe.warmup_steps == hyper["opt_learning_rate_warmup_steps"]
        assert recipe.warmup_factor == hyper["opt_learning_rate_warmup_factor"]
        if "min_image_size" in hyper:
            assert (recipe.min_image_size, recipe.max_image_size) == (hyper["min_image_size"], hyper["max_image_size"])
        # 6 images per accelerator in the RCP runs (BS 8: 1): 1000 proposals per image, as trainperf keeps them.
        per_chip = {8: 1}.get(point["BS"], 6)
        if point["BS"] % per_chip == 0:
            ctx = RuntimeContext(device=torch.device("cpu"), world_size=point["BS"] // per_chip)
            logged = MaskRCNNWorkload().mlperf_hyperparameters(recipe, ctx)["num_image_candidates"]
            assert logged == hyper["num_image_candidates"]


def test_a_recipe_names_its_ruleset_in_the_log_and_check_and_score_use_it(tmp_path):
    """rcp-8's log records ruleset 2.0.0 (`trainperf_ruleset`); `check` and `score` then judge it by
    2.0.0's rules and RCPs, not the workload's 1.0.0."""
    from trainperf.results.compliance import read_header
    from trainperf.results.keys import ruleset_for
    from trainperf.rulesets import RULESET_KEY

    assert ruleset_for("maskrcnn") == "1.0.0" and ruleset_for("maskrcnn", "maskrcnn", "2.0.0") == "2.0.0"
    assert ruleset_for("ssd", "retinanet") == "2.0.0"
    with pytest.raises(TrainperfError, match="ruleset='two'"):
        dataclasses.replace(FULL_RECIPES["rcp-8"], ruleset="two").validate()
    recipe = FULL_RECIPES["rcp-8"]
    hyper = MaskRCNNWorkload().mlperf_hyperparameters(recipe, RuntimeContext(device=torch.device("cpu"), world_size=8))
    log = tmp_path / "result_0.txt"
    write_minimal_closed_log(log, "maskrcnn", 8, {RULESET_KEY: "2.0.0", **hyper}, {"BBOX": 0.378, "SEGM": 0.342}, 14,
                             initialized=M.reference_tensor_names(M.maskrcnn_resnet50_fpn(81)))
    assert read_header(log)[RULESET_KEY] == "2.0.0"
    result = check(log)
    assert result.ruleset == "2.0.0" and result.valid, result.output


@pytest.mark.slow
def test_backbone_weights_are_loaded_and_checked(tmp_path):
    from torchvision.models import resnet50

    from trainperf.contract import Assets

    weights = resnet50().state_dict()
    path = tmp_path / "r50.pt"
    torch.save(weights, path)
    recipe = FULL_RECIPES["rcp-48"]
    ctx = RuntimeContext(device=torch.device("cpu"))
    body = MaskRCNNWorkload().build(recipe, ctx, Assets({"backbone weights": path})).model.backbone.body
    torch.testing.assert_close(body.conv1.weight, weights["conv1.weight"])
    torch.testing.assert_close(body.layer4[2].bn3.running_var, weights["layer4.2.bn3.running_var"])
    weights["layer3.0.conv2.weight"] = torch.zeros(3, 3)
    torch.save(weights, path)
    with pytest.raises(TrainperfError, match=r"r50.pt: layer3.0.conv2.weight has shape \(3, 3\)"):
        MaskRCNNWorkload().build(recipe, ctx, Assets({"backbone weights": path}))


def _detectron_pickle(path: Path, state: dict[str, torch.Tensor]) -> None:
    """A torchvision resnet50 state dict written as Detectron's R-50.pkl: its blob names, each batch norm
    folded into a scale and a bias."""
    import pickle

    from trainperf.workloads.maskrcnn import weights as W

    names = {f"res{stage}_{block}_branch{branch}{bn}_{kind}" for stage in range(2, 6) for block in range(6)
             for branch in ("1", "2a", "2b", "2c") for bn, kinds in (("", "w"), ("_bn", "sb")) for kind in kinds}
    names |= {"conv1_w", "res_conv1_bn_s", "res_conv1_bn_b"}
    blobs = {}
    for blob in names:
        key = W._torchvision_name(blob)
        if key is None or key not in state:
            continue
        module = key.rsplit(".", 1)[0]
        if blob.endswith(("_bn_s", "_bn_b")) or blob.startswith("res_conv1_bn"):
            scale = state[f"{module}.weight"] / (state[f"{module}.running_var"] + 1e-5).sqrt()
            value = scale if blob.endswith("_s") else state[f"{module}.bias"] - state[f"{module}.running_mean"] * scale
        else:
            value = state[key]
        blobs[blob] = value.numpy()
    blobs["pred_w"] = np.zeros((1000, 2048), dtype=np.float32)  # the classifier: not part of the body
    path.write_bytes(pickle.dumps({"blobs": blobs}))


@pytest.mark.slow
def test_the_references_msra_weights_are_read_from_detectrons_pickle(tmp_path):
    """`backbone_weights=R-50.pkl`: Detectron's blobs under torchvision's names, batch norms folded (the body
    computes what the original did), strides in the 1x1 convolutions and BGR 0..255 input (MSRA's)."""
    from torchvision.models import resnet50

    from trainperf.contract import Assets

    torch.manual_seed(0)
    original = resnet50().eval()
    for module in original.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.running_mean.uniform_(-1, 1)
            module.running_var.uniform_(0.5, 2)
    path = tmp_path / "R-50.pkl"
    _detectron_pickle(path, original.state_dict())
    recipe = FULL_RECIPES["rcp-48"].with_overrides([f"backbone_weights={path}"])
    workload = MaskRCNNWorkload()
    assert workload.input_format(recipe) == "bgr255" and workload.notes(recipe, "full") == []
    body = workload.build(recipe, RuntimeContext(device=torch.device("cpu")),
                          Assets({"backbone weights": path})).model.backbone.body.eval()
    torch.testing.assert_close(body.conv1.weight, original.conv1.weight)
    x = torch.randn(2, 64, 8, 8)
    torch.testing.assert_close(body.bn1(x), original.bn1(x), rtol=1e-4, atol=1e-5)
    y = torch.randn(1, 1024, 2, 2)
    torch.testing.assert_close(body.layer3[0].downsample[1](y), original.layer3[0].downsample[1](y),
                               rtol=1e-4, atol=1e-5)
    assert body.layer2[0].conv1.stride == (2, 2) and body.layer2[0].conv2.stride == (1, 1)


@pytest.mark.slow
def test_torchvisions_weights_keep_their_own_input_and_strides(tmp_path):
    """A torchvision state dict: RGB normalised input and the stride in the 3x3 (v1.5), said before the run;
    an explicit input format against the weights is one line; msra under torchvision's names is allowed."""
    from torchvision.models import resnet50

    from trainperf.contract import Assets

    path = tmp_path / "r50.pt"
    torch.save(resnet50().state_dict(), path)
    recipe = FULL_RECIPES["rcp-48"].with_overrides([f"backbone_weights={path}"])
    workload = MaskRCNNWorkload()
    assert workload.input_format(recipe) == "rgb"
    assert "torchvision's convention" in workload.notes(recipe, "full")[0]
    body = workload.build(recipe, RuntimeContext(device=torch.device("cpu")),
                          Assets({"backbone weights": path})).model.backbone.body
    assert body.layer2[0].conv1.stride == (1, 1) and body.layer2[0].conv2.stride == (2, 2)
    with pytest.raises(TrainperfError, match=r"^--set input_format=bgr255: the backbone weights .*r50.pt follow "
                                             r"the torchvision convention, whose input is rgb"):
        FULL_RECIPES["rcp-48"].with_overrides([f"backbone_weights={path}", "input_format=bgr255"])
    msra = FULL_RECIPES["rcp-48"].with_overrides([f"backbone_weights={path}", "backbone_format=msra",
                                                  "input_format=bgr255"])
    assert workload.input_format(msra) == "bgr255" and workload.notes(msra, "full") == []
    assert workload.input_format(FULL_RECIPES["rcp-48"]) == "bgr255"  # no weights: the reference's


def test_lr_policy_is_the_references_warmup_multistep():
    recipe = FULL_RECIPES["reference"]
    f = lr_factor(recipe)
    assert f(0) == pytest.approx(1 / 3) and f(250) == pytest.approx(1 / 3 * 0.5 + 0.5) and f(500) == 1.0
    assert f(59_999) == 1.0 and f(60_000) == pytest.approx(0.1) and f(80_000) == pytest.approx(0.01)


def test_biases_get_twice_the_lr_and_no_weight_decay(reference):
    groups = param_groups(reference, FULL_RECIPES["reference"])
    assert groups[1]["lr"] == pytest.approx(0.04) and groups[1]["weight_decay"] == 0.0
    assert groups[0]["weight_decay"] == 1e-4
    assert sum(p.numel() for g in groups for p in g["params"]) == sum(
        p.numel() for p in reference.parameters() if p.requires_grad)


def test_the_mini_masks_are_the_visible_shapes():
    root = mini_data("maskrcnn")
    train, val = DATA.read(root)
    assert train.segmentations is not None and val.segmentations is not None
    for i in range(50):
        masks = K.rasterize(train.segmentations[i], *train.sizes[i])
        assert masks.sum(0).max() <= 1  # no two shapes share a pixel: every polygon is what is seen
        for box, mask in zip(train.boxes[i], masks, strict=True):
            ys, xs = np.nonzero(mask)
            assert abs(xs.min() - box[0]) <= 1.5 and abs(ys.max() + 1 - box[3]) <= 1.5
    assert not C.mini_ready(root, C.MINI_SIZE, C.MINI_COUNTS)  # not the overlapping detectors' data


def test_the_mini_model_trains_and_detects_with_masks():
    torch.manual_seed(0)
    model = M.mini_maskrcnn(5)
    images = torch.rand(2, 3, 64, 64)
    targets = [{"boxes": torch.tensor([[4.0, 4.0, 30.0, 30.0]]), "labels": torch.tensor([2]),
                "masks": torch.zeros(1, 64, 64, dtype=torch.uint8)} for _ in range(2)]
    targets[0]["masks"][0, 4:30, 4:30] = 1
    targets[1]["masks"][0, 10:20, 4:30] = 1
    losses = model(images, targets)
    assert set(losses) == {"loss_classifier", "loss_box_reg", "loss_mask", "loss_objectness", "loss_rpn_box_reg"}
    sum(losses.values()).backward()
    assert model.roi_heads.mask_predictor.mask_fcn_logits.weight.grad.abs().sum() > 0
    model.eval()
    with torch.no_grad():
        out = model(images)
    assert out[0]["masks"].shape[1:] == (1, 64, 64)


def test_masks_leave_the_model_unpasted_and_are_pasted_as_torchvision_would():
    """The training processes ship the head's MxM probabilities; `masks.paste` in the scoring process
    gives exactly the masks torchvision's own postprocessing would have pasted."""
    torch.manual_seed(0)
    model = M.mini_maskrcnn(5).eval()
    model.roi_heads.score_thresh = 0.0  # an untrained model: keep every detection
    images = torch.rand(2, 3, 64, 48)
    with torch.no_grad():
        pasted = model(list(images))
        unpasted = M.unpasted(model)(list(images))
    for whole, small in zip(pasted, unpasted, strict=True):
        assert len(small["boxes"]) > 0 and small["masks"].shape[1:] == (1, 14, 14)
        assert torch.equal(whole["boxes"], small["boxes"])
        binary = K.paste(small["masks"][:, 0].numpy(), small["boxes"].numpy(), 64, 48)
        assert np.array_equal(binary, (whole["masks"][:, 0] > 0.5).numpy())


def test_two_metrics_are_one_target():
    metric = MaskRCNNWorkload.metric
    assert metric.reached({"BBOX": 0.38, "SEGM": 0.34}, FULL_RECIPES["reference"].target)
    assert not metric.reached({"BBOX": 0.40, "SEGM": 0.30}, FULL_RECIPES["reference"].target)
    assert metric.logged({"BBOX": 0.38, "SEGM": 0.34}) == {"BBOX": 0.38, "SEGM": 0.34}
    with pytest.raises(TrainperfError, match="decay_steps must increase"):
        dataclasses.replace(MINI, decay_steps=(5, 2)).validate()


def _coco_tree_with_masks(root: Path, images: int = 4) -> Path:
    """A tiny COCO tree of 48x40 images with polygon masks (one a 2-point polygon: dropped), a crowd
    RLE, and an image without annotations."""
    from PIL import Image

    for split in ("train2017", "val2017"):
        (root / split).mkdir(parents=True)
        entries, anns = [], []
        for i in range(1, images + 1):
            pixels = np.full((40, 48, 3), 30, np.uint8)
            pixels[8:8 + 2 * i, 6:30] = 200
            Image.fromarray(pixels).save(root / split / f"{i:012d}.jpg")
            entries.append({"id": i, "file_name": f"{i:012d}.jpg", "width": 48, "height": 40})
            if i < images:
                y1 = 8 + 2 * i
                anns.append({"id": 10 * i, "image_id": i, "category_id": 3, "iscrowd": 0, "area": 24.0 * 2 * i,
                             "bbox": [6, 8, 24, 2 * i], "segmentation": [[6, 8, 30, 8, 30, y1, 6, y1]]})
        anns.append({"id": 98, "image_id": 1, "category_id": 3, "iscrowd": 0, "area": 1.0, "bbox": [1, 1, 2, 2],
                     "segmentation": [[1, 1, 3, 3]]})
        anns.append({"id": 99, "image_id": 2, "category_id": 3, "iscrowd": 1, "area": 1920.0, "bbox": [0, 0, 48, 40],
                     "segmentation": {"size": [40, 48], "counts": [0, 1920]}})
        (root / "annotations").mkdir(exist_ok=True)
        (root / "annotations" / f"instances_{split}.json").write_text(json.dumps(
            {"images": entries, "annotations": anns, "categories": [{"id": 3, "name": "bar"}]}))
    return root


@pytest.mark.slow
def test_full_path_on_a_tiny_coco_tree_with_masks(tmp_path, capsys):
    """The reference Mask R-CNN (R50-FPN, 81 classes, 800-pixel inputs) on a COCO tree with masks:
    prepare, one epoch, one evaluation of box and mask AP, a log whose eval_accuracy is the dict."""
    from trainperf.cli import main

    root = _coco_tree_with_masks(tmp_path / "coco")
    assert main(["prepare", "maskrcnn", "--scale", "full", "--data", str(root)]) == 0
    out = tmp_path / "run"
    code = main(["run", "maskrcnn", "--scale", "full", "--data", str(root), "--recipe", "reference", "--out", str(out),
                 "--quiet", "--set", "global_batch_size=2", "--set", "max_epochs=1", "--set", "num_workers=0",
                 "--set", "eval_batch_size=2", "--set", "min_image_size=128", "--set", "max_image_size=160"])
    assert code == 1
    assert "note: no --set backbone_weights=PATH" in capsys.readouterr().out
    result = json.loads((out / "result.json").read_text())
    assert result["train_samples"] == 2 and result["eval_samples"] == 4 and len(result["evaluations"]) == 1
    value = result["evaluations"][0]["value"]
    assert set(value) == {"BBOX", "SEGM"} and all(0.0 <= v <= 1.0 for v in value.values())
    records = read_log(out / "mlperf_log.txt")
    accuracy = [r for r in records if r["key"] == "eval_accuracy"]
    assert set(accuracy[0]["value"]) == {"BBOX", "SEGM"}
    opened = tmp_path / "open.txt"
    opened.write_text((out / "mlperf_log.txt").read_text().replace('"value": "closed"', '"value": "open"'))
    assert check(opened, "1.0.0").valid


@pytest.mark.second_tier
def test_two_processes_reach_both_targets_and_score_and_report_read_the_runs(tmp_path, capsys):
    """The mini on two gloo processes (each half of every batch and half of val) reaches both targets as
    one process does in the README's calibration; then `score`, `report` and `compare` read a results
    folder of such maskrcnn logs (the official summarizer's folder layout)."""
    import shutil

    from tests.conftest import Page
    from trainperf.cli import main

    mini_data("maskrcnn")
    out = tmp_path / "two"
    assert main(["run", "maskrcnn", "--seed", "0", "--nproc", "2", "--async-eval", "--out", str(out), "--quiet"]) == 0
    result = json.loads((out / "result.json").read_text())
    assert result["environment"]["world_size"] == 2 and result["eval_samples"] == 500
    final = result["evaluations"][-1]["value"]
    assert final["BBOX"] >= MINI.target[0] and final["SEGM"] >= MINI.target[1] and result["epochs_to_target"] <= 5
    records = read_log(out / "mlperf_log.txt")
    assert [r["key"] for r in records].count("run_start") == 1
    assert set([r for r in records if r["key"] == "eval_accuracy"][-1]["value"]) == {"BBOX", "SEGM"}
    assert check(out / "mlperf_log.txt", "1.0.0").valid
    folder = tmp_path / "results" / "cpu" / "maskrcnn"
    folder.mkdir(parents=True)
    for i in range(5):
        shutil.copy(out / "mlperf_log.txt", folder / f"result_{i}.txt")
    capsys.readouterr()
    assert main(["score", str(tmp_path / "results")]) == 0
    assert f"BBOX {final['BBOX']:.4f}, SEGM {final['SEGM']:.4f}" in capsys.readouterr().out
    html = tmp_path / "report.html"
    assert main(["report", str(tmp_path / "results"), "-o", str(html)]) == 0
    assert len(Page(html.read_text()).images) == 1  # the convergence figure, a curve per metric
    assert main(["compare", str(tmp_path / "results"), str(tmp_path / "results")]) == 0
    assert "maskrcnn" in capsys.readouterr().out


# -- the sync-free training pass (workloads/maskrcnn/syncfree.py) ------------------------------------------------
def _boxes(generator: torch.Generator, n: int, size: float, clusters: int = 0) -> torch.Tensor:
    """n random boxes in a size x size image; with clusters, jittered copies of a few (heavy overlaps)."""
    if clusters:
        centres = torch.rand(clusters, 2, generator=generator) * size * 0.7 + size * 0.15
        centre = centres[torch.randint(0, clusters, (n,), generator=generator)] + torch.randn(n, 2, generator=generator)
        side = 8 + torch.rand(n, 2, generator=generator) * 4
    else:
        centre = torch.rand(n, 2, generator=generator) * size
        side = 2 + torch.rand(n, 2, generator=generator) * size * 0.3
    return torch.cat([centre - side / 2, centre + side / 2], 1).clamp(0, size)


def test_fixed_nms_keeps_what_torchvisions_nms_keeps_and_never_an_overlapping_pair():
    from torchvision.ops import box_iou, nms

    generator = torch.Generator().manual_seed(0)
    for clusters in (0, 3, 20):
        boxes = _boxes(generator, 300, 100.0, clusters)
        scores = torch.rand(300, generator=generator)
        order = scores.argsort(descending=True)
        boxes, scores = boxes[order], scores[order]
        valid = torch.rand(300, generator=generator) > 0.1
        expected = torch.zeros(300, dtype=torch.bool)
        index = valid.nonzero()[:, 0]
        expected[index[nms(boxes[index], scores[index], 0.5)]] = True
        kept = S.fixed_nms(boxes[None], valid[None], 0.5, iterations=301)[0]
        assert torch.equal(kept, expected), clusters
        # Cut short, it keeps a subset of the answer and still no pair overlapping above the threshold.
        short = S.fixed_nms(boxes[None], valid[None], 0.5, iterations=1)[0]
        assert not (short & ~expected).any()
        iou = box_iou(boxes[short], boxes[short]).fill_diagonal_(0)
        assert (iou <= 0.5).all()
    # The default iterations are exact on the clustered case too (chains of the RPN's kind).
    boxes = _boxes(generator, 300, 100.0, 10)
    index = torch.arange(300)
    expected = torch.zeros(300, dtype=torch.bool)
    expected[nms(boxes, torch.linspace(1, 0, 300), 0.7)] = True
    assert torch.equal(S.fixed_nms(boxes[None], torch.ones(1, 300, dtype=torch.bool), 0.7)[0], expected)


def test_balanced_sampling_fills_fixed_slots_with_the_eligible_only():
    torch.manual_seed(0)
    labels = torch.full((3, 50), -1)
    labels[0, :30] = 1  # more positives than the quota
    labels[0, 30:40] = 0
    labels[1, :2] = 1  # few positives: negatives fill the rest
    labels[1, 2:45] = 0
    labels[2, :3] = 0  # nothing to sample but three negatives
    positive, negative, slots, taken = S.balanced_sample(labels, 16, 0.25)
    assert positive.sum(1).tolist() == [4, 2, 0] and negative.sum(1).tolist() == [10, 14, 3]
    assert (labels[positive] == 1).all() and (labels[negative] == 0).all()
    assert slots.shape == taken.shape == (3, 4) and taken.sum(1).tolist() == [4, 2, 0]
    assert torch.equal(positive.gather(1, slots) & taken, taken)
    # Uniform over the eligible: every positive of image 0 gets picked over a few draws.
    picked = torch.zeros(50, dtype=torch.bool)
    for _ in range(60):
        picked |= S.balanced_sample(labels, 16, 0.25)[0][0]
    assert picked[:30].all() and not picked[30:].any()


def test_pooling_every_level_equals_multiscale_roialign():
    from torchvision.ops import MultiScaleRoIAlign

    generator = torch.Generator().manual_seed(1)
    features = {str(i): torch.randn(2, 4, 64 // 2 ** (i + 2), 96 // 2 ** (i + 2), generator=generator)
                for i in range(4)}
    rois = torch.stack([_boxes(generator, 40, 64.0), _boxes(generator, 40, 64.0)])
    pooler = MultiScaleRoIAlign(["0", "1", "2", "3"], 7, sampling_ratio=2, canonical_scale=56, canonical_level=4)
    expected = pooler(features, list(rois), [(60, 90), (64, 96)])
    torch.testing.assert_close(S.pool_levels(pooler, features, rois, (64, 96)), expected)


def _targets(generator: torch.Generator, counts: list[int], size: int, classes: int) -> list[dict]:
    targets = []
    for n in counts:
        boxes = _boxes(generator, n, float(size)).round()
        boxes[:, 2:] = torch.maximum(boxes[:, 2:], boxes[:, :2] + 4).clamp(max=size)
        masks = torch.zeros(n, size, size, dtype=torch.uint8)
        for j, (x0, y0, x1, y1) in enumerate(boxes.int().tolist()):
            masks[j, y0:y1, x0:(x0 + x1) // 2 + 1] = 1
        targets.append({"boxes": boxes, "labels": torch.randint(1, classes, (n,), generator=generator),
                        "masks": masks})
    return targets


@pytest.mark.parametrize("counts", [[3, 5], [0, 2]])
def test_the_sync_free_losses_equal_torchvisions_when_sampling_takes_everything(counts):
    """With samplers whose quotas exceed the candidates (every positive and negative taken, so no random
    choice) and NMS run to its fixed point, the five losses and their gradients are torchvision's."""
    from torchvision.models.detection import MaskRCNN
    from torchvision.models.detection.roi_heads import RoIHeads
    from torchvision.models.detection.rpn import RegionProposalNetwork

    torch.manual_seed(0)
    model = M.mini_maskrcnn(5)
    model.rpn.fg_bg_sampler.batch_size_per_image = 100_000
    model.roi_heads.fg_bg_sampler.batch_size_per_image = 100_000
    model.rpn.nms_iterations = 1001
    generator = torch.Generator().manual_seed(2)
    images = torch.rand(2, 3, 64, 64, generator=generator)
    targets = _targets(generator, counts, 64, 5)

    def losses_and_grads(forward):
        model.zero_grad()
        losses = forward()
        sum(losses.values()).backward()
        return losses, [p.grad.clone() for p in model.parameters() if p.grad is not None]

    mine, my_grads = losses_and_grads(lambda: model(images, targets))
    model.rpn.__class__, model.roi_heads.__class__ = RegionProposalNetwork, RoIHeads
    theirs, their_grads = losses_and_grads(lambda: MaskRCNN.forward(model, images, targets))
    assert set(mine) == set(theirs)
    for name in theirs:
        torch.testing.assert_close(mine[name], theirs[name], rtol=1e-4, atol=1e-6, msg=name)
    assert len(my_grads) == len(their_grads)
    for a, b in zip(my_grads, their_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-5)


def test_static_shapes_give_the_same_losses_and_a_bucketed_batch():
    """--static-shapes: the boxes padded to their bucket (marked absent) change no loss; a full-size
    batch is padded to one of three sizes whatever its images' own."""
    from trainperf.contract import LengthBuckets

    torch.manual_seed(0)
    model = M.mini_maskrcnn(5)
    model.rpn.fg_bg_sampler.batch_size_per_image = 100_000
    model.roi_heads.fg_bg_sampler.batch_size_per_image = 100_000
    generator = torch.Generator().manual_seed(2)
    images = torch.rand(2, 3, 64, 64, generator=generator)
    targets = _targets(generator, [3, 5], 64, 5)
    eager = model(images, targets)
    tensors, padded = model.static_inputs(images, targets, LengthBuckets((8, 16)), M.image_buckets(64, 64))
    assert tensors.shape == (2, 3, 64, 64) and padded["boxes"].shape == (2, 8, 4)
    assert padded["masks"].shape == (2, 8, 64, 64) and padded["present"].sum().item() == 8
    static = model(tensors, padded)
    for name in eager:
        torch.testing.assert_close(static[name], eager[name], rtol=1e-5, atol=1e-6, msg=name)

    assert M.image_buckets(800, 1333) == [(800, 1344), (1344, 800), (1344, 1344)]
    full = M.mini_maskrcnn(5)
    full.transform.min_size, full.transform.max_size, full.transform.fixed_size = (96,), 160, None
    sizes = M.image_buckets(96, 160)
    for shapes, expected in [([(60, 100), (50, 100)], (96, 160)), ([(100, 60)], (160, 96)),
                             ([(100, 60), (60, 100)], (160, 160))]:
        batch = [torch.rand(3, h, w, generator=generator) for h, w in shapes]
        boxes = [{"boxes": torch.tensor([[1.0, 1.0, 20.0, 20.0]]), "labels": torch.tensor([1]),
                  "masks": torch.ones(1, h, w, dtype=torch.uint8)} for h, w in shapes]
        tensors, padded = full.static_inputs(batch, boxes, LengthBuckets((8,)), sizes)
        assert tuple(tensors.shape[-2:]) == expected and padded["masks"].shape[-2:] == expected
        losses = full(tensors, padded)
        assert all(torch.isfinite(v) for v in losses.values())


def test_static_shapes_warm_every_bucket():
    workload = MaskRCNNWorkload()
    recipe = dataclasses.replace(FULL_RECIPES["reference"], global_batch_size=2, min_image_size=64, max_image_size=96,
                                 static_shapes=True, bucket_boxes=(8, 16))
    ctx = RuntimeContext(device=torch.device("cpu"))
    batches = workload.synthetic_batches(recipe, ctx, None)
    assert len(batches) == 6  # 3 image sizes x 2 box counts
    assert workload.shape_buckets(recipe)["lengths"] == [8, 16] and workload.shape_buckets(recipe)["shapes"] == 6
