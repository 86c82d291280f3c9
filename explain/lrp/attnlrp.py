"""AttnLRP and CP-LRP in their Gradient x Input form: rule modifiers as forward hooks.

Both methods (Achtibat et al., ICML 2024; Ali et al., ICML 2022) equal Gradient x Input
once the backward of a few operations is modified (LXT 2.1's "efficient" form): the
identity rule through normalisations and element-wise activations, the uniform rule for
the products of two activations (q k^T, A v, gated MLPs), and for CP-LRP no gradient
through the softmax's query-key path nor through a gate. Every modifier keeps the
forward values bit for bit; nothing is patched: the hooks live on the model's own
modules for one call (`attnlrp_hooks`), where the family's `AttnLrpSites` say. The
relevance is read at the embedding output, or at an input of a module where no module
outputs the embeddings whole (a vision-language model's language model), and may be read
at several embeddings of one call, each on the way to the next (`AttnLrpCall`).
docs/methods.md derives it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

import torch
from torch import Tensor, nn

from explain.errors import ExplainError, UnsupportedModelError
from explain.layout import InputHook, ModuleHook, TokenLayout
from explain.lrp.weights import used_weight

__all__ = [
    "VARIANTS",
    "AttnLrpCall",
    "AttnLrpSites",
    "Embedding",
    "Gate",
    "Projection",
    "Variant",
    "attnlrp_hooks",
    "embedding_relevance",
    "hidden_sum",
    "on_layout",
]

Variant = Literal["attnlrp", "cp_lrp"]
VARIANTS: tuple[str, ...] = ("attnlrp", "cp_lrp")

_ACTIVATION_PACKAGES = ("transformers.activations", "timm.layers.activations")
_ELEMENTWISE = (
    nn.GELU,
    nn.SiLU,
    nn.Tanh,
    nn.ReLU,
    nn.Sigmoid,
    nn.Mish,
    nn.ELU,
    nn.LeakyReLU,
    nn.Softplus,
    nn.Hardswish,
    nn.Hardsigmoid,
)
_NOT_ELEMENTWISE = ("Softmax", "GLU", "Identity", "ClassInstantier", "LinearActivation")


@dataclass(frozen=True)
class Projection:
    """Output channels `part` (all when None) of a module that computes one factor of a
    product: a query, key or value projection, or a gated MLP's up projection."""

    module: nn.Module
    part: slice | None = None


@dataclass(frozen=True)
class Gate:
    """A gated unit act(gate(x)) * up(x): `activation` computes the gate, `other` the
    factor it multiplies."""

    activation: nn.Module
    other: Projection


@dataclass(frozen=True)
class Embedding:
    """Where relevance is read: the output of `module`, or, with `argument`, the tensor
    its call takes as that keyword argument (read before it runs). `axis` holds the
    hidden size (1 for a patch convolution's (B, D, gh, gw) output)."""

    module: nn.Module
    axis: int = -1
    argument: str | None = None


@dataclass(frozen=True)
class AttnLrpSites:
    """Where a model family's rules attach (the family wiring's answer).

    Normalisations and element-wise activation modules are found by type over the whole
    model; what cannot be found by type is named here.
    """

    embedding: nn.Module
    """Its output is the input whose relevance is read (word or patch embeddings)."""
    queries_keys: Sequence[Projection]
    """Modules whose outputs reach the attention scores only (after RoPE, qk-norm)."""
    values: Sequence[Projection] = ()
    """Modules whose outputs are the values only; or, where the family names
    `attention_outputs` instead:"""
    attention_outputs: Sequence[Projection] = ()
    """Modules whose output is the attention output A V (heads merged): the uniform rule
    for A V applies there, to A and v at once, and `queries_keys` then only take the
    q k^T half."""
    gates: Sequence[Gate] = ()
    embedding_axis: int = -1
    """The axis of the embedding output that holds the hidden size (1 for a patch
    convolution's (B, D, gh, gw) output)."""
    tanh_inputs: Sequence[nn.Module] = ()
    """Modules whose output goes through a functional tanh (not a module), such as
    RoBERTa's classification head: the identity rule is applied through a correction of
    the gradient at their output."""
    embedding_argument: str | None = None
    """The keyword argument of `embedding`'s call that holds the embeddings, where no
    module outputs them whole (a vision-language model's language model, whose
    `inputs_embeds` hold the image features scattered in among the word embeddings);
    None: `embedding`'s output."""
    unit_offset_norms: Sequence[nn.Module] = ()
    """RMSNorms that scale by (1 + weight) in float32 (Gemma's), not by their weight."""
    tower: Embedding | None = None
    """A vision-language model's tower's patch embeddings, beneath `embedding`: the
    image's relevance read there, carried on through the projector and the tower's
    blocks (depth "tower")."""

    @property
    def read(self) -> Embedding:
        """Where the relevance is read by default: `embedding`."""
        return Embedding(self.embedding, self.embedding_axis, self.embedding_argument)


