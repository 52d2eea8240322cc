"""The Llama family's Hugging Face reader and writer (workloads/common/llm/hf.py) against `transformers` itself:
a folder `save_pretrained` writes (5.x's `rope_parameters`, or 4.x's `rope_theta` + `rope_scaling`) read into
trainperf's Llama gives transformers' logits, a folder trainperf writes builds the same model in transformers,
and every config the Llama cannot compute is refused in one line, never read with a default."""

from __future__ import annotations

import json
import re

import pytest
import torch

from trainperf.errors import TrainperfError
from trainperf.workloads.common.llm import hf
from trainperf.workloads.common.llm.model import Llama, LlamaConfig

transformers = pytest.importorskip("transformers")

# Llama 3.1's shape in miniature: grouped queries, a 500,000 base and Llama 3's rotary scaling, at an original
# context short enough that the 24 positions below span scaled, blended and kept wavelengths.
SCALED = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 16}
TINY = LlamaConfig(layers=2, dim=64, heads=4, kv_heads=2, ffn_dim=96, vocab_size=80, norm_eps=1e-5,
                   rope_theta=500_000.0, rope_factor=8.0, rope_low_freq_factor=1.0, rope_high_freq_factor=4.0,
                   rope_original_context=16)
SEQ = 24


def _theirs(rope: dict | None = SCALED, theta: float = 500_000.0) -> torch.nn.Module:
    config = transformers.LlamaConfig(
        vocab_size=80, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, rms_norm_eps=1e-5, max_position_embeddings=256, tie_word_embeddings=False,
        rope_parameters={"rope_theta": theta, **(rope or {"rope_type": "default"})})
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():  # transformers initialises the norms to 1: other scales, so that they are read too
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return model


def _logits_equal(theirs: torch.nn.Module, ours: Llama) -> None:
    tokens = torch.randint(0, 80, (2, SEQ), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = theirs(input_ids=tokens).logits
        found = ours.eval()(tokens)
    assert found.shape == expected.shape
    assert torch.allclose(found, expected, atol=2e-5, rtol=1e-5), (found - expected).abs().max()


def _read(folder) -> Llama:
    checkpoint = hf.Checkpoint(folder)
    model = Llama(checkpoint.config, SEQ)
    checkpoint.load_into(model)
    return model


def test_a_folder_transformers_5_writes_is_read_into_the_same_model(tmp_path):
    theirs = _theirs()
    theirs.save_pretrained(tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    assert "rope_parameters" in written and "rope_scaling" not in written, "transformers 5's layout"
    assert hf.read_config(tmp_path) == TINY
    _logits_equal(theirs, _read(tmp_path))


def test_the_layout_of_transformers_4_is_read_as_the_same_model(tmp_path):
    theirs = _theirs()
    theirs.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    params = config.pop("rope_parameters")
    config["rope_theta"] = params.pop("rope_theta")
    config["rope_scaling"] = params
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert hf.read_config(tmp_path) == TINY
    _logits_equal(theirs, _read(tmp_path))


def test_an_unscaled_llama_2_folder_keeps_its_base(tmp_path):
    theirs = _theirs(rope=None, theta=10_000.0)
    theirs.save_pretrained(tmp_path)
    config = hf.read_config(tmp_path)
    assert (config.rope_theta, config.rope_factor) == (10_000.0, 0.0)
    _logits_equal(theirs, _read(tmp_path))


def test_what_trainperf_writes_transformers_builds_as_the_same_model(tmp_path):
    torch.manual_seed(2)
    ours = Llama(TINY, SEQ)
    ours.reset_parameters()
    hf.write(ours, TINY, tmp_path, dtype=torch.float32)
    assert hf.read_config(tmp_path) == TINY, "the writer writes what the reader reads: Llama 3.1's scaling kept"
    theirs = transformers.LlamaForCausalLM.from_pretrained(tmp_path, torch_dtype=torch.float32).eval()
    assert theirs.config.rope_parameters["rope_type"] == "llama3"
    _logits_equal(theirs, ours)


def _config(**changes) -> dict:
    config = hf.config_json(TINY, torch.float32)
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    return config


@pytest.mark.parametrize("changes, message", [
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 5e5, "factor": 4.0}, "rope_scaling": None},
     "rope_parameters of type 'yarn': this Llama computes Llama 3's scaling (llama3) or none"),
    ({"rope_scaling": {**SCALED, "factor": 4.0}},
     "rope_scaling and rope_parameters describe different rotary scalings"),
    ({"rope_theta": 10_000.0}, "rope_theta 10000.0 and rope_parameters.rope_theta 500000.0 differ"),
    ({"rope_parameters": {"rope_type": "default"}, "rope_scaling": None, "rope_theta": None},
     "rope_parameters has no rope_theta"),
    ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}, "rope_scaling": None},
     "rope_parameters of type 'llama3' has no low_freq_factor, high_freq_factor, original_max_position_embeddings"),
    ({"rope_scaling": "llama3"}, "rope_scaling is 'llama3', expected an object or null"),
    ({"head_dim": 32}, "head_dim is 32, not hidden_size / num_attention_heads = 16"),
    ({"attention_bias": True}, "attention_bias or mlp_bias is true; Llama has no biases"),
    ({"hidden_act": "gelu"}, "hidden_act is 'gelu', Llama's feed-forward is SwiGLU (silu)"),
    ({"tie_word_embeddings": True}, "tie_word_embeddings is true"),
])
def test_a_config_the_llama_cannot_compute_is_refused_in_one_line(tmp_path, changes, message):
    (tmp_path / "config.json").write_text(json.dumps(_config(**changes)))
    with pytest.raises(TrainperfError, match=re.escape(message)) as caught:
        hf.read_config(tmp_path)
    assert str(tmp_path / "config.json") in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize("train", [False, True], ids=["eval", "with-dropout"])
