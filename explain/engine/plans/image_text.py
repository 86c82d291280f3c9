"""The plan of a vision-language model (`TokenSets.IMAGE_TEXT`): which part of the picture,
and which words of the prompt, made the model say its next token or each token of an
answer.

One forward runs the vision tower and the language model; the method's fold runs over the
language model's blocks, read out at the explained position, exactly as for a language
model (explain.engine.plans `GenerationPlan`, with the tokens after the position hidden
from its sink). Its relevance over the whole sequence then splits in two:

- "text": the prompt's tokens (B, T), the image tokens' positions 0;
- "image": the relevance at the image tokens, carried back through the projector's merge
  (`ImageTokens.sources`) onto the tower's tokens, and onto its patch grid (B, gh, gw) (a
  photo split into tiles: the tiles' grids put together on the photo, `ImageTokens.to_photo`).

Two depths (option `depth`, stated in `Explanation.settings`):

- "lm" (default): the image map is the language model's fold read at the image tokens;
- "tower": that relevance is the readout row of the same method's fold through the
  tower's own blocks, `v = r_tower @ prod_l (I + Abar_l)` for `generic` (the bi-modal
  step of Chefer et al., ICCV 2021: the image's self-attention relevance starts from the
  identity and is read out by what the text side found). The tower's blocks get their
  gradients in the same backward, after the language model's; where the method folds by
  spreads, every column's tower fold starts from its language-model fold's rows
  (explain.engine.spread `ReadOut`) and streams as that one does.

AttnLRP and CP-LRP (`EmbeddingGradientPass`) read Gradient x Input at the language
model's input embeddings, the image features among them, whose image tokens then go back
onto the photo as above; at depth "tower" the image's relevance is read instead at the
tower's patch embeddings, the gradient carried on under the same rules through the
projector and the tower's blocks (`embeddings`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Literal, cast

import torch
from torch import Tensor

from explain.architectures.base import Adapter, LanguageModel
from explain.engine.passes import (
    AttentionGradientPass,
    Columns,
    ColumnSink,
    EmbeddingGradientPass,
    ForwardPass,
    IntegratedGradientPass,
    OcclusionPass,
)
from explain.engine.plans.base import Plan, masked_columns, per_set, resolve_start_layer
from explain.engine.plans.generation import (
    column_rows,
    generated_scores,
    generated_tokens,
    read_out_at,
)
from explain.engine.request import Request
from explain.engine.spread import ReadOut
from explain.errors import OptionError
from explain.layout import ImagePrepared, ImageTokens, TokenLayout
from explain.lrp.attnlrp import AttnLrpSites, Embedding
from explain.rules import METHODS, Method, Need, RuleContext, Sink

__all__ = ["DEPTHS", "Depth", "ImageAt", "ImageTextPlan", "ImageTextSink", "reaches_tower"]

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


class ImageTextSink:
    """One column's sink: the method's sink over the language model's blocks and, for
    depth "tower", the method's sink over the tower's blocks `tower_layers`, built once the
    language model's fold is known (its readout row comes from it). Its `result()` is the
    folds' rows, (the language model's (B, T), the tower's or None), which the plan maps
    onto the photo and the text for every column at once (`ImageAt.split`).

    Layers arrive with their model-wide numbers: the tower's are 0..V-1, the language
    model's V.... With gradients the language model's blocks arrive first (they are
    nearer the score); forward-only methods see the tower first, whose blocks are kept
    until the language model's fold is done. Where the method folds by spreads, the fold
    of all columns at once (explain.engine.spread) takes both folds instead (`parts`).
    """

    def __init__(
        self,
        text: Sink,
        offset: int,
        image: ImageAt,
        tower: Callable[[Tensor], Sink] | None,
        tower_layers: range,
    ) -> None:
        self._text = text
        self._offset = offset
        self._image = image
        self._build_tower = tower
        self._tower_layers = tower_layers
        self._tower: Sink | None = None
        self._waiting: list[tuple[int, Tensor, Tensor | None]] = []
        self._text_result: Tensor | None = None
        self._tower_input: Tensor | None = None
        self._awaited = set(text.layers)  # the text's blocks its fold has yet to see
        text_layers = [offset + layer for layer in text.layers]
        self.layers: list[int] = ([*tower_layers] if tower is not None else []) + text_layers

    def add(self, layer: int, attention: Tensor, gradient: Tensor | None) -> None:
        if layer >= self._offset:
            self._text.add(layer - self._offset, attention, gradient)
            self._awaited.discard(layer - self._offset)
            return
        if self._build_tower is None:
            return
        if self._awaited:  # the tower's blocks came first: keep them until the text's fold
            self._waiting.append((layer, attention, gradient))
            return
        self._tower_sink().add(layer, attention, gradient)

    def parts(self) -> list[tuple[Sequence[int], Sink | ReadOut]]:
        """For the fold of all columns at once (explain.engine.spread, `ColumnSink`): the
        language model's sink over its blocks by their model-wide numbers and, with depth
        "tower", the tower's fold read out by its result at the image tokens (`ReadOut`),
        whose sink is made from that readout row (`_start_tower`)."""
        last = self._text.layers[-1] if len(self._text.layers) else -1
        text = (range(self._offset, self._offset + last + 1), self._text)
        if self._build_tower is None:
            return [text]
        tower = ReadOut(0, self._tower_layers, self._image.tower_rows, self._start_tower)
        return [text, (range(self._offset), tower)]

    def add_input(self, text: Tensor, tower: Tensor | None = None) -> None:
        """AttnLRP's and CP-LRP's relevance (`ImageTextPlan.embeddings`): at the language
        model's input embeddings (B, T) and, at depth "tower", at the tower's patch
        embeddings (the tower's batch, tower tokens; or its patches, for a tower that
        runs them packed), which is then the tower's result."""
        self._text.add_input(text)  # type: ignore[attr-defined]  # an InputSink (Need)
        if tower is not None:
            self._tower_input = tower.reshape(-1, self._image.tokens.tower_tokens)

    def _text_relevance(self) -> Tensor:
        if self._text_result is None:
            self._text_result = self._text.result()
        return self._text_result

    def _start_tower(self, readout: Tensor) -> Sink:
        """The tower's sink, read out by `readout` (the tower's batch, tower tokens)."""
        assert self._build_tower is not None and self._tower is None
        self._tower = self._build_tower(readout)
        return self._tower

    def _tower_sink(self) -> Sink:
        if self._tower is None:
            self._start_tower(self._image.tower_rows(self._text_relevance()))
            assert self._tower is not None
            waiting, self._waiting = self._waiting, []
            for layer, attention, gradient in waiting:
                self._tower.add(layer, attention, gradient)
        return self._tower

    def result(self) -> tuple[Tensor, Tensor | None]:
        """(the language model's folded rows (B, T), the tower's (the tower's batch, tower
        tokens) at depth "tower", else None)."""
        text = self._text_relevance()
        if self._build_tower is None:
            return text, None
        if self._tower_input is not None:
            return text, self._tower_input
        return text, self._tower_sink().result()


