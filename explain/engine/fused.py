"""Attention probabilities and their gradient, recomputed for models on the fused path.

A fused scaled-dot-product kernel never materialises the attention probabilities, which
makes the forward and backward cheaper in time and memory at long sequences. The rules
need `A` and `dA = d score / d A` of one block at a time, so they are recomputed just in
time, when the block's gradient arrives in the backward pass, from tensors the kernel
keeps for its own backward anyway:

    A  = softmax(q k^T * scale)          (B, H, N, N)
    dA = dO v^T                          dO = d score / d (A v), the kernel's output

This is what the explicit path computes too, so both paths give the same numbers to
float32 precision. Which path a call takes is decided by `choose_path`, from the device,
a memory budget and the measurements in docs/benchmarks.md.

Streaming: a fold needs only the readout row v, and `v @ (I + Abar)` needs only the
spread `v @ Abar`, which explain.engine.kernels computes from q, k, v and dO without any
N x N map (explain.engine.spread). A block hands it its tensors and its mask as a key
mask (`FusedBlock.key_mask`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor, nn

from explain.architectures.base import Adapter
from explain.errors import OptionError
from explain.layout import FusedAttentionSite, Pieces, TokenLayout

__all__ = [
    "ATTENTION_PATHS",
    "CPU_FUSED_MIN_COLUMNS",
    "CPU_FUSED_MIN_TOKENS",
    "CPU_MEMORY_BUDGET",
    "AttentionPath",
    "FusedBlock",
    "PathChoice",
    "attention_gradient",
    "attention_heads",
    "attention_probabilities",
    "choose_path",
    "default_memory_budget",
    "explicit_map_bytes",
]

AttentionPath = Literal["auto", "explicit", "fused"]
ATTENTION_PATHS: tuple[str, ...] = ("auto", "explicit", "fused")

CPU_FUSED_MIN_TOKENS = 384
"""On CPU the fused path is chosen from this many tokens on (`choose_path`). Below it the
explicit path is faster, because recomputing A and dA repeats work that the explicit
backward does once (ViT-B/16 at 197 tokens); above it the explicit path's N x N tensors
per block and head dominate (see docs/benchmarks.md)."""


CPU_FUSED_MIN_COLUMNS = 2
"""On CPU a method that differentiates the maps takes the fused path from this many score
columns on, at any length (`choose_path`): the explicit backward keeps a dA per block and
column, while the streamed fold takes every column's rows in one product (CPU seconds per
`cite` of generic on a narrow Llama, explicit against fused: 360 tokens x 1 column 0.055
against 0.052, x 2 0.109 against 0.051, x 32 1.49 against 0.62; see docs/benchmarks.md).
A forward-only method folds one map for every column, and stays explicit below
`CPU_FUSED_MIN_TOKENS` (rollout at 360 x 32: 0.024 against 0.029)."""


CPU_MEMORY_BUDGET = 1 << 30
"""The largest default memory budget off CUDA (`default_memory_budget`)."""


def attention_probabilities(
    query: Tensor, key: Tensor, scale: float, mask: Tensor | None = None, *, causal: bool = False
) -> Tensor:
    """softmax(q k^T * scale + mask) over the keys, as the explicit paths compute it. A bool
    mask is True where a query may attend; a float mask is added to the scores; `causal`
    also hides every key after the query's own position. A query that may attend nowhere
    (a left pad under a causal mask) gets a row of zeros, as the sdpa kernel gives it,
    instead of the NaN of a softmax over nothing."""
    scores = (query * scale) @ key.transpose(-2, -1)  # our own tensor: masked in place
    if causal:
        size = scores.shape[-1]
        later = torch.ones(size, size, dtype=torch.bool, device=scores.device).triu_(1)
        if mask is not None and mask.dtype == torch.bool:
            mask = mask & ~later  # joined, so that a row the two leave empty is seen empty
        else:
            scores.masked_fill_(later, float("-inf"))
    if mask is None:
        return scores.softmax(dim=-1)
    if mask.dtype != torch.bool:
        return scores.add_(mask).softmax(dim=-1)
    probabilities = scores.masked_fill_(~mask, float("-inf")).softmax(dim=-1)
    return probabilities.masked_fill_(~mask.any(dim=-1, keepdim=True), 0.0)


def attention_gradient(output_grad: Tensor, value: Tensor) -> Tensor:
    """d score / d A = dO v^T, because the attention output is A v."""
    return output_grad @ value.transpose(-2, -1)


@dataclass
class FusedBlock:
    """One block's tensors from the forward pass, kept until its gradient has arrived.

    q, k and v are the very tensors the fused kernel saved for its backward, so keeping
    references costs no memory beyond what autograd holds already.
    """

    site: FusedAttentionSite
    query: Tensor | None = None
    key: Tensor | None = None
    value: Tensor | None = None
    mask: Tensor | Pieces | None = None

    def see_query(self, output: Tensor) -> None:
        self.query = self.site.queries(output) if self.site.queries else output

    def see_key(self, output: Tensor) -> None:
        self.key = self.site.keys(output) if self.site.keys else output

    def see_value(self, output: Tensor) -> None:
        self.value = self.site.values(output)

    def see_mask(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        assert self.site.masks is not None
        self.mask = self.site.masks(args, kwargs)

    def release(self) -> None:
        """Drop the references once nothing will ask for this block again."""
        self.query = self.key = self.value = self.mask = None

    def tensors(self) -> tuple[Tensor, Tensor, Tensor]:
        """q, k and v (B, H, N, d) as the kernel saw them."""
        if self.query is None or self.key is None or self.value is None:
            raise RuntimeError(f"block {self.site.layer}: q, k or v was not seen in the forward")
        return self.query, self.key, self.value

    def probabilities(self) -> Tensor:
        """The block's (B, H, N, N) attention probabilities, outside autograd."""
        query, key, _ = self.tensors()
        with torch.no_grad():
            return attention_probabilities(
                query, key, self.site.scale, self._dense_mask(), causal=self.site.causal
            )

    def _dense_mask(self) -> Tensor | None:
        """The mask as a tensor that broadcasts to the block's maps."""
        if isinstance(self.mask, Pieces):
            return self.mask.dense(self.tensors()[0].device)
        return self.mask

    def output_grads(self, output_grads: Tensor) -> Tensor:
        """dO per head (C, B, H, N, d) from the gradients of the attention output for C
        score columns, (C, B, ...) as the output enters the block's output module."""
        heads = self.site.heads(output_grads.flatten(0, 1))
        return heads.unflatten(0, output_grads.shape[:2])

    def probabilities_grad(self, output_grad: Tensor) -> Tensor:
        """dA (B, H, N, N) from the gradient of the attention output of one column."""
        _, _, value = self.tensors()
        with torch.no_grad():
            return attention_gradient(self.output_grads(output_grad[None])[0], value)

    def key_mask(self) -> tuple[Tensor | None, Tensor | None]:
        """The block's mask as explain.engine.kernels takes it: (B, Nk) bool, True where a
        key may be attended (None: every key), together with the site's causality, and a
        0-d bool tensor that says whether the two are the whole mask (None: surely so).
        They are not where the mask hides other keys of other rows (a sliding window) or
        adds a bias; the caller then folds the block from its whole map. Reading that
        tensor waits for the device, so a caller reads it once per distinct mask. `Pieces`
        are seen as their dense mask here: a fold that takes them piece by piece reads
        them as they are (explain.engine.spread)."""
        mask = self._dense_mask()
        if mask is None:
            return None, None
        exact = None
        if mask.dtype != torch.bool:  # additive: 0 where attended, a huge negative where not
            allowed = mask > torch.finfo(mask.dtype).min / 2
            exact = ((mask == 0) | ~allowed).all()  # no bias
            mask = allowed
        mask = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))  # as sdpa broadcasts
        query, _, _ = self.tensors()
        keys = mask.any(dim=2).any(dim=1).expand(query.shape[0], mask.shape[-1])
        if mask.shape[1] == mask.shape[2] == 1 and not self.site.causal:
            return keys, exact  # a key mask already
        candidate = keys[:, None, None, :]
        if self.site.causal:
            size = mask.shape[-1]
            causal = torch.ones(size, size, dtype=torch.bool, device=mask.device).tril_()
            candidate, mask = candidate & causal, mask & causal
        same = (candidate == mask).all()
        return keys, same if exact is None else same & exact


