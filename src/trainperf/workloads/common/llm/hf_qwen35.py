"""A Hugging Face-format Qwen3.5 MoE checkpoint (config.json + safetensors shards: Qwen's release of
Qwen3.5-397B-A17B, or what `transformers` writes for `Qwen3_5MoeForCausalLM`) read into trainperf's
Qwen3.5 text model (qwen35.py), the family's reader (hf.py) with Qwen's names.

Names: the text model's tensors under `model.language_model.` in the vision-language release (its vision
tower and multi-token-prediction layer are not read: the reference trains the text path with MTP off),
under `model.` in a text-only checkpoint: `embed_tokens`, `layers.{i}.{input_layernorm,
post_attention_layernorm}`, the linear-attention layers' `linear_attn.{in_proj_qkv, in_proj_z, in_proj_b,
in_proj_a, conv1d, dt_bias, A_log, norm, out_proj}`, the full-attention layers' `self_attn.{q_proj, k_proj,
v_proj, o_proj, q_norm, k_norm}`, `mlp.gate`, one `mlp.experts.{j}.{gate,up,down}_proj` per expert,
`mlp.shared_expert.{gate,up,down}_proj`, `mlp.shared_expert_gate`, `norm`; `lm_head` at the top.

Each process reads only what it holds (a DTensor's slice; under expert parallelism its own experts). A
config this model cannot compute, a missing tensor or one of the wrong shape is one line naming the file."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainperf.errors import TrainperfError, shown
from trainperf.files import write_json_atomic
from trainperf.workloads.common.llm.hf import Shards, read_json, save_single
from trainperf.workloads.common.llm.hf_deepseek import _hf_expert_shape, _named, expert_region, load_moe
from trainperf.workloads.common.llm.moe import MoEConfig
from trainperf.workloads.common.llm.qwen35 import Qwen35, Qwen35Config

__all__ = ["Qwen35Checkpoint", "config_json", "read_qwen35_config", "write"]

LINEAR = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj")
FULL = ("q_proj", "k_proj", "v_proj", "o_proj")
EXPERT = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}


def read_qwen35_config(folder: Path) -> Qwen35Config:
    """config.json (model_type qwen3_5_moe with its text_config, or qwen3_5_moe_text) as the model it
    describes; what this model cannot compute is one line naming the file."""
    path = folder / "config.json"
    raw = read_json(path)
    text = raw.get("text_config") if raw.get("model_type") == "qwen3_5_moe" else raw
    try:
        if not isinstance(text, dict) or text.get("model_type") not in ("qwen3_5_moe_text", None):
            raise ValueError(f"model_type is {shown(str(raw.get('model_type')), 40)!r}")
        rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
        layers = int(text["num_hidden_layers"])
        kinds = list(text.get("layer_types") or [])
        every = int(text.get("full_attention_interval", 4))
        expected = ["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(layers)]
        if kinds and kinds != expected:
            raise TrainperfError(f"{path}: layer_types is not one full-attention layer every {every}")
        shared = int(text.get("shared_expert_intermediate_size", 0))
        hidden = int(text["moe_intermediate_size"])
        if shared % hidden:
            raise TrainperfError(f"{path}: shared_expert_intermediate_size {shared} is not a multiple of "
                                 f"moe_intermediate_size {hidden}")
        config = Qwen35Config(
            layers=layers, dim=int(text["hidden_size"]), vocab_size=int(text["vocab_size"]),
            heads=int(text["num_attention_heads"]), kv_heads=int(text["num_key_value_heads"]),
            head_dim=int(text["head_dim"]), rotary_fraction=float(rope.get("partial_rotary_factor", 1.0)),
            rope_theta=float(rope.get("rope_theta", text.get("rope_theta", 10_000.0))),
            linear_k_heads=int(text["linear_num_key_heads"]), linear_v_heads=int(text["linear_num_value_heads"]),
            linear_k_dim=int(text["linear_key_head_dim"]), linear_v_dim=int(text["linear_value_head_dim"]),
            conv_kernel=int(text.get("linear_conv_kernel_dim", 4)), full_attention_every=every,
            moe=MoEConfig(experts=int(text["num_experts"]), top_k=int(text["num_experts_per_tok"]), hidden=hidden,
                          shared=shared // hidden, shared_gate=bool(shared), scoring="softmax_topk", balance="none"),
            norm_eps=float(text.get("rms_norm_eps", 1e-6)))
        kind = rope.get("rope_type", "default")
    except TrainperfError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise TrainperfError(f"{path}: not a Qwen3.5 MoE config.json ({type(exc).__name__}: "
                             f"{shown(str(exc), 200)})") from None
    unsupported = [
        (kind != "default", f"rotary scaling of type {shown(str(kind), 40)!r}: Qwen3.5's is none"),
        (text.get("hidden_act", "silu") != "silu", "hidden_act is not silu"),
        (text.get("attention_bias"), "attention_bias is true; Qwen3.5's projections have no biases"),
        (text.get("tie_word_embeddings"), "tie_word_embeddings is true; Qwen3.5-397B's embeddings are untied"),
        (text.get("norm_topk_prob", True) is not True, "norm_topk_prob is false (the chosen experts' weights are "
                                                       "renormalised in Qwen3.5)"),
    ]
    for found, what in unsupported:
        if found:
            raise TrainperfError(f"{path}: {what}")
    return config


class Qwen35Checkpoint(Shards):
    """A Qwen3.5 MoE checkpoint folder: its config and its tensors by this model's names."""

    def __init__(self, folder: Path) -> None:
        self.config = read_qwen35_config(folder)
        super().__init__(folder, read_json(folder / "config.json"))
        self.prefix = "model.language_model." if "model.language_model.embed_tokens.weight" in self.files else "model."

    def require(self, model: Qwen35Config) -> None:
        """Refuse (one line naming config.json) a checkpoint of another architecture than `model`'s."""
        fields = ("layers", "dim", "vocab_size", "heads", "kv_heads", "head_dim", "rotary_fraction", "rope_theta",
                  "linear_k_heads", "linear_v_heads", "linear_k_dim", "linear_v_dim", "conv_kernel",
                  "full_attention_every", "norm_eps")
        differ = [f"{n} {getattr(self.config, n)} in the checkpoint, {getattr(model, n)} in the recipe"
                  for n in fields if getattr(self.config, n) != getattr(model, n)]
        for n in ("experts", "top_k", "hidden", "shared", "shared_gate"):
            if getattr(self.config.moe, n) != getattr(model.moe, n):
                differ.append(f"moe.{n} {getattr(self.config.moe, n)} in the checkpoint, {getattr(model.moe, n)} "
                              "in the recipe")
        if differ:
            raise TrainperfError(f"{self.folder / 'config.json'}: " + "; ".join(differ))

    def names(self) -> Iterator[tuple[str, str]]:
        """(this model's tensor name, the checkpoint's) for every tensor read; for the routed experts, expert
        0's name (the others differ in the index)."""
        c, p = self.config, self.prefix
        yield "tok_embeddings.weight", f"{p}embed_tokens.weight"
        for i in range(c.layers):
            ours, theirs = f"blocks.{i}.", f"{p}layers.{i}."
            yield f"{ours}input_norm.weight", f"{theirs}input_layernorm.weight"
            yield f"{ours}post_norm.weight", f"{theirs}post_attention_layernorm.weight"
            if c.full_attention(i):
                for name in (*FULL, "q_norm", "k_norm"):
                    yield f"{ours}mixer.{name}.weight", f"{theirs}self_attn.{name}.weight"
            else:
                for name in (*LINEAR, "conv1d", "norm"):
                    yield f"{ours}mixer.{name}.weight", f"{theirs}linear_attn.{name}.weight"
                for name in ("dt_bias", "A_log"):
                    yield f"{ours}mixer.{name}", f"{theirs}linear_attn.{name}"
            yield f"{ours}moe.router.gate.weight", f"{theirs}mlp.gate.weight"
            if c.moe.shared:
                for a, b in EXPERT.items():
                    yield f"{ours}moe.shared.{a}.weight", f"{theirs}mlp.shared_expert.{b}.weight"
                yield f"{ours}moe.shared_gate.weight", f"{theirs}mlp.shared_expert_gate.weight"
            for a, b in EXPERT.items():
                yield f"{ours}moe.experts.{a}", f"{theirs}mlp.experts.0.{b}.weight"
        yield "norm.weight", f"{p}norm.weight"
        yield "output.weight", "lm_head.weight"

    def check_headers(self) -> None:
        """Every tensor the config implies is in its shard with its shape and a float type, from the headers
        only: a partial or mismatched checkpoint is one line before a run starts."""
        with torch.device("meta"):
            model = Qwen35(self.config, 1)
        shapes = {name: tuple(t.shape) for name, t in _named(model)}
        for ours, theirs in self.names():
            shape = shapes[ours]
            if ".experts." in ours:
                for expert in range(shape[0]):
                    self._tensor(theirs.replace(".experts.0.", f".experts.{expert}."), _hf_expert_shape(ours, shape))
            else:
                self._tensor(theirs, shape)

    def region(self, name: str, shape: tuple[int, ...], where: tuple[slice, ...], first_expert: int = 0
               ) -> torch.Tensor:
        """The part `where` of this model's tensor `name` of global `shape`, reading only what it covers;
        the routed experts' [experts, in, out] from each expert's [out, in] matrix, counted from
        `first_expert` (the first this process holds under expert parallelism)."""
        theirs = dict(self.names())[name]
        if ".experts." in name:
            return expert_region(self, theirs, name, shape, where, first_expert)
        return self._tensor(theirs, shape)[tuple(where)]

    def load_into(self, model: nn.Module) -> None:
        """Copy every parameter of `model` (plain or DTensor shards; its experts all, or this process's under
        expert parallelism) from the checkpoint."""
        load_moe(self, model)


