"""DeepSeek-V3's Hugging Face reader (workloads/common/llm/hf_deepseek.py) against `transformers` itself: a folder
`save_pretrained` writes (several shards and an index, with a multi-token prediction layer added in DeepSeek's
names, which transformers leaves out) read into trainperf's model gives transformers' logits, and the prediction
module's those of its layer built from transformers' own parts; any part of any tensor is read as that part of
the whole; FP8 weights with block scales (deepseek-ai's release) are read as their bf16 values; a config this
model cannot compute, a checkpoint of another model or a partial one is one line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from tests.workloads.test_moe_peers import randomised_deepseek
from trainperf.errors import TrainperfError
from trainperf.workloads.common.llm import hf
from trainperf.workloads.common.llm.hf_deepseek import DeepSeekCheckpoint, read_deepseek_config
from trainperf.workloads.common.llm.moe_model import MoETransformer

transformers = pytest.importorskip("transformers")

SEQ = 40  # far enough for YaRN's scaled wavelengths to differ from the unscaled
LAYERS = 3
VOCAB = 96


def _config(layers: int) -> object:
    return transformers.DeepseekV3Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=80, moe_intermediate_size=24, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1, n_routed_experts=8, num_experts_per_tok=3,
        n_group=4, topk_group=2, routed_scaling_factor=2.5, norm_topk_prob=True, kv_lora_rank=16, q_lora_rank=24,
        qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, first_k_dense_replace=1, rms_norm_eps=1e-6,
        max_position_embeddings=4096 * 40, tie_word_embeddings=False, attn_implementation="eager",
        num_nextn_predict_layers=1,
        rope_parameters={"rope_type": "yarn", "factor": 40.0, "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0,
                         "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096, "rope_theta": 10_000.0})


def _write(folder: Path, shard: str = "60KB") -> tuple[torch.nn.Module, torch.nn.Module, dict[str, torch.Tensor]]:
    """A DeepSeek-V3 of LAYERS blocks as transformers saves it (sharded, indexed), plus the multi-token prediction
    layer (index LAYERS) in DeepSeek's names, taken from a model of LAYERS + 1 blocks: (the model, the model of
    one block more whose last block is the prediction module's, the prediction module's own tensors)."""
    from safetensors.torch import load_file, save_file

    torch.manual_seed(0)
    bigger = randomised_deepseek(transformers.DeepseekV3ForCausalLM(_config(LAYERS + 1)))
    theirs = transformers.DeepseekV3ForCausalLM(_config(LAYERS)).eval()
    missing, _ = theirs.load_state_dict(bigger.state_dict(), strict=False)
    assert not missing
    theirs.save_pretrained(folder, max_shard_size=shard)
    scratch = folder / "scratch"
    bigger.save_pretrained(scratch)
    prefix = f"model.layers.{LAYERS}."
    block = {k: v for k, v in load_file(str(scratch / hf.SINGLE)).items() if k.startswith(prefix)}
    for path in scratch.iterdir():
        path.unlink()
    scratch.rmdir()
    gen = torch.Generator().manual_seed(3)
    own = {f"{prefix}enorm.weight": 0.5 + torch.rand(64, generator=gen),
           f"{prefix}hnorm.weight": 0.5 + torch.rand(64, generator=gen),
           f"{prefix}eh_proj.weight": 0.1 * torch.randn(64, 128, generator=gen),
           f"{prefix}shared_head.norm.weight": 0.5 + torch.rand(64, generator=gen),
           # DeepSeek's release keeps copies of the embedding and output layer in the module: not read again
           f"{prefix}embed_tokens.weight": torch.zeros(VOCAB, 64), f"{prefix}shared_head.head.weight":
               torch.zeros(VOCAB, 64)}
    save_file(block | own, str(folder / "model-mtp.safetensors"), metadata={"format": "pt"})
    index = json.loads((folder / hf.INDEX).read_text())
    index["weight_map"].update({name: "model-mtp.safetensors" for name in block | own})
    (folder / hf.INDEX).write_text(json.dumps(index))
    return theirs, bigger, own


def _tokens() -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(1))


def _expected_prediction(bigger: torch.nn.Module, own: dict[str, torch.Tensor], tokens: torch.Tensor
                         ) -> torch.Tensor:
    """DeepSeek-V3's multi-token prediction from transformers' parts: position i's last hidden state (before the
    final norm) and token i + 1's embedding, each RMS-normalised, projected from [embedding | hidden], through
    the module's decoder block, its norm and the shared output layer."""
    prefix = f"model.layers.{LAYERS}."
    inner = bigger.model
    kept: list[torch.Tensor] = []
    hook = inner.layers[LAYERS - 1].register_forward_hook(lambda m, i, o: kept.append(o[0] if isinstance(o, tuple)
                                                                                        else o))
    with torch.no_grad():
        bigger.model.layers, layers = bigger.model.layers[:LAYERS], bigger.model.layers
        try:
            bigger(input_ids=tokens)
        finally:
            bigger.model.layers = layers
    hook.remove()

    def norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))

    hidden = kept[0][:, :-1]
    with torch.no_grad():
        embedded = inner.embed_tokens(tokens[:, 1:])
        x = torch.cat([norm(embedded, own[f"{prefix}enorm.weight"]), norm(hidden, own[f"{prefix}hnorm.weight"])], -1)
        x = x @ own[f"{prefix}eh_proj.weight"].t()
        positions = torch.arange(SEQ - 1)[None]
        mask = torch.full((SEQ - 1, SEQ - 1), float("-inf")).triu(1)[None, None]
        x = inner.layers[LAYERS](x, attention_mask=mask, position_ids=positions,
                                 position_embeddings=inner.rotary_emb(x, positions))
        x = x[0] if isinstance(x, tuple) else x
        return bigger.lm_head(norm(x, own[f"{prefix}shared_head.norm.weight"]))


