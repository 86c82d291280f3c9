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

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Union

import torch
from torch import Tensor

from explain.errors import InputError, OptionError, TargetError, UnsupportedModelError
from explain.explanation import Explanation
from explain.recorder import Recorder
from explain.rules import RuleContext, Sink, get_method
from explain.rules.coattention import BlockRole, TwoSetFold
from explain.targets import Score, Target, check_score, resolve_targets, select_scores

if TYPE_CHECKING:
    from explain.api import Explainer
    from explain.architectures.dual_encoder import DualEncoder
    from explain.architectures.hf_seq2seq import HFEncoderDecoder

__all__ = [
    "Position",
    "explain_dual_encoder",
    "explain_encoder_decoder",
    "explain_token_sets",
    "generate_target",
]

Position = Union[None, int, Sequence[int], Tensor, Literal["all"]]
"""Which decoder position an encoder-decoder explanation reads out (it explains the token
predicted there, the next one): None = each sample's last real position, an int or B
ints, or "all": every token of the decoder sequence after the start token, column j
explaining token j + 1 from position j (by default as the target: the sequence's own
tokens, which for a generated sequence are the tokens the model chose)."""


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
    if get_method(method).gradient_rules is not None:
        raise UnsupportedModelError(
            f"method {method!r} has no rules for {adapter.family} yet; use generic, "
            "attention_gradcam, rollout, raw_attention or random"
        )
    if adapter.token_sets == "dual_encoder":
        return explain_dual_encoder(
            adapter, inputs, target, method, score, start_layer, options, explainer.tokenizer
        )
    if adapter.token_sets == "encoder_decoder":
        return explain_encoder_decoder(
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
    adapter: DualEncoder,
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
    layer defaults to its last block, as in the reference notebook, whose authors found
    that with every block the ViT-B/16 maps over-expand.
    """
    from explain.api import resolve_start_layer

    spec = get_method(method)
    if spec.lrp_rules is not None:
        raise OptionError(
            f"method {method!r} needs an LRP pass through the model, which CLIP's towers do "
            "not have; use generic, attention_gradcam, rollout, raw_attention or random"
        )
    if score != "logit":
        raise TargetError(
            f"a dual encoder explains the similarity logit (score='logit'); got {score!r}"
        )
    prepared = adapter.prepare(adapter.encode(inputs, tokenizer))
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
        tokens = adapter.token_strings(pairs.arguments[adapter.text_arguments[0]], tokenizer)
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


def _decoder_positions(position: Position, lengths: Tensor) -> tuple[Tensor, Tensor]:
    """(B, P) explained positions and (B, P) validity from each sample's decoder length."""
    batch = lengths.shape[0]
    if isinstance(position, str):
        if position != "all":
            raise OptionError(f"position must be an int, B ints, None or 'all'; got {position!r}")
        width = int(lengths.max()) - 1
        if width < 1:
            raise InputError("position='all' needs decoder sequences of at least two tokens")
        columns = torch.arange(width, device=lengths.device).expand(batch, width)
        valid = columns < (lengths - 1)[:, None]
        return torch.minimum(columns, (lengths - 1)[:, None]), valid
    if position is None:
        positions = lengths - 1
    else:
        if isinstance(position, bool):
            raise OptionError("position must be an int, B ints, None or 'all', not a bool")
        try:
            positions = torch.as_tensor(position, device=lengths.device).long().expand(batch)
        except (TypeError, ValueError, RuntimeError):
            raise OptionError(
                f"position must be an int, B = {batch} ints, None or 'all'; got {position!r}"
            ) from None
        positions = torch.where(positions < 0, positions + lengths, positions)
        if bool(((positions < 0) | (positions >= lengths)).any()):
            raise OptionError(
                f"position {position!r} is outside a decoder sequence (real lengths "
                f"{lengths.tolist()}); negative positions count from each sequence's end"
            )
    return positions[:, None], torch.ones(batch, 1, dtype=torch.bool, device=lengths.device)


def explain_encoder_decoder(
    adapter: HFEncoderDecoder,
    inputs: Any,
    target: Target,
    method: str,
    score: Score,
    start_layer: int | Mapping[str, int] | None,
    options: dict[str, Any],
    tokenizer: Any = None,
) -> Explanation:
    """Source and target relevance of the token predicted at a decoder position.

    One forward; one backward per explained position (the forward is reused), each folded
    with the encoder-decoder rules (explain.rules.coattention) over every block, and read
    out at the position: relevances["source"] = R_qi[p] over the encoder tokens (or the
    image patch grid), relevances["target"] = R_qq[p] over the decoder tokens. Options:
    `position` (see `Position`). The target is a token id: None = the predicted token
    (for position="all": the sequence's own next tokens), an int, B ints, a (B, P)
    tensor with position="all", or a callable on the (B, vocabulary) logits.
    """
    options = dict(options)
    position = options.pop("position", None)
    if options:
        raise OptionError(
            f"encoder-decoders take only the option 'position'; got {sorted(options)}"
        )
    if method != "generic":
        raise OptionError(
            "encoder-decoders are explained with the generic rule in its two-token-set form "
            f"(method='generic', ICCV 2021); got method={method!r}"
        )
    if start_layer is not None:
        raise OptionError("encoder-decoder relevance aggregates over every block: no start_layer")
    check_score(score)
    prepared = adapter.prepare(inputs)
    decoder_ids = prepared.arguments["decoder_input_ids"]
    lengths = prepared.arguments["decoder_attention_mask"].sum(dim=1)
    positions, valid = _decoder_positions(position, lengths)
    every = isinstance(position, str)  # "all" (anything else was refused above)
    if every and target is None:
        target = decoder_ids.gather(1, positions + 1)
    elif every and not callable(target):
        target = torch.as_tensor(target, device=decoder_ids.device)
        if target.dim() == 0:
            target = target.expand_as(positions)
        if target.shape != positions.shape:
            raise TargetError(
                f"with position='all' give one target token per sample and position, shape "
                f"{tuple(positions.shape)}; got {tuple(target.shape)}"
            )
    if every and isinstance(target, Tensor):  # past a sequence's end nothing is explained
        target = target.masked_fill(~valid, 0)
    roles = [
        BlockRole(site.layer, "i" if site.stack == "source" else "q", site.kind)
        for site in adapter.attention_sites()
    ]
    source_layout, target_layout = (adapter.layout(prepared, s) for s in adapter.stacks)
    rows = torch.arange(prepared.batch_size, device=positions.device)
    sources, targets, classes_per_column, logits_per_column = [], [], [], []
    with Recorder(adapter, track=range(len(roles))) as recorder:
        logits = adapter.forward(prepared)
        for column in range(positions.shape[1]):
            at = positions[:, column]
            column_logits = logits[rows, at]
            chosen = target[:, column] if every and isinstance(target, Tensor) else target
            classes, custom = resolve_targets(column_logits, chosen)
            if classes is not None and classes.dim() == 2:
                raise TargetError("one target token per explained position; got a (B, K) target")
            scores = custom if classes is None else select_scores(column_logits, classes, score)
            fold = TwoSetFold(roles, target_layout.num_tokens, source_layout.num_tokens)
            last = column == positions.shape[1] - 1
            recorder.backward(scores.sum(), fold.add, retain_graph=not last)
            state = fold.result()
            sources.append(state.qi[rows, at])
            targets.append(state.qq[rows, at])
            classes_per_column.append(
                torch.full_like(at, -1) if classes is None else classes.to(at.device)
            )
            logits_per_column.append(column_logits.detach())
    keep = valid.to(sources[0].dtype)[..., None]
    source = adapter.to_input_space(torch.stack(sources, dim=1) * keep, source_layout)
    target_relevance = adapter.to_input_space(torch.stack(targets, dim=1) * keep, target_layout)
    classes = torch.stack(classes_per_column, dim=1).masked_fill(~valid, -1)
    explained_logits = torch.stack(logits_per_column, dim=1)
    if not every:  # one position: no position axis
        source, target_relevance = source[:, 0], target_relevance[:, 0]
        classes, explained_logits = classes[:, 0], explained_logits[:, 0]
    tokens = None
    if tokenizer is not None and "input_ids" in prepared.arguments:
        tokens = [
            tokenizer.convert_ids_to_tokens(r.tolist()) for r in prepared.arguments["input_ids"]
        ]
    relevances = {"source": source.detach(), "target": target_relevance.detach()}
    return Explanation(
        relevance=relevances["source"],
        logits=explained_logits,
        target=classes,
        method="generic",
        score=score,
        input_size=source_layout.input_size,
        relevances=relevances,
        tokens=tokens,
    )


def generate_target(explainer: Explainer, inputs: Any, max_new_tokens: int = 20) -> dict[str, Any]:
    """`inputs` with the decoder sequence the model generates for them (greedy): adds
    decoder_input_ids and decoder_attention_mask (real up to the first end token).

    Generation runs inside a recorder that computes nothing: the model is in eval mode,
    the RNG is forked and everything is restored afterwards, as for an explanation.
    """
    adapter = explainer.adapter
    if adapter.token_sets != "encoder_decoder":
        raise OptionError(f"{adapter.family}: generate_target is for encoder-decoder models")
    source = {k: v for k, v in dict(inputs).items() if not k.startswith("decoder_")}
    model = adapter.model
    with Recorder(adapter, differentiable=False):
        sequences = model.generate(**source, max_new_tokens=max_new_tokens, do_sample=False)
    eos = model.generation_config.eos_token_id
    eos_ids = torch.as_tensor([] if eos is None else eos, device=sequences.device).flatten()
    is_end = torch.isin(sequences, eos_ids)
    is_end[:, 0] = False  # the start token may share the end token's id (Marian, GPT-2)
    after_end = (is_end.long().cumsum(dim=1) - is_end.long()) > 0
    return {
        **inputs,
        "decoder_input_ids": sequences,
        "decoder_attention_mask": (~after_end).long(),
    }
