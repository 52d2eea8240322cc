"""GNMT v2 as the MLPerf reference builds it (seq2seq "gnmt" with gnmt_v2 attention): a shared
source/target embedding; an encoder of 4 LSTM layers, the first bidirectional, residual connections
from the third; a decoder of 4 LSTM layers whose first layer's output queries a normalized Bahdanau
attention over the encoder outputs, the attention context concatenated to the inputs of layers 2-4,
residuals from the third; dropout on every layer's input; a linear classifier. Parameters start
uniform in [-0.1, 0.1], the attention's normalisation scalar at 1/sqrt(hidden), its bias at 0.

Decoding keeps each decoder layer's LSTM state (the incremental cache); `GNMTStepper(cached=False)`
re-runs the decoder over every target token at each step instead (the check for the cache)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from trainperf.workloads.common.rnn import LSTM, lstm_layer
from trainperf.workloads.common.wmt.text import BOS, EOS, PAD


class NormalizedBahdanau(nn.Module):
    """score(q, k) = g * v / |v| . tanh(W_q q + W_k k + b), softmax over the real source positions."""

    def __init__(self, hidden: int, scale: float) -> None:
        super().__init__()
        self.query = nn.Linear(hidden, hidden, bias=False)
        self.key = nn.Linear(hidden, hidden, bias=False)
        self.v = nn.Parameter(torch.empty(hidden))
        self.bias = nn.Parameter(torch.zeros(hidden))
        self.gain = nn.Parameter(torch.tensor(scale))

    def forward(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """q [B, T, H], keys (projected) [B, S, H], values [B, S, H], mask [B, S] True where real ->
        (context [B, T, H], attention [B, T, S])."""
        v = self.gain * self.v / self.v.norm()
        scores = torch.tanh(self.query(q).unsqueeze(2) + keys.unsqueeze(1) + self.bias) @ v  # [B, T, S]
        scores = scores.masked_fill(~mask.unsqueeze(1), -math.inf)
        attention = scores.softmax(-1)
        return attention @ values, attention


class Encoder(nn.Module):
    def __init__(self, hidden: int, dropout: float) -> None:
        super().__init__()
        self.layers = nn.ModuleList([LSTM(hidden, hidden, batch_first=True, bidirectional=True),
                                     LSTM(2 * hidden, hidden, batch_first=True),
                                     LSTM(hidden, hidden, batch_first=True),
                                     LSTM(hidden, hidden, batch_first=True)])
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, lengths: list[int], real: torch.Tensor) -> torch.Tensor:
        """`lengths` on the host (a list): packing needs them there; `real`, the same lengths on the device.

        Each layer packs the sentences sorted by length, as pack_padded_sequence(enforce_sorted=False)
        would, but the permutation is made here once, on the device from `real` (a stable sort, as the
        host's order of `lengths`): torch's own unsorted packing moves its sorted indices to the device and
        reads the inverse back to the host in every layer, and a permutation made on the host is a copy
        that waits for the device (on a GPU, a synchronisation each)."""
        order = sorted(range(len(lengths)), key=lambda i: -lengths[i])  # stable: ties keep their order
        sort = torch.sort(real, descending=True, stable=True).indices
        unsort = torch.empty_like(sort).scatter_(0, sort, torch.arange(len(order), device=sort.device))
        sorted_lengths = [lengths[i] for i in order]
        for i, lstm in enumerate(self.layers):
            packed = pack_padded_sequence(self.drop(x).index_select(0, sort), sorted_lengths, batch_first=True)
            out, _ = lstm(packed)
            out, _ = pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])
            out = out.index_select(0, unsort)
            x = out + x if i >= 2 else out
        return x


    def padded(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """The same layers over padded rows, without packing (static shapes: --static-shapes, --cuda-graphs):
        `lengths` a device tensor [B]. A forward LSTM's outputs at real positions do not depend on what follows
        them; the backward direction runs on each row reversed within its length, its output reversed back.
        Padded positions hold values the attention's mask never reads: the loss is the packed path's."""
        for i, lstm in enumerate(self.layers):
            inp = self.drop(x)
            out = _bidirectional(lstm, inp, lengths) if lstm.bidirectional else lstm(inp)[0]
            x = out + x if i >= 2 else out
        return x


def _reverse_within(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Each row's first lengths[b] positions in reverse order, the rest where they are (its own inverse)."""
    t = torch.arange(x.shape[1], device=x.device)
    index = torch.where(t < lengths[:, None], lengths[:, None] - 1 - t, t)  # [B, T]
    return x.gather(1, index[..., None].expand_as(x))


def _bidirectional(lstm: nn.LSTM, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """One bidirectional layer over padded rows: each direction with its own weights (one LSTM layer each)."""
    zeros = x.new_zeros(1, x.shape[0], lstm.hidden_size)
    outputs = []
    for suffix, rows in (("", x), ("_reverse", _reverse_within(x, lengths))):
        weights = [getattr(lstm, f"{name}_l0{suffix}") for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
        out = lstm_layer(rows, (zeros, zeros), weights, batch_first=True, training=lstm.training)[0]
        outputs.append(out if not suffix else _reverse_within(out, lengths))
    return torch.cat(outputs, dim=-1)


class Decoder(nn.Module):
    def __init__(self, hidden: int, dropout: float, attention_scale: float) -> None:
        super().__init__()
        self.first = LSTM(hidden, hidden, batch_first=True)
        self.attention = NormalizedBahdanau(hidden, attention_scale)
        self.layers = nn.ModuleList(LSTM(2 * hidden, hidden, batch_first=True) for _ in range(3))
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, keys: torch.Tensor, memory: torch.Tensor, mask: torch.Tensor,
                state: list | None = None) -> tuple[torch.Tensor, torch.Tensor, list]:
        """x: embedded targets [B, T, H] -> (outputs [B, T, H], attention [B, T, S], new states)."""
        state = state or [None] * 4
        out, s0 = self.first(self.drop(x), state[0])
        context, attention = self.attention(out, keys, memory, mask)
        states = [s0]
        x = out
        for i, lstm in enumerate(self.layers):
            y, s = lstm(self.drop(torch.cat([x, context], dim=-1)), state[i + 1])
            states.append(s)
            x = y + x if i >= 1 else y  # residuals from the third decoder layer
        return x, attention, states


class GNMT(nn.Module):
    def __init__(self, vocab: int, hidden: int = 1024, dropout: float = 0.2, init_scale: float = 0.1,
                 attention_scale: float | None = None, forget_bias: float = 0.0) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden, padding_idx=PAD)  # shared by encoder and decoder
        self.encoder = Encoder(hidden, dropout)
        self.decoder = Decoder(hidden, dropout, attention_scale if attention_scale else hidden ** -0.5)
        self.classifier = nn.Linear(hidden, vocab)
        for name, p in self.named_parameters():
            if name.endswith("attention.gain") or name.endswith("attention.bias"):
                continue
            nn.init.uniform_(p, -init_scale, init_scale)
        if forget_bias:
            for module in self.modules():
                if isinstance(module, nn.LSTM):
                    for name, p in module.named_parameters():
                        if name.startswith("bias_ih"):  # gates i, f, g, o: the forget gate is the 2nd quarter
                            with torch.no_grad():
                                p[p.shape[0] // 4:p.shape[0] // 2].fill_(forget_bias)
                        elif name.startswith("bias_hh"):
                            with torch.no_grad():
                                p[p.shape[0] // 4:p.shape[0] // 2].zero_()

    def encode(self, src: torch.Tensor, lengths: list[int] | torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """-> (memory [B, S, H], projected keys, mask [B, S]). Without the sources' `lengths` (known on
        the host where batches are made), they are read back from the device once; given as a device
        tensor, the encoder runs unpacked (Encoder.padded)."""
        mask = src != PAD
        if isinstance(lengths, torch.Tensor):  # static shapes: padded rows, no packing
            memory = self.encoder.padded(self.embed(src), lengths)
            return memory, self.decoder.attention.key(memory), mask
        real = mask.sum(1)
        if lengths is None:
            lengths = real.tolist()
        memory = self.encoder(self.embed(src), lengths, real)
        return memory, self.decoder.attention.key(memory), mask

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor, src_lengths: list[int] | torch.Tensor | None = None
                ) -> torch.Tensor:
        memory, keys, mask = self.encode(src, src_lengths)
        out, _, _ = self.decoder(self.embed(tgt_in), keys, memory, mask)
        return self.classifier(out)


class GNMTStepper:
    """Beam-search steps (see wmt.beam.Stepper), returning the attention for the coverage penalty."""

    def __init__(self, model: GNMT, src: torch.Tensor, beam: int, cached: bool = True) -> None:
        self.model, self.cached = model, cached
        memory, keys, mask = model.encode(src)
        self.memory, self.keys = memory.repeat_interleave(beam, 0), keys.repeat_interleave(beam, 0)
        self.mask = mask.repeat_interleave(beam, 0)
        self.state: list | None = None

    def step(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        model = self.model
        if self.cached:
            out, attention, self.state = model.decoder(model.embed(tokens[:, -1:]), self.keys, self.memory,
                                                       self.mask, self.state)
        else:
            out, attention, _ = model.decoder(model.embed(tokens), self.keys, self.memory, self.mask)
        return F.log_softmax(model.classifier(out[:, -1]).float(), dim=-1), attention[:, -1]

    def keep(self, index: torch.Tensor) -> None:
        self.memory, self.keys, self.mask = self.memory[index], self.keys[index], self.mask[index]
        if self.state is not None:
            self.state = [(h[:, index], c[:, index]) for h, c in self.state]


def translate(model: GNMT, src: torch.Tensor, beam: int, alpha: float, lp_constant: float, coverage: float,
              max_length: int, cached: bool = True) -> list[list[int]]:
    """Token ids of each source's translation: beam search with GNMT's length normalisation and
    coverage penalty (greedy when beam is 1), at most max_length tokens, EOS included."""
    from trainperf.workloads.common.wmt import beam as beam_search

    limit = torch.full((src.shape[0],), max_length, device=src.device)
    stepper = GNMTStepper(model, src, beam, cached)
    if beam == 1:
        return beam_search.greedy_search(stepper, src.shape[0], limit, BOS, EOS)
    return beam_search.beam_search(stepper, src.shape[0], beam, limit, BOS, EOS, alpha=alpha, lp_constant=lp_constant,
                         coverage=coverage, source_mask=src != PAD)
