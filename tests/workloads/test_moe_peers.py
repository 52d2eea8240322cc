"""trainperf's mixture-of-experts models against the implementations users know, on tiny configurations (CPU,
fp32, the same weights): GPT-OSS as OpenAI's card builds it against `transformers`' GptOssForCausalLM
(attention sinks and biases, alternating sliding windows, YaRN without truncation, the clamped SwiGLU)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from trainperf.workloads.common.llm.moe_model import GPT_OSS_20B_CARD, MoETransformer

transformers = pytest.importorskip("transformers")

SEQ = 40  # past the window (8) and far enough for YaRN's scaled wavelengths to differ from the unscaled


def _unpermute(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Hugging Face's rows (each head's rotary pairs split in halves) -> interleaved pairs, as trainperf rotates;
    a bias is a one-column matrix."""
    matrix = w if w.dim() == 2 else w[:, None]
    rows, cols = matrix.shape
    out = matrix.reshape(heads, 2, rows // heads // 2, cols).transpose(1, 2).reshape(rows, cols)
    return out if w.dim() == 2 else out[:, 0]


def _gpt_oss_pair(truncate: bool = False) -> tuple[torch.nn.Module, MoETransformer]:
    config = transformers.GptOssConfig(
        vocab_size=96, hidden_size=64, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=8,
        layer_types=["sliding_attention", "full_attention"], max_position_embeddings=4096 * 32,
        rms_norm_eps=1e-5, tie_word_embeddings=False, attn_implementation="eager",
        rope_parameters={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                         "truncate": truncate, "original_max_position_embeddings": 4096, "rope_theta": 150_000.0})
    torch.manual_seed(0)
    theirs = transformers.GptOssForCausalLM(config).eval()
    with torch.no_grad():  # transformers starts biases, sinks and norms at constants: other values, so they count
        for name, p in theirs.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
            elif p.dim() == 1 or name.endswith(("_bias", "sinks")):
                p.normal_(std=0.2)
            else:
                p.normal_(std=0.1)
    ours_config = dataclasses.replace(GPT_OSS_20B_CARD, layers=2, dim=64, vocab_size=96, heads=4, kv_heads=2,
                                      head_dim=16, window=7, experts=4, top_k=2, expert_dim=32,
                                      yarn_truncate=truncate)
    ours = MoETransformer(ours_config, SEQ).eval()
    found = dict(theirs.named_parameters())
    state = {"tok_embeddings.weight": found["model.embed_tokens.weight"], "norm.weight": found["model.norm.weight"],
             "output.weight": found["lm_head.weight"]}
    for i in range(2):
        hf, mine = f"model.layers.{i}.", f"blocks.{i}."
        heads = {"q": 4, "k": 2}
        for p in "qkvo":
            for kind in ("weight", "bias"):
                tensor = found[f"{hf}self_attn.{p}_proj.{kind}"]
                state[f"{mine}attention.w{p}.{kind}"] = _unpermute(tensor, heads[p]) if p in heads else tensor
        state[f"{mine}attention.sinks"] = found[f"{hf}self_attn.sinks"]
        state[f"{mine}attention_norm.weight"] = found[f"{hf}input_layernorm.weight"]
        state[f"{mine}ffn_norm.weight"] = found[f"{hf}post_attention_layernorm.weight"]
        state[f"{mine}feed_forward.router.gate.weight"] = found[f"{hf}mlp.router.weight"]
        state[f"{mine}feed_forward.router.gate.bias"] = found[f"{hf}mlp.router.bias"]
        gate_up, gate_up_bias = found[f"{hf}mlp.experts.gate_up_proj"], found[f"{hf}mlp.experts.gate_up_proj_bias"]
        # Their gate and up columns alternate (gate_up[..., ::2] is the gate).
        state[f"{mine}feed_forward.experts.w1"], state[f"{mine}feed_forward.experts.w3"] = gate_up[..., ::2], \
            gate_up[..., 1::2]
        state[f"{mine}feed_forward.experts.b1"], state[f"{mine}feed_forward.experts.b3"] = gate_up_bias[:, ::2], \
            gate_up_bias[:, 1::2]
        state[f"{mine}feed_forward.experts.w2"] = found[f"{hf}mlp.experts.down_proj"]
        state[f"{mine}feed_forward.experts.b2"] = found[f"{hf}mlp.experts.down_proj_bias"]
    missing, unexpected = ours.load_state_dict({k: v.detach().clone() for k, v in state.items()}, strict=False)
    assert not unexpected and all(k.endswith((".load", ".tokens_seen")) for k in missing), (missing, unexpected)
    return theirs, ours


@pytest.mark.parametrize("truncate", [False, True], ids=["the-card-s-yarn", "truncated-yarn"])
def test_gpt_oss_as_the_card_builds_it_gives_transformers_logits(truncate):
    theirs, ours = _gpt_oss_pair(truncate)
    tokens = torch.randint(0, 96, (2, SEQ), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = theirs(input_ids=tokens).logits
        found = ours(tokens)[0]
    assert torch.allclose(found, expected, atol=3e-5, rtol=1e-4), (found - expected).abs().max()


def randomised_deepseek(model: torch.nn.Module) -> torch.nn.Module:
    """A transformers DeepSeek-V3 with every weight drawn (transformers starts norms and biases at constants:
    other values, so that they count), its balancing biases too (they pick experts, never weigh them)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(std=0.1)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.normal_(std=0.05)
    return model.eval()


def _deepseek_pair() -> tuple[torch.nn.Module, MoETransformer]:
    from trainperf.workloads.deepseekv3_671b.recipes import DEEPSEEK_V3

    config = transformers.DeepseekV3Config(
        vocab_size=96, hidden_size=64, intermediate_size=80, moe_intermediate_size=24, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1, n_routed_experts=8, num_experts_per_tok=3,
        n_group=4, topk_group=2, routed_scaling_factor=2.5, norm_topk_prob=True, kv_lora_rank=16, q_lora_rank=24,
        qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, first_k_dense_replace=1, rms_norm_eps=1e-6,
        max_position_embeddings=4096 * 40, tie_word_embeddings=False, attn_implementation="eager",
        rope_parameters={"rope_type": "yarn", "factor": 40.0, "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0,
                         "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096, "rope_theta": 10_000.0})
    torch.manual_seed(0)
    theirs = randomised_deepseek(transformers.DeepseekV3ForCausalLM(config))
    ours_config = dataclasses.replace(DEEPSEEK_V3, layers=3, dim=64, vocab_size=96, heads=4, kv_heads=4, q_rank=24,
                                      kv_rank=16, nope_dim=16, rope_dim=8, v_dim=16, head_dim=24, dense_layers=1,
                                      ffn_dim=80, experts=8, top_k=3, expert_dim=24, shared_experts=1, groups=4,
                                      topk_groups=2, mtp_layers=0)
    ours = MoETransformer(ours_config, SEQ).eval()
    found = dict(theirs.named_parameters()) | dict(theirs.named_buffers())
    state = {"tok_embeddings.weight": found["model.embed_tokens.weight"], "norm.weight": found["model.norm.weight"],
             "output.weight": found["lm_head.weight"]}
    names = {"q_a_proj": "wq_a", "q_a_layernorm": "q_norm", "q_b_proj": "wq_b", "kv_a_proj_with_mqa": "wkv_a",
             "kv_a_layernorm": "kv_norm", "kv_b_proj": "wkv_b", "o_proj": "wo"}
    for i in range(3):
        hf, mine = f"model.layers.{i}.", f"blocks.{i}."
        for theirs_name, ours_name in names.items():
            state[f"{mine}attention.{ours_name}.weight"] = found[f"{hf}self_attn.{theirs_name}.weight"]
        state[f"{mine}attention_norm.weight"] = found[f"{hf}input_layernorm.weight"]
        state[f"{mine}ffn_norm.weight"] = found[f"{hf}post_attention_layernorm.weight"]
        if i == 0:
            for w, p in (("w1", "gate_proj"), ("w3", "up_proj"), ("w2", "down_proj")):
                state[f"{mine}feed_forward.{w}.weight"] = found[f"{hf}mlp.{p}.weight"]
            continue
        state[f"{mine}feed_forward.router.gate.weight"] = found[f"{hf}mlp.gate.weight"]
        state[f"{mine}feed_forward.router.correction"] = found[f"{hf}mlp.gate.e_score_correction_bias"]
        # Theirs: [experts, gate rows then up rows, dim] and [experts, dim, hidden], each applied as F.linear.
        gate, up = found[f"{hf}mlp.experts.gate_up_proj"].chunk(2, dim=1)
        state[f"{mine}feed_forward.experts.w1"] = gate.transpose(1, 2)
        state[f"{mine}feed_forward.experts.w3"] = up.transpose(1, 2)
        state[f"{mine}feed_forward.experts.w2"] = found[f"{hf}mlp.experts.down_proj"].transpose(1, 2)
        for w, p in (("w1", "gate_proj"), ("w3", "up_proj"), ("w2", "down_proj")):
            state[f"{mine}feed_forward.shared.{w}.weight"] = found[f"{hf}mlp.shared_experts.{p}.weight"]
    missing, unexpected = ours.load_state_dict({k: v.detach().clone() for k, v in state.items()}, strict=False)
    assert not unexpected and all(k.endswith((".load", ".tokens_seen")) for k in missing), (missing, unexpected)
    return theirs, ours


def test_deepseek_v3_gives_transformers_logits():
    """Latent attention with YaRN (its softmax temperature included), grouped sigmoid routing with the
    correction bias choosing experts only, the routed scale, a shared expert and a first dense block."""
    theirs, ours = _deepseek_pair()
    tokens = torch.randint(0, 96, (2, SEQ), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = theirs(input_ids=tokens).logits
        found = ours(tokens)[0]
    assert torch.allclose(found, expected, atol=3e-5, rtol=1e-4), (found - expected).abs().max()
