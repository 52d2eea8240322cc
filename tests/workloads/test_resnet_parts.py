"""ResNet parts: the v1.5 model, reference init, parameter groups and batched augmentation."""

from __future__ import annotations

import torch
from torch import nn

from tests.conftest import build_parts
from trainperf.spec import RuntimeContext
from trainperf.workloads.resnet import FULL_RECIPES, MINI_RECIPE, ResNetWorkload, _param_groups
from trainperf.workloads.resnet import data as D
from trainperf.workloads.resnet.model import MiniResNet, build_resnet50


def test_resnet50_is_v1_5():
    model = build_resnet50(1000)
    assert sum(p.numel() for p in model.parameters()) == 25_557_032
    block = model.layer2[0]
    # v1.5: the stride sits on the 3x3 convolution, not the first 1x1.
    assert block.conv1.stride == (1, 1) and block.conv2.stride == (2, 2)
    assert model.fc.weight.std().item() < 0.02
    assert all(m.momentum == 0.1 and m.eps == 1e-5 for m in model.modules() if isinstance(m, nn.BatchNorm2d))


def test_mini_model_shapes():
    model = MiniResNet(10, 32, (16, 32, 64), (1, 1, 1))
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
    assert model.layers[1].conv2.stride == (2, 2)


def test_bn_and_bias_excluded_from_weight_decay():
    model = MiniResNet(10, 8, (4,), (1,))
    decay, skip = _param_groups(model, 1e-4)
    n_bn_bias = sum(1 for m in model.modules() for n, _ in m.named_parameters(recurse=False)
                    if isinstance(m, nn.BatchNorm2d) or n == "bias")
    assert len(skip["params"]) == n_bn_bias and skip["weight_decay"] == 0.0 and skip["lars_exclude"]
    assert len(decay["params"]) + len(skip["params"]) == len(list(model.parameters()))


def test_random_resized_crop_is_batched_and_seeded():
    images = torch.rand(5, 3, 32, 32) * 255
    a = D.random_resized_crop(images, 0.6, True, torch.Generator().manual_seed(1))
    b = D.random_resized_crop(images, 0.6, True, torch.Generator().manual_seed(1))
    assert a.shape == images.shape and torch.equal(a, b)
    assert not torch.equal(a, images)


def test_build_uses_the_recipe_optimizer():
    w = ResNetWorkload()
    ctx = RuntimeContext.create("cpu")
    assert isinstance(build_parts(w, MINI_RECIPE, ctx).optimizer, torch.optim.SGD)
    lars = build_parts(w, MINI_RECIPE.with_overrides(["optimizer=lars"]), ctx).optimizer
    assert type(lars).__name__ == "LARS"
    assert FULL_RECIPES["lars-3264"].train_epochs == 39
