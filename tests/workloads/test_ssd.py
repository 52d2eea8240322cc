"""SSD: default boxes and matching against hand-computed values, the loss's hard-negative mining, COCO
AP of perfect and empty detectors (two backends), the COCO reader's checks, the mini run end to end,
the full path on a tiny COCO tree, and the closed rules of the full recipes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from tests.conftest import mini_data, read_log
from trainperf.cli import main
from trainperf.errors import TrainperfError
from trainperf.results.compliance import check
from trainperf.workloads.common.coco import data as C
from trainperf.workloads.common.coco import scoring
from trainperf.workloads.ssd import FULL_RECIPES, MINI, lr_factor
from trainperf.workloads.ssd import model as M


# -- default boxes, coding, matching ------------------------------------------------------------
def test_ssd300_default_boxes_by_hand():
    boxes = M.default_boxes(M.SSD300_BOXES)
    assert boxes.shape == (8732, 4)
    assert M.SSD300_BOXES.boxes_per_location == (4, 6, 6, 6, 4, 4)
    # Map 0 (38x38, step 8: fk = 37.5): first shape s1 = 21/300 at the first cell's centre 0.5/37.5.
    torch.testing.assert_close(boxes[0], torch.tensor([0.5 / 37.5, 0.5 / 37.5, 0.07, 0.07]))
    # Second shape: sqrt(21 * 45) / 300, starting at index 38 * 38.
    s2 = math.sqrt(21 * 45) / 300
    torch.testing.assert_close(boxes[38 * 38], torch.tensor([0.5 / 37.5, 0.5 / 37.5, s2, s2]))
    # Aspect ratio 2: (s1 sqrt 2, s1 / sqrt 2) then its transpose.
    torch.testing.assert_close(boxes[2 * 38 * 38, 2:], torch.tensor([0.07 * math.sqrt(2), 0.07 / math.sqrt(2)]))
    torch.testing.assert_close(boxes[3 * 38 * 38, 2:], torch.tensor([0.07 / math.sqrt(2), 0.07 * math.sqrt(2)]))
    # The last map (1x1): centred, sizes 261/300 and sqrt(261 * 315)/300, the elongated ones clamped to 1.
    last = boxes[-4:]
    assert torch.allclose(last[:, :2], torch.full((4, 2), 0.5))
    torch.testing.assert_close(last[:2, 2], torch.tensor([0.87, math.sqrt(261 * 315) / 300]))
    assert last[2, 2] == 1.0 and last[3, 3] == 1.0


def test_box_coding_round_trip_and_matching():
    coder = M.BoxCoder(M.SSD300_BOXES)
    gt = torch.tensor([[0.1, 0.1, 0.4, 0.5], [0.6, 0.55, 0.62, 0.58]])  # the second is tiny: IoU < 0.5 everywhere
    targets, labels = coder.match(gt, torch.tensor([3, 7]))
    assert (labels == 7).sum() == 1  # its best default box is still assigned to it
    assert (labels == 3).sum() > 1  # the first matches every default box above IoU 0.5
    encoded = coder.encode(targets.unsqueeze(0))
    decoded = coder.decode(encoded)[0]
    for label, box in ((3, gt[0]), (7, gt[1])):
        torch.testing.assert_close(decoded[labels == label], box.expand(int((labels == label).sum()), 4),
                                   rtol=1e-4, atol=1e-5)


def test_hard_negative_mining_keeps_three_negatives_per_positive():
    anchors, classes = 20, 4
    loc = torch.zeros(1, 4, anchors)
    conf = torch.zeros(1, classes, anchors)
    labels = torch.zeros(1, anchors, dtype=torch.long)
    labels[0, [2, 9]] = 1  # 2 positives -> the 6 hardest negatives count
    conf[0, 1, :] = torch.arange(anchors, dtype=torch.float)  # negatives get harder with their index
    targets = torch.zeros(1, 4, anchors)
    loss = M.ssd_loss(loc, conf, targets, labels)
    ce = torch.nn.functional.cross_entropy(conf, labels, reduction="none")[0]
    negatives = [i for i in range(anchors) if i not in (2, 9)]
    hardest = sorted(negatives, key=lambda i: -float(ce[i]))[:6]
    expected = (ce[[2, 9]].sum() + ce[hardest].sum()) / 2
    torch.testing.assert_close(loss, expected)
    # An image without positives contributes nothing.
    assert M.ssd_loss(loc, conf, targets, torch.zeros_like(labels)) == 0


def test_batched_matching_equals_per_image():
    coder = M.BoxCoder(M.SSD300_BOXES)
    gen = torch.Generator().manual_seed(0)
    boxes, labels = [], []
    for n in (3, 0, 6, 1):
        xy = torch.rand(n, 2, 2, generator=gen)
        boxes.append(torch.cat([xy.min(1).values, xy.max(1).values], 1))
        labels.append(torch.randint(1, 81, (n,), generator=gen))
    # Two identical boxes claim the same best default box: the later one wins it (label 7, once), as in
    # the per-image matching; their other matches go to the first (the IoU's argmax).
    boxes.append(torch.tensor([[0.2, 0.2, 0.5, 0.6], [0.2, 0.2, 0.5, 0.6], [0.6, 0.1, 0.9, 0.3]]))
    labels.append(torch.tensor([5, 7, 9]))
    batched, batched_labels = coder.match_batch(boxes, labels)
    assert int((batched_labels[4] == 7).sum()) == 1 and int((batched_labels[4] == 5).sum()) > 1
    for i in range(5):
        one, one_labels = coder.match(boxes[i], labels[i])
        assert torch.equal(one_labels, batched_labels[i])
        torch.testing.assert_close(one, batched[i])


def test_postprocess_keeps_confident_boxes_after_class_wise_nms():
    coder = M.BoxCoder(M.SSD300_BOXES)
    conf = torch.full((1, 3, 8732), -10.0)
    conf[0, 0] = 10.0  # background everywhere ...
    conf[0, 2, 100], conf[0, 0, 100] = 10.0, -10.0  # ... but a class-2 box at default box 100
    conf[0, 1, 101], conf[0, 0, 101] = 10.0, -10.0  # and a class-1 box at its neighbour
    boxes, scores, labels = M.postprocess(coder, torch.zeros(1, 4, 8732), conf)[0]
    assert sorted(labels.tolist()) == [1, 2] and bool((scores > 0.99).all())
    torch.testing.assert_close(boxes[labels == 2][0], coder.dboxes_xyxy[100].clamp(0, 1))


# -- COCO AP -----------------------------------------------------------------------------------------
def _gt_rows(index: C.CocoIndex) -> list[np.ndarray]:
    rows = []
    for i, (boxes, labels) in enumerate(zip(index.boxes, index.labels, strict=True)):
        cats = np.array(index.category_ids)[labels - 1]
        rows.append(scoring.detection_rows(index.image_ids[i], boxes, np.ones(len(labels)), cats))
    return rows


@pytest.mark.parametrize("backend", scoring.BACKENDS)
def test_ap_of_a_perfect_and_an_empty_detector(backend):
    val = C.read_instances(mini_data("ssd"), "val2017")
    metric = scoring.metric(val.annotation_file, val.image_ids, backend)
    assert metric({"detections": _gt_rows(val)}) == pytest.approx(1.0)
    assert metric({"detections": []}) == 0.0


def test_faster_coco_eval_gives_pycocotools_ap():
    """faster-coco-eval is offered only because it agrees (to 1e-4) on noisy, partly wrong detections."""
    val = C.read_instances(mini_data("ssd"), "val2017")
    rng = np.random.default_rng(0)
    rows = []
    for row in np.concatenate(_gt_rows(val)):
        x, y, w, h = (v + rng.normal(0, 2) for v in row[1:5])
        rows.append((row[0], x, y, w, h, float(rng.uniform(0.2, 1)), row[6]))
        rows.append((row[0], 3.0, 3.0, 20.0, 20.0, 0.3, val.category_ids[int(rng.integers(0, 4))]))
    values = [scoring.metric(val.annotation_file, val.image_ids, b)({"detections": rows}) for b in scoring.BACKENDS]
    assert 0.2 < values[0] < 0.9 and values[1] == pytest.approx(values[0], abs=1e-4)


# -- the COCO reader's checks ---------------------------------------------------------------------
def _coco_tree(root: Path, images: int = 5, crowd: bool = True) -> Path:
    """A tiny COCO tree: image 1..n of 40x30 (the last has no annotation), category ids 2 and 5."""
    for split in ("train2017", "val2017"):
        (root / split).mkdir(parents=True)
        entries, anns = [], []
        for i in range(1, images + 1):
            Image.fromarray(np.full((30, 40, 3), 40 * i, np.uint8)).save(root / split / f"{i:012d}.jpg")
            entries.append({"id": i, "file_name": f"{i:012d}.jpg", "width": 40, "height": 30})
            if i < images:
                anns.append({"id": 10 * i, "image_id": i, "category_id": 2 if i % 2 else 5, "iscrowd": 0,
                             "bbox": [5, 5, 10 + i, 8], "area": 80.0})
        if crowd:
            anns.append({"id": 999, "image_id": 1, "category_id": 5, "iscrowd": 1, "bbox": [0, 0, 20, 20], "area": 400})
        (root / "annotations").mkdir(exist_ok=True)
        (root / "annotations" / f"instances_{split}.json").write_text(json.dumps({
            "images": entries, "annotations": anns, "categories": [{"id": 2, "name": "a"}, {"id": 5, "name": "b"}]}))
    return root


def _edit(root: Path, change) -> None:
    path = root / "annotations" / "instances_train2017.json"
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def test_reader_repairs_what_the_references_repair_and_counts_it(tmp_path):
    root = _coco_tree(tmp_path)
    _edit(root, lambda d: d["annotations"].extend([
        {"id": 500, "image_id": 2, "category_id": 2, "bbox": [30, 20, 50, 50]},  # runs off the image: clamped
        {"id": 501, "image_id": 2, "category_id": 2, "bbox": [10, 10, 0, 5]},  # zero width: skipped
        {"id": 502, "image_id": 3, "category_id": 5, "bbox": [45, 35, 5, 5]}]))  # outside: empty once clamped
    index = C.read_instances(root, "train2017")
    assert index.category_ids == [2, 5] and index.skipped == 2 and index.crowd == 1
    assert index.boxes[1].tolist()[-1] == [30.0, 20.0, 40.0, 30.0]
    assert len(index) == 5 and len(index.without_empty_images()) == 4  # the image without boxes


@pytest.mark.parametrize("change, message", [
    (lambda d: d["annotations"].append({"id": 77, "image_id": 1, "category_id": 3, "bbox": [1, 1, 2, 2]}),
     "annotation 77: unknown category_id 3"),
    (lambda d: d["annotations"].append({"id": 78, "image_id": 42, "category_id": 2, "bbox": [1, 1, 2, 2]}),
     "annotation 78: unknown image_id 42"),
    (lambda d: d["images"].append({"id": 9, "file_name": "gone.jpg", "width": 4, "height": 4}),
     "train2017/gone.jpg: missing (image id 9"),
    (lambda d: d["annotations"][0].update(bbox=[1, 2, 3]), "annotation 10: expected bbox [x, y, width, height]"),
    (lambda d: d.pop("categories"), "not a COCO instances file"),
])
def test_bad_annotations_are_one_line_naming_them(tmp_path, change, message):
    root = _coco_tree(tmp_path)
    _edit(root, change)
    with pytest.raises(TrainperfError, match=message.replace("[", r"\[").replace("(", r"\(")) as err:
        C.read_instances(root, "train2017")
    assert "\n" not in str(err.value)


def test_missing_annotations_and_corrupt_image(tmp_path, capsys):
    root = _coco_tree(tmp_path)
    (root / "annotations" / "instances_val2017.json").unlink()
    assert main(["prepare", "ssd", "--scale", "full", "--data", str(root)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "instances_val2017.json: missing" in err[0]
    (root / "train2017" / "000000000001.jpg").write_bytes(b"\xff\xd8 not a jpeg")
    with pytest.raises(TrainperfError, match="000000000001.jpg: cannot decode image"):
        C.decode(root / "train2017" / "000000000001.jpg")


# -- recipes ------------------------------------------------------------------------------------
def test_warmup_ramp_and_step_decay():
    recipe = FULL_RECIPES["rcp-1024"]
    f = lr_factor(recipe, 115)
    warmup = round(recipe.warmup_epochs * 115)
    assert warmup == 301 and f(0) == 0.0 and f(warmup // 2) == pytest.approx((warmup // 2) / warmup)
    assert f(warmup) == 1.0 and f(40 * 115) == pytest.approx(0.1) and f(50 * 115) == pytest.approx(0.01)
    mini = lr_factor(MINI, 62)
    assert mini(31) == pytest.approx(0.5)  # the warmup ramp, then a cosine over the whole run
    assert mini(62) == pytest.approx(0.5 * (1 + math.cos(math.pi / 12))) and mini(6 * 62) == pytest.approx(0.5)
    assert mini(12 * 62) == pytest.approx(0.0, abs=1e-12)


# -- end to end ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ssd_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ssd") / "run"
    assert main(["run", "ssd", "--seed", "0", "--out", str(out), "--quiet"]) == 0
    return out


@pytest.mark.second_tier
def test_mini_reaches_target_and_log_passes_checker(ssd_run):
    result = json.loads((ssd_run / "result.json").read_text())
    assert result["status"] == "success" and result["final_metric"] >= MINI.target
    assert result["train_samples"] == 2000 - 2000 % 32 and result["eval_samples"] == 500
    verdict = check(ssd_run / "mlperf_log.txt")
    assert verdict.valid and verdict.ruleset == "1.0.0", verdict.output


@pytest.mark.slow
def test_full_path_on_a_tiny_coco_tree(tmp_path, capsys):
    """The reference SSD300 (ResNet-34 trunk, 8,732 boxes, 81 classes) on a COCO-layout tree with a crowd
    box and an image without annotations: prepare, then one epoch and its evaluation."""
    root = _coco_tree(tmp_path / "coco")
    assert main(["prepare", "ssd", "--scale", "full", "--data", str(root)]) == 0
    out = tmp_path / "run"
    code = main(["run", "ssd", "--scale", "full", "--data", str(root), "--recipe", "reference-32", "--out", str(out),
                 "--quiet", "--set", "global_batch_size=2", "--set", "max_epochs=1", "--set", "eval_first=1",
                 "--set", "num_workers=0", "--set", "eval_batch_size=2", "--set", "crop_trials=50"])
    assert code == 1  # one epoch of a randomly initialised SSD does not reach 0.23
    assert "note: no --set backbone_weights=PATH" in capsys.readouterr().out
    result = json.loads((out / "result.json").read_text())
    assert result["abort_reason"].startswith("target box_ap") and result["train_samples"] == 4
    # The image without annotations is left out of evaluation too, as the reference's (4 of 5).
    assert result["eval_samples"] == 4 and len(result["evaluations"]) == 1
    records = read_log(out / "mlperf_log.txt")
    assert records[-1]["key"] == "run_stop"
    closed = check(out / "mlperf_log.txt")  # full scale logs the closed division: the target is checked
    assert not closed.valid and "Failed checks for eval_accuracy" in closed.output
    opened = tmp_path / "open.txt"
    opened.write_text((out / "mlperf_log.txt").read_text().replace('"value": "closed"', '"value": "open"'))
    assert check(opened).valid


def _short_run(tmp_path: Path, name: str, *extra: str) -> dict:
    """Four epochs of the mini recipe and one evaluation (an unreachable target: fixed work)."""
    out = tmp_path / name
    assert main(["run", "ssd", "--seed", "3", "--out", str(out), "--quiet", "--set", "max_epochs=4",
                 "--set", "target=2", "--set", "eval_first=4", *extra]) == 1
    return json.loads((out / "result.json").read_text())


@pytest.mark.second_tier
def test_async_scoring_in_a_process_gives_the_synchronous_ap(tmp_path):
    sync = _short_run(tmp_path, "sync")
    background = _short_run(tmp_path, "async", "--async-eval")
    assert [e["value"] for e in background["evaluations"]] == [e["value"] for e in sync["evaluations"]]
    assert sync["evaluations"][0]["value"] > 0.05  # it learnt something: the comparison means something


@pytest.mark.second_tier
def test_two_processes_reach_the_same_ap_as_one_with_one_log(tmp_path):
    one = _short_run(tmp_path, "one")
    two = _short_run(tmp_path, "two", "--nproc", "2")
    assert two["environment"]["world_size"] == 2 and two["eval_samples"] == one["eval_samples"] == 500
    # BatchNorm sees half batches and augmentation draws differ: the same AP within noise.
    assert abs(two["evaluations"][0]["value"] - one["evaluations"][0]["value"]) < 0.06
    records = read_log(tmp_path / "two" / "mlperf_log.txt")
    assert [r["key"] for r in records].count("run_start") == 1


@pytest.mark.parametrize("empty", ["no images", "no annotations"])
def test_an_empty_evaluation_set_is_refused_by_prepare_and_run(tmp_path, capsys, empty):
    """val2017 with no image (or none annotated) passed every check: SSD then trained its whole budget,
    logging AP 0.0 on nothing. Refused in one line, by `prepare` and by `run`'s data check alike."""
    from trainperf import jobs, registry

    root = _coco_tree(tmp_path / "coco")
    path = root / "annotations" / "instances_val2017.json"
    data = json.loads(path.read_text())
    data["annotations"] = []
    if empty == "no images":
        data["images"] = []
    path.write_text(json.dumps(data))
    assert main(["prepare", "ssd", "--scale", "full", "--data", str(root)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "instances_val2017.json: the evaluation set is empty (MLPerf's holds 4,952)" in err[0]
    assert jobs.data_problems(registry.get("ssd"), "full", root) == [err[0].removeprefix("trainperf: error: ")]


def test_the_logged_base_learning_rate_is_the_runs_as_the_reference_logs_it():
    """The reference logs opt_base_learning_rate after scaling by global_batch_size / 32 (0.08 at 1,024); the
    recipe's base_lr is per 32 images."""
    from trainperf.contract import RuntimeContext
    from trainperf.workloads.ssd import SSDWorkload

    workload = SSDWorkload()
    ctx = RuntimeContext(device=torch.device("meta"))
    assert workload.mlperf_hyperparameters(FULL_RECIPES["rcp-1024"], ctx)["opt_base_learning_rate"] == \
        pytest.approx(0.08)
    for recipe in FULL_RECIPES.values():
        logged = workload.mlperf_hyperparameters(recipe, ctx)["opt_base_learning_rate"]
        assert logged == pytest.approx(recipe.base_lr * recipe.global_batch_size / 32)


def test_evaluation_skips_images_without_boxes_as_the_reference(tmp_path):
    """SSD's reference drops val2017's images without a box (4,952 of 5,000 evaluated and logged); RetinaNet's
    and Mask R-CNN's evaluate every validation image."""
    import shutil

    from trainperf import registry
    from trainperf.contract import RuntimeContext

    root = tmp_path / "coco"
    shutil.copytree(mini_data("ssd"), root)
    annotations = root / "annotations" / "instances_val2017.json"
    instances = json.loads(annotations.read_text())
    emptied = instances["images"][0]["id"]
    instances["annotations"] = [a for a in instances["annotations"] if a["image_id"] != emptied]
    annotations.write_text(json.dumps(instances))
    workload = registry.get("ssd")
    data = workload.load_data(MINI, root, RuntimeContext.create("cpu"))
    assert data.eval_samples == len(instances["images"]) - 1
    assert workload.mlperf.full_eval_samples == 4_952
    assert not registry.get("retinanet").eval_without_empty_images
    assert not registry.get("maskrcnn").eval_without_empty_images


def test_the_crop_needs_every_box_over_the_threshold_as_the_reference():
    """The reference's SSDCropping accepts a crop only when every box's IoU with it exceeds the drawn
    threshold; torchvision's RandomIoUCrop when some box centred in it reaches it. Two boxes in opposite
    corners: no crop has IoU > 0.3 with both, so with the choices (keep, 0.3) the image is always kept;
    torchvision's crops it."""
    from torchvision import tv_tensors
    from torchvision.transforms import v2

    from trainperf.workloads.ssd.transforms import SSDCrop

    image = tv_tensors.Image(torch.zeros(3, 100, 100))
    boxes = tv_tensors.BoundingBoxes(torch.tensor([[0.0, 0, 40, 40], [60, 60, 100, 100]]), format="XYXY",
                                     canvas_size=(100, 100))
    ours = SSDCrop(trials=50)
    ours.choices = (None, 0.3)
    theirs = v2.RandomIoUCrop(trials=50, sampler_options=[0.3, 2.0])
    torch.manual_seed(0)
    assert all(ours(image, boxes)[0].shape[-2:] == (100, 100) for _ in range(100))
    assert any(theirs(image, boxes)[0].shape[-2:] != (100, 100) for _ in range(100))
    # Any-crop draws: sides of 0.3..1 of the image's, their ratio within [0.5, 2]; the boxes kept are those
    # centred in the crop (the other marked degenerate for SanitizeBoundingBoxes).
    ours.choices = (-float("inf"),)
    for _ in range(100):
        cropped, kept = ours(tv_tensors.Image(torch.zeros(3, 100, 200)),
                             tv_tensors.BoundingBoxes(torch.tensor([[90.0, 40, 110, 60]]), format="XYXY",
                                                      canvas_size=(100, 200)))
        h, w = cropped.shape[-2:]
        assert 29 <= h <= 100 and 59 <= w <= 200 and 0.5 <= (w / 200) / (h / 100) <= 2.05
        assert (kept[0, 2:] > kept[0, :2]).all()
