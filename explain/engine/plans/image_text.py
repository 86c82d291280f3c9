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
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, ClassVar, Literal, cast

import torch
from torch import Tensor

from explain.architectures.base import Adapter, TokenLayout
from explain.architectures.hf_vision_language import ImageTokens, VisionLanguageModel
from explain.engine.passes import AttentionGradientPass, Columns, ColumnSink, ForwardPass
from explain.engine.plans.base import Plan, per_set, resolve_start_layer
from explain.engine.plans.generation import generated_tokens, read_out_at
from explain.engine.request import Request
from explain.engine.spread import ReadOut
from explain.errors import OptionError
from explain.rules import Method, RuleContext, Sink
from explain.targets import select_scores

__all__ = ["DEPTHS", "Depth", "ImageTextPlan", "ImageTextSink"]

Depth = Literal["lm", "tower"]
DEPTHS: tuple[Depth, ...] = ("lm", "tower")


class ImageTextSink:
    """One column's sink: the method's sink over the language model's blocks and, for
    depth "tower", the method's sink over the tower's blocks `tower_layers`, built once the
    language model's fold is known (its readout row comes from it).

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
        image_at: Tensor,
        tokens: ImageTokens,
        tower: Callable[[Tensor], Sink] | None,
        tower_layers: range,
    ) -> None:
        self._text = text
        self._offset = offset
        self._image_at = image_at  # (B, k * n)
        self._tokens = tokens
        self._build_tower = tower
        self._tower_layers = tower_layers
        self._tower: Sink | None = None
        self._waiting: list[tuple[int, Tensor, Tensor | None]] = []
        self._text_result: Tensor | None = None
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
        tower = ReadOut(0, self._tower_layers, self._tower_readout, self._start_tower)
        return [text, (range(self._offset), tower)]

    def _text_relevance(self) -> Tensor:
        if self._text_result is None:
            self._text_result = self._text.result()
        return self._text_result

    def _image_tokens(self, relevance: Tensor) -> Tensor:
        """(..., B, T) relevance over the text -> (..., B, k * tower images, tower tokens):
        the relevance at the image tokens of each image of the tower's batch, carried back
        through the projector's merge onto the tower's tokens."""
        at = self._image_at.expand(*relevance.shape[:-2], *self._image_at.shape)
        picked = relevance.gather(-1, at).unflatten(-1, (-1, self._tokens.per_image))
        return self._tokens.to_tower(picked)

    def _tower_readout(self, relevance: Tensor) -> Tensor:
        """(..., B, T) the language model's folded rows -> (..., the tower's batch, tower
        tokens): the tower's readout rows."""
        return self._image_tokens(relevance).flatten(-3, -2)

    def _start_tower(self, readout: Tensor) -> Sink:
        """The tower's sink, read out by `readout` (the tower's batch, tower tokens)."""
        assert self._build_tower is not None and self._tower is None
        self._tower = self._build_tower(readout)
        return self._tower

    def _tower_sink(self) -> Sink:
        if self._tower is None:
            self._start_tower(self._tower_readout(self._text_relevance()))
            assert self._tower is not None
            waiting, self._waiting = self._waiting, []
            for layer, attention, gradient in waiting:
                self._tower.add(layer, attention, gradient)
        return self._tower

    def result(self) -> dict[str, Tensor]:
        text = self._text_relevance()
        if self._build_tower is None:
            image = self._image_tokens(text)
        else:
            tower = self._tower_sink().result()
            image = tower.reshape(text.shape[0], -1, tower.shape[-1])
        # the tower's order made row-major, a photo's tiles put together on it
        image = self._tokens.to_photo(image)
        return {"image": image, "text": text.scatter(1, self._image_at, 0.0)}


