"""A Hugging Face-format DeepSeek-V3 checkpoint (config.json + safetensors shards, as deepseek-ai publishes it
and as `transformers` writes it) read into the shared mixture-of-experts transformer (moe_model.py), the
family's reader (hf.py) with DeepSeek's names.

Names: `model.layers.{i}.self_attn.{q_a_proj, q_a_layernorm, q_b_proj | q_proj, kv_a_proj_with_mqa,
kv_a_layernorm, kv_b_proj, o_proj}`, `input_layernorm`, `post_attention_layernorm`; the first
`first_k_dense_replace` blocks' `mlp.{gate,up,down}_proj`, the others' `mlp.gate` (and its
`e_score_correction_bias`), `mlp.shared_experts.{gate,up,down}_proj` and one `mlp.experts.{j}.{gate,up,down}_proj`
per routed expert; the multi-token prediction module as layer `num_hidden_layers` (`enorm`, `hnorm`, `eh_proj`
over [embedding | hidden], `shared_head.norm`, and a decoder block's own names; its copies of the embedding and
output layer are the model's, not read again). The rotary rows are in DeepSeek's interleaved order
(`rope_interleave`, transformers' default), which this model rotates as they are.

Each process reads only what its shards hold: a slice of each dense tensor under FSDP2, and under expert
parallelism only its own experts' tensors (their slices). FP8 weights with block scales (deepseek-ai's release)
are read as bf16. A config this model cannot compute, a missing tensor or one of the wrong shape is one line
naming the file."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainperf.errors import TrainperfError, shown
from trainperf.workloads.common.llm.hf import Shards, _plain_named, copy_region, plain_name, read_json
from trainperf.workloads.common.llm.moe import MoE
from trainperf.workloads.common.llm.moe_model import MoEModelConfig, MoETransformer

__all__ = ["DeepSeekCheckpoint", "read_deepseek_config"]

# What the checkpoint decides (the architecture); the rest of a recipe's model (its losses' weights, the balancing
# updates, a capacity factor, the initialisation) is the training's.
ARCHITECTURE = ("layers", "dim", "vocab_size", "norm_eps", "attention", "heads", "kv_heads", "head_dim", "qk_norm",
                "q_rank", "kv_rank", "nope_dim", "rope_dim", "v_dim", "rope_theta", "yarn_factor",
                "yarn_original_context", "yarn_beta_fast", "yarn_beta_slow", "yarn_mscale", "yarn_mscale_all_dim",
                "dense_layers", "ffn_dim", "experts", "top_k", "expert_dim", "shared_experts", "scoring",
                "router_bias", "expert_bias", "activation", "groups", "topk_groups", "routed_scale", "mtp_layers")
YARN = {"factor": "yarn_factor", "original_max_position_embeddings": "yarn_original_context",
        "beta_fast": "yarn_beta_fast", "beta_slow": "yarn_beta_slow", "mscale": "yarn_mscale",
        "mscale_all_dim": "yarn_mscale_all_dim"}
ATTENTION = {"wq_a": "q_a_proj", "q_norm": "q_a_layernorm", "wq_b": "q_b_proj", "wq": "q_proj",
             "wkv_a": "kv_a_proj_with_mqa", "kv_norm": "kv_a_layernorm", "wkv_b": "kv_b_proj", "wo": "o_proj"}
FEED_FORWARD = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}
MTP = {"hidden_norm": "hnorm", "embed_norm": "enorm", "proj": "eh_proj", "norm": "shared_head.norm"}


def read_deepseek_config(folder: Path) -> MoEModelConfig:
    """config.json (model_type deepseek_v3) as the model it describes. What this model cannot compute (softmax
    scoring, unnormalised top-k weights, biases, another activation, half-split rotary rows, another rotary
    scaling, MoE layers not in every block past the dense ones) is one line naming the file."""
    path = folder / "config.json"
    raw = read_json(path)
    try:
        if raw.get("model_type") != "deepseek_v3":
            raise ValueError(f"model_type is {shown(str(raw.get('model_type')), 40)!r}")
        scaling = raw.get("rope_scaling") or raw.get("rope_parameters") or {}
        kind = scaling.get("rope_type", scaling.get("type", "default"))
        theta = float(scaling.get("rope_theta", raw.get("rope_theta", 10_000.0)))
        if kind not in ("default", "yarn"):
            raise TrainperfError(f"{path}: rotary scaling of type {shown(str(kind), 40)!r}: DeepSeek-V3's is yarn or "
                                 "none")
        yarn = {ours: float(scaling[theirs]) for theirs, ours in YARN.items() if kind == "yarn" and theirs in scaling}
        if kind == "yarn":
            yarn["yarn_original_context"] = int(scaling["original_max_position_embeddings"])
            yarn.setdefault("yarn_mscale_all_dim", 0.0)
        nope, rope = int(raw["qk_nope_head_dim"]), int(raw["qk_rope_head_dim"])
        config = MoEModelConfig(
            layers=int(raw["num_hidden_layers"]), dim=int(raw["hidden_size"]), vocab_size=int(raw["vocab_size"]),
            norm_eps=float(raw.get("rms_norm_eps", 1e-6)), attention="latent",
            heads=int(raw["num_attention_heads"]), kv_heads=int(raw.get("num_key_value_heads")
                                                                or raw["num_attention_heads"]),
            head_dim=nope + rope, qk_norm=False, q_rank=int(raw.get("q_lora_rank") or 0),
            kv_rank=int(raw["kv_lora_rank"]), nope_dim=nope, rope_dim=rope, v_dim=int(raw["v_head_dim"]),
            rope_theta=theta, **yarn, dense_layers=int(raw.get("first_k_dense_replace", 0)),
            ffn_dim=int(raw["intermediate_size"]), experts=int(raw["n_routed_experts"]),
            top_k=int(raw["num_experts_per_tok"]), expert_dim=int(raw["moe_intermediate_size"]),
            shared_experts=int(raw.get("n_shared_experts") or 0), scoring="sigmoid",
            groups=int(raw.get("n_group") or 0), topk_groups=int(raw.get("topk_group") or 0),
            routed_scale=float(raw.get("routed_scaling_factor", 1.0)),
            mtp_layers=int(raw.get("num_nextn_predict_layers") or 0))
    except TrainperfError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise TrainperfError(f"{path}: not a DeepSeek-V3 config.json ({type(exc).__name__}: "
                             f"{shown(str(exc), 200)})") from None
    unsupported = [
        (raw.get("scoring_func", "sigmoid") != "sigmoid", "scoring_func is not sigmoid (DeepSeek-V3's router)"),
        (raw.get("topk_method", "noaux_tc") != "noaux_tc", "topk_method is not noaux_tc (DeepSeek-V3's grouped "
                                                           "choice with correction biases)"),
        (raw.get("norm_topk_prob", True) is not True, "norm_topk_prob is not true (the chosen experts' weights "
                                                      "are normalised)"),
        (raw.get("moe_layer_freq", 1) != 1, "moe_layer_freq is not 1 (every block past the dense ones is MoE)"),
        (raw.get("hidden_act", "silu") != "silu", "hidden_act is not silu"),
        (raw.get("attention_bias"), "attention_bias is true; DeepSeek-V3's projections have no biases"),
        (raw.get("tie_word_embeddings"), "tie_word_embeddings is true; the embeddings are untied"),
        (raw.get("rope_interleave", True) is not True, "rope_interleave is false: rotary rows split in halves, not "
                                                       "DeepSeek's interleaved pairs"),
        (config.mtp_layers > 1, f"num_nextn_predict_layers is {config.mtp_layers}; one module is built"),
    ]
    for found, what in unsupported:
        if found:
            raise TrainperfError(f"{path}: {what}")
    return config


class DeepSeekCheckpoint(Shards):
    """A DeepSeek-V3 checkpoint folder: its config (`read_deepseek_config`) and its tensors by this model's
    names."""

    def __init__(self, folder: Path) -> None:
        self.config = read_deepseek_config(folder)
        super().__init__(folder, read_json(folder / "config.json"))

    def require(self, model: MoEModelConfig) -> None:
        """Refuse (one line naming config.json) a checkpoint of another architecture than `model`'s."""
        differ = [f"{name} {getattr(self.config, name)} in the checkpoint, {getattr(model, name)} in the recipe"
                  for name in ARCHITECTURE if getattr(self.config, name) != getattr(model, name)]
        if differ:
            raise TrainperfError(f"{self.folder / 'config.json'}: " + "; ".join(differ))

    def names(self) -> Iterator[tuple[str, str]]:
        """(this model's tensor name, Hugging Face's) for every tensor read; for the routed experts, Hugging
        Face's name of expert 0's (the others' differ in the index)."""
        c = self.config
        yield "tok_embeddings.weight", "model.embed_tokens.weight"
        prefixes = [(f"blocks.{i}.", f"model.layers.{i}.", i) for i in range(c.layers)]
        if c.mtp_layers:
            mtp = f"model.layers.{c.layers}."
            for ours, theirs in MTP.items():
                yield f"mtp.{ours}.weight", f"{mtp}{theirs}.weight"
            prefixes.append(("mtp.block.", mtp, c.layers))
        for ours, theirs, layer in prefixes:
            for a, b in ATTENTION.items():
                if (a == "wq") == (c.q_rank == 0) or a in ("wkv_a", "kv_norm", "wkv_b", "wo"):
                    yield f"{ours}attention.{a}.weight", f"{theirs}self_attn.{b}.weight"
            yield f"{ours}attention_norm.weight", f"{theirs}input_layernorm.weight"
            yield f"{ours}ffn_norm.weight", f"{theirs}post_attention_layernorm.weight"
            if layer < c.dense_layers:
                for a, b in FEED_FORWARD.items():
                    yield f"{ours}feed_forward.{a}.weight", f"{theirs}mlp.{b}.weight"
                continue
            yield f"{ours}feed_forward.router.gate.weight", f"{theirs}mlp.gate.weight"
            yield f"{ours}feed_forward.router.correction", f"{theirs}mlp.gate.e_score_correction_bias"
            if c.shared_experts:
                for a, b in FEED_FORWARD.items():
                    yield f"{ours}feed_forward.shared.{a}.weight", f"{theirs}mlp.shared_experts.{b}.weight"
            for a, b in FEED_FORWARD.items():
                yield f"{ours}feed_forward.experts.{a}", f"{theirs}mlp.experts.0.{b}.weight"
        yield "norm.weight", "model.norm.weight"
        yield "output.weight", "lm_head.weight"

    def check_headers(self) -> None:
        """Every tensor the config implies is in its shard with its shape and a float type, from the headers
        only (nothing is loaded): a partial or mismatched checkpoint is one line before a run starts."""
        with torch.device("meta"):
            model = MoETransformer(self.config, 1)
        shapes = {name: tuple(t.shape) for name, t in _named(model)}
        for ours, theirs in self.names():
            shape = shapes[ours]
            if ".experts." in ours:
                for expert in range(shape[0]):
                    self._tensor(_expert(theirs, expert), _hf_expert_shape(ours, shape))
            else:
                self._tensor(theirs, shape)

    def region(self, name: str, shape: tuple[int, ...], where: tuple[slice, ...], first_expert: int = 0
               ) -> torch.Tensor:
        """The part `where` (a slice per dimension) of this model's tensor `name` of global `shape`, reading
        only what it covers. For the routed experts' stacked weights ([experts, in, out]) the first dimension
        counts from `first_expert` (the first this process holds under expert parallelism), each expert's
        Hugging Face matrix ([out, in]) read transposed."""
        theirs = dict(self.names())[name]
        if ".experts." in name:
            return expert_region(self, theirs, name, shape, where, first_expert)
        if name == "mtp.proj.weight":  # Hugging Face's columns: [embedding | hidden]; this model's: the reverse
            dim = self.config.dim
            rows, cols = where
            piece = self._tensor(theirs, shape)
            columns = torch.cat([torch.arange(dim, 2 * dim), torch.arange(dim)])[cols]
            return piece[rows, :][:, columns]
        if name in ("tok_embeddings.weight", "output.weight") and shape[0] != self.config.vocab_size:
            return self._vocabulary_rows(theirs, self.config.vocab_size, self.config.dim, where)
        return self._tensor(theirs, shape)[tuple(where)]

    def load_into(self, model: nn.Module) -> None:
        """Copy every parameter and the routers' correction biases of `model` (plain, or DTensor shards; its
        experts all, or this process's under expert parallelism) from the checkpoint."""
        load_moe(self, model)


