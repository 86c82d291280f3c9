"""Copies of a call's inputs that differ at the input embeddings, run in one batch: the
forwards of the methods that ask for copies (a `CopiesMethod`, explain.engine.passes
`EmbeddingCopiesPass`). The plan
repeats its inputs (`Adapter.repeated`), a hook at the embeddings puts each copy's in
place (`EmbeddingCopies`), in chunks sized by the memory budget (`copy_chunks`);
docs/methods.md ("The baselines") says how.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from explain.errors import ExplainError, OptionError
from explain.layout import InputHook, ModuleHook, TokenLayout
from explain.lrp.attnlrp import Embedding, hidden_sum, on_layout
from explain.rules.registry import EmbeddingBaseline

__all__ = [
    "ACTIVATIONS_PER_BLOCK",
    "EmbeddingCopies",
    "check_baseline_token",
    "copy_bytes",
    "copy_chunks",
]

ACTIVATIONS_PER_BLOCK = 20
"""Tensors of the embeddings' size that one block keeps for its backward, at most (its
norms' inputs, q, k, v, the attention output, the MLP's wider hidden states): the
estimate behind `copy_bytes`."""


def copy_bytes(embeddings: Tensor, blocks: int, *, gradients: bool, maps: int) -> int:
    """What one copy of the inputs (`embeddings`, the inputs' own, (B, ...)) holds at most
    while it runs: with `gradients`, what `blocks` blocks keep for the backward and the
    copy's embeddings and their gradient; without, a few activations at a time; plus
    `maps`, the bytes of the attention maps the explicit path keeps (0 on the fused
    path)."""
    size = embeddings.numel() * embeddings.element_size()
    return size * (ACTIVATIONS_PER_BLOCK * blocks + 4 if gradients else 8) + maps


def copy_chunks(count: int, per_copy: int, budget: int) -> list[range]:
    """`count` copies in consecutive chunks of as many as fit in `budget` bytes at
    `per_copy` bytes each (at least one per chunk)."""
    size = max(1, min(count, budget // max(per_copy, 1)))
    return [range(first, min(count, first + size)) for first in range(0, count, size)]


class EmbeddingCopies:
    """The state of one call's embedding hook (module docstring).

    Each forward runs the copies `blend` last set. In the first, copy 0 must be the
    inputs themselves (weight 1 everywhere): its embeddings are kept as e (`inputs`), and
    the baseline's e0 computed from the same call of the embedding module.

    Args:
        read: where the embeddings are: a module's output, or the keyword argument a
            module is called with (a vision-language model's language-model input, its
            image features among the word embeddings), and the axis of the hidden size
            (1 for a convolution's (B, D, gh, gw), -1 for (B, N, D)).
        baseline: what the inputs are blended with: zero embeddings for an argument,
            which no module of ours computes from a token or from pixels.
        batch: the inputs' batch size B.
        layout: the inputs' tokens, on which `relevance` and `on_layout` lay relevance.
        differentiable: whether the copies' embeddings become the graph's leaf (`leaf`),
            whose gradient the path integrates.
    """

    def __init__(
        self,
        read: Embedding,
        baseline: EmbeddingBaseline,
        batch: int,
        layout: TokenLayout,
        *,
        differentiable: bool,
    ) -> None:
        check_baseline_token(read.module, baseline)
        if read.argument is not None and baseline.kind != "zero":
            raise OptionError(
                f"the embeddings are read at {type(read.module).__name__}'s {read.argument} "
                "(the image tokens among the words), whose baseline is zero embeddings: "
                "leave baseline_token unset"
            )
        self.read = read
        self.axis = read.axis
        self._kind = baseline
        self._batch = batch
        self._layout = layout
        self._differentiable = differentiable
        self._inputs: Tensor | None = None
        self._baseline: Tensor | None = None
        self._weights: Tensor | None = None
        self._shift: Tensor | None = None
        self._leaf: Tensor | None = None

    def hooks(self) -> list[tuple[nn.Module, ModuleHook | InputHook]]:
        """The hook a session registers for the call: a forward hook on the module that
        outputs the embeddings, or an input hook on the module whose call takes them."""
        read = self.read
        if read.argument is None:
            return [(read.module, self._output_hook)]
        return [(read.module, InputHook(partial(self._input_hook, read.argument)))]

    def blend(self, weights: Tensor, shift: Tensor | None = None) -> None:
        """The next forward's copies, by the (C, B or 1, P or 1) weight of the inputs for
        each copy and token (P: the embedded tokens, a text's positions or an image's
        patches): copy c holds e where its weight is 1, e0 where it is 0, and
        e0 + w (e - e0) between (a point of integrated gradients' path, as captum writes
        it); plus `shift` (C, B, ...), shaped as the inputs' embeddings and in their dtype
        and device, where one is given (noise)."""
        self._weights, self._shift = weights, shift

    # -- what the forwards saw ----------------------------------------------------------

    @property
    def inputs(self) -> Tensor:
        """The inputs' own embeddings e (B, ...)."""
        if self._inputs is None:
            raise ExplainError("the embedding module did not run in the forward pass")
        return self._inputs

    @property
    def difference(self) -> Tensor:
        """e - e0 (B, ...), in the embeddings' dtype."""
        assert self._baseline is not None
        return self.inputs - self._baseline

    def tokens(self, values: Tensor) -> Tensor:  # explain.rules.registry.CopiesSeen
        return hidden_sum(values, self.inputs.dim(), self.axis, self._layout)

    def on_layout(self, relevance: Tensor) -> Tensor:
        return on_layout(relevance, self._layout)

    @property
    def leaf(self) -> Tensor:
        """The last forward's copies' embeddings (C * B, ...), the graph's leaf."""
        if self._leaf is None:
            raise ExplainError("the embedding module did not run in the copies' forward pass")
        return self._leaf

    # -- the hook -------------------------------------------------------------------------

    def _output_hook(self, module: nn.Module, args: Any, kwargs: Any, output: Tensor) -> Tensor:
        if self._inputs is None:
            self._baseline = self._baseline_of(module, args, kwargs, output)[: self._batch]
        return self._copies(output)

    def _input_hook(
        self, name: str, module: nn.Module, args: Any, kwargs: dict[str, Any]
    ) -> tuple[Any, dict[str, Any]]:
        tensor = kwargs.get(name)
        if not isinstance(tensor, Tensor):
            raise ExplainError(f"{type(module).__name__} was called without {name}")
        if self._inputs is None:
            self._baseline = torch.zeros_like(tensor[: self._batch]).detach()
        return args, {**kwargs, name: self._copies(tensor)}

    def _copies(self, output: Tensor) -> Tensor:
        """The copies' embeddings in place of `output`, the repeated inputs' (module
        docstring); the first call keeps copy 0's as the inputs' own."""
        if self._inputs is None:  # the first forward's copy 0: the inputs themselves
            self._inputs = output[: self._batch].detach()
        inputs, baseline, weights = self.inputs, self._baseline, self._weights
        assert baseline is not None and weights is not None
        weights = self._on_embeddings(weights.to(inputs.device, inputs.dtype), inputs.shape)
        blended = baseline + weights * (inputs - baseline)
        value = torch.where(weights == 1, inputs, torch.where(weights == 0, baseline, blended))
        value = (value if self._shift is None else value + self._shift).flatten(0, 1)
        if value.shape != output.shape:
            raise ExplainError(
                f"the embedding module's output has shape {tuple(output.shape)} for "
                f"{output.shape[0] // self._batch} copies of the inputs, where "
                f"{tuple(value.shape)} was expected"
            )
        if self._differentiable:
            value = value.detach().requires_grad_(True)
            self._leaf = value
        return value

    def _on_embeddings(self, weights: Tensor, shape: torch.Size) -> Tensor:
        """(C, B or 1, P or 1) weights -> broadcastable to (C, *shape), for embeddings of
        `shape` (B, ...) whose hidden size lies at the axis."""
        hidden = self.axis % len(shape)
        tokens = [size for dim, size in enumerate(shape) if dim not in (0, hidden)]
        count = torch.Size(tokens).numel()
        if weights.shape[-1] not in (1, count):
            raise ExplainError(
                f"{weights.shape[-1]} tokens to replace, but the embedding module's output "
                f"{tuple(shape)} holds {count}"
            )
        grid = tokens if weights.shape[-1] == count else [1] * len(tokens)
        return weights.reshape(*weights.shape[:2], *grid).unsqueeze(hidden + 1)

    def _baseline_of(self, module: nn.Module, args: Any, kwargs: Any, output: Tensor) -> Tensor:
        """e0 (B, ...): zeros, or the module's own forward on zeros or on the baseline
        token at every position (its first tensor argument replaced)."""
        kind = self._kind
        if kind.kind == "zero":
            return torch.zeros_like(output).detach()
        args, kwargs = list(args), dict(kwargs)
        if args and isinstance(args[0], Tensor):
            first = args[0]
        else:
            key = next(k for k, v in kwargs.items() if isinstance(v, Tensor))
            first = kwargs[key]
        if kind.kind == "zero_input":
            value = torch.zeros_like(first)
        else:
            assert kind.token is not None
            value = torch.full_like(first, kind.token)
        if args and args[0] is first:
            args[0] = value
        else:
            kwargs[key] = value
        with torch.no_grad():
            return module.forward(*args, **kwargs).detach()


def check_baseline_token(module: nn.Module, baseline: EmbeddingBaseline) -> None:
    """Refuse, before any forward, a baseline token beyond an embedding table."""
    if baseline.token is None or not isinstance(module, nn.Embedding):
        return
    if baseline.token >= module.num_embeddings:
        raise OptionError(
            f"baseline_token {baseline.token} is not in the model's vocabulary of "
            f"{module.num_embeddings} tokens"
        )
