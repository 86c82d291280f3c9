"""Explaining models with two token sets: dual encoders (CLIP) and encoder-decoders.

`Explainer.explain` hands such models here (their adapter's `token_sets`). The flow is
the one of a single stack, one recorder over every stack, one forward and one backward
per explained column, but the result has one relevance per token set:

- dual encoders: each tower gets the chosen method on its own (ICCV 2021 CLIP notebook),
  with its own readout (CLS / EOS) and start layer; relevances {"image", "text"};
- encoder-decoders: the two-set rules of explain.rules.coattention read out at the
  explained decoder position; relevances {"source", "target"}.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from explain.errors import OptionError, TargetError
from explain.explanation import Explanation
from explain.recorder import Recorder
from explain.rules import RuleContext, Sink, get_method
from explain.targets import Score, Target, resolve_targets

if TYPE_CHECKING:
    from explain.api import Explainer
    from explain.architectures.hf_clip import HFClip

__all__ = ["explain_dual_encoder", "explain_token_sets"]


def explain_token_sets(
    explainer: Explainer,
    inputs: Any,
    target: Target,
    method: str,
    score: Score,
    start_layer: int | Mapping[str, int] | None,
    options: dict[str, Any],
) -> Explanation:
    """Dispatch on the adapter's kind of token sets."""
    adapter = explainer.adapter
    if adapter.token_sets == "dual_encoder":
        return explain_dual_encoder(
            adapter, inputs, target, method, score, start_layer, options, explainer.tokenizer
        )
    raise OptionError(f"{adapter.family}: unknown token sets {adapter.token_sets!r}")


class _ByStack:
    """Routes the model-wide layers of each stack to that stack's sink, renumbered from 0."""

    def __init__(self, sinks: dict[str, Sink], layers: dict[str, range]) -> None:
        self._route = {
            layers[stack][local]: (sink, local)
            for stack, sink in sinks.items()
            for local in range(len(layers[stack]))
        }
        self.layers = sorted(
            layers[stack][local] for stack, sink in sinks.items() for local in sink.layers
        )

    def add(self, layer: int, attention: Tensor, gradient: Tensor | None) -> None:
        sink, local = self._route[layer]
        sink.add(local, attention, gradient)


def _per_tower(start_layer: int | Mapping[str, int] | None, stacks: tuple[str, ...]) -> dict:
    if isinstance(start_layer, Mapping):
        unknown = set(start_layer) - set(stacks)
        if unknown:
            raise OptionError(
                f"start_layer names unknown towers {sorted(unknown)}; the towers are "
                + ", ".join(stacks)
            )
        return {stack: start_layer.get(stack) for stack in stacks}
    return dict.fromkeys(stacks, start_layer)


def explain_dual_encoder(
    adapter: HFClip,
    inputs: Any,
    target: Target,
    method: str,
    score: Score,
    start_layer: int | Mapping[str, int] | None,
    options: dict[str, Any],
    tokenizer: Any = None,
) -> Explanation:
    """Image and text relevance for the similarity of each image with its text.

    The target chooses texts: None pairs image i with text i when there are as many texts
    as images, and otherwise explains each image's best-matching text (zero-shot
    classification over prompts); an int, B ints, a (B, K) tensor (K texts per image: the
    relevances get a K axis) or a callable on the (images, texts) similarity logits
    choose others. Every explained (image, text) pair is run as its own sample, so two
    images explained against the same text never share a gradient. Each tower's start
    layer defaults to its last block, as in the reference notebook: with every block,
    ViT-B/16 maps over-expand to the whole image.
    """
    from explain.api import resolve_start_layer

    spec = get_method(method)
    if score != "logit":
        raise TargetError(
            f"a dual encoder explains the similarity logit (score='logit'); got {score!r}"
        )
    prepared = adapter.prepare(inputs)
    num_images, num_texts = prepared.batch_size, adapter.num_texts(prepared)
    starts = _per_tower(start_layer, adapter.stacks)
    layers = {stack: adapter.stack_layers(stack) for stack in adapter.stacks}
    for stack in adapter.stacks:  # validate before any model work
        resolve_start_layer(spec, starts[stack], len(layers[stack]), stack)

    logits: Tensor | None = None
    if target is None and num_texts == num_images:
        classes = torch.arange(num_images)
    else:
        with Recorder(adapter, differentiable=False):
            logits = adapter.forward(prepared)
        classes, _ = resolve_targets(logits, target)
        if classes is None:
            raise TargetError(
                "a dual encoder's target chooses texts: a callable must return text indices"
            )
    columns = classes if classes.dim() == 2 else classes[:, None]
    image_index = torch.arange(num_images, device=columns.device).repeat_interleave(
        columns.shape[1]
    )
    pairs = adapter.pair(prepared, image_index, columns.reshape(-1))

    sinks: dict[str, Sink] = {}
    for stack in adapter.stacks:
        count = len(layers[stack])
        default = -1 if spec.default_start_layer is not None else None
        given = starts[stack] if starts[stack] is not None else default
        context = RuleContext(
            readout=adapter.stack_readout(pairs, stack),
            layout=adapter.layout(pairs, stack),
            num_layers=count,
            start_layer=resolve_start_layer(spec, given, count, stack),
        )
        sinks[stack] = spec.sink(context, options)
    router = _ByStack(sinks, layers)
    if spec.needs_gradients:
        with Recorder(adapter, track=router.layers) as recorder:
            pair_logits = adapter.forward(pairs)
            recorder.backward(pair_logits.diagonal().sum(), router.add)
    else:
        with Recorder(
            adapter,
            on_attention=lambda layer, attention: router.add(layer, attention, None),
            differentiable=False,
        ):
            pair_logits = adapter.forward(pairs)
    if logits is None:  # the pairs were the inputs as given: their logits are the model's
        logits = pair_logits

    relevances = {}
    for stack, sink in sinks.items():
        mapped = adapter.to_input_space(sink.result(), adapter.layout(pairs, stack)).detach()
        relevances[stack] = (
            mapped.reshape(num_images, columns.shape[1], *mapped.shape[1:])
            if classes.dim() == 2
            else mapped
        )
    tokens = None
    if tokenizer is not None and classes.dim() == 1:  # the tokens of each image's text
        tokens = [
            tokenizer.convert_ids_to_tokens(row.tolist()) for row in pairs.arguments["input_ids"]
        ]
    return Explanation(
        relevance=relevances["image"],
        logits=logits.detach(),
        target=classes.to(logits.device),
        method=spec.name,
        score=score,
        input_size=adapter.layout(pairs, "image").input_size,
        relevances=relevances,
        tokens=tokens,
    )
