"""The fused (sdpa) attention path for Hugging Face models that dispatch attention through
transformers' attention interface (`ALL_ATTENTION_FUNCTIONS`): decoder-only language
models of every family.

The rules need q, k and v as the kernel sees them, after rotary embeddings, query/key
norms and head splitting, which every family does its own way inside its attention
module, with no submodule whose output is the final q or k. What all of them share is
the call `attention_interface(module, query, key, value, attention_mask, scaling=...)`.
So for the duration of a call the model's `_attn_implementation` names a wrapper of
transformers' own sdpa function, registered in transformers' attention registries under
`IMPLEMENTATION` (with sdpa's mask function) for the call only: the path's `context`,
which the session enters before it sets the flag and leaves after restoring it (calls
in parallel are counted, and the last one out removes the entries). The wrapper shows
q * scaling, k and v (key/value heads repeated to the query heads), the mask and the
kernel's output to small identity modules of the adapter's own (`Probes`, one set per
attention module, never attached to the model). The recorder hooks those as it hooks a
`FusedAttentionSite`'s modules (explain.fused), and the model computes exactly what its
sdpa path computes.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

from torch import Tensor, nn

from explain.architectures.base import FlagSetting, FusedAttentionSite, FusedPath, whole_output

__all__ = ["IMPLEMENTATION", "Probes", "dispatches_attention", "probed_fused_path"]

IMPLEMENTATION = "explain_sdpa"
"""The attention implementation name the wrapper is registered under in transformers."""

_PROBES: weakref.WeakKeyDictionary[nn.Module, Probes] = weakref.WeakKeyDictionary()


class Probes(nn.Module):
    """Identity modules through which the wrapper shows one attention module's tensors:
    `query` (q * scaling), `key`, `value` (B, H, N, d), `output` (the kernel's output,
    (B, N, H, d)), and `mask` (called with the mask the kernel gets, for its pre-hook)."""

    def __init__(self) -> None:
        super().__init__()
        self.query, self.key, self.value = nn.Identity(), nn.Identity(), nn.Identity()
        self.output = nn.Identity()
        self.mask = _MaskProbe()


class _MaskProbe(nn.Module):
    def forward(self, mask: Tensor | None) -> None:
        return None


def _masks(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor | None:
    """The mask the kernel gets (bool, True = attend), or None where sdpa runs causal
    without one: the sites are causal (`FusedAttentionSite.causal`) either way."""
    return args[0]


def _heads_last(output: Tensor) -> Tensor:
    """The kernel's (B, N, H, d) output -> (B, H, N, d)."""
    return output.transpose(1, 2)


def _probed_sdpa(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    *args: Any,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    output, _ = sdpa_attention_forward(
        module, query, key, value, attention_mask, *args, scaling=scaling, **kwargs
    )
    probes = _PROBES.get(module)
    if probes is None:  # not one of the explained model's attention modules
        return output, None
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    groups = query.shape[1] // key.shape[1]
    probes.query(query * scale)
    probes.key(key.repeat_interleave(groups, dim=1) if groups > 1 else key)
    probes.value(value.repeat_interleave(groups, dim=1) if groups > 1 else value)
    probes.mask(attention_mask)
    return probes.output(output), None


class _Registration:
    """The wrapper's entries in transformers' attention registries, present while at least
    one call needs them (the registries are process-wide: calls in parallel share them)."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._users = 0

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

        with self._guard:
            if self._users == 0:
                AttentionInterface.register(IMPLEMENTATION, _probed_sdpa)
                AttentionMaskInterface.register(IMPLEMENTATION, sdpa_mask)
            self._users += 1
        try:
            yield
        finally:
            with self._guard:
                self._users -= 1
                if self._users == 0:  # `register` has no inverse: remove the entries
                    AttentionInterface._global_mapping.pop(IMPLEMENTATION, None)
                    AttentionMaskInterface._global_mapping.pop(IMPLEMENTATION, None)


_registered = _Registration()


def dispatches_attention(model: nn.Module, attention: Sequence[nn.Module]) -> bool:
    """Whether the model can run on sdpa and its attention modules dispatch through
    transformers' attention interface (which the wrapper needs), with no soft-capping
    (which sdpa cannot do)."""
    if not getattr(model, "_supports_sdpa", False):
        return False
    config = model.config
    if getattr(config, "attn_logit_softcapping", None) is not None:
        return False
    return all(
        "ALL_ATTENTION_FUNCTIONS" in vars(sys.modules[type(module).__module__])
        for module in attention
    )


def probed_fused_path(attention: Sequence[nn.Module], flags: Sequence[FlagSetting]) -> FusedPath:
    """The fused path over `attention` (one module per block, in order): `flags` are the
    eager-path flags, whose attention implementation is turned into the wrapper's."""
    sites = []
    for layer, module in enumerate(attention):
        probes = _PROBES.get(module)
        if probes is None:
            probes = _PROBES[module] = Probes()
        sites.append(
            FusedAttentionSite(
                layer=layer,
                query=probes.query,
                key=probes.key,
                value=probes.value,
                values=whole_output,
                output=probes.output,
                heads=_heads_last,
                scale=1.0,  # the query probe shows q * scaling
                mask_module=probes.mask,
                masks=_masks,
                causal=bool(getattr(module, "is_causal", True)),
            )
        )
    fused_flags = [
        FlagSetting(flag.owner, flag.name, IMPLEMENTATION) if flag.value == "eager" else flag
        for flag in flags
    ]
    return FusedPath(sites=sites, flags=fused_flags, context=_registered)
