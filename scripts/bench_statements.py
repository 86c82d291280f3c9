"""Answer statements (explain.cite.statements) on a model whose evidence is known: does
each sentence of a 3-sentence answer cite its own fact, and what does the matrix cost?

The answer is built from three facts of a held-out recall prompt of zoo:recall-llama
(explain.data.recall), in the model's own multi-query format: the prompt asks `? a` (the
asked fact's key), and the answer, teacher-forced, is `A ? b B ? c C`: the asked value,
then a question and value about two more facts of the context (drawn from the
example's seed). The context's sentence splitter cuts it into three sentences, `A ?`,
` b B ?` and ` c C`, one per fact. The context's spans are scripts/bench_cite.py's
(each fact a line, the filler between facts in lines of at most 16 words), so each
sentence's own fact is one span. A sentence hits when the top span of its row of
`Citation.statement_relevance` is its own fact's.

Cost: `cite` (check off) gives the whole matrix from one forward and one backward batched
over the answer's tokens; against it, one citation per sentence (that sentence alone as
the answer, the sentences before it read as the question's end: one forward and one
backward per sentence), which each row equals (tests/test_cite_statements.py). Medians
of interleaved calls.

    python scripts/bench_statements.py --count 50 --out docs/cite.md
"""

from __future__ import annotations

import argparse
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import torch
from bench import machine
from bench_cite import LENGTH, recall_case, with_section
from tqdm import tqdm

from explain import Explainer
from explain.cite import cite
from explain.data import recall

MARKERS = (
    "<!-- answer statements: scripts/bench_statements.py -->",
    "<!-- end of answer statements -->",
)
SENTENCES = 3
"""Facts, and so sentences, of each answer."""
GOAL = 0.9
"""Issue 43's goal: each sentence's top span is its own fact on at least this share."""


def words(ids: tuple[int, ...]) -> str:
    return " ".join(recall.VOCABULARY[token] for token in ids)


def statements_case(example: recall.RecallExample) -> tuple[str, str, str, list[int]]:
    """(context, question, answer, each sentence's fact's line) of `example`: the asked
    fact and two more (drawn from its seed), the answer `A ? b B ? c C`."""
    case = recall_case(example)
    lines = case.context.split("\n")
    others = [i for i in range(len(example.facts)) if i != example.asked[0]]
    rng = np.random.default_rng((example.seed, SENTENCES))
    facts = [example.asked[0], *rng.choice(others, SENTENCES - 1, replace=False).tolist()]
    chosen = [example.facts[i] for i in facts]
    parts = [words(chosen[0].value)]
    parts += [f"{recall.ASK} {words(f.key)} {words(f.value)}" for f in chosen[1:]]
    answer = " ".join(parts)
    own = [lines.index(f"{words(f.key)} {words(f.value)} {recall.END}") for f in chosen]
    return case.context, case.question, answer, own


def value_accuracy(explainer: Explainer, result, example: recall.RecallExample) -> float:
    """The share of the answer's value tokens the model predicts greedily (teacher-forced):
    whether the answer is one the model gives."""
    ids = torch.cat([result.prompt_ids, result.answer_ids])[None]
    with torch.no_grad():
        predicted = explainer.adapter.model(input_ids=ids).logits[0, :-1].argmax(-1)
    start = result.prompt_ids.numel()
    vocabulary = set(recall.NUMBERS) | set(recall.THINGS)
    values = [g for g, token in enumerate(result.answer_tokens) if token in vocabulary]
    return sum(int(predicted[start + g - 1] == result.answer_ids[g]) for g in values) / len(values)


def per_sentence(
    explainer: Explainer, context: str, question: str, answer: str, result, method, score
) -> torch.Tensor:
    """One citation per sentence: that sentence alone, those before it in the question."""
    rows = []
    for sentence in result.sentences:
        asked = f"{question} {answer[: sentence.start]}".rstrip()
        alone = cite(explainer, context, asked, sentence.text.strip(), method=method,
                     score=score, ablate=0, check=False)  # fmt: skip
        rows.append(alone.scores)
    return torch.stack(rows)


