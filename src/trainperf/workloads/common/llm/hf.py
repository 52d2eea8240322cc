"""A Hugging Face-format Llama checkpoint (config.json + safetensors shards, with
model.safetensors.index.json when sharded) read into the shared Llama, and written from it (the mini's
shipped base).

Names: `model.layers.{i}.self_attn.{q,k,v,o}_proj` (or the MLPerf checkpoint's fused `qkv_proj`, q then k
then v rows), `mlp.{gate,up,down}_proj`, `input_layernorm`, `post_attention_layernorm`,
`model.embed_tokens`, `model.norm`, `lm_head`. Hugging Face's conversion permutes the rows of q and k so
that its rotary embedding can rotate halves; this Llama rotates interleaved pairs as Meta's code does, so
those rows are permuted back on reading (and forth on writing).

Tensors are read from the memory-mapped shards through safetensors' lazy slices: a process of a sharded model
(FSDP2, tensor parallelism, both) reads only the part of each tensor its shard holds (for q and k, the whole
heads it falls in), never a whole 405B tensor. Anything missing or of the wrong shape or dtype is one line
naming the file."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainperf.errors import TrainperfError, shown
from trainperf.files import write_json_atomic
from trainperf.workloads.common.llm.model import Llama, LlamaConfig

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
DTYPES = {"torch.bfloat16": torch.bfloat16, "torch.float16": torch.float16, "torch.float32": torch.float32,
          "BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}
FP8 = ("F8_E4M3",)


# transformers' own default where a Llama config.json names no rotary base (the conversions of Llama 1 and 2).
DEFAULT_THETA = 10_000.0
# The parameters whose rows are the vocabulary's (a model of another vocabulary reads the overlap).
VOCABULARY_ROWS = ("tok_embeddings.weight", "output.weight")
LLAMA3_FIELDS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def read_config(folder: Path) -> LlamaConfig:
    """config.json as a LlamaConfig, in either layout transformers writes: 4.x's `rope_theta` beside
    `rope_scaling`, 5.x's `rope_parameters` (the base and the scaling together). What this Llama cannot
    compute (another scaling, biases, another activation or head size) is one line naming the file."""
    path = folder / "config.json"
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(raw, dict):
            raise TypeError("not an object")
        theta, scaling = _rope(raw, path)
        config = LlamaConfig(
            layers=int(raw["num_hidden_layers"]), dim=int(raw["hidden_size"]), heads=int(raw["num_attention_heads"]),
            kv_heads=int(raw.get("num_key_value_heads") or raw["num_attention_heads"]),
            ffn_dim=int(raw["intermediate_size"]), vocab_size=int(raw["vocab_size"]),
            norm_eps=float(raw.get("rms_norm_eps", 1e-5)), rope_theta=theta,
            rope_factor=float(scaling["factor"]) if scaling else 0.0,
            rope_low_freq_factor=float(scaling["low_freq_factor"]) if scaling else 1.0,
            rope_high_freq_factor=float(scaling["high_freq_factor"]) if scaling else 4.0,
            rope_original_context=int(scaling["original_max_position_embeddings"]) if scaling
            else int(raw.get("max_position_embeddings", 4096)))
    except OSError as exc:
        raise TrainperfError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise TrainperfError(f"{path}: not a Llama config.json ({type(exc).__name__}: "
                             f"{shown(str(exc), 200)})") from None
    unsupported = [
        (raw.get("tie_word_embeddings"), "tie_word_embeddings is true; Llama's input and output embeddings are untied"),
        (raw.get("attention_bias") or raw.get("mlp_bias"), "attention_bias or mlp_bias is true; Llama has no biases"),
        (raw.get("hidden_act", "silu") != "silu", f"hidden_act is {shown(str(raw.get('hidden_act')), 40)!r}, "
                                                   "Llama's feed-forward is SwiGLU (silu)"),
        (raw.get("head_dim") not in (None, config.head_dim),
         f"head_dim is {shown(str(raw.get('head_dim')), 40)}, not hidden_size / num_attention_heads "
         f"= {config.head_dim}"),
    ]
    for found, what in unsupported:
        if found:
            raise TrainperfError(f"{path}: {what}")
    return config


def _rope(raw: dict[str, Any], path: Path) -> tuple[float, dict[str, float] | None]:
    """The rotary base and Llama 3's scaling (None: unscaled) from either layout; both layouts present must
    agree, and a scaling this Llama does not compute is refused (never read as none)."""
    layouts: dict[str, dict[str, float] | None] = {}
    for name in ("rope_scaling", "rope_parameters"):
        value = raw.get(name)
        if value is not None and not isinstance(value, dict):
            raise TrainperfError(f"{path}: {name} is {shown(str(value), 40)!r}, expected an object or null")
        if value:
            kind = value.get("rope_type", value.get("type", "default"))
            if kind not in ("default", "llama3"):
                raise TrainperfError(f"{path}: {name} of type {shown(str(kind), 40)!r}: this Llama computes Llama "
                                     "3's scaling (llama3) or none")
            layouts[name] = ({k: float(v) for k, v in value.items() if k in LLAMA3_FIELDS} if kind == "llama3"
                             else None)
    params = raw.get("rope_parameters") or {}
    thetas = {float(v) for v in (raw.get("rope_theta"), params.get("rope_theta")) if v is not None}
    if len(thetas) > 1:
        raise TrainperfError(f"{path}: rope_theta {raw['rope_theta']} and rope_parameters.rope_theta "
                             f"{params['rope_theta']} differ")
    if params and not thetas:
        raise TrainperfError(f"{path}: rope_parameters has no rope_theta")
    if len(layouts) == 2 and layouts["rope_scaling"] != layouts["rope_parameters"]:
        raise TrainperfError(f"{path}: rope_scaling and rope_parameters describe different rotary scalings")
    theta = thetas.pop() if thetas else DEFAULT_THETA
    name, scaling = next(((n, v) for n, v in layouts.items() if v is not None), (None, None))
    if scaling is None:
        return theta, None
    missing = [f for f in LLAMA3_FIELDS if f not in scaling]
    if missing:
        raise TrainperfError(f"{path}: {name} of type 'llama3' has no {', '.join(missing)}")
    return theta, scaling


def _permute(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Meta's row order -> Hugging Face's (each head's interleaved pairs split into two halves)."""
    rows, cols = w.shape
    return w.view(heads, rows // heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


def _unpermute(w: torch.Tensor, heads: int) -> torch.Tensor:
    rows, cols = w.shape
    return w.view(heads, 2, rows // heads // 2, cols).transpose(1, 2).reshape(rows, cols)


def hf_names(config: LlamaConfig) -> Iterator[tuple[str, str]]:
    """(this Llama's parameter name, Hugging Face's) for every base parameter."""
    yield "tok_embeddings.weight", "model.embed_tokens.weight"
    for i in range(config.layers):
        ours, theirs = f"blocks.{i}.", f"model.layers.{i}."
        for a, b in (("attention.wq", "self_attn.q_proj"), ("attention.wk", "self_attn.k_proj"),
                     ("attention.wv", "self_attn.v_proj"), ("attention.wo", "self_attn.o_proj"),
                     ("feed_forward.w1", "mlp.gate_proj"), ("feed_forward.w3", "mlp.up_proj"),
                     ("feed_forward.w2", "mlp.down_proj"), ("attention_norm", "input_layernorm"),
                     ("ffn_norm", "post_attention_layernorm")):
            yield f"{ours}{a}.weight", f"{theirs}{b}.weight"
    yield "norm.weight", "model.norm.weight"
    yield "output.weight", "lm_head.weight"


class Shards:
    """The tensors of one Hugging Face checkpoint folder, by Hugging Face name, read lazily from their
    safetensors shards; what every model family's reader shares. FP8 tensors stored with block scales (the
    `weight_scale_inv` beside each weight, `quantization_config.weight_block_size` in config.json: DeepSeek's
    own releases) are read as bf16, weight x scale per block, as DeepSeek's `fp8_cast_bf16.py` converts them."""

    def __init__(self, folder: Path, raw_config: dict[str, Any]) -> None:
        self.folder = folder
        index = folder / INDEX
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
                self.files = {str(name): folder / file for name, file in weight_map.items()}
                bad = [name for name, file in weight_map.items()
                       if not isinstance(file, str) or Path(file).name != file or file in ("", ".", "..")]
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
                raise TrainperfError(f"{index}: not a safetensors index ({type(exc).__name__})") from None
            if bad:
                raise TrainperfError(f"{index}: {shown(bad[0], 80)!r} maps to {shown(str(weight_map[bad[0]]), 80)!r}, "
                                     "expected a shard's file name in this folder")
        elif (folder / SINGLE).is_file():
            self.files = {name: folder / SINGLE for name in self._names(folder / SINGLE)}
        else:
            raise TrainperfError(f"{folder}: no {INDEX} nor {SINGLE} (a Hugging Face checkpoint folder)")
        self._open: dict[Path, Any] = {}
        self.block = _fp8_block(raw_config, folder / "config.json")

    @staticmethod
    def _names(path: Path) -> list[str]:
        from safetensors import safe_open

        try:
            with safe_open(str(path), framework="pt") as f:
                return list(f.keys())
        except Exception as exc:  # safetensors raises its own error types for a damaged header
            raise TrainperfError(f"{path}: not a safetensors file ({type(exc).__name__}: "
                                 f"{shown(str(exc), 200)})") from None

    def _file(self, name: str) -> Any:
        from safetensors import safe_open

        path = self.files[name]
        if path not in self._open:
            if not path.is_file():
                raise TrainperfError(f"{path}: missing (the shard {self.folder / INDEX} names for {name})")
            try:
                self._open[path] = safe_open(str(path), framework="pt")
            except Exception as exc:
                raise TrainperfError(f"{path}: not a safetensors file ({type(exc).__name__}: "
                                     f"{shown(str(exc), 200)})") from None
        return self._open[path]

    def _slice(self, name: str) -> Any:
        if name not in self.files:
            raise TrainperfError(f"{self.folder}: no tensor {name} in the checkpoint")
        handle = self._file(name)
        if name not in handle.keys():
            raise TrainperfError(f"{self.files[name]}: no tensor {name}, which {self.folder / INDEX} places there")
        try:
            return handle.get_slice(name)
        except Exception as exc:  # safetensors' own error types
            raise TrainperfError(f"{self.files[name]}: {name}: {shown(str(exc), 200)}") from None

    def _tensor(self, name: str, shape: tuple[int, ...]) -> Any:
        """The lazy slice of tensor `name`, checked to be of `shape` and a float type (an FP8 one with its block
        scales: read as bf16)."""
        piece = self._slice(name)
        found = tuple(piece.get_shape())
        if found != shape:
            raise TrainperfError(f"{self.files[name]}: {name} has shape {list(found)}, the config says {list(shape)}")
        kind = piece.get_dtype()
        if kind in FP8:
            scales = name.removesuffix(".weight") + ".weight_scale_inv"
            if len(shape) != 2:
                raise TrainperfError(f"{self.files[name]}: {name} is {kind} of {len(shape)} dimensions; block scales "
                                     "are read for matrices only")
            if self.block is None or scales not in self.files:
                raise TrainperfError(f"{self.files[name]}: {name} is {kind} without block scales ({scales} and "
                                     "config.json's quantization_config.weight_block_size); expected BF16, F16 or "
                                     "F32, or FP8 as DeepSeek publishes it")
            blocks = tuple(-(-n // b) for n, b in zip(shape, self.block, strict=True))
            return _BlockScaled(piece, self._tensor(scales, blocks), self.block)
        if DTYPES.get(kind) is None:
            raise TrainperfError(f"{self.files[name]}: {name} is {kind}, expected BF16, F16 or F32")
        return piece

    def _vocabulary_rows(self, theirs: str, vocab: int, dim: int, where: tuple[slice, ...]) -> torch.Tensor:
        """Rows of the embedding or output layer of a model whose vocabulary differs from the checkpoint's
        `vocab`, as Megatron's shape-mismatch load gives them (what the MLPerf 405B reference does with Meta's
        128,256 rows for the Mixtral tokenizer's padded 32,768): the checkpoint's first rows, zeros past its
        vocabulary."""
        piece = self._tensor(theirs, (vocab, dim))
        rows, cols = where
        width = len(range(dim)[cols])
        out = torch.zeros(rows.stop - rows.start, width, dtype=DTYPES[piece.get_dtype()])
        stop = min(rows.stop, vocab)
        if stop > rows.start:
            out[:stop - rows.start] = piece[rows.start:stop, cols]
        return out


class _BlockScaled:
    """An FP8 tensor and its inverse scales, one per block of `block` rows x columns, sliced as one bf16 tensor."""

    def __init__(self, piece: Any, scales: Any, block: tuple[int, int]) -> None:
        self.piece, self.scales, self.block = piece, scales, block

    def get_dtype(self) -> str:
        return "BF16"

    def get_shape(self) -> list[int]:
        return list(self.piece.get_shape())

    def __getitem__(self, where: tuple[slice, ...]) -> torch.Tensor:
        ranges = [range(n)[s] for n, s in zip(self.get_shape(), where, strict=True)]
        if not all(ranges):
            return torch.empty([len(r) for r in ranges], dtype=torch.bfloat16)
        first = [r.start // b for r, b in zip(ranges, self.block, strict=True)]
        last = [(r.stop - 1) // b + 1 for r, b in zip(ranges, self.block, strict=True)]
        scales = self.scales[tuple(slice(f, la) for f, la in zip(first, last, strict=True))].float()
        for dim, b in enumerate(self.block):
            scales = scales.repeat_interleave(b, dim=dim)
        offset = [r.start - f * b for r, f, b in zip(ranges, first, self.block, strict=True)]
        scales = scales[tuple(slice(o, o + len(r)) for o, r in zip(offset, ranges, strict=True))]
        return (self.piece[tuple(where)].float() * scales).to(torch.bfloat16)


class Checkpoint(Shards):
    """A Llama's checkpoint folder: its config (`read_config`) and its tensors in this Llama's names."""

    def __init__(self, folder: Path) -> None:
        self.config = read_config(folder)
        super().__init__(folder, read_json(folder / "config.json"))

    def require(self, model: LlamaConfig, ignored: tuple[str, ...] = ()) -> None:
        """Refuse (one line naming config.json) a checkpoint of another model than `model`: every field but the
        context it was trained at, the initialisation's scale and `ignored`."""
        differ = [f"{f.name} {getattr(self.config, f.name)} in the checkpoint, {getattr(model, f.name)} in the recipe"
                  for f in dataclasses.fields(model)
                  if f.name not in ("rope_original_context", "init_std", *ignored)
                  and getattr(self.config, f.name) != getattr(model, f.name)]
        if differ:
            raise TrainperfError(f"{self.folder / 'config.json'}: " + "; ".join(differ))

    def check_headers(self) -> None:
        """Every base tensor the config implies is in its shard with its shape and a float dtype, read from
        the safetensors headers only (nothing is loaded): a partial or mismatched checkpoint is one line
        before a run starts, not an aborted run."""
        c = self.config
        q_rows, kv_rows = c.heads * c.head_dim, c.kv_heads * c.head_dim
        with torch.device("meta"):
            shapes = {name: tuple(p.shape) for name, p in _plain_named(Llama(c, 1))}
        for ours, theirs in hf_names(c):
            module = theirs.split(".")[-2]
            fused = theirs.replace(f".{module}.", ".qkv_proj.")
            if module in ("q_proj", "k_proj", "v_proj") and fused in self.files and theirs not in self.files:
                self._tensor(fused, (q_rows + 2 * kv_rows, c.dim))
            else:
                self._tensor(theirs, shapes[ours])

    def full(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        """One of this Llama's base tensors, whole, in Meta's row order."""
        return self.region(name, shape, tuple(slice(0, n) for n in shape))

    def region(self, name: str, shape: tuple[int, ...], where: tuple[slice, ...]) -> torch.Tensor:
        """The part `where` (a slice per dimension, in Meta's row order) of one of this Llama's base tensors
        of global `shape`, reading from the shard only what it covers: for q and k the whole heads its rows
        fall in (Hugging Face's rows are permuted within each head), for a fused q|k|v its part's rows."""
        config = self.config
        q_rows, kv_rows = config.heads * config.head_dim, config.kv_heads * config.head_dim
        theirs = dict(hf_names(config))[name]
        module = theirs.split(".")[-2]
        fused = theirs.replace(f".{module}.", ".qkv_proj.")
        start = 0
        if module in ("q_proj", "k_proj", "v_proj") and fused in self.files and theirs not in self.files:
            piece = self._tensor(fused, (q_rows + 2 * kv_rows, config.dim))
            start = {"q_proj": 0, "k_proj": q_rows, "v_proj": q_rows + kv_rows}[module]
        elif name in VOCABULARY_ROWS and shape[0] != config.vocab_size:
            return self._vocabulary_rows(theirs, config.vocab_size, config.dim, where)
        else:
            piece = self._tensor(theirs, shape)
        rows, rest = where[0], tuple(where[1:])
        if module in ("q_proj", "k_proj"):
            size = config.head_dim
            first, last = rows.start // size * size, -(-rows.stop // size) * size
            whole = piece[(slice(start + first, start + last), *rest)]
            return _unpermute(whole, (last - first) // size)[rows.start - first:rows.stop - first]
        return piece[(slice(start + rows.start, start + rows.stop), *rest)]

    def load_into(self, model: nn.Module) -> None:
        """Copy every base parameter of `model` (plain, or a DTensor shard: each process reads only the part
        its shard holds) from the checkpoint."""
        params = dict(_plain_named(model))
        for name, _ in hf_names(self.config):
            if name not in params:
                raise TrainperfError(f"{self.folder}: the model has no parameter {name} (another shape?)")
            copy_region(params[name], lambda shape, where, name=name: self.region(name, shape, where))


def copy_region(param: torch.Tensor, read: Any) -> None:
    """Fill `param` (plain, or a DTensor whose shard this process holds) with `read(global shape, where)`, the
    part `where` (a slice per dimension) of the global tensor: each process reads only what it holds."""
    shape = tuple(param.shape)
    with torch.no_grad():
        if hasattr(param, "to_local"):
            local = param.to_local()
            if local.numel():
                local.copy_(read(shape, _local_region(param)).to(local.dtype).view(local.shape))
        else:
            param.copy_(read(shape, tuple(slice(0, n) for n in shape)))


def _fp8_block(raw: dict[str, Any], path: Path) -> tuple[int, int] | None:
    """The FP8 weights' block (rows, columns) config.json's quantization_config declares; None: not quantized."""
    quantization = raw.get("quantization_config")
    if not quantization:
        return None
    block = quantization.get("weight_block_size") if isinstance(quantization, dict) else None
    if (quantization.get("quant_method") if isinstance(quantization, dict) else None) != "fp8" or not (
            isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block)):
        raise TrainperfError(f"{path}: quantization_config {shown(json.dumps(quantization), 120)}: only FP8 with "
                             "a weight_block_size [rows, columns] (DeepSeek's release) is read")
    return block[0], block[1]


def read_json(path: Path) -> dict[str, Any]:
    """A config.json's object, or one line naming the file."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise TrainperfError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise TrainperfError(f"{path}: not JSON ({shown(str(exc), 200)})") from None
    if not isinstance(raw, dict):
        raise TrainperfError(f"{path}: not a JSON object")
    return raw


def _local_region(param: Any) -> tuple[slice, ...]:
    """The part of a DTensor's global tensor this process holds, as a slice per dimension (Shard placements,
    even or not, FSDP's strided ones under tensor parallelism included; replicated dimensions whole)."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    local, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
    return tuple(slice(o, o + n) for o, n in zip(offset, local, strict=True))


def plain_name(name: str) -> str:
    """A parameter's or module's name without the wrappers' infixes (activation checkpointing, compile)."""
    return name.replace("_checkpoint_wrapped_module.", "").replace("_orig_mod.", "")


def _plain_named(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    for name, p in model.named_parameters():
        yield plain_name(name), p


def write(model: nn.Module, config: LlamaConfig, folder: Path, dtype: torch.dtype = torch.bfloat16) -> None:
    """The base of `model` as a Hugging Face checkpoint (one shard), as a conversion would write it."""
    folder.mkdir(parents=True, exist_ok=True)
    params = dict(_plain_named(model))
    tensors = {}
    for name, theirs in hf_names(config):
        tensor = params[name].detach().to(dtype)
        if theirs.endswith("q_proj.weight"):
            tensor = _permute(tensor, config.heads)
        elif theirs.endswith("k_proj.weight"):
            tensor = _permute(tensor, config.kv_heads)
        tensors[theirs] = tensor.contiguous()
    save_single(tensors, folder)
    write_json_atomic(folder / "config.json", config_json(config, dtype))


def save_single(tensors: dict[str, torch.Tensor], folder: Path) -> None:
    """`tensors` as the folder's one safetensors shard, written atomically and as readable as any file."""
    from safetensors.torch import save_file

    partial = folder / (SINGLE + ".partial")
    save_file(tensors, str(partial), metadata={"format": "pt"})
    mask = os.umask(0)
    os.umask(mask)
    partial.chmod(0o666 & ~mask)  # safetensors writes owner-only; a checkpoint is as readable as any file
    partial.replace(folder / SINGLE)


def config_json(config: LlamaConfig, dtype: torch.dtype = torch.bfloat16) -> dict[str, Any]:
    """`config` as Hugging Face's config.json, in both of transformers' layouts at once (4.x reads
    rope_theta and rope_scaling, 5.x rope_parameters), so that either builds this very model."""
    scaling = None
    if config.rope_factor:
        scaling = {"rope_type": "llama3", "factor": config.rope_factor,
                   "low_freq_factor": config.rope_low_freq_factor, "high_freq_factor": config.rope_high_freq_factor,
                   "original_max_position_embeddings": config.rope_original_context}
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": config.dim,
        "intermediate_size": config.ffn_dim, "num_attention_heads": config.heads, "head_dim": config.head_dim,
        "num_hidden_layers": config.layers, "num_key_value_heads": config.kv_heads, "vocab_size": config.vocab_size,
        "rms_norm_eps": config.norm_eps, "hidden_act": "silu", "rope_theta": config.rope_theta,
        "rope_scaling": scaling,
        "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta, **(scaling or {})},
        # Llama 3.1's rows carry positions up to 16x the scaled context (131,072); unscaled, the context itself.
        "max_position_embeddings": config.rope_original_context * (16 if scaling else 1),
        "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False,
        "torch_dtype": str(dtype).removeprefix("torch.")}
