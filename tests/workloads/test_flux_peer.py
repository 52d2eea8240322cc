"""trainperf's FLUX.1 transformer against `diffusers`' FluxTransformer2DModel (what users of FLUX.1-schnell run),
on a tiny configuration, CPU, fp32, the same weights: the same prediction. One difference is the reference's
and kept: its query/key norms are torch's RMSNorm without an epsilon (diffusers adds 1e-6), a relative 1e-6."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from trainperf.workloads.flux1.model import FLUX1_SCHNELL, Flux

diffusers = pytest.importorskip("diffusers")

CONFIG = dataclasses.replace(FLUX1_SCHNELL, hidden=128, heads=4, depth=2, depth_single=2, axes_dim=(8, 12, 12),
                             vec_in_dim=24, context_in_dim=40)


def _diffusers_state(ours: Flux) -> dict[str, torch.Tensor]:
    """trainperf's (Black Forest Labs') names and layout -> diffusers': q, k and v split, the single blocks'
    fused input split into attention and MLP, the final modulation's (shift, scale) swapped to (scale, shift)."""
    h, s = CONFIG.hidden, dict(ours.state_dict())
    out = {"x_embedder.weight": s["img_in.weight"], "x_embedder.bias": s["img_in.bias"],
           "context_embedder.weight": s["txt_in.weight"], "context_embedder.bias": s["txt_in.bias"],
           "proj_out.weight": s["final_layer.linear.weight"], "proj_out.bias": s["final_layer.linear.bias"]}
    for ours_name, theirs in (("time_in", "timestep_embedder"), ("vector_in", "text_embedder")):
        for a, b in (("in_layer", "linear_1"), ("out_layer", "linear_2")):
            for kind in ("weight", "bias"):
                out[f"time_text_embed.{theirs}.{b}.{kind}"] = s[f"{ours_name}.{a}.{kind}"]
    for kind in ("weight", "bias"):
        shift, scale = s[f"final_layer.adaLN_modulation.{kind}"].chunk(2)
        out[f"norm_out.linear.{kind}"] = torch.cat([scale, shift])
    for i in range(CONFIG.depth):
        ours_block, theirs = f"blocks.{i}.", f"transformer_blocks.{i}."
        for stream, norm, q, ff, proj, qn in (("img", "norm1", "to_", "ff", "attn.to_out.0", "norm_"),
                                              ("txt", "norm1_context", "add_", "ff_context", "attn.to_add_out",
                                               "norm_added_")):
            p = f"{ours_block}{stream}."
            for kind in ("weight", "bias"):
                out[f"{theirs}{norm}.linear.{kind}"] = s[f"{p}mod.lin.{kind}"]
                for name, part in zip("qkv", s[f"{p}qkv.{kind}"].chunk(3), strict=True):
                    out[f"{theirs}attn.{q}{name}{'_proj' if q == 'add_' else ''}.{kind}"] = part
                out[f"{theirs}{proj}.{kind}"] = s[f"{p}proj.{kind}"]
                out[f"{theirs}{ff}.net.0.proj.{kind}"] = s[f"{p}mlp_in.{kind}"]
                out[f"{theirs}{ff}.net.2.{kind}"] = s[f"{p}mlp_out.{kind}"]
            out[f"{theirs}attn.{qn}q.weight"] = s[f"{p}query_norm.weight"]
            out[f"{theirs}attn.{qn}k.weight"] = s[f"{p}key_norm.weight"]
    for j in range(CONFIG.depth_single):
        ours_block, theirs = f"blocks.{CONFIG.depth + j}.", f"single_transformer_blocks.{j}."
        for kind in ("weight", "bias"):
            q, k, v, mlp = s[f"{ours_block}linear1.{kind}"].split([h, h, h, CONFIG.mlp_hidden])
            out.update({f"{theirs}attn.to_q.{kind}": q, f"{theirs}attn.to_k.{kind}": k,
                        f"{theirs}attn.to_v.{kind}": v, f"{theirs}proj_mlp.{kind}": mlp,
                        f"{theirs}norm.linear.{kind}": s[f"{ours_block}modulation.lin.{kind}"],
                        f"{theirs}proj_out.{kind}": s[f"{ours_block}linear2.{kind}"]})
        out[f"{theirs}attn.norm_q.weight"] = s[f"{ours_block}query_norm.weight"]
        out[f"{theirs}attn.norm_k.weight"] = s[f"{ours_block}key_norm.weight"]
    return out


def test_flux_schnell_gives_diffusers_prediction():
    torch.manual_seed(0)
    ours = Flux(CONFIG).eval()
    with torch.no_grad():  # zero-initialised layers (the modulations, the final layer) would hide their mapping
        for name, p in ours.named_parameters():
            p.uniform_(0.5, 1.5) if "norm" in name else p.normal_(std=0.05)
    theirs = diffusers.FluxTransformer2DModel(
        patch_size=1, in_channels=CONFIG.latent_channels * CONFIG.patch ** 2, num_layers=CONFIG.depth,
        num_single_layers=CONFIG.depth_single, attention_head_dim=CONFIG.head_dim, num_attention_heads=CONFIG.heads,
        joint_attention_dim=CONFIG.context_in_dim, pooled_projection_dim=CONFIG.vec_in_dim, guidance_embeds=False,
        axes_dims_rope=CONFIG.axes_dim).eval()
    theirs.load_state_dict(_diffusers_state(ours), strict=True)  # every tensor of theirs, none left over
    rows, cols, text = 4, 6, 5
    generator = torch.Generator().manual_seed(1)
    img = torch.randn(2, rows * cols, CONFIG.latent_channels * CONFIG.patch ** 2, generator=generator)
    txt = torch.randn(2, text, CONFIG.context_in_dim, generator=generator)
    pooled = torch.randn(2, CONFIG.vec_in_dim, generator=generator)
    t = torch.rand(2, generator=generator)
    image_ids = torch.stack([torch.zeros(rows * cols), torch.arange(rows).repeat_interleave(cols).float(),
                             torch.arange(cols).repeat(rows).float()], dim=-1)
    with torch.no_grad():
        expected = theirs(hidden_states=img, encoder_hidden_states=txt, pooled_projections=pooled, timestep=t,
                          img_ids=image_ids, txt_ids=torch.zeros(text, 3), return_dict=False)[0]
        found = ours(img, txt, pooled, t, torch.zeros(2), rows, cols)
    assert found.shape == expected.shape
    error = (found - expected).abs().max() / expected.abs().max()
    assert error < 1e-4, error
