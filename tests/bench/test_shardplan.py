"""`trainperf plan` for a fully sharded model: the activation count it rests on equals what autograd keeps
(saved-tensor hooks on a small Llama under bf16 autocast), and the 405B's layouts follow from it."""

from __future__ import annotations

import json

import torch

from trainperf import registry
from trainperf.bench import shardplan
from trainperf.cli import main
from trainperf.workloads.common.llm.model import Llama, LlamaConfig, next_token_loss

SEQ = 128


def _saved_per_token_tensors(layers: int) -> int:
    """Bytes autograd keeps for the backward, the tensors that grow with the sequence (not the weights'
    bf16 casts, which FSDP's bf16 parameters do not need)."""
    config = LlamaConfig(layers=layers, dim=192, heads=6, kv_heads=2, ffn_dim=640, vocab_size=1000,
                         rope_original_context=SEQ)
    torch.manual_seed(0)
    model = Llama(config, SEQ)
    own = {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}
    seen: dict[int, tuple[int, tuple[int, ...]]] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        seen[t.untyped_storage().data_ptr()] = (t.untyped_storage().nbytes(), tuple(t.shape))
        return t

    with torch.autocast("cpu", dtype=torch.bfloat16), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        next_token_loss(model, torch.randint(0, 1000, (1, SEQ + 1)))
    return sum(size for ptr, (size, shape) in seen.items() if ptr not in own and SEQ in shape)


def test_a_blocks_activation_count_is_what_autograd_keeps():
    one_block = _saved_per_token_tensors(2) - _saved_per_token_tensors(1)
    counted = []
    for layers in (1, 2):
        with torch.device("meta"):
            model = Llama(LlamaConfig(layers=layers, dim=192, heads=6, kv_heads=2, ffn_dim=640, vocab_size=1000), SEQ)
        counted.append(model.activation_bytes(SEQ, 1, "none"))
    assert one_block == counted[1] - counted[0] == SEQ * (34 * 192 + 8 * 640 + 8 + 4 * 6)


def test_the_405b_needs_tensor_parallelism_and_full_checkpointing_on_80gb():
    workload = registry.get("llama31_405b")
    recipe = workload.recipe("full")
    rows = shardplan.plan(workload, recipe, 80 * 2**30, devices=1152)
    fits = {(r["tp"], r["checkpointing"]): r["fewest"] for r in rows}
    assert set(fits) == {(tp, c) for tp in (1, 2, 4, 8) for c in ("none", "selective", "full")}
    assert all(fits[(tp, c)] is None for tp in (1, 2, 4, 8) for c in ("none", "selective"))
    best = fits[(8, "full")]
    assert best["gpus"] == 128 and best["dp"] == 16 and best["need"] <= 80 * 2**30
    assert best["state"] == 402_724_438_016 * 16 // 128  # fp32 weights, gradients and two moments, sharded
    # The next smaller data-parallel size (12: 96 GPUs) would not fit.
    assert shardplan.layout(shardplan.shape_of(workload, recipe), 8, "full", 12).need > 80 * 2**30
    at = {(r["tp"], r["checkpointing"]): r["at_devices"] for r in rows}
    assert at[(8, "full")]["fits"] and at[(8, "full")]["gpus"] == 1152


def test_plan_prints_the_layouts_and_writes_json(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert main(["plan", "llama31_405b", "--devices", "64", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "| 8 | full | 128 (16 x 8) |" in text and "does not fit |" in text
    saved = json.loads(out.read_text())
    assert saved["workload"] == "llama31_405b" and len(saved["layouts"]) == 12


def test_plan_refuses_what_it_cannot_lay_out(capsys):
    assert main(["plan", "dlrm"]) == 2
    assert "--devices N is required" in capsys.readouterr().err
    assert main(["plan", "llama31_405b", "--memory", "eighty"]) == 2
    assert "--memory 'eighty': expected a size" in capsys.readouterr().err
