"""FLUX.1's training step against diffusers' FluxTransformer2DModel, side by side in one process: the same depth,
width, heads, rotary axes, latent and text sizes, precision, AdamW (the recipe's settings and parameter groups),
gradient clipping and block recomputation; the peer's loop is the rectified-flow step a diffusers user writes
(the VAE posterior sampled, 2 x 2 patches packed, logit-normal timesteps, the velocity's mean squared error).
One step of each in turn, medians reported.

    python benchmarks/flux_peer.py                      # a CPU-sized check (the step probe: 1 + 1 blocks of 256)
    python benchmarks/flux_peer.py --device cuda --hidden 3072 --heads 24 --depth 2 --depth-single 4 \\
        --latent 32 --text 256 --context 4096 --batch-size 8 --precision bf16     # FLUX.1's blocks on one GPU

diffusers is a benchmark dependency (`pip install trainperf[peers]`).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from trainperf import devices, registry

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llm_peers import side_by_side, trainperf_step  # noqa: E402 - the other peers' loop, beside this script


def peer_step(args: argparse.Namespace, recipe: Any, device: torch.device) -> Callable[[], None]:
    try:
        from diffusers import FluxTransformer2DModel
    except ImportError:
        raise SystemExit("benchmarks/flux_peer.py needs diffusers (pip install trainperf[peers])") from None
    torch.manual_seed(0)
    model = FluxTransformer2DModel(patch_size=1, in_channels=64, num_layers=args.depth,
                                   num_single_layers=args.depth_single, attention_head_dim=args.hidden // args.heads,
                                   num_attention_heads=args.heads, joint_attention_dim=args.context,
                                   pooled_projection_dim=768, guidance_embeds=False,
                                   axes_dims_rope=tuple(recipe.model.axes_dim)).to(device)
    if recipe.checkpointing != "none":
        model.enable_gradient_checkpointing()
    model.train()
    trained = list(model.parameters())
    groups = [{"params": [p for p in trained if p.dim() > 1], "weight_decay": recipe.weight_decay},
              {"params": [p for p in trained if p.dim() <= 1], "weight_decay": 0.0}]
    kernels = {"fused": True} if device.type == "cuda" else {"foreach": True}
    optimizer = torch.optim.AdamW(groups, lr=recipe.base_lr, betas=(recipe.beta1, recipe.beta2), eps=recipe.eps,
                                  **kernels)
    gen = torch.Generator(device=device).manual_seed(0)
    rows, side = args.batch_size, args.latent
    mean = torch.randn(rows, 16, side, side, device=device, generator=gen)
    logvar = torch.randn(rows, 16, side, side, device=device, generator=gen) - 4
    t5 = torch.randn(rows, args.text, args.context, device=device, generator=gen)
    clip = torch.randn(rows, 768, device=device, generator=gen)
    half = side // 2
    grid = torch.stack(torch.meshgrid(torch.arange(half), torch.arange(half), indexing="ij"), -1).reshape(-1, 2)
    img_ids = torch.cat([torch.zeros(len(grid), 1), grid.float()], 1).to(device)
    txt_ids = torch.zeros(args.text, 3, device=device)

    def step() -> None:
        latents = mean + torch.exp(0.5 * logvar) * torch.randn_like(mean)
        packed = latents.view(rows, 16, half, 2, half, 2).permute(0, 2, 4, 1, 3, 5).reshape(rows, half * half, 64)
        t = torch.sigmoid(torch.randn(rows, device=device))
        noise = torch.randn_like(packed)
        noisy = (1 - t[:, None, None]) * packed + t[:, None, None] * noise
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            out = model(hidden_states=noisy, encoder_hidden_states=t5, pooled_projections=clip, timestep=t,
                        img_ids=img_ids, txt_ids=txt_ids).sample
        loss = F.mse_loss(out.float(), noise - packed)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trained, recipe.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default=None)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--depth", type=int, default=1)
    parser.add_argument("--depth-single", type=int, default=1)
    parser.add_argument("--latent", type=int, default=8, help="latent side (the image's / 8)")
    parser.add_argument("--text", type=int, default=16, help="T5 tokens")
    parser.add_argument("--context", type=int, default=512, help="T5 width")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--precision", default=None, choices=("bf16", "fp32"))
    args = parser.parse_args()
    device = devices.resolve(args.device)
    args.precision = args.precision or ("bf16" if device.type == "cuda" else "fp32")
    workload = registry.get("flux1")
    recipe = workload.recipe("full").with_overrides([
        f"global_batch_size={args.batch_size}", f"model.hidden={args.hidden}", f"model.heads={args.heads}",
        f"model.depth={args.depth}", f"model.depth_single={args.depth_single}", f"latent_size={args.latent}",
        f"text_tokens={args.text}", f"model.context_in_dim={args.context}", f"precision={args.precision}",
        f"fused_optimizer={'true' if device.type == 'cuda' else 'false'}"])
    theirs, ours = side_by_side(peer_step(args, recipe, device), trainperf_step(workload, recipe, device), device,
                                args.batch_size, args.warmup, args.reps)
    t, o = statistics.median(theirs), statistics.median(ours)
    ratios = ", ".join(f"{b / a:.2f}" for a, b in zip(theirs, ours, strict=True))
    print(f"flux: {args.depth} + {args.depth_single} blocks of {args.hidden} ({args.heads} heads), latents "
          f"{args.latent} x {args.latent}, {args.text} text tokens of {args.context}, batch {args.batch_size}, "
          f"{args.precision}, AdamW, {'recomputed, ' if recipe.checkpointing != 'none' else ''}{device}, "
          f"{args.warmup} warm-up steps each, then {args.reps} of each in turn (medians)")
    print(f"diffusers FluxTransformer2DModel: {t:.3f} images/s; trainperf bench flux1: {o:.3f} images/s; "
          f"trainperf / peer: {o / t:.2f}x (per rep: {ratios})")


if __name__ == "__main__":
    main()
