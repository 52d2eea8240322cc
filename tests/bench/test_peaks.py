"""The peak an MFU is measured against: an fp32 step on a GPU that may run it in TF32 (cuDNN's default for
convolutions) is held to the TF32 peak, so its MFU cannot pass 100 % as the H200 round's 112 % did."""

from __future__ import annotations

import pytest
import torch

from trainperf import devices
from trainperf.bench import throughput


@pytest.fixture
def h200(monkeypatch):
    monkeypatch.setattr(devices, "name", lambda device: "NVIDIA H200")
    return torch.device("cuda", 0)


def test_fp32_with_tf32_allowed_is_held_to_the_tf32_peak(h200, monkeypatch):
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)
    peak, source = throughput.device_peak_tflops(h200, "fp32")
    assert peak == 494.7 and "TF32" in source


def test_fp32_without_tf32_is_held_to_the_fp32_peak(h200, monkeypatch):
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        peak, source = throughput.device_peak_tflops(h200, "fp32")
    finally:
        torch.set_float32_matmul_precision(previous)
    assert peak == 67.0 and "fp32 peak" in source


def test_bf16_is_unchanged_by_tf32(h200, monkeypatch):
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", True)
    assert throughput.device_peak_tflops(h200, "bf16")[0] == 989.0
