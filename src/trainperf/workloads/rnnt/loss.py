"""The RNN-T transducer loss (Graves 2012) in pure PyTorch, computed along anti-diagonals.

The forward variable alpha(t, u) depends on alpha(t-1, u) and alpha(t, u-1): every node of one
anti-diagonal t + u = n depends only on the previous diagonal, so a diagonal is one vectorised step
over (batch, U+1) and the lattice takes T + U steps instead of T x U (the wavefront NVIDIA's fused
transducer loss uses). The backward variable beta runs the same wavefront from the far corner.

Only two values per lattice node are read from the joint output: the blank's and the next label's
log-probability (logit minus the node's log-sum-exp); no log-softmax of the joint is kept. The
gradient is the analytic one from alpha and beta (a node's occupancy times the softmax, minus the
occupancy of its blank and label edges), written once into a tensor the size of the joint output.
`transducer_loss_reference` is the straightforward float64 loop that the tests check it against.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from trainperf.errors import TrainperfError

NEG_INF = float("-inf")


def _skew(x: torch.Tensor) -> torch.Tensor:
    """(B, T, U1) -> (B, T + U1 - 1, U1) with out[b, n, u] = x[b, n - u, u] (-inf off the lattice)."""
    b, t, u1 = x.shape
    n = torch.arange(t + u1 - 1, device=x.device)[:, None]
    u = torch.arange(u1, device=x.device)[None, :]
    ti = n - u
    valid = (ti >= 0) & (ti < t)
    out = x.gather(1, ti.clamp(0, t - 1)[None].expand(b, -1, -1))
    return out.masked_fill(~valid[None], NEG_INF)


def _unskew(d: torch.Tensor, t: int) -> torch.Tensor:
    """(B, T + U1 - 1, U1) -> (B, T, U1): the inverse of `_skew`."""
    b, _, u1 = d.shape
    n = torch.arange(t, device=d.device)[:, None] + torch.arange(u1, device=d.device)[None, :]
    return d.gather(1, n[None].expand(b, -1, -1))


def _lattice(blank: torch.Tensor, label: torch.Tensor, frames: torch.Tensor, labels: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """alpha, beta (B, T, U1) and log Z (B,) from the blank and label log-probabilities of every node.
    Edges that leave a sample's lattice (t >= T_b, u >= U_b) are cut; the final blank of
    (T_b - 1, U_b) is the terminal of beta."""
    b, t, u1 = blank.shape
    tt = torch.arange(t, device=blank.device)[None, :, None]
    uu = torch.arange(u1, device=blank.device)[None, None, :]
    last_t = (frames - 1)[:, None, None]
    inside = (tt <= last_t) & (uu <= labels[:, None, None])
    blank_edge = blank.masked_fill(~inside | (tt >= last_t), NEG_INF)
    label_edge = label.masked_fill(~inside | (uu >= labels[:, None, None]), NEG_INF)
    terminal = blank.masked_fill(~((tt == last_t) & (uu == labels[:, None, None])), NEG_INF)
    sb, sl, st = _skew(blank_edge), _skew(label_edge), _skew(terminal)
    diagonals = t + u1 - 1
    # The loops below run T + U times, so each diagonal costs as few operators as it can: the views of
    # every diagonal are taken once (unbind), and each step writes into preallocated tensors (out=):
    # three kernels per diagonal for alpha, four for beta (a GPU launches each; ~16 dispatches before).
    sb_rows, sl_heads, st_rows = sb.unbind(1), sl[:, :, :-1].unbind(1), st.unbind(1)
    stay, shifted, both = blank.new_empty((b, u1)), blank.new_full((b, u1), NEG_INF), blank.new_empty((b, u1))

    alpha_d = blank.new_full((b, diagonals, u1), NEG_INF)
    alpha_d[:, 0, 0] = 0.0
    alpha_rows, alpha_heads = alpha_d.unbind(1), alpha_d[:, :, :-1].unbind(1)
    into_tail = shifted[:, 1:]  # column 0 stays -inf: (t, -1) does not exist
    for n in range(1, diagonals):
        torch.add(alpha_rows[n - 1], sb_rows[n - 1], out=stay)  # (t-1, u) --blank--> (t, u): same u
        torch.add(alpha_heads[n - 1], sl_heads[n - 1], out=into_tail)  # (t, u-1) --label--> (t, u)
        torch.logaddexp(stay, shifted, out=alpha_rows[n])

    beta_d = st.clone()  # the terminal blank of each sample's lattice, -inf elsewhere
    beta_rows, beta_tails = beta_d.unbind(1), beta_d[:, :, 1:].unbind(1)
    shifted.fill_(NEG_INF)
    into_head = shifted[:, :-1]  # the last column stays -inf: (t, U1) does not exist
    for n in range(diagonals - 2, -1, -1):
        torch.add(sb_rows[n], beta_rows[n + 1], out=stay)  # (t, u) --blank--> (t+1, u)
        torch.add(sl_heads[n], beta_tails[n + 1], out=into_head)  # (t, u) --label--> (t, u+1)
        torch.logaddexp(stay, shifted, out=both)
        torch.logaddexp(both, st_rows[n], out=beta_rows[n])
    return _unskew(alpha_d, t), _unskew(beta_d, t), beta_d[:, 0, 0]


def _forward_parts(logits: torch.Tensor, targets: torch.Tensor, frames: torch.Tensor, labels: torch.Tensor,
                   blank: int) -> tuple[torch.Tensor, ...]:
    """Each utterance's loss and what its gradient needs: (loss, lse, lp_blank, lp_label, alpha, beta,
    next_label)."""
    b, t, u1, _v = logits.shape
    work = logits if logits.dtype == torch.float64 else logits.float()
    lse = torch.logsumexp(work, dim=-1)  # (B, T, U1)
    lp_blank = work[..., blank] - lse
    next_label = torch.cat([targets[:, : u1 - 1], targets.new_full((b, 1), blank)], dim=1).long()
    next_label = next_label.clamp(0, work.shape[-1] - 1)
    lp_label = work.gather(3, next_label[:, None, :, None].expand(b, t, u1, 1)).squeeze(3) - lse
    alpha, beta, log_z = _lattice(lp_blank, lp_label, frames, labels)
    return -log_z, lse, lp_blank, lp_label, alpha, beta, next_label


def _gradient(grad_out: torch.Tensor, logits: torch.Tensor, lse: torch.Tensor, lp_blank: torch.Tensor,
              lp_label: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor, loss: torch.Tensor,
              next_label: torch.Tensor, frames: torch.Tensor, labels: torch.Tensor, blank: int) -> torch.Tensor:
    """d(grad_out . loss)/d logits from the lattice's alpha and beta."""
    b, t, u1, _v = logits.shape
    z = -loss[:, None, None]
    node = torch.exp(alpha + beta - z)  # the probability that the path visits (t, u)
    after_blank = torch.cat([beta[:, 1:], beta.new_full((b, 1, u1), NEG_INF)], dim=1)
    terminal = (torch.arange(t, device=beta.device)[None, :, None] == (frames - 1)[:, None, None]) & (
        torch.arange(u1, device=beta.device)[None, None, :] == labels[:, None, None])
    after_blank = after_blank.masked_fill(terminal, 0.0)
    after_label = torch.cat([beta[:, :, 1:], beta.new_full((b, t, 1), NEG_INF)], dim=2)
    blank_flow = torch.exp(alpha + lp_blank + after_blank - z)
    label_flow = torch.exp(alpha + lp_label + after_label - z)
    label_flow = label_flow.masked_fill(
        torch.arange(u1, device=beta.device)[None, None, :] >= labels[:, None, None], 0.0)
    scale = grad_out.to(lse.dtype)[:, None, None]
    # d(-log Z)/d logit_k at a node: occupancy * softmax_k - flow of the edges that emit k.
    grad = torch.exp(logits.to(lse.dtype) - lse[..., None]).mul_((node * scale)[..., None])
    grad[..., blank] -= blank_flow * scale
    grad.scatter_add_(3, next_label[:, None, :, None].expand(b, t, u1, 1), -(label_flow * scale)[..., None])
    return grad.to(logits.dtype)


