"""The language-evidence test on a tiny Llama with synthetic evidence: its records against
plain loops (one unpadded prompt at a time), its summary against a hand computation
(ties, empty evidence and wrong answers included), its errors and its side effects."""

from __future__ import annotations

import math

import pytest
import torch

from explain import Explainer
from explain.errors import InputError, OptionError
from explain.evaluation import ERASER_FRACTIONS, FRACTIONS, LanguageEvidenceTest
from explain.evaluation.datasets import AnswerExample, ImageAnswerExample
from explain.evaluation.language import removed_tokens
from explain.evaluation.perturbation import removed_count
from explain.evaluation.protocol import records_problem
from explain.generation import Generation, explain_generation
from explain.testing import ModelState, tiny_lm

REPLACEMENT = 9  # "w9"
KEPT = 3  # the last three tokens: the question


@pytest.fixture(scope="module")
def lm():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield tiny_lm.tiny_causal_lm("llama"), tiny_lm.tiny_tokenizer()
    torch.set_num_threads(threads)


def greedy(model, ids, count):
    """The model's own answer: `count` tokens of plain greedy decoding."""
    ids = list(ids)
    for _ in range(count):
        with torch.no_grad():
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return tuple(ids[-count:])


@pytest.fixture(scope="module")
def examples(lm):
    """Four prompts: answered right with evidence; right, with a special token inside;
    wrong (the second answer token changed); right without evidence."""
    model, _ = lm
    generator = torch.Generator().manual_seed(3)
    made = []
    for index, length in enumerate((18, 23, 20, 25)):
        ids = [1, *torch.randint(10, 58, (length - 1,), generator=generator).tolist()]
        if index == 1:
            ids[6] = 2  # "</s>": a special token, never ranked nor removed
        answer = greedy(model, ids, 2)
        if index == 2:
            answer = (answer[0], 10 + (answer[1] - 9) % 48)
        evidence = () if index == 3 else (4, 5, 6)
        kept = tuple(range(length - KEPT, length))
        made.append(AnswerExample(tuple(ids), answer, evidence=evidence, kept=kept))
    return made


def answer_log_probability(model, prompt, answer):
    """Sum of log p(answer token | everything before it), one unpadded forward; and
    whether each answer token is the model's most likely one."""
    ids = torch.tensor([list(prompt) + list(answer)])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].double()
    log_probabilities = logits.log_softmax(dim=-1)
    total = sum(float(log_probabilities[g, token]) for g, token in enumerate(answer))
    right = all(int(logits[g].argmax()) == token for g, token in enumerate(answer))
    return total, right


def maps_of(model, tokenizer, examples, method):
    """The answer maps as the docs define them: each prompt's answer explained token by
    token (left-padded batch), the rows summed, cut to the unpadded prompt."""
    width = max(len(e.input_ids) for e in examples)
    answer_width = max(len(e.answer) for e in examples)
    ids, mask = [], []
    for e in examples:
        pad = width - len(e.input_ids)
        tail = answer_width - len(e.answer)
        ids.append([0] * pad + list(e.input_ids) + list(e.answer) + [0] * tail)
        mask.append([0] * pad + [1] * len(e.input_ids) + [1] * len(e.answer) + [0] * tail)
    generation = Generation(torch.tensor(ids), torch.tensor(mask), prompt_length=width)
    explainer = Explainer(model, tokenizer=tokenizer)
    relevance = explain_generation(explainer, generation, method=method).explanation.relevance
    return [
        relevance[b].double().sum(dim=0)[width - len(e.input_ids) : width].tolist()
        for b, e in enumerate(examples)
    ]


