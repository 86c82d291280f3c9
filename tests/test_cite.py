"""Span attribution (explain.cite): span scores are the sums of the token relevances the
engine's generation explanation gives, for every method a language model takes; the
ablation check equals a hand computation (one unpadded forward per ablation) on a tiny
model; contrasts of two answers equal the difference of the two answers' attributions
for the methods linear in the score and are refused for the others; the result saves and
loads; the model is left as found."""

from __future__ import annotations

import functools
import itertools
import json
import math
import re
import statistics

import pytest
import torch
from reference_hf import answer_log_probability
from scipy import stats

from explain import Explainer, InputError, OptionError
from explain.cite import Citation, check_ranking, cite, explain_contrast, spearman
from explain.cite.check import DRAWS, TOP_K, ablated_targets
from explain.engine import Request, supported_methods
from explain.generation import Generation, explain_generation, generate
from explain.testing import ModelState
from explain.testing.tiny_lm import tiny_causal_lm, tiny_tokenizer

CONTEXT = "w9 w10 w11. w12 w13! w14 w15 w16.\nw17 w18 w19 w20. w21 w22 w23. w24 w25."
QUESTION = "w30 w31"
ANSWER = "w40 w41 w42"
FOIL = "w43 w44"


@functools.cache
def _explainer() -> Explainer:
    return Explainer(tiny_causal_lm("llama").double(), tokenizer=tiny_tokenizer())


def _methods() -> list[str]:
    return supported_methods(_explainer().adapter, Request(prompt_length=1))


def _ablated(result: Citation, keep: torch.Tensor) -> list[int]:
    """The prompt's ids without the tokens of the spans `keep` (S,) drops."""
    return [
        int(token)
        for token, span in zip(result.prompt_ids, result.token_spans, strict=True)
        if span < 0 or keep[span]
    ]


@pytest.mark.parametrize("method", _methods())
def test_span_scores_are_the_sums_of_the_engines_token_relevances(method):
    explainer = _explainer()
    result = cite(explainer, CONTEXT, QUESTION, ANSWER, method=method, check=False, ablate=0)
    prompt_length = result.prompt_ids.shape[0]
    count = len(result.spans)
    # The token relevances are the engine's explanation of prompt + answer, unchanged.
    ids = torch.cat([result.prompt_ids, result.answer_ids])[None]
    generation = Generation(ids, torch.ones_like(ids), prompt_length)
    score = "log_probability" if method not in ("rollout", "raw_attention", "random") else None
    engine = explain_generation(explainer, generation, method=method, score=score)
    if method != "random":  # the chance baseline draws anew per call
        torch.testing.assert_close(
            result.token_relevance, engine.explanation.relevance[0, :, :prompt_length]
        )
    assert result.token_relevance.shape == (3, prompt_length)
    assert result.span_relevance.shape == (3, count)
    for s in range(count):
        inside = [i for i, owner in enumerate(result.token_spans.tolist()) if owner == s]
        assert inside, f"span {s} has no token"
        expected = result.token_relevance[:, inside].sum(dim=1)
        torch.testing.assert_close(result.span_relevance[:, s], expected, rtol=1e-12, atol=0)
    torch.testing.assert_close(result.scores, result.span_relevance.sum(dim=0))
    assert result.answer_tokens == ["w40", "w41", "w42"]
    assert result.check is None


def test_a_generated_answer_is_the_models_own_continuation():
    explainer = _explainer()
    result = cite(explainer, CONTEXT, QUESTION, max_new_tokens=4, check=False)
    ids = result.prompt_ids[None]
    prompt = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    own = generate(explainer, prompt, max_new_tokens=4)
    width = own.prompt_length
    assert result.answer_ids.tolist() == own.input_ids[0, width:][own.generated[0]].tolist()
    assert result.token_relevance.shape[0] == len(result.answer_ids)


