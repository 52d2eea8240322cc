"""HSTU as the DLRMv4 reference configures it (mlcommons/training PR #889, `generative_recommenders/modules/`:
`dlrm_hstu.py`, `preprocessors.py`, `action_encoder.py`, `positional_encoder.py`, `stu.py`, `postprocessors.py`,
`multitask_module.py`; the yambda-5b configuration of `dlrm_v4/configs.py` and `train/gin/yambda_5b.gin`).

A sample's sequence is [8 contextual slots (the user, 7 crossed ids: one projection each), the history in time
order, the candidate]. Every history and candidate position is the sum of three MLPs over its item's, its
artist and album's and its action's embeddings (the candidate's action is a learned target embedding: its
label is never read); the whole sequence is scaled by sqrt(d), given position (distance from the candidate)
and time (sqrt of the minutes before the query time) embeddings, and dropped out. Each STU layer:
u, v, q, k = LN(x) W + b; attention silu(q.k / sqrt(d_qk)) / N without softmax over the causal prefix (N the
batch's longest sequence; with one candidate the reference's target-aware mask is the causal one); y = silu(u)
* LN(attention); x + dropout([silu(u), attention, y]) W_out. The candidate's output, with hour-of-day and
day-of-week features, is projected and normalised, multiplied by the item tower's output, and the head gives
the listen_plus logit. Tables: TorchRec's EmbeddingCollection on the meta device (the runtime shards them).

Here the sequences are padded to `max_seq_len` (static shapes); the reference's jagged Triton kernels skip the
padding. The math is the same."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from trainperf.workloads.dlrmv4.data import Batch

CONTEXT_NAMES = ("uid",)  # then the crossed tables' names, in their order
HISTORY_FEATURES = ("item_id", "artist_id", "album_id")
CANDIDATE_FEATURES = ("item_candidate_id", "item_candidate_artist_id", "item_candidate_album_id")
ACTION_BITS = (1, 2, 4)
TWO_PI = 2 * 3.14  # the reference's time features use 3.14


class SwishLayerNorm(nn.Module):
    """x * sigmoid(LN(x)): the reference's SwishLayerNorm (not silu of the norm)."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim, eps=eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(self.norm(x))


def _mlp(sizes: Sequence[int], last_norm: bool = True) -> nn.Sequential:
    """Linear -> SwishLN -> Linear (-> LayerNorm): the reference's tower shape, xavier-uniform, biases 0."""
    a, b, c = sizes
    layers: list[nn.Module] = [nn.Linear(a, b), SwishLayerNorm(b), nn.Linear(b, c)]
    if last_norm:
        layers.append(nn.LayerNorm(c, eps=1e-5))
    net = nn.Sequential(*layers)
    for m in net.modules():
        if isinstance(m, nn.Linear):
            nn.init.xavier_uniform_(m.weight)
            nn.init.zeros_(m.bias)
    return net


class STULayer(nn.Module):
    def __init__(self, dim: int, heads: int, qk_dim: int, linear_dim: int, dropout: float) -> None:
        super().__init__()
        self.heads, self.qk_dim, self.linear_dim, self.dropout = heads, qk_dim, linear_dim, dropout
        self.input_norm = nn.LayerNorm(dim, eps=1e-6)
        self.uvqk = nn.Parameter(torch.empty(dim, heads * (2 * linear_dim + 2 * qk_dim)))
        self.uvqk_beta = nn.Parameter(torch.zeros(heads * (2 * linear_dim + 2 * qk_dim)))
        self.output_norm = nn.LayerNorm(heads * linear_dim, eps=1e-6)
        self.output = nn.Parameter(torch.empty(3 * heads * linear_dim, dim))
        nn.init.xavier_uniform_(self.uvqk)
        nn.init.xavier_uniform_(self.output)

    def forward(self, x: torch.Tensor, mask: torch.Tensor, divisor: torch.Tensor) -> torch.Tensor:
        """x [B, S, D]; mask [B, 1, S, S] (True: may attend); divisor [B, 1, 1, 1]: the batch's longest length."""
        b, s, _ = x.shape
        hv, hq = self.heads * self.linear_dim, self.heads * self.qk_dim
        u, v, q, k = torch.split(torch.addmm(self.uvqk_beta, self.input_norm(x).reshape(b * s, -1), self.uvqk),
                                 [hv, hv, hq, hq], dim=1)
        u = F.silu(u)
        q = q.reshape(b, s, self.heads, self.qk_dim).transpose(1, 2)
        k = k.reshape(b, s, self.heads, self.qk_dim).transpose(1, 2)
        v = v.reshape(b, s, self.heads, self.linear_dim).transpose(1, 2)
        scores = F.silu(torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.qk_dim)) / divisor
        attn = torch.matmul(scores * mask, v).transpose(1, 2).reshape(b * s, hv)
        y = u * self.output_norm(attn)
        z = F.dropout(torch.cat([u, attn, y], dim=1), p=self.dropout, training=self.training)
        return x + (z @ self.output).reshape(b, s, -1)


