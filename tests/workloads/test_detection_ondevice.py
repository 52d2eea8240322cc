"""The detectors' input transform and box coder without host-device synchronisations (issue 62): the same
values as torchvision's, bit for bit, and the same losses and gradients for RetinaNet and Mask R-CNN (the mini
models and the reference ones, on same-size batches and on images of different sizes with masks)."""

from __future__ import annotations

import copy

import pytest
import torch
from torchvision.models.detection._utils import BoxCoder
from torchvision.models.detection.transform import GeneralizedRCNNTransform, resize_boxes

from trainperf.contract import Assets, RuntimeContext
from trainperf.workloads.common.coco import ondevice
from trainperf.workloads.maskrcnn import MaskRCNNWorkload
from trainperf.workloads.maskrcnn import model as maskrcnn_model
from trainperf.workloads.retinanet import RetinaNetWorkload
from trainperf.workloads.retinanet import model as retinanet_model

CPU = RuntimeContext.create("cpu")


def _torchvisions(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of `model` with torchvision's own transform and box coders (what trainperf ran before)."""
    theirs = copy.deepcopy(model)
    theirs.transform.__class__ = GeneralizedRCNNTransform
    for module in theirs.modules():
        if isinstance(getattr(module, "box_coder", None), ondevice.DeviceBoxCoder):
            module.box_coder.__class__ = BoxCoder
    return theirs


def test_box_ratios_as_python_numbers_scale_boxes_as_torchvisions_device_tensors():
    generator = torch.Generator().manual_seed(0)
    boxes = torch.rand(50, 4, generator=generator) * 1000
    for original, new in [((480, 640), (800, 1066)), ((333, 500), (800, 1201)), ((64, 64), (64, 64)),
                          ((427, 640), (800, 1199)), ((1, 7), (13, 3))]:
        assert torch.equal(ondevice.scaled_boxes(boxes, original, new), resize_boxes(boxes, original, new))


def test_the_box_coder_encodes_and_decodes_as_torchvisions():
    coder = BoxCoder((10.0, 10.0, 5.0, 5.0))
    generator = torch.Generator().manual_seed(1)
    corner = torch.rand(30, 2, generator=generator) * 100
    a = torch.cat([corner, corner + 1 + torch.rand(30, 2, generator=generator) * 50], 1)
    b = torch.cat([corner + 2, corner + 3 + torch.rand(30, 2, generator=generator) * 50], 1)
    expected = coder.encode_single(a, b)
    holder = torch.nn.Module()
    holder.transform, holder.box_coder = GeneralizedRCNNTransform(8, 8, [0.5] * 3, [0.2] * 3), coder
    ondevice.keep_on_device(holder)
    assert isinstance(coder, ondevice.DeviceBoxCoder)
    assert torch.equal(coder.encode_single(a, b), expected)
    assert torch.equal(coder.encode([a[:10]], [b[:10]])[0], expected[:10])  # torchvision's encode, per image
    deltas = torch.randn(30, 4, generator=generator) * 2
    assert torch.equal(coder.decode_single(deltas, a), BoxCoder.decode_single(coder, deltas, a))
    assert torch.equal(coder.decode(deltas[:, None], [a]), BoxCoder.decode(coder, deltas[:, None], [a]))


@pytest.mark.parametrize("same_size", [True, False])
def test_the_transform_gives_torchvisions_images_and_targets(same_size):
    generator = torch.Generator().manual_seed(2)
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    theirs = GeneralizedRCNNTransform(96, 160, mean, std)
    ours = copy.deepcopy(theirs)
    holder = torch.nn.Module()
    holder.transform = ours
    ondevice.keep_on_device(holder)
    assert "mean" not in ours.state_dict() and torch.equal(ours.mean, torch.tensor(mean))
    sizes = [(70, 90)] * 3 if same_size else [(70, 90), (120, 64), (33, 47)]
    images = [torch.rand(3, h, w, generator=generator) for h, w in sizes]
    targets = [{"boxes": torch.tensor([[1.0, 2.0, 30.5, 40.25], [5.0, 5.0, 20.0, 11.0]]),
                "masks": (torch.rand(2, h, w, generator=generator) > 0.5).to(torch.uint8),
                "labels": torch.tensor([1, 2])} for h, w in sizes]
    results = []
    for transform in (ours, theirs):
        torch.manual_seed(3)  # training draws a size (torchvision's torch_choice): the same draw in both
        results.append(transform(images, copy.deepcopy(targets)))
    (mine, mine_targets), (expected, expected_targets) = results
    assert torch.equal(mine.tensors, expected.tensors) and mine.image_sizes == expected.image_sizes
    for a, b in zip(mine_targets, expected_targets, strict=True):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _losses_and_gradients(model: torch.nn.Module, loss_fn, batch) -> list[torch.Tensor]:
    model.train()
    torch.manual_seed(0)
    loss = loss_fn(model, batch)
    params = [p for p in model.parameters() if p.requires_grad]
    return [loss.detach(), *torch.autograd.grad(loss, params)]


@pytest.mark.parametrize("workload", [RetinaNetWorkload(), MaskRCNNWorkload()], ids=lambda w: w.name)
# The reference models take tens of seconds each on 2 cores: the second tier's (the transform's unit tests above
# cover the images of different sizes and the masks in the gate).
@pytest.mark.parametrize("scale", ["mini", pytest.param("full", marks=pytest.mark.second_tier)])
def test_the_training_losses_and_gradients_are_torchvisions(workload, scale):
    if scale == "mini":
        recipe = workload.recipe("mini")
    else:
        small = (["image_size=128"] if workload.name == "retinanet" else ["min_image_size=96", "max_image_size=160"])
        recipe = workload.recipe("full").with_overrides(["global_batch_size=2", *small])
    torch.manual_seed(0)
    parts = workload.build(recipe, CPU, Assets({}))
    batch = workload.synthetic_batch(recipe, CPU, parts.model)
    if scale == "full":  # images of different sizes, as the full loaders give them (the second one taller)
        images, targets = list(batch[0].unbind(0)), copy.deepcopy(batch[1])
        images[1] = torch.nn.functional.pad(images[1], (0, 0, 0, 40))
        if "masks" in targets[1]:
            targets[1]["masks"] = torch.nn.functional.pad(targets[1]["masks"], (0, 0, 0, 40))
        batch = (images, targets, *batch[2:])
    mine = _losses_and_gradients(parts.model, parts.loss_fn, batch)
    expected = _losses_and_gradients(_torchvisions(parts.model), parts.loss_fn, batch)
    assert all(torch.equal(a, b) for a, b in zip(mine, expected, strict=True))


def test_both_detectors_are_built_with_the_device_transform_and_coders():
    for model in (retinanet_model.mini_retinanet(3), maskrcnn_model.unpasted(maskrcnn_model.mini_maskrcnn(3))):
        assert isinstance(model.transform, ondevice.DeviceTransform)
        coders = [m.box_coder for m in model.modules() if isinstance(getattr(m, "box_coder", None), BoxCoder)]
        assert coders and all(isinstance(c, ondevice.DeviceBoxCoder) for c in coders)
    assert isinstance(maskrcnn_model.unpasted(maskrcnn_model.mini_maskrcnn(3)).transform,
                      maskrcnn_model.UnpastedMasks)