PathChoice = Literal["explicit", "fused"]


def choose_path(
    adapter: Adapter,
    layout: TokenLayout,
    *,
    batch: int,
    needs_gradients: bool,
    requested: AttentionPath,
    memory_budget: int,
    reads_attention: bool = True,
    maps: Sequence[tuple[int, int, int]] | None = None,
    columns: int | None = None,
) -> PathChoice:
    """The attention path a call runs on (docs/benchmarks.md, "Which path").

    "explicit" and "fused" are obeyed ("fused" needs an adapter that supports it).
    "auto" takes the fused path wherever the adapter supports it for a method that reads
    no attention map (`reads_attention=False`: AttnLRP and CP-LRP, whose rules sit on
    the projections), since then the model's own kernel is the cheaper forward and
    backward at any length. For a method that reads the maps it keeps the explicit path
    while the maps fit `memory_budget` (`explicit_map_bytes`; `maps`: the stacks' own
    sequences, `Adapter.attention_maps`), and on CPU also only while the longest
    sequence is shorter than `CPU_FUSED_MIN_TOKENS` tokens: on CUDA the explicit maps are
    one batched kernel per product and the fastest path wherever they fit; on CPU
    recomputing A (and dA) by chunks is faster from that length on (rollout on a narrow
    Llama at 4096 tokens: 0.66 s and 56 MiB against 2.99 s and 845 MiB; at 256 tokens the
    explicit path is 10% faster). Beyond, the fused path streams each block's fold
    (explain.engine.spread). On CPU a method with gradients (`needs_gradients`) that
    explains `columns` score columns, known before the forward (a generation's tokens;
    None: not known, taken as one), keeps the explicit path for one column only
    (`CPU_FUSED_MIN_COLUMNS`).
    """
    if requested not in ATTENTION_PATHS:
        raise OptionError(
            f"attention_path must be one of {', '.join(ATTENTION_PATHS)}; got {requested!r}"
        )
    supported = adapter.fused_path() is not None
    if requested == "fused":
        if not supported:
            raise OptionError(
                f"attention_path='fused' is not available for {type(adapter.model).__name__}"
                " (its adapter has no fused path); use 'auto' or 'explicit'"
            )
        return "fused"
    if requested == "explicit" or not supported:
        return "explicit"
    if not reads_attention:
        return "fused"
    stacks = _stacks(adapter, layout, batch, maps)
    fits = explicit_map_bytes(adapter, layout, batch, needs_gradients, maps) <= memory_budget
    if adapter.parameter.device.type == "cuda":
        return "explicit" if fits else "fused"
    longest = max(tokens for _, _, tokens in stacks)
    many = needs_gradients and (columns or 1) >= CPU_FUSED_MIN_COLUMNS
    return "explicit" if fits and longest < CPU_FUSED_MIN_TOKENS and not many else "fused"