class HSTU(nn.Module):
    def __init__(self, id_tables: Sequence[int], cross_tables: Sequence[tuple[str, int]], embedding_dim: int,
                 model_dim: int, layers: int, heads: int, qk_dim: int, linear_dim: int, hidden_dim: int,
                 item_hidden: int, input_dropout: float, linear_dropout: float, action_dim: int, max_seq_len: int,
                 position_buckets: int, time_buckets: int, device: torch.device, max_rows: int = 0) -> None:
        super().__init__()
        from torchrec import EmbeddingCollection, EmbeddingConfig

        # max_rows > 0: every table capped at that many rows and ids taken modulo it (a full-shape model on a
        # machine that cannot hold the tables: not the reference model).
        self.max_rows = max_rows
        if max_rows:
            id_tables = [min(n, max_rows) for n in id_tables]
            cross_tables = [(name, min(n, max_rows)) for name, n in cross_tables]
        items, artists, albums, users = id_tables
        self.context_names = [*CONTEXT_NAMES, *(name for name, _ in cross_tables)]
        self.contexts, self.max_seq_len, self.input_dropout = len(self.context_names), max_seq_len, input_dropout
        self.sequence_len = max_seq_len - self.contexts  # history + candidate
        self.position_buckets, self.time_buckets, self.dim = position_buckets, time_buckets, model_dim
        e, d = embedding_dim, model_dim

        def table(name: str, rows: int, features: list[str]) -> EmbeddingConfig:
            # TorchRec's default: U(-1/sqrt(rows), 1/sqrt(rows)), the reference's bounds.
            return EmbeddingConfig(name=name, embedding_dim=e, num_embeddings=rows, feature_names=features)

        self.tables = EmbeddingCollection(tables=[
            table("item_id", items, ["item_id", "item_candidate_id"]),
            table("artist_id", artists, ["artist_id", "item_candidate_artist_id"]),
            table("album_id", albums, ["album_id", "item_candidate_album_id"]),
            table("uid", users, ["uid"]),
            *(table(name, rows, [name]) for name, rows in cross_tables)], need_indices=False,
            device=torch.device("meta"))
        with torch.device(device):
            # The contextual slots' projections: one matrix each, N(0, 2 / (e + d)), biases 0.
            self.context_weight = nn.Parameter(torch.randn(self.contexts, e, d) * math.sqrt(2.0 / (e + d)))
            self.context_bias = nn.Parameter(torch.zeros(self.contexts, d))
            self.content_mlp = _mlp((e, hidden_dim, d))
            self.additional_mlp = _mlp((2 * e, hidden_dim, d))  # artist and album side by side
            self.action_table = nn.Parameter(torch.randn(len(ACTION_BITS), action_dim) * 0.1)
            self.target_action = nn.Parameter(torch.randn(1, len(ACTION_BITS) * action_dim) * 0.1)
            self.action_mlp = _mlp((len(ACTION_BITS) * action_dim, hidden_dim, d))
            self.register_buffer("action_bits", torch.tensor(ACTION_BITS), persistent=False)
            bound_p, bound_t = math.sqrt(1.0 / position_buckets), math.sqrt(1.0 / time_buckets)
            self.position = nn.Parameter(torch.empty(position_buckets, d).uniform_(-bound_p, bound_p))
            self.time = nn.Parameter(torch.empty(time_buckets + 1, d).uniform_(-bound_t, bound_t))
            self.blocks = nn.ModuleList(STULayer(d, heads, qk_dim, linear_dim, linear_dropout) for _ in range(layers))
            self.time_combiner = nn.Linear(d + 4, d)
            nn.init.zeros_(self.time_combiner.bias)
            self.output_norm = nn.LayerNorm(d, eps=1e-5)
            self.item_mlp = _mlp((3 * e, item_hidden, d))
            self.head = _mlp((d, item_hidden, 1), last_norm=False)
            # The transducer's own modules' Linear weights are drawn again, xavier-normal (HSTUTransducer's
            # __init__): the preprocessor's MLPs and the time combiner, not the STU, item tower or head.
            for module in (self.content_mlp, self.additional_mlp, self.action_mlp, self.time_combiner):
                for m in module.modules():
                    if isinstance(m, nn.Linear):
                        nn.init.xavier_normal_(m.weight)
            self.register_buffer("slots", torch.arange(max_seq_len), persistent=False)

    def _lookup(self, batch: Batch) -> dict[str, torch.Tensor]:
        from torchrec import KeyedJaggedTensor

        n = len(batch)
        keys = [*self.context_names, *HISTORY_FEATURES, *CANDIDATE_FEATURES]
        context = batch.context.t().reshape(-1)  # feature-major: each slot's n ids
        candidates = batch.candidates.t().reshape(-1)
        values = torch.cat([context, batch.items, batch.artists, batch.albums, candidates])
        if self.max_rows:
            values = torch.remainder(values, self.max_rows)
        ones = torch.ones(n * self.contexts, dtype=torch.int64, device=values.device)
        lengths = torch.cat([ones, batch.lengths.repeat(3), ones[: 3 * n]])
        total = batch.items.shape[0]  # known on the host: no read back of the lengths
        per_key = [n] * self.contexts + [total] * 3 + [n] * 3
        offsets = [0]
        for count in per_key:
            offsets.append(offsets[-1] + count)
        kjt = KeyedJaggedTensor(keys=keys, values=values, lengths=lengths, length_per_key=per_key,
                                offset_per_key=offsets, stride=n)
        out = self.tables(kjt)
        return {key: out[key].values() for key in keys}

    def forward(self, batch: Batch) -> torch.Tensor:
        """The listen_plus logits [B]."""
        emb = self._lookup(batch)
        n, s, d, c = len(batch), self.sequence_len, self.dim, self.contexts
        lengths = batch.lengths
        # Where each history value and each candidate sits in the padded [n, s] merged sequence.
        starts = torch.cumsum(lengths, 0) - lengths
        row = torch.repeat_interleave(torch.arange(n, device=lengths.device), lengths,
                                      output_size=batch.items.shape[0])
        flat_history = row * s + torch.arange(batch.items.shape[0], device=lengths.device) - starts[row]
        flat_candidate = torch.arange(n, device=lengths.device) * s + lengths

        def merged(history: torch.Tensor, candidate: torch.Tensor) -> torch.Tensor:
            out = history.new_zeros((n * s, *history.shape[1:]))
            out = out.index_copy(0, flat_history, history).index_copy(0, flat_candidate, candidate)
            return out.reshape(n, s, *history.shape[1:])

        item = merged(emb["item_id"], emb["item_candidate_id"])
        side = merged(torch.cat([emb["artist_id"], emb["album_id"]], 1),
                      torch.cat([emb["item_candidate_artist_id"], emb["item_candidate_album_id"]], 1))
        bits = (batch.actions.unsqueeze(1) & self.action_bits) > 0
        action = (bits.unsqueeze(-1) * self.action_table).reshape(bits.shape[0], -1)
        action = merged(action, self.target_action.expand(n, -1))
        x = self.content_mlp(item) + self.additional_mlp(side) + self.action_mlp(action)
        context = torch.stack([emb[name] for name in self.context_names], 1)  # [n, c, e]
        context = torch.einsum("nce,ced->ncd", context.to(x.dtype), self.context_weight.to(x.dtype)) \
            + self.context_bias.to(x.dtype)
        x = torch.cat([context, x], 1)  # [n, max_seq_len, d]

        times = merged(batch.times, batch.query_time)
        times = torch.cat([times.new_zeros(n, c), times], 1)
        slot = self.slots.unsqueeze(0)
        high = (c + lengths).unsqueeze(1)  # the candidate's slot
        distance = (high - torch.minimum(slot, high) + c).clamp(max=self.position_buckets - 1)
        position = torch.where(slot < c, slot, distance)
        minutes = (batch.query_time.unsqueeze(1) - times).clamp(min=1e-6) / 60.0
        bucket = torch.sqrt(minutes).long().clamp(0, self.time_buckets)
        x = x * math.sqrt(d) + (self.position[position] + self.time[bucket]).to(x.dtype)
        x = F.dropout(x, p=self.input_dropout, training=self.training)

        valid = slot <= high  # the contextual slots, the history and the candidate
        causal = self.slots.unsqueeze(1) >= self.slots.unsqueeze(0)  # [s, s]
        mask = causal.unsqueeze(0) & valid.unsqueeze(1)  # [n, s, s]: key j valid and j <= i
        divisor = (lengths.max() + 1 + c).to(x.dtype).reshape(1, 1, 1, 1)  # the batch's longest sequence
        mask = mask.unsqueeze(1).to(x.dtype)
        for block in self.blocks:
            x = block(x, mask, divisor)

        user = x[torch.arange(n, device=x.device), c + lengths]  # the candidates' rows
        t = batch.query_time.unsqueeze(1)
        angles = torch.cat([torch.div(t, 3600, rounding_mode="floor") % 24 / 24.0,
                            torch.div(t, 86_400, rounding_mode="floor") % 7 / 7.0], 1).float() * TWO_PI
        features = torch.stack([torch.cos(angles), torch.sin(angles)], -1).reshape(n, 4)
        user = self.output_norm(self.time_combiner(torch.cat([user, features.to(user.dtype)], 1)))
        # The transducer's output rounded to its activations' dtype, then the item tower, the head and the loss
        # in fp32 whatever the precision: the reference runs them outside its autocast.
        if torch.is_autocast_enabled(user.device.type):
            user = user.to(torch.get_autocast_dtype(user.device.type))
        user = user.float()
        with torch.autocast(user.device.type, enabled=False):
            item_out = self.item_mlp(torch.cat([emb[name].float() for name in CANDIDATE_FEATURES], 1))
            return self.head(user * item_out).squeeze(-1)


def parameter_count(recipe_tables: Sequence[int], embedding_dim: int, dense: nn.Module) -> dict[str, int]:
    """Parameters by part: the tables (rows x width) and the dense model (everything else)."""
    return {"embeddings": sum(recipe_tables) * embedding_dim,
            "dense": sum(p.numel() for name, p in dense.named_parameters() if not name.startswith("tables."))}
