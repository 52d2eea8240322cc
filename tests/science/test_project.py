"""The scaling projection's ring all-reduce model and its fit to measured timings."""

from __future__ import annotations

import pytest

from trainperf.science import project


def _inputs(compute_s: float, grad_bytes: int, epochs: float = 10.0) -> project.Inputs:
    return project.Inputs("w", 32, compute_s, "given", grad_bytes, 1_000_000, None, 1.0, lambda b: (epochs, "fixed"))


def test_ring_allreduce_cost_is_bandwidth_term_plus_latency_per_bucket():
    link = project.Link(bandwidth_gbs=10.0, latency_us=5.0, source="test")
    assert project.allreduce_s(100 * 2**20, 1, link) == 0.0
    expected = 2 * 7 / 8 * 100 * 2**20 / 10e9 + 4 * 2 * 7 * 5e-6  # 100 MiB = 4 buckets of 25 MiB
    assert project.allreduce_s(100 * 2**20, 8, link) == pytest.approx(expected)


def test_backward_hides_the_allreduce_up_to_the_last_bucket():
    link = project.Link(bandwidth_gbs=10.0, latency_us=0.0, source="test")
    heavy = _inputs(compute_s=1.0, grad_bytes=100 * 2**20)  # 18 ms of all-reduce under 667 ms of backward
    step, total, exposed = project.step_s(heavy.compute_s, heavy.gradient_bytes, 8, link, overlap=1.0)
    assert exposed == pytest.approx(project.allreduce_s(25 * 2**20, 8, link)) and step == pytest.approx(1 + exposed)
    _, _, none_hidden = project.step_s(heavy.compute_s, heavy.gradient_bytes, 8, link, overlap=0.0)
    assert none_hidden == pytest.approx(total)
    light = _inputs(compute_s=0.001, grad_bytes=100 * 2**20)  # NCF-like: far more talk than work
    rows = project.project(light, [1, 2, 4, 8], link)
    assert rows[0].speedup == 1.0 and rows[-1].efficiency < 0.2
    rows = project.project(heavy, [1, 2, 4, 8], link)
    assert rows[-1].efficiency > 0.95 and [r.global_batch for r in rows] == [32, 64, 128, 256]


def test_more_epochs_at_a_larger_batch_lower_the_speedup():
    link = project.Link(bandwidth_gbs=1e6, latency_us=0.0, source="free")
    flat = project.project(_inputs(1.0, 1), [1, 8], link)[-1]
    inputs = _inputs(1.0, 1)
    inputs.epochs = lambda b: (10.0 * (1 + b / 256), "grows")  # 32 -> 11.25 epochs, 256 -> 20
    grown = project.project(inputs, [1, 8], link)[-1]
    assert flat.speedup == pytest.approx(8, rel=0.01) and grown.speedup == pytest.approx(8 * 11.25 / 20, rel=0.01)


def test_the_fit_recovers_latency_and_bandwidth():
    truth = project.Link(bandwidth_gbs=2.0, latency_us=40.0, source="truth")
    timings = {size: project.allreduce_s(size, 4, truth, bucket_bytes=2**40) for size in project.PROBE_SIZES}
    fitted = project.fit(timings, 4)
    assert fitted.bandwidth_gbs == pytest.approx(2.0, rel=1e-6) and fitted.latency_us == pytest.approx(40.0, rel=1e-6)
