"""Float8 training layers (precision=fp8) through torchao, with two additions torchao's Float8Linear lacks:

- any number of rows: float8 matrix products (torch._scaled_mm) take only multiples of 16 in every dimension,
  so the input's rows are padded with zeros to one and the output sliced back (zero rows change neither the
  product, the gradients, nor the scales, taken from the largest magnitude);
- frozen weights (LoRA's base): torchao computes the weight's gradient whether or not the weight needs one
  and keeps each layer's input for it; a frozen layer here keeps only its weight (the parameter FSDP
  gathers again for the backward) and computes the input's gradient alone: a third fewer float8 products
  in the backward and no saved input. Casts and scales are torchao's own (dynamic, tensorwise by default),
  recast in the backward as torchao does.

torchao is an optional extra (`pip install -e '.[fp8]'`)."""

from __future__ import annotations

from typing import Any

import torch

FLOAT8_ROWS = 16


def _cast(tensor: torch.Tensor, cast: Any, mm_config: Any, role: Any, axis: int, config: Any) -> torch.Tensor:
    from torchao.float8.config import ScalingType
    from torchao.float8.distributed_utils import tensor_already_casted_to_fp8
    from torchao.float8.float8_scaling_utils import get_maybe_axiswise_dim, hp_tensor_to_float8_dynamic

    if tensor_already_casted_to_fp8(tensor) or cast.scaling_type is ScalingType.DISABLED:
        return tensor
    return hp_tensor_to_float8_dynamic(tensor, cast.target_dtype, mm_config, gemm_input_role=role,
                                       scaling_granularity=cast.scaling_granularity,
                                       axiswise_dim=get_maybe_axiswise_dim(axis, cast.scaling_granularity),
                                       round_scales_to_power_of_2=config.round_scales_to_power_of_2)


class FrozenFloat8Matmul(torch.autograd.Function):
    """x @ w_t in float8 for a weight that takes no gradient: the backward gives x's alone."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight_t: torch.Tensor, mm_config: Any, config: Any) -> torch.Tensor:
        from torchao.float8.float8_training_tensor import GemmInputRole

        ctx.save_for_backward(weight_t)
        ctx.mm_config, ctx.config = mm_config, config
        x8 = _cast(x, config.cast_config_input, mm_config, GemmInputRole.INPUT, -1, config)
        w8 = _cast(weight_t, config.cast_config_weight, mm_config, GemmInputRole.WEIGHT, 0, config)
        out = torch.mm(x8.reshape(-1, x.shape[-1]), w8)
        return out.reshape(*x.shape[:-1], out.shape[-1])

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, None, None, None]:
        from torchao.float8.float8_training_tensor import GemmInputRole

        (weight_t,) = ctx.saved_tensors
        c = ctx.config
        flat = grad.reshape(-1, grad.shape[-1])
        g8 = _cast(flat, c.cast_config_grad_output, ctx.mm_config, GemmInputRole.GRAD_OUTPUT, -1, c)
        w8 = _cast(weight_t, c.cast_config_weight_for_grad_input, ctx.mm_config, GemmInputRole.WEIGHT, -1, c)
        grad_x = torch.mm(g8, w8.t())
        return grad_x.reshape(*grad.shape[:-1], grad_x.shape[-1]), None, None, None


def _frozen_forward(self: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    if torch.is_autocast_enabled(x.device.type):
        x = x.to(torch.get_autocast_dtype(x.device.type))
    out = FrozenFloat8Matmul.apply(x, self.weight.t(), self.linear_mm_config, self.config)
    return out if self.bias is None else out + self.bias.to(out.dtype)


_CLASSES: dict[tuple[type, bool], type] = {}


def variant(float8_linear: type, frozen: bool) -> type:
    """torchao's Float8Linear taking any number of rows, and without weight gradients when `frozen`."""
    key = (float8_linear, frozen)
    if key not in _CLASSES:
        def inner(self: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
            return _frozen_forward(self, x) if frozen else float8_linear.forward(self, x)

        def forward(self: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
            shape = x.shape
            flat = x.reshape(-1, shape[-1])
            pad = -flat.shape[0] % FLOAT8_ROWS
            if pad == 0:
                return inner(self, x)
            out = inner(self, torch.nn.functional.pad(flat, (0, 0, 0, pad)))
            return out[:flat.shape[0]].reshape(*shape[:-1], out.shape[-1])

        name = ("Frozen" if frozen else "RowsPadded") + float8_linear.__name__
        _CLASSES[key] = type(name, (float8_linear,), {"forward": forward})
    return _CLASSES[key]


def convert(model: torch.nn.Module) -> int:
    """Swap the model's Linear layers for float8 ones where both sizes are multiples of 16 (what float8 matrix
    products take) and the layer does not ask to stay as it is (`float8 = False`: LoRA's adapters); a layer
    whose weight takes no gradient becomes a frozen one. Returns how many were swapped."""
    from trainperf import optional

    convert_to_float8_training = optional.require("torchao.float8", "precision=fp8",
                                                  optional.TORCHAO).convert_to_float8_training

    def eligible(module: torch.nn.Module, _name: str) -> bool:
        return (isinstance(module, torch.nn.Linear) and module.in_features % 16 == 0
                and module.out_features % 16 == 0 and getattr(module, "float8", True))

    before = sum(1 for m in model.modules() if eligible(m, ""))
    convert_to_float8_training(model, module_filter_fn=eligible)
    for module in model.modules():
        if type(module).__name__ == "Float8Linear":
            module.__class__ = variant(type(module), frozen=not module.weight.requires_grad)
    return before