class ImageTextPlan(Plan):
    """The next token (no `Request.prompt_length`), or every generated token of an answer
    (with it, as `GenerationPlan`), of a vision-language model; see the module doc.

    Options: `depth` ("lm" or "tower"). `start_layer`, one for both folds or one per set
    ({"text": s, "image": s}: the language model's, the tower's), as for dual encoders.
    """

    passes = frozenset(
        {
            ForwardPass,
            AttentionGradientPass,
            EmbeddingGradientPass,
            IntegratedGradientPass,
            OcclusionPass,
        }
    )
    refused_because = (
        "vision-language models are explained by the attention methods and the methods "
        "at the embeddings (AttnLRP, CP-LRP and the baselines): the LRP walks have no rules "
        "for their projectors and towers"
    )
    generates: ClassVar[bool] = True

    def __init__(
        self, adapter: Adapter, spec: Method | None, request: Request, tokenizer: Any
    ) -> None:
        self.vlm = cast(LanguageModel, adapter)  # a vision-language model (TokenSets.IMAGE_TEXT)
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
                if spec.needs & {Need.PATH_GRADIENTS, Need.OCCLUSION}
                else "reads one fixed block"
            )
            takers = ", ".join(name for name, m in sorted(METHODS.items()) if reaches_tower(m))
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

    def forward(self) -> Tensor:
        if not self.generation:
            return self.adapter.forward(self.prepared)
        return self.vlm.logits_at(self.prepared, read_out_at(self.width, self.valid))

    def sink(self, column: int = 0) -> ColumnSink:
        return self._column_sinks(range(column, column + 1))[0]

    def column_sinks(self, count: int) -> list[ColumnSink]:
        return self._column_sinks(range(count))

    def forward_sinks(self) -> list[ColumnSink]:
        """One sink per generated token (each reads out at its own position), or the next
        token's."""
        return self._column_sinks(range(len(self.positions) if self.generation else 1))

    def _column_sinks(self, columns: range) -> list[ColumnSink]:
        """The sinks of `columns`: a generation's read out at each column's position, blind
        to what follows it, their readout rows and token masks made at once (a
        generation's cost must not grow with its tokens beyond its batched backward);
        every column of the next token reads out at the last token."""
        assert self.spec is not None
        spec = self.spec
        image, text = self.sets
        layout = text.layout
        if self.generation:
            assert layout.token_mask is not None
            at = self.positions[columns.start : columns.stop]
            rows = column_rows(self.vlm, self.prepared, at, layout.token_mask)
        else:
            rows = [(text.readout, layout.token_mask)] * len(columns)
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

            def tower(row: Tensor) -> Sink:
                context = RuleContext(row, tower_layout, depth, start)
                return spec.sink(context, options)

        return [
            ImageTextSink(
                spec.sink(
                    RuleContext(
                        readout=readout,
                        layout=replace(layout, token_mask=mask),
                        num_layers=count,
                        start_layer=text_start,
                    ),
                    options,
                ),
                text.layers.start,
                self.image,
                tower,
                tower_layers,
            )
            for readout, mask in rows
        ]

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

    def read(self, column: int, sink: ColumnSink) -> dict[str, Tensor]:
        return self.read_columns([sink])[0]

    def read_columns(self, sinks: Sequence[ColumnSink]) -> list[dict[str, Tensor]]:
        """Every column's folds stacked, mapped onto the photo and the text at once
        (`ImageAt.split`), then handed back column by column."""
        results = [cast(ImageTextSink, sink).result() for sink in sinks]
        text = torch.stack([text for text, _ in results])
        towers = [tower for _, tower in results]
        tower = None if towers[0] is None else torch.stack(cast(list[Tensor], towers))
        split = {name: value.unbind() for name, value in self.image.split(text, tower).items()}
        return [{name: split[name][k] for name in split} for k in range(len(sinks))]

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

    def finish(self, per_column: list[dict[str, Tensor]], columns: Columns) -> dict[str, Tensor]:
        if not self.generation:
            return super().finish(per_column, columns)
        return masked_columns(per_column, self.valid)

    def settings(self) -> dict[str, Any]:
        return {"depth": self.depth}