class _TransducerLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, targets: torch.Tensor, frames: torch.Tensor,
                labels: torch.Tensor, blank: int) -> torch.Tensor:
        loss, *saved = _forward_parts(logits, targets, frames, labels, blank)
        lse, lp_blank, lp_label, alpha, beta, next_label = saved
        ctx.save_for_backward(logits, lse, lp_blank, lp_label, alpha, beta, loss, next_label, frames, labels)
        ctx.blank = blank
        return loss

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        return _gradient(grad_out, *ctx.saved_tensors, ctx.blank), None, None, None, None


# Compiled (--compile, --cuda-graphs), the loss is one operator to torch.compile: traced, the T + U diagonals
# would unroll into a graph of thousands of nodes per shape. Its kernels still run inside a captured CUDA
# graph (no read-back, no allocation that depends on the data); eagerly, the autograd.Function above runs
# the same code, its operators visible to the step counter.
@torch.library.custom_op("trainperf::transducer_lattice", mutates_args=())
def _lattice_op(logits: torch.Tensor, targets: torch.Tensor, frames: torch.Tensor, labels: torch.Tensor,
                blank: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                     torch.Tensor, torch.Tensor]:
    return _forward_parts(logits, targets, frames, labels, blank)


@_lattice_op.register_fake
def _(logits: torch.Tensor, targets: torch.Tensor, frames: torch.Tensor, labels: torch.Tensor, blank: int
      ) -> tuple[torch.Tensor, ...]:
    b, t, u1, _v = logits.shape
    dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    node = logits.new_empty((b, t, u1), dtype=dtype)
    return (logits.new_empty((b,), dtype=dtype), node, torch.empty_like(node), torch.empty_like(node),
            torch.empty_like(node), torch.empty_like(node), targets.new_empty((b, u1), dtype=torch.int64))


