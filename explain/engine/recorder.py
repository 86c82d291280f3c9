"""The recorder: what the model computes, seen for one call.

Inside an active `Session` (explain.engine.session), which has borrowed the model (eval
mode, no parameter gradients, the attention path's flags, the RNG forked, the lock), a
recorder keeps each block's attention probabilities from the forward pass and receives
their gradients in the backward pass through tensor hooks on the same tensors (Chefer et
al.'s `save_attn_gradients`), optionally does the same for hidden states, and on the fused
path recomputes attention and its gradient from q, k, v (explain.engine.fused), as it does on
either path for a block whose probabilities are no tensor of the model (a packed
sequence attended piece by piece: `AttentionSite.recomputed`). It also registers
the forward hooks that only read activations for a rule (the LRP walk's). On exit every
hook it registered is removed and what it kept is dropped; the session then gives the
model back.

Memory: an attention map kept for its gradient is released as soon as its gradient has
been delivered, so the backward pass never holds more than autograd itself does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from explain.architectures.base import this_thread_only
from explain.engine.fused import FusedBlock
from explain.engine.session import Session
from explain.errors import ExplainError, TargetError
from explain.layout import FusedAttentionSite, FusedPath, ModuleHook

__all__ = [
    "BATCHED_GRADIENT_BYTES",
    "AttentionCallback",
    "BlockCallback",
    "GradientCallback",
    "Recorder",
    "column_gradients",
]

AttentionCallback = Callable[[int, Tensor], None]
"""Receives (layer, attention) in the forward pass."""

GradientCallback = Callable[[int, Tensor, Tensor], None]
"""Receives (layer, attention, d score / d attention) in the backward pass."""

BlockCallback = Callable[[int, slice, "FusedBlock | Tensor", Tensor | None], None]
"""Receives (layer, the score columns, the block's record, its gradient for every one of
those columns) for a fold batched over columns (explain.engine.spread). The record is the
attention (B, H, N, N) on the explicit path, with dA (C, B, H, N, N); on the fused path
(and for a recomputed site, `AttentionSite.recomputed`) it is the block itself (q, k, v
and mask), with dO per head (C, B, H, N, d), so that no N x N map need ever be built.
The gradient is None without a backward; the columns are a chunk of a batched
backward's, or all of them (slice(None)). It runs outside autograd: a fold of the maps
builds no graph."""

TargetGradientCallback = Callable[[int, int, Tensor, Tensor], None]
"""Receives (score column k, layer, attention, d score_k / d attention)."""

_SCORE_WITHOUT_GRAPH = (
    "the explained score does not depend on the model's attention: a target callable's "
    "scores must be computed from the model output it receives (not detached, not from "
    ".item() or a tensor made elsewhere)"
)

BATCHED_GRADIENT_BYTES = 1 << 30
"""Memory bound of one batched backward over several targets: every tracked tensor's
gradient is held for all targets of a chunk at once, so targets are taken in chunks whose
gradients fit in this many bytes (at least one target per chunk)."""


class Recorder(contextlib.AbstractContextManager["Recorder"]):
    """Record what `session`'s model computes, for one call.

    Args:
        session: the active session that has borrowed the model; its `fused` path, when
            set, is recorded by recomputing each block's attention and its gradient from
            q, k, v and the gradient of the attention output just in time
            (explain.engine.fused), instead of reading the explicit path's maps.
        on_attention: called with every block's attention in the forward pass.
        track: layers whose attention is kept for a gradient (their grad is requested).
        hidden_states: also keep hidden states (block 0 input, every block output) and
            their gradients.
        module_hooks: (module, forward hook) pairs that only read what they see,
            registered and removed with the recorder's own hooks: how a rule that needs
            more than attention (the LRP walk's activations) sees the forward pass.
        stream_forward: fused path, no gradient: keep every block's q, k (and mask), small,
            instead of handing its whole map to `on_attention` in the forward, so that
            `stream_attention` can hand the blocks over last first, folded without maps.
        observed: the layers whose attention `on_attention` is for (None: every layer): a
            block recomputed from q, k, v that no one reads (a vision-language model's
            tower explained at depth "lm") is then never recomputed.
    """

    def __init__(
        self,
        session: Session,
        *,
        on_attention: AttentionCallback | None = None,
        track: Collection[int] = (),
        hidden_states: bool = False,
        module_hooks: Sequence[tuple[nn.Module, ModuleHook]] = (),
        stream_forward: bool = False,
        observed: Collection[int] | None = None,
    ) -> None:
        if (track or hidden_states) and not session.differentiable:
            raise ExplainError("recording gradients needs a differentiable Session")
        self.session = session
        self.adapter = session.adapter
        self._fused: FusedPath | None = session.fused
        self._stream_forward = stream_forward and self._fused is not None
        self._module_hooks = tuple(module_hooks)
        self._fused_blocks: dict[int, FusedBlock] = {}
        self._fused_outputs: dict[int, Tensor] = {}  # fused path: the tracked tensors
        self._on_attention = on_attention
        self._observed = None if observed is None else frozenset(observed)
        self._track = frozenset(track)
        self._keep_hidden = hidden_states
        self.attentions: dict[int, Tensor] = {}
        self.hidden_states: list[Tensor] = []
        self.attention_grads: dict[int, Tensor] = {}
        self.hidden_state_grads: dict[int, Tensor] = {}
        self._on_gradient: GradientCallback | None = None
        self._on_block: BlockCallback | None = None
        self._retain_graph = False
        self._handles: list[RemovableHandle] = []
        self._active = False

    # -- context ---------------------------------------------------------------------------

    def __enter__(self) -> Recorder:
        if not self.session.active:
            raise ExplainError("a Recorder records inside an active Session")
        if self._active:
            raise ExplainError("a Recorder cannot be entered twice")
        self._active = True
        try:
            self._install_hooks()
        except BaseException:
            self._remove()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._remove()

    def _remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self.attentions.clear()
        self._fused_blocks.clear()
        self._fused_outputs.clear()
        self._active = False

    def _hook(
        self, module: nn.Module, hook: Callable[..., Any], *, pre: bool = False, **options: Any
    ) -> None:
        """Register a forward hook (`pre`: a forward pre-hook) that acts only in this
        thread, whose call this is (another thread's forward through a module the model
        shares is not this call's), and remove it with the recorder's others."""
        register = module.register_forward_pre_hook if pre else module.register_forward_hook
        self._handles.append(register(this_thread_only(hook), **options))

    def _install_hooks(self) -> None:
        for module, hook in self._module_hooks:
            self._hook(module, hook, with_kwargs=True)
        # A module may serve several blocks (ALBERT runs one shared layer L times): it gets
        # one hook, which hands its k-th call in a forward pass to the k-th block it serves.
        # A site whose probabilities are no tensor of the model (`AttentionSite.recomputed`)
        # is recorded as on the fused path, whichever path the call takes.
        declared = self.adapter.attention_sites()
        if self._fused is not None:
            self._install_fused_hooks(self._fused.sites)
        else:
            self._install_fused_hooks([s.recomputed for s in declared if s.recomputed])
        explicit_sites = () if self._fused else [s for s in declared if s.recomputed is None]
        for module, sites in _occurrences(explicit_sites, lambda s: s.module):
            turn = _Rotation(sites)
            self._hook(
                module,
                lambda module, args, output, t=turn: self._see_attention(
                    (site := t.next()).layer,
                    site.probabilities(output if site.seen_in == "output" else args),
                ),
            )
        blocks = _occurrences(range(self.adapter.num_layers), lambda i: self.adapter.blocks[i])
        if self.session.differentiable:
            first, indices = blocks[0]
            turn = _Rotation(indices)
            self._hook(
                first,
                lambda module, args, kwargs, t=turn: (
                    self._enter_first_block(module, args, kwargs) if t.next() == 0 else None
                ),
                pre=True,
                with_kwargs=True,
            )
            # Further stacks (a dual encoder's second tower, a decoder) start from leaves too.
            for entry in self.adapter.entry_blocks[1:]:
                self._hook(
                    entry,
                    lambda module, args, kwargs: _as_leaf(args, kwargs)[:2],
                    pre=True,
                    with_kwargs=True,
                )
        if self._keep_hidden:
            for block, indices in blocks:
                turn = _Rotation(indices)
                self._hook(
                    block,
                    lambda module, args, output, t=turn: self._see_hidden(
                        t.next() + 1, self.adapter.block_output(output)
                    ),
                )

    def _install_fused_hooks(self, sites: Sequence[FusedAttentionSite]) -> None:
        if len({id(site.output) for site in sites}) != len(sites):
            raise ExplainError("the fused path does not support layers shared between blocks")
        for site in sites:
            block = self._fused_blocks[site.layer] = FusedBlock(site)
            self._hook(site.query, lambda m, a, out, b=block: b.see_query(out))
            self._hook(site.key, lambda m, a, out, b=block: b.see_key(out))
            self._hook(site.value, lambda m, a, out, b=block: b.see_value(out))
            self._hook(
                site.output,
                lambda m, args, layer=site.layer: self._see_fused_output(layer, args[0]),
                pre=True,
            )
            if site.mask_module is not None:
                self._hook(
                    site.mask_module,
                    lambda m, args, kwargs, b=block: b.see_mask(args, kwargs),
                    pre=True,
                    with_kwargs=True,
                )

    # -- forward hooks ----------------------------------------------------------------------

    def _enter_first_block(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """Make block 0's input a leaf that requires grad: with frozen parameters this is
        what gives the attention maps a graph, and it stops the backward at the blocks."""
        args, kwargs, hidden = _as_leaf(args, kwargs)
        self.hidden_states.clear()
        if self._keep_hidden:
            self._see_hidden(0, hidden)
        return args, kwargs

    def _see_attention(self, layer: int, attention: Tensor) -> None:
        if self._on_attention is not None:
            self._on_attention(layer, attention)
        if layer in self._track and attention.requires_grad:
            self.attentions[layer] = attention
            self._handles.append(
                attention.register_hook(lambda grad, i=layer: self._deliver(i, grad))
            )

    def _see_fused_output(self, layer: int, output: Tensor) -> None:
        """Fused path: the block's attention output, whose gradient dO gives dA = dO v^T."""
        block = self._fused_blocks[layer]
        if self._stream_forward:  # kept for `stream_attention`, after the forward
            return
        if self._on_attention is not None and (self._observed is None or layer in self._observed):
            self._on_attention(layer, block.probabilities())
        if layer in self._track and output.requires_grad:
            self._fused_outputs[layer] = output
            self._handles.append(output.register_hook(lambda grad, i=layer: self._deliver(i, grad)))
        else:  # nothing will ask for this block again: let q, k, v go with the graph
            block.release()

    def _see_hidden(self, index: int, hidden: Tensor) -> None:
        if index != len(self.hidden_states):
            raise ExplainError(f"hidden state {index} arrived out of order")
        self.hidden_states.append(hidden)
        if hidden.requires_grad:
            self._handles.append(
                hidden.register_hook(lambda grad, i=index: self._see_hidden_grad(i, grad))
            )

    def _see_hidden_grad(self, index: int, grad: Tensor) -> None:
        self.hidden_state_grads[index] = grad

    def _deliver(self, layer: int, grad: Tensor) -> None:
        if self._on_block is not None:
            record, gradient = self._record(layer, grad[None])
            self._on_block(layer, slice(0, 1), record, gradient)
        elif self._on_gradient is not None:
            self._on_gradient(layer, self._attention(layer), self._attention_grad(layer, grad))
        if not self._retain_graph:
            self._release(layer)  # released as soon as its gradient has been used

    def _attention(self, layer: int) -> Tensor:
        """A of a tracked layer: kept on the explicit path, recomputed on the fused path
        (and for a recomputed site)."""
        if layer not in self._fused_blocks:
            return self.attentions[layer]
        return self._fused_blocks[layer].probabilities()

    def _attention_grad(self, layer: int, grad: Tensor) -> Tensor:
        """dA from the gradient of the layer's tracked tensor: A itself on the explicit
        path, the attention output on the fused path (dA = dO v^T)."""
        if layer not in self._fused_blocks:
            return grad
        return self._fused_blocks[layer].probabilities_grad(grad)

    def _record(self, layer: int, grads: Tensor) -> tuple[FusedBlock | Tensor, Tensor]:
        """A tracked layer's record and gradients for a `BlockCallback`, from the
        gradients of its tracked tensor for several columns (C, ...)."""
        if layer not in self._fused_blocks:
            return self.attentions[layer], grads
        block = self._fused_blocks[layer]
        return block, block.output_grads(grads)

    def _release(self, layer: int) -> None:
        if layer not in self._fused_blocks:
            del self.attentions[layer]
        else:
            del self._fused_outputs[layer]
            self._fused_blocks[layer].release()

    @property
    def recomputes(self) -> bool:
        """Whether some block is recorded from its q, k and v (the fused path, or a site
        whose probabilities are no tensor of the model) rather than as its map: its
        record (`BlockCallback`) is then a `FusedBlock`."""
        return bool(self._fused_blocks)

    def stream_attention(self, on_block: BlockCallback) -> None:
        """After a `stream_forward` forward: every block (no gradient) to `on_block`, last
        block first, each released once it has been handed over."""
        if not self._stream_forward:
            raise ExplainError(
                "stream_attention needs a Recorder(stream_forward=True) on the fused path"
            )
        for layer in sorted(self._fused_blocks, reverse=True):
            block = self._fused_blocks[layer]
            on_block(layer, slice(None), block, None)
            block.release()

    # -- backward ---------------------------------------------------------------------------

    def backward(
        self,
        score: Tensor,
        on_gradient: GradientCallback | None = None,
        *,
        retain_graph: bool = False,
        keep_gradients: bool = False,
        on_block: BlockCallback | None = None,
    ) -> None:
        """Differentiate the scalar `score` with respect to the tracked tensors only.

        No parameter gradient is computed: the backward asks autograd for the gradient of
        the earliest tracked tensor, which runs exactly the part of the graph between it
        and the score, and tensor hooks hand every tracked attention gradient to
        `on_gradient` as it arrives, last block first. `retain_graph` keeps the graph and
        the attention maps for another backward (several targets over one forward);
        `keep_gradients` stores every gradient in `attention_grads` and
        `hidden_state_grads` (for `trace`) instead of letting each go once it is used.
        `on_block` (when given, and not with `keep_gradients`) receives every block's
        record instead of `on_gradient` (`BlockCallback`): on the fused path no N x N map
        of a block is then ever built.
        """
        if not self._active:
            raise ExplainError("Recorder.backward must be called inside the recorder context")
        earliest = self._earliest_tracked()
        if not earliest:
            raise ExplainError("nothing with a gradient was recorded in the forward pass")
        if not score.requires_grad:
            raise TargetError(_SCORE_WITHOUT_GRAPH)
        delivered: set[int] = set()

        def deliver(layer: int, attention: Tensor, grad: Tensor) -> None:
            delivered.add(layer)
            if keep_gradients:
                self.attention_grads[layer] = grad
            if on_gradient is not None:
                on_gradient(layer, attention, grad)

        def deliver_block(
            layer: int, columns: slice, record: FusedBlock | Tensor, gradient: Tensor | None
        ) -> None:
            delivered.add(layer)
            assert on_block is not None
            on_block(layer, columns, record, gradient)

        self._on_gradient = deliver
        self._on_block = deliver_block if on_block is not None and not keep_gradients else None
        self._retain_graph = retain_graph
        self.attention_grads.clear()
        self.hidden_state_grads.clear()
        try:
            grads = torch.autograd.grad(
                score, inputs=earliest, retain_graph=retain_graph, allow_unused=True
            )
        finally:
            self._on_gradient = None
            self._on_block = None
        if all(grad is None for grad in grads):
            raise TargetError(_SCORE_WITHOUT_GRAPH)
        if delivered != self._track:
            raise ExplainError(
                f"no gradient reached the attention of layers {sorted(self._track - delivered)}"
            )

    def backward_batched(
        self,
        scores: Tensor,
        on_gradient: TargetGradientCallback | None = None,
        *,
        max_bytes: int | None = None,
        on_block: BlockCallback | None = None,
    ) -> None:
        """Differentiate every column k of the (B, K) `scores`, summed over the batch.

        One forward serves all K targets: autograd runs one vectorised backward
        (`is_grads_batched`) per chunk of targets, sized so that the chunk's gradients of
        the tracked tensors fit in `max_bytes` (default `BATCHED_GRADIENT_BYTES`).
        `on_gradient(k, layer, attention, grad)` is called for every target and tracked
        layer, last block first, as in `backward`; `on_block`, when given, instead receives
        every block once per chunk of targets with the gradients of all of them
        (`BlockCallback`), for a fold batched over columns.
        """
        if not self._active:
            raise ExplainError("Recorder.backward_batched must be called inside the context")
        if scores.dim() != 2:
            raise ExplainError(f"expected (B, K) scores, got shape {tuple(scores.shape)}")
        tracked = self._tracked()
        missing = self._track - set(tracked)
        if missing:
            raise ExplainError(f"no gradient can reach the attention of layers {sorted(missing)}")
        layers = sorted(self._track)
        tensors = [tracked[layer] for layer in layers]
        # The tensor hooks still fire, inside autograd's vmap: they must neither call back
        # nor release anything there; the callbacks run below on the unbatched results.
        self._on_gradient = None
        self._retain_graph = True
        try:
            for columns, grads in column_gradients(scores, tensors, max_bytes):
                for position in reversed(range(len(layers))):
                    layer, grad = layers[position], grads[position]
                    grads[position] = None  # type: ignore[call-overload]  # free as we go
                    if on_block is not None:  # outside autograd, as within a backward
                        record, gradient = self._record(layer, grad)
                        with torch.no_grad():
                            on_block(layer, slice(columns.start, columns.stop), record, gradient)
                        continue
                    assert on_gradient is not None, "give on_gradient or on_block"
                    attention = self._attention(layer)
                    for row, column in enumerate(columns):
                        attention_grad = self._attention_grad(layer, grad[row])
                        on_gradient(column, layer, attention, attention_grad)
        finally:
            self._retain_graph = False

    def _tracked(self) -> dict[int, Tensor]:
        """Every tracked layer's tensor: its attention, or on the fused path (and for a
        recomputed site) its attention output."""
        return {**self.attentions, **self._fused_outputs}

    def _earliest_tracked(self) -> list[Tensor]:
        """What the backward differentiates: the earliest tracked tensor of every stack
        (block 0's input when hidden states are kept), so exactly the graph between them
        and the score runs; empty when nothing was tracked."""
        if self._keep_hidden and self.hidden_states and len(self.adapter.entry_blocks) == 1:
            return [self.hidden_states[0]]
        tracked = self._tracked()
        stacks = {site.layer: site.stack for site in self.adapter.attention_sites()}
        earliest: dict[str, Tensor] = {}
        for layer in sorted(tracked):
            earliest.setdefault(stacks.get(layer, "main"), tracked[layer])
        return list(earliest.values())


def column_gradients(
    scores: Tensor, inputs: Sequence[Tensor], max_bytes: int | None = None
) -> Iterator[tuple[range, list[Tensor]]]:
    """The gradients of every column k of the (B, K) `scores`, summed over the batch, with
    respect to `inputs`: one vectorised backward (`is_grads_batched`) per chunk of
    columns, sized so that the chunk's gradients fit in `max_bytes` (default
    `BATCHED_GRADIENT_BYTES`; at least one column per chunk). Yields (the chunk's
    columns, one (len(columns), *input.shape) gradient per input); the graph is kept
    until the last chunk."""
    per_column = sum(t.numel() * t.element_size() for t in inputs)
    count = scores.shape[1]
    budget = BATCHED_GRADIENT_BYTES if max_bytes is None else max_bytes
    chunk = max(1, min(count, budget // max(per_column, 1)))
    for first in range(0, count, chunk):
        columns = range(first, min(count, first + chunk))
        keep = columns.stop < count
        if len(columns) == 1:  # one column: a plain backward, without autograd's vmap
            grads = torch.autograd.grad(
                scores[:, first].sum(), inputs=list(inputs), retain_graph=keep
            )
            yield columns, [grad[None] for grad in grads]
            continue
        # Row r of the batch of cotangents is one-hot at column first + r.
        one_hot = torch.eye(count, dtype=scores.dtype, device=scores.device)
        grad_outputs = one_hot[columns.start : columns.stop, None, :].expand(
            len(columns), *scores.shape
        )
        grads = torch.autograd.grad(
            scores,
            inputs=list(inputs),
            grad_outputs=grad_outputs,
            retain_graph=keep,
            is_grads_batched=True,
        )
        yield columns, list(grads)


def _as_leaf(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any], Tensor]:
    """A block's call with its hidden-state input (the first tensor argument) replaced by
    a detached leaf that requires grad; also returns that leaf."""
    if args:
        hidden = args[0].detach().requires_grad_(True)
        return (hidden, *args[1:]), kwargs, hidden
    key = next(k for k, v in kwargs.items() if isinstance(v, Tensor))
    hidden = kwargs[key].detach().requires_grad_(True)
    return args, {**kwargs, key: hidden}, hidden


class _Rotation:
    """The items a shared module serves, handed out in call order, round after round."""

    def __init__(self, items: list[Any]) -> None:
        self._items = items
        self._calls = 0

    def next(self) -> Any:
        item = self._items[self._calls % len(self._items)]
        self._calls += 1
        return item


def _occurrences(items: Iterable[Any], module_of: Callable[[Any], nn.Module]) -> list[Any]:
    """[(module, [its items in order])] in order of each module's first appearance."""
    grouped: dict[int, tuple[nn.Module, list[Any]]] = {}
    for item in items:
        module = module_of(item)
        grouped.setdefault(id(module), (module, []))[1].append(item)
    return list(grouped.values())
