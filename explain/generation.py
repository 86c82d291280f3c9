"""Generating text, and explaining what a decoder-only language model generates.

`generate` runs the model's own `generate` on prompts (texts, a tokenized batch, or chat
conversations put through the tokenizer's chat template) without leaving a trace on the
model: it runs inside a session (modes and the global RNG restored afterwards, no cache
outliving the call) on the model's own attention path, since nothing is recorded: its
tokens are those of the model's own generate. `explain_generation` then
explains every generated token from ONE forward pass over prompt + continuation: column g
of the (B, G, T) relevance reads out at position P + g - 1 (P: the padded prompt width)
and explains the token generated at P + g over everything before it, exactly what a
next-token explanation of the prefix would give. The explanation runs on the engine
(explain.engine, `Request.prompt_length` -> `GenerationPlan`): one batched backward
differentiates all columns; forward-only methods fold every column from the same attention maps.
A vision-language model's answer about an image is explained the same way, over the image
and the prompt (explain.engine.plans.image_text).

`GenerationExplanation.answer` is what every view of one continuation shows (the
terminal, page and figure of `explain generate`): its tokens, special ones included, and
for each generated token the tokens it rests on (explain.viz.ranking: by |relevance|,
the token it is read out at left out).

`generate_target` generates an encoder-decoder's target sequence for its sources, to be
explained position by position (`position="all"`) like any encoder-decoder input.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import warnings
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from explain import engine
from explain.api import Explainer
from explain.architectures.base import EncoderDecoder, refuse_meta_inputs
from explain.architectures.hf_registries import finite_eager_masks
from explain.architectures.hf_vision_language import VisionLanguageModel
from explain.defaults import DefaultMethod, default_method
from explain.engine import Request, require_causal_lm
from explain.engine.session import Session
from explain.engine.targets import Score
from explain.errors import InputError, OptionError
from explain.explanation import Explanation
from explain.inputs import is_raw_text
from explain.viz.ranking import rests_on

__all__ = [
    "Answer",
    "Generation",
    "GenerationExplanation",
    "Prompt",
    "explain_generation",
    "generate",
    "generate_target",
    "generation_default",
    "is_chat",
    "rests_on",
]

Message = Mapping[str, str]
Prompt = str | Sequence[str] | Sequence[Message] | Sequence[Sequence[Message]] | Mapping[str, Any]
"""A text, texts, one chat conversation (a list of {"role", "content"} messages), several
conversations, or a tokenized batch (input_ids and attention_mask, padded on the left)."""


@dataclasses.dataclass(frozen=True)
class Generation:
    """Prompts and their generated continuations, ready to be explained.

    Attributes:
        input_ids: (B, T) the left-padded prompts (columns 0..P-1) followed by the
            continuations (columns P..T-1).
        attention_mask: (B, T) 1 at real tokens; 0 at the prompts' padding and after
            each continuation's end token (the end token itself is real).
        prompt_length: P, the padded width of the prompts.
        extra: the model's other inputs for the whole sequences (a vision-language
            model's `pixel_values`, and its `token_type_ids` along prompt and answer; for
            Idefics3 and SmolVLM also `rows` and `cols`, the photos' tile layout).
    """

    input_ids: Tensor
    attention_mask: Tensor
    prompt_length: int
    extra: Mapping[str, Tensor] = dataclasses.field(default_factory=dict)

    @property
    def generated(self) -> Tensor:
        """(B, G) bool: which generated positions hold a real token."""
        return self.attention_mask[:, self.prompt_length :].bool()

    def inputs(self) -> dict[str, Tensor]:
        """The whole sequences as a tokenized batch (with the model's other inputs)."""
        return {"input_ids": self.input_ids, "attention_mask": self.attention_mask, **self.extra}


@dataclasses.dataclass(frozen=True)
class Answer:
    """One prompt's continuation as every view of it shows it: `explain generate`'s
    terminal lines, its page and its figure say the same thing from this.

    Attributes:
        tokens: the prompt's tokens without its padding, then the generated ones up to
            and including the end token. Special tokens the model wrote (an end token,
            a tile marker) are kept, in every view: each was generated and explained.
        prompt_length: how many of `tokens` are the prompt.
        relevance: (G, len(tokens)) row g: every token's relevance for generated token
            g (a vision-language model's: over the text, image tokens 0).
        ids: the G generated token ids.
    """

    tokens: list[str]
    prompt_length: int
    relevance: Tensor
    ids: list[int]

    @property
    def generated(self) -> list[str]:
        """The G generated tokens."""
        return self.tokens[self.prompt_length :]

    def readout(self, g: int) -> int:
        """The position generated token g is read out at: the one just before it."""
        return self.prompt_length + g - 1

    def rests_on(self, g: int, count: int = 3) -> list[int]:
        """The positions (in `tokens`) generated token g rests on most, by |relevance|
        (explain.viz.ranking.rests_on: the one ranking every view shows)."""
        return rests_on(self.relevance[g], self.readout(g), count)

    def text(self, tokenizer: Any) -> str:
        """The generated tokens as text, special tokens kept as every view shows them."""
        return tokenizer.decode(self.ids, skip_special_tokens=False)


@dataclasses.dataclass(frozen=True)
class GenerationExplanation:
    """`explanation.relevance` (B, G, T): row g is the relevance of every token for the
    token generated at position P + g (zero from P + g on, and zero on rows past a
    continuation's end); `explanation.target` (B, G) the generated tokens (-1 past the
    end); `explanation.logits` (B, G, vocab) the logits each was chosen from."""

    explanation: Explanation
    generation: Generation

    def answer(self, sample: int = 0) -> Answer:
        """Sample `sample`'s continuation as the views show it (see `Answer`); needs the
        token strings, which an Explainer with a tokenizer gives."""
        tokens = self.explanation.tokens
        if tokens is None:
            raise InputError("the explanation has no tokens: create the Explainer with a tokenizer")
        generation = self.generation
        width = generation.prompt_length
        count = int(generation.generated[sample].sum())
        first = int((~generation.attention_mask[sample, :width].bool()).sum())  # left pads
        relevance = self.explanation.relevances.get("text", self.explanation.relevance)
        return Answer(
            tokens=list(tokens[sample][first : width + count]),
            prompt_length=width - first,
            relevance=relevance[sample, :count, first : width + count],
            ids=generation.input_ids[sample, width : width + count].tolist(),
        )

    def to_captum(self, sample: int = 0) -> Any:
        """Sample `sample`'s continuation as captum's `LLMAttributionResult`, for captum's
        `plot_token_attr` and `plot_seq_attr` (needs the `captum` extra).

        `input_tokens` are `answer(sample).tokens` (the prompt without its padding, then
        the generated tokens), `output_tokens` the generated ones, `token_attr` the
        answer's (G, len(tokens)) relevance unchanged, `seq_attr` its sum over the
        generated tokens, `output_probs` each generated token's probability under the
        logits it was chosen from (explain.bridges.captum_results)."""
        from explain.bridges.captum_results import llm_attribution_result

        answer = self.answer(sample)
        return llm_attribution_result(
            answer.tokens, answer.generated, answer.relevance, self._probabilities(sample)
        )

    def to_inseq(self) -> Any:
        """Every continuation as inseq's `FeatureAttributionOutput`, one sequence per
        prompt, for inseq's `.show()`, `.aggregate()` and JSON `save` / `load` (needs the
        `inseq` extra).

        Sequence b's `target` is `answer(b).tokens` with their ids, its `source` the
        prompt's; `target_attributions` (len(tokens), G) is the answer's relevance
        transposed, every value unchanged, NaN where inseq writes it: from each
        generated token on, which it does not read (explain.bridges.inseq_results)."""
        from explain.bridges.inseq_results import (
            feature_attribution_output,
            sequence_attribution,
        )

        sequences = []
        for sample in range(len(self.generation.input_ids)):
            answer = self.answer(sample)
            end = self.generation.prompt_length + len(answer.ids)
            ids = self.generation.input_ids[sample, end - len(answer.tokens) : end].tolist()
            probabilities = self._probabilities(sample)
            sequences.append(
                sequence_attribution(
                    answer.tokens, ids, answer.prompt_length, answer.relevance, probabilities
                )
            )
        explanation = self.explanation
        info = {
            "attribution_method": explanation.method,
            "attributed_fn": explanation.score,
            "step_scores": ["probability"],
            "explain_settings": dict(explanation.settings),
        }
        return feature_attribution_output(sequences, info)

    def _probabilities(self, sample: int) -> Tensor:
        """(G,) each of sample `sample`'s generated tokens' probability under the logits
        it was chosen from, up to its continuation's end."""
        count = int(self.generation.generated[sample].sum())
        probabilities = self.explanation.logits[sample, :count].float().softmax(dim=-1)
        return probabilities.gather(-1, self.explanation.target[sample, :count, None])[:, 0]


def is_chat(prompt: object) -> bool:
    """One conversation (a list of messages with "role" and "content") or several."""
    if not isinstance(prompt, Sequence) or isinstance(prompt, str) or not prompt:
        return False
    first = prompt[0]
    if isinstance(first, Sequence) and not isinstance(first, str):
        return bool(first) and all(is_chat(conversation) for conversation in prompt)
    return all(isinstance(m, Mapping) and {"role", "content"} <= set(m) for m in prompt)


def _tokenize(tokenizer: Any, prompt: Prompt) -> dict[str, Tensor]:
    """Texts or conversations as a left-padded batch (generation appends on the right)."""
    if tokenizer is None:
        raise InputError(
            "texts and chats need a tokenizer: Explainer(model, tokenizer=tokenizer), or "
            "pass a tokenized batch (input_ids, attention_mask)"
        )
    special = True
    if is_chat(prompt):
        if getattr(tokenizer, "chat_template", None) is None:
            raise InputError(
                "this tokenizer has no chat template: pass the conversation as plain text, "
                "or use the instruct model's own tokenizer"
            )
        first = prompt[0]  # type: ignore[index]
        conversations = [prompt] if isinstance(first, Mapping) else list(prompt)  # type: ignore[arg-type]
        _check_messages(conversations)
        prompt = [
            tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=False)
            for c in conversations
        ]
        special = False  # the template writes the special tokens itself
    if not is_raw_text(prompt):
        raise InputError(
            "a prompt is a text, a list of texts, a chat (a list of {'role', 'content'} "
            f"messages) or a tokenized batch; got {type(prompt).__name__}"
        )
    texts = [prompt] if isinstance(prompt, str) else list(prompt)  # type: ignore[arg-type]
    if any(not text.strip() for text in texts):
        raise InputError("a prompt is empty: there is nothing to continue")
    encoded = tokenizer(
        texts,
        padding=True,
        padding_side="left",
        add_special_tokens=special,
        return_tensors="pt",
    )
    return {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]}


