"""Explaining generations: every generated token's relevance, from one forward over prompt
+ continuation, equals the next-token explanation of the prefix before it."""

from __future__ import annotations

import copy
import functools

import pytest
import reference_hf as ref
import torch
from conftest import float32_atol
from tolerances import assert_float32_close
from transformers.masking_utils import AttentionMaskInterface, eager_mask

from explain import Explainer, InputError, OptionError, engine
from explain.generation import Generation, explain_generation, generate, is_chat
from explain.testing import ModelState, tiny_lm

PROMPTS = [[4, 14, 7, 33, 9], [4, 41], [4, 5, 17]]
NEW = 4
FLOAT32_SOFTMAX = {"llama", "gemma2"}
"""The families whose eager attention transformers computes with a float32 softmax even
for a float64 model: their maps carry float32 rounding, which depends on a row's length
(its padding) on some CPUs' vector units, so their float64 comparisons of maps that run
through it hold at float32's share (tolerances.assert_float32_close); gpt2's eager
softmax keeps the model's dtype, so it is compared to the last digits."""


@functools.cache
def _model(family: str):
    return tiny_lm.tiny_causal_lm(family)


def _generation(model, end: bool = False) -> Generation:
    """The model's greedy continuation of PROMPTS; with `end`, the second text's second
    generated token is declared the end token, so that its continuation stops there."""
    explainer = Explainer(model)
    generation = generate(explainer, ref.padded_batch(PROMPTS, "left"), max_new_tokens=NEW)
    if not end:
        return generation
    ids = generation.input_ids.clone()
    width = generation.prompt_length
    mask = generation.attention_mask.clone()
    mask[1, width + 2 :] = 0
    ids[1, width + 2 :] = 0
    return Generation(ids, mask, width)


def _next_token_methods() -> list[str]:
    """Every method a next-token explanation of a decoder-only language model takes, but
    those whose noise depends on the whole input (a prefix is shorter): the chance
    baseline's shape and SmoothGrad's range (docs/methods.md, "The noise")."""
    adapter = Explainer(_model("llama")).adapter
    noisy = {"random", "smoothgrad"}
    return [name for name in engine.supported_methods(adapter) if name not in noisy]


def _check_columns(
    explainer, generation, method, rtol, atol, *, float32=False, float32_softmax=False
) -> None:
    """Every column of the generation's explanation against its prefix's explanation
    (`float32`: at conftest.float32_atol; `float32_softmax`: a float64 model whose eager
    softmax rounds in float32, at float32's share, `FLOAT32_SOFTMAX`)."""
    result = explain_generation(explainer, generation, method=method).explanation
    width, total = generation.prompt_length, generation.input_ids.shape[1]
    batch = generation.input_ids.shape[0]
    assert result.relevance.shape == (batch, total - width, total)
    assert result.logits.shape == (batch, total - width, tiny_lm.VOCAB)
    for g in range(total - width):
        at = width + g
        prefix = {
            "input_ids": generation.input_ids[:, :at],
            "attention_mask": generation.attention_mask[:, :at],
        }
        expected = explainer.explain(
            prefix, target=generation.input_ids[:, at], method=method
        ).relevance
        real = generation.generated[:, g]
        scaled = float32_atol(method, expected, atol) if float32 else atol
        if float32_softmax:
            assert_float32_close(result.relevance[real, g, :at], expected[real])
        else:
            torch.testing.assert_close(
                result.relevance[real, g, :at], expected[real], rtol=rtol, atol=scaled
            )
        assert (result.relevance[:, g, at:] == 0).all()  # nothing after the explained token
        assert (result.relevance[~real, g] == 0).all()  # past a continuation's end
        assert (result.target[real, g] == generation.input_ids[real, at]).all()
        assert (result.target[~real, g] == -1).all()
    assert (
        result.relevance[~generation.attention_mask.bool()[:, None].expand_as(result.relevance)]
        == 0
    ).all()


@pytest.mark.parametrize("method", _next_token_methods())
@pytest.mark.parametrize("family", ["llama", "gemma2", "gpt2"])
def test_every_generated_token_equals_the_next_token_explanation(family, method):
    """Column g of a generation's relevance is the next-token explanation of the prefix
    that generated token g, for every method the prefix's explanation takes (AttnLRP and
    CP-LRP included: one batched backward to the embeddings serves every column), with
    prompts padded on the left and a continuation that ends early."""
    model = _model(family)
    _check_columns(Explainer(model), _generation(model, end=True), method, 1e-4, 1e-6, float32=True)