def reference_records(model, tokenizer, example, scores):
    """The protocol for one example in plain loops, from its map `scores`."""
    prompt, answer = list(example.input_ids), example.answer
    special = set(tokenizer.all_special_ids)
    readout = len(prompt) - 1
    removable = [
        p
        for p in range(len(prompt))
        if p != readout and prompt[p] not in special and p not in example.kept
    ]
    most = sorted(removable, key=lambda p: (-scores[p], p))
    least = sorted(removable, key=lambda p: (scores[p], p))

    def without(removed):
        ids = [REPLACEMENT if p in set(removed) else t for p, t in enumerate(prompt)]
        return answer_log_probability(model, ids, answer)[0]

    n = len(removable)
    clean, right = answer_log_probability(model, prompt, answer)
    top = [most[: removed_count(q, n)] for q in ERASER_FRACTIONS]
    return {
        "right": int(right),
        "tokens": n,
        "log_probability": clean,
        "comprehensiveness": [math.exp(clean) - math.exp(without(t)) for t in top],
        "sufficiency": [
            math.exp(clean) - math.exp(without([p for p in removable if p not in t])) for t in top
        ],
        "positive": [without(most[: removed_count(p, n)]) for p in FRACTIONS],
        "negative": [without(least[: removed_count(p, n)]) for p in FRACTIONS],
    }


@pytest.mark.parametrize("method", ["generic", "rollout", "attnlrp"])
def test_records_match_plain_loops(lm, examples, method):
    model, tokenizer = lm
    protocol = LanguageEvidenceTest(model, tokenizer, REPLACEMENT, forward_batch=7)
    records = protocol.evaluate(method, examples)
    assert records_problem(records, LanguageEvidenceTest.fields, len(examples)) is None
    assert records["right"] == [1, 1, 0, 1]
    assert records["evidence"] == [1, 1, 1, 0]
    for b, (example, scores) in enumerate(
        zip(examples, maps_of(model, tokenizer, examples, method), strict=True)
    ):
        expected = reference_records(model, tokenizer, example, scores)
        for key, value in expected.items():
            assert records[key][b] == pytest.approx(value, rel=1e-4, abs=1e-6), key


def test_recall_ranks_the_prompt_without_readout_and_special_tokens(lm, examples):
    model, tokenizer = lm
    records = LanguageEvidenceTest(model, tokenizer, REPLACEMENT).evaluate("rollout", examples)
    for b, (example, scores) in enumerate(
        zip(examples, maps_of(model, tokenizer, examples, "rollout"), strict=True)
    ):
        if not example.evidence:
            assert (records["hits"][b], records["rank"][b]) == ([0.0] * 3, 0.0)
            continue
        prompt = example.input_ids
        candidates = [
            p for p in range(len(prompt) - 1) if prompt[p] not in tokenizer.all_special_ids
        ]
        evidence = [p for p in example.evidence if p in candidates]
        best = max(scores[p] for p in evidence)  # rollout's maps have no ties here
        rank = 1 + sum(scores[p] > best for p in candidates if p not in evidence)
        assert records["rank"][b] == rank
        assert records["hits"][b] == [float(rank <= k) for k in (1, 2, 5)]
    # the special token inside the second prompt is neither ranked nor removed
    assert records["tokens"][1] == len(examples[1].input_ids) - 2 - KEPT


def test_removed_tokens_with_ties_pair_sufficiency_with_comprehensiveness():
    # ten removable tokens (positions 0-9), the last position kept; five tie at the top
    relevance = torch.tensor([[0.5, 0.1, 0.5, 0.5, 0.2, 0.5, 0.3, 0.5, 0.0, 0.0, 9.0]])
    removable = torch.ones(1, 11, dtype=torch.bool)
    removable[0, 10] = False
    rows, removed, inverse = removed_tokens(relevance, removable)
    assert rows.tolist() == [0] * len(rows)

    def copy(request):
        return removed[inverse[0, request]].nonzero().flatten().tolist()

    eraser, curve = len(ERASER_FRACTIONS), len(FRACTIONS)
    assert copy(0) == []  # the prompt as it is
    # q = 10% and 20% of 10 tokens: the first one and two of the tie, in prompt order
    assert copy(1 + 2) == [0] and copy(1 + 3) == [0, 2]
    # sufficiency at 20% keeps exactly those two: it removes every other removable token
    assert copy(1 + eraser + curve + 3) == [1, 3, 4, 5, 6, 7, 8, 9]
    # q = 1% and 5% of 10 tokens remove nothing, and keep nothing: one copy each
    assert copy(1) == [] and copy(1 + eraser + curve) == list(range(10))
    # the negative curve at 30%: the three least relevant, the tie at 0.0 first by position
    assert copy(1 + 2 * eraser + curve + 2) == [1, 8, 9]
    # the positive curve at 60%: the five tied tokens, then 0.3
    assert copy(1 + eraser + 5) == [0, 2, 3, 5, 6, 7]


