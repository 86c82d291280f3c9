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
kernel's output to small identity modules of the adapter's own (an `AttentionProbe`
per attention module, never attached to the model; `Probes` shows every call, a packed
module's probe its pieces together, explain.architectures.hf_packed_attention). The
recorder hooks those as it hooks a `FusedAttentionSite`'s modules (explain.engine.fused), and
the model computes exactly what its sdpa path computes.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Sequence
from typing import Any, TypeVar

from torch import Tensor, nn

from explain.architectures.base import whole_output
from explain.architectures.hf_registries import Entry, Registration
from explain.layout import FlagSetting, FusedAttentionSite, FusedPath

__all__ = [
    "IMPLEMENTATION",
    "AttentionProbe",
    "Probes",
    "dispatches_attention",
    "probe_of",
    "probed_fused_path",
    "registered",
    "shown_mask",
]

IMPLEMENTATION = "explain_sdpa"
"""The attention implementation name the wrapper is registered under in transformers."""

_PROBES: weakref.WeakKeyDictionary[nn.Module, AttentionProbe] = weakref.WeakKeyDictionary()


class AttentionProbe(nn.Module):
    """What the wrapper shows one attention module's tensors to, call by call; adapter-owned
    (one per attention module, `probe_of`), never attached to the model.

    Identity modules for the recorder's hooks: `query` (q * scaling), `key`, `value`
    (B, H, N, d), `output` (the attention output, whose gradient is dO) and `mask`
    (called with the mask the kernel gets, for its pre-hook). `see` decides when they are
    called: `Probes` at every call, a packed module's probe once its pieces are done
    (explain.architectures.hf_packed_attention)."""

    def __init__(self) -> None:
        super().__init__()
        self.query, self.key, self.value = nn.Identity(), nn.Identity(), nn.Identity()
        self.output = nn.Identity()
        self.mask = _MaskProbe()

    def see(
        self, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None, output: Tensor
    ) -> Tensor:
        """One call of the attention function: q * scaling, k and v (key/value heads
        repeated to the query heads), its mask and output (B, N, H, d); returns the output
        the model goes on with (equal in value)."""
        raise NotImplementedError


class Probes(AttentionProbe):
    """The probe of a module that calls the attention function once per forward: every
    call is shown as it is."""

    def see(
        self, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None, output: Tensor
    ) -> Tensor:
        self.query(query)
        self.key(key)
        self.value(value)
        self.mask(mask)
        return self.output(output)


P = TypeVar("P", bound=AttentionProbe)


def probe_of(module: nn.Module, kind: type[P]) -> P:
    """The probe of the attention `module`, of `kind` (made the first time): one per
    module, shared by every adapter of its model, whose calls the session serialises."""
    probe = _PROBES.get(module)
    if not isinstance(probe, kind):
        probe = kind()
        _PROBES[module] = probe
    return probe


class _MaskProbe(nn.Module):
    def forward(self, mask: Tensor | None) -> None:
        return None


def shown_mask(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor | None:
    """`FusedAttentionSite.masks` of a probe's `mask`: the mask it is shown (the kernel's:
    bool, True = attend), or None (none, or sdpa running causal without one: those sites
    are causal, `FusedAttentionSite.causal`, either way)."""
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
    probe = _PROBES.get(module)
    # Not one of the explained model's attention modules, or another thread's forward
    # through a module it shares (it gets sdpa's output, as without explain).
    if probe is None or not registered.in_this_thread():
        return output, None
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    groups = query.shape[1] // key.shape[1]
    if groups > 1:
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    return probe.see(query * scale, key, value, attention_mask, output), None


def _probe_entries() -> list[Entry]:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    return [
        (AttentionInterface, IMPLEMENTATION, lambda previous: _probed_sdpa),
        (AttentionMaskInterface, IMPLEMENTATION, lambda previous: sdpa_mask),
    ]


registered = Registration(_probe_entries)
"""The wrapper's registration for one call (a context manager, counted across calls)."""


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
        probes = probe_of(module, Probes)
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
                masks=shown_mask,
                causal=bool(getattr(module, "is_causal", True)),
            )
        )
    fused_flags = [
        FlagSetting(flag.owner, flag.name, IMPLEMENTATION) if flag.value == "eager" else flag
        for flag in flags
    ]
    return FusedPath(sites=sites, flags=fused_flags, context=registered)