def test_a_folder_transformers_writes_is_read_into_the_same_model(tmp_path):
    """Latent attention with YaRN, grouped sigmoid routing with the correction biases, a shared and eight routed
    experts (each its own tensors), a dense first block, and the multi-token prediction module."""
    theirs, bigger, own = _write(tmp_path)
    assert len({p.name for p in tmp_path.glob("*.safetensors")}) > 2, "several shards, as the release's 163"
    checkpoint = DeepSeekCheckpoint(tmp_path)
    checkpoint.check_headers()
    ours = MoETransformer(checkpoint.config, SEQ)
    checkpoint.load_into(ours)
    tokens = _tokens()
    with torch.no_grad():
        expected = theirs(input_ids=tokens).logits
        found, _, predicted = ours.train()(tokens)
        assert torch.equal(found, ours.eval()(tokens)[0])
    assert torch.allclose(found, expected, atol=3e-5, rtol=1e-4), (found - expected).abs().max()
    further = _expected_prediction(bigger, own, tokens)
    assert predicted is not None and torch.allclose(predicted, further, atol=3e-5, rtol=1e-4), \
        (predicted - further).abs().max()
    for layer in (1, 2, LAYERS):  # the balancing biases, buffers not parameters, read too
        block = ours.mtp.block if layer == LAYERS else ours.blocks[layer]
        source = bigger.model.layers[layer].mlp.gate.e_score_correction_bias
        assert torch.equal(block.feed_forward.router.correction, source)


