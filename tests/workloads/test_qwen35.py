"""Qwen3.5's MoE text model held to `transformers`' Qwen3_5MoeForCausalLM (the same weights give the same
logits), its chunked delta rule to the token-by-token definition, and its size to 397B."""

from __future__ import annotations

import json

import pytest
import torch

from trainperf.errors import TrainperfError
from trainperf.workloads.common.llm.hf_qwen35 import Qwen35Checkpoint
from trainperf.workloads.common.llm.moe import MoEConfig
from trainperf.workloads.common.llm.qwen35 import (
    QWEN35_397B,
    Qwen35,
    Qwen35Config,
    chunked_delta_rule,
    recurrent_delta_rule,
)

TINY = Qwen35Config(layers=4, dim=64, vocab_size=100, heads=4, kv_heads=2, head_dim=16, rope_theta=10_000.0,
                    linear_k_heads=2, linear_v_heads=4, linear_k_dim=8, linear_v_dim=8, chunk=8,
                    moe=MoEConfig(experts=8, top_k=2, hidden=16, shared=1, shared_gate=True, scoring="softmax_topk",
                                  balance="none"))


@pytest.mark.parametrize("seq", [1, 13, 32])
def test_the_chunked_delta_rule_equals_the_recurrence(seq: int) -> None:
    gen = torch.Generator().manual_seed(seq)
    b, h, dk, dv = 2, 3, 8, 5
    q, k = (torch.nn.functional.normalize(torch.randn(b, h, seq, dk, generator=gen, dtype=torch.float64), dim=-1)
            for _ in range(2))
    v = torch.randn(b, h, seq, dv, generator=gen, dtype=torch.float64)
    g = -torch.rand(b, h, seq, generator=gen, dtype=torch.float64) * 2
    beta = torch.rand(b, h, seq, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(chunked_delta_rule(q, k, v, g, beta, chunk=8), recurrent_delta_rule(q, k, v, g, beta))


def test_the_397b_model_has_the_references_size() -> None:
    assert QWEN35_397B.parameters() == pytest.approx(397e9, rel=0.01)
    assert sum(QWEN35_397B.full_attention(i) for i in range(60)) == 15
    with torch.device("meta"):
        tiny = Qwen35(TINY, 32)
    assert sum(p.numel() for p in tiny.parameters()) == TINY.parameters()


def _hf_model():
    transformers = pytest.importorskip("transformers")
    from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import Qwen3_5MoeTextConfig

    c = TINY
    config = Qwen3_5MoeTextConfig(
        vocab_size=c.vocab_size, hidden_size=c.dim, num_hidden_layers=c.layers, num_attention_heads=c.heads,
        num_key_value_heads=c.kv_heads, head_dim=c.head_dim, linear_num_key_heads=c.linear_k_heads,
        linear_num_value_heads=c.linear_v_heads, linear_key_head_dim=c.linear_k_dim,
        linear_value_head_dim=c.linear_v_dim, linear_conv_kernel_dim=c.conv_kernel, num_experts=c.moe.experts,
        num_experts_per_tok=c.moe.top_k, moe_intermediate_size=c.moe.hidden,
        shared_expert_intermediate_size=c.moe.hidden,
        rms_norm_eps=c.norm_eps, layer_types=["full_attention" if c.full_attention(i) else "linear_attention"
                                              for i in range(c.layers)],
        rope_parameters={"rope_type": "default", "rope_theta": c.rope_theta, "partial_rotary_factor": 0.25},
        tie_word_embeddings=False, attn_implementation="eager")
    torch.manual_seed(0)
    model = transformers.Qwen3_5MoeForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") and "linear_attn" not in name:
                p.normal_(0, 0.1)  # zero-centred norms: non-zero offsets exercise the 1 + w
            elif name.endswith("mlp.gate.weight"):
                p.normal_(0, 0.5)
    return model


def _load_from_hf(ours: Qwen35, hf_state: dict[str, torch.Tensor]) -> None:
    state = {}
    inner = TINY.moe.hidden
    for name, t in hf_state.items():
        name = name.removeprefix("model.")
        if name.startswith("layers."):
            _, i, rest = name.split(".", 2)
            p = f"blocks.{i}."
            rest = (rest.replace("input_layernorm", "input_norm").replace("post_attention_layernorm", "post_norm")
                    .replace("linear_attn.", "mixer.").replace("self_attn.", "mixer."))
            if rest == "mlp.gate.weight":
                state[p + "moe.router.gate.weight"] = t
            elif rest == "mlp.experts.gate_up_proj":
                state[p + "moe.experts.w1"] = t[:, :inner].transpose(1, 2)
                state[p + "moe.experts.w3"] = t[:, inner:].transpose(1, 2)
            elif rest == "mlp.experts.down_proj":
                state[p + "moe.experts.w2"] = t.transpose(1, 2)
            elif rest.startswith("mlp.shared_expert."):
                w = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}[rest.split(".")[2]]
                state[p + f"moe.shared.{w}.weight"] = t
            elif rest == "mlp.shared_expert_gate.weight":
                state[p + "moe.shared_gate.weight"] = t
            else:
                state[p + rest] = t
        else:
            state[{"embed_tokens.weight": "tok_embeddings.weight", "norm.weight": "norm.weight",
                   "lm_head.weight": "output.weight"}[name]] = t
    missing, unexpected = ours.load_state_dict(state, strict=False)
    assert not unexpected and all(m.endswith(("load", "tokens_seen")) for m in missing), (missing, unexpected)


