"""The LSTM that compiles as one operator per layer (workloads/common/rnn.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from trainperf.workloads.common.rnn import LSTM


class _Net(nn.Module):
    def __init__(self, layers: int = 2, dropout: float = 0.0) -> None:
        super().__init__()
        self.rnn = LSTM(6, 8, num_layers=layers, batch_first=True, dropout=dropout)
        self.out = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        y, (h, c) = self.rnn(x, state)
        return self.out(y).square().mean() + h.sum() * 0.3 + c[-1].mean()  # every output has a gradient


def _grads(net: nn.Module, x: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor] | None = None
           ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    loss = net(x, state)
    leaves = [*net.parameters(), *(t for t in (x, *(state or ())) if t.requires_grad)]
    return loss.detach(), list(torch.autograd.grad(loss, leaves))


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    torch._dynamo.config.allow_rnn = True
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("with_state", [False, True])
def test_compiled_lstm_matches_eager_loss_and_every_gradient(fresh_dynamo, with_state: bool):
    torch.manual_seed(0)
    net = _Net(layers=3)
    x = torch.randn(3, 11, 6, requires_grad=True)
    state = (torch.randn(3, 3, 8, requires_grad=True), torch.randn(3, 3, 8, requires_grad=True)) if with_state else None
    eager_loss, eager_grads = _grads(net, x, state)
    compiled = torch.compile(net, fullgraph=True, backend="aot_eager")
    loss, grads = _grads(compiled, x, state)
    torch.testing.assert_close(loss, eager_loss)
    assert len(grads) == len(eager_grads) == 3 * 4 + 2 + 1 + 2 * with_state  # 3 layers, the head, x, the state
    for got, want in zip(grads, eager_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_the_compiled_graph_does_not_grow_with_the_sequence(fresh_dynamo):
    """One operator per layer each way: the graph is the same size for 4 or 64 steps (torch's decomposition
    unrolls a cell per step)."""
    from torch._dynamo.backends.common import aot_autograd

    sizes = {}
    for steps in (4, 64):
        graphs: list[torch.fx.GraphModule] = []

        def keep(g: torch.fx.GraphModule, _: list, into: list = graphs) -> torch.fx.GraphModule:
            into.append(g)
            return g

        torch._dynamo.reset()
        net = _Net(layers=2)
        x = torch.randn(2, steps, 6)
        backend = aot_autograd(fw_compiler=keep, bw_compiler=keep)
        torch.compile(net, fullgraph=True, backend=backend, dynamic=False)(x).backward()
        sizes[steps] = [len(g.graph.nodes) for g in graphs]
        ops = [str(n.target) for g in graphs for n in g.graph.nodes if n.op == "call_function"]
        assert ops.count("trainperf.lstm_layer.default") == 2
        assert ops.count("trainperf.lstm_layer_backward.default") == 2
    assert sizes[4] == sizes[64]


def test_dropout_between_layers_stays_outside_the_recomputed_operator(fresh_dynamo):
    """With dropout the backward recomputes each layer from its saved (dropped-out) input, so the gradient is
    that of the forward that ran: checked against a central difference of the compiled loss along a random
    direction, every evaluation under the same seed (the same masks), in float64."""
    torch.manual_seed(1)
    net = _Net(layers=3, dropout=0.5).double().train()
    x = torch.randn(2, 7, 6, dtype=torch.float64)
    compiled = torch.compile(net, fullgraph=True, backend="aot_eager")
    params = list(net.parameters())
    direction = [torch.randn_like(p) for p in params]

    def loss_at(step: float) -> torch.Tensor:
        torch.manual_seed(5)
        if not step:
            return compiled(x, None)
        with torch.no_grad():
            for p, d in zip(params, direction, strict=True):
                p.add_(d, alpha=step)
            loss = compiled(x, None)
            for p, d in zip(params, direction, strict=True):
                p.sub_(d, alpha=step)
        return loss

    loss_at(0.0)  # compile first: compiling draws random numbers of its own
    grads = torch.autograd.grad(loss_at(0.0), params)
    analytic = sum((g * d).sum() for g, d in zip(grads, direction, strict=True))
    eps = 1e-6
    numeric = (loss_at(eps) - loss_at(-eps)).detach() / (2 * eps)
    assert loss_at(0.0).item() != pytest.approx(net.eval()(x).item(), rel=1e-3)  # the masks did drop units
    net.train()
    torch.testing.assert_close(analytic.detach(), numeric, rtol=1e-5, atol=1e-8)


def test_eager_lstm_is_torchs_own():
    """Eager, the subclass is nn.LSTM: same parameters, state dict and outputs (packed sequences too)."""
    torch.manual_seed(0)
    ours = LSTM(5, 4, num_layers=2, batch_first=True)
    theirs = nn.LSTM(5, 4, num_layers=2, batch_first=True)
    theirs.load_state_dict(ours.state_dict())
    x = torch.randn(3, 6, 5)
    torch.testing.assert_close(ours(x)[0], theirs(x)[0])
    packed = nn.utils.rnn.pack_padded_sequence(x, [6, 4, 2], batch_first=True)
    torch.testing.assert_close(ours(packed)[0].data, theirs(packed)[0].data)


def test_the_operators_pass_opcheck():
    torch.manual_seed(0)
    weights = [torch.randn(16, 3, requires_grad=True), torch.randn(16, 4, requires_grad=True),
               torch.randn(16, requires_grad=True), torch.randn(16, requires_grad=True)]
    for batch_first, x in ((True, torch.randn(2, 5, 3)), (False, torch.randn(5, 2, 3))):
        args = (x.requires_grad_(), torch.randn(1, 2, 4), torch.randn(1, 2, 4), weights, batch_first)
        torch.library.opcheck(torch.ops.trainperf.lstm_layer.default, args)


def test_bf16_lstms_run_on_a_cpu_without_bf16_instructions():
    """oneDNN cannot build a bf16 LSTM on such a CPU ("could not create a primitive descriptor"):
    speedups.cpu_rnns leaves it off there for models with RNN layers, and the bf16 step runs."""
    from trainperf.runtime import speedups

    net = _Net(layers=2)
    onednn = torch.backends.mkldnn.enabled
    try:
        speedups.cpu_rnns(net, torch.device("cpu"), "bf16")
        if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
            assert not torch.backends.mkldnn.enabled
        with torch.autocast("cpu", torch.bfloat16):
            loss = net(torch.randn(2, 5, 6))
        loss.float().backward()
        assert net.rnn.weight_hh_l1.grad is not None
        torch.backends.mkldnn.enabled = onednn
        speedups.cpu_rnns(nn.Linear(2, 2), torch.device("cpu"), "bf16")  # no RNN: left as it was
        assert torch.backends.mkldnn.enabled == onednn
    finally:
        torch.backends.mkldnn.enabled = onednn