def test_the_lora_adapter_on_the_fused_qkv_is_peft_s(train):
    """The reference's adapter: PEFT's LoRA on a fused qkv_proj (rank 16, alpha 32, dropout 0.1). trainperf's
    keeps one B per output (q, k, v) so that tensor parallelism can split each; stacked, they are PEFT's B:
    the same outputs and the same gradients of A and B (the same dropout mask from the same seed)."""
    peft = pytest.importorskip("peft")
    from trainperf.workloads.llama2_70b_lora.lora import LowRank

    dim, q, kv, rank = 64, 64, 32, 16

    class Attention(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv_proj = torch.nn.Linear(dim, q + 2 * kv, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.qkv_proj(x)

    torch.manual_seed(0)
    base = Attention()
    theirs = peft.get_peft_model(base, peft.LoraConfig(r=rank, lora_alpha=32, lora_dropout=0.1,
                                                       target_modules=["qkv_proj"]))
    layer = theirs.base_model.model.qkv_proj
    ours = LowRank(dim, (q, kv, kv), rank, 32, 0.1)
    with torch.no_grad():
        layer.lora_B["default"].weight.normal_()  # PEFT starts B at zero, as trainperf does: another B, so it counts
        ours.lora_a.weight.copy_(layer.lora_A["default"].weight)
        for b, rows in zip(ours.lora_b, layer.lora_B["default"].weight.split((q, kv, kv)), strict=True):
            b.weight.copy_(rows)
    theirs.train(train)
    ours.train(train)
    x = torch.randn(3, 5, dim)
    torch.manual_seed(1)
    expected = theirs(x)
    torch.manual_seed(1)
    found = base.qkv_proj.base_layer(x) + ours(x)
    assert torch.allclose(found, expected, atol=1e-6)
    weights = torch.randn_like(expected)
    (expected * weights).sum().backward()
    (found * weights).sum().backward()
    for found_grad, expected_grad in ((ours.lora_a.weight.grad, layer.lora_A["default"].weight.grad),
                                      (torch.cat([b.weight.grad for b in ours.lora_b]),
                                       layer.lora_B["default"].weight.grad)):
        error = (found_grad - expected_grad).abs().max() / expected_grad.abs().max()
        assert error < 1e-5, error


def _sharded_logits(folder: str, tp: int) -> list[list[float]]:
    """In each of two launched processes: the checkpoint read into a Llama built on the meta device and sharded
    (FSDP2 over both, or tensor parallelism over both), each process reading only its shards' parts; the
    logits of fixed tokens."""
    from pathlib import Path

    from trainperf import registry
    from trainperf.contract import FullyShard, ModelParts
    from trainperf.runtime import distributed
    from trainperf.runtime.fsdp import FSDPEngine

    ctx = distributed.init_from_env("cpu")
    try:
        checkpoint = hf.Checkpoint(Path(folder))
        read: list[str] = []
        region = checkpoint.region

        def counted(name, shape, where):  # what this process read, to hold it to its share
            out = region(name, shape, where)
            read.append(f"{name}:{out.numel()}")
            return out

        checkpoint.region = counted
        with torch.device("meta"):
            model = Llama(checkpoint.config, SEQ)
        model.weights_source = checkpoint
        recipe = registry.get("llama31_8b").recipe("mini").with_overrides([f"tp={tp}", "meta_init=true"])
        parts = ModelParts(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.0),
                           loss_fn=lambda m, b: torch.zeros(()), lr_schedule=lambda steps: lambda s: 1.0)
        parts = FSDPEngine().apply(FullyShard(tp=tp), parts, recipe, ctx)
        tokens = torch.randint(0, 80, (2, SEQ), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            logits = parts.model.eval()(tokens)
        if hasattr(logits, "full_tensor"):
            logits = logits.full_tensor()
        total = sum(int(r.split(":")[1]) for r in read)
        return [logits.tolist(), total]
    finally:
        distributed.shutdown()


@pytest.mark.second_tier
@pytest.mark.parametrize("tp", [1, 2], ids=["fsdp2", "tp2"])
def test_a_sharded_model_reads_its_shards_and_gives_transformers_logits(tmp_path, tp):
    from tests.conftest import launch

    theirs = _theirs()
    theirs.save_pretrained(tmp_path, max_shard_size="200KB")  # several shards and an index, as 405B's 191
    assert (tmp_path / hf.INDEX).is_file()
    tokens = torch.randint(0, 80, (2, SEQ), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = theirs(input_ids=tokens).logits
    whole = sum(p.numel() for p in theirs.parameters())
    for rank, (logits, read) in launch(_sharded_logits, str(tmp_path), tp).items():
        assert torch.allclose(torch.tensor(logits), expected, atol=2e-5, rtol=1e-5), rank
        # Each process reads about half of the model (q and k rows rounded out to whole heads), never all of it.
        assert read < 0.6 * whole, (rank, read, whole)


@pytest.mark.parametrize("fused", [False, True], ids=["q-k-v", "fused-qkv"])
def test_any_part_of_a_tensor_is_read_as_that_part_of_the_whole(tmp_path, fused):
    """What a shard reads (rows cut anywhere, inside a head too, and columns) is that part of the whole tensor
    in this Llama's row order: the launched processes' test holds the sharded model to transformers' logits."""
    from safetensors.torch import load_file, save_file

    _theirs().save_pretrained(tmp_path)
    if fused:  # the MLPerf LoRA checkpoint's layout: q, k and v rows in one qkv_proj
        tensors = load_file(str(tmp_path / hf.SINGLE))
        for i in range(TINY.layers):
            prefix = f"model.layers.{i}.self_attn."
            tensors[prefix + "qkv_proj.weight"] = torch.cat([tensors.pop(prefix + f"{p}_proj.weight") for p in "qkv"])
        save_file(tensors, str(tmp_path / hf.SINGLE), metadata={"format": "pt"})
    checkpoint = hf.Checkpoint(tmp_path)
    with torch.device("meta"):
        shapes = {name: tuple(p.shape) for name, p in Llama(TINY, SEQ).named_parameters()}
    for name in ("blocks.1.attention.wq.weight", "blocks.1.attention.wk.weight", "blocks.0.attention.wv.weight",
                 "blocks.0.attention.wo.weight", "tok_embeddings.weight", "blocks.1.feed_forward.w2.weight"):
        shape = shapes[name]
        whole = checkpoint.full(name, shape)
        for rows in (slice(0, shape[0]), slice(3, 13), slice(shape[0] // 2, shape[0]), slice(7, 8)):
            for cols in (slice(0, shape[1]), slice(5, 37)):
                part = checkpoint.region(name, shape, (rows, cols))
                assert torch.equal(part, whole[rows, cols]), (name, rows, cols)


def test_a_llama_recipe_starts_from_the_initial_checkpoint_it_names(tmp_path):
    """`--set initial_checkpoint=DIR`: the dense Llama workloads build the model from a Hugging Face folder (built
    whole, or on the meta device where each shard reads its part), its config held to the recipe's model."""
    from trainperf import registry
    from trainperf.contract import Assets, RuntimeContext

    workload = registry.get("llama31_8b")
    recipe = workload.recipe("mini")
    torch.manual_seed(5)
    source = Llama(recipe.model, recipe.seq_len)
    source.reset_parameters()
    hf.write(source, recipe.model, tmp_path / "ckpt", dtype=torch.float32)
    recipe = recipe.with_overrides([f"initial_checkpoint={tmp_path / 'ckpt'}"])
    assets = Assets(workload.assets(recipe, None))
    workload.check_assets(recipe, assets)
    parts = workload.build(recipe, RuntimeContext.create("cpu"), assets)
    for (name, a), b in zip(source.named_parameters(), parts.model.parameters(), strict=True):
        assert torch.equal(a, b), name


def test_an_initial_checkpoint_of_another_model_is_refused_in_one_line(tmp_path):
    import dataclasses

    from trainperf import registry
    from trainperf.contract import Assets

    workload = registry.get("llama31_8b")
    recipe = workload.recipe("mini")
    other = dataclasses.replace(recipe.model, layers=recipe.model.layers + 1)
    hf.write(Llama(other, 16), other, tmp_path, dtype=torch.float32)
    recipe = recipe.with_overrides([f"initial_checkpoint={tmp_path}"])
    with pytest.raises(TrainperfError, match=re.escape(f"layers {other.layers} in the checkpoint, "
                                                       f"{other.layers - 1} in the recipe")):
        workload.check_assets(recipe, Assets(workload.assets(recipe, None)))
    moe = registry.get("gpt_oss_20b")
    moe_recipe = moe.recipe("mini").with_overrides([f"initial_checkpoint={tmp_path}"])
    with pytest.raises(TrainperfError, match="gpt_oss_20b's model is not DeepSeek-V3's; only Llama and DeepSeek-V3 "
                                                       "checkpoints"):
        moe.check_assets(moe_recipe, Assets(moe.assets(moe_recipe, None)))


@pytest.mark.parametrize("more", [24, -16], ids=["a-larger-vocabulary", "a-smaller-vocabulary"])
def test_another_vocabulary_reads_the_overlapping_rows_as_megatron_does(tmp_path, more):
    """The MLPerf 405B reference continues from Meta's checkpoint (128,256 rows) with the Mixtral tokenizer's
    padded 32,768: Megatron's shape-mismatch load keeps the checkpoint's first rows and zeros past them."""
    import dataclasses

    from trainperf import registry
    from trainperf.contract import Assets, RuntimeContext

    workload = registry.get("llama31_8b")
    recipe = workload.recipe("mini")
    theirs = dataclasses.replace(recipe.model, vocab_size=recipe.model.vocab_size + more)
    torch.manual_seed(6)
    source = Llama(theirs, recipe.seq_len)
    source.reset_parameters()
    hf.write(source, theirs, tmp_path, dtype=torch.float32)
    recipe = recipe.with_overrides([f"initial_checkpoint={tmp_path}"])
    assets = Assets(workload.assets(recipe, None))
    workload.check_assets(recipe, assets)
    model = workload.build(recipe, RuntimeContext.create("cpu"), assets).model
    kept = min(theirs.vocab_size, recipe.model.vocab_size)
    for name in ("tok_embeddings", "output"):
        ours, read = getattr(model, name).weight, getattr(source, name).weight
        assert ours.shape[0] == recipe.model.vocab_size
        assert torch.equal(ours[:kept], read[:kept]) and not ours[kept:].any()
    assert torch.equal(model.blocks[0].attention.wq.weight, source.blocks[0].attention.wq.weight)


def test_the_405b_recipes_name_their_checkpoint_and_refuse_to_start_without_it(tmp_path):
    from trainperf import registry
    from trainperf.contract import Assets

    workload = registry.get("llama31_405b")
    recipe = workload.recipe("full")
    assert recipe.initial_checkpoint == "checkpoint"
    assert workload.assets(recipe, tmp_path) == {"initial checkpoint": tmp_path / "checkpoint" / "config.json"}
    assert workload.assets(recipe, None) == {}, "a synthetic bench draws the weights"
    # What `run` checks before it writes anything (jobs.py: the assets, then their headers).
    with pytest.raises(TrainperfError, match=re.escape(str(tmp_path / "checkpoint" / "config.json"))):
        Assets(workload.assets(recipe, tmp_path)).check()
