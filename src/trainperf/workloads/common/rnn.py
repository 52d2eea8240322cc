"""LSTMs that torch.compile keeps whole: one operator per layer instead of the time-unrolled decomposition.

Compiled, `torch.lstm` is decomposed (torch/_decomp's `lstm_impl`) into a Python loop over time steps unless
oneDNN takes it (CPU inference only): on a GPU every layer becomes T copies of a cell, so RNN-T's encoder
(hundreds of frames, five layers) makes a graph that compiles for many minutes (an H100 had not finished
after 375 s), and GNMT's unrolled layers launch a cell per step instead of cuDNN's fused kernels.

`trainperf::lstm_layer` is one unidirectional LSTM layer as an opaque operator: its forward runs the
device's own LSTM kernel (cuDNN, oneDNN or native) without recording a graph and keeps only its inputs;
its backward (`trainperf::lstm_layer_backward`) runs the forward again with autograd and differentiates
it. A layer's activations are thus recomputed (one more forward of the LSTM, the trade activation
checkpointing makes) and never stored. Both are custom operators with fake versions, so dynamo, AOTAutograd
and Inductor see one node each way and CUDA Graphs record the kernels inside.

`LSTM` is `nn.LSTM` (same parameters and state dict) that takes this path while compiling, layer by layer
with its dropout between layers outside the operator (so that the recomputed forward is the one that ran);
eager it is `nn.LSTM`. `lstm_layer` is the function for code that calls torch.lstm with its own weights."""

from __future__ import annotations

import torch
from torch import nn

_AUTOGRAD = ("AutogradOther", "AutogradCPU", "AutogradCUDA", "AutogradNestedTensor", "ADInplaceOrView")


def _run(x: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor, weights: list[torch.Tensor], batch_first: bool,
         train: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    with torch.autocast(x.device.type, enabled=False):  # the caller cast the inputs as autocast would
        out, h, c = torch.lstm(x, (h0, c0), weights, len(weights) == 4, 1, 0.0, train, False, batch_first)
    # Kernels return batch-first outputs as transposed time-major ones; the fake version's are contiguous.
    return out.contiguous(), h.contiguous(), c.contiguous()


@torch.library.custom_op("trainperf::lstm_layer", mutates_args=())
def _lstm_layer(x: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor, weights: list[torch.Tensor],
                batch_first: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        return _run(x, h0, c0, weights, batch_first, train=False)


@_lstm_layer.register_fake
def _(x: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor, weights: list[torch.Tensor], batch_first: bool
      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return x.new_empty((*x.shape[:-1], h0.shape[-1])), torch.empty_like(h0), torch.empty_like(c0)


@torch.library.custom_op("trainperf::lstm_layer_backward", mutates_args=())
def _lstm_layer_backward(x: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor, weights: list[torch.Tensor],
                         batch_first: bool, grad_out: torch.Tensor, grad_h: torch.Tensor, grad_c: torch.Tensor
                         ) -> list[torch.Tensor]:
    # A custom operator's kernel runs with autograd's dispatch keys excluded; the recomputation needs them.
    exclude = torch._C._dispatch_tls_local_exclude_set()
    for key in _AUTOGRAD:
        exclude = exclude.remove(getattr(torch._C.DispatchKey, key))
    with torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), exclude), \
            torch.enable_grad():
        leaves = [t.detach().requires_grad_() for t in (x, h0, c0, *weights)]
        out, h, c = _run(leaves[0], leaves[1], leaves[2], leaves[3:], batch_first, train=True)
        grads = torch.autograd.grad((out, h, c), leaves, (grad_out, grad_h, grad_c), allow_unused=True)
    # Each gradient laid out as its input (what the fake version promises), whatever the kernel returned.
    return [torch.zeros_like(t) if g is None else g if g.stride() == t.stride() else torch.empty_like(t).copy_(g)
            for g, t in zip(grads, leaves, strict=True)]


@_lstm_layer_backward.register_fake
def _(x: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor, weights: list[torch.Tensor], batch_first: bool,
      grad_out: torch.Tensor, grad_h: torch.Tensor, grad_c: torch.Tensor) -> list[torch.Tensor]:
    return [torch.empty_like(t) for t in (x, h0, c0, *weights)]


def _setup(ctx: torch.autograd.function.FunctionCtx, inputs: tuple, output: tuple) -> None:
    x, h0, c0, weights, batch_first = inputs
    ctx.save_for_backward(x, h0, c0, *weights)
    ctx.batch_first = batch_first


def _backward(ctx: torch.autograd.function.FunctionCtx, grad_out: torch.Tensor | None, grad_h: torch.Tensor | None,
              grad_c: torch.Tensor | None) -> tuple:
    x, h0, c0, *weights = ctx.saved_tensors
    if grad_out is None:  # an output the loss did not use
        grad_out = x.new_zeros((*x.shape[:-1], h0.shape[-1]))
    grads = _lstm_layer_backward(x, h0, c0, weights, ctx.batch_first, grad_out,
                                 torch.zeros_like(h0) if grad_h is None else grad_h,
                                 torch.zeros_like(c0) if grad_c is None else grad_c)
    return grads[0], grads[1], grads[2], list(grads[3:]), None


_lstm_layer.register_autograd(_backward, setup_context=_setup)


def lstm_layer(x: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor] | None, weights: list[torch.Tensor],
               batch_first: bool = True, training: bool = True
               ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """One unidirectional LSTM layer, (out, (h, c)) with h and c [1, B, H]: the opaque operator while
    compiling, torch.lstm otherwise. `weights` are (w_ih, w_hh[, b_ih, b_hh]); no projections."""
    hidden = weights[1].shape[1]
    if state is None:
        zeros = x.new_zeros(1, x.shape[0 if batch_first else 1], hidden)
        state = (zeros, zeros)
    if not torch.compiler.is_compiling():
        out, h, c = torch.lstm(x, state, weights, len(weights) == 4, 1, 0.0, training, False, batch_first)
        return out, (h, c)
    kind = x.device.type
    if torch.is_autocast_enabled(kind):  # torch.lstm runs in autocast's lower precision
        dtype = torch.get_autocast_dtype(kind)
        x, state, weights = x.to(dtype), (state[0].to(dtype), state[1].to(dtype)), [w.to(dtype) for w in weights]
    out, h, c = torch.ops.trainperf.lstm_layer(x, state[0], state[1], weights, batch_first)
    return out, (h, c)


class LSTM(nn.LSTM):
    """nn.LSTM that compiles as one operator per layer (see the module's docstring); eager, nn.LSTM itself.
    Compiled: padded tensors (no PackedSequence), unidirectional, no projections."""

    def forward(self, input: torch.Tensor, hx: tuple[torch.Tensor, torch.Tensor] | None = None  # noqa: A002
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        if (not torch.compiler.is_compiling() or not isinstance(input, torch.Tensor) or self.bidirectional
                or self.proj_size or input.dim() != 3):
            return super().forward(input, hx)
        x, hs, cs = input, [], []
        for layer in range(self.num_layers):
            if layer and self.dropout:
                x = nn.functional.dropout(x, self.dropout, self.training)
            weights = [getattr(self, f"{name}_l{layer}") for name in
                       (("weight_ih", "weight_hh", "bias_ih", "bias_hh") if self.bias else ("weight_ih", "weight_hh"))]
            state = None if hx is None else (hx[0][layer:layer + 1], hx[1][layer:layer + 1])
            x, (h, c) = lstm_layer(x, state, weights, self.batch_first, self.training)
            hs.append(h)
            cs.append(c)
        return x, (torch.cat(hs), torch.cat(cs))