class AttnLrpCall:
    """The rules' state for one call: the embeddings whose relevance is read (`reads`,
    the first nearest the score), their tensors in the forward pass, and the projections
    whose hooks have run.

    Every embedding but the last lies on the way from the score to the next one (a
    vision-language model's language-model input on the way to its tower's patch
    embeddings): it is read where it is, in the graph. The last becomes the graph's
    leaf: its tensor detached from what computed it, requiring grad."""

    def __init__(self, reads: Sequence[Embedding]) -> None:
        self.reads = tuple(reads)
        self._tensors: list[list[Tensor]] = [[] for _ in self.reads]
        self.expected: dict[int, str] = {}
        self.seen: set[int] = set()

    def hooks(self) -> list[tuple[nn.Module, ModuleHook | InputHook]]:
        """The hook that reads each embedding: a forward hook on the module that outputs
        it, or an input hook on the module whose call takes it."""
        hooks: list[tuple[nn.Module, ModuleHook | InputHook]] = []
        for index, read in enumerate(self.reads):
            if read.argument is None:
                hooks.append((read.module, partial(self._output_hook, index)))
            else:
                hooks.append((read.module, InputHook(partial(self._input_hook, index))))
        return hooks

    def _output_hook(
        self, index: int, module: nn.Module, args: Any, kwargs: Any, output: Tensor
    ) -> Tensor:
        return self._keep(index, output)

    def _input_hook(
        self, index: int, module: nn.Module, args: Any, kwargs: dict[str, Any]
    ) -> tuple[Any, dict[str, Any]]:
        name = self.reads[index].argument
        tensor = kwargs.get(name)
        if not isinstance(tensor, Tensor):
            raise ExplainError(
                f"{type(module).__name__} was called without {name}, where the relevance "
                "of AttnLRP/CP-LRP is read"
            )
        return args, {**kwargs, name: self._keep(index, tensor)}

    def _keep(self, index: int, tensor: Tensor) -> Tensor:
        if self._tensors[index]:
            raise ExplainError(
                f"{type(self.reads[index].module).__name__} ran twice in one forward pass; "
                "AttnLRP/CP-LRP read the relevance at its single embeddings"
            )
        if index == len(self.reads) - 1:
            tensor = tensor.detach().requires_grad_(True)
        elif not tensor.requires_grad:  # the deeper embeddings did not reach it
            raise ExplainError(
                f"the embeddings at {type(self.reads[index].module).__name__} do not depend "
                f"on those at {type(self.reads[index + 1].module).__name__} in this forward "
                "pass, so the relevance cannot be carried on to them"
            )
        self._tensors[index].append(tensor)
        return tensor

    @property
    def tensors(self) -> list[Tensor]:
        """The embeddings read (one tensor per read), once the forward pass has run and
        every rule has attached."""
        for read, tensors in zip(self.reads, self._tensors, strict=True):
            if not tensors:
                raise ExplainError(
                    f"{type(read.module).__name__}, where the relevance is read, did not run "
                    "in the forward pass"
                )
        missing = sorted({name for key, name in self.expected.items() if key not in self.seen})
        if missing:
            raise UnsupportedModelError(
                f"attnlrp/cp_lrp cannot attach to this model: {', '.join(missing)} never ran "
                "as a module (its weights are used directly), so its gradient cannot be "
                "ruled; use 'generic' for this model"
            )
        return [tensors[0] for tensors in self._tensors]

    def relevance(self, gradient: Tensor, layout: TokenLayout, read: int = 0) -> Tensor:
        """(B, N) relevance over the layout's tokens of read `read`: embedding x gradient
        summed over the hidden size; (C, B, N) from the gradients of C score columns at
        once (C, B, ...) (`embedding_relevance`)."""
        return embedding_relevance(self.tensors[read], gradient, self.reads[read].axis, layout)


