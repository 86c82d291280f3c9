"""Hugging Face decoder-only language models: every `...ForCausalLM` (and GPT-2's
`GPT2LMHeadModel`) whose class names its blocks and attention modules.

Llama and everything built on it (SmolLM, TinyLlama, Granite), Mistral, Mixtral, Qwen2,
Qwen3, Gemma 2 and 3, Phi-3, OLMo 2, GPT-NeoX and GPT-2 all run through this one adapter:
their blocks and attention modules come from `_can_record_outputs` (hf_common), and their
own eager attention function computes the probabilities with everything the family
adds (grouped-query heads repeated, sliding-window masks, soft-capping, rotary positions),
so the maps the rules read are the ones the model really multiplies with its values.

What is explained is the next token: the output scores are the logits at each text's last
real token, shape (B, vocab), and the readout row is one-hot at that token. Left and
right padding both work: position ids are counted over real tokens (as generation does),
so a padded text gets the same numbers as the text alone. Generated continuations are
explained by explain.generation, on top of this adapter.
"""

from __future__ import annotations

import inspect
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import Tensor, nn

from explain.architectures.base import LanguageModel
from explain.architectures.hf_attention_probe import dispatches_attention, probed_fused_path
from explain.architectures.hf_common import (
    HFAdapter,
    last_real_token,
    positions_from_mask,
    prepare_text,
    sliced_logits,
)
from explain.architectures.hf_registries import finite_eager_masks
from explain.layout import FusedPath, Prepared, TokenLayout

__all__ = ["HFCausalLM", "is_decoder_only_lm"]


def is_decoder_only_lm(model: nn.Module) -> bool:
    """Whether `model` is a transformers decoder-only language model this adapter takes.

    It must be a transformers `...ForCausalLM` (or `GPT2LMHeadModel`) that names its blocks
    in `_can_record_outputs` and takes `position_ids`. Encoder stacks run as decoders
    (`config.is_decoder`, e.g. RobertaForCausalLM) are left out: they count positions
    from their padding index and may carry cross-attention, which this adapter does not
    model; encoder-decoders go to hf_seq2seq.
    """
    cls = type(model)
    in_transformers = any(c.__module__.startswith("transformers.models.") for c in cls.__mro__)
    named = cls.__name__.endswith("ForCausalLM") or any(
        c.__name__ == "GPT2LMHeadModel" for c in cls.__mro__
    )
    if not (in_transformers and named):
        return False
    record = getattr(cls, "_can_record_outputs", None) or {}
    if not isinstance(record.get("hidden_states"), type) or "attentions" not in record:
        return False
    config = getattr(model, "config", None)
    if getattr(config, "is_encoder_decoder", False) or getattr(config, "is_decoder", False):
        return False
    return "position_ids" in inspect.signature(cls.forward).parameters


def _max_tokens(config: object) -> int | None:
    """The longest text the model's position scheme is configured for (None: no limit)."""
    for name in ("max_position_embeddings", "n_positions"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


class HFCausalLM(HFAdapter, LanguageModel):
    family = (
        "Hugging Face decoder-only language models, ...ForCausalLM and GPT2LMHeadModel; "
        "tested: Llama, Granite, Mistral, Mixtral, Qwen2, Qwen3, Gemma 2, Gemma 3, Phi-3, "
        "OLMo 2, GPT-NeoX, GPT-2 (the next token at the last real token; generations)"
    )
    causal_without_mask = True

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        self.max_tokens = _max_tokens(model.config)
        self.vocab_size = model.get_input_embeddings().num_embeddings
        self._keeps_logits = "logits_to_keep" in inspect.signature(model.forward).parameters

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        return is_decoder_only_lm(model)

    def prepare(self, inputs: object) -> Prepared:
        arguments = prepare_text(
            inputs,
            max_tokens=self.max_tokens if self.max_tokens is not None else 1 << 62,
            vocab_size=self.vocab_size,
            device=self.parameter.device,
            token_types=False,
        )
        mask = arguments["attention_mask"]
        arguments["position_ids"] = positions_from_mask(mask)
        return Prepared(
            batch_size=mask.shape[0], layout=TokenLayout.text(mask), arguments=arguments
        )

    def path_context(self) -> AbstractContextManager[Any]:
        """The eager masks of a float64 model kept finite (hf_registries): a left pad's
        query would otherwise make every token's logits NaN."""
        return finite_eager_masks()

    def logits_at(self, prepared: Prepared, positions: Tensor | slice) -> Tensor:
        """(B, P) positions, or a slice of them, -> the (B, P, vocab) logits there, without
        a cache. The head runs only at the positions asked for (`logits_to_keep`, where the
        model takes it; for a slice, from its start on): at thousands of tokens and a large
        vocabulary, logits everywhere would cost more memory than the whole explanation."""
        if isinstance(positions, slice):
            return sliced_logits(
                self.model, prepared.arguments, positions, keeps_logits=self._keeps_logits
            )
        keep = positions.unique()  # sorted
        if self._keeps_logits:
            logits = self.model(**prepared.arguments, use_cache=False, logits_to_keep=keep).logits
            index = torch.searchsorted(keep, positions.contiguous())
        else:
            logits = self.model(**prepared.arguments, use_cache=False).logits
            index = positions
        # A gather, not advanced indexing: its backward is one scatter per column of a
        # batched backward instead of an index_put and its helpers.
        index = index.to(logits.device)[..., None].expand(-1, -1, logits.shape[-1])
        return logits.gather(1, index)

    def forward(self, prepared: Prepared) -> Tensor:
        last = last_real_token(prepared.arguments["attention_mask"])
        return self.logits_at(prepared, last[:, None])[:, 0]

    def readout(self, prepared: Prepared) -> Tensor:
        mask = prepared.arguments["attention_mask"]
        return self.readout_at(prepared, last_real_token(mask))

    def fused_path(self) -> FusedPath | None:
        """sdpa, with q, k, v seen through the attention interface (hf_attention_probe),
        for families that dispatch through it and have no soft-capping (Gemma 2)."""
        if not dispatches_attention(self.model, self._attention_modules):
            return None
        return probed_fused_path(self._attention_modules, self.path_flags())