class ImageTextPlan(Plan):
    """The next token (no `Request.prompt_length`), or every generated token of an answer
    (with it, as `GenerationPlan`), of a vision-language model; see the module doc.

    Options: `depth` ("lm" or "tower"). `start_layer`, one for both folds or one per set
    ({"text": s, "image": s}: the language model's, the tower's), as for dual encoders.
    """

    passes = frozenset({ForwardPass, AttentionGradientPass})
    refused_because = (
        "vision-language models are explained by the attention methods: the LRP walks "
        "have no rules for their projectors and towers, and AttnLRP and CP-LRP read "
        "Gradient x Input at an embedding module's output, while the image tokens enter "
        "the language model after it (the model's forward scatters them in)"
    )
    generates: ClassVar[bool] = True

    def __init__(
        self, adapter: Adapter, spec: Method | None, request: Request, tokenizer: Any
    ) -> None:
        self.vlm = cast(VisionLanguageModel, adapter)
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
        if spec is not None and depth == "tower" and spec.default_start_layer is None:
            raise OptionError(
                f"depth='tower' continues an aggregation over blocks through the tower's "
                f"blocks; method {spec.name!r} reads one fixed block (use generic or rollout, "
                "or depth='lm')"
            )
        if self.generation and request.target is not None:
            raise OptionError(
                "a generation explains the tokens it generated, so it takes no target; "
                "leave target unset (or explain a prefix with Explainer.explain)"
            )

    def prepare(self, inputs: Any) -> None:
        super().prepare(inputs)
        arguments = self.prepared.arguments
        self.per_image = self.vlm.image_tokens(arguments)
        self.image_at = self.vlm.image_positions(self.prepared)
        if not self.generation:
            return
        self.width, self.valid, self.positions = generated_tokens(
            arguments["attention_mask"], self.request.prompt_length
        )

    def forward(self) -> Tensor:
        if not self.generation:
            return self.adapter.forward(self.prepared)
        return self.vlm.logits_at(self.prepared, read_out_at(self.width, self.valid))

    def sink(self, column: int = 0) -> ColumnSink:
        assert self.spec is not None
        spec = self.spec
        image, text = self.sets
        readout, layout = text.readout, text.layout
        if self.generation:  # read out at the column's position, blind to what follows
            at = self.positions[column]
            assert layout.token_mask is not None
            seen = torch.arange(layout.token_mask.shape[1], device=at.device) <= at
            readout = self.vlm.readout_at(self.prepared, at.expand(self.prepared.batch_size))
            layout = replace(layout, token_mask=layout.token_mask & seen)
        starts = per_set(self.request.start_layer, ["image", "text"])
        options = dict(self.request.options)
        count = len(text.layers)
        text_sink = spec.sink(
            RuleContext(
                readout=readout,
                layout=layout,
                num_layers=count,
                start_layer=resolve_start_layer(spec, starts["text"], count, "text"),
            ),
            options,
        )
        tower, tower_layers = None, range(0)
        if self.depth == "tower":
            depth = len(image.layers)
            tower_layout = TokenLayout.image(
                self.per_image.grid,
                cast(tuple[int, int], image.layout.input_size),
                self.per_image.tower_prefix,
            )
            start = resolve_start_layer(spec, starts["image"], depth, "image")
            tower_layers = range(start, depth)  # the tower's layers are numbered from 0

            def tower(row: Tensor) -> Sink:
                context = RuleContext(row, tower_layout, depth, start)
                return spec.sink(context, options)

        return ImageTextSink(
            text_sink, text.layers.start, self.image_at, self.per_image, tower, tower_layers
        )

    def forward_sinks(self) -> list[ColumnSink]:
        if not self.generation:
            return [self.sink()]
        return [self.sink(column) for column in range(len(self.positions))]

    def columns(self, output: Tensor) -> Columns:
        if not self.generation:
            return super().columns(output)
        batch, count = self.valid.shape
        generated = self.prepared.arguments["input_ids"][:, self.width :]
        scores = select_scores(output.flatten(0, 1), generated.flatten(), self.score)
        scores = scores.reshape(batch, count) * self.valid  # nothing past an answer's end
        return Columns(scores, generated.masked_fill(~self.valid, -1), output)

    def finish(self, per_column: list[dict[str, Tensor]], columns: Columns) -> dict[str, Tensor]:
        if not self.generation:
            return super().finish(per_column, columns)
        result = {}
        for name in per_column[0]:
            stacked = torch.stack([c[name] for c in per_column], dim=1)
            keep = self.valid.reshape(*self.valid.shape, *(1,) * (stacked.dim() - 2))
            result[name] = stacked * keep.to(stacked.dtype)
        return result

    def settings(self) -> dict[str, Any]:
        return {"depth": self.depth}
