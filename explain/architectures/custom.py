"""Your own transformer: a declarative spec of its blocks, attention and readout
(`TransformerSpec`), for a model `explain` has no adapter for. docs/custom-models.md
says what to name (`blocks`, `attention`, `readout`, and for images `patch_size` and
`prefix_tokens`), how the model is called and what it must return; a model whose
attention is fused (never materialises per-head probabilities) gets an error that says
how to write it explicitly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

import torch
from torch import Tensor, nn

from explain.architectures.base import Adapter, validate_image_batch
from explain.architectures.hf_common import last_real_token, mask_padding, text_layout
from explain.architectures.wrappers import unwrap
from explain.errors import ExplainError, InputError
from explain.layout import AttentionSite, FlagSetting, Prepared, TokenLayout

__all__ = ["CustomTransformer", "TransformerSpec"]

Readout = int | Literal["mean", "last"]

_POSITIONAL = "*"
"""The `Prepared.arguments` key of an input passed positionally, `model(x)`: never a
keyword argument name, so it cannot collide with the keys of a mapping."""

_FUSED_HELP = (
    "write the attention explicitly, probabilities = scores.softmax(dim=-1), pass them "
    "through an nn.Identity() (or nn.Dropout) module before multiplying with the values, "
    "and name that module as attention= (see docs/custom-models.md)"
)


@dataclass(frozen=True)
class TransformerSpec:
    """How to explain a transformer of your own: `Explainer(model, spec=TransformerSpec(...))`.

    Args:
        blocks: the attention blocks, in forward order: a dotted pattern in which `*` is
            any one name ("encoder.layers.*": every child of `model.encoder.layers`, in
            module order), the path of a container ("encoder.layers": its children), or
            a sequence of modules.
        attention: the dotted path, inside each block, of the module whose output is the
            block's post-softmax probabilities (B, H, N, N), e.g. "attn.attn_drop".
        readout: the token the head reads: an index (0: class token, -1: last token),
            "mean" (patch tokens of an image, real tokens of a text) or "last" (each
            text's last real token).
        patch_size: images only: the patch size, an int or (height, width).
        prefix_tokens: images only: class and register tokens before the patch tokens.
        probabilities: "output" (default) when the probabilities are the output of the
            `attention` module, "input" when they are its first positional input (a
            module that computes A @ V, like the einsum modules of Chefer et al.'s code).
    """

    blocks: str | Sequence[nn.Module]
    attention: str
    readout: Readout = 0
    patch_size: int | tuple[int, int] | None = None
    prefix_tokens: int = 0
    probabilities: Literal["output", "input"] = "output"

    def adapter(self, model: nn.Module) -> CustomTransformer:
        """The adapter that instruments `model` as this spec says (checked now)."""
        return CustomTransformer(model, self)


class CustomTransformer(Adapter):
    """The adapter of a model described by a `TransformerSpec`."""

    family = "your own transformer, described by explain.TransformerSpec (docs/custom-models.md)"

    def __init__(self, model: nn.Module, spec: TransformerSpec) -> None:
        model = unwrap(model)
        super().__init__(model)
        if isinstance(spec.readout, bool) or not (
            isinstance(spec.readout, int) or spec.readout in ("mean", "last")
        ):
            raise ExplainError(
                f"readout must be a token index, 'mean' or 'last'; got {spec.readout!r}"
            )
        if spec.probabilities not in ("output", "input"):
            raise ExplainError(
                f"probabilities must be 'output' or 'input', got {spec.probabilities!r}"
            )
        if isinstance(spec.prefix_tokens, bool) or not (
            isinstance(spec.prefix_tokens, int) and spec.prefix_tokens >= 0
        ):
            raise ExplainError(f"prefix_tokens must be an int >= 0, got {spec.prefix_tokens!r}")
        _check_patch_size(spec.patch_size)
        if isinstance(spec.blocks, nn.Module) or not isinstance(spec.blocks, str | Sequence):
            raise ExplainError(
                "blocks must be a dotted name or pattern (e.g. 'blocks', 'layers.*') or a list "
                f"of the model's block modules, got {spec.blocks!r:.80}"
            )
        if not isinstance(spec.attention, str) or not spec.attention:
            raise ExplainError(
                "attention must name the module inside each block that holds the attention "
                f"probabilities (e.g. 'attn.attn_drop'), got {spec.attention!r:.80}"
            )
        self.spec = spec
        self.reads_text = spec.patch_size is None  # a patch size says: an image model
        self._blocks = _resolve_blocks(model, spec.blocks)
        self._attention = [
            _attention_module(block, spec.attention, index)
            for index, block in enumerate(self._blocks)
        ]
        self._expected_tokens: int | None = None
        self._seen: set[int] = set()

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        return False  # only ever built from a spec

    @property
    def blocks(self) -> Sequence[nn.Module]:
        return self._blocks

    def attention_sites(self) -> Sequence[AttentionSite]:
        return [
            AttentionSite(
                layer=index,
                module=module,
                probabilities=partial(self._check, index),
                seen_in=self.spec.probabilities,
            )
            for index, module in enumerate(self._attention)
        ]

    def path_flags(self) -> Sequence[FlagSetting]:
        return []

    def _check(self, layer: int, seen: Any) -> Tensor:
        """The probabilities of block `layer` (from the module's output, or its positional
        inputs), checked to be what the spec promised."""
        where = f"attention={self.spec.attention!r} of block {layer}"
        if self.spec.probabilities == "input":
            where = f"the first input of {where}"
            output = seen[0] if seen else None
        else:
            output = seen
        if not isinstance(output, Tensor):
            raise ExplainError(
                f"{where} is a {type(output).__name__}, not the (B, H, N, N) "
                f"probabilities; {_FUSED_HELP}"
            )
        tokens = self._expected_tokens
        if output.dim() != 4 or output.shape[-1] != output.shape[-2]:
            raise ExplainError(
                f"{where} has shape {tuple(output.shape)}, not the (B, H, N, N) "
                f"probabilities of every head; {_FUSED_HELP}"
            )
        if tokens is not None and output.shape[-1] != tokens:
            raise ExplainError(
                f"{where} has {output.shape[-1]} tokens, but the input has {tokens} "
                f"({_count(self.spec.prefix_tokens, 'prefix token')} + patches); check "
                "prefix_tokens "
                "and patch_size"
            )
        sums = output.detach().sum(dim=-1)
        if not torch.allclose(sums, torch.ones_like(sums), atol=1e-3):
            raise ExplainError(
                f"{where} is not post-softmax (its rows do not sum to 1): name the module "
                "the probabilities pass through after the softmax, not the scores"
            )
        self._seen.add(layer)
        return output

    # -- inputs ---------------------------------------------------------------------------

    def prepare(self, inputs: object) -> Prepared:
        if isinstance(inputs, Tensor) and inputs.is_floating_point():
            return self._prepare_images(inputs)
        text = isinstance(inputs, Tensor) or (isinstance(inputs, Mapping) and "input_ids" in inputs)
        if text and self.spec.patch_size is not None:  # its forward would fail on token ids
            raise InputError(
                f"this model takes images (B, C, H, W): its TransformerSpec names a patch_size "
                f"({self.spec.patch_size}); got token ids. A model that reads text is "
                "described without patch_size"
            )
        if isinstance(inputs, Tensor):
            return self._prepare_text({"input_ids": inputs}, positional=True)
        if isinstance(inputs, Mapping) and "input_ids" in inputs:
            return self._prepare_text(inputs, positional=False)
        raise InputError(
            "a custom model takes images (B, C, H, W), token ids (B, T), or a mapping with "
            f"input_ids (and attention_mask); got {type(inputs).__name__}"
        )

    def _prepare_images(self, images: Tensor) -> Prepared:
        if self.spec.patch_size is None:
            raise InputError(
                "images need the patch size: TransformerSpec(..., patch_size=P, prefix_tokens=K)"
            )
        channels = images.shape[1] if images.dim() == 4 else 3
        images = validate_image_batch(images, channels, self.parameter)
        patch = self.spec.patch_size
        ph, pw = (patch, patch) if isinstance(patch, int) else patch
        height, width = images.shape[-2:]
        if height % ph or width % pw:
            raise InputError(
                f"image size {height}x{width} is not a multiple of the patch size {ph}x{pw}"
            )
        grid = (height // ph, width // pw)
        layout = TokenLayout.image(grid, (height, width), self.spec.prefix_tokens)
        return Prepared(batch_size=images.shape[0], layout=layout, arguments={_POSITIONAL: images})

    def _prepare_text(self, inputs: Mapping[str, Any], *, positional: bool) -> Prepared:
        ids = inputs["input_ids"]
        if not isinstance(ids, Tensor) or ids.dim() != 2 or ids.is_floating_point():
            raise InputError("input_ids must be a (B, T) integer tensor of token ids")
        if ids.shape[0] == 0 or ids.shape[1] == 0:
            raise InputError("the batch is empty: pass at least one text of one token")
        mask = inputs.get("attention_mask")
        mask = torch.ones_like(ids) if mask is None else torch.as_tensor(mask)
        if mask.shape != ids.shape or not ((mask == 0) | (mask == 1)).all():
            raise InputError("attention_mask must be (B, T) like input_ids, with 0 at padding")
        if not mask.bool().any(dim=1).all():
            raise InputError("a text of the batch has no real token in its attention_mask")
        device = self.parameter.device
        arguments = {
            key: value.to(device) if isinstance(value, Tensor) else value
            for key, value in inputs.items()
        }
        if positional:
            arguments = {_POSITIONAL: arguments["input_ids"]}
        layout = text_layout(mask.to(device))
        return Prepared(batch_size=ids.shape[0], layout=layout, arguments=arguments)

    # -- model ----------------------------------------------------------------------------

    def forward(self, prepared: Prepared) -> Tensor:
        self._expected_tokens = prepared.layout.num_tokens
        self._seen = set()
        arguments = prepared.arguments
        if _POSITIONAL in arguments:
            output = self.model(arguments[_POSITIONAL])
        else:
            output = self.model(**arguments)
        missing = sorted(set(range(len(self._blocks))) - self._seen)
        if missing:
            raise ExplainError(
                f"the attention module {self.spec.attention!r} of block {missing[0]} never "
                "ran in the forward pass, so its probabilities were never seen: the block "
                "computes attention with a fused kernel (F.scaled_dot_product_attention, "
                f"nn.MultiheadAttention) or skips that module; {_FUSED_HELP}"
            )
        scores = getattr(output, "logits", output)
        if isinstance(scores, tuple | list):
            scores = scores[0]
        if not isinstance(scores, Tensor) or scores.dim() != 2:
            raise ExplainError(
                "the model must return (B, C) scores (a tensor, .logits, or a tuple whose "
                f"first element is the scores); got {type(scores).__name__}"
                + (f" of shape {tuple(scores.shape)}" if isinstance(scores, Tensor) else "")
            )
        return scores

    def readout(self, prepared: Prepared) -> Tensor:
        layout = prepared.layout
        parameter = self.parameter
        batch, tokens = prepared.batch_size, layout.num_tokens
        row = torch.zeros(batch, tokens, device=parameter.device, dtype=parameter.dtype)
        readout = self.spec.readout
        if readout == "mean":
            keys = layout.key_mask(batch, parameter.device).to(row.dtype)
            return keys / keys.sum(dim=1, keepdim=True)
        if readout == "last":
            if layout.token_mask is None:
                row[:, -1] = 1.0
            else:
                row[torch.arange(batch), last_real_token(layout.token_mask)] = 1.0
            return row
        if not -tokens <= readout < tokens:
            raise InputError(f"readout token {readout} is outside the {tokens} tokens")
        row[:, readout] = 1.0
        return row

    def to_input_space(self, token_relevance: Tensor, layout: TokenLayout) -> Tensor:
        if layout.modality == "image":
            return layout.patch_grid(token_relevance)
        assert layout.token_mask is not None
        return mask_padding(token_relevance, layout.token_mask)


def _check_patch_size(patch_size: object) -> None:
    """None (a text model), a positive int, or a (height, width) pair of positive ints."""
    if patch_size is None:
        return
    pair = isinstance(patch_size, tuple | list)
    sizes = tuple(patch_size) if pair else (patch_size,)
    if len(sizes) != (2 if pair else 1) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in sizes
    ):
        raise ExplainError(
            f"patch_size must be a positive int or a (height, width) pair of them (None for "
            f"a text model), got {patch_size!r}"
        )


def _resolve_blocks(model: nn.Module, blocks: str | Sequence[nn.Module]) -> list[nn.Module]:
    if isinstance(blocks, str) and "*" in blocks:
        pattern = blocks.split(".")
        found = [
            module for name, module in model.named_modules() if _matches(name.split("."), pattern)
        ]
    elif isinstance(blocks, str):
        found = list(_submodule(model, blocks, "blocks").children())
    else:
        found = list(blocks)
        owned = {id(module) for module in model.modules()}
        if not all(isinstance(b, nn.Module) and id(b) in owned for b in found):
            raise ExplainError("blocks must be modules of the model, in forward order")
    if not found:
        children = ", ".join(name for name, _ in model.named_children()) or "none"
        raise ExplainError(
            f"blocks={blocks!r} names no block of the model (its children: {children})"
        )
    for index, block in enumerate(found):
        if isinstance(block, nn.TransformerEncoderLayer | nn.TransformerDecoderLayer):
            raise ExplainError(
                f"block {index} is a torch {type(block).__name__}, whose nn.MultiheadAttention "
                "runs with need_weights=False (a fused kernel) and never returns per-head "
                f"probabilities; write the block yourself: {_FUSED_HELP}"
            )
    return found


def _matches(name: list[str], pattern: list[str]) -> bool:
    """Whether a dotted module name matches a pattern segment by segment ("*": any one)."""
    if len(name) != len(pattern):
        return False
    return all(part in ("*", segment) for segment, part in zip(name, pattern, strict=True))


def _attention_module(block: nn.Module, path: str, index: int) -> nn.Module:
    module = _submodule(block, path, f"attention (in block {index})")
    if isinstance(module, nn.MultiheadAttention):
        raise ExplainError(
            f"attention={path!r} of block {index} is an nn.MultiheadAttention, which returns "
            "head-averaged weights, or none with need_weights=False; the methods need every "
            f"head's probabilities: {_FUSED_HELP}"
        )
    return module


def _submodule(root: nn.Module, path: str, what: str) -> nn.Module:
    try:
        return root.get_submodule(path) if path else root
    except AttributeError:
        children = ", ".join(name for name, _ in root.named_children()) or "none"
        raise ExplainError(
            f"{what}={path!r} is not a module path of {type(root).__name__} (its children: "
            f"{children})"
        ) from None


def _count(number: int, noun: str) -> str:
    """ "1 prefix token", "2 prefix tokens": a number with its noun in the right number."""
    return f"{number} {noun}" + ("" if number == 1 else "s")
