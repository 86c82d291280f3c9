"""The public verbs: `Explainer.explain` (relevance maps) and `Explainer.trace` (raw
tensors), thin fronts that build one `Request` for the engine (explain.engine)."""

from __future__ import annotations

from typing import Any

from torch import nn

from explain import engine
from explain.architectures import Adapter, adapter_for
from explain.architectures.custom import TransformerSpec
from explain.architectures.wrappers import runnable
from explain.defaults import DefaultMethod, default_method
from explain.engine import Request, StartLayer, check_tokenizer, resolve_start_layer
from explain.engine.fused import ATTENTION_PATHS, AttentionPath
from explain.engine.targets import Score, Target
from explain.errors import OptionError
from explain.explanation import Explanation, Trace
from explain.rules import get_method

__all__ = ["Explainer", "explain", "resolve_start_layer"]


class Explainer:
    """Explains the predictions of one model. Constructing it does not touch the model.

    Args:
        model: a supported transformer (see `explain.architectures.supported_families()`),
            used as it is: no copy, no wrapper. Every call leaves it exactly as it was.
            Also a transformers pipeline (its model) or a SentenceTransformer (its
            encoder, read out by its pooling), see docs/wrappers.md, an nnsight model
            (the module it wraps) or a TransformerLens TransformerBridge (the Hugging
            Face model it wraps), see docs/bridges.md.
        tokenizer: for text models, the tokenizer whose tokens `Explanation.tokens` names
            (and that encodes raw texts); a model that reads no text refuses one. None
            takes a pipeline's tokenizer (its processor for a vision-language model), a
            SentenceTransformer's tokenization, prompt included, and an nnsight model's
            or a TransformerBridge's tokenizer.
        attention_path: "auto" (default) keeps the fused attention kernel where that is
            faster and recomputes each block's attention from q, k, v (explain.engine.fused);
            "explicit" or "fused" force one path. Both give the same numbers. Each result
            records the path it took in `Explanation.settings["attention_path"]`.
        memory_budget: bytes the attention maps may take: "auto" keeps the explicit path
            only where its maps fit, and the fused path folds the blocks in chunks of
            that size (README, "Attention paths"); integrated gradients and occlusion run
            as many copies of the inputs per forward as fit in it. None: half the free
            memory of a CUDA device, a quarter of the available RAM (at most 1 GiB)
            elsewhere.
        spec: for a transformer of your own (no supported family): its blocks, attention
            probabilities and readout, see `explain.TransformerSpec` and
            docs/custom-models.md.

    DataParallel, DistributedDataParallel, torch.compile and PEFT wrappers are looked
    through: the wrapped model is explained. accelerate's dispatched and offloaded models
    and weight-only quantised models explain as they run (docs/wrappers.md).
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        tokenizer: Any = None,
        attention_path: AttentionPath = "auto",
        memory_budget: int | None = None,
        spec: TransformerSpec | None = None,
    ) -> None:
        if attention_path not in ATTENTION_PATHS:
            raise OptionError(
                f"attention_path must be one of {', '.join(ATTENTION_PATHS)}; "
                f"got {attention_path!r}"
            )
        model, brought = runnable(model)
        self.model = model
        self.adapter: Adapter = adapter_for(model) if spec is None else spec.adapter(model)
        if tokenizer is None:  # what a pipeline, a SentenceTransformer, nnsight or a bridge brings
            reads = ("processor", "tokenizer") if self.adapter.reads_images else ("tokenizer",)
            found = [brought[name] for name in reads if brought.get(name) is not None]
            tokenizer = found[0] if found and self.adapter.reads_text else None
        check_tokenizer(self.adapter, tokenizer)
        self.tokenizer = tokenizer
        self.attention_path: AttentionPath = attention_path
        if memory_budget is not None and (
            isinstance(memory_budget, bool)
            or not isinstance(memory_budget, int)
            or memory_budget <= 0
        ):
            raise OptionError(
                f"memory_budget must be a positive number of bytes; got {memory_budget!r}"
            )
        self.memory_budget = memory_budget

    @property
    def default_method(self) -> DefaultMethod:
        """The method `explain` runs when it names none: the default of the model's kind
        (explain.defaults; docs/methods.md, "Default method per model kind"), with
        the measurement that chose it."""
        return default_method(self.adapter)

    def explain(
        self,
        inputs: Any,
        target: Target = None,
        method: str | None = None,
        score: Score | None = None,
        start_layer: StartLayer = None,
        **options: Any,
    ) -> Explanation:
        """Relevance of every input element for the target class of each sample.

        Args:
            inputs: images (B, C, H, W), or a tokenizer's output for text models; with
                a tokenizer, also a text or a list of texts (see explain.inputs.encode).
            target: None (predicted class), an int, B ints, a (B, K) tensor of K classes
                per input (the relevance gets a K axis), or a callable on the output.
            method: a name from `explain.METHODS`; None: the default of the model's
                kind, chosen by measurement (`default_method`; docs/methods.md, "Default
                method per model kind").
            score: what the methods that differentiate a score (those with attention
                gradients) differentiate: "logit" (None: the default, as in the papers),
                "probability" or "log_probability". The others take no score, as the
                methods that read one fixed block take no start_layer: a class-agnostic
                map is the same for every score and an LRP walk starts from the logit
                (`Explanation.score` then says "logit"); so does a target callable that
                returns the scores itself.
            start_layer: first block to aggregate over (methods that aggregate); negative
                values count from the end. None uses the method's default (a dual
                encoder's towers: their last block). Also one per token set by name, e.g.
                {"image": s, "text": s} for CLIP's towers.
            **options: method options, e.g. rollout's `head_fusion`, `discard_ratio`;
                encoder-decoders take `position` (see docs/multimodal.md).

        Returns:
            An `Explanation`; its tensors are detached and on the model's device.
        """
        method = self.default_method.method if method is None else method
        get_method(method)  # a name, checked before the inputs are
        request = Request(
            method=method,
            target=target,
            score=score,
            start_layer=start_layer,
            options=options,
            attention_path=self.attention_path,
            memory_budget=self.memory_budget,
        )
        return engine.explain(self.adapter, inputs, request, self.tokenizer)

    def trace(self, inputs: Any, target: Target = None, score: Score | None = None) -> Trace:
        """Every block's attention and hidden states with their gradients for one score.

        The gradients are those of `sum_b score_b`, where score_b is the chosen score
        (None: the probability) of sample b's target class; samples do not interact,
        so each sample's slice is the gradient of its own score. See docs/gradients.md.
        Inputs and targets follow exactly the rules of `explain` (a dual encoder pairs
        image i with text i and traces their similarity logit, its only score; an
        encoder-decoder traces the token predicted at each sample's
        last real decoder position), and so does the Explainer's attention_path.
        """
        request = Request(
            method=None,
            target=target,
            score=score,
            attention_path=self.attention_path,
            memory_budget=self.memory_budget,
        )
        return engine.trace(self.adapter, inputs, request, self.tokenizer)


def explain(model: nn.Module, inputs: Any, **kwargs: Any) -> Explanation:
    """One-shot form of `Explainer(model).explain(inputs, **kwargs)` (`tokenizer`, `spec`,
    `attention_path` and `memory_budget` go to the Explainer)."""
    names = ("tokenizer", "spec", "attention_path", "memory_budget")
    settings = {name: kwargs.pop(name) for name in names if name in kwargs}
    return Explainer(model, **settings).explain(inputs, **kwargs)