@pytest.mark.parametrize("share", [0.3, 0.9])
def test_sparse_zeroes_the_spans_below_a_share_of_the_top_score(share):
    explainer = _explainer()
    whole = cite(explainer, CONTEXT, QUESTION, ANSWER, method="cp_lrp", check=False, ablate=0)
    sparse = cite(
        explainer, CONTEXT, QUESTION, ANSWER, method="cp_lrp", check=False, sparse=share, ablate=0
    )
    top = float(whole.scores.max())
    assert top > 0
    kept = [s for s, score in enumerate(whole.scores.tolist()) if score >= share * top]
    dropped = [s for s in range(len(whole.spans)) if s not in kept]
    assert kept and dropped, "the share should split this context's spans"
    torch.testing.assert_close(sparse.span_relevance[:, kept], whole.span_relevance[:, kept])
    assert (sparse.span_relevance[:, dropped] == 0).all()
    torch.testing.assert_close(sparse.scores, sparse.span_relevance.sum(dim=0))
    torch.testing.assert_close(sparse.token_relevance, whole.token_relevance)
    assert sparse.settings["sparse"] == share and "sparse" not in whole.settings


def test_sparse_keeps_scores_without_a_positive_top():
    from explain.cite.attribution import sparse_spans

    negative = -torch.rand(3, 5, dtype=torch.float64)
    assert torch.equal(sparse_spans(negative, 0.5), negative)


@pytest.mark.parametrize("share", [-0.1, 1.0, True, "0.1"])
def test_sparse_out_of_range_is_refused(share):
    with pytest.raises(OptionError, match="sparse"):
        cite(_explainer(), CONTEXT, QUESTION, ANSWER, check=False, sparse=share)


def test_ablated_targets_equal_one_unpadded_forward_per_ablation():
    explainer = _explainer()
    result = cite(explainer, CONTEXT, QUESTION, ANSWER, check=False)
    spans = len(result.spans)
    keep = torch.rand(12, spans, generator=torch.Generator().manual_seed(3)) < 0.5
    keep[0], keep[1] = True, False
    answer = result.answer_ids.tolist()
    values = ablated_targets(
        explainer.adapter,
        result.prompt_ids,
        result.token_spans,
        [(result.answer_ids, 1.0)],
        keep,
        batch_tokens=40,  # several chunks
    )
    model = explainer.adapter.model
    expected = [answer_log_probability(model, _ablated(result, row), answer) for row in keep]
    torch.testing.assert_close(
        values, torch.tensor(expected, dtype=torch.float64), rtol=1e-10, atol=1e-10
    )


def test_ablated_sequences_are_built_one_chunk_at_a_time():
    # Issue 46: every ablated sequence was materialised at once (M x P ids); now no
    # (rows, tokens) integer tensor holds more than one chunk's `batch_tokens` tokens.
    from torch.utils._python_dispatch import TorchDispatchMode

    class LargestIds(TorchDispatchMode):
        largest = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for value in out if isinstance(out, (tuple, list)) else (out,):
                if (
                    isinstance(value, torch.Tensor)
                    and value.dtype == torch.int64
                    and value.dim() == 2
                ):
                    self.largest = max(self.largest, value.numel())
            return out

    explainer = _explainer()
    result = cite(explainer, CONTEXT, QUESTION, ANSWER, check=False)
    keep = torch.rand(64, len(result.spans), generator=torch.Generator().manual_seed(5)) < 0.5
    batch_tokens = 2 * (result.prompt_ids.shape[0] + 3)
    with LargestIds() as seen:
        ablated_targets(
            explainer.adapter,
            result.prompt_ids,
            result.token_spans,
            [(result.answer_ids, 1.0)],
            keep,
            batch_tokens=batch_tokens,
        )
    # A chunk's ids, or the (kept tokens, 2) index they are gathered with, and the one
    # column the model adds: twice the chunk at most, far below all 64 x 19 ablated ids.
    assert seen.largest <= 2 * batch_tokens < keep.shape[0] * result.prompt_ids.shape[0]


