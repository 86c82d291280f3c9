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

from explain.architectures.hf_bert import HuggingFaceTextEncoder
from explain.errors import UnsupportedModelError
from explain.layout import ModuleHook
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
        to_tokens: bool = False,
    ) -> Tensor | None:
        """Relevance from 1.0 at each sample's class logit down to layer `stop_layer`.

        `on_attention(layer, relevance)` receives each layer's attention relevance RA_l
        (B, H, N, N), last layer first. With `to_tokens` returns the relevance of layer
        `stop_layer`'s input (B, N, D); with `to_input`, that of the embedding output
        summed over D, (B, N); otherwise the walk ends once layer `stop_layer`'s RA is
        delivered and returns None. All samples walk together; the walk runs in
        `rules.dtype` and hands back the model's dtype (at least float32).
        """
        with torch.no_grad():
            tokens = self.head["tokens"]
            result_dtype = compute_dtype(tokens)
            dtype = rules.dtype(tokens)

            def report(layer: int, relevance: Tensor) -> None:
                on_attention(layer, relevance.to(result_dtype))

            relevance = logit_relevance(self.head["logits"], classes, dtype)
            model = self.model
            # classifier, dropout, pooler tanh (pass), pooler dense, first token (LRP-0)
            relevance = rules.linear(self.head["pooled"], model.classifier.weight, relevance)
            relevance = rules.linear(self.head["first"], model.bert.pooler.dense.weight, relevance)
            relevance = rule.select_tokens(tokens.to(dtype), 0, relevance)
            samples, count, width = relevance.shape
            relevance = relevance.reshape(samples * count, width)
            for layer in range(len(self.layers) - 1, stop_layer - 1, -1):
                last = layer == stop_layer and not (to_input or to_tokens)
                below = self._layer(layer, relevance, rules, report, dtype, samples, last=last)
                if below is None:
                    return None
                relevance = below
            relevance = relevance.reshape(samples, count, width)
            return (relevance.sum(dim=-1) if to_input else relevance).to(result_dtype)

    def _layer(
        self,
        index: int,
        relevance: Tensor,
        rules: RuleSet,
        report: Callable[[int, Tensor], None],
        dtype: torch.dtype,
        samples: int,
        *,
        last: bool = False,
    ) -> Tensor | None:
        """Relevance of layer `index`'s output rows -> of its input rows; the `last`
        layer of a walk only delivers its RA and returns None."""
        layer, store = self.layers[index], self.blocks[index]
        self_attention = layer.attention.self
        x, ao, attn_branch, mlp_branch = (
            store[name].flatten(0, -2) for name in ("x", "ao", "attn_branch", "mlp_branch")
        )

        # BertOutput: LN(dense(inter) + ao); LN passes.
        total = rule.safe_denominator(mlp_branch.to(dtype) + ao)
        from_branch, from_ao = rules.residual(mlp_branch, ao, relevance, total, samples)
        inter = rules.linear(store["inter"].flatten(0, -2), layer.output.dense.weight, from_branch)
        into_ff = rules.linear(ao, layer.intermediate.dense.weight, inter)
        relevance = rule.branch(ao, [into_ff, from_ao], rule.safe_denominator(ao.to(dtype)))

        # BertSelfOutput: LN(dense(o) + x).
        total = rule.safe_denominator(attn_branch.to(dtype) + x)
        from_attn, from_x = rules.residual(attn_branch, x, relevance, total, samples)
        dense = layer.attention.output.dense.weight
        relevance_o = rules.linear(store["o"].flatten(0, -2), dense, from_attn)

        batch, heads, tokens, _ = store["attention"].shape
        head_dim = self_attention.attention_head_size
        groups = batch * heads

        def by_head(t: Tensor) -> Tensor:  # (..., B, N, H * d) -> (..., B * H, N, d), as HF
            t = t.to(dtype).view(*t.shape[:-1], heads, head_dim).transpose(-3, -2)
            return t.reshape(*t.shape[:-4], groups, tokens, head_dim)

        probabilities = store["attention"].to(dtype).view(groups, tokens, tokens)
        relevance_o = by_head(relevance_o.view(batch, tokens, -1))
        if last:
            of_attention, _ = rule.attention_probabilities(
                probabilities, by_head(store["v"]), relevance_o
            )
            report(index, of_attention.view(batch, heads, tokens, tokens))
            return None
        of_attention, of_heads = rule.attention(
            by_head(torch.stack([store["q"], store["k"], store["v"]])),
            probabilities,
            relevance_o,
            rules.residual,
            samples=batch,
            scale=self_attention.scaling,
            mask=store.get("mask"),
        )
        report(index, of_attention.view(batch, heads, tokens, tokens))
        # The query, key and value projections share their input: their rules' sum is the
        # rule of one linear map with the three weights stacked, run once.
        of_qkv = of_heads.view(3, batch, heads, tokens, head_dim).permute(1, 3, 0, 2, 4)
        weights = torch.cat(
            [self_attention.query.weight, self_attention.key.weight, self_attention.value.weight]
        )
        projections = rules.linear(x, weights, of_qkv.reshape(batch * tokens, -1))
        # The reference's two branch points: q/k/v share the attention's input, which the
        # layer shares with the residual.
        below = rule.safe_denominator(x.to(dtype))
        return rule.branch(x, [rule.branch(x, [projections], below), from_x], below)
