"""3D U-Net parts: sliding-window inference (constant models, windows batched or one by one, the
reference's crop-or-pad rule), Dice of perfect and empty predictions, the Dice + CE loss, the network's
shapes, and the v1.0 cadence in epochs rescaled to the samples per epoch."""

from __future__ import annotations

import math

import pytest
import torch

from trainperf.spec import Cadence
from trainperf.workloads.unet3d import inference as I
from trainperf.workloads.unet3d import model as M


@pytest.mark.parametrize("shape", [(20, 24, 17), (32, 32, 32), (70, 45, 33), (16, 80, 40)])
def test_a_constant_model_gives_that_constant_everywhere(shape):
    """Smaller than, equal to and larger than the 32^3 window: the Gaussian-weighted average of a
    constant is the constant, padding included."""
    volume = torch.randn(1, *shape)
    const = torch.tensor([0.25, -1.5, 3.0])

    def predict(w: torch.Tensor) -> torch.Tensor:
        return const[None, :, None, None, None].expand(w.shape[0], 3, *w.shape[2:])

    scores, bounds = I.sliding_window(volume, predict, roi=32, classes=3, batch=3)
    kept = tuple(stop - start for start, stop in bounds)
    assert scores.shape == (3, *kept)
    torch.testing.assert_close(scores, const[:, None, None, None].expand_as(scores), rtol=1e-6, atol=1e-6)
    for size, (start, stop) in zip(shape, bounds, strict=True):  # crop only remainders under 8 (stride/2)
        assert size - (stop - start) == (size % 16 if size % 16 < 8 else 0)


def test_batched_windows_equal_one_window_at_a_time_and_the_padding_is_seen():
    torch.manual_seed(0)
    net = torch.nn.Conv3d(1, 3, 3, padding=1)
    volume = torch.randn(1, 40, 37, 50)
    one, b1 = I.sliding_window(volume, net, roi=16, classes=3, batch=1)
    many, b2 = I.sliding_window(volume, net, roi=16, classes=3, batch=7)
    assert b1 == b2
    torch.testing.assert_close(one, many, rtol=1e-5, atol=1e-5)
    # a model that reports its input: the pad value shows up only where windows saw padding
    # (12^3 -> padded to 16^3 with -2.2; 9^3 -> its remainder of 1 cropped to 8^3, then padded)
    for size, kept in ((12, 12), (9, 8)):
        seen, _ = I.sliding_window(torch.full((1, size, size, size), 5.0), lambda w: w.repeat(1, 3, 1, 1, 1), roi=16,
                                   classes=3)
        assert seen.shape == (3, kept, kept, kept) and torch.allclose(seen, torch.full_like(seen, 5.0))
    padded, _ = I.sliding_window(torch.full((1, 12, 12, 12), 5.0), lambda w: w.mean((2, 3, 4), keepdim=True)
                                 .expand(-1, 3, *w.shape[2:]), roi=16, classes=3)
    assert float(padded.max()) < 5.0  # the window's mean includes the -2.2 padding


def test_gaussian_importance_is_the_references():
    g = I.gaussian_importance(128)
    assert g.shape == (128, 128, 128) and float(g.max()) == pytest.approx(1.0)
    sigma = 0.125 * 128
    # cube root of a product of three Gaussians: exp(-r^2 / (6 sigma^2)) away from the centre (63.5)
    expected = math.exp(-((64 - 63.5) ** 2 * 2 + (100 - 63.5) ** 2) / (2 * sigma ** 2) / 3)
    assert float(g[64, 64, 100]) / float(g[64, 64, 64]) == pytest.approx(
        expected / math.exp(-(3 * 0.5 ** 2) / (2 * sigma ** 2) / 3), rel=1e-6)


def test_dice_of_perfect_and_empty_predictions():
    label = torch.zeros(8, 8, 8, dtype=torch.long)
    label[2:5, 2:5, 2:5] = 1
    label[6:, 6:, 6:] = 2
    assert M.case_dice(label, label).tolist() == pytest.approx([1.0, 1.0])
    assert M.case_dice(torch.zeros_like(label), label).tolist() == pytest.approx([0.0, 0.0], abs=1e-6)
    only_kidney = label.clone()
    only_kidney[label == 2] = 0
    assert M.case_dice(only_kidney, only_kidney).tolist() == pytest.approx([1.0, 1.0])  # absent tumour: 1
    half = label.clone()
    half[2:5, 2:5, 2] = 0  # a third of the kidney missed: 2 * 18 / (18 + 27)
    assert M.case_dice(half, label)[0].item() == pytest.approx(36 / 45)


def test_dice_ce_loss_falls_for_the_right_answer():
    label = torch.zeros(1, 1, 8, 8, 8, dtype=torch.long)
    label[..., 2:6, 2:6, 2:6] = 1
    label[..., 7, 7, 6:] = 2
    good = torch.nn.functional.one_hot(label[:, 0], 3).movedim(-1, 1).float() * 20
    uniform = torch.zeros_like(good)
    assert M.dice_ce_loss(good, label) < 1e-3 < M.dice_ce_loss(uniform, label)
    # uniform softmax: Dice of class c = 2 (n_c / 3) / (512 / 3 + n_c); CE = log 3
    dice = [2 * n / 3 / (512 / 3 + n) for n in (64, 2)]
    assert M.dice_ce_loss(uniform, label).item() == pytest.approx((1 - sum(dice) / 2 + math.log(3)) / 2, rel=1e-4)


def test_network_shapes_and_halvings():
    net = M.UNet3D((4, 8, 16))
    assert net.halvings == 3
    out = net(torch.randn(2, 1, 16, 16, 16))
    assert out.shape == (2, 3, 16, 16, 16)
    reference = M.UNet3D()
    params = sum(p.numel() for p in reference.parameters())
    assert reference.halvings == 5 and params == 31_190_243  # 32/64/128/256/320, as the reference's


@pytest.mark.parametrize("samples,first,every,budget", [(168, 1000, 20, 10000), (84, 2000, 40, 20000),
                                                         (336, 500, 10, 5000), (100, 1680, 34, 16800),
                                                         (1000, 168, 4, 1680)])
def test_cadence_is_the_v1_rule_in_reference_epochs(samples, first, every, budget):
    """First evaluation at epoch ceil(1000 * 168 / S), then every ceil(20 * 168 / S); non-converged
    after ceil(10000 * 168 / S); S = samples per epoch."""
    cadence = Cadence(every=20, first=1000, max_epochs=10000, reference_epoch_samples=168).resolve(samples)
    assert (cadence.first, cadence.every, cadence.max_epochs) == (first, every, budget)
    assert first == math.ceil(1000 * 168 / samples) and every == math.ceil(20 * 168 / samples)
