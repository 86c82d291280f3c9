"""Hugging Face GPT-2 style causal language models (GPT2LMHeadModel).

What is explained is the next token: the output scores are the logits at each text's last
real token, shape (B, vocab), and the readout row is one-hot at that token. Left and
right padding both work: position ids are counted over real tokens (as generation does),
so a padded text gets the same numbers as the text alone.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from explain.architectures.base import Prepared, TokenLayout, one_hot_rows
from explain.architectures.hf_common import (
    HuggingFaceAdapter,
    is_transformers_class,
    last_real_token,
    positions_from_mask,
    prepare_text,
)

__all__ = ["HuggingFaceCausalLM"]


class HuggingFaceCausalLM(HuggingFaceAdapter):
    family = "Hugging Face GPT2LMHeadModel (next-token logits at the last real token)"

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        self.max_tokens = model.config.n_positions

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        return is_transformers_class(model, "gpt2", ("GPT2LMHeadModel",))

    def prepare(self, inputs: object) -> Prepared:
        arguments = prepare_text(
            inputs,
            max_tokens=self.max_tokens,
            vocab_size=self.model.config.vocab_size,
            device=self.parameter.device,
            token_types=False,
        )
        mask = arguments["attention_mask"]
        arguments["position_ids"] = positions_from_mask(mask)
        return Prepared(
            batch_size=mask.shape[0], layout=TokenLayout.text(mask), arguments=arguments
        )

    def forward(self, prepared: Prepared) -> Tensor:
        output = self.model(**prepared.arguments, use_cache=False)
        last = last_real_token(prepared.arguments["attention_mask"])
        return output.logits[torch.arange(len(last), device=last.device), last]

    def readout(self, prepared: Prepared) -> Tensor:
        mask = prepared.arguments["attention_mask"]
        return one_hot_rows(mask.shape[0], mask.shape[1], last_real_token(mask), self.parameter)