def _check_messages(conversations: Sequence[Sequence[Message]]) -> None:
    """Every message's role and content are text (a template would print None as "None")."""
    for c, conversation in enumerate(conversations):
        for m, message in enumerate(conversation):
            for key in ("role", "content"):
                if not isinstance(message[key], str):
                    raise InputError(
                        f"message {m} of conversation {c} has {key} {message[key]!r}; the "
                        f"{key} of a chat message is text"
                    )


_SET_HERE = ("input_ids", "inputs", "attention_mask", "max_new_tokens", "pad_token_id")
"""`model.generate` arguments that `generate` gives itself."""


def _check_options(model: Any, options: Mapping[str, Any], inputs: Collection[str]) -> None:
    """Refuse generation options that would fail inside transformers or change what a
    Generation holds: one continuation per prompt, from the prompt as given (`inputs`:
    the model inputs besides the ids and mask that the prompt brings, e.g. pixels)."""
    given = sorted(set(options) & {*_SET_HERE, *inputs})
    if given:
        raise OptionError(
            f"generate sets {', '.join(given)} itself: pass the prompt as `prompt` and the "
            "length as `max_new_tokens`"
        )
    if options.get("num_return_sequences", 1) != 1:
        raise OptionError(
            "generate makes one continuation per prompt (num_return_sequences=1); to get "
            "several, repeat the prompt in the batch with do_sample=True"
        )
    known = set(model.generation_config.to_dict()) | set(
        inspect.signature(model.generate).parameters
    )
    unknown = sorted(key for key in options if key not in known)
    if unknown:
        raise OptionError(
            f"unknown generation option {', '.join(map(repr, unknown))}; generate takes the "
            "options of transformers' GenerationConfig (do_sample, temperature, top_k, ...)"
        )


