"""A SentenceTransformer explained as its `encode` runs it: its encoder, read out by its
pooling, over the tokens its own preprocessing makes (prompt or chat template included).

`Explainer(sentence_transformer)` explains the Hugging Face encoder inside it (`[0]`'s
`auto_model`, a bare encoder whose output explain reads as the mean over the real
tokens) with `SentenceTokenizer`, which encodes texts through the SentenceTransformer's
`preprocess` with the prompt `encode` would resolve (`default_prompt_name`): the tokens
explained are exactly the tokens `encode` embeds, its truncation at `max_seq_length`
included. The pooling must be the mean over every token (a Normalize module may follow:
the explained similarity is a cosine, which normalising does not change); anything
else after the encoder is refused, naming it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import nn

from explain.errors import UnsupportedModelError

__all__ = ["SentenceTokenizer", "sentence_encoder"]

_KEPT = ("input_ids", "attention_mask", "token_type_ids")
"""The encoder inputs of the SentenceTransformer's preprocessing that explain passes on."""


class SentenceTokenizer:
    """The tokenizer of a SentenceTransformer as its `encode` uses it: texts go through
    the model's `preprocess` with the resolved `prompt`; the token names and special
    tokens are those of the model's own tokenizer (every other attribute is its)."""

    def __init__(self, sentence_transformer: Any, prompt: str | None) -> None:
        self.sentence_transformer = sentence_transformer
        self.prompt = prompt
        self.tokenizer = sentence_transformer.tokenizer

    def __call__(self, texts: Sequence[str], **_: Any) -> dict[str, Any]:
        """The batch `encode` would embed, with the special-tokens mask that
        explain.inputs.encode checks; the padding and truncation options explain's
        encoder asks for are the SentenceTransformer's own here."""
        features = self.sentence_transformer.preprocess(list(texts), prompt=self.prompt)
        batch = {name: features[name] for name in _KEPT if name in features}
        batch["special_tokens_mask"] = batch["input_ids"].new_tensor(
            [
                self.tokenizer.get_special_tokens_mask(row, already_has_special_tokens=True)
                for row in batch["input_ids"].tolist()
            ]
        )
        return batch

    def __getattr__(self, name: str) -> Any:  # only for what the instance lacks
        if name == "tokenizer":  # not set yet (a copy under construction)
            raise AttributeError(name)
        return getattr(self.tokenizer, name)


def sentence_encoder(sentence_transformer: Any) -> tuple[nn.Module, SentenceTokenizer]:
    """The encoder inside `sentence_transformer` and the tokenizer that encodes texts as
    its `encode` does; UnsupportedModelError naming what explain cannot read out."""
    modules = list(sentence_transformer)
    encoder = getattr(modules[0], "auto_model", None) if modules else None
    if not isinstance(encoder, nn.Module):
        first = type(modules[0]).__name__ if modules else "nothing"
        raise UnsupportedModelError(
            f"this SentenceTransformer starts with {first}, "
            "not a Hugging Face Transformer module: explain reads the encoder at "
            "model[0].auto_model"
        )
    prompt = sentence_transformer._resolve_prompt(None, None)
    for module in modules[1:]:
        kind = type(module).__name__
        if kind == "Normalize":
            continue
        if kind != "Pooling":
            raise UnsupportedModelError(
                f"this SentenceTransformer applies {kind} after its pooling; explain reads "
                "out the pooled embedding of the encoder (Pooling, then Normalize) only: "
                "explain model[0].auto_model's mean-pooled embedding instead"
            )
        if module.pooling_mode != "mean":
            raise UnsupportedModelError(
                f"this SentenceTransformer pools with {module.pooling_mode!r}; explain reads "
                "out a sentence encoder by the mean over its tokens (pooling_mode='mean')"
            )
        if prompt and not module.include_prompt:
            raise UnsupportedModelError(
                "this SentenceTransformer leaves its prompt out of the mean "
                "(include_prompt=False); explain reads out the mean over every token"
            )
    dimensions = getattr(sentence_transformer, "truncate_dim", None)
    if dimensions is not None:
        raise UnsupportedModelError(
            f"this SentenceTransformer truncates its embeddings to {dimensions} dimensions; "
            "explain reads out the whole pooled embedding: set truncate_dim=None"
        )
    return encoder, SentenceTokenizer(sentence_transformer, prompt)