def load_moe(checkpoint: Any, model: nn.Module) -> None:
    """Copy every tensor `checkpoint.names()` lists into `model` through `checkpoint.region`, each process
    only its part; under expert parallelism the experts counted from the first this process holds (the
    MoE checkpoint readers' shared loop: DeepSeek-V3's, Qwen3.5's)."""
    tensors = dict(_named(model))
    first = {f"{path}.experts.": layer.ep.rank * (layer.config.experts // layer.ep.size)
             for path, layer in _moe_layers(model) if layer.ep is not None}
    for name, _ in checkpoint.names():
        if name not in tensors:
            raise TrainperfError(f"{checkpoint.folder}: the model has no tensor {name} (another shape?)")
        offset = next((o for prefix, o in first.items() if name.startswith(prefix)), 0)
        copy_region(tensors[name], lambda shape, where, name=name, offset=offset:
                    checkpoint.region(name, shape, where, offset))


def expert_region(checkpoint: Any, theirs: str, name: str, shape: tuple[int, ...], where: tuple[slice, ...],
                  first_expert: int) -> torch.Tensor:
    """The routed experts' stacked [experts, in, out] part `where` from each expert's Hugging Face [out, in]
    matrix (`theirs` names expert 0's), experts counted from `first_expert`."""
    experts, rows, cols = where
    hf_shape = _hf_expert_shape(name, shape)
    parts = [checkpoint._tensor(_expert(theirs, first_expert + e), hf_shape)[cols, rows].t()
             for e in range(experts.start, experts.stop)]
    return torch.stack(parts) if parts else torch.empty(0, rows.stop - rows.start, cols.stop - cols.start)


def _expert(theirs: str, expert: int) -> str:
    return theirs.replace(".experts.0.", f".experts.{expert}.")


def _hf_expert_shape(name: str, shape: tuple[int, ...]) -> tuple[int, int]:
    """Hugging Face's [out, in] matrix of one expert of this model's stacked [experts, in, out] weight."""
    return shape[2], shape[1]


def _named(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Parameters and persistent buffers by their plain names (the wrappers' infixes removed)."""
    yield from _plain_named(model)
    for name, buffer in model.named_buffers():
        if name.endswith(".correction"):
            yield plain_name(name), buffer


def _moe_layers(model: nn.Module) -> Iterator[tuple[str, Any]]:
    for name, module in model.named_modules():
        if isinstance(module, MoE):
            yield plain_name(name), module
