"""The weights a layer's forward actually computes with, however the layer is wrapped.

The LRP rules and the AttnLRP / CP-LRP normalisation rules read a layer's weight; the
attribute `module.weight` is not always what the forward used:

- a PEFT LoRA layer (`peft.tuners.lora.Linear`, `Conv2d`, ...) computes with its base
  layer's weight plus each active adapter's delta (none when the adapters are disabled or
  merged into the base weight), while `module.weight` is the base weight alone;
- accelerate's offloading (`cpu_offload`, `disk_offload`, a `device_map` with "cpu" or
  "disk") keeps the weight on the meta device between forwards and loads it from its
  weights map for each forward, on the hooks' execution device;
- weight-only quantisation keeps integers and scales: torchao's weight tensors,
  optimum-quanto's `qweight` and bitsandbytes' 4-bit weights compute as their
  dequantised values;
- PEFT's `ModulesToSaveWrapper` (a trained copy of a layer, e.g. a classifier head) runs
  its active copy.

`used_weight` gives the tensor the forward multiplies by, as a plain tensor; `acts_as`
the torch layer class whose computation the module performs with it, so that a rule
written for `nn.Linear` or `nn.Conv2d` covers the wrapped layer exactly; `base_layer` the
module that holds the layer's geometry (channels, kernel size, stride). They recognise
the wrapping libraries by their classes' modules and import none of them (bitsandbytes'
dequantisation excepted, for its own weights).
"""

from __future__ import annotations

from torch import Tensor, nn

from explain.errors import UnsupportedModelError

__all__ = ["acts_as", "base_layer", "used_weight"]


def _is_peft_layer(module: nn.Module) -> bool:
    """A PEFT tuner layer (LoRA and the other adapters that wrap a base layer)."""
    return type(module).__module__.startswith("peft.tuners.") and hasattr(module, "base_layer")


def _adds_delta_weights(module: nn.Module) -> bool:
    """Whether the PEFT layer computes as its base layer with its weight plus each active
    adapter's `get_delta_weight`: LoRA (rank-stabilised included), without DoRA's
    magnitude or another variant, and every active adapter of this layer a LoRA one."""
    if not hasattr(module, "get_delta_weight") or not hasattr(module, "lora_A"):
        return False
    if module.merged or module.disable_adapters:
        return True
    active = [name for name in module.active_adapters if name in module.lora_A]
    variants = getattr(module, "lora_variant", {})
    return all(not module.use_dora.get(name, False) and name not in variants for name in active)


def _is_quanto(module: nn.Module) -> bool:
    return type(module).__module__.startswith("optimum.quanto.") and hasattr(module, "qweight")


def _is_bitsandbytes_4bit(module: nn.Module) -> bool:
    return type(module).__module__.startswith("bitsandbytes.") and hasattr(
        getattr(module, "weight", None), "quant_state"
    )


def _runs(module: nn.Module) -> nn.Module:
    """The module that a PEFT `ModulesToSaveWrapper` (a trained copy of a layer, e.g. a
    classifier head) runs in its forward: its active adapter's copy, or the original
    module where no adapter of it is active; any other module itself."""
    while type(module).__name__ == "ModulesToSaveWrapper" and type(module).__module__.startswith(
        "peft."
    ):
        active = module.active_adapters
        copies = module.modules_to_save
        if module.disable_adapters or not active or any(name not in copies for name in active):
            module = module.original_module
        else:
            module = copies[active[0]]
    return module


def base_layer(module: nn.Module) -> nn.Module:
    """The layer a wrapper stands for (a PEFT layer's base layer, however deep), which
    holds its geometry: `in_channels`, `kernel_size`, `out_features`, ...; `module` itself
    otherwise."""
    module = _runs(module)
    while _is_peft_layer(module):
        module = _runs(module.base_layer)
    return module


def acts_as(module: nn.Module) -> type[nn.Module]:
    """The class whose forward `module` computes, with `used_weight` as its weight: the
    torch layer inside a LoRA layer or an optimum-quanto layer (weight-only), the module's
    own class otherwise (also for a wrapper that computes something else, DoRA or a PEFT
    tuner other than LoRA, which no rule written for the torch layer covers)."""
    module = _runs(module)
    if _is_peft_layer(module):
        return acts_as(module.base_layer) if _adds_delta_weights(module) else type(module)
    quantised = _is_quanto(module) and getattr(module, "activation_qtype", None) is None
    if quantised or _is_bitsandbytes_4bit(module):
        return next(cls for cls in type(module).__mro__ if cls.__module__.startswith("torch.nn"))
    return type(module)


def used_weight(module: nn.Module, name: str = "weight") -> Tensor | None:
    """The tensor `name` ("weight" or "bias") that `module`'s forward computes with, as a
    plain tensor on the device the forward runs on (None where the layer has none): the
    LoRA deltas of the active adapters added, offloaded weights loaded from accelerate's
    weights map, quantised weights dequantised (module docstring). A plain layer's own
    parameter comes as it is, not detached (no dispatched op): the rules read it under
    no_grad."""
    module = _runs(module)
    if _is_peft_layer(module):
        tensor = used_weight(module.base_layer, name)
        if name != "weight" or tensor is None or module.merged or module.disable_adapters:
            return tensor
        for adapter in module.active_adapters:
            if adapter in module.lora_A:
                tensor = tensor + module.get_delta_weight(adapter).to(tensor)
        return tensor
    if name == "weight" and _is_quanto(module) and module.qweight is not None:
        tensor = module.qweight
    elif name == "weight" and _is_bitsandbytes_4bit(module):
        from bitsandbytes.functional import dequantize_4bit

        weight = module.weight  # dequantised in the dtype it was quantised from
        return dequantize_4bit(weight.data, weight.quant_state)
    else:
        tensor = getattr(module, name, None)
    if tensor is None:
        return None
    if tensor.is_meta:
        tensor = _offloaded(module, name)
    if type(tensor) not in (Tensor, nn.Parameter) and hasattr(tensor, "dequantize"):
        tensor = tensor.dequantize()
    return tensor


def _offloaded(module: nn.Module, name: str) -> Tensor:
    """An offloaded tensor, read from the weights map of accelerate's hook on `module`
    and put on the hook's execution device, as the hook does before each forward."""
    hook = getattr(module, "_hf_hook", None)
    for each in getattr(hook, "hooks", None) or [hook]:  # a SequentialHook holds several
        weights = getattr(each, "weights_map", None)
        if weights is not None and name in weights:
            return weights[name].to(each.execution_device)
    raise UnsupportedModelError(
        f"{type(module).__name__}.{name} is on the meta device and no accelerate hook "
        "holds its values: load the weights (or dispatch the model with accelerate) first"
    )
