"""The plan of a vision-language model: which part of the picture, and which words of the
prompt, made the model say its next token or each token of an answer. The method's fold
runs over the language model's blocks, as for a language model (AttnLRP and CP-LRP read
the language model's input embeddings); its relevance splits into "text" (the prompt)
and "image" (at the image tokens, carried back onto the photo), at depth "lm" or
continued through the tower ("tower"). docs/multimodal.md ("Vision-language models")
says how.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Literal, cast

from torch import Tensor

from explain.architectures.base import ImageTextModel
from explain.engine.passes import Columns, Relevances, pass_for
from explain.engine.plans.base import Plan, masked_columns, per_set, resolve_start_layer
from explain.engine.plans.generation import (
    GenerationPlan,
    column_rows,
    generated_scores,
    generated_tokens,
    read_out_at,
)
from explain.engine.targets import Request
from explain.errors import OptionError
from explain.layout import ImagePrepared, ImageTokens, TokenLayout
from explain.lrp.attnlrp import AttnLrpSites, Embedding
from explain.rules.fold import ReadoutFold, RowSum, joined
from explain.rules.registry import METHODS, Fold, Method, Need, RuleContext, SpreadMode

__all__ = ["DEPTHS", "Depth", "ImageAt", "ImageTextFold", "ImageTextPlan", "reaches_tower"]

Depth = Literal["lm", "tower"]
DEPTHS: tuple[Depth, ...] = ("lm", "tower")


def reaches_tower(spec: Method) -> bool:
    """Whether `spec` continues through the tower at depth "tower": a method that
    aggregates over blocks (its fold read out by the language model's) or reads
    Gradient x Input at the embeddings (carried on to the tower's patch embeddings); a
    method that reads one fixed block does not, nor do integrated gradients and
    occlusion, which replace the language model's input embeddings in copies of the
    inputs (depth "lm")."""
    return spec.default_start_layer is not None or Need.EMBEDDING_GRADIENTS in spec.needs


@dataclass(frozen=True)
class ImageAt:
    """Where each text's image tokens lie (`at` (B, k * n)) and how they go back onto the
    tower's tokens and the photo (`tokens`): every mapping batched over leading
    dimensions, so that all columns of a call map at once."""

    at: Tensor
    tokens: ImageTokens

    def on_tower(self, relevance: Tensor) -> Tensor:
        """(..., B, T) relevance over the text -> (..., B, k * tower images, tower tokens):
        the relevance at the image tokens of each image of the tower's batch, carried back
        through the projector's merge onto the tower's tokens."""
        at = self.at.expand(*relevance.shape[:-2], *self.at.shape)
        picked = relevance.gather(-1, at).unflatten(-1, (-1, self.tokens.per_image))
        return self.tokens.to_tower(picked)

    def tower_rows(self, relevance: Tensor) -> Tensor:
        """(..., B, T) the language model's folded rows -> (..., the tower's batch, tower
        tokens): the tower's readout rows."""
        return self.on_tower(relevance).flatten(-3, -2)

    def split(self, text: Tensor, tower: Tensor | None) -> dict[str, Tensor]:
        """The language model's relevance (..., B, T) and, at depth "tower", the tower's
        (..., the tower's batch, tower tokens) -> "image" (..., B, k, tokens on the photo)
        and "text" (..., B, T), the image tokens' positions 0."""
        if tower is None:
            image = self.on_tower(text)
        else:
            image = tower.unflatten(-2, (text.shape[-2], -1))
        # the tower's order made row-major, a photo's tiles put together on it
        image = self.tokens.to_photo(image)
        at = self.at.expand(*text.shape[:-2], *self.at.shape)
        return {"image": image, "text": text.scatter(-1, at, 0.0)}


class ImageTextFold:
    """The call's fold: the method's fold over the language model's blocks and, for depth
    "tower", the method's fold over the tower's blocks `tower_layers`, made for each
    chunk of columns once the language model's fold of those columns is done (its
    readout rows come from it: `tower(rows)`). Its `result()` is the folds' rows (the
    language model's (C, B, T), the tower's or None), which the plan maps onto the photo
    and the text for every column at once (`ImageAt.split`).

    Layers arrive with their model-wide numbers: the tower's are 0..V-1, the language
    model's V.... With gradients the language model's blocks arrive first (they are
    nearer the score); forward-only methods see the tower first, whose blocks are kept
    (as the head mean where that is all its fold reads) until the language model's fold
    is done.
    """

    def __init__(
        self,
        text: Fold,
        offset: int,
        image: ImageAt,
        tower: Callable[[Tensor], Fold] | None,
        tower_layers: range,
    ) -> None:
        self._text = text
        self._offset = offset
        self._image = image
        self._build_tower = tower
        self._towers: dict[int, Fold] = {}  # first column of a chunk -> its tower's fold
        self._tower_inputs: dict[int, Tensor] = {}  # ... -> AttnLRP's at the tower
        self._waiting: list[tuple[int, slice, Tensor, Tensor | None]] = []
        text_layers = [offset + layer for layer in text.layers]
        self.layers: list[int] = ([*tower_layers] if tower is not None else []) + text_layers

    @property
    def spread(self) -> SpreadMode | None:
        """The language model's fold's: the tower's is the same method's, over an image."""
        return self._text.spread

    def add(self, layer: int, columns: slice, attention: Tensor, gradients: Tensor | None) -> None:
        if layer >= self._offset:
            self._text.add(layer - self._offset, columns, attention, gradients)
            return
        if self._build_tower is None:
            return
        tower = self._tower(columns)
        if tower is not None:
            tower.add(layer, slice(None), attention, gradients)
            return
        if self._text.spread is SpreadMode.ATTENTION:  # its fold reads the head mean only
            attention = attention.mean(dim=1, keepdim=True)
        self._waiting.append((layer, columns, attention, gradients))

    def fold(
        self, layer: int, columns: slice, spread: Callable[[Tensor], Tensor], rowsum: RowSum
    ) -> None:
        if layer >= self._offset:
            self._text.fold(layer - self._offset, columns, spread, rowsum)
            return
        tower = self._tower(columns)
        if tower is None:
            raise RuntimeError("a tower block arrived before the language model's fold ended")
        tower.fold(layer, slice(None), spread, rowsum)

    def add_input(self, columns: slice, text: Tensor, tower: Tensor | None = None) -> None:
        """The relevance at the embeddings (`ImageTextPlan.embeddings`: Gradient x Input,
        plain or AttnLRP's and CP-LRP's; integrated gradients' and occlusion's at depth
        "lm") for `columns`: at the language model's input embeddings (c, B, T) and, at
        depth "tower", at the tower's patch embeddings (c, the tower's batch, tower tokens;
        or its patches, for a tower that runs them packed), which is then the tower's
        result."""
        self._text.add_input(columns, text)
        if tower is not None:
            tokens = self._image.tokens.tower_tokens
            self._tower_inputs[columns.start or 0] = tower.reshape(len(tower), -1, tokens)

    def _tower(self, columns: slice) -> Fold | None:
        """The tower's fold of `columns`, made from the language model's rows at the image
        tokens once its fold of them is done; None before."""
        start = columns.start or 0
        if start not in self._towers:
            text = cast(ReadoutFold, self._text)  # depth "tower" takes folds over blocks
            if text.expects(columns) is not None:
                return None
            rows = self._image.tower_rows(text.rows(columns))
            self._towers[start] = cast(Callable[[Tensor], Fold], self._build_tower)(rows)
        return self._towers[start]

    def result(self) -> tuple[Tensor, Tensor | None]:
        """(the language model's folded rows (C, B, T), the tower's (C, the tower's batch,
        tower tokens) at depth "tower", else None)."""
        text = self._text.result()
        if self._build_tower is None:
            return text, None
        if self._tower_inputs:
            return text, joined(self._tower_inputs)
        waiting, self._waiting = self._waiting, []
        for layer, columns, attention, gradients in waiting:
            self.add(layer, columns, attention, gradients)
        return text, joined({start: fold.result() for start, fold in self._towers.items()})


class ImageTextPlan(Plan):
    """The next token (no `Request.prompt_length`), or every generated token of an answer
    (with it, as `GenerationPlan`), of a vision-language model; see the module doc.

    Options: `depth` ("lm" or "tower"). `start_layer`, one for both folds or one per set
    ({"text": s, "image": s}: the language model's, the tower's), as for dual encoders.
    """

    serves = ImageTextModel
    passes = GenerationPlan.passes  # its language model's, the answers' as a generation's
    refused_because = (
        "vision-language models are explained by the attention methods and the methods "
        "at the embeddings (AttnLRP, CP-LRP and the baselines): the LRP walks have no rules "
        "for their projectors and towers"
    )
    generates: ClassVar[bool] = True
    adapter: ImageTextModel

    def __init__(
        self, adapter: ImageTextModel, spec: Method | None, request: Request, tokenizer: Any
    ) -> None:
        options = dict(request.options)
        depth = options.pop("depth", "lm")
        if depth not in DEPTHS:
            raise OptionError(f"depth must be one of {', '.join(DEPTHS)}; got {depth!r}")
        self.depth: Depth = depth
        self.generation = request.prompt_length is not None
        if spec is None and self.generation:
            raise OptionError(
                "trace() follows one score per input; a generation has one per generated "
                "token: trace a prefix of it with its next token as the target"
            )
        super().__init__(adapter, spec, replace(request, options=options), tokenizer)
        if spec is not None and depth == "tower" and not reaches_tower(spec):
            why = (
                "replaces the language model's input embeddings in copies of the inputs, "
                "where the image tokens already stand for the tower's output"
                if Need.EMBEDDING_COPIES in spec.needs
                else "reads one fixed block"
            )
            takers = ", ".join(
                name
                for name, m in sorted(METHODS.items())
                if reaches_tower(m) and pass_for(m) in self.passes
            )
            raise OptionError(
                f"depth='tower' continues an aggregation over blocks, or a gradient, through "
                f"the tower's blocks; method {spec.name!r} {why} (use {takers}, or "
                "depth='lm')"
            )
        if self.generation and request.target is not None:
            raise OptionError(
                "a generation explains the tokens it generated, so it takes no target; "
                "leave target unset (or explain a prefix with Explainer.explain)"
            )

    def prepare(self, inputs: Any) -> None:
        super().prepare(inputs)
        prepared = self.prepared
        assert isinstance(prepared, ImagePrepared)
        self.image = ImageAt(prepared.image_at, prepared.tokens)
        if not self.generation:
            return
        self.width, self.valid, self.positions = generated_tokens(
            prepared.arguments["attention_mask"], self.request.prompt_length
        )
        self.known_columns = self.valid.shape[1]

    def forward(self) -> Tensor:
        if not self.generation:
            return self.adapter.forward(self.prepared)
        return self.adapter.logits_at(self.prepared, read_out_at(self.width, self.valid))

    def call_fold(self) -> Fold:
        """The method's folds for every column: a generation's read out at each column's
        position, blind to what follows it, their readout rows and token masks made at
        once (`column_rows`); every column of the next token reads out at the last
        token."""
        assert self.spec is not None
        spec = self.spec
        image, text = self.sets
        layout = text.layout
        if self.generation:
            assert layout.token_mask is not None
            readouts, mask = column_rows(
                self.adapter, self.prepared, self.positions, layout.token_mask
            )
        else:
            readouts, mask = text.readout[None], layout.token_mask
        starts = per_set(self.request.start_layer, ["image", "text"])
        options = dict(self.request.options)
        count = len(text.layers)
        text_start = resolve_start_layer(spec, starts["text"], count, "text")
        tower, tower_layers = None, range(0)
        if self.depth == "tower":
            depth = len(image.layers)
            tower_layout = TokenLayout.image(
                self.image.tokens.grid,
                cast(tuple[int, int], image.layout.input_size),
                self.image.tokens.tower_prefix,
            )
            start = resolve_start_layer(spec, starts["image"], depth, "image")
            tower_layers = range(start, depth)  # the tower's layers are numbered from 0

            def tower(rows: Tensor) -> Fold:
                return spec.fold(RuleContext(rows, tower_layout, depth, start), options)

        context = RuleContext(readouts, replace(layout, token_mask=mask), count, text_start)
        text_fold = spec.fold(context, options)
        return ImageTextFold(text_fold, text.layers.start, self.image, tower, tower_layers)

    def embeddings(self, sites: AttnLrpSites) -> list[tuple[Embedding, TokenLayout]]:
        """AttnLRP and CP-LRP read the language model's input embeddings (over the text's
        tokens, the image tokens among them) and, at depth "tower", the tower's patch
        embeddings beneath them (over the tower's tokens, its prefix tokens 0)."""
        _, text = self.sets
        reads = [(sites.read, text.layout)]
        if self.depth == "tower":
            assert sites.tower is not None  # a vision-language model's sites have it
            tokens = self.image.tokens
            layout = TokenLayout.image(tokens.grid, tokens.input_size, tokens.tower_prefix)
            reads.append((sites.tower, layout))
        return reads

    def read(self, fold: Fold) -> Relevances:
        """Every column's folds, mapped onto the photo and the text at once
        (`ImageAt.split`)."""
        text, tower = fold.result()
        split = self.image.split(text, tower).items()
        return {name: relevance.transpose(0, 1) for name, relevance in split}

    def columns(self, output: Tensor) -> Columns:
        if not self.generation:
            return super().columns(output)
        generated = self.prepared.arguments["input_ids"][:, self.width :]
        scores = generated_scores(output, generated, self.valid, self.score)
        return Columns(scores, generated.masked_fill(~self.valid, -1), output)

    def copy_columns(self, output: Tensor, columns: Columns, copies: int) -> Tensor:
        if not self.generation:
            return super().copy_columns(output, columns, copies)
        generated = self.prepared.arguments["input_ids"][:, self.width :]
        return generated_scores(
            output, generated.repeat(copies, 1), self.valid.repeat(copies, 1), self.score
        )

    def finish(self, relevances: Relevances, columns: Columns) -> dict[str, Tensor]:
        if not self.generation:
            return super().finish(relevances, columns)
        return masked_columns(relevances, self.valid)

    def settings(self) -> dict[str, Any]:
        return {"depth": self.depth}