def embedding_relevance(inputs: Tensor, gradient: Tensor, axis: int, layout: TokenLayout) -> Tensor:
    """(B, N) relevance over `layout`'s tokens: `inputs` (B, ...) (embeddings, or their
    difference from a baseline's) times `gradient` (B, ...), summed over the hidden size
    at `axis` of `inputs` (`hidden_sum`); (C, B, N) from the gradients of C score columns
    at once (C, B, ...). In float32 at least."""
    dtype = inputs.dtype if inputs.dtype == torch.float64 else torch.float32
    return hidden_sum(inputs.to(dtype) * gradient.to(dtype), inputs.dim(), axis, layout)


def hidden_sum(values: Tensor, dims: int, axis: int, layout: TokenLayout) -> Tensor:
    """Values at embeddings of `dims` dimensions (B, ...), (B, ...) or (C, B, ...),
    summed over the hidden size at `axis` of the embeddings: (B, N) or (C, B, N) over
    `layout`'s tokens. Image embeddings hold the patches only: the prefix tokens, which
    do not come from the image, get 0 (`on_layout`). Packed embeddings (N, D), a tower's
    patches of every image one after the other, give (N,) (the plan regroups them)."""
    columns = values.dim() - dims  # 0, or 1 for a column axis
    axis = axis if axis < 0 else axis + columns
    relevance = values.sum(dim=axis)
    if relevance.dim() > columns + 1:  # not packed: (B, tokens) from (B, ..., D)
        relevance = relevance.flatten(columns + 1)
    return on_layout(relevance, layout)


def on_layout(relevance: Tensor, layout: TokenLayout) -> Tensor:
    """(..., P) relevance of the embedded tokens (a text's positions, an image's patches)
    -> (..., N) over `layout`'s tokens, the prefix tokens (class, register tokens) 0."""
    if not layout.num_prefix_tokens:
        return relevance
    prefix = relevance.new_zeros(*relevance.shape[:-1], layout.num_prefix_tokens)
    return torch.cat([prefix, relevance], dim=-1)


