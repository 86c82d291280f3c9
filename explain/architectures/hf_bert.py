"""Hugging Face BERT-style text encoders: BERT, RoBERTa, XLM-RoBERTa, DistilBERT, ALBERT,
ELECTRA, as sequence classifiers (`...ForSequenceClassification`) and as bare encoders
(`...Model`).

Readouts (docs/methods.md): a classifier's head reads the first token (CLS), so its readout
row is one-hot there, and such inputs must be right-padded. A bare encoder is explained
as a mean-pooled sentence encoder (sentence-transformers style): its output is the mean
of the last hidden states over the real tokens, and the readout row is that mean.

Padding: position ids are counted over real tokens (RoBERTa and XLM-R already do this
from the pad id), so a padded text gets the same numbers as the text alone.

ALBERT shares one layer's weights across all L layers: the same module runs L times, so
`blocks` lists it L times and the recorder hands its k-th call to block k.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from explain.architectures.base import LazyImport, one_hot_rows
from explain.architectures.hf_common import (
    HuggingFaceAdapter,
    is_transformers_class,
    positions_from_mask,
    prepare_text,
    sdpa_attention_flags,
    split_heads,
)
from explain.errors import InputError
from explain.layout import FusedAttentionSite, FusedPath, Prepared, TokenLayout

__all__ = ["HuggingFaceTextEncoder"]


@dataclass(frozen=True)
class _Family:
    prefix: str
    """Class name prefix in transformers (Bert, Roberta, ...)."""
    counts_positions: bool
    """The model derives position ids from the pad id itself (RoBERTa): pass none."""


_FAMILIES = {
    "bert": _Family("Bert", counts_positions=False),
    "roberta": _Family("Roberta", counts_positions=True),
    "xlm_roberta": _Family("XLMRoberta", counts_positions=True),
    "distilbert": _Family("DistilBert", counts_positions=False),
    "albert": _Family("Albert", counts_positions=False),
    "electra": _Family("Electra", counts_positions=False),
}


def _family_of(model: nn.Module) -> str | None:
    for package, family in _FAMILIES.items():
        names = (f"{family.prefix}ForSequenceClassification", f"{family.prefix}Model")
        if is_transformers_class(model, package, names):
            return package
    return None


class HuggingFaceTextEncoder(HuggingFaceAdapter):
    family = (
        "Hugging Face BERT, RoBERTa, XLM-RoBERTa, DistilBERT, ALBERT and ELECTRA "
        "(ForSequenceClassification: CLS readout; bare Model: mean-pooled sentence encoder)"
    )
    reads_text = True
    lrp_walk = LazyImport("explain.lrp.hf_bert", "BertTape")

    def __init__(self, model: nn.Module) -> None:
        self._package = _family_of(model) or "bert"
        super().__init__(model)
        config = model.config
        family = _FAMILIES[self._package]
        self.pooled_by_mean = not is_transformers_class(
            model, self._package, (f"{family.prefix}ForSequenceClassification",)
        )
        parameters = inspect.signature(model.forward).parameters
        self._token_types = "token_type_ids" in parameters
        self._positions = "position_ids" in parameters and not family.counts_positions
        # RoBERTa's positions start after the pad id: the table holds pad_token_id + 1 fewer.
        offset = config.pad_token_id + 1 if family.counts_positions else 0
        self.max_tokens = config.max_position_embeddings - offset

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        return _family_of(model) is not None

    @property
    def feature_output(self) -> str | None:
        if not self.pooled_by_mean:
            return None
        return (
            f"{type(self.model).__name__} is a sentence encoder: its output is the "
            "mean-pooled embedding, so there is no predicted class; explain the similarity "
            "of two texts with explain.text.similarity (CLI: --pair TEXT), or give the "
            "target explicitly (a callable that returns one score per text, or a feature "
            "index)"
        )

    def find_blocks(self) -> list[nn.Module]:
        if self._package != "albert":
            return super().find_blocks()
        # ALBERT: layer i runs group int(i / (L / G)), each group its inner layers in order.
        encoder = self.model.albert.encoder if hasattr(self.model, "albert") else self.model.encoder
        config = self.model.config
        layers, groups = config.num_hidden_layers, config.num_hidden_groups
        return [
            layer
            for i in range(layers)
            for layer in encoder.albert_layer_groups[int(i / (layers / groups))].albert_layers
        ]

    def prepare(self, inputs: object) -> Prepared:
        parameter = self.parameter
        arguments = prepare_text(
            inputs,
            max_tokens=self.max_tokens,
            vocab_size=self.model.config.vocab_size,
            device=parameter.device,
            token_types=self._token_types,
            type_vocab_size=getattr(self.model.config, "type_vocab_size", 1),
        )
        mask = arguments["attention_mask"]
        if not self.pooled_by_mean and not mask[:, 0].all():
            raise InputError(
                "this classifier reads the first token (CLS), but the text is left-padded; "
                "pad on the right (tokenizer.padding_side = 'right')"
            )
        if self._positions:
            arguments["position_ids"] = positions_from_mask(mask)
        return Prepared(
            batch_size=mask.shape[0], layout=TokenLayout.text(mask), arguments=arguments
        )

    def forward(self, prepared: Prepared) -> Tensor:
        output = self.model(**prepared.arguments)
        if not self.pooled_by_mean:
            return output.logits
        hidden = output.last_hidden_state
        weights = self.readout(prepared).to(hidden.dtype)
        return torch.einsum("bt,btd->bd", weights, hidden)

    def readout(self, prepared: Prepared) -> Tensor:
        mask = prepared.arguments["attention_mask"]
        dtype = self.parameter.dtype
        if self.pooled_by_mean:
            return mask.to(dtype) / mask.sum(dim=1, keepdim=True).to(dtype)
        return one_hot_rows(mask.shape[0], mask.shape[1], 0, self.parameter)

    def fused_path(self) -> FusedPath | None:
        """BERT-style self-attention on the sdpa kernel (explain.fused): q, k, v are the
        outputs of the query, key and value projections, the kernel's output enters
        attention.output.dense, and the self-attention module receives the mask. DistilBERT
        and ALBERT are built differently and keep the explicit path."""
        if self._package not in _FUSED_PACKAGES:
            return None
        sites = []
        for layer, block in enumerate(self.blocks):
            attention = block.attention.self
            heads = partial(split_heads, attention.attention_head_size)
            sites.append(
                FusedAttentionSite(
                    layer=layer,
                    query=attention.query,
                    key=attention.key,
                    value=attention.value,
                    values=heads,
                    output=block.attention.output.dense,
                    heads=heads,
                    scale=float(attention.scaling),
                    queries=heads,
                    keys=heads,
                    mask_module=attention,
                    masks=_attention_mask,
                )
            )
        return FusedPath(sites=sites, flags=sdpa_attention_flags(self.model))


_FUSED_PACKAGES = ("bert", "roberta", "xlm_roberta", "electra")


def _attention_mask(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Tensor | None:
    """The mask the self-attention module hands to its kernel (None: every token attends)."""
    return kwargs["attention_mask"] if "attention_mask" in kwargs else (args[1:2] or (None,))[0]