def test_any_part_of_any_tensor_is_read_as_that_part_of_the_whole(tmp_path):
    """What a shard reads (rows and columns cut anywhere, a run of experts counted from the first this process
    holds) is that part of the whole tensor: the launched processes' test holds the sharded model to
    transformers' logits."""
    _write(tmp_path)
    checkpoint = DeepSeekCheckpoint(tmp_path)
    with torch.device("meta"):
        shapes = {name: tuple(p.shape) for name, p in MoETransformer(checkpoint.config, SEQ).named_parameters()}
    for name in ("blocks.1.attention.wq_b.weight", "blocks.2.attention.wkv_b.weight", "mtp.proj.weight",
                 "blocks.0.feed_forward.w2.weight", "blocks.2.feed_forward.experts.w1",
                 "blocks.1.feed_forward.experts.w2", "mtp.block.feed_forward.experts.w3"):
        shape = shapes[name]
        whole = checkpoint.region(name, shape, tuple(slice(0, n) for n in shape))
        for rows in (slice(0, shape[0]), slice(1, 3), slice(shape[0] // 2, shape[0])):
            for cols in (slice(0, shape[1]), slice(5, 13)):
                rest = tuple(slice(0, n) for n in shape[2:])
                part = checkpoint.region(name, shape, (rows, cols, *rest))
                assert torch.equal(part, whole[(rows, cols, *rest)]), (name, rows, cols)
        if name.endswith("experts.w1"):  # expert parallelism: experts 4..7 are this process's 0..3
            local = (4, *shape[1:])
            part = checkpoint.region(name, local, (slice(1, 3), slice(0, shape[1]), slice(0, shape[2])), 4)
            assert torch.equal(part, whole[5:7])


def test_fp8_weights_with_block_scales_are_read_as_their_bf16_values(tmp_path):
    """deepseek-ai's release: 2-D weights in float8 e4m3 with an inverse scale per 128 x 128 block
    (`weight_scale_inv`); read as weight x scale in bf16, whatever part a shard reads (blocks cut anywhere)."""
    from safetensors.torch import load_file, save_file

    _write(tmp_path)
    block = (8, 16)
    config = json.loads((tmp_path / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                     "weight_block_size": list(block)}
    (tmp_path / "config.json").write_text(json.dumps(config))
    index = json.loads((tmp_path / hf.INDEX).read_text())
    expected: dict[str, torch.Tensor] = {}
    for shard in sorted({*index["weight_map"].values()}):
        tensors = load_file(str(tmp_path / shard))
        for name in [n for n in tensors if n.endswith("proj.weight") and ".experts." in n or "q_b_proj" in n]:
            w = tensors[name]
            blocks = [-(-n // b) for n, b in zip(w.shape, block, strict=True)]
            scale = 0.01 + torch.rand(blocks)
            full = scale.repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)[:w.shape[0], :w.shape[1]]
            tensors[name] = (w / full).to(torch.float8_e4m3fn)
            tensors[name + "_scale_inv"] = scale
            index["weight_map"][name + "_scale_inv"] = shard
            expected[name] = (tensors[name].float() * full).to(torch.bfloat16)
        save_file(tensors, str(tmp_path / shard), metadata={"format": "pt"})
    (tmp_path / hf.INDEX).write_text(json.dumps(index))
    checkpoint = DeepSeekCheckpoint(tmp_path)
    checkpoint.check_headers()
    read = checkpoint.region("blocks.1.attention.wq_b.weight", (96, 24), (slice(5, 30), slice(3, 21)))
    assert read.dtype == torch.bfloat16
    assert torch.equal(read, expected["model.layers.1.self_attn.q_b_proj.weight"][5:30, 3:21])
    experts = checkpoint.region("blocks.2.feed_forward.experts.w2", (8, 24, 64),
                                (slice(2, 5), slice(3, 19), slice(0, 64)))
    for e in range(2, 5):
        assert torch.equal(experts[e - 2], expected[f"model.layers.2.mlp.experts.{e}.down_proj.weight"][:, 3:19].t())
    # Without its scales an FP8 tensor is refused, never read as it is.
    first = next(n for n in index["weight_map"] if n.endswith("_scale_inv"))
    index["weight_map"].pop(first)
    (tmp_path / hf.INDEX).write_text(json.dumps(index))
    with pytest.raises(TrainperfError, match=re.escape(first.removesuffix("_scale_inv")) + ".*without block scales"):
        DeepSeekCheckpoint(tmp_path).check_headers()


@pytest.mark.parametrize(("changes", "message"), [
    ({"scoring_func": "softmax"}, "scoring_func is not sigmoid"),
    ({"norm_topk_prob": False}, "norm_topk_prob is not true"),
    ({"rope_interleave": False}, "rope_interleave is false"),
    ({"model_type": "llama"}, "not a DeepSeek-V3 config.json (ValueError: model_type is 'llama')"),
    ({"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10_000.0}},
     "rotary scaling of type 'linear'"),
    ({"quantization_config": {"quant_method": "bitsandbytes"}}, "only FP8 with a weight_block_size"),
])
def test_a_config_this_model_cannot_compute_is_refused_in_one_line(tmp_path, changes, message):
    _write(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text()) | changes
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(TrainperfError, match=re.escape(f"{tmp_path / 'config.json'}: ") + ".*" + re.escape(message)):
        DeepSeekCheckpoint(tmp_path)


def test_a_partial_checkpoint_is_refused_before_anything_is_read(tmp_path):
    _write(tmp_path)
    index = json.loads((tmp_path / hf.INDEX).read_text())
    del index["weight_map"]["model.layers.2.mlp.experts.5.up_proj.weight"]
    (tmp_path / hf.INDEX).write_text(json.dumps(index))
    with pytest.raises(TrainperfError, match="no tensor model.layers.2.mlp.experts.5.up_proj.weight"):
        DeepSeekCheckpoint(tmp_path).check_headers()


def _workload_recipe(folder: Path, **model: object) -> tuple[object, object]:
    from trainperf import registry

    workload = registry.get("deepseekv3_671b")
    config = read_deepseek_config(folder)
    shape = {"layers": config.layers, "dim": config.dim, "vocab_size": config.vocab_size, "heads": 4,
             "kv_heads": 4, "head_dim": 24, "q_rank": 24, "kv_rank": 16, "nope_dim": 16, "rope_dim": 8, "v_dim": 16,
             "dense_layers": 1, "ffn_dim": 80, "experts": 8, "top_k": 3, "expert_dim": 24, "groups": 4,
             "topk_groups": 2} | model
    recipe = workload.recipe("full").with_overrides(
        ["global_batch_size=2", "grad_accum_steps=1", f"seq_len={SEQ}", "ep=1", "checkpointing=none",
         "meta_init=false", "precision=fp32", "fused_optimizer=false", f"initial_checkpoint={folder}",
         *(f"model.{k}={v}" for k, v in shape.items())])
    return workload, recipe


def test_the_deepseek_recipes_start_from_the_checkpoint_they_name(tmp_path):
    """The full recipes continue from a checkpoint (`--data DIR` holds DIR/checkpoint/, as the reference
    continues from MLCommons' re-warmed DeepSeek-V3), built whole or on the meta device; a checkpoint of another
    architecture or vocabulary is one line before anything is written."""
    from trainperf import registry
    from trainperf.contract import Assets, RuntimeContext

    full = registry.get("deepseekv3_671b").recipe("full")
    assert full.initial_checkpoint == "checkpoint"
    theirs, bigger, _ = _write(tmp_path)
    workload, recipe = _workload_recipe(tmp_path)
    assets = Assets(workload.assets(recipe, None))
    workload.check_assets(recipe, assets)
    model = workload.build(recipe, RuntimeContext.create("cpu"), assets).model
    tokens = _tokens()
    with torch.no_grad():
        assert torch.allclose(model.eval()(tokens)[0], theirs(input_ids=tokens).logits, atol=3e-5, rtol=1e-4)
    for changes, differs in (({"vocab_size": 128}, f"vocab_size {VOCAB} in the checkpoint, 128 in the recipe"),
                             ({"top_k": 2}, "top_k 3 in the checkpoint, 2 in the recipe")):
        workload, recipe = _workload_recipe(tmp_path, **changes)
        where = re.escape(f"{tmp_path / 'config.json'}: ")
        with pytest.raises(TrainperfError, match=where + ".*" + re.escape(differs)):
            workload.check_assets(recipe, Assets(workload.assets(recipe, None)))
    # The training's own settings (its losses' weights, the balancing updates) are the recipe's, not the checkpoint's.
    workload, recipe = _workload_recipe(tmp_path, aux_loss_coeff=0.5, bias_update_rate=0.1)
    workload.check_assets(recipe, Assets(workload.assets(recipe, None)))
    assert recipe.model.aux_loss_coeff == 0.5


def _sharded_logits(folder: str, ep: int) -> list:
    """In each of two launched processes: the checkpoint read into the model built on the meta device, sharded by
    FSDP2 over both (ep=1) or with each MoE layer's experts split over them (ep=2), each process reading only its
    shards' parts and its own experts; the logits of fixed tokens and how many values this process read."""
    from trainperf.contract import ModelParts
    from trainperf.runtime import distributed
    from trainperf.runtime.fsdp import FSDPEngine

    ctx = distributed.init_from_env("cpu")
    try:
        workload, recipe = _workload_recipe(Path(folder))
        recipe = recipe.with_overrides([f"ep={ep}", "meta_init=true"])
        checkpoint = DeepSeekCheckpoint(Path(folder))
        read: list[int] = []
        region = checkpoint.region

        def counted(name, shape, where, first_expert=0):  # what this process read, to hold it to its share
            out = region(name, shape, where, first_expert)
            read.append(out.numel())
            return out

        checkpoint.region = counted
        with torch.device("meta"):
            model = MoETransformer(recipe.model, SEQ)
        model.weights_source = checkpoint
        parts = ModelParts(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.0),
                           loss_fn=lambda m, b: torch.zeros(()), lr_schedule=lambda steps: lambda s: 1.0)
        parts = FSDPEngine().apply(workload.parallelism(recipe), parts, recipe, ctx)
        with torch.no_grad():
            logits = parts.model.eval()(_tokens())[0]
        return [logits.tolist(), sum(read)]
    finally:
        distributed.shutdown()


@pytest.mark.second_tier
@pytest.mark.parametrize("ep", [1, 2], ids=["fsdp2", "ep2"])
def test_a_sharded_model_reads_its_shards_and_experts_and_gives_transformers_logits(tmp_path, ep):
    from tests.conftest import launch

    theirs, _, _ = _write(tmp_path)
    with torch.no_grad():
        expected = theirs(input_ids=_tokens()).logits
    with torch.device("meta"):  # every value read: parameters and the routers' correction biases
        whole = sum(t.numel() for t in MoETransformer(read_deepseek_config(tmp_path), SEQ).state_dict().values())
    for rank, (logits, read) in launch(_sharded_logits, str(tmp_path), ep).items():
        assert torch.allclose(torch.tensor(logits), expected, atol=3e-5, rtol=1e-4), rank
        # Each process reads about half of the model (its experts, its shards' rows), never all of it.
        assert read < 0.6 * whole, (rank, read, whole)