def attnlrp_hooks(
    model: nn.Module, sites: AttnLrpSites, variant: Variant, call: AttnLrpCall
) -> list[tuple[nn.Module, ModuleHook | InputHook]]:
    """(module, hook) pairs that apply `variant`'s rules to `model` for one call, whose
    state `call` keeps (the embeddings it reads among them).

    The embeddings' hooks come first; a module with two roles (an activation that gates,
    a projection whose output is also corrected) gets one hook per role.
    """
    if variant not in VARIANTS:
        raise ExplainError(f"unknown rule set {variant!r}; known: {', '.join(VARIANTS)}")
    attnlrp = variant == "attnlrp"
    factors = _Factors(call)
    # AttnLRP halves the gradient after q k^T and after A v: q and k get 1/4 where v is
    # ruled on its own, 1/2 where the A v output is; CP-LRP holds q and k constant.
    query_key = (0.5 if sites.attention_outputs else 0.25) if attnlrp else 0.0
    for projection in sites.queries_keys:
        factors.add(projection, query_key)
    for projection in (*sites.values, *sites.attention_outputs):
        factors.add(projection, 0.5 if attnlrp else 1.0)
    gated: dict[int, float | None] = {}
    for gate in sites.gates:
        # AttnLRP: identity rule on the activation, then half to each factor.
        # CP-LRP: the gate is a constant, the other factor keeps its full gradient.
        gated[id(gate.activation)] = 0.5 if attnlrp else None
        factors.add(gate.other, 0.5 if attnlrp else 1.0)

    hooks: list[tuple[nn.Module, ModuleHook | InputHook]] = call.hooks()
    tanh_inputs = {id(module) for module in sites.tanh_inputs}
    unit_offset = {id(module) for module in sites.unit_offset_norms}
    for module in model.modules():
        key = id(module)
        if module is sites.embedding:
            continue
        if key in gated:
            hooks.append((module, _gate_hook(gated[key])))
        elif _is_layer_norm(module):
            hooks.append((module, _layer_norm_hook))
        elif _is_rms_norm(module):
            hooks.append((module, _rms_norm_hook(key in unit_offset)))
        elif _is_elementwise(module):
            hooks.append((module, _gate_hook(1.0)))
        if key in factors:
            hooks.append((module, factors.hook(module)))
        if key in tanh_inputs:
            hooks.append((module, _tanh_identity_hook))
    return hooks


# -- which modules ------------------------------------------------------------------------


def _is_layer_norm(module: nn.Module) -> bool:
    return isinstance(module, nn.LayerNorm)


def _is_rms_norm(module: nn.Module) -> bool:
    return isinstance(module, nn.RMSNorm) or type(module).__name__.endswith("RMSNorm")


def _is_elementwise(module: nn.Module) -> bool:
    """An element-wise activation module: torch's, transformers' or timm's."""
    if isinstance(module, _ELEMENTWISE):
        return True
    cls = type(module)
    return cls.__module__.startswith(_ACTIVATION_PACKAGES) and not any(
        name in cls.__name__ for name in _NOT_ELEMENTWISE
    )


