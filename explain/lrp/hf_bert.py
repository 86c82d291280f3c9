"""Relevance propagation through Hugging Face `BertForSequenceClassification`, on the stock
modules, in the order of the CVPR 2021 BERT reference's `relprop`.

Per layer (post-LayerNorm BERT): the output add `LN(dense(inter) + ao)`, the intermediate
GELU and dense, the branch at the attention output `ao`; then `LN(dense(o) + x)`, the
attention products with the attention mask add (scores + mask) between them, the
query/key/value projections and the two branch points of the reference, first the three
projections' shared input, then that input shared with the residual. The head is the
pooler (first token, dense, tanh) and the classifier. Full LRP stops at the embedding
output, summed over the hidden size (the reference's text `lrp`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from explain.architectures.base import ModuleHook
from explain.architectures.hf_bert import HuggingFaceTextEncoder
from explain.errors import UnsupportedModelError
from explain.lrp import rules as rule
from explain.lrp.rules import RuleSet
from explain.lrp.structure import (
    keep,
    logit_relevance,
    require_forward,
    require_linear,
    require_pass,
    type_name,
)
from explain.rules.fold import compute_dtype

__all__ = ["BertTape"]

_MODULE = "transformers.models.bert.modeling_bert"
_FORWARDS = {
    "": "BertForSequenceClassification.forward",
    "layer": "BertLayer.forward",
    "attention": "BertAttention.forward",
    "attention.self": "BertSelfAttention.forward",
    "attention.output": "BertSelfOutput.forward",
    "intermediate": "BertIntermediate.forward",
    "output": "BertOutput.forward",
    "pooler": "BertPooler.forward",
}
_LAYER_PASS = (
    "attention.self.dropout",
    "attention.output.dropout",
    "attention.output.LayerNorm",
    "intermediate.intermediate_act_fn",
    "output.dropout",
    "output.LayerNorm",
)
_LAYER_LINEAR = (
    "attention.self.query",
    "attention.self.key",
    "attention.self.value",
    "attention.output.dense",
    "intermediate.dense",
    "output.dense",
)


def _get(module: nn.Module, path: str) -> nn.Module:
    return module.get_submodule(path) if path else module


class BertTape:
    """The activations of one forward pass of a BERT classifier and the LRP walk over them.

    Raises:
        UnsupportedModelError for other families of the text adapter (their heads and
        layers differ) or a module on the path that no rule covers.
    """

    in_input_space = False  # full LRP ends at the tokens, which the adapter maps

    def __init__(self, adapter: HuggingFaceTextEncoder, *, to_input: bool) -> None:
        model = adapter.model
        self.model = model
        self._check(model)
        self.layers = list(model.bert.encoder.layer)
        self.blocks: list[dict[str, Tensor]] = [{} for _ in self.layers]
        self.head: dict[str, Tensor] = {}
        self.hooks: list[tuple[nn.Module, ModuleHook]] = []
        for store, layer in zip(self.blocks, self.layers, strict=True):
            attention, output = layer.attention, layer.output
            self.hooks += [
                (attention.self.query, keep(store, "x", "input")),
                (attention.self.query, keep(store, "q")),
                (attention.self.key, keep(store, "k")),
                (attention.self.value, keep(store, "v")),
                (attention.self, keep(store, "mask", "mask")),
                (attention.self, keep(store, "attention", "output1")),
                (attention.output.dense, keep(store, "o", "input")),
                (attention.output.dense, keep(store, "attn_branch")),
                (layer.intermediate.dense, keep(store, "ao", "input")),
                (output.dense, keep(store, "inter", "input")),
                (output.dense, keep(store, "mlp_branch")),
            ]
        pooler = model.bert.pooler
        self.hooks += [
            (pooler, keep(self.head, "tokens", "input")),
            (pooler.dense, keep(self.head, "first", "input")),
            (model.classifier, keep(self.head, "pooled", "input")),
            (model.classifier, keep(self.head, "logits")),
        ]

    def _check(self, model: nn.Module) -> None:
        if not type(model).__name__ == "BertForSequenceClassification":
            raise UnsupportedModelError(
                f"no LRP rules for {type_name(model)}: in the BERT family the LRP methods "
                "cover BertForSequenceClassification (pooler and classifier head)"
            )
        require_forward(model, (_MODULE, _FORWARDS[""]), "the model")
        config = model.config
        if config.is_decoder or config.add_cross_attention or config.chunk_size_feed_forward:
            raise UnsupportedModelError(
                "the LRP rules cover BERT encoders without cross-attention or chunked "
                "feed-forward (is_decoder, add_cross_attention, chunk_size_feed_forward)"
            )
        pooler = model.bert.pooler
        if pooler is None:
            raise UnsupportedModelError("the BERT classifier has no pooler to propagate through")
        require_forward(pooler, (_MODULE, _FORWARDS["pooler"]), "bert.pooler")
        if type(pooler.activation) is not nn.Tanh:  # tanh passes, as in the reference
            require_pass(pooler.activation, "bert.pooler.activation")
        require_linear(pooler.dense, "bert.pooler.dense")
        require_pass(model.dropout, "dropout")
        require_linear(model.classifier, "classifier")
        for index, layer in enumerate(model.bert.encoder.layer):
            where = f"bert.encoder.layer.{index}"
            for path, forward in _FORWARDS.items():
                if path and path != "pooler":
                    module = layer if path == "layer" else _get(layer, path)
                    name = where if path == "layer" else f"{where}.{path}"
                    require_forward(module, (_MODULE, forward), name)
            for path in _LAYER_PASS:
                require_pass(_get(layer, path), f"{where}.{path}")
            for path in _LAYER_LINEAR:
                require_linear(_get(layer, path), f"{where}.{path}")

    # -- the walk ----------------------------------------------------------------------------

    def propagate(
        self,
        classes: Tensor,
        rules: RuleSet,
        on_attention: Callable[[int, Tensor], None],
        *,
        stop_layer: int = 0,
        to_input: bool = False,
    ) -> Tensor:
        """Relevance from 1.0 at each sample's class logit down to layer `stop_layer`.

        `on_attention(layer, relevance)` receives each layer's attention relevance RA_l
        (B, H, N, N), last layer first. Returns the relevance of layer `stop_layer`'s input
        (B, N, D); with `to_input`, that of the embedding output summed over D, (B, N).
        """
        with torch.no_grad():
            tokens = self.head["tokens"]
            dtype = compute_dtype(tokens)
            relevance = logit_relevance(self.head["logits"], classes, dtype)
            model = self.model
            # classifier, dropout, pooler tanh (pass), pooler dense, first token (LRP-0)
            relevance = self._linear(model.classifier, self.head["pooled"], relevance, rules)
            relevance = self._linear(model.bert.pooler.dense, self.head["first"], relevance, rules)
            first = torch.zeros(1, dtype=torch.long, device=tokens.device)
            relevance = rule.select_tokens(tokens.to(dtype), first, relevance[:, None])
            for layer in range(len(self.layers) - 1, stop_layer - 1, -1):
                relevance = self._layer(layer, relevance, rules, on_attention, dtype)
            return relevance.sum(dim=-1) if to_input else relevance

    @staticmethod
    def _linear(module: nn.Module, x: Tensor, relevance: Tensor, rules: RuleSet) -> Tensor:
        return rules.linear(
            x.to(relevance.dtype), module.weight.detach().to(relevance.dtype), relevance
        )

    def _layer(
        self,
        index: int,
        relevance: Tensor,
        rules: RuleSet,
        on_attention: Callable[[int, Tensor], None],
        dtype: torch.dtype,
    ) -> Tensor:
        layer = self.layers[index]
        store = {key: value.to(dtype) for key, value in self.blocks[index].items()}
        self_attention = layer.attention.self

        # BertOutput: LN(dense(inter) + ao); LN passes.
        from_branch, from_ao = rules.residual(store["mlp_branch"], store["ao"], relevance)
        inter = self._linear(layer.output.dense, store["inter"], from_branch, rules)
        into_ff = self._linear(layer.intermediate.dense, store["ao"], inter, rules)
        relevance = rule.branch(store["ao"], [into_ff, from_ao])

        # BertSelfOutput: LN(dense(o) + x).
        from_attn, from_x = rules.residual(store["attn_branch"], store["x"], relevance)
        relevance_o = self._linear(layer.attention.output.dense, store["o"], from_attn, rules)
        batch, tokens, _ = store["o"].shape
        heads = self_attention.num_attention_heads
        head_dim = self_attention.attention_head_size

        def split(t: Tensor) -> Tensor:  # (B, N, H * d) -> (B, H, N, d), as HF's view
            return t.reshape(batch, tokens, heads, head_dim).transpose(1, 2)

        def merge(t: Tensor) -> Tensor:
            return t.transpose(1, 2).reshape(batch, tokens, heads * head_dim)

        query, key = split(store["q"]), split(store["k"])
        scores = torch.matmul(query, key.transpose(2, 3)) * self_attention.scaling
        of_attention, of_query, of_key, of_value = rule.attention(
            query,
            key,
            store["attention"],
            split(store["v"]),
            split(relevance_o),
            rules.residual,
            scores=scores,
            mask=store.get("mask"),
        )
        on_attention(index, of_attention)
        x = store["x"]
        projections = [
            self._linear(self_attention.query, x, merge(of_query), rules),
            self._linear(self_attention.key, x, merge(of_key), rules),
            self._linear(self_attention.value, x, merge(of_value), rules),
        ]
        # The reference's two branch points: q/k/v share the attention's input, which the
        # layer shares with the residual.
        return rule.branch(x, [rule.branch(x, projections), from_x])
