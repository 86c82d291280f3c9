"""scripts/bench_cite.py cuts recall prompts into the spans it ranks: each fact a line,
the filler between two facts in lines of at most --filler-words words, the question
apart; the evidence lines are the asked fact (two hops: the chain's two facts), and
`cite`'s tokenization of the lines is the example's prompt, token for token.
scripts/bench_statements.py's 3-sentence answers hold one fact each, and its own fact's
line is each sentence's."""

from __future__ import annotations

import pytest
from script_modules import script_module

from explain.cite.prompt import TEMPLATE, build_prompt, read_context
from explain.cite.spans import split
from explain.data import recall


@pytest.fixture(scope="module")
def bench_cite():
    """scripts/bench_cite.py as a module (it imports scripts/bench.py as `bench`)."""
    with script_module("bench_cite") as module:
        yield module


@pytest.mark.parametrize(
    ("length", "filler_words", "hops"), [(64, 16, 1), (512, 16, 1), (512, 5, 1), (512, 16, 2)]
)
def test_recall_case_lines_are_the_facts_and_the_filler(bench_cite, length, filler_words, hops):
    for example in recall.examples("heldout", 4, length, hops=hops):
        case = bench_cite.recall_case(example, filler_words)
        lines = case.context.split("\n")
        assert " ".join([*lines, case.question]) == example.text
        assert case.question.split(" ") == [
            recall.VOCABULARY[example.input_ids[p]] for p in example.question_positions
        ]
        assert case.answer == example.answer_text
        facts = [line for line in lines if line.endswith(" .")]
        assert len(facts) == len(example.facts)
        for line in lines:
            words = line.split(" ")
            if line.endswith(" ."):
                assert len(words) == 5  # key (2) value (2) .
            else:
                assert 1 <= len(words) <= filler_words
                assert set(words) <= set(recall.FILLER)
        assert len(case.evidence) == hops
        asked = sorted((example.facts[i] for i in example.asked), key=lambda f: f.start)
        for line, fact in zip(case.evidence, asked, strict=True):
            words = [recall.VOCABULARY[token] for token in (*fact.key, *fact.value)]
            assert lines[line] == " ".join([*words, "."])


def test_filler_runs_are_cut_at_the_stated_length(bench_cite):
    (example,) = recall.examples("heldout", 1, 512)
    # A long run splits into full lines of `filler_words` words and one shorter last line.
    case = bench_cite.recall_case(example, 7)
    lines = case.context.split("\n")
    runs: list[list[int]] = [[]]
    for line in lines:
        if line.endswith(" ."):
            runs.append([])
        else:
            runs[-1].append(len(line.split(" ")))
    for run in runs:
        assert all(count == 7 for count in run[:-1])
    assert any(len(run) > 1 for run in runs)


@pytest.mark.parametrize("hops", [1, 2])
def test_the_lines_tokenize_to_the_example_with_each_fact_one_span(bench_cite, hops):
    tokenizer = recall.build_tokenizer()
    for example in recall.examples("heldout", 3, 256, hops=hops):
        case = bench_cite.recall_case(example)
        context = read_context(case.context, "lines")
        assert [span.text.strip() for span in context.spans] == case.context.split("\n")
        prompt = build_prompt(tokenizer, context, case.question, TEMPLATE, False)
        assert prompt.input_ids.tolist() == list(example.input_ids)
        for line, index in zip(case.evidence, sorted(example.asked), strict=True):
            spans = prompt.token_spans[list(example.facts[index].positions)]
            assert spans.tolist() == [line] * len(example.facts[index].positions)
        assert (prompt.token_spans[list(example.question_positions)] == -1).all()


def test_statements_answers_hold_one_fact_in_each_sentence(bench_cite):
    import bench_statements

    def words(ids) -> list[str]:
        return [recall.VOCABULARY[token] for token in ids]

    for example in recall.examples("heldout", 3, 256):
        context, question, answer, own = bench_statements.statements_case(example)
        lines = context.split("\n")
        spans = read_context(context, "sentences").spans  # the context's sentences: its lines
        assert [span.text.strip() for span in spans] == lines
        asked = example.facts[example.asked[0]]
        assert question.split(" ") == ["?", *words(asked.key)]
        assert lines[own[0]] == " ".join([*words(asked.key), *words(asked.value), "."])
        sentences = split(answer, "sentences")
        assert len(sentences) == len(set(own)) == bench_statements.SENTENCES
        for n, (sentence, line) in enumerate(zip(sentences, own, strict=True)):
            fact = lines[line].split(" ")  # key (2) value (2) .
            said = sentence.text.split()
            assert said == (fact[2:4] if n == 0 else fact[:4]) + (["?"] if n < 2 else [])