def _first_tensor(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor:
    if args and isinstance(args[0], Tensor):
        return args[0]
    return next(value for value in kwargs.values() if isinstance(value, Tensor))


# -- the rules ----------------------------------------------------------------------------


class _RuledGradient(torch.autograd.Function):
    """`value` in the forward pass; in the backward pass `rule(grad)` is the gradient that
    flows to `source`, for the gradient `grad` of the output.

    One node instead of a zero-valued surrogate term (`value + (s - s.detach())`) keeps the
    rules to a few element-wise operations: what they cost on top of a plain gradient is
    what separates these methods from the floor (docs/benchmarks.md)."""

    @staticmethod
    def forward(ctx: Any, source: Tensor, value: Tensor, rule: Callable[[Tensor], Tensor]):
        ctx.rule = rule
        return value.view_as(value)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        return ctx.rule(grad), None, None


def _ruled(source: Tensor, value: Tensor, rule: Callable[[Tensor], Tensor]) -> Tensor:
    """`value` exactly, with `rule` as the gradient path to `source` (nothing to rule when
    `source` needs no gradient)."""
    if not source.requires_grad:
        return value.detach()
    # Detached, so that the module's own backward (and what it saved) leaves the graph.
    return _RuledGradient.apply(source, value.detach(), rule)


def _layer_norm_hook(module: nn.Module, args: Any, kwargs: Any, output: Tensor) -> Tensor:
    """Identity rule: y = (x - mean(x)) * weight / std with the std a constant, so the
    gradient of x is g' - mean(g') for g' = grad * weight / std (the mean over the
    normalised dimensions)."""
    x = _first_tensor(args, kwargs)
    dims = tuple(range(-len(module.normalized_shape), 0))
    with torch.no_grad():
        # 1 / std as the layer norm kernel computes it (a quarter of the cost of x.var).
        _, _, scale = torch.native_layer_norm(
            x, list(module.normalized_shape), None, None, module.eps
        )
        weight = used_weight(module)  # where accelerate offloads it, not module.weight
        if weight is not None:
            scale = weight * scale

    dtype = x.dtype  # not x itself: the rule must not keep the input alive

    def rule(grad: Tensor) -> Tensor:
        scaled = grad * scale
        return (scaled - scaled.mean(dim=dims, keepdim=True)).to(dtype)

    return _ruled(x, output, rule)


def _rms_norm_hook(unit_offset: bool) -> ModuleHook:
    """Identity rule: y = x * weight / rms(x) with the rms a constant (computed in float32,
    as the models do), so the gradient of x is grad * weight / rms, the weight applied as
    the model applies it: in its own dtype, or, for a `unit_offset` norm (Gemma's), as
    (1 + weight) in float32."""

    def hook(module: nn.Module, args: Any, kwargs: Any, output: Tensor) -> Tensor:
        x = _first_tensor(args, kwargs)
        eps = getattr(module, "variance_epsilon", None)
        if eps is None:
            eps = module.eps if module.eps is not None else torch.finfo(x.dtype).eps
        with torch.no_grad():
            scale = torch.rsqrt(x.float().pow(2).mean(dim=-1, keepdim=True) + eps)
            weight = used_weight(module)  # where accelerate offloads it, not module.weight
            if weight is not None and unit_offset:
                scale = scale * (1.0 + weight.float())
            elif weight is not None:
                scale = scale.to(weight.dtype) * weight
            scale = scale.to(output.dtype)
        dtype = x.dtype  # not x itself: the rule must not keep the input alive
        return _ruled(x, output, lambda grad: (grad * scale).to(dtype))

    return hook


def _gate_hook(factor: float | None) -> ModuleHook:
    """Identity rule on an element-wise y = f(x): the gradient of x is `factor` * y / x
    times that of y (LXT's epsilon 1e-10 in the denominator); None: y is a constant."""

    def hook(module: nn.Module, args: Any, kwargs: Any, output: Tensor) -> Tensor:
        if factor is None:
            return output.detach()
        x = _first_tensor(args, kwargs)
        with torch.no_grad():
            ratio = output / (x + 1e-10)
            if factor != 1.0:
                ratio = ratio * factor
        return _ruled(x, output, lambda grad: grad * ratio)

    return hook


def _tanh_identity_hook(module: nn.Module, args: Any, kwargs: Any, output: Tensor) -> None:
    """The output z goes through a functional tanh next: scale its gradient by
    (tanh(z) / z) / tanh'(z), which turns tanh's own gradient into the identity rule's."""
    with torch.no_grad():
        tanh = torch.tanh(output)
        correction = (tanh / (output + 1e-10)) / (1 - tanh * tanh)
    if output.requires_grad:
        output.register_hook(lambda grad: grad * correction)


class _Factors:
    """Gradient factors per module output channel, from the projections' parts."""

    def __init__(self, call: AttnLrpCall) -> None:
        self._parts: dict[int, tuple[nn.Module, list[tuple[slice | None, float]]]] = {}
        self._call = call

    def add(self, projection: Projection, factor: float) -> None:
        entry = self._parts.setdefault(id(projection.module), (projection.module, []))
        entry[1].append((projection.part, factor))
        self._call.expected[id(projection.module)] = type(projection.module).__name__

    def __contains__(self, key: int) -> bool:
        return key in self._parts

    def hook(self, module: nn.Module) -> ModuleHook:
        parts = self._parts[id(module)][1]
        seen = self._call.seen

        def scale(module: nn.Module, args: Any, kwargs: Any, output: Tensor) -> Tensor | None:
            seen.add(id(module))
            if len(parts) == 1 and parts[0][0] is None:  # one factor for the whole output
                factor = parts[0][1]
                if factor == 0.0:
                    return output.detach()
                if factor != 1.0 and output.requires_grad:
                    output.register_hook(lambda grad: grad * factor)
                return None
            factors = output.new_ones(output.shape[-1])
            for part, factor in parts:
                factors[part if part is not None else slice(None)] = factor
            if output.requires_grad:
                output.register_hook(lambda grad: grad * factors)
            return None

        return scale
