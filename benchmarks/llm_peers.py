"""The current round's steps against what users would run instead, side by side in one process: trainperf's
Llama 3.1 step (`bench llama31_8b`) against Hugging Face `transformers`' LlamaForCausalLM, and trainperf's LoRA
step (`bench llama2_70b_lora`) against PEFT's LoRA on that model: the same configuration, precision,
optimizer (AdamW with the recipe's settings), gradient clipping, recomputation, batch and sequence length,
alternated, medians reported.

    python benchmarks/llm_peers.py --pair llama                           # a CPU-sized check (2 blocks of 512)
    python benchmarks/llm_peers.py --pair lora
    python benchmarks/llm_peers.py --pair moe --dim 256 --kv-heads 2    # GPT-OSS as its card builds it
    python benchmarks/llm_peers.py --pair llama --device cuda --dim 4096 --layers 4 --ffn 14336 --heads 32 \\
        --kv-heads 8 --vocab 128256 --seq 8192 --batch-size 1 --precision bf16           # Llama 3.1 8B's blocks

transformers and peft are benchmark dependencies (`pip install trainperf[peers]`), not trainperf's.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from trainperf import devices, registry
from trainperf.contract import Assets, RuntimeContext
from trainperf.runtime import speedups
from trainperf.runtime.step import TrainStep

WORKLOADS = {"llama": "llama31_8b", "lora": "llama2_70b_lora", "moe": "gpt_oss_20b"}
# trainperf's GPT-OSS as the model card builds it (what transformers' GptOssForCausalLM implements: attention
# sinks and biases, router and expert biases, the clamped SwiGLU, no QK norm); the MLPerf reference differs.
MOE_AS_THE_CARD = ("model.sinks=true", "model.attention_bias=true", "model.router_bias=true", "model.expert_bias=true",
                   "model.activation=gpt_oss_swiglu", "model.qk_norm=false", "ep=1")


def hf_llama(args: argparse.Namespace, device: torch.device) -> torch.nn.Module:
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError:
        raise SystemExit("benchmarks/llm_peers.py needs transformers (pip install trainperf[peers])") from None
    config = LlamaConfig(vocab_size=args.vocab, hidden_size=args.dim, intermediate_size=args.ffn,
                         num_hidden_layers=args.layers, num_attention_heads=args.heads,
                         num_key_value_heads=args.kv_heads, max_position_embeddings=args.seq, rms_norm_eps=1e-5,
                         rope_theta=500_000.0, tie_word_embeddings=False, attn_implementation="sdpa",
                         use_cache=False)
    return LlamaForCausalLM(config).to(device)


def hf_gpt_oss(args: argparse.Namespace, device: torch.device) -> torch.nn.Module:
    from transformers import GptOssConfig, GptOssForCausalLM

    config = GptOssConfig(vocab_size=args.vocab, hidden_size=args.dim, intermediate_size=args.expert_dim,
                          num_hidden_layers=args.layers, num_attention_heads=args.heads,
                          num_key_value_heads=args.kv_heads, head_dim=args.head_dim, num_local_experts=args.experts,
                          num_experts_per_tok=args.top_k, sliding_window=args.window,
                          layer_types=["sliding_attention" if i % 2 == 0 else "full_attention"
                                       for i in range(args.layers)],
                          max_position_embeddings=args.seq, rms_norm_eps=1e-6, tie_word_embeddings=False,
                          attn_implementation="eager", use_cache=False, router_aux_loss_coef=0.0)
    return GptOssForCausalLM(config).to(device)


def peer(args: argparse.Namespace, recipe: Any, device: torch.device) -> tuple[torch.nn.Module, Any]:
    """The peer's model and optimizer, as a user of transformers (and PEFT) writes them."""
    torch.manual_seed(0)
    model = hf_gpt_oss(args, device) if args.pair == "moe" else hf_llama(args, device)
    if args.pair == "lora":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=recipe.lora_rank, lora_alpha=recipe.lora_alpha,
                                                 lora_dropout=recipe.lora_dropout,
                                                 target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    if recipe.checkpointing != "none":  # trainperf recomputes each block in the backward: so does the peer
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    kernels = {"fused": True} if device.type == "cuda" else {"foreach": True}
    trained = [p for p in model.parameters() if p.requires_grad]
    # As Hugging Face's Trainer and Megatron: no weight decay on the norms' scales (the 1-D parameters).
    groups = [{"params": [p for p in trained if p.dim() > 1], "weight_decay": recipe.weight_decay},
              {"params": [p for p in trained if p.dim() <= 1], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=recipe.base_lr, betas=(recipe.beta1, recipe.beta2), eps=recipe.eps,
                                  **kernels)
    return model, optimizer


def peer_step(args: argparse.Namespace, recipe: Any, device: torch.device) -> Callable[[], None]:
    """One training step of the peer's loop, as its users write it."""
    model, optimizer = peer(args, recipe, device)
    model.train()
    generator = torch.Generator(device=device).manual_seed(0)
    tokens = torch.randint(0, args.vocab, (args.batch_size, args.seq), device=device, generator=generator)
    trained = [p for p in model.parameters() if p.requires_grad]

    def step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trained, recipe.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def trainperf_step(workload: Any, recipe: Any, device: torch.device) -> Callable[[], Any]:
    """One step of trainperf's training loop for the workload's full recipe (as `bench` builds it)."""
    ctx = RuntimeContext.create(str(device))
    torch.manual_seed(0)
    parts = speedups.assemble(workload, recipe, ctx, Assets(workload.assets(recipe, None)))
    step = TrainStep(parts, 1000, recipe, device, ctx=ctx, split=workload.split_batch, count=workload.batch_samples)
    batch = workload.synthetic_batch(recipe, ctx, parts.model)
    parts.model.train()
    return lambda: step(batch)


def timed(step: Callable[[], Any], device: torch.device) -> float:
    devices.synchronize(device)
    start = time.perf_counter()
    step()
    devices.synchronize(device)
    return time.perf_counter() - start


def side_by_side(theirs_step: Callable[[], Any], ours_step: Callable[[], Any], device: torch.device, rows: int,
                 warmup: int, reps: int) -> tuple[list[float], list[float]]:
    """Samples per second of each step, one step of each in turn (the machine's noise falls on both alike)."""
    for _ in range(warmup):
        timed(theirs_step, device), timed(ours_step, device)
    theirs, ours = [], []
    for _ in range(reps):
        theirs.append(rows / timed(theirs_step, device))
        ours.append(rows / timed(ours_step, device))
    return theirs, ours


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pair", choices=sorted(WORKLOADS), default="llama")
    parser.add_argument("--device", default=None, help="cuda, cuda:N or cpu (default: cuda when present)")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--ffn", type=int, default=1792)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--head-dim", type=int, default=32, help="moe: each head's size")
    parser.add_argument("--experts", type=int, default=8, help="moe: routed experts a layer")
    parser.add_argument("--top-k", type=int, default=2, help="moe: experts a token")
    parser.add_argument("--expert-dim", type=int, default=256, help="moe: each expert's hidden size")
    parser.add_argument("--window", type=int, default=128, help="moe: the sliding window of every other block")
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=2, help="steps of each before the timed ones")
    parser.add_argument("--reps", type=int, default=15, help="timed steps of each, alternated; medians reported")
    parser.add_argument("--precision", default=None, choices=("bf16", "fp32"),
                        help="both sides (default: bf16 on a GPU, fp32 on a CPU)")
    args = parser.parse_args()
    device = devices.resolve(args.device)
    args.precision = args.precision or ("bf16" if device.type == "cuda" else "fp32")
    workload = registry.get(WORKLOADS[args.pair])
    sets = [f"global_batch_size={args.batch_size}", f"seq_len={args.seq}", f"model.layers={args.layers}",
            f"model.dim={args.dim}", f"model.heads={args.heads}", f"model.kv_heads={args.kv_heads}",
            f"model.vocab_size={args.vocab}", f"precision={args.precision}",
            f"fused_optimizer={'true' if device.type == 'cuda' else 'false'}"]
    if args.pair == "moe":
        sets += [f"model.head_dim={args.head_dim}", f"model.experts={args.experts}", f"model.top_k={args.top_k}",
                 f"model.expert_dim={args.expert_dim}", f"model.window={args.window}", *MOE_AS_THE_CARD]
    else:
        sets.append(f"model.ffn_dim={args.ffn}")
    recipe = workload.recipe("full").with_overrides(sets)
    theirs, ours = side_by_side(peer_step(args, recipe, device), trainperf_step(workload, recipe, device), device,
                                args.batch_size, args.warmup, args.reps)
    name = {"llama": "transformers LlamaForCausalLM (SDPA)", "lora": "PEFT LoRA on transformers' Llama",
            "moe": "transformers GptOssForCausalLM (eager attention: its sinks)"}[args.pair]
    t, o = statistics.median(theirs), statistics.median(ours)
    width = (f"{args.experts} experts of {args.expert_dim}, top {args.top_k}" if args.pair == "moe"
             else f"ffn {args.ffn}")
    print(f"{args.pair}: {args.layers} blocks of {args.dim} ({width}, {args.heads}/{args.kv_heads} heads), "
          f"vocab {args.vocab}, seq {args.seq}, batch {args.batch_size}, {args.precision}, AdamW"
          f"{', recomputed' if recipe.checkpointing != 'none' else ''}, {device}, {args.warmup} warm-up steps each, "
          f"then {args.reps} steps of each in turn (medians)")
    ratios = ", ".join(f"{b / a:.2f}" for a, b in zip(theirs, ours, strict=True))
    print(f"{name}: {t:.3f} sequences/s; trainperf bench {workload.name}: {o:.3f} sequences/s; "
          f"trainperf / peer: {o / t:.2f}x (per rep: {ratios})")


if __name__ == "__main__":
    main()
