"""ResNet parts: the v1.5 model, reference init, parameter groups and batched augmentation."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from torch import nn

from tests.conftest import build_parts
from trainperf.contract import RuntimeContext
from trainperf.errors import TrainperfError
from trainperf.workloads.resnet import FULL_RECIPES, MINI_RECIPE, ResNetWorkload, _param_groups
from trainperf.workloads.resnet import images as resnet_images
from trainperf.workloads.resnet.model import MiniResNet, build_resnet50


@pytest.mark.slow
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
    a = resnet_images.random_resized_crop(images, 0.6, True, torch.Generator().manual_seed(1))
    b = resnet_images.random_resized_crop(images, 0.6, True, torch.Generator().manual_seed(1))
    assert a.shape == images.shape and torch.equal(a, b)
    assert not torch.equal(a, images)


def test_build_uses_the_recipe_optimizer():
    w = ResNetWorkload()
    ctx = RuntimeContext.create("cpu")
    assert isinstance(build_parts(w, MINI_RECIPE, ctx).optimizer, torch.optim.SGD)
    lars = build_parts(w, MINI_RECIPE.with_overrides(["optimizer=lars"]), ctx).optimizer
    assert type(lars).__name__ == "LARS"
    assert FULL_RECIPES["lars-3264"].train_epochs == 39


# -- decode=device: workers read bytes, the device decodes and augments ------------------------------
def test_crop_boxes_are_random_resized_crops_drawn_on_the_host():
    import numpy as np

    sizes = [(375, 500), (500, 333), (60, 600), (40, 40)] * 50
    boxes = resnet_images.crop_boxes(sizes, 0.08, np.random.default_rng(0))
    assert boxes == resnet_images.crop_boxes(sizes, 0.08, np.random.default_rng(0))  # the same draws from the same seed
    ratios = []
    for (h, w), (top, left, bh, bw) in zip(sizes, boxes, strict=True):
        assert 0 <= top and top + bh <= h and 0 <= left and left + bw <= w and bh > 0 and bw > 0
        area = bh * bw / (h * w)
        assert 0.08 * 0.9 <= area <= 1.0
        ratios.append(bw / bh)
    # torchvision's aspect range 3/4-4/3 (a 60x600 image cannot always fit one: then its centre crop).
    inside = [r for r, (h, w) in zip(ratios, sizes, strict=True) if (h, w) != (60, 600)]
    assert min(inside) >= 0.7 and max(inside) <= 1.4


def test_device_crops_and_eval_crops_are_torchvisions():
    from torchvision.transforms.v2 import functional as TF

    gen = torch.Generator().manual_seed(0)
    image = torch.randint(0, 256, (3, 375, 500), generator=gen, dtype=torch.uint8)
    ours = resnet_images.crop_resize([image, image], [(10, 20, 200, 300), (0, 0, 375, 500)], 224, [False, True])
    theirs = TF.resized_crop(image.float(), 10, 20, 200, 300, [224, 224], antialias=True)
    torch.testing.assert_close(ours[0], theirs, atol=1e-3, rtol=1e-4)
    torch.testing.assert_close(ours[1], TF.resize(image.float(), [224, 224], antialias=True).flip(-1), atol=1e-3,
                               rtol=1e-4)
    for shape in ((375, 500), (500, 333), (256, 256)):
        img = torch.randint(0, 256, (3, *shape), generator=gen, dtype=torch.uint8)
        expected = resnet_images.eval_transform(224, 256)(img.float())
        torch.testing.assert_close(resnet_images.resize_center_crop([img], 256, 224)[0], expected, atol=1e-3, rtol=1e-4)


class _NoFFmpeg:
    """A meta-path finder that fails TorchCodec's import the way it fails without FFmpeg's libraries."""

    def find_spec(self, name, path=None, target=None):
        if name.startswith("torchcodec"):
            raise RuntimeError("Could not load libtorchcodec. Likely causes: FFmpeg is not properly installed.")
        return None


@pytest.mark.parametrize("decoder", ["torchcodec", "torchvision", "torchcodec-without-ffmpeg"])
def test_device_decoding_reads_what_pillow_reads_and_falls_back_for_a_png(tmp_path, monkeypatch, request, decoder):
    import sys
    import warnings

    from PIL import Image

    from tests.conftest import imagenet_folder

    resnet_images._jpeg_decoder.cache_clear()
    if decoder == "torchcodec":
        pytest.importorskip("torchcodec.decoders")
    elif decoder == "torchvision":
        monkeypatch.setitem(sys.modules, "torchcodec.decoders", None)  # as where it is not installed
    else:
        for name in [m for m in sys.modules if m.startswith("torchcodec")]:
            monkeypatch.delitem(sys.modules, name)
        monkeypatch.setattr(sys, "meta_path", [_NoFFmpeg(), *sys.meta_path])
        with pytest.warns(UserWarning, match=r"^decode=device: TorchCodec cannot load \(Could not load libtorchcodec"):
            resnet_images._jpeg_decoder()
    # No decoder chosen under a patched import outlives the test.
    request.addfinalizer(resnet_images._jpeg_decoder.cache_clear)
    warnings.simplefilter("ignore")

    root = imagenet_folder(tmp_path / "imagenet")
    jpeg = next((root / "train").rglob("*.JPEG"))
    png = jpeg.with_name("disguised.JPEG")  # ImageNet holds a PNG under a .JPEG name
    Image.open(jpeg).save(png, format="PNG")
    datas = [torch.frombuffer(bytearray(p.read_bytes()), dtype=torch.uint8) for p in (jpeg, png)]
    decoded = resnet_images.decode_batch(datas, [jpeg, png], torch.device("cpu"))
    torch.testing.assert_close(decoded[1], resnet_images.decode(png))  # Pillow, where the JPEG decoder refuses
    assert (decoded[0].float() - resnet_images.decode(jpeg).float()).abs().mean() < 2  # libjpeg against Pillow
    broken = tmp_path / "broken.JPEG"
    broken.write_bytes(b"not an image at all")
    with pytest.raises(TrainperfError, match="broken.JPEG: cannot decode image"):
        resnet_images.decode_batch([torch.frombuffer(bytearray(broken.read_bytes()), dtype=torch.uint8)], [broken],
                       torch.device("cpu"))


@pytest.mark.slow
def test_decode_on_the_device_runs_the_full_path(tmp_path):
    import json

    from tests.conftest import imagenet_folder
    from trainperf.cli import main

    root = imagenet_folder(tmp_path / "imagenet", train_per_class=4, val_per_class=2)
    out = tmp_path / "bench.json"
    assert main(["bench", "resnet", "--scale", "full", "--data", str(root), "--batch-size", "4", "--steps", "2",
                 "--warmup", "1", "--set", "decode=device", "--set", "num_workers=0", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["samples_per_s"] > 0
    run = tmp_path / "run"
    code = main(["run", "resnet", "--scale", "full", "--data", str(root), "--out", str(run), "--quiet",
                 "--set", "decode=device", "--set", "num_workers=0", "--set", "global_batch_size=4",
                 "--set", "max_epochs=1", "--set", "eval_first=1", "--set", "eval_every=1",
                 "--set", "eval_batch_size=3"])
    result = json.loads((run / "result.json").read_text())
    assert code == 1 and result["eval_samples"] == 4 and len(result["evaluations"]) == 1  # evaluated, not converged


def test_the_reference_crop_is_tensorflows_distorted_box_with_the_whole_image_as_the_box():
    """tf.image.sample_distorted_bounding_box as the reference calls it (min_object_covered 0.1, area
    0.05-1, aspect 0.75-1.33, 100 attempts, the whole image as the box): no crop under 10 % of the
    image though the area range starts at 5 %, aspects within the range, the height uniform between
    the bounds the area range gives for the drawn aspect (not torchvision's area-uniform draw)."""
    rng = np.random.default_rng(0)
    h, w = 375, 500
    boxes = [resnet_images.reference_crop_box(h, w, 0.05, rng.random) for _ in range(20000)]
    areas = np.array([bh * bw for _, _, bh, bw in boxes]) / (h * w)
    aspects = np.array([bw / bh for _, _, bh, bw in boxes])
    assert areas.min() >= 0.1 and areas.max() <= 1.0
    assert aspects.min() >= 0.74 and aspects.max() <= 1.34
    assert all(0 <= top <= h - bh and 0 <= left <= w - bw for top, left, bh, bw in boxes)
    # Height uniform in [sqrt(0.05 A / r), sqrt(A / r)] puts more crops at 10-30 % of the image than
    # torchvision's area-uniform draw (whose large crops at extreme aspects often do not fit), and none
    # under 10 %, where torchvision's draw puts 1 in 14 (this image: 42 % vs 35 % under 30 %).
    assert 0.3 < np.median(areas) < 0.4 and 0.38 < (areas < 0.3).mean() < 0.46
    tv = resnet_images.crop_boxes([(h, w)] * 20000, 0.05, np.random.default_rng(0))
    tv_areas = np.array([bh * bw for _, _, bh, bw in tv]) / (h * w)
    assert (tv_areas < 0.1).mean() > 0.05 and 0.3 < (tv_areas < 0.3).mean() < 0.38
    # The same sampler on the host batch path, and a fixed stream for a fixed seed.
    sizes = [(h, w), (64, 48), (10, 300)]
    ref = resnet_images.crop_boxes(sizes, 0.05, np.random.default_rng(3), crop="reference")
    assert ref == resnet_images.crop_boxes(sizes, 0.05, np.random.default_rng(3), crop="reference")
    assert all(0 < bh <= sh and 0 < bw <= sw for (sh, sw), (_, _, bh, bw) in zip(sizes, ref, strict=True))


def test_the_full_recipes_crop_as_the_reference_and_the_in_memory_path_refuses_it():
    assert {r.crop for r in FULL_RECIPES.values()} == {"reference"}
    assert MINI_RECIPE.crop == "torchvision"
    transform = resnet_images.train_transform(224, 0.05, "reference")
    out = transform(torch.zeros(3, 300, 400, dtype=torch.uint8))
    assert out.shape == (3, 224, 224)
    with pytest.raises(TrainperfError, match="crop=reference: the in-memory path"):
        dataclasses.replace(MINI_RECIPE, crop="reference").validate()
