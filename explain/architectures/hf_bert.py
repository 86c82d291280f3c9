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
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from explain.architectures.base import one_hot_rows
from explain.architectures.hf_common import (
    HFAdapter,
    is_transformers_class,
    positions_from_mask,
    prepare_text,
    sdpa_attention_flags,
    split_heads,
)
from explain.errors import InputError, UnsupportedModelError
from explain.layout import FusedAttentionSite, FusedPath, ModuleHook, Prepared, TokenLayout
from explain.lrp import propagation as lrp
from explain.lrp.propagation import RuleSet
from explain.lrp.walk import (
    keep,
    lacks,
    logit_relevance,
    require_forward,
    require_linear,
    require_pass,
    type_name,
)
from explain.lrp.weights import used_weight
from explain.rules.fold import compute_dtype

__all__ = ["HFTextEncoder"]


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


class HFTextEncoder(HFAdapter):
    family = (
        "Hugging Face BERT, RoBERTa, XLM-RoBERTa, DistilBERT, ALBERT and ELECTRA "
        "(ForSequenceClassification: CLS readout; bare Model: mean-pooled sentence encoder)"
    )
    reads_text = True
    lrp_covers = "BertForSequenceClassification"

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

    def lrp_walk(self, *, to_input: bool) -> BertWalk:
        return BertWalk(self, to_input=to_input)

    def lrp_missing(self) -> str | None:
        return lacks(lambda: BertWalk.check(self.model))

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
        """BERT-style self-attention on the sdpa kernel (explain.engine.fused): q, k, v are the
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


# -- the LRP walk -------------------------------------------------------------------------

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


class BertWalk:
    """The LRP walk through Hugging Face `BertForSequenceClassification`, on the stock
    modules, in the order of the CVPR 2021 BERT reference's `relprop`
    (`HFTextEncoder.lrp_walk`).

    Per layer (post-LayerNorm BERT): the output add `LN(dense(inter) + ao)`, the
    intermediate GELU and dense, the branch at the attention output `ao`; then
    `LN(dense(o) + x)`, the attention products with the attention mask add (scores +
    mask) between them, the query/key/value projections and the two branch points of the
    reference, first the three projections' shared input, then that input shared with
    the residual. The head is the pooler (first token, dense, tanh) and the classifier.
    Full LRP stops at the embedding output, summed over the hidden size (the reference's
    text `lrp`).

    Raises:
        UnsupportedModelError for other families of the text adapter (their heads and
        layers differ) or a module on the path that no rule covers.
    """

    in_input_space = False  # full LRP ends at the tokens, which the adapter maps

    def __init__(self, adapter: HFTextEncoder, *, to_input: bool) -> None:
        model = adapter.model
        self.model = model
        self.check(model)
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

    @staticmethod
    def check(model: nn.Module) -> None:
        """Raise UnsupportedModelError unless the walk covers `model`: a BERT classifier
        whose every module on the path has a rule (`HFTextEncoder.lrp_missing`)."""
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
            relevance = rules.linear(self.head["pooled"], used_weight(model.classifier), relevance)
            relevance = rules.linear(
                self.head["first"], used_weight(model.bert.pooler.dense), relevance
            )
            relevance = lrp.select_tokens(tokens.to(dtype), 0, relevance)
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
        total = lrp.safe_denominator(mlp_branch.to(dtype) + ao)
        from_branch, from_ao = rules.residual(mlp_branch, ao, relevance, total, samples)
        inter = rules.linear(
            store["inter"].flatten(0, -2), used_weight(layer.output.dense), from_branch
        )
        into_ff = rules.linear(ao, used_weight(layer.intermediate.dense), inter)
        relevance = lrp.branch(ao, [into_ff, from_ao], lrp.safe_denominator(ao.to(dtype)))

        # BertSelfOutput: LN(dense(o) + x).
        total = lrp.safe_denominator(attn_branch.to(dtype) + x)
        from_attn, from_x = rules.residual(attn_branch, x, relevance, total, samples)
        dense = used_weight(layer.attention.output.dense)
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
            of_attention, _ = lrp.attention_probabilities(
                probabilities, by_head(store["v"]), relevance_o
            )
            report(index, of_attention.view(batch, heads, tokens, tokens))
            return None
        of_attention, of_heads = lrp.attention(
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
            [used_weight(getattr(self_attention, name)) for name in ("query", "key", "value")]
        )
        projections = rules.linear(x, weights, of_qkv.reshape(batch * tokens, -1))
        # The reference's two branch points: q/k/v share the attention's input, which the
        # layer shares with the residual.
        below = lrp.safe_denominator(x.to(dtype))
        return lrp.branch(x, [lrp.branch(x, [projections], below), from_x], below)