def test_the_same_weights_give_transformers_logits() -> None:
    hf = _hf_model()
    ours = Qwen35(TINY, 64).eval()
    _load_from_hf(ours, hf.state_dict())
    tokens = torch.randint(0, TINY.vocab_size, (2, 21), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf(tokens).logits
        got = ours(tokens)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def _saved(tmp_path, vlm: bool = False):
    from safetensors.torch import load_file, save_file

    hf = _hf_model()
    folder = tmp_path / "ckpt"
    hf.save_pretrained(folder)
    if vlm:  # the release's layout: the text model under model.language_model., the config nested
        tensors = load_file(folder / "model.safetensors")
        save_file({k.replace("model.", "model.language_model.", 1) if k.startswith("model.") else k: v
                   for k, v in tensors.items()}, folder / "model.safetensors")
        text = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({"model_type": "qwen3_5_moe", "text_config": text}))
    return hf, folder


@pytest.mark.parametrize("vlm", [False, True])
def test_a_transformers_checkpoint_is_read_into_the_model(tmp_path, vlm: bool) -> None:
    hf, folder = _saved(tmp_path, vlm)
    checkpoint = Qwen35Checkpoint(folder)
    checkpoint.require(TINY)
    checkpoint.check_headers()
    ours = Qwen35(TINY, 64).eval()
    checkpoint.load_into(ours)
    tokens = torch.randint(0, TINY.vocab_size, (1, 17), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(ours(tokens), hf(tokens).logits, rtol=1e-4, atol=1e-4)
    # expert parallelism: a process holding experts 4-7 reads only theirs
    w1 = checkpoint.region("blocks.0.moe.experts.w1", (8, 64, 16), (slice(0, 4), slice(0, 64), slice(0, 16)), 4)
    torch.testing.assert_close(w1, ours.blocks[0].moe.experts.w1[4:].detach())


def test_a_damaged_checkpoint_is_one_line(tmp_path) -> None:
    from safetensors.torch import load_file, save_file

    _, folder = _saved(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(dict(config, num_experts=16)))
    with pytest.raises(TrainperfError, match="moe.experts 16 in the checkpoint, 8 in the recipe"):
        Qwen35Checkpoint(folder).require(TINY)
    (folder / "config.json").write_text(json.dumps(dict(config, rope_parameters={"rope_type": "yarn"})))
    with pytest.raises(TrainperfError, match="rotary scaling"):
        Qwen35Checkpoint(folder)
    (folder / "config.json").write_text(json.dumps(config))
    tensors = load_file(folder / "model.safetensors")
    del tensors["model.layers.1.mlp.experts.5.up_proj.weight"]
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(TrainperfError, match=r"no tensor model.layers.1.mlp.experts.5.up_proj.weight") as err:
        Qwen35Checkpoint(folder).check_headers()
    assert "\n" not in str(err.value)


def test_what_trainperf_writes_is_read_back_and_by_transformers(tmp_path) -> None:
    """The mini's shipped policy is written in the release's text-only layout: the family's reader gives the
    same model back, and `transformers` reads the folder to the same logits."""
    from trainperf.workloads.common.llm import hf_qwen35

    torch.manual_seed(3)
    model = Qwen35(TINY, 64).eval()
    model.reset_parameters()
    hf_qwen35.write(model, tmp_path / "policy", dtype=torch.float32)
    checkpoint = Qwen35Checkpoint(tmp_path / "policy")
    checkpoint.require(TINY)
    checkpoint.check_headers()
    back = Qwen35(TINY, 64).eval()
    checkpoint.load_into(back)
    tokens = torch.randint(0, TINY.vocab_size, (2, 19), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        expected = model(tokens)
        torch.testing.assert_close(back(tokens), expected)
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "Qwen3_5MoeForCausalLM"):
        pytest.skip("this transformers has no Qwen3.5")
    hf = transformers.Qwen3_5MoeForCausalLM.from_pretrained(tmp_path / "policy").eval()
    with torch.no_grad():
        torch.testing.assert_close(hf(tokens).logits, expected, rtol=1e-4, atol=1e-4)
