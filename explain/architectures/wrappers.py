"""Models as people run them: the wrappers an explanation looks through.

- DataParallel, DistributedDataParallel and torch.compile hold the real model
  (`.module`, `._orig_mod`) and forward to it. An explanation instruments and calls the
  wrapped model itself: its hooks and attention switches belong on the real modules, a
  compiled graph would not run Python hooks, and DistributedDataParallel's forward would
  take part in gradient synchronisation that an explanation, which computes no parameter
  gradients, must not start.
- PEFT: a `PeftModel` (and its task subclasses) or a tuner (`LoraModel`) holds the base
  model, whose layers PEFT has wrapped; the base model is explained, and its LoRA layers
  compute exactly as they do under the PEFT model (the active adapters, or none inside
  `disable_adapter()`). Prompt-learning adapters (prompt, prefix and p-tuning), which add
  virtual tokens in `PeftModel.forward` itself, are refused.
- accelerate (`device_map`, `dispatch_model`, `cpu_offload`, `disk_offload`): the hooks
  stay on the modules and run as in any forward; the inputs go to the hooks' execution
  device (`execution_device`), and the rules that read weights read them where accelerate
  keeps them (explain.lrp.weights).
- Quantised weights (torchao, optimum-quanto): weight-only quantisation computes with
  dequantised weights and explains as such; a model that quantises its activations is
  refused (`refuse_quantised_activations`).
- A TransformerLens `TransformerBridge` is explained as the Hugging Face model it wraps,
  as Hugging Face built it (explain.architectures.transformer_lens_bridge).
- A transformers pipeline, a SentenceTransformer or an nnsight model (an `Envoy`:
  `LanguageModel`, `TransformersModel`, `NNsight`) is not a module: `runnable` gives the
  model and the tokenizer to explain it with (explain.architectures.sentence_encoding
  for a SentenceTransformer). nnsight's envoys stay as they are: outside a trace the
  forward nnsight installs on each module runs the module's own forward, and an
  explanation's hooks sit on the modules, as on any model.

The wrapped model runs on the device of its parameters (for DataParallel, the first
device), or on accelerate's execution device.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn

from explain.architectures.transformer_lens_bridge import hugging_face_view, is_bridge
from explain.errors import UnsupportedModelError
from explain.layout import FlagSetting

__all__ = [
    "ACCELERATE_HOOK",
    "HELD_LAYER_PACKAGES",
    "execution_device",
    "execution_devices",
    "held_still",
    "refuse_quantised_activations",
    "runnable",
    "unwrap",
]

# What a caller looks for, in a pass over the modules it already makes, before it asks
# this module anything: the attribute that holds accelerate's hooks, and the packages of
# the layers `held_still` keeps still. A plain model has neither, so its calls never
# enter the helpers below.
ACCELERATE_HOOK = "_hf_hook"
HELD_LAYER_PACKAGES = ("bitsandbytes.",)


def unwrap(model: nn.Module) -> nn.Module:
    """The model inside any nesting of DataParallel, DistributedDataParallel,
    torch.compile and PEFT wrappers (the model itself when it is not wrapped)."""
    while True:
        if isinstance(model, nn.DataParallel | nn.parallel.DistributedDataParallel):
            model = model.module
        elif _is_compiled(model):
            model = model._orig_mod
        elif _is_class(model, "peft.peft_model", "PeftModel") or _is_class(
            model, "peft.mixed_model", "PeftMixedModel"
        ):
            _refuse_prompt_learning(model)
            model = model.base_model
        elif _is_class(model, "peft.tuners.tuners_utils", "BaseTuner"):
            model = model.model
        else:
            return model


def _is_class(obj: object, module: str, name: str) -> bool:
    """Whether `obj` is an instance of class `name` of `module` (or of a subclass), without
    importing that module."""
    return any(cls.__module__ == module and cls.__name__ == name for cls in type(obj).__mro__)


def _is_compiled(model: nn.Module) -> bool:
    """Whether `model` is torch.compile's wrapper, without importing torch._dynamo."""
    cls = type(model)
    return cls.__name__ == "OptimizedModule" and cls.__module__.startswith("torch._dynamo")


def _refuse_prompt_learning(model: nn.Module) -> None:
    config = model.peft_config.get(model.active_adapter)
    if config is not None and getattr(config, "is_prompt_learning", False):
        raise UnsupportedModelError(
            f"its active PEFT adapter ({config.peft_type}) is prompt learning: "
            "PeftModel.forward puts virtual tokens before the input, which no adapter of "
            "explain's reads as tokens of the input. LoRA and the other adapters that wrap "
            "layers are explained exactly; to explain the model without this adapter, pass "
            "model.get_base_model()"
        )


# -- accelerate ---------------------------------------------------------------------------


def execution_devices(modules: Iterable[nn.Module]) -> Iterator[torch.device]:
    """The devices accelerate's hooks on `modules` run them on, in the modules' order (a
    SequentialHook holds several hooks)."""
    for module in modules:
        hook = getattr(module, ACCELERATE_HOOK, None)
        for each in (getattr(hook, "hooks", None) or [hook]) if hook is not None else ():
            device = getattr(each, "execution_device", None)
            if device is not None:
                yield torch.device(device if not isinstance(device, int) else f"cuda:{device}")


def execution_device(model: nn.Module) -> torch.device | None:
    """The device accelerate runs `model`'s first hooked module on (where its inputs
    belong), or None when no hook names a device. Callers ask only for a model accelerate
    dispatched (`Adapter.parameter`: its root hooked, or an `hf_device_map` on it)."""
    return next(execution_devices(model.modules()), None)


# -- quantisation ---------------------------------------------------------------------------