def explicit_map_bytes(
    adapter: Adapter,
    layout: TokenLayout,
    batch: int,
    needs_gradients: bool,
    maps: Sequence[tuple[int, int, int]] | None = None,
) -> int:
    """What the explicit path's maps hold at most: every block's A (B, H, N, N) in the
    model's dtype, kept from the forward until its gradient has been used, and for
    gradient methods one dA and the rule's float32 temporaries of the largest block's
    size. `maps`: (blocks, maps, tokens) per stack where the stacks attend over
    sequences of their own (`Adapter.attention_maps`); None: every block over `layout`."""
    stacks = _stacks(adapter, layout, batch, maps)
    size = adapter.parameter.element_size()
    kept = sum(blocks * count * tokens**2 for blocks, count, tokens in stacks) * size
    largest = max(count * tokens**2 for _, count, tokens in stacks)
    return kept + (largest * (size + 8) if needs_gradients else 0)


def _stacks(
    adapter: Adapter,
    layout: TokenLayout,
    batch: int,
    maps: Sequence[tuple[int, int, int]] | None,
) -> Sequence[tuple[int, int, int]]:
    """(blocks, maps, tokens) per stack: `maps`, or every block over `layout`."""
    if maps is not None:
        return maps
    return [(adapter.num_layers, batch * attention_heads(adapter.model), layout.num_tokens)]


def attention_heads(model: nn.Module) -> int:
    """The number of attention heads of `model` (the largest a module or the config
    names; 1 if none does), for the explicit path's memory estimate."""
    found = [1]
    config = getattr(model, "config", None)
    configs = [config, getattr(config, "text_config", None), getattr(config, "vision_config", None)]
    for each in configs:
        heads = getattr(each, "num_attention_heads", None)
        if isinstance(heads, int):
            found.append(heads)
    for module in model.modules():
        for name in ("num_heads", "num_attention_heads"):
            heads = getattr(module, name, None)
            if isinstance(heads, int):
                found.append(heads)
    return max(found)


def default_memory_budget(device: torch.device) -> int:
    """The memory budget of a call that states none: half the free memory of a CUDA
    device (read once per call), counting as free what PyTorch's caching allocator holds
    without using it (what earlier calls left cached would otherwise decide the path); on
    other devices a quarter of the available RAM, at most `CPU_MEMORY_BUDGET` (a CPU is
    shared by other work, and its streamed fold gains little from chunks larger than
    that)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return (free + cached) // 2
    try:
        available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return CPU_MEMORY_BUDGET
    return max(min(available // 4, CPU_MEMORY_BUDGET), 64 << 20)
