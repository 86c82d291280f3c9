"""Attention probabilities and their gradient, recomputed for models on the fused path.

A fused scaled-dot-product kernel never materialises the attention probabilities, which
makes the forward and backward cheaper in time and memory at long sequences. The rules
need `A` and `dA = d score / d A` of one block at a time, so they are recomputed just in
time, when the block's gradient arrives in the backward pass, from tensors the kernel
keeps for its own backward anyway:

    A  = softmax(q k^T * scale)          (B, H, N, N)
    dA = dO v^T                          dO = d score / d (A v), the kernel's output

This is what the explicit path computes too, so both paths give the same numbers to
float32 precision. Whether the fused path pays is decided by `use_fused_path`, from the
measurements in docs/benchmarks.md.

Streaming: a fold needs only the readout row v, and `v @ (I + Abar)` is a sum over the
rows of Abar, so a sink that can take rows (`add_rows`) receives each block as chunks of
query rows instead (`FusedBlock.rows`), A and dA recomputed chunk by chunk from q, k, v
and dO as flash attention does: a block then never holds more than a chunk x N slice of
its maps (`STREAM_BYTES`), and the fold's memory grows with N instead of N^2.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import Tensor

from explain.architectures.base import Adapter, FusedAttentionSite, TokenLayout
from explain.errors import OptionError
from explain.rules.fold import AttentionRows

__all__ = [
    "ATTENTION_PATHS",
    "CPU_FUSED_MIN_TOKENS",
    "STREAM_BYTES",
    "AttentionPath",
    "FusedBlock",
    "attention_gradient",
    "attention_probabilities",
    "use_fused_path",
]

AttentionPath = Literal["auto", "explicit", "fused"]
ATTENTION_PATHS: tuple[str, ...] = ("auto", "explicit", "fused")

CPU_FUSED_MIN_TOKENS = 384
"""On CPU the fused path is chosen from this many tokens on (for forward-only methods on
every device). Below it the explicit path is faster, because recomputing A and dA repeats
work that the explicit backward does once (ViT-B/16 at 197 tokens); above it the explicit
path's N x N tensors per block and head dominate (see docs/benchmarks.md)."""


STREAM_BYTES = 4 << 20
"""Size of one (B, H, rows, N) chunk of a block's maps when they are streamed: a chunk has
as many query rows as fit (at least one). The fold holds a few tensors of this size at a
time, which keeps it far below the forward + backward's own memory at long sequences,
while chunks stay large enough that the per-chunk overhead does not show in the time."""


