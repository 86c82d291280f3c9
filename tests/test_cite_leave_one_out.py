"""Span scores refined by leave-one-out ablations (`cite(..., ablate=k)`,
explain.cite.leave_one_out): a hand-built model whose bridge span acts through the
attention weights alone (no value) gets CP-LRP score 0 and yet its removal changes the
answer, and the ablation ranks it first; the refined scores equal one unpadded forward per
removed span (the batch equals single runs), for an answer and for a contrast; the
candidates are the spans of largest |score|, chosen before `sparse`; no random number is
drawn; bad counts are refused; the CLI's --ablate writes what the Python API returns."""

from __future__ import annotations

import functools
import html
import json

import pytest
import torch
from reference_hf import answer_log_probability

from explain import Explainer, InputError, OptionError
from explain.cite import Citation, cite
from explain.cite.figure import cite_figure
from explain.cite.leave_one_out import (
    DEFAULT_COUNT,
    candidates,
    leave_one_out,
    removed_alone_note,
)
from explain.cli import main
from explain.testing import tiny_lm

CONTEXT = "w9 w10 w11\nw12 w13\nw14 w15 w16\nw17 w18"
"""Four line spans; the second, `w12 w13`, is the hand-built model's bridge."""
QUESTION = "w30 w31"
BRIDGE = 1


@functools.cache
def _explainer() -> Explainer:
    return Explainer(tiny_lm.tiny_causal_lm("llama").double(), tokenizer=tiny_lm.tiny_tokenizer())


