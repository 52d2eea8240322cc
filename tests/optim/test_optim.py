"""The MLPerf LR schedule and LARS update rule."""

from __future__ import annotations

import pytest
import torch

from trainperf.optim import LARS, warmup_poly


def test_warmup_then_poly_to_end_lr():
    f = warmup_poly(base_lr=2.0, end_lr=1e-4, warmup_steps=4, total_steps=14, power=2)
    assert [f(s) * 2.0 for s in range(4)] == pytest.approx([0.5, 1.0, 1.5, 2.0])
    # Halfway through the decay: end + (base - end) * 0.5^2.
    assert f(9) * 2.0 == pytest.approx(1e-4 + (2.0 - 1e-4) * 0.25)
    assert f(14) * 2.0 == pytest.approx(1e-4)
    assert f(100) * 2.0 == pytest.approx(1e-4)  # stays at end LR past the horizon


def test_lars_matches_reference_formula():
    w0 = torch.tensor([3.0, 4.0])  # |w| = 5
    g = torch.tensor([0.6, 0.8])  # |g| = 1
    p = torch.nn.Parameter(w0.clone())
    opt = LARS([p], lr=0.5, momentum=0.9, weight_decay=0.01, trust_coefficient=0.001)
    p.grad = g.clone()
    opt.step()
    trust = 0.001 * 5 / (1 + 0.01 * 5)
    v1 = 0.5 * trust * (g + 0.01 * w0)
    assert torch.allclose(p.detach(), w0 - v1)
    p.grad = g.clone()
    opt.step()
    w1 = w0 - v1
    trust2 = 0.001 * w1.norm() / (1 + 0.01 * w1.norm())
    v2 = 0.9 * v1 + 0.5 * trust2 * (g + 0.01 * w1)
    assert torch.allclose(p.detach(), w1 - v2, atol=1e-7)


def test_lars_excluded_group_is_plain_momentum_sgd():
    p = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    opt = LARS([{"params": [p], "weight_decay": 0.0, "lars_exclude": True}], lr=0.1, momentum=0.9,
               weight_decay=0.5)
    p.grad = torch.tensor([1.0, 1.0])
    opt.step()
    assert torch.allclose(p.detach(), torch.tensor([0.9, -2.1]))


def test_lars_zero_weights_use_trust_one():
    p = torch.nn.Parameter(torch.zeros(3))
    opt = LARS([p], lr=0.1, momentum=0.0)
    p.grad = torch.ones(3)
    opt.step()
    assert torch.allclose(p.detach(), -0.1 * torch.ones(3))


def test_lamb_matches_reference_formula():
    from trainperf.optim import LAMB

    w0 = torch.tensor([1.0, -2.0, 2.0])
    g = torch.tensor([0.5, 0.1, -0.3])
    p = torch.nn.Parameter(w0.clone())
    opt = LAMB([p], lr=0.1, betas=(0.9, 0.99), eps=1e-6, weight_decay=0.01)
    p.grad = g.clone()
    opt.step()
    m_hat = (0.1 * g) / (1 - 0.9)
    v_hat = (0.01 * g * g) / (1 - 0.99)
    update = m_hat / (v_hat.sqrt() + 1e-6) + 0.01 * w0
    trust = w0.norm() / update.norm()
    assert torch.allclose(p.detach(), w0 - 0.1 * trust * update, atol=1e-6)


def test_lamb_excluded_group_has_no_decay_or_trust_ratio():
    from trainperf.optim import LAMB

    p = torch.nn.Parameter(torch.tensor([3.0, 4.0]))
    opt = LAMB([{"params": [p], "lamb_exclude": True}], lr=0.1, weight_decay=0.5)
    p.grad = torch.tensor([1.0, -1.0])
    opt.step()
    # First Adam step with bias correction: m_hat/sqrt(v_hat) = sign(g) (up to eps).
    assert torch.allclose(p.detach(), torch.tensor([2.9, 4.1]), atol=1e-5)


def test_lars_foreach_equals_the_per_parameter_loop():
    """The multi-tensor form gives the same weights as the reference loop over several steps, with
    an excluded group (BN/bias), a zero-weight tensor and weight decay."""
    torch.manual_seed(0)
    shapes = [(8, 4), (4,), (16,), (3, 3, 2)]
    start = [torch.randn(s) for s in shapes]
    start[2].zero_()
    runs = []
    for foreach in (False, True):
        params = [torch.nn.Parameter(w.clone()) for w in start]
        opt = LARS([{"params": params[:2]}, {"params": params[2:], "lars_exclude": True, "weight_decay": 0.0}],
                   lr=0.3, momentum=0.9, weight_decay=5e-5, trust_coefficient=0.001, foreach=foreach)
        gen = torch.Generator().manual_seed(1)
        for _ in range(4):
            for p in params:
                p.grad = torch.randn(p.shape, generator=gen)
            opt.step()
        runs.append([p.detach().clone() for p in params])
    for a, b in zip(*runs, strict=True):
        assert torch.allclose(a, b, atol=1e-6)


def test_lamb_foreach_equals_the_per_parameter_loop():
    """The multi-tensor LAMB gives the reference loop's weights over several steps, with an excluded
    group (LayerNorm/bias), a zero-weight tensor and weight decay."""
    from trainperf.optim import LAMB

    torch.manual_seed(0)
    shapes = [(8, 4), (4,), (16,), (3, 3, 2)]
    start = [torch.randn(s) for s in shapes]
    start[1].zero_()
    runs = []
    for foreach in (False, True):
        params = [torch.nn.Parameter(w.clone()) for w in start]
        opt = LAMB([{"params": params[:2], "weight_decay": 0.01},
                    {"params": params[2:], "lamb_exclude": True, "weight_decay": 0.0}],
                   lr=0.01, betas=(0.88, 0.88), eps=1e-6, foreach=foreach)
        gen = torch.Generator().manual_seed(1)
        for _ in range(5):
            for p in params:
                p.grad = torch.randn(p.shape, generator=gen)
            opt.step()
        runs.append([p.detach().clone() for p in params])
    for a, b in zip(*runs, strict=True):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-5)
    assert not torch.equal(runs[0][0], start[0])


def test_ema_copies_then_averages_weights_and_buffers_without_a_host_sync():
    from trainperf.bench.stepcount import _Dispatched
    from trainperf.optim import ema

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    averaged = ema(model, 0.9)
    with torch.no_grad():
        model[0].weight.add_(1.0)
    mode = _Dispatched()
    with mode:
        averaged.update_parameters(model)  # the first update copies
        first = averaged.module[0].weight.clone()
        with torch.no_grad():
            model[0].weight.add_(1.0)
            model(torch.randn(8, 3))  # BN statistics move; its counter (an integer buffer) too
        averaged.update_parameters(model)
    assert dict(mode.syncs) == {}  # torch's AveragedModel reads its counter back here each step
    torch.testing.assert_close(first, model[0].weight - 1.0)
    torch.testing.assert_close(averaged.module[0].weight, 0.9 * first + 0.1 * model[0].weight)
    torch.testing.assert_close(averaged.module[1].running_mean, 0.1 * model[1].running_mean)
    assert int(averaged.module[1].num_batches_tracked) == int(model[1].num_batches_tracked) == 1
    state = averaged.state_dict()
    fresh = ema(model, 0.9)
    fresh.load_state_dict(state)
    assert fresh.updates == 2  # the count travels with the state: a restore restores it