def config_json(config: Qwen35Config, max_positions: int, dtype: torch.dtype = torch.bfloat16) -> dict[str, Any]:
    """`config` as a text-only Qwen3.5 MoE config.json (`Qwen3_5MoeForCausalLM`'s), what
    `read_qwen35_config` reads back to the same model."""
    c, moe = config, config.moe
    return {
        "architectures": ["Qwen3_5MoeForCausalLM"], "model_type": "qwen3_5_moe_text", "hidden_size": c.dim,
        "num_hidden_layers": c.layers, "vocab_size": c.vocab_size, "num_attention_heads": c.heads,
        "num_key_value_heads": c.kv_heads, "head_dim": c.head_dim,
        "rope_parameters": {"rope_type": "default", "rope_theta": c.rope_theta,
                            "partial_rotary_factor": c.rotary_fraction},
        "linear_num_key_heads": c.linear_k_heads, "linear_num_value_heads": c.linear_v_heads,
        "linear_key_head_dim": c.linear_k_dim, "linear_value_head_dim": c.linear_v_dim,
        "linear_conv_kernel_dim": c.conv_kernel, "full_attention_interval": c.full_attention_every,
        "layer_types": ["full_attention" if c.full_attention(i) else "linear_attention" for i in range(c.layers)],
        "num_experts": moe.experts, "num_experts_per_tok": moe.top_k, "moe_intermediate_size": moe.hidden,
        "shared_expert_intermediate_size": moe.hidden * moe.shared, "norm_topk_prob": True,
        "rms_norm_eps": c.norm_eps, "hidden_act": "silu", "attention_bias": False, "tie_word_embeddings": False,
        "max_position_embeddings": max_positions, "torch_dtype": str(dtype).removeprefix("torch."),
    }


def write(model: Qwen35, folder: Path, dtype: torch.dtype = torch.bfloat16) -> None:
    """`model` as a text-only Hugging Face checkpoint (one shard, config.json), under the names and layouts
    `Qwen35Checkpoint` reads (each routed expert its own [out, in] matrices): a mini's shipped policy."""
    folder.mkdir(parents=True, exist_ok=True)
    params = dict(_named(model))
    probe = Qwen35Checkpoint.__new__(Qwen35Checkpoint)
    probe.config, probe.prefix = model.config, "model."
    tensors = {}
    for ours, theirs in probe.names():
        tensor = params[ours].detach().to(dtype)
        if ".experts." in ours:
            for expert in range(tensor.shape[0]):
                tensors[theirs.replace(".experts.0.", f".experts.{expert}.")] = tensor[expert].T.contiguous()
        else:
            tensors[theirs] = tensor.contiguous()
    save_single(tensors, folder)
    write_json_atomic(folder / "config.json", config_json(model.config, model.max_seq_len, dtype))