def _end_mask(sequences: Tensor, prompt_length: int, end_ids: Tensor) -> Tensor:
    """(B, G) 1 up to and including each continuation's first end token, 0 after it."""
    continuation = sequences[:, prompt_length:]
    is_end = torch.isin(continuation, end_ids).long()
    return ((is_end.cumsum(dim=1) - is_end) == 0).long()


def generate(
    explainer: Explainer, prompt: Prompt, max_new_tokens: int = 20, **options: Any
) -> Generation:
    """Continue `prompt` with the model's own `generate` (greedy unless `options` say
    otherwise, e.g. do_sample=True), leaving the model and the global RNG as found.

    A vision-language model takes an image prompt (an image with a question, or a chat
    with image entries) through its processor, the Explainer's tokenizer, or the
    processor's output (explain.architectures.hf_vision_language)."""
    adapter = require_causal_lm(explainer.adapter)
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int):
        raise OptionError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
    if max_new_tokens < 1:
        raise OptionError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    refuse_meta_inputs(prompt)
    if adapter.reads_images:
        encoded = adapter.encode(prompt, explainer.tokenizer)
    elif isinstance(prompt, Mapping):
        encoded = prompt
    else:
        encoded = _tokenize(explainer.tokenizer, prompt)
    prepared = adapter.prepare(encoded)
    extra = {
        name: value
        for name, value in prepared.arguments.items()
        if name not in ("input_ids", "attention_mask", "position_ids")
    }
    mask = prepared.arguments["attention_mask"]
    if not bool(mask[:, -1].all()):
        raise InputError(
            "the prompts are padded on the right; generation appends on the right, so pad "
            "them on the left: tokenizer(texts, padding=True, padding_side='left')"
        )
    model = adapter.model
    _check_options(model, options, extra)
    limit = getattr(adapter, "max_tokens", None)
    if limit is not None and mask.shape[1] + max_new_tokens > limit:
        room = limit - mask.shape[1]
        if room < 1:
            raise InputError(
                f"the prompt fills the model's {limit} positions: there is no room to "
                "generate; shorten it"
            )
        warnings.warn(
            f"generating at most {room} tokens, not {max_new_tokens}: the model takes "
            f"{limit} positions and the prompt uses {mask.shape[1]}",
            stacklevel=2,
        )
        max_new_tokens = room
    config = model.generation_config
    end = config.eos_token_id
    end_ids = torch.as_tensor([] if end is None else end, device=mask.device).flatten()
    pad = config.pad_token_id
    if pad is None:
        pad = int(end_ids[0]) if len(end_ids) else 0
    options = {"do_sample": False, **options}
    if isinstance(adapter, VisionLanguageModel):
        # An image placeholder in the answer would be read as an image by the explained
        # forward: the model may not write one.
        options = {"suppress_tokens": [adapter.image_token_id], **options}
    held = adapter.generating() if isinstance(adapter, VisionLanguageModel) else None
    inputs = adapter.model_arguments(extra) if isinstance(adapter, VisionLanguageModel) else extra
    # Nothing is recorded: the model generates on its own attention path, as its own
    # generate would, with finite eager masks (a float64 model on eager attention
    # otherwise continues a left-padded prompt with NaN logits, read as pad tokens).
    with (
        Session(adapter, own_path=True),
        finite_eager_masks(),
        held or contextlib.nullcontext(),
    ):
        try:
            sequences = model.generate(
                input_ids=prepared.arguments["input_ids"],
                attention_mask=mask,
                max_new_tokens=max_new_tokens,
                pad_token_id=pad,
                **inputs,
                **options,
            )
        except ValueError as error:  # transformers' own check of the options' values
            raise OptionError(f"bad generation options {dict(options)}: {error}") from None
    prompt_length = mask.shape[1]
    if isinstance(adapter, VisionLanguageModel):  # token types run along the answer too
        extra = adapter.continued(extra, sequences.shape[1] - prompt_length)
    continuation = _end_mask(sequences, prompt_length, end_ids).to(mask.dtype)
    return Generation(
        input_ids=sequences,
        attention_mask=torch.cat([mask, continuation], dim=1),
        prompt_length=prompt_length,
        extra=extra,
    )


