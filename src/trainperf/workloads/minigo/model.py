"""MiniGo's dual network (dual_net.py of the reference, v0.7+): a 3x3 convolution and residual blocks
of two 3x3 convolutions with BatchNorm (momentum 0.95 as TensorFlow counts it, eps 1e-5); a policy
head (1x1 convolution to 2 planes, BatchNorm, ReLU, a linear layer to N*N+1 moves) and a value head
(1x1 convolution to 1 plane, BatchNorm, ReLU, linear to `fc_width`, ReLU, linear to 1, tanh).
The loss: policy cross-entropy against the search's visit distribution + `value_weight` x the squared
error of the value against the game's result; the L2 term (1e-4 x sum of squared weights / 2) is
the optimizer's weight decay on every weight but biases and BatchNorm shifts.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from trainperf.workloads.minigo import go

BN_MOMENTUM = 0.05  # torch's momentum is 1 - TensorFlow's decay (0.95)


def _conv_bn(cin: int, cout: int, kernel: int) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, kernel, padding=kernel // 2, bias=False),
            nn.BatchNorm2d(cout, eps=1e-5, momentum=BN_MOMENTUM)]


class Residual(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.body = nn.Sequential(*_conv_bn(width, width, 3), nn.ReLU(inplace=True), *_conv_bn(width, width, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(x + self.body(x))


class DualNet(nn.Module):
    """Policy logits [B, N*N+1] and value [B] (for the player to move) from planes [B, 13, N, N]."""

    def __init__(self, board_size: int, width: int = 64, blocks: int = 6, fc_width: int = 64) -> None:
        super().__init__()
        self.board_size = board_size
        points = board_size * board_size
        self.trunk = nn.Sequential(*_conv_bn(go.PLANES, width, 3), nn.ReLU(inplace=True),
                                   *[Residual(width) for _ in range(blocks)])
        self.policy_conv = nn.Sequential(*_conv_bn(width, 2, 1), nn.ReLU(inplace=True))
        self.policy_fc = nn.Linear(2 * points, points + 1)
        self.value_conv = nn.Sequential(*_conv_bn(width, 1, 1), nn.ReLU(inplace=True))
        self.value_fc = nn.Sequential(nn.Linear(points, fc_width), nn.ReLU(inplace=True), nn.Linear(fc_width, 1))

    def forward(self, planes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.trunk(planes.float())
        logits = self.policy_fc(self.policy_conv(x).flatten(1))
        value = torch.tanh(self.value_fc(self.value_conv(x).flatten(1))).squeeze(1)
        return logits, value


def loss(model: nn.Module, planes: torch.Tensor, policy: torch.Tensor, outcome: torch.Tensor,
         value_weight: float) -> torch.Tensor:
    logits, value = model(planes)
    policy_loss = -(policy * F.log_softmax(logits.float(), dim=1)).sum(1).mean()
    return policy_loss + value_weight * F.mse_loss(value.float(), outcome.float())


def param_groups(model: nn.Module, l2: float) -> list[dict[str, Any]]:
    """Weight decay (the reference's L2 term) on convolution and linear weights and BatchNorm scales;
    none on biases and BatchNorm shifts."""
    decayed, plain = [], []
    for name, p in model.named_parameters():
        (plain if name.endswith("bias") else decayed).append(p)
    return [{"params": decayed, "weight_decay": l2}, {"params": plain, "weight_decay": 0.0}]


class NetworkEvaluator:
    """The search's `Evaluator` for a network: batches of planes in, move probabilities and values
    out, on the network's device, without gradients, in eval mode (BatchNorm's running statistics)."""

    def __init__(self, model: nn.Module, device: torch.device) -> None:
        self.model, self.device = model, device
        self.calls = self.positions = 0

    def __call__(self, planes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        was_training = self.model.training
        self.model.eval()
        with torch.no_grad():
            logits, value = self.model(torch.from_numpy(planes).to(self.device))
            probabilities = torch.softmax(logits.float(), dim=1)
        self.model.train(was_training)
        self.calls += 1
        self.positions += len(planes)
        return probabilities.cpu().numpy().astype(np.float64), value.float().cpu().numpy().astype(np.float64)