@functools.cache
def _bridge_explainer() -> Explainer:
    """One block whose readout looks at the bridge's words and reads nothing from them.

    Embedding direction 0 belongs to the bridge's words alone (every other word has none
    of it); the value projection ignores it (the bridge's values are 0); the key
    projection maps it onto the readout word's query, 20 times its unit length, and the
    rotary embedding is off (its frequencies 0), so the readout's attention goes to the
    bridge whatever the positions. A linear account through the values (CP-LRP holds
    the attention weights constant) gives the bridge nothing, but removing it moves the
    readout's attention onto the other words' values."""
    tokenizer = tiny_lm.tiny_tokenizer()
    model = tiny_lm.tiny_causal_lm("llama", num_hidden_layers=1).double()
    model.model.rotary_emb.inv_freq.zero_()
    layer = model.model.layers[0]
    attention = layer.self_attn
    embedding = model.model.embed_tokens.weight
    bridge = tokenizer.convert_tokens_to_ids(["w12", "w13"])
    head = attention.head_dim
    groups = attention.num_key_value_groups
    with torch.no_grad():
        embedding[:, 0] = 0
        embedding[bridge] = torch.nn.functional.one_hot(torch.tensor(0), embedding.shape[1]).to(
            embedding
        )
        attention.v_proj.weight[:, 0] = 0
        reader = layer.input_layernorm(embedding[tokenizer.convert_tokens_to_ids("w31")][None])
        query = attention.q_proj(reader)[0].reshape(-1, head)  # (heads, head)
        unit = layer.input_layernorm(embedding[bridge[0]][None])[0, 0]
        for kv in range(attention.k_proj.weight.shape[0] // head):
            target = query[kv * groups : (kv + 1) * groups].sum(dim=0)
            attention.k_proj.weight[kv * head : (kv + 1) * head, 0] = (
                20 * target / target.norm() / unit
            )
    return Explainer(model, tokenizer=tokenizer)


def _without(result, span: int) -> list[int]:
    """The prompt's ids without the tokens of `span`."""
    return [
        int(token)
        for token, owner in zip(result.prompt_ids, result.token_spans, strict=True)
        if owner != span
    ]


def test_a_bridge_read_through_attention_alone_scores_0_and_the_ablation_finds_it():
    explainer = _bridge_explainer()
    model = explainer.model
    plain = cite(explainer, CONTEXT, QUESTION, spans="lines", method="cp_lrp",
                 max_new_tokens=1, ablate=0, check=False)  # fmt: skip
    answer = plain.answer_ids.tolist()
    assert abs(float(plain.scores[BRIDGE])) < 1e-12  # no value, no CP-LRP relevance
    assert plain.ranked()[0] != BRIDGE and bool((plain.scores != 0).sum() >= 2)
    # ... yet without it the model answers something else
    without = torch.tensor([_without(plain, BRIDGE)])
    with torch.no_grad():
        assert int(model(input_ids=without).logits[0, -1].argmax()) != answer[0]
    refined = cite(explainer, CONTEXT, QUESTION, plain.answer, spans="lines",
                   method="cp_lrp", ablate=len(plain.spans), check=False)  # fmt: skip
    assert refined.ranked()[0] == BRIDGE
    whole = answer_log_probability(model, plain.prompt_ids.tolist(), answer)
    for span in range(len(plain.spans)):
        drop = whole - answer_log_probability(model, _without(plain, span), answer)
        assert float(refined.scores[span]) == pytest.approx(drop, abs=1e-9)
    torch.testing.assert_close(refined.span_relevance, plain.span_relevance)
    assert refined.settings["ablate"] == len(plain.spans) and "ablate" not in plain.settings


@pytest.mark.parametrize("foil", [None, "w43 w44"])
def test_the_candidates_scores_are_their_drops_one_forward_each(foil):
    explainer = _explainer()
    model = explainer.model
    options = dict(spans="lines", method="cp_lrp", foil=foil, check=False)
    plain = cite(explainer, CONTEXT, QUESTION, "w40 w41 w42", ablate=0, **options)
    refined = cite(explainer, CONTEXT, QUESTION, "w40 w41 w42", ablate=2, **options)
    chosen = plain.scores.abs().argsort(descending=True)[:2].tolist()
    assert candidates(plain.scores, 2).tolist() == chosen
    answers = [(plain.answer_ids.tolist(), 1.0)]
    if foil is not None:
        answers.append((plain.foil_ids.tolist(), -1.0))

    def target(ids: list[int]) -> float:
        return sum(
            weight * answer_log_probability(model, ids, answer) for answer, weight in answers
        )

    whole = target(plain.prompt_ids.tolist())
    for span in range(len(plain.spans)):
        if span in chosen:
            drop = whole - target(_without(plain, span))
            assert float(refined.scores[span]) == pytest.approx(drop, abs=1e-9)
        else:
            assert float(refined.scores[span]) == float(plain.scores[span])


def test_the_candidates_are_chosen_before_sparse():
    explainer = _explainer()
    options = dict(spans="lines", method="cp_lrp", check=False)
    plain = cite(explainer, CONTEXT, QUESTION, "w40 w41 w42", ablate=0, **options)
    sparse = cite(explainer, CONTEXT, QUESTION, "w40 w41 w42", sparse=0.9, ablate=0, **options)
    both = cite(explainer, CONTEXT, QUESTION, "w40 w41 w42", sparse=0.9, ablate=4, **options)
    assert bool((sparse.scores == 0).any())  # sparse zeroed a span ...
    every = cite(explainer, CONTEXT, QUESTION, "w40 w41 w42", ablate=4, **options)
    # ... that the ablation still scores: every span was a candidate, by its own score
    torch.testing.assert_close(both.scores, every.scores)
    assert not torch.equal(plain.scores, every.scores)


def test_leave_one_out_calls_its_targets_once_and_keeps_the_rest():
    scores = torch.tensor([0.5, -3.0, 0.0, 2.0, -0.1], dtype=torch.float64)
    calls = []

    def targets(keep: torch.Tensor) -> torch.Tensor:
        calls.append(keep.clone())
        # the answer needs spans 1 and 2 together (log p 0 with both, -20 without)
        return torch.where(keep[:, 1] & keep[:, 2], 0.0, -20.0).double()

    refined, ablated = leave_one_out(scores, targets, 2)
    (keep,) = calls
    assert keep.tolist() == [[True] * 5, [True, False, True, True, True],
                             [True, True, True, False, True]]  # fmt: skip
    assert refined.tolist() == [0.5, 20.0, 0.0, 0.0, -0.1]
    assert refined.dtype == torch.float64 and ablated == (1, 3)  # largest |score| first
    everything, ablated = leave_one_out(scores, targets, 99)  # more than the spans: all
    assert everything.tolist() == [0.0, 20.0, 20.0, 0.0, 0.0] and ablated == (1, 3, 0, 4, 2)
    by_other, ablated = leave_one_out(scores, targets, 1, chosen_by=torch.tensor([0, 0, 9, 0, 0]))
    assert by_other.tolist() == [0.5, -3.0, 20.0, 2.0, -0.1] and ablated == (2,)
    calls.clear()
    unchanged, ablated = leave_one_out(scores, targets, 0)
    assert torch.equal(unchanged, scores.double()) and ablated == () and not calls


def test_the_ablation_draws_no_random_number():
    explainer = _explainer()
    state = torch.get_rng_state()
    cite(explainer, CONTEXT, QUESTION, "w40 w41", spans="lines", method="cp_lrp",
         ablate=3, check=False)  # fmt: skip
    assert torch.equal(torch.get_rng_state(), state)


@pytest.mark.parametrize(
    ("method", "expected"), [("cp_lrp", DEFAULT_COUNT), ("attnlrp", DEFAULT_COUNT), ("generic", 0)]
)
def test_a_call_naming_no_count_ablates_the_default_for_methods_linear_in_the_score(
    method, expected
):
    """The default: DEFAULT_COUNT spans for a method whose relevance is in the target's nats
    (as the drops are), none for the others (generic's relevance is on no such scale)."""
    explainer = _explainer()
    options = dict(spans="lines", method=method, check=False)
    default = cite(explainer, CONTEXT, QUESTION, "w40 w41 w42", **options)
    named = cite(explainer, CONTEXT, QUESTION, "w40 w41 w42", ablate=expected, **options)
    torch.testing.assert_close(default.scores, named.scores, rtol=0, atol=0)
    assert default.settings.get("ablate", 0) == expected
    if expected:  # the one-pass scores and the default's differ where the drops went
        plain = cite(explainer, CONTEXT, QUESTION, "w40 w41 w42", ablate=0, **options)
        assert not torch.equal(default.scores, plain.scores)


@pytest.mark.parametrize("count", [-1, True, 1.5, "2"])
def test_a_bad_count_is_refused(count):
    with pytest.raises(OptionError, match="ablate"):
        cite(_explainer(), CONTEXT, QUESTION, "w40", ablate=count, check=False)
    with pytest.raises(OptionError, match="ablate"):
        leave_one_out(torch.zeros(3), lambda keep: torch.zeros(len(keep)), count)


def test_a_photo_takes_no_ablate():
    with pytest.raises(OptionError, match="ablate"):
        cite(_explainer(), None, QUESTION, image="photo.png", ablate=2)


def test_the_note_names_the_ablated_spans_from_1_and_the_rest_as_the_methods():
    assert removed_alone_note((), "cp_lrp") == ""
    one = removed_alone_note((3,), "cp_lrp")
    assert one.startswith("The whole answer's score of span 4 (the one of largest |score|) is")
    assert "from log p(answer), in nats" in one and "is the relevance of cp_lrp." in one
    several = removed_alone_note((1, 0, 4), "attnlrp", contrast=True)
    assert "scores of spans 2, 1 and 5 (the 3 of largest |score|) are leave-one-out" in several
    assert "log p(answer) - log p(foil)" in several and "is the relevance of attnlrp." in several


def test_the_figure_says_which_scores_are_drops_in_place_of_the_sum():
    rows = torch.tensor([[3.0, 0.5], [0.2, 0.1], [0.1, 0.3]])
    plain = cite_figure(["a .", "b ."], ["x", "y"], rows, method="cp_lrp")
    note = removed_alone_note((0,), "cp_lrp")
    noted = cite_figure(["a .", "b ."], ["x", "y"], rows, method="cp_lrp", note=note)

    def caption(figure):
        return " ".join(" ".join(t.get_text().split()) for t in figure.texts)

    assert "the sum of their tokens' relevance" in caption(plain)
    assert note in caption(noted) and "the sum of their tokens'" not in caption(noted)


def test_the_ablated_spans_are_saved_loaded_and_checked(tmp_path):
    result = cite(_explainer(), CONTEXT, QUESTION, "w40 w41", spans="lines", method="cp_lrp",
                  ablate=2, check=False)  # fmt: skip
    chosen = result.span_relevance.sum(dim=0).abs().argsort(descending=True, stable=True)[:2]
    assert result.ablated == tuple(chosen.tolist())
    assert result.ablated_note == removed_alone_note(result.ablated, "cp_lrp")
    path = tmp_path / "cite.json"
    result.save(path)
    assert Citation.load(path).ablated == result.ablated
    document = json.loads(path.read_text())
    for damaged in ([0, 0], [len(result.spans)], ["1"], 1):
        path.write_text(json.dumps({**document, "ablated": damaged}))
        with pytest.raises(InputError, match="ablated is"):
            Citation.load(path)
    del document["ablated"]  # a file written before the field: no span was ablated
    path.write_text(json.dumps(document))
    assert Citation.load(path).ablated == ()


def test_the_cli_writes_the_ablated_scores(tmp_path, capsys):
    folder = tiny_lm.save_tiny_lm(tmp_path / "tiny-llama", "llama")
    context = tmp_path / "context.txt"
    context.write_text(CONTEXT, encoding="utf-8")
    arguments = ["cite", "--model", str(folder), "--context", str(context), "--spans", "lines"]
    arguments += ["--question", QUESTION, "--answer", "w40 w41", "--method", "cp_lrp"]
    assert main([*arguments, "--ablate", "2", "--out", str(tmp_path / "out")]) == 0
    document = json.loads((tmp_path / "out" / "cite.json").read_text())
    explainer = Explainer(tiny_lm.tiny_causal_lm("llama"), tokenizer=tiny_lm.tiny_tokenizer())
    expected = cite(explainer, CONTEXT, QUESTION, "w40 w41", spans="lines", method="cp_lrp",
                    ablate=2)  # fmt: skip
    scores = torch.tensor([s["score"] for s in document["spans"]], dtype=torch.float64)
    torch.testing.assert_close(scores, expected.scores.double())
    assert document["settings"]["ablate"] == 2
    assert document["ablated"] == list(expected.ablated) and len(expected.ablated) == 2
    # the terminal, the page and the figure say which scores are drops, in the same words
    assert expected.ablated_note in capsys.readouterr().out
    page = (tmp_path / "out" / "cite.html").read_text()
    assert f'<p class="legend" id="ablated">{html.escape(expected.ablated_note)}</p>' in page
    with pytest.raises(SystemExit):  # argparse refuses it
        main([*arguments, "--ablate", "-1", "--out", str(tmp_path / "bad")])
