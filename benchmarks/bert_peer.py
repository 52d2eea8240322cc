"""BERT-Large pretraining steps: Hugging Face `transformers`' BertForPreTraining (the peer users know:
SDPA attention, bf16 autocast, torch's fused AdamW) against `trainperf bench bert` on the same device,
batch and sequence length, alternated, medians reported, with each one's model FLOPs and MFU.

    python benchmarks/bert_peer.py --device cuda --batch-size 32 --steps 20 --warmup 5     # one GPU
    python benchmarks/bert_peer.py --batch-size 2 --seq 128 --layers 2 --steps 2 --warmup 1 # a CPU check
    python benchmarks/bert_peer.py --batch-size 2 --seq 128 --predictions 20 --steps 6 --warmup 2 \
        --precision fp32 --optimizer lamb                                                   # BERT-Large, a CPU

transformers is not a trainperf dependency: `pip install transformers` to run this. trainperf's step
is its full recipe's (LAMB, the reference's optimizer, multi-tensor by default on a GPU; --packing
optional); the peer's is what a Hugging Face user writes (AdamW), so the optimizer step differs, as it
does between the two in practice; `--optimizer lamb` gives the peer trainperf's LAMB over the same parameter
groups, so that only the model and the loop differ. `--precision fp32` on a CPU: Hugging Face's model in
bf16 autocast took 360 s for one backward here (its forward 9.8 s; 3.9 s in fp32).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.utils.flop_counter import FlopCounterMode

from trainperf import devices, registry
from trainperf.bench import throughput


def hf_model(layers: int, hidden: int, heads: int, vocab: int, seq: int, device: torch.device) -> torch.nn.Module:
    try:
        from transformers import BertConfig, BertForPreTraining
    except ImportError:
        raise SystemExit("benchmarks/bert_peer.py needs transformers (pip install transformers)") from None
    config = BertConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                        intermediate_size=4 * hidden, max_position_embeddings=max(512, seq), attn_implementation="sdpa")
    return BertForPreTraining(config).to(device)


def hf_batch(batch: int, seq: int, vocab: int, predictions: int, device: torch.device) -> dict[str, torch.Tensor]:
    gen = torch.Generator(device=device).manual_seed(0)
    ids = torch.randint(5, vocab, (batch, seq), device=device, generator=gen)
    labels = torch.full_like(ids, -100)
    masked = torch.rand(batch, seq, device=device, generator=gen).argsort(1)[:, :predictions]
    labels.scatter_(1, masked, ids.gather(1, masked))
    return {"input_ids": ids, "token_type_ids": (torch.arange(seq, device=device) >= seq // 2).long().expand(batch, -1),
            "attention_mask": torch.ones_like(ids), "labels": labels,
            "next_sentence_label": torch.randint(0, 2, (batch,), device=device, generator=gen)}


def hf_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: dict[str, torch.Tensor],
            device: torch.device, precision: str = "bf16") -> None:
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
        loss = model(**batch).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def hf_rate(args: argparse.Namespace, device: torch.device) -> tuple[float, float]:
    """(sequences/s, FLOPs per sequence) of the Hugging Face loop."""
    torch.manual_seed(0)
    model = hf_model(args.layers, args.hidden, args.heads, 30522, args.seq, device)
    if args.optimizer == "lamb":
        from trainperf.optim import LAMB
        from trainperf.workloads.bert.model import parameter_groups

        optimizer: torch.optim.Optimizer = LAMB(parameter_groups(model, 0.01), lr=1e-4, foreach=True)
    else:
        fused = {"fused": True} if device.type == "cuda" else {"foreach": True}
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, **fused)
    batch = hf_batch(args.batch_size, args.seq, 30522, args.predictions, device)
    with FlopCounterMode(display=False) as counter:
        hf_step(model, optimizer, batch, device, args.precision)
    for _ in range(args.warmup):
        hf_step(model, optimizer, batch, device, args.precision)
    devices.synchronize(device)
    start = time.perf_counter()
    for _ in range(args.steps):
        hf_step(model, optimizer, batch, device, args.precision)
    devices.synchronize(device)
    return args.batch_size * args.steps / (time.perf_counter() - start), counter.get_total_flops() / args.batch_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default=None, help="cuda, cuda:N or cpu (default: cuda when present)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--predictions", type=int, default=76)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--reps", type=int, default=3, help="alternating repetitions; medians are reported")
    parser.add_argument("--precision", default="bf16", choices=("bf16", "fp32"), help="both sides (default bf16)")
    parser.add_argument("--optimizer", default="adamw", choices=("adamw", "lamb"),
                        help="the peer's: AdamW (a Hugging Face user's) or trainperf's LAMB (the same as trainperf's)")
    parser.add_argument("--packing", action="store_true", help="trainperf packs short sequences (its option)")
    args = parser.parse_args()
    device = devices.resolve(args.device)
    workload = registry.get("bert")
    sets = [f"global_batch_size={args.batch_size}", f"max_seq_length={args.seq}", f"max_predictions={args.predictions}",
            f"layers={args.layers}", f"hidden={args.hidden}", f"heads={args.heads}", f"intermediate={4 * args.hidden}",
            "checkpoint=none", f"precision={args.precision}", f"packing={'true' if args.packing else 'false'}"]
    recipe = workload.recipe("full").with_overrides(sets)
    theirs, ours, peak_src = [], [], None
    for _ in range(args.reps):
        rate, flops = hf_rate(args, device)
        theirs.append(rate)
        result = throughput.run_bench(workload, recipe, "full", None, True, args.steps, args.warmup, str(device))
        ours.append(result.samples_per_s)
        peak_src = (result.peak_tflops, result.peak_source)
        print(f"Hugging Face {rate:8.2f} sequences/s   trainperf {result.samples_per_s:8.2f} sequences/s", flush=True)
    t, o = statistics.median(theirs), statistics.median(ours)
    peak, source = peak_src
    print(f"BERT ({args.layers} layers, hidden {args.hidden}), seq {args.seq}, batch {args.batch_size}, "
          f"{args.precision}, {args.steps} steps after {args.warmup} warm-up, {device}, medians of {args.reps}")
    peer_name = f"Hugging Face BertForPreTraining (SDPA, {'LAMB' if args.optimizer == 'lamb' else 'AdamW'})"
    for name, rate, per in ((peer_name, t, flops),
                            ("trainperf bench bert (LAMB" + (", packed" if args.packing else "") + ")", o,
                             result.flops_per_sample)):
        mfu = f"MFU {rate * per / 1e12 / peak:.1%}" if peak else f"MFU n/a ({source})"
        print(f"{name}: {rate:.2f} sequences/s, {per / 1e9:.1f} GFLOP per sequence, {mfu}")
    print(f"trainperf / Hugging Face: {o / t:.2f}x")


if __name__ == "__main__":
    main()