def test_the_check_against_a_hand_computation():
    explainer = _explainer()
    model = explainer.adapter.model
    before = ModelState.capture(model)
    result = cite(explainer, CONTEXT, QUESTION, ANSWER, method="attnlrp", lds=24, seed=5)
    assert before.differences(ModelState.capture(model)) == []
    check = result.check
    spans = len(result.spans)
    answer = result.answer_ids.tolist()
    full = answer_log_probability(model, result.prompt_ids.tolist(), answer)
    assert check.full == pytest.approx(full, rel=1e-10)
    ranked = sorted(range(spans), key=lambda s: -float(result.scores[s]))
    # The random sets and LDS ablations, drawn as the check documents it: every k-set
    # where there are at most DRAWS of them (k = 1 and 5 of these 6 spans), else DRAWS
    # random ones (k = 3: 20 sets).
    generator = torch.Generator().manual_seed(5)
    assert spans == 6
    assert [d.k for d in check.drops] == [k for k in TOP_K if k < spans]
    assert [d.exact for d in check.drops] == [True, False, True]
    for drop in check.drops:
        keep = torch.ones(spans, dtype=torch.bool)
        keep[ranked[: drop.k]] = False
        top = full - answer_log_probability(model, _ablated(result, keep), answer)
        assert drop.top == pytest.approx(top, rel=1e-9)
        if drop.exact:
            picks = [list(pick) for pick in itertools.combinations(range(spans), drop.k)]
        else:
            picks = torch.rand(DRAWS, spans, generator=generator).argsort(dim=1)[:, : drop.k]
        random = []
        for pick in picks:
            keep = torch.ones(spans, dtype=torch.bool)
            keep[pick] = False
            random.append(full - answer_log_probability(model, _ablated(result, keep), answer))
        assert drop.sets == len(random) == (math.comb(spans, drop.k) if drop.exact else DRAWS)
        assert drop.random == pytest.approx(statistics.fmean(random), rel=1e-9)
        spread = statistics.pstdev(random) if drop.exact else statistics.stdev(random)
        assert drop.random_std == pytest.approx(spread, rel=1e-9)
    halves = torch.rand(24, spans, generator=generator) < 0.5
    actual = [answer_log_probability(model, _ablated(result, keep), answer) for keep in halves]
    predicted = (halves.double() * result.scores.double()).sum(dim=1)
    assert check.lds == pytest.approx(stats.spearmanr(predicted, actual).statistic, rel=1e-9)
    assert check.lds_ablations == 24 and check.seed == 5 and check.draws == DRAWS
    assert "removed" in check.ablation


def test_spearman_matches_scipy_with_ties():
    generator = torch.Generator().manual_seed(0)
    x = torch.randint(0, 5, (40,), generator=generator).double()
    y = x + torch.randint(0, 3, (40,), generator=generator)
    assert spearman(x, y) == pytest.approx(stats.spearmanr(x, y).statistic, rel=1e-12)
    assert spearman(torch.ones(5), torch.arange(5.0)) is None


def test_check_options_are_checked():
    explainer = _explainer()
    result = cite(explainer, CONTEXT, QUESTION, ANSWER, check=False)
    arguments = (explainer.adapter, result.prompt_ids, result.token_spans)
    answers = [(result.answer_ids, 1.0)]
    for bad in (-1, 1, True, 2.5):
        with pytest.raises(OptionError, match=r"(?i)lds"):
            check_ranking(*arguments, answers, result.scores, lds=bad)
    with pytest.raises(OptionError, match="check=True"):
        cite(explainer, CONTEXT, QUESTION, ANSWER, check=False, lds=4)


