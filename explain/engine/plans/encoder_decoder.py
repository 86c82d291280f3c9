"""The plan of an encoder-decoder: source and target relevance of the token predicted at
a decoder position.

Column p is the token predicted at decoder position p (option `position`); the call's
fold is the two-set fold of explain.rules.coattention over every block, for all positions at
once, from one forward and one backward batched over the positions; the targets are
chosen and checked once for all positions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal, Union

import torch
from torch import Tensor

from explain.architectures.base import EncoderDecoder
from explain.engine.passes import AttentionGradientPass, Columns, Relevances
from explain.engine.plans.base import Plan, custom_scores, masked_columns
from explain.engine.targets import Request, Target, resolve_targets, select_scores
from explain.errors import InputError, OptionError, TargetError
from explain.rules.coattention import TWO_SET_METHODS, BlockRole, TwoSetFold, row_at
from explain.rules.registry import Fold, Method

__all__ = ["EncoderDecoderPlan", "Position"]

Position = Union[None, int, Sequence[int], Tensor, Literal["all"]]
"""Which decoder position an encoder-decoder explanation reads out (it explains the token
predicted there, the next one): None = each sample's last real position, an int or B
ints, or "all": every token of the decoder sequence after the start token, column j
explaining token j + 1 from position j (by default as the target: the sequence's own
tokens, which for a generated sequence are the tokens the model chose)."""


class EncoderDecoderPlan(Plan):
    """Source and target relevance of the token predicted at a decoder position.

    One forward; one backward batched over the explained positions, all of them folded
    together with the encoder-decoder rules (explain.rules.coattention) over every block,
    and each read out at its position: relevances["source"] = R_qi[p] over the encoder tokens
    (or the image patch grid), relevances["target"] = R_qq[p] over the decoder tokens.
    Options: `position` (see `Position`). The target is a token id: None = the predicted
    token (for position="all": the sequence's own next tokens), an int, B ints, a (B, P)
    tensor with position="all", or a callable on the (B, vocabulary) logits.
    """

    serves = EncoderDecoder
    passes = frozenset({AttentionGradientPass})
    contrast_refused = (
        "an encoder-decoder's targets are its decoder positions' tokens; explain the "
        "two tokens and subtract (AttnLRP and CP-LRP are linear in the score)"
    )
    methods = TWO_SET_METHODS
    refused_because = (
        "encoder-decoders are explained with the generic rule in its two-token-set form"
    )

    def __init__(
        self, adapter: EncoderDecoder, spec: Method | None, request: Request, tokenizer: Any
    ) -> None:
        super().__init__(adapter, spec, request, tokenizer)
        options = dict(request.options)
        self.position: Position = options.pop("position", None)
        if options:
            raise OptionError(
                f"encoder-decoders take only the option 'position'; got {sorted(options)}"
            )
        if request.start_layer is not None:
            raise OptionError(
                "encoder-decoder relevance aggregates over every block: no start_layer"
            )
        self._every = isinstance(self.position, str)
        self._target: Target = request.target

    def prepare(self, inputs: Any) -> None:
        super().prepare(inputs)
        arguments = self.prepared.arguments
        decoder_ids = arguments["decoder_input_ids"]
        lengths = arguments["decoder_attention_mask"].sum(dim=1)
        self.positions, self.valid = _decoder_positions(self.position, lengths)
        target = self.request.target
        if self._every and target is None:
            target = decoder_ids.gather(1, self.positions + 1)
        elif self._every and not callable(target):
            target = torch.as_tensor(target, device=decoder_ids.device)
            if target.dim() == 0:
                target = target.expand_as(self.positions)
            if target.shape != self.positions.shape:
                raise TargetError(
                    f"with position='all' give one target token per sample and position, "
                    f"shape {tuple(self.positions.shape)}; got {tuple(target.shape)}"
                )
        if self._every and isinstance(target, Tensor):  # past a sequence's end: nothing
            target = target.masked_fill(~self.valid, 0)
        self._target = target

    def call_fold(self) -> TwoSetFold:
        """The two-set fold over every block, for every position."""
        roles = [
            BlockRole(site.layer, "i" if site.stack == "source" else "q", site.kind)
            for site in self.adapter.attention_sites()
        ]
        source, target = self.sets
        return TwoSetFold(roles, target.layout.num_tokens, source.layout.num_tokens)

    def read(self, fold: Fold) -> Relevances:
        """Each position's rows of R_qi and R_qq, read for every column at once."""
        state = fold.result()
        rows = self.positions.T  # (P, B): each column's position in each sample
        source, target = row_at(state.qi, rows), row_at(state.qq, rows)
        return {"source": source.transpose(0, 1), "target": target.transpose(0, 1)}

    def columns(self, output: Tensor) -> Columns:
        rows = torch.arange(output.shape[0], device=output.device)[:, None]
        logits = output[rows, self.positions]  # (B, P, vocabulary): every column at once
        target = self._target
        if self._every and callable(target) and not isinstance(target, Tensor):
            found, custom = _per_position(logits, target)
        else:
            found, custom = resolve_targets(logits if self._every else logits[:, 0], target)
        if found is None:
            assert custom is not None
            custom_scores(self.request.score)
            scores = custom if self._every else custom[:, None]
            classes = torch.full_like(self.positions, -1)
        else:
            if not self._every and found.dim() == 2:
                raise TargetError("one target token per explained position; got a (B, K) target")
            classes = found.to(self.positions.device).reshape(self.positions.shape)
            scores = select_scores(logits, classes, self.score)
        explained = classes.masked_fill(~self.valid, -1)
        if not self._every:  # one position: no position axis
            explained, logits = explained[:, 0], logits[:, 0]
        return Columns(scores, explained, logits, custom=found is None)

    def finish(self, relevances: Relevances, columns: Columns) -> dict[str, Tensor]:
        result = masked_columns(relevances, self.valid)  # past a sequence's end: 0
        if not self._every:
            result = {name: r[:, 0] for name, r in result.items()}
        return result


def _per_position(
    logits: Tensor, target: Callable[[Tensor], Tensor]
) -> tuple[Tensor | None, Tensor | None]:
    """(classes, custom scores), each (B, P) or None, from a target callable, which takes
    one position's (B, vocabulary) logits: it is called once per position."""
    chosen = [resolve_targets(logits[:, column], target) for column in range(logits.shape[1])]
    kinds = {found is None for found, _ in chosen}
    if len(kinds) > 1:
        raise TargetError(
            "a target callable must return class indices at every position or scores at "
            "every position, not both"
        )
    if any(found is not None and found.dim() == 2 for found, _ in chosen):
        raise TargetError("one target token per explained position; got a (B, K) target")
    if kinds == {True}:
        return None, torch.stack([custom for _, custom in chosen], dim=1)  # type: ignore[misc]
    return torch.stack([found for found, _ in chosen], dim=1), None  # type: ignore[misc]


def _decoder_positions(position: Position, lengths: Tensor) -> tuple[Tensor, Tensor]:
    """(B, P) explained positions and (B, P) validity from each sample's decoder length."""
    batch = lengths.shape[0]
    if isinstance(position, str):
        if position != "all":
            raise OptionError(f"position must be an int, B ints, None or 'all'; got {position!r}")
        width = int(lengths.max()) - 1
        if width < 1:
            raise InputError("position='all' needs decoder sequences of at least two tokens")
        columns = torch.arange(width, device=lengths.device).expand(batch, width)
        valid = columns < (lengths - 1)[:, None]
        return torch.minimum(columns, (lengths - 1)[:, None]), valid
    if position is None:
        positions = lengths - 1
    else:
        if isinstance(position, bool):
            raise OptionError("position must be an int, B ints, None or 'all', not a bool")
        try:
            positions = torch.as_tensor(position, device=lengths.device)
            if not _integers(positions):
                raise TypeError("not integers")  # 1.5 would be read as 1
            positions = positions.long().expand(batch)
        except (TypeError, ValueError, RuntimeError, OverflowError):
            raise OptionError(
                f"position must be an int, B = {batch} ints, None or 'all'; got {position!r}"
            ) from None
        positions = torch.where(positions < 0, positions + lengths, positions)
        if bool(((positions < 0) | (positions >= lengths)).any()):
            raise OptionError(
                f"position {position!r} is outside a decoder sequence (real lengths "
                f"{lengths.tolist()}); negative positions count from each sequence's end"
            )
    return positions[:, None], torch.ones(batch, 1, dtype=torch.bool, device=lengths.device)


def _integers(tensor: Tensor) -> bool:
    return not (tensor.is_floating_point() or tensor.is_complex() or tensor.dtype == torch.bool)