def generation_default(explainer: Explainer) -> DefaultMethod:
    """The method an explanation of a generation (explain_generation, explain.cite) runs
    when it names none: the default of the model's kind, for generations
    (explain.defaults)."""
    return default_method(explainer.adapter, Request(prompt_length=1))


def explain_generation(
    explainer: Explainer,
    prompt: Prompt | Generation,
    max_new_tokens: int = 20,
    method: str | None = None,
    score: Score | None = None,
    start_layer: int | None = None,
    **options: Any,
) -> GenerationExplanation:
    """Generate a continuation of `prompt` (or take a `Generation`) and explain every
    generated token over the prompt and the tokens before it (see the module doc).

    Args:
        explainer: an Explainer of a decoder-only language model (with its tokenizer for
            texts and chats); its attention_path and memory_budget apply.
        prompt: see `Prompt`, or a `Generation` from `generate` to explain as it is.
        max_new_tokens: the most tokens to generate (ignored for a `Generation`).
        method, score, start_layer, options: as for `Explainer.explain`, under the same
            rules (None: the model kind's default method; only the methods that
            differentiate a score take one; the LRP methods are refused for generations).
    """
    adapter = require_causal_lm(explainer.adapter)
    method = generation_default(explainer).method if method is None else method
    generation = (
        prompt if isinstance(prompt, Generation) else generate(explainer, prompt, max_new_tokens)
    )
    request = Request(
        method=method,
        score=score,
        start_layer=start_layer,
        options=options,
        attention_path=explainer.attention_path,
        memory_budget=explainer.memory_budget,
        prompt_length=generation.prompt_length,
    )
    explanation = engine.explain(adapter, generation.inputs(), request, explainer.tokenizer)
    return GenerationExplanation(explanation=explanation, generation=generation)


def generate_target(explainer: Explainer, inputs: Any, max_new_tokens: int = 20) -> dict[str, Any]:
    """`inputs` with the decoder sequence the model generates for them (greedy): adds
    decoder_input_ids and decoder_attention_mask (real up to the first end token).

    Generation runs inside a session on the model's own attention path: the model is in
    eval mode, the RNG is forked and everything is restored afterwards, as for an
    explanation.
    """
    adapter = explainer.adapter
    if not isinstance(adapter, EncoderDecoder):
        raise OptionError(f"{adapter.family}: generate_target is for encoder-decoder models")
    source = {k: v for k, v in dict(inputs).items() if not k.startswith("decoder_")}
    model = adapter.model
    with Session(adapter, own_path=True):
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