def _records(**changes):
    """Hand-made records of three examples: right with evidence; right without evidence;
    wrong with evidence."""
    records = {
        "right": [1, 1, 0],
        "tokens": [100, 100, 100],
        "log_probability": [-1.0, -3.0, -10.0],
        "comprehensiveness": [[0.1, 0.2, 0.3, 0.4, 0.5], [0.0] * 5, [0.9] * 5],
        "sufficiency": [[0.0, 0.0, 0.1, 0.1, 0.2], [0.5] * 5, [0.9] * 5],
        "positive": [[-1.5] * 9, [-4.0] * 9, [-20.0] * 9],
        "negative": [[-1.0] * 9, [-3.0] * 9, [-10.0] * 9],
        "evidence": [1, 0, 1],
        "hits": [[1 / 3, 2 / 3, 1.0], [0.0] * 3, [1.0] * 3],
        "rank": [2.0, 0.0, 1.0],
    }
    records.update(changes)
    return records


def _bare(**attributes):
    protocol = object.__new__(LanguageEvidenceTest)
    protocol.__dict__.update(attributes)
    return protocol


def test_summary_of_a_hand_computed_case():
    summary = _bare().summarize(_records())
    assert summary["accuracy"] == pytest.approx(2 / 3)
    assert (summary["right"], summary["with_evidence"]) == (2, 1)
    # recall: only the first example is right and has evidence (its tie: hit@1 = 1/3)
    assert summary["hit@1"] == pytest.approx(1 / 3)
    assert summary["hit@2"] == pytest.approx(2 / 3)
    assert summary["rank"] == pytest.approx(2.0)
    # AOPC over the two right examples: the mean over q of the mean over examples
    assert summary["comprehensiveness"] == pytest.approx((0.05 + 0.1 + 0.15 + 0.2 + 0.25) / 5)
    assert summary["sufficiency"] == pytest.approx((0.25 + 0.25 + 0.3 + 0.3 + 0.35) / 5)
    # curves from the mean clean log-probability (-2) at x = 0
    assert summary["curves"]["positive"] == pytest.approx([-2.0] + [-2.75] * 9)
    assert summary["positive_auc"] == pytest.approx(100 * (0.1 * (-2.0 - 2.75) / 2 + 0.8 * -2.75))
    assert summary["negative_auc"] == pytest.approx(100 * 0.9 * -2.0)
    wrong = summary["wrong"]
    assert wrong["count"] == 1
    assert (wrong["hit@1"], wrong["rank"], wrong["comprehensiveness"]) == (1.0, 1.0, 0.9)


def test_no_example_answered_right_leaves_the_numbers_undefined():
    summary = _bare().summarize(_records(right=[0, 0, 0]))
    assert summary["accuracy"] == 0.0
    assert all(math.isnan(summary[key]) for key in ("hit@1", "rank", "comprehensiveness"))
    assert summary["wrong"]["count"] == 3


def test_bad_examples_and_options_are_refused(lm, examples):
    model, tokenizer = lm
    with pytest.raises(OptionError, match="replacement token"):
        LanguageEvidenceTest(model, tokenizer, 10_000)
    protocol = LanguageEvidenceTest(model, tokenizer, REPLACEMENT)
    image = ImageAnswerExample((1, 2), torch.zeros(3, 4, 4), (3,), torch.zeros(4, 4).bool())
    with pytest.raises(InputError, match="AnswerExample"):
        protocol.evaluate("generic", [image])
    with pytest.raises(InputError, match="outside the prompt"):
        AnswerExample((1, 2, 3), (4,), evidence=(3,))
    with pytest.raises(InputError, match="answer token"):
        AnswerExample((1, 2, 3), ())
    with pytest.raises(OptionError, match="forward_batch"):
        LanguageEvidenceTest(model, tokenizer, REPLACEMENT, forward_batch=0)


def test_the_test_leaves_the_model_as_it_found_it(lm, examples):
    model, tokenizer = lm
    before = ModelState.capture(model)
    LanguageEvidenceTest(model, tokenizer, REPLACEMENT).evaluate("generic", examples[:2])
    assert before.differences(ModelState.capture(model)) == []