_ACTIVATION_QUANTISATION = (
    "act_quant_kwargs",  # torchao Int8Tensor, Float8Tensor
    "activation_quantization",  # torchao IntxUnpackedToInt8Tensor
    "input_quant_func",  # torchao LinearActivationQuantizedTensor
)


def _quantises_activations(module: nn.Module) -> str | None:
    """How `module` quantises its input in the forward, or None."""
    if type(module).__module__.startswith("optimum.quanto."):
        qtype = getattr(module, "activation_qtype", None)
        if qtype is not None:
            return f"optimum-quanto ({type(module).__name__}, activations {qtype})"
    if type(module).__module__.startswith("bitsandbytes.") and type(module).__name__ == (
        "Linear8bitLt"
    ):
        return "bitsandbytes LLM.int8() (Linear8bitLt multiplies int8 activations)"
    for tensor in module.parameters(recurse=False):
        if type(tensor).__module__.startswith("torchao."):
            for name in _ACTIVATION_QUANTISATION:
                if getattr(tensor, name, None) is not None:
                    return f"torchao ({type(tensor).__name__} with {name})"
    return None


def held_still(modules: Iterable[nn.Module]) -> list[FlagSetting]:
    """Flags the session sets for a call so that a wrapping library does not change the
    model during it. bitsandbytes' 4-bit layers, in eval mode on a CPU with AVX512-BF16,
    repack their weights in place at their first forward without input gradients (their
    scales rounded to bfloat16), which changes the model's outputs for good: the call
    keeps them on the kernel they had (`support_avx512bf16_for_cpu` off)."""
    return [
        FlagSetting(module, "support_avx512bf16_for_cpu", False)
        for module in modules
        if type(module).__module__.startswith(HELD_LAYER_PACKAGES)
        and getattr(module, "support_avx512bf16_for_cpu", False)
    ]


def refuse_quantised_activations(model: nn.Module) -> None:
    """Refuse a model that quantises activations (torchao's dynamic activation
    quantisation, optimum-quanto's `activations=`, bitsandbytes' 8-bit layers) with one
    message: why, and what to explain instead."""
    for name, module in model.named_modules():
        how = _quantises_activations(module)
        if how is not None:
            raise UnsupportedModelError(
                f"{name or 'the model'} quantises its activations: {how}. Rounding an "
                "activation is a step whose gradient is zero almost everywhere (the "
                "libraries pass a straight-through value or none), so no gradient or "
                "relevance through it describes the model. Explain the same weights "
                "quantised weight-only (torchao Int8WeightOnlyConfig or IntxWeightOnlyConfig, "
                "optimum-quanto quantize(model, weights=qint8), bitsandbytes 4-bit) or "
                "unquantised: their explanations are the ones this model approximates"
            )


# -- what people run that is not a module ---------------------------------------------------

_MODULE_ATTRIBUTES = ("model", "module", "auto_model", "base_model", "net", "network", "backbone")


def runnable(runner: object) -> tuple[nn.Module, dict[str, Any]]:
    """The model to explain for what the user runs, with what it brings to encode inputs
    ({"tokenizer": ..., "processor": ...}; `Explainer` takes the one its model reads):
    a transformers pipeline (its model, tokenizer and processor), a SentenceTransformer
    (its encoder, with a tokenizer that gives the tokens its `encode` sees:
    explain.architectures.sentence_encoding), an nnsight model (the module it wraps, and
    its tokenizer), or a module as it is. Anything else is
    refused, naming the attribute that holds a module where there is one."""
    if _is_class(runner, "transformers.pipelines.base", "Pipeline"):
        model = runner.model
        if not isinstance(model, nn.Module):
            raise UnsupportedModelError(
                f"this pipeline runs a {type(model).__name__}, not a PyTorch model; build "
                "the pipeline with framework='pt'"
            )
        brought = {"tokenizer": runner.tokenizer, "processor": getattr(runner, "processor", None)}
        return model, brought
    if _is_class(runner, "sentence_transformers.base.model", "BaseModel") or _is_class(
        runner, "sentence_transformers.sentence_transformer.model", "SentenceTransformer"
    ):
        from explain.architectures.sentence_encoding import sentence_encoder

        encoder, tokenizer = sentence_encoder(runner)
        return encoder, {"tokenizer": tokenizer}
    if is_bridge(runner):
        return hugging_face_view(runner), {"tokenizer": getattr(runner, "tokenizer", None)}
    if _is_class(runner, "nnsight.intervention.envoy", "Envoy"):
        return _nnsight_module(runner), {"tokenizer": getattr(runner, "tokenizer", None)}
    if isinstance(runner, nn.Module):
        return runner, {}
    held = [
        name for name in _MODULE_ATTRIBUTES if isinstance(getattr(runner, name, None), nn.Module)
    ]
    where = (
        f"; its attribute `{held[0]}` holds one: Explainer(obj.{held[0]}, tokenizer=...)"
        if held
        else ""
    )
    raise UnsupportedModelError(
        "expected a torch.nn.Module, a transformers pipeline, a SentenceTransformer or an "
        f"nnsight model, got {type(runner).__module__}.{type(runner).__qualname__}{where}"
    )


def _nnsight_module(envoy: Any) -> nn.Module:
    """The module an nnsight envoy wraps (nnsight 0.8 keeps it as `_module`); refused while
    nnsight has not loaded its weights (a model made from a name is built on the meta
    device and loaded at its first trace)."""
    module = envoy._module
    if getattr(envoy, "dispatched", True) is False or any(
        parameter.is_meta for parameter in module.parameters()
    ):
        raise UnsupportedModelError(
            "this nnsight model's weights are not loaded yet (nnsight loads a model made "
            "from a name at its first trace): call model.dispatch() first, or create it "
            "with dispatch=True"
        )
    return module
