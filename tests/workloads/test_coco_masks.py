"""COCO instance masks (the Mask R-CNN foundation shared with the detection workloads): checked
segmentations in both of COCO's forms, rasterisation equal to pycocotools', RLE encoding, the
compressed-RLE run check, and box + mask AP of perfect, box-filled and empty predictions."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from pycocotools import mask as maskutils

from tests.conftest import mini_data
from trainperf.cli import main
from trainperf.errors import TrainperfError
from trainperf.workloads.common.coco import data as C
from trainperf.workloads.common.coco import masks as K
from trainperf.workloads.common.coco import scoring

PATH = Path("instances.json")


def test_compressed_rle_run_totals_match_pycocotools():
    rng = np.random.default_rng(0)
    for t in range(200):
        h, w = (int(v) for v in rng.integers(1, 50, 2))
        m = (rng.random((h, w)) < rng.random()).astype(np.uint8) * (t % 5 != 0)
        counts = maskutils.encode(np.asfortranarray(m[:, :, None]))[0]["counts"].decode()
        assert K._rle_string_total(counts) == h * w
    assert K._rle_string_total("0a") is None  # an unfinished run
    assert K._rle_string_total("~~~") is None  # characters outside the alphabet


def test_polygons_rasterize_as_pycocotools_and_degenerate_ones_are_dropped():
    square = [2.0, 2.0, 8.0, 2.0, 8.0, 8.0, 2.0, 8.0]
    outside = [-5.0, -5.0, 30.0, -5.0, 30.0, 4.0]  # mostly beyond a 12 x 10 image: clipped
    got = K.check_segmentation([square, [1.0, 1.0, 3.0, 3.0], outside], 7, 10, 12, PATH)
    assert got == [square, outside]  # the 2-point polygon is gone (pycocotools would read it as a box)
    masks = K.rasterize([got], 10, 12)
    expected = maskutils.decode(maskutils.merge(maskutils.frPyObjects([square, outside], 10, 12)))
    assert masks.shape == (1, 10, 12) and np.array_equal(masks[0], expected)
    assert K.check_segmentation([[0.0, 0.0, 1.0, 1.0]], 7, 10, 12, PATH) is None


def test_rle_in_both_forms_reads_and_round_trips():
    rng = np.random.default_rng(1)
    m = (rng.random((9, 11)) < 0.4).astype(np.uint8)
    compressed = K.encode(m[None])[0]
    assert compressed["size"] == [9, 11] and isinstance(compressed["counts"], str)
    # The uncompressed form COCO uses for crowds: alternating runs, column-major, starting with zeros.
    flat = m.flatten(order="F")
    changes = np.flatnonzero(np.diff(flat)) + 1
    runs = np.diff(np.concatenate([[0], changes, [flat.size]])).tolist()
    if flat[0]:
        runs = [0] + runs
    uncompressed = {"size": [9, 11], "counts": runs}
    for seg in (compressed, uncompressed):
        checked = K.check_segmentation(seg, 3, 9, 11, PATH)
        assert np.array_equal(K.rasterize([checked], 9, 11)[0], m)


@pytest.mark.parametrize("segmentation, message", [
    ([[1.0, 2.0, 3.0]], "polygon of 3 numbers"),
    ([[1.0, "a", 3.0, 4.0, 5.0, 6.0]], "expected a list of numbers"),
    ([[1.0, float("nan"), 3.0, 4.0, 5.0, 6.0]], "expected a list of numbers"),
    ({"size": [5, 5], "counts": [10]}, "is not the image's"),
    ({"size": [10, 12], "counts": [100]}, "cover 100 pixels, the image has 120"),
    ({"size": [10, 12], "counts": [-1, 121]}, "non-negative integers"),
    ({"size": [10, 12], "counts": "0a"}, "not a compressed COCO RLE string"),
    ({"size": [10, 12], "counts": "52"}, "cover 7 pixels"),
    ("polygon", "expected polygons or RLE"),
])
def test_bad_segmentations_are_one_line_naming_the_annotation(segmentation, message):
    with pytest.raises(TrainperfError) as err:
        K.check_segmentation(segmentation, 42, 10, 12, PATH)
    text = str(err.value)
    assert "annotation 42" in text and message in text and "\n" not in text


def _tree(root: Path, annotations: list[dict]) -> Path:
    (root / "train2017").mkdir(parents=True)
    (root / "annotations").mkdir()
    Image.new("RGB", (12, 10)).save(root / "train2017" / "a.jpg")
    data = {"images": [{"id": 1, "file_name": "a.jpg", "width": 12, "height": 10}],
            "categories": [{"id": 3, "name": "c"}], "annotations": annotations}
    (root / "annotations" / "instances_train2017.json").write_text(json.dumps(data))
    return root


def test_the_reader_keeps_masks_beside_their_boxes_and_counts_the_dropped(tmp_path):
    good = {"id": 1, "image_id": 1, "category_id": 3, "bbox": [2, 2, 6, 6],
            "segmentation": [[2, 2, 8, 2, 8, 8, 2, 8]]}
    thin = {"id": 2, "image_id": 1, "category_id": 3, "bbox": [1, 1, 2, 2], "segmentation": [[1, 1, 3, 3]]}
    crowd = {"id": 3, "image_id": 1, "category_id": 3, "bbox": [0, 0, 4, 4], "iscrowd": 1,
             "segmentation": {"size": [10, 12], "counts": [0, 120]}}
    root = _tree(tmp_path, [good, thin, crowd])
    index = C.read_instances(root, "train2017", masks=True)
    assert index.no_mask == 1 and index.crowd == 1 and len(index.boxes[0]) == 1
    assert index.segmentations == [[good["segmentation"]]]
    assert index.without_empty_images().segmentations == index.segmentations
    assert C.read_instances(root, "train2017").segmentations is None  # boxes only: no mask is read


def test_a_bad_mask_is_one_line_through_the_cli(tmp_path, capsys):
    bad = {"id": 9, "image_id": 1, "category_id": 3, "bbox": [2, 2, 6, 6], "segmentation": [[2, 2, 8]]}
    root = _tree(tmp_path, [bad])
    with pytest.raises(TrainperfError) as err:
        C.read_instances(root, "train2017", masks=True)
    assert "annotation 9: polygon of 3 numbers" in str(err.value)
    no_segmentation = {k: v for k, v in bad.items() if k != "segmentation"}
    (root / "annotations" / "instances_train2017.json").write_text(json.dumps(
        {"images": [{"id": 1, "file_name": "a.jpg", "width": 12, "height": 10}],
         "categories": [{"id": 3, "name": "c"}], "annotations": [no_segmentation]}))
    with pytest.raises(TrainperfError, match="annotation 9: no segmentation"):
        C.read_instances(root, "train2017", masks=True)
    assert main(["list"]) == 0  # the CLI still imports with the masks module in place
    capsys.readouterr()


@pytest.mark.slow
@pytest.mark.parametrize("backend", scoring.BACKENDS)
def test_box_and_mask_ap_of_perfect_box_filled_and_empty_predictions(backend):
    val = C.read_instances(mini_data("ssd"), "val2017", masks=True)
    rows, perfect, filled = [], [], []
    for i, (boxes, labels) in enumerate(zip(val.boxes, val.labels, strict=True)):
        height, width = val.sizes[i]
        cats = np.array(val.category_ids)[labels - 1]
        rows.append(scoring.detection_rows(val.image_ids[i], boxes, np.ones(len(labels)), cats))
        perfect.append(K.encode(K.rasterize(val.segmentations[i], height, width)))
        box_masks = np.zeros((len(boxes), height, width), np.uint8)
        for k, (x0, y0, x1, y1) in enumerate(np.round(boxes).astype(int)):
            box_masks[k, y0:y1, x0:x1] = 1
        filled.append(K.encode(box_masks))
    metric = scoring.metric(val.annotation_file, val.image_ids, backend, masks=True)
    assert metric({"detections": rows, "masks": perfect}) == pytest.approx({"BBOX": 1.0, "SEGM": 1.0}, abs=1e-6)
    boxy = metric({"detections": rows, "masks": filled})
    assert boxy["BBOX"] == pytest.approx(1.0) and 0.0 < boxy["SEGM"] < 0.9  # discs, triangles, crosses
    assert metric({"detections": [], "masks": []}) == {"BBOX": 0.0, "SEGM": 0.0}
    with pytest.raises(ValueError, match="masks for"):
        metric({"detections": rows, "masks": []})


@pytest.mark.slow
@pytest.mark.parametrize("backend", scoring.BACKENDS)
def test_mask_probabilities_are_pasted_into_their_boxes_at_each_images_size(backend):
    """The form the training processes send: each detection's 28x28 probabilities. The ground truth
    cropped into its box as Mask R-CNN's training targets are (RoIAlign), then pasted back by the
    scoring process, scores far above box-filled masks; all-ones maps score near box-filled masks."""
    from torchvision.ops import roi_align

    val = C.read_instances(mini_data("ssd"), "val2017", masks=True)
    rows, crops, ones, filled = [], [], [], []
    for i, (boxes, labels) in enumerate(zip(val.boxes, val.labels, strict=True)):
        height, width = val.sizes[i]
        cats = np.array(val.category_ids)[labels - 1]
        rows.append(scoring.detection_rows(val.image_ids[i], boxes, np.ones(len(labels)), cats))
        gt = torch.from_numpy(K.rasterize(val.segmentations[i], height, width)).float()[:, None]
        rois = torch.cat([torch.arange(len(boxes), dtype=torch.float32)[:, None], torch.from_numpy(boxes).float()], 1)
        crops.append(roi_align(gt, rois, (28, 28), 1.0)[:, 0].numpy().astype(np.float16))
        ones.append(np.ones((len(boxes), 28, 28), np.float16))
        box_masks = np.zeros((len(boxes), height, width), np.uint8)
        for k, (x0, y0, x1, y1) in enumerate(np.round(boxes).astype(int)):
            box_masks[k, y0:y1, x0:x1] = 1
        filled.append(K.encode(box_masks))
    metric = scoring.metric(val.annotation_file, val.image_ids, backend, masks=True)
    cropped = metric({"detections": rows, "masks": crops})
    boxy = metric({"detections": rows, "masks": filled})
    # Objects of 10-30 pixels through 28x28 maps: mean mask IoU 0.90, so AP@[.5:.95] ~0.80.
    assert cropped["BBOX"] == pytest.approx(1.0) and cropped["SEGM"] > max(0.75, boxy["SEGM"] + 0.2)
    # Boxes of 10-30 pixels: the paste's sub-pixel edges and the rounded box-filling differ by a pixel.
    assert metric({"detections": rows, "masks": ones})["SEGM"] == pytest.approx(boxy["SEGM"], abs=0.15)


@pytest.mark.parametrize("segmentation, message", [
    ({"size": [12, 10], "counts": [0, 120]}, "RLE size [12, 10] is not the image's [height, width] [10, 12]"),
    ({"size": [10, 12], "counts": [0, 120, 5]}, "RLE runs cover 125 pixels, the image has 120"),
    ({"size": [10, 12]}, "RLE counts None"),
])
def test_a_bad_crowd_rle_is_one_line_naming_the_annotation_and_the_file(tmp_path, segmentation, message):
    """Crowd annotations (iscrowd 1, RLE) are checked like the others: COCO AP ignores detections on
    them, so a wrong one silently changes the score."""
    crowd = {"id": 77, "image_id": 1, "category_id": 3, "bbox": [0, 0, 4, 4], "iscrowd": 1,
             "segmentation": segmentation}
    root = _tree(tmp_path, [crowd])
    with pytest.raises(TrainperfError) as err:
        C.read_instances(root, "train2017", masks=True)
    text = str(err.value)
    assert "instances_train2017.json: annotation 77: " in text and message in text and "\n" not in text


def test_an_evaluations_detections_reach_the_host_in_one_transfer_per_field():
    """The detectors keep each image's detections on the device until the evaluation ends (DeviceDetections):
    one .cpu() per field for the whole evaluation, each image's rows given back in order, empty ones too."""
    import torch

    from trainperf.workloads.common.coco.loading import DeviceDetections

    class Counted(torch.Tensor):
        moves = 0

        def cpu(self, *args, **kwargs):
            Counted.moves += 1
            return super().cpu(*args, **kwargs)

    kept = DeviceDetections()
    counts = {7: 3, 2: 0, 5: 2}
    for position, n in counts.items():
        kept.add(position, boxes=torch.arange(4.0 * n).reshape(n, 4).as_subclass(Counted),
                 scores=torch.full((n,), float(position)).as_subclass(Counted),
                 labels=torch.full((n,), position).as_subclass(Counted))
    found = list(kept.on_host())
    assert Counted.moves == 3
    assert [p for p, _ in found] == [7, 2, 5]
    for (position, fields), n in zip(found, counts.values(), strict=True):
        assert fields["boxes"].shape == (n, 4) and (fields["scores"] == position).all()
        assert fields["labels"].tolist() == [position] * n
    assert found[2][1]["boxes"].tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