@pytest.mark.parametrize("method", _next_token_methods())
@pytest.mark.parametrize("family", ["llama", "gemma2", "gpt2"])
def test_generated_tokens_equal_their_prefixes_in_float64(family, method):
    """The same to the last digits in float64 (at float32's share for `FLOAT32_SOFTMAX`),
    with prompts padded on the left (the eager masks kept finite where transformers' eager
    softmax reads them in float32)."""
    model = _model(family)
    generation = generate(Explainer(model), ref.padded_batch(PROMPTS, "left"), max_new_tokens=NEW)
    mask = generation.attention_mask.clone()
    mask[1, generation.prompt_length + 2 :] = 0  # the second continuation ends early
    ids = generation.input_ids.masked_fill(mask == 0, 0)
    generation = Generation(ids, mask, generation.prompt_length)
    double = copy.deepcopy(model).to(torch.float64)
    # The explicit path on both sides: "auto" streams a generation's columns from maps
    # recomputed in float64, while the eager maps' softmax runs in float32 (transformers).
    explicit = Explainer(double, attention_path="explicit")
    float32_softmax = family in FLOAT32_SOFTMAX
    _check_columns(explicit, generation, method, 1e-10, 1e-13, float32_softmax=float32_softmax)


def test_a_generation_takes_a_score_as_explain_does():
    """The engine's score rule: a method that differentiates a score explains the chosen
    one at every generated position, as a next-token explanation of the prefix would."""
    model = _model("llama")
    explainer = Explainer(model)
    generation = _generation(model, end=True)
    result = explain_generation(explainer, generation, score="probability").explanation
    assert result.score == "probability"
    width, total = generation.prompt_length, generation.input_ids.shape[1]
    for g in range(total - width):
        at, real = width + g, generation.generated[:, g]
        prefix = {
            "input_ids": generation.input_ids[:, :at],
            "attention_mask": generation.attention_mask[:, :at],
        }
        expected = explainer.explain(
            prefix, target=generation.input_ids[:, at], score="probability"
        ).relevance
        torch.testing.assert_close(
            result.relevance[real, g, :at], expected[real], rtol=1e-4, atol=1e-6
        )
    logit = explain_generation(explainer, generation).explanation
    assert logit.score == "logit"
    assert not torch.allclose(logit.relevance, result.relevance)


def test_the_engines_option_rules_hold_for_generations():
    """No option is accepted and ignored: the engine refuses, before any model work on
    the generation, what it refuses for any other call."""
    model = _model("llama")
    explainer = Explainer(model)
    generation = _generation(model)
    before = ModelState.capture(model)
    with pytest.raises(OptionError, match="takes no score"):
        explain_generation(explainer, generation, method="rollout", score="logit")
    with pytest.raises(OptionError, match=r"not available .* generation"):
        explain_generation(explainer, generation, method="lrp")
    with pytest.raises(OptionError, match=r"not available .* generation"):
        explain_generation(explainer, generation, method="transformer_attribution")
    with pytest.raises(OptionError, match="bogus"):
        explain_generation(explainer, generation, method="rollout", bogus=1)
    with pytest.raises(OptionError, match="start_layer 9 is out of range"):
        explain_generation(explainer, generation, method="generic", start_layer=9)
    with pytest.raises(OptionError, match="takes no start_layer"):
        explain_generation(explainer, generation, method="raw_attention", start_layer=0)
    inputs, width = generation.inputs(), generation.prompt_length
    with pytest.raises(OptionError, match="takes no target"):
        engine.explain(
            explainer.adapter,
            inputs,
            engine.Request(method="generic", target=3, prompt_length=width),
        )
    with pytest.raises(OptionError, match="one score per input"):
        engine.trace(explainer.adapter, inputs, engine.Request(method=None, prompt_length=width))
    with pytest.raises(InputError, match="no generated token"):
        whole = engine.Request(method="generic", prompt_length=inputs["input_ids"].shape[1])
        engine.explain(explainer.adapter, inputs, whole)
    assert before.differences(ModelState.capture(model)) == []


