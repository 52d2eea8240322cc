"""BERT for pretraining (masked LM + next-sentence prediction), in the parameter layout of Hugging Face's
`BertForPreTraining` (so its state dicts, and NVIDIA's converted phase-1 checkpoint, load by name).

Attention is `scaled_dot_product_attention` with a block-diagonal mask built from per-token sequence
ids, so one code path serves plain rows (one sequence each) and packed rows (several sequences in
one row, each with its own positions, segments and NSP label). The MLM head runs only on the masked
positions (gathered with fixed-size index tensors: no data-dependent shapes, no host sync), the NSP
head only on each sequence's [CLS]."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from trainperf.contract.fields import Count, Fraction
from trainperf.errors import TrainperfError

IGNORE = -100  # label of a padding slot (cross_entropy's ignore_index)


@dataclass(frozen=True)
class BertConfig:
    vocab_size: Count = 30522
    hidden: Count = 1024
    layers: Count = 24
    heads: Count = 16
    intermediate: Count = 4096
    max_positions: Count = 512
    type_vocab: int = 2
    dropout: Fraction = 0.1
    init_std: float = 0.02
    layer_norm_eps: float = 1e-12

    def validate(self) -> None:
        if self.hidden % self.heads:
            raise TrainperfError(f"BERT: hidden {self.hidden} must be divisible by heads {self.heads}")

    def flops_per_token(self, seq_len: int, predictions: int) -> float:
        """Training FLOPs per token (forward + backward = 3x forward): the encoder's matmuls and
        attention, and the MLM head on `predictions` masked positions of every `seq_len` tokens."""
        h, f = self.hidden, self.intermediate
        encoder = self.layers * (2 * (4 * h * h + 2 * h * f) + 4 * seq_len * h)
        head = predictions / seq_len * 2 * (h * h + h * self.vocab_size)
        return 3.0 * (encoder + head)


class SelfAttention(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.heads, self.dropout = cfg.heads, cfg.dropout
        self.query = nn.Linear(cfg.hidden, cfg.hidden)
        self.key = nn.Linear(cfg.hidden, cfg.hidden)
        self.value = nn.Linear(cfg.hidden, cfg.hidden)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape

        def split(y: torch.Tensor) -> torch.Tensor:
            return y.view(b, t, self.heads, d // self.heads).transpose(1, 2)

        y = F.scaled_dot_product_attention(split(self.query(x)), split(self.key(x)), split(self.value(x)),
                                           attn_mask=mask, dropout_p=self.dropout if self.training else 0.0)
        return y.transpose(1, 2).reshape(b, t, d)


class DenseNorm(nn.Module):
    """dense -> dropout -> residual add -> LayerNorm (BERT's post-LN sublayer output)."""

    def __init__(self, d_in: int, cfg: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(d_in, cfg.hidden)
        self.LayerNorm = nn.LayerNorm(cfg.hidden, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(x)) + residual)


class Attention(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.self = SelfAttention(cfg)
        self.output = DenseNorm(cfg.hidden, cfg)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.output(self.self(x, mask), x)


class Intermediate(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(cfg.hidden, cfg.intermediate)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.dense(x))


class Layer(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.attention = Attention(cfg)
        self.intermediate = Intermediate(cfg)
        self.output = DenseNorm(cfg.intermediate, cfg)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.attention(x, mask)
        return self.output(self.intermediate(x), x)


class Encoder(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList(Layer(cfg) for _ in range(cfg.layers))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        for layer in self.layer:
            x = layer(x, mask)
        return x


class Embeddings(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.position_embeddings = nn.Embedding(cfg.max_positions, cfg.hidden)
        self.token_type_embeddings = nn.Embedding(cfg.type_vocab, cfg.hidden)
        self.LayerNorm = nn.LayerNorm(cfg.hidden, eps=cfg.layer_norm_eps)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, ids: torch.Tensor, segments: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = self.word_embeddings(ids) + self.position_embeddings(positions) + self.token_type_embeddings(segments)
        return self.dropout(self.LayerNorm(x))


class Pooler(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(cfg.hidden, cfg.hidden)

    def forward(self, cls: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(cls))


class Bert(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.embeddings = Embeddings(cfg)
        self.encoder = Encoder(cfg)
        self.pooler = Pooler(cfg)


class Transform(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(cfg.hidden, cfg.hidden)
        self.LayerNorm = nn.LayerNorm(cfg.hidden, eps=cfg.layer_norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(F.gelu(self.dense(x)))


class Predictions(nn.Module):
    """The MLM head; its decoder is the word embedding matrix (tied), plus an output bias."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.transform = Transform(cfg)
        self.bias = nn.Parameter(torch.zeros(cfg.vocab_size))


class Heads(nn.Module):
    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.predictions = Predictions(cfg)
        self.seq_relationship = nn.Linear(cfg.hidden, 2)


class BertForPreTraining(nn.Module):
    """forward(batch) -> (MLM logits at the masked slots [B, M, V], NSP logits per sequence slot [B, S, 2]).

    batch (a dict of [rows, ...] tensors, see `trainperf.workloads.bert.batches`): input_ids,
    segment_ids, position_ids, sequence_ids (1.. for each sequence of a row, 0 for padding),
    masked_lm_positions [B, M], cls_positions [B, S]."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        cfg.validate()
        self.config = cfg
        self.bert = Bert(cfg)
        self.cls = Heads(cfg)
        self.apply(self._init)

    def _init(self, module: nn.Module) -> None:
        std = self.config.init_std
        if isinstance(module, nn.Linear):
            nn.init.trunc_normal_(module.weight, std=std, a=-2 * std, b=2 * std)
            nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.trunc_normal_(module.weight, std=std, a=-2 * std, b=2 * std)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)

    @staticmethod
    def attention_mask(sequence_ids: torch.Tensor) -> torch.Tensor:
        """[B, 1, L, L] boolean: a token attends to the tokens of its own sequence only. Padding (id 0)
        attends to padding, so that no row of the mask is empty (SDPA would return NaN there)."""
        return (sequence_ids[:, :, None] == sequence_ids[:, None, :]).unsqueeze(1)

    def forward(self, batch: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.bert.embeddings(batch["input_ids"], batch["segment_ids"], batch["position_ids"])
        x = self.bert.encoder(x, self.attention_mask(batch["sequence_ids"]))
        h = x.shape[-1]
        masked = torch.gather(x, 1, batch["masked_lm_positions"].unsqueeze(-1).expand(-1, -1, h))
        heads = self.cls.predictions
        mlm = heads.transform(masked) @ self.bert.embeddings.word_embeddings.weight.t() + heads.bias
        cls = torch.gather(x, 1, batch["cls_positions"].unsqueeze(-1).expand(-1, -1, h))
        nsp = self.cls.seq_relationship(self.bert.pooler(cls))
        return mlm, nsp


def losses(outputs: tuple[torch.Tensor, torch.Tensor], batch: Mapping[str, torch.Tensor]
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-slot losses: MLM [B, M] and NSP [B, S], 0 at padding slots (labels IGNORE)."""
    mlm, nsp = outputs
    mlm_loss = F.cross_entropy(mlm.float().flatten(0, 1), batch["masked_lm_ids"].flatten(), ignore_index=IGNORE,
                               reduction="none").view(mlm.shape[:2])
    nsp_loss = F.cross_entropy(nsp.float().flatten(0, 1), batch["next_sentence_labels"].flatten(),
                               ignore_index=IGNORE, reduction="none").view(nsp.shape[:2])
    return mlm_loss, nsp_loss


def pretraining_loss(outputs: tuple[torch.Tensor, torch.Tensor], batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """MLM loss averaged over the real masked positions + NSP loss averaged over the sequences (the
    reference's loss), computed on the device: no count leaves it."""
    mlm_loss, nsp_loss = losses(outputs, batch)
    n_masked = (batch["masked_lm_ids"] != IGNORE).sum().clamp(min=1)
    n_seq = (batch["next_sentence_labels"] != IGNORE).sum().clamp(min=1)
    return mlm_loss.sum() / n_masked + nsp_loss.sum() / n_seq


def mlm_correct(mlm_logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """[correct predictions, real masked positions] at this batch's masked slots (padding not counted)."""
    valid = labels != IGNORE
    correct = (mlm_logits.argmax(-1) == labels) & valid
    return torch.stack([correct.sum(), valid.sum()]).to(torch.float64)


# ---------------------------------------------------------------------------------------------
# checkpoints
# ---------------------------------------------------------------------------------------------
def normalize_state_dict(state: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """A phase-1 checkpoint in one of the layouts users have, as this model's keys: NVIDIA's
    converted checkpoint ({"model": state} and `module.` prefixes from DDP), older TF-converted names
    (LayerNorm `gamma`/`beta`), and Hugging Face's BertForPreTraining (whose tied decoder weight and
    duplicated decoder bias are dropped: this model ties them)."""
    if "model" in state and isinstance(state["model"], Mapping):
        state = state["model"]
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if not isinstance(value, torch.Tensor):
            continue
        key = key.removeprefix("module.")
        if key.endswith("LayerNorm.gamma"):
            key = key[: -len("gamma")] + "weight"
        elif key.endswith("LayerNorm.beta"):
            key = key[: -len("beta")] + "bias"
        if key in ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias", "bert.embeddings.position_ids"):
            continue
        out[key] = value
    return out


def config_from_state_dict(state: Mapping[str, torch.Tensor], heads: int, dropout: float, where: str
                           ) -> BertConfig:
    """The BERT sizes a checkpoint holds (vocabulary, hidden, layers, FFN, positions)."""
    try:
        vocab, hidden = state["bert.embeddings.word_embeddings.weight"].shape
        positions = state["bert.embeddings.position_embeddings.weight"].shape[0]
        types = state["bert.embeddings.token_type_embeddings.weight"].shape[0]
        intermediate = state["bert.encoder.layer.0.intermediate.dense.weight"].shape[0]
    except KeyError as exc:
        raise TrainperfError(f"{where}: not a BERT pretraining checkpoint (missing {exc.args[0]})") from None
    layers = 1 + max(int(k.split(".")[3]) for k in state if k.startswith("bert.encoder.layer."))
    return BertConfig(vocab_size=vocab, hidden=hidden, layers=layers, heads=heads, intermediate=intermediate,
                      max_positions=positions, type_vocab=types, dropout=dropout)


def load_checkpoint(model: BertForPreTraining, state: Mapping[str, Any], where: str) -> None:
    """Load a (normalised) checkpoint into `model`: every key present with its shape, nothing extra,
    a mismatch reported by name in one line."""
    state = normalize_state_dict(state)
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    extra = sorted(set(state) - set(expected))
    if missing:
        raise TrainperfError(f"{where}: missing {missing[0]} (+{len(missing) - 1} more) for this BERT")
    if extra:
        raise TrainperfError(f"{where}: unexpected tensor {extra[0]} (+{len(extra) - 1} more) for this BERT")
    for key, value in expected.items():
        if tuple(state[key].shape) != tuple(value.shape):
            raise TrainperfError(f"{where}: {key} has shape {tuple(state[key].shape)}, this BERT needs "
                                 f"{tuple(value.shape)}")
    model.load_state_dict({k: v.to(expected[k].dtype) for k, v in state.items()})


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """LAMB groups with the reference's exclusions: LayerNorm and bias parameters get neither weight
    decay nor the trust ratio."""
    excluded = [p for n, p in model.named_parameters() if "LayerNorm" in n or n.endswith("bias")]
    ids = {id(p) for p in excluded}
    kept = [p for p in model.parameters() if id(p) not in ids]
    return [{"params": kept, "weight_decay": weight_decay},
            {"params": excluded, "weight_decay": 0.0, "lamb_exclude": True}]


def lr_factor(base_lr: float, warmup: int, start_warmup: int, total: int, power: float = 1.0
              ) -> Callable[[int], float]:
    """The reference schedule as a multiplier of base_lr at optimizer step `step` (0 = first update):
    polynomial decay to 0 at `total` steps; during warmup, linear in (step - start_warmup) / warmup."""

    def factor(step: int) -> float:
        decay = (1.0 - min(step, total) / total) ** power if total > 0 else 1.0
        if warmup > 0 and step - start_warmup < warmup:
            return max(step - start_warmup, 0) / warmup
        return decay

    return factor


def mfu_flops(cfg: BertConfig, seq_len: int, predictions: int) -> float:
    """Training FLOPs of one sequence (for `bench`'s MFU)."""
    return cfg.flops_per_token(seq_len, predictions) * seq_len