def run(args: argparse.Namespace) -> str:
    from explain.loading import load_model

    explainer = Explainer(load_model(args.model).model, tokenizer=recall.build_tokenizer())
    examples = recall.examples("heldout", args.count, args.length)
    runs = [(method, score) for method in args.methods for score in args.scores]
    hits = {run: np.zeros((args.count, SENTENCES), dtype=bool) for run in runs}
    largest = {run: np.zeros((args.count, SENTENCES), dtype=bool) for run in runs}
    accuracy, matrix_s, separate_s, agree = [], [], [], []
    for index, example in enumerate(tqdm(examples, desc="statements")):
        context, question, answer, own = statements_case(example)
        for method, score in runs:
            start = time.perf_counter()
            result = cite(explainer, context, question, answer, method=method, score=score,
                          ablate=0, check=False)  # fmt: skip
            took = time.perf_counter() - start
            if len(result.sentences) != SENTENCES:
                raise RuntimeError(f"{answer!r} split into {len(result.sentences)} sentences")
            top = result.statement_relevance.double().argmax(dim=1).tolist()
            hits[method, score][index] = [t == o for t, o in zip(top, own, strict=True)]
            top = result.statement_relevance.double().abs().argmax(dim=1).tolist()
            largest[method, score][index] = [t == o for t, o in zip(top, own, strict=True)]
            if (method, score) == runs[0]:
                accuracy.append(value_accuracy(explainer, result, example))
                start = time.perf_counter()
                rows = per_sentence(explainer, context, question, answer, result, method, score)
                separate_s.append(time.perf_counter() - start)
                matrix_s.append(took)
                scale = float(rows.abs().max())
                agree.append(float((rows - result.statement_relevance).abs().max()) / scale)
    first = f"{runs[0][0]}, {runs[0][1]}"
    written = "" if args.out is None else f" --out {args.out}"
    lines = [
        MARKERS[0],
        f"Generated by `python scripts/bench_statements.py --count {args.count}{written}` on "
        f"{datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}, {machine()}. "
        f"`{args.model}`; {args.count} held-out recall prompts of {args.length} tokens; "
        f"the answer `A ? b B ? c C` from three of each context's facts (module doc of the "
        f"script); the model predicts {statistics.mean(accuracy):.3f} of the answers' value "
        "tokens greedily (teacher-forced).",
        "",
        "| method | score | sentence 1 | sentence 2 | sentence 3 | every sentence | all three "
        "of a prompt | own fact at the largest \\|score\\| |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (method, score), found in hits.items():
        each = " | ".join(f"{found[:, n].mean():.3f}" for n in range(SENTENCES))
        lines.append(
            f"| {method} | {score} | {each} | {found.mean():.3f} | "
            f"{found.all(axis=1).mean():.3f} | {largest[method, score].mean():.3f} |"
        )
    matrix, separate = statistics.median(matrix_s), statistics.median(separate_s)
    lines += [
        "",
        f"Share of prompts where the sentence's top span is its own fact (goal: at least "
        f"{GOAL:g} for each sentence). Cost ({first}): the matrix with the citation, "
        f"{matrix:.3f} s a prompt (median), against {separate:.3f} s for one citation per "
        f"sentence ({separate / matrix:.2f}x); the two agree to {max(agree):.1e} of the "
        "largest |score|.",
        MARKERS[1],
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="zoo:recall-llama")
    parser.add_argument("--count", type=int, default=50, help="held-out prompts")
    parser.add_argument("--length", type=int, default=LENGTH, help="prompt length in tokens")
    parser.add_argument(
        "--methods", type=lambda text: text.split(","), default=["cp_lrp", "attnlrp", "generic"]
    )
    parser.add_argument(
        "--scores",
        type=lambda text: text.split(","),
        default=["log_probability", "logit", "probability"],
        help="what each answer token's explanation differentiates (cite's score=)",
    )
    parser.add_argument("--out", type=Path, default=None, help="a Markdown file to update")
    args = parser.parse_args()
    torch.set_num_threads(1)
    section = run(args)
    print(section)
    if args.out is not None:
        with_section(args.out, MARKERS, section)


if __name__ == "__main__":
    main()