def attention_probabilities(
    query: Tensor,
    key: Tensor,
    scale: float,
    mask: Tensor | None = None,
    *,
    causal_from: int | None = None,
) -> Tensor:
    """softmax(q k^T * scale + mask) over the keys, as the explicit paths compute it. A bool
    mask is True where a query may attend; a float mask is added to the scores. A query
    that may attend nowhere (a left pad under a causal mask) gets a row of zeros, as the
    sdpa kernel gives it, instead of the NaN of a softmax over nothing.

    `causal_from`: the queries are the positions causal_from, causal_from + 1, ... and
    attend to no later key (the caller leaves out the keys after the last query). Only
    the trailing square of the scores has such keys, so that causal mask is applied there
    alone: a c x c mask instead of c x N, the largest cost of streamed chunks after the
    products and the softmax (docs/benchmarks.md, Long prompts). Every query then sees
    its own key, so no row is empty on its account."""
    # In place where the tensor is our own: streamed chunks then hold two of their size at
    # most (the scores and the probabilities), not four.
    scores = (query * scale) @ key.transpose(-2, -1)
    if causal_from is not None:
        size = query.shape[-2]
        later = torch.ones(size, size, dtype=torch.bool, device=scores.device).triu_(1)
        scores[..., causal_from : causal_from + size].masked_fill_(later, float("-inf"))
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
    mask: Tensor | None = None

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

    def probabilities(self) -> Tensor:
        """The block's (B, H, N, N) attention probabilities, outside autograd."""
        if self.query is None or self.key is None:
            raise RuntimeError(f"block {self.site.layer}: q or k was not seen in the forward")
        tokens = self.query.shape[-2]
        with torch.no_grad():
            mask, causal_from = self._mask(slice(0, tokens), self.key.shape[-2])
            return attention_probabilities(
                self.query, self.key, self.site.scale, mask, causal_from=causal_from
            )

    def _mask(self, rows: slice, keys: int) -> tuple[Tensor | None, int | None]:
        """The mask of query `rows` over the first `keys` keys, and `causal_from` for
        `attention_probabilities`. Without a model mask a causal site's mask is left to
        `causal_from` (applied to the chunk's diagonal square alone); with one, the causal
        mask is joined to the model's, sliced, so that a row the two leave empty (a left
        pad) is seen as empty."""
        mask = self.mask
        if mask is None:
            return None, rows.start if self.site.causal else None
        if mask.dim() >= 2 and mask.shape[-2] > 1:
            mask = mask[..., rows, :]
        if mask.shape[-1] > 1:
            mask = mask[..., :keys]
        if not self.site.causal:
            return mask, None
        assert self.query is not None
        device = self.query.device
        causal = torch.arange(keys, device=device) <= torch.arange(
            rows.start, rows.stop, device=device
        ).unsqueeze(-1)
        if mask.dtype == torch.bool:
            return mask & causal, None
        return mask.masked_fill(~causal, float("-inf")), None

    def probabilities_grad(self, output_grad: Tensor) -> Tensor:
        """dA (B, H, N, N) from the gradient of the attention output as it enters the
        block's output module, (B, N, H * d)."""
        if self.value is None:
            raise RuntimeError(f"block {self.site.layer}: v was not seen in the forward")
        with torch.no_grad():
            return attention_gradient(self.site.heads(output_grad), self.value)

    def rows(
        self, output_grad: Tensor | None, max_bytes: int | None = None
    ) -> Iterator[AttentionRows]:
        """The block's A and dA by chunks of query rows (each (B, H, rows, N), at most
        `max_bytes`, default `STREAM_BYTES`), each computed only when it is asked for, from
        q, k, v, the mask and dO (outside autograd); without `output_grad`, A alone."""
        if self.query is None or self.key is None or self.value is None:
            raise RuntimeError(f"block {self.site.layer}: q, k or v was not seen in the forward")
        query, key, value = self.query, self.key, self.value
        gradient = None if output_grad is None else self.site.heads(output_grad)
        batch, heads, tokens, _ = query.shape
        row_bytes = batch * heads * key.shape[-2] * max(query.element_size(), 4)
        step = max(1, (STREAM_BYTES if max_bytes is None else max_bytes) // row_bytes)
        for first in range(0, tokens, step):
            rows = slice(first, min(tokens, first + step))
            # Causal rows see no key after the chunk's last row: those columns are left out.
            keys = rows.stop if self.site.causal else key.shape[-2]
            mask, causal_from = self._mask(rows, keys)
            with torch.no_grad():
                attention = attention_probabilities(
                    query[:, :, rows],
                    key[:, :, :keys],
                    self.site.scale,
                    mask,
                    causal_from=causal_from,
                )
                attention_grad = (
                    None
                    if gradient is None
                    else attention_gradient(gradient[:, :, rows], value[:, :, :keys])
                )
            yield AttentionRows(rows=rows, attention=attention, gradient=attention_grad)
            del attention, attention_grad  # the consumer's references are the last ones


def use_fused_path(
    adapter: Adapter,
    layout: TokenLayout,
    *,
    needs_gradients: bool,
    requested: AttentionPath,
    reads_attention: bool = True,
) -> bool:
    """Whether a call runs on the fused path.

    "explicit" and "fused" are obeyed ("fused" needs an adapter that supports it).
    "auto" takes the fused path wherever the adapter supports it for a method that reads
    no attention map (`reads_attention=False`: AttnLRP and CP-LRP, whose rules sit on
    the projections), since then the model's own kernel is the cheaper forward and
    backward at any length. For a method that reads the maps it takes the fused path
    where that pays: from `CPU_FUSED_MIN_TOKENS` tokens on, and for gradient methods
    also on CUDA at any length (where the fused kernels are much faster and the explicit
    path's N x N tensors cost the most memory). A forward-only method (rollout, raw
    attention) computes every A either way; from that length on, folding A by chunks of
    query rows is the faster and holds one chunk instead of a block's maps (rollout on a
    narrow Llama at 4096 tokens: 0.66 s and 56 MiB against 2.99 s and 845 MiB; at 256
    tokens the explicit path is 10% faster).
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
        return True
    if requested == "explicit" or not supported:
        return False
    if not reads_attention:
        return True
    if needs_gradients and adapter.parameter.device.type == "cuda":
        return True
    return layout.num_tokens >= CPU_FUSED_MIN_TOKENS
