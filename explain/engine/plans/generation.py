"""The plan of a decoder-only language model's generation (`Request.prompt_length`):
column g is the token generated at P + g, read out at P + g - 1 over the tokens up to
there; each column has its own readout rows, also for the forward-only methods.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from torch import Tensor

from explain.architectures.base import Adapter, LanguageModel
from explain.engine.passes import (
    AttentionGradientPass,
    Columns,
    EmbeddingCopiesPass,
    EmbeddingGradientPass,
    ForwardPass,
    Relevances,
)
from explain.engine.plans.base import Plan, masked_columns
from explain.engine.targets import Request, Score, integer_option, select_scores
from explain.errors import InputError, OptionError
from explain.layout import Prepared
from explain.rules.registry import Fold, Method

__all__ = ["GenerationPlan", "column_rows", "generated_scores", "require_causal_lm"]


def require_causal_lm(adapter: Adapter) -> LanguageModel:
    """`adapter` as a decoder-only language model's: only those generate text."""
    if not isinstance(adapter, LanguageModel):
        raise OptionError(
            "generations are explained for decoder-only language models; "
            f"{type(adapter.model).__name__} is a {adapter.family} model"
        )
    return adapter


def generated_tokens(mask: Tensor, prompt_length: Any) -> tuple[int, Tensor, Tensor]:
    """Where a generation's tokens lie in its (B, P + G) attention `mask`, for the padded
    prompts' width `prompt_length` (P): P checked, which of the (B, G) generated
    positions hold a real token, and the (G,) positions each is read out at (P + g - 1)."""
    width = integer_option("prompt_length", prompt_length)
    if not 0 < width < mask.shape[1]:
        raise InputError(
            f"prompt_length {width} leaves no prompt or no generated token in sequences "
            f"of {mask.shape[1]} tokens; it is the padded prompts' width"
        )
    valid = mask[:, width:].bool()
    positions = torch.arange(valid.shape[1], device=mask.device) + width - 1
    return width, valid, positions


def read_out_at(width: int, valid: Tensor) -> slice:
    """The positions P - 1 .. P + G - 2 that the G generated tokens (`valid` (B, G)) after
    prompts of width P are read out at, as the slice `LanguageModel.logits_at` takes."""
    return slice(width - 1, width - 1 + valid.shape[1])


def generated_scores(output: Tensor, generated: Tensor, valid: Tensor, score: Score) -> Tensor:
    """(B, G) scores of the (B, G) `generated` tokens in the (B, G, vocab) `output` they
    were chosen from, 0 past each continuation's end (`valid`): there is nothing to
    explain there, and no gradient flows."""
    batch, count = valid.shape
    scores = select_scores(output.flatten(0, 1), generated.flatten(), score)
    return scores.reshape(batch, count) * valid


def column_rows(
    lm: LanguageModel, prepared: Prepared, at: Tensor, token_mask: Tensor
) -> tuple[Tensor, Tensor]:
    """Each column's readout rows, one-hot at its position `at` (C,), and its token mask,
    `token_mask` (B, T) blind to the tokens after that position: (C, B, T) each, made for
    every column at once (a generation's cost must not grow with its tokens beyond its
    batched backward)."""
    batch = prepared.batch_size
    readouts = lm.readout_at(prepared, at.expand(batch, -1)).transpose(0, 1)  # (C, B, T)
    tokens = torch.arange(token_mask.shape[1], device=at.device)
    seen = token_mask[None] & (tokens <= at[:, None])[:, None, :]  # (C, B, T)
    return readouts, seen


class GenerationPlan(Plan):
    """Every generated token of a decoder-only language model, over the tokens before it.

    The inputs are left-padded prompts of width P (`Request.prompt_length`) followed by
    their continuations, the attention mask 0 past each continuation's end. One forward
    over the whole sequences; column g explains the token generated at P + g, read out at
    P + g - 1 with the tokens after that position hidden from its fold, which is exactly
    a next-token explanation of the prefix before the token (methods that average over
    the keys need the hiding). The gradient methods differentiate every column in one
    batched backward; the forward-only methods fold every column from the same forward.
    The relevance is (B, G, T), 0 on the columns past a continuation's end; the target,
    the generated tokens (-1 past the end), is implied.
    """

    serves = LanguageModel
    passes = frozenset(
        {
            ForwardPass,
            AttentionGradientPass,
            EmbeddingGradientPass,
            EmbeddingCopiesPass,
        }
    )
    contrast_refused = (
        "a generation explains the tokens it generated; contrast two answers with "
        "explain.cite.explain_contrast"
    )
    refused_because = (
        "a generation is explained at every generated position from one forward, and an "
        "LRP walk propagates one position's logit per pass"
    )

    adapter: LanguageModel

    def __init__(self, adapter: Adapter, spec: Method | None, request: Request, tokenizer: Any):
        require_causal_lm(adapter)  # chosen by the request (`plan_kind`), whatever the kind
        if spec is None:
            raise OptionError(
                "trace() follows one score per input; a generation has one per generated "
                "token: trace a prefix of it with its next token as the target"
            )
        super().__init__(adapter, spec, request, tokenizer)
        if request.target is not None:
            raise OptionError(
                "a generation explains the tokens it generated, so it takes no target; "
                "leave target unset (or explain a prefix with Explainer.explain)"
            )

    def prepare(self, inputs: Any) -> None:
        super().prepare(inputs)
        self.width, self.valid, self.positions = generated_tokens(
            self.prepared.arguments["attention_mask"], self.request.prompt_length
        )
        self.known_columns = self.valid.shape[1]

    def forward(self) -> Tensor:
        """(B, G, vocab): the logits each generated token was chosen from."""
        return self.adapter.logits_at(self.prepared, read_out_at(self.width, self.valid))

    def call_fold(self) -> Fold:
        """The method's fold for every generated position: each column reads out at its
        own position, blind to the tokens after it (`column_rows`)."""
        (text,) = self.sets
        layout = text.layout
        assert layout.token_mask is not None  # a text layout masks its pads
        readouts, seen = column_rows(self.adapter, self.prepared, self.positions, layout.token_mask)
        return self._set_folds([replace(text, layout=replace(layout, token_mask=seen))], [readouts])

    def columns(self, output: Tensor) -> Columns:
        generated = self.prepared.arguments["input_ids"][:, self.width :]
        scores = generated_scores(output, generated, self.valid, self.score)
        return Columns(scores, generated.masked_fill(~self.valid, -1), output)

    def copy_columns(self, output: Tensor, columns: Columns, copies: int) -> Tensor:
        generated = self.prepared.arguments["input_ids"][:, self.width :]
        return generated_scores(
            output, generated.repeat(copies, 1), self.valid.repeat(copies, 1), self.score
        )

    def finish(self, relevances: Relevances, columns: Columns) -> dict[str, Tensor]:
        return masked_columns(relevances, self.valid)