@torch.library.custom_op("trainperf::transducer_lattice_backward", mutates_args=())
def _gradient_op(grad_out: torch.Tensor, logits: torch.Tensor, lse: torch.Tensor, lp_blank: torch.Tensor,
                 lp_label: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor, loss: torch.Tensor,
                 next_label: torch.Tensor, frames: torch.Tensor, labels: torch.Tensor, blank: int) -> torch.Tensor:
    return _gradient(grad_out, logits, lse, lp_blank, lp_label, alpha, beta, loss, next_label, frames, labels, blank)


@_gradient_op.register_fake
def _(grad_out: torch.Tensor, logits: torch.Tensor, *rest: Any) -> torch.Tensor:
    return torch.empty_like(logits)


def _setup(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, ...]) -> None:
    logits, _targets, frames, labels, blank = inputs
    loss, lse, lp_blank, lp_label, alpha, beta, next_label = output
    ctx.save_for_backward(logits, lse, lp_blank, lp_label, alpha, beta, loss, next_label, frames, labels)
    ctx.blank = blank


def _backward(ctx: Any, grad_loss: torch.Tensor, *_unused: Any) -> tuple[torch.Tensor | None, ...]:
    return _gradient_op(grad_loss, *ctx.saved_tensors, ctx.blank), None, None, None, None


_lattice_op.register_autograd(_backward, setup_context=_setup)


def transducer_loss(logits: torch.Tensor, targets: torch.Tensor, frames: torch.Tensor, labels: torch.Tensor,
                    blank: int, reduction: str = "mean") -> torch.Tensor:
    """-log P(targets | inputs) of each utterance from joint-network logits.

    logits (B, T, U+1, V) (computed in fp32, or in fp64 for fp64 logits), targets (B, U) label ids (padding
    ignored), frames (B,) valid encoder frames, labels (B,) valid labels; `blank` the blank's id.
    reduction: "none" (B,), "sum", or "mean" over utterances.
    """
    if logits.dim() != 4 or targets.dim() != 2 or logits.shape[0] != targets.shape[0]:
        raise ValueError(f"transducer_loss: logits (B, T, U+1, V) and targets (B, U), got {tuple(logits.shape)} "
                         f"and {tuple(targets.shape)}")
    if logits.shape[2] != targets.shape[1] + 1:
        raise ValueError(f"transducer_loss: logits dim 2 must be targets' length + 1, got {logits.shape[2]} "
                         f"and {targets.shape[1]}")
    if torch.compiler.is_compiling():
        per = _lattice_op(logits, targets, frames.long(), labels.long(), blank)[0]
    else:
        per = _TransducerLoss.apply(logits, targets, frames.long(), labels.long(), blank)
    if reduction == "none":
        return per
    if reduction == "sum":
        return per.sum()
    if reduction == "mean":
        return per.mean()
    raise ValueError(f"transducer_loss: reduction {reduction!r} is not none, sum or mean")