@pytest.mark.parametrize("method", ["attnlrp", "cp_lrp"])
def test_a_contrast_of_two_answers_is_the_difference_of_their_attributions(method):
    explainer = _explainer()
    one_pass = dict(method=method, ablate=0)  # the one-pass scores, whose sum is linear
    contrast = cite(explainer, CONTEXT, QUESTION, ANSWER, foil=FOIL, lds=8, **one_pass)
    answer = cite(explainer, CONTEXT, QUESTION, ANSWER, check=False, **one_pass)
    foil = cite(explainer, CONTEXT, QUESTION, FOIL, check=False, **one_pass)
    torch.testing.assert_close(contrast.scores, answer.scores - foil.scores, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(
        contrast.span_relevance, torch.cat([answer.span_relevance, -foil.span_relevance])
    )
    assert contrast.answer_tokens == ["w40", "w41", "w42", "w43", "w44"]
    model = explainer.adapter.model
    prompt = contrast.prompt_ids.tolist()
    full = answer_log_probability(model, prompt, [40, 41, 42]) - answer_log_probability(
        model, prompt, [43, 44]
    )
    assert contrast.check.full == pytest.approx(full, rel=1e-10)
    assert contrast.check.target == "log p(answer) - log p(foil)"
    plain = explain_contrast(explainer, "w9 w10 w11", "w12 w13", "w14", method=method)
    prompt_ids = torch.tensor(tiny_tokenizer()("w9 w10 w11")["input_ids"])

    def summed(continuation: list[int]) -> torch.Tensor:
        ids = torch.tensor([[*prompt_ids.tolist(), *continuation]])
        found = explain_generation(
            explainer,
            Generation(ids, torch.ones_like(ids), 3),
            method=method,
            score="log_probability",
        )
        return found.explanation.relevance[0, :, :3].sum(dim=0)

    torch.testing.assert_close(plain.relevance, summed([12, 13]) - summed([14]))
    assert plain.foil_tokens == ["w14"] and plain.answer_tokens == ["w12", "w13"]


@pytest.mark.parametrize("method", ["generic", "attention_gradcam", "rollout"])
def test_methods_not_linear_in_the_score_refuse_a_contrast_of_two_answers(method):
    with pytest.raises(OptionError, match=r"not linear in the explained score.*attnlrp, cp_lrp"):
        cite(_explainer(), CONTEXT, QUESTION, ANSWER, foil=FOIL, method=method)


@pytest.mark.parametrize("suffix", ["json", "npz"])
def test_a_citation_saves_and_loads(tmp_path, suffix):
    result = cite(_explainer(), CONTEXT, QUESTION, ANSWER, foil=FOIL, method="attnlrp", lds=4)
    path = tmp_path / f"cite.{suffix}"
    result.save(path)
    loaded = Citation.load(path)
    for name in ("token_relevance", "span_relevance", "scores", "token_spans"):
        assert torch.equal(getattr(loaded, name), getattr(result, name)), name
    for name in ("context", "spans", "kind", "question", "prompt", "context_offset", "foil"):
        assert getattr(loaded, name) == getattr(result, name), name
    assert loaded.check == result.check
    assert loaded.answer_tokens == result.answer_tokens
    assert loaded.prompt_tokens == result.prompt_tokens
    if suffix == "json":
        import json

        document = json.loads(path.read_text())
        span = document["spans"][2]
        assert document["context"][span["start"] : span["end"]] == span["text"]
        assert span["score"] == pytest.approx(float(result.scores[2]))
        assert document["check"]["top_k"][0]["k"] == 1
    other = tmp_path / f"explanation.{suffix}"
    _explainer().explain("w9 w10 w11").save(other)
    with pytest.raises(InputError, match="not a citation"):
        Citation.load(other)


@pytest.fixture(scope="module")
def saved_contrast(tmp_path_factory) -> dict:
    """A contrast's cite.json document, as Citation.save writes it."""
    path = tmp_path_factory.mktemp("cite") / "cite.json"
    cite(_explainer(), CONTEXT, QUESTION, ANSWER, foil=FOIL, method="attnlrp", lds=4).save(path)
    return json.loads(path.read_text())


def _past_the_end(document):
    document["spans"][-1]["end"] += 5


def _overlapping(document):  # span 1 starts inside span 0
    span = document["spans"][1]
    span["start"] -= 1
    span["text"] = document["context"][span["start"] : span["end"]]


DAMAGE = {
    "outside": (_past_the_end, r"span 5 covers \d+..\d+, not the next piece"),
    "overlap": (_overlapping, r"span 1 covers \d+..\d+, not the next piece"),
    "text": (lambda d: d["spans"][0].update(text="other"), "span 0's text is not the context's"),
    "gap": (lambda d: d["spans"].pop(), "the spans end at"),
    "offset": (lambda d: d.update(context_offset=3), "context_offset 3 is not where"),
    "span index": (
        lambda d: d["tensors"]["token_spans"].__setitem__(-5, 6),
        r"token_spans is not one span index in -1..5",
    ),
    "span order": (
        lambda d: d["tensors"]["token_spans"].reverse(),
        "token_spans puts the context's tokens out of their spans' order",
    ),
    "token rows": (lambda d: d["answer_tokens"].pop(), "token_relevance is"),
    "prompt ids": (lambda d: d["tensors"]["prompt_ids"].pop(), "its token ids are not one per"),
    "foil ids": (lambda d: d["tensors"].pop("foil_ids"), "it lacks foil_ids"),
    "tokens": (lambda d: d.update(prompt_tokens=[1, 2]), "prompt_tokens is not a list"),
    "method": (lambda d: d.update(method=None), "method is None, not a text"),
    "check": (lambda d: d["check"].update(seed="3"), "check's seed is '3'"),
    "check drops": (lambda d: d["check"]["top_k"][0].pop("drop"), "check's top_k"),
    "check exact": (lambda d: d["check"]["top_k"][0].update(random_exact=1), "check's top_k"),
    "check sets": (lambda d: d["check"]["top_k"][0].update(random_sets=0), "check's top_k"),
}
"""Damage to a saved citation -> what the error names."""


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_citation_is_refused_naming_the_damage(tmp_path, saved_contrast, damage):
    """Issue 46: spans outside the context, overlapping or disagreeing with the token data
    were loaded, and failed later with KeyError or TypeError."""
    edit, named = DAMAGE[damage]
    document = json.loads(json.dumps(saved_contrast))
    edit(document)
    path = tmp_path / "cite.json"
    path.write_text(json.dumps(document))
    with pytest.raises(InputError, match=f"holds no valid citation: ({named})"):
        Citation.load(path)


def test_bad_calls_are_refused():
    explainer = _explainer()
    with pytest.raises(InputError, match="answer is empty"):
        cite(explainer, CONTEXT, QUESTION, " ")
    with pytest.raises(OptionError, match="generate_options"):
        cite(explainer, CONTEXT, QUESTION, ANSWER, generate_options={"do_sample": True})
    with pytest.raises(InputError, match="tokenizer"):
        cite(Explainer(explainer.adapter.model), CONTEXT, QUESTION, ANSWER)


@pytest.mark.parametrize("seed", [1.5, "3", True, -1, 1 << 64])
def test_a_seed_that_is_no_seed_is_refused_before_any_work(seed):
    # Issue 46: cite(seed=1.5 / "3") and --seed past 64 bits raised torch's raw errors.
    explainer = _explainer()
    with pytest.raises(OptionError, match=r"seed must be a whole number from 0 to 2\*\*64 - 1"):
        cite(explainer, CONTEXT, QUESTION, ANSWER, seed=seed)
    with pytest.raises(OptionError, match="seed must be a whole number"):
        check_ranking(
            explainer.adapter, torch.tensor([1]), torch.tensor([0]), [], torch.ones(1), seed=seed
        )


def test_the_cli_refuses_a_seed_past_64_bits_in_one_line(capsys, tmp_path):
    from explain.cli import main

    context = tmp_path / "context.txt"
    context.write_text("a. b.")
    argv = ["cite", "--model", "zoo:recall-llama", "--context", str(context), "--question", "q"]
    assert main([*argv, "--seed", str(1 << 64)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "explain: error: seed must be a whole number from 0 to 2**64 - 1, got 18446744073709551616"
    ]


def test_a_generated_answer_with_no_text_is_refused():
    # Issue 46: a model whose greedy answer is special tokens only got spans ranked for
    # an answer with no text ("answer: ").
    model = tiny_causal_lm("llama").double()
    torch.nn.init.zeros_(model.lm_head.weight)  # every logit 0: greedy picks id 0, <pad>
    explainer = Explainer(model, tokenizer=tiny_tokenizer())
    with pytest.raises(InputError, match="the model's answer has no text"):
        cite(explainer, CONTEXT, QUESTION, max_new_tokens=2)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"question": 3}, "question must be a str, got 3"),
        ({"answer": 7}, "answer must be a str or None, got 7"),
        ({"foil": ["x"]}, "foil must be a str or None"),
        ({"spans": None}, "spans must be a str"),
        ({"method": 1}, "method must be a str"),
        ({"chat": "yes"}, "chat must be a bool"),
        ({"max_new_tokens": 2.5}, "max_new_tokens must be an int"),
    ],
)
def test_wrong_typed_arguments_are_one_clear_error(arguments, message):
    # Issue 46: wrong-typed arguments reached raw TypeErrors and AttributeErrors.
    call = {"question": QUESTION, "answer": ANSWER, **arguments}
    with pytest.raises(OptionError, match=re.escape(message)):
        cite(_explainer(), CONTEXT, **call)