@pytest.mark.parametrize(
    "method", ["generic", "rollout", "raw_attention", "attention_gradcam", "attnlrp"]
)
def test_generations_on_the_fused_path(method):
    """sdpa (q, k, v seen through the attention interface), every block folded for all
    generated positions at once, one query row at a time (a budget of 1 byte), from one
    batched backward or after the forward: equal to the explicit path's whole maps. Qwen2's
    sliding-window blocks are folded from their whole maps (their mask is more than keys
    and causality), the others from q, k, v and dO. Attention GradCAM recomputes its last
    block's A once for all positions, and dA one position at a time: fused, unstreamed.
    AttnLRP reads no map: fused, unstreamed."""
    model = _model("qwen2")
    generation = _generation(model, end=True)
    streamed = Explainer(model, attention_path="fused", memory_budget=1)
    fused = explain_generation(streamed, generation, method=method)
    taken = "fused" if method in ("attnlrp", "attention_gradcam") else "streamed"
    assert fused.explanation.settings["attention_path"] == taken
    explicit = explain_generation(
        Explainer(model, attention_path="explicit"), generation, method=method
    )
    assert explicit.explanation.settings["attention_path"] == "explicit"
    # "auto" on CPU: the fused kernel for AttnLRP; the explicit maps below 384 tokens for a
    # forward-only method; the streamed fold for a gradient method with several columns.
    auto = explain_generation(Explainer(model), generation, method=method).explanation
    taken = {"attnlrp": "fused", "generic": "streamed", "attention_gradcam": "fused"}
    assert auto.settings["attention_path"] == taken.get(method, "explicit")
    torch.testing.assert_close(auto.relevance, explicit.explanation.relevance, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(
        fused.explanation.relevance, explicit.explanation.relevance, rtol=1e-4, atol=1e-6
    )


def test_generation_is_greedy_and_matches_the_model():
    model = _model("qwen3")
    generation = _generation(model)
    logits = model(**generation.inputs(), position_ids=generation.attention_mask.cumsum(1) - 1)
    width = generation.prompt_length
    predicted = logits.logits[:, width - 1 : -1].argmax(dim=-1)
    assert torch.equal(predicted, generation.input_ids[:, width:])


def _in(family: str, dtype: torch.dtype):
    """The tiny `family` model in `dtype` (a copy: the cached model stays float32)."""
    return copy.deepcopy(_model(family)).to(dtype)


def _models_own(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The model's own greedy continuation of `batch`, outside explain."""
    return model.generate(**batch, max_new_tokens=NEW, do_sample=False, pad_token_id=0)


@pytest.mark.parametrize(
    ("family", "dtype"),
    [
        ("llama", torch.float32),
        ("llama", torch.float64),
        ("gpt2", torch.float32),
        ("gpt2", torch.float64),
        ("gemma2", torch.float32),
    ],
)
def test_a_left_padded_batch_generates_as_the_models_own_generate(family, dtype):
    """Token for token what the model's own generate gives: explain generates on the
    model's own attention path (sdpa for Llama and GPT-2, eager for Gemma 2). Gemma 2 in
    float64 is left out here: its own generate writes pad tokens after a left-padded prompt
    (transformers' eager softmax runs in float32, where the float64 mask's lowest value is
    -inf: a pad's row of NaN reaches every token), see the next test."""
    model = _in(family, dtype)
    batch = ref.padded_batch(PROMPTS, "left")
    generation = generate(Explainer(model), batch, max_new_tokens=NEW)
    assert torch.equal(generation.input_ids, _models_own(model, batch))


@pytest.mark.parametrize("family", ["llama", "gemma2", "gpt2"])
def test_a_left_padded_batch_generates_as_each_prompt_alone_in_float64(family):
    """In float64 each prompt of a left-padded batch is continued exactly as it is alone,
    unpadded, by the model's own generate: no pad token where the batch's padding once
    made the logits NaN, Gemma 2 on eager attention included."""
    model = _in(family, torch.float64)
    generation = generate(Explainer(model), ref.padded_batch(PROMPTS, "left"), max_new_tokens=NEW)
    width = generation.prompt_length
    for row, prompt in enumerate(PROMPTS):
        alone = _models_own(model, {"input_ids": torch.tensor([prompt])})[0, len(prompt) :]
        continuation = generation.input_ids[row, width:][generation.generated[row]]
        assert continuation.tolist() == alone.tolist()


@pytest.mark.parametrize("method", _next_token_methods())
@pytest.mark.parametrize("family", ["llama", "gemma2", "gpt2"])
def test_a_left_padded_batch_is_explained_as_each_prompt_alone_in_float64(family, method):
    """Each row of a left-padded batch's generation explanation equals the explanation of
    its prompt and continuation alone, unpadded, to the last digits in float64 (at
    float32's share for `FLOAT32_SOFTMAX`); its pads get nothing."""
    explainer = Explainer(_in(family, torch.float64))
    generation = generate(explainer, ref.padded_batch(PROMPTS, "left"), max_new_tokens=NEW)
    batch = explain_generation(explainer, generation, method=method).explanation
    width = generation.prompt_length
    for row, prompt in enumerate(PROMPTS):
        pads = width - len(prompt)
        alone = Generation(
            generation.input_ids[row : row + 1, pads:],
            generation.attention_mask[row : row + 1, pads:],
            len(prompt),
        )
        single = explain_generation(explainer, alone, method=method).explanation
        if family in FLOAT32_SOFTMAX:  # the padded rows' softmax rounds in float32
            assert_float32_close(batch.relevance[row, :, pads:], single.relevance[0])
        else:
            torch.testing.assert_close(
                batch.relevance[row, :, pads:], single.relevance[0], rtol=1e-10, atol=1e-13
            )
        assert (batch.relevance[row, :, :pads] == 0).all()


def test_generation_and_its_explanation_leave_no_trace():
    model = _model("llama")
    torch.manual_seed(11)
    before = ModelState.capture(model)
    config = model.generation_config.to_dict()
    explainer = Explainer(model)
    explain_generation(explainer, ref.padded_batch(PROMPTS, "left"), max_new_tokens=3)
    generate(explainer, ref.padded_batch(PROMPTS, "left"), max_new_tokens=3, do_sample=True)
    assert before.differences(ModelState.capture(model)) == []
    assert model.generation_config.to_dict() == config
    assert not [name for name in vars(model) if "cache" in name.lower() and vars(model)[name]]
    assert AttentionMaskInterface._global_mapping["eager"] is eager_mask  # transformers' own


def test_chat_messages_go_through_the_chat_template():
    tokenizer = tiny_lm.tiny_tokenizer()
    explainer = Explainer(_model("llama"), tokenizer=tokenizer)
    chat = [{"role": "user", "content": "w10 w11 w12"}]
    assert is_chat(chat) and is_chat([chat, chat]) and not is_chat(["w10"])
    result = explain_generation(explainer, chat, max_new_tokens=2)
    generation = result.generation
    expected = tokenizer("<s> user w10 w11 w12 <s> assistant", add_special_tokens=False)
    width = generation.prompt_length
    assert generation.input_ids[0, :width].tolist() == expected["input_ids"]
    tokens = result.explanation.tokens[0]
    assert tokens[:width] == ["<s>", "user", "w10", "w11", "w12", "<s>", "assistant"]
    assert result.explanation.relevance.shape == (1, 2, width + 2)


def test_texts_are_padded_on_the_left():
    tokenizer = tiny_lm.tiny_tokenizer()
    explainer = Explainer(_model("llama"), tokenizer=tokenizer)
    generation = generate(explainer, ["w10 w11 w12", "w20"], max_new_tokens=2)
    assert generation.attention_mask[1, :2].tolist() == [0, 0]
    assert generation.attention_mask[:, generation.prompt_length - 1].all()


def test_errors_say_what_to_do():
    explainer = Explainer(_model("llama"))
    with pytest.raises(InputError, match="pad them on the left"):
        generate(explainer, ref.padded_batch(PROMPTS, "right"))
    with pytest.raises(InputError, match="need a tokenizer"):
        generate(explainer, "w10 w11")
    with pytest.raises(OptionError, match="max_new_tokens"):
        generate(explainer, ref.padded_batch(PROMPTS, "left"), max_new_tokens=0)
    meta = {k: v.to("meta") for k, v in ref.padded_batch(PROMPTS, "left").items()}
    with pytest.raises(InputError, match="input_ids is on the meta device"):
        generate(explainer, meta)
    with pytest.raises(OptionError, match="decoder-only"):
        explain_generation(Explainer(ref.tiny_text_model("bert-classifier")), "w1")


def test_generation_stops_at_the_models_last_position_with_a_note():
    model = _model("gpt2")
    limit = model.config.n_positions
    explainer = Explainer(model)
    prompt = {
        "input_ids": torch.full((1, limit - 2), 5),
        "attention_mask": torch.ones(1, limit - 2),
    }
    with pytest.warns(
        UserWarning, match=f"generating at most 2 tokens, not 5: the model takes {limit}"
    ):
        result = explain_generation(explainer, prompt, max_new_tokens=5)
    assert result.generation.input_ids.shape == (1, limit)
    full = {"input_ids": torch.full((1, limit), 5), "attention_mask": torch.ones(1, limit)}
    with pytest.raises(InputError, match="no room to generate"):
        generate(explainer, full)


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"num_return_sequences": 2}, OptionError, "one continuation per prompt"),
        ({"bogus_option": 1}, OptionError, "unknown generation option 'bogus_option'"),
        ({"input_ids": torch.ones(1, 2, dtype=torch.long)}, OptionError, "sets input_ids itself"),
        ({"pad_token_id": 3}, OptionError, "sets pad_token_id itself"),
        ({"do_sample": True, "temperature": -1.0}, OptionError, "bad generation options"),
    ],
)
def test_bad_generation_options_are_clear_errors(options, error, message):
    model = _model("llama")
    before = ModelState.capture(model)
    with pytest.raises(error, match=message):
        generate(Explainer(model), ref.padded_batch(PROMPTS, "left"), max_new_tokens=2, **options)
    assert before.differences(ModelState.capture(model)) == []


@pytest.mark.parametrize("content", [None, 3, ["w10"]])
def test_chat_messages_must_hold_text(content):
    explainer = Explainer(_model("llama"), tokenizer=tiny_lm.tiny_tokenizer())
    chat = [{"role": "user", "content": "w10"}, {"role": "assistant", "content": content}]
    with pytest.raises(InputError, match="message 1 of conversation 0 has content"):
        generate(explainer, chat, max_new_tokens=1)