def transducer_loss_reference(logits: torch.Tensor, targets: torch.Tensor, frames: torch.Tensor,
                              labels: torch.Tensor, blank: int) -> torch.Tensor:
    """The textbook recursion, one lattice node at a time in float64 (gradients by autograd):
    the oracle the wavefront loss is tested against, and the 'naive loop' it is timed against."""
    out = []
    log_probs = torch.log_softmax(logits.double(), dim=-1)
    for i in range(logits.shape[0]):
        t_len, u_len = int(frames[i]), int(labels[i])
        lp = log_probs[i]
        alpha: dict[tuple[int, int], torch.Tensor] = {(0, 0): lp.new_zeros(())}
        for t in range(t_len):
            for u in range(u_len + 1):
                if t == 0 and u == 0:
                    continue
                terms = []
                if t > 0:
                    terms.append(alpha[(t - 1, u)] + lp[t - 1, u, blank])
                if u > 0:
                    terms.append(alpha[(t, u - 1)] + lp[t, u - 1, int(targets[i, u - 1])])
                alpha[(t, u)] = torch.logsumexp(torch.stack(terms), dim=0)
        out.append(-(alpha[(t_len - 1, u_len)] + lp[t_len - 1, u_len, blank]))
    return torch.stack(out)


def transducer_loss_loop(logits: torch.Tensor, targets: torch.Tensor, frames: torch.Tensor, labels: torch.Tensor,
                         blank: int) -> torch.Tensor:
    """The same recursion as a loop over (t, u) vectorised over the batch (autograd for the gradient):
    the straightforward PyTorch port that `bench`'s comparison uses at full size."""
    b, t_max, u1, _v = logits.shape
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    lp_blank = log_probs[..., blank]
    nxt = torch.cat([targets[:, : u1 - 1], targets.new_full((b, 1), blank)], dim=1).long()
    lp_label = log_probs.gather(3, nxt[:, None, :, None].expand(b, t_max, u1, 1)).squeeze(3)
    rows: list[list[torch.Tensor]] = []
    for t in range(t_max):
        row: list[torch.Tensor] = []
        for u in range(u1):
            if t == 0 and u == 0:
                row.append(lp_blank.new_zeros(b))
                continue
            stay = rows[t - 1][u] + lp_blank[:, t - 1, u] if t > 0 else lp_blank.new_full((b,), NEG_INF)
            emit = row[u - 1] + lp_label[:, t, u - 1] if u > 0 else lp_blank.new_full((b,), NEG_INF)
            row.append(torch.logaddexp(stay, emit))
        rows.append(row)
    idx = torch.arange(b)
    alpha = torch.stack([torch.stack(r, dim=1) for r in rows], dim=1)
    end = alpha[idx, frames.long() - 1, labels.long()] + lp_blank[idx, frames.long() - 1, labels.long()]
    return -end


def torchaudio_rnnt_loss() -> Callable[..., torch.Tensor]:
    """torchaudio's rnnt_loss, or one line saying why it cannot be had: torchaudio builds pair with one
    torch release each, and none may exist for the torch installed (none for trainperf's pinned one)."""
    try:
        from torchaudio.functional import rnnt_loss
    # A torchaudio built for another torch fails at import with OSError or RuntimeError (undefined symbols).
    except (ImportError, OSError, RuntimeError) as exc:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
        raise TrainperfError(
            f"loss_impl=torchaudio: needs the torchaudio build of torch {torch.__version__.split('+')[0]}, and none "
            f"can be imported here ({reason}); torchaudio publishes no build for every torch release: use "
            "loss_impl=wavefront (trainperf's own transducer loss, the default)") from None
    return rnnt_loss
