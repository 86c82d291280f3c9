"""Span attribution (explain cite) side by side with ContextCite, and its cost against the
batched floor.

Quality (default): on the zoo's recall language model (`zoo:recall-llama`, whose evidence
is known: explain.data.recall), held-out prompts of --length tokens, the same contexts,
spans and answers for every method a language model takes and for ContextCite at 32, 64
and 256 ablations; each ranking is scored by the same ablation check (explain.cite.check:
the answer's log-probability drop when the top-1/3/5 spans are removed, against as many
random spans; the LDS from --lds random ablations of half the spans), by span-level
evidence recall (the asked fact's span among the top 1 and 3 spans; two hops, --hops 2:
both facts of the asked chain among the top 2) and by its time per example. Each of
--ablate-methods runs again with `cite(..., ablate=--ablate)` (its spans of largest
|score| rescored by leave-one-out drops: explain.cite.leave_one_out). The spans are
sentence-like, as a user would cut the context: each fact
`key value .` one span, and the filler words between two facts one span, a run longer
than --filler-words words cut every --filler-words words (the last piece shorter); the
context is written one span per line (spans="lines"; the word-level tokenizer reads a
newline as the space it replaces, so the prompt's tokens are the example's). The
question `? key` is the query, never ranked; the answer explained is the example's
answer (its two words), whether or not the model answers it. ContextCite gets our spans
through a partitioner (its own sentence splitter needs nltk's punkt_tab, which cannot be
downloaded offline), its prompt is ours (the tokenizer's chat template renders the
message as it is), and its response is the answer explained.

Cost (--cost): span attribution of a 2,000-token prompt with a 32-token answer, and of
an 8,192-token one (the streamed path), against the batched floor: one forward and one
backward of every answer token's log-probability (scripts/bench.py's generation floor),
on the narrow random Llama of scripts/bench.py's long prompts; the prompts are held-out
recall prompts of that length, cut into spans as above, and the answer random words of
the recall vocabulary (the model is random: only the shapes matter); medians of
interleaved rounds and the peak memory each call adds.

Check cost (--check-cost): the ablation check (--lds random halves) of cp_lrp's span
scores on a held-out recall prompt of 512 and of 2,048 tokens, on --model, against one
forward of the whole prompt and answer: the check's time in full forwards.

ContextCite is not a dependency of explain (`--ablations` with no count leaves it out,
and the table says so). To run the quality benchmark:

    pip install context-cite     # imports nltk, spacy, datasets, pandas, scikit-learn
    python scripts/bench_cite.py --out docs/benchmarks.md
    python scripts/bench_cite.py --cost --out docs/benchmarks.md
    python scripts/bench_cite.py --check-cost --out docs/benchmarks.md

--model takes any model spec explain loads (zoo:NAME, a folder) of a language model
trained on explain.data.recall with its word-level tokenizer (default zoo:recall-llama;
the two-hop zoo:twohop-llama with --hops 2).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch
from bench import generation_floor, machine, narrow_model, peak_memory, timed
from tqdm import tqdm

from explain import Explainer
from explain.cite import Span, check_ranking, cite
from explain.cite.check import DRAWS, ablated_targets, check_scores, kept_tokens
from explain.data import recall
from explain.engine import Request, supported_methods
from explain.evaluation.bootstrap import draws, standard_error
from explain.export import atomic_write
from explain.generation import generation_default
from explain.rules import Need, get_method

QUALITY = ("<!-- span attribution: scripts/bench_cite.py -->", "<!-- end of span attribution -->")
QUALITY_TWO_HOPS = (
    "<!-- two-hop span attribution: scripts/bench_cite.py -->",
    "<!-- end of two-hop span attribution -->",
)
COST = (
    "<!-- span attribution cost: scripts/bench_cite.py -->",
    "<!-- end of span attribution cost -->",
)
CHECK_COST = (
    "<!-- cite check cost: scripts/bench_cite.py -->",
    "<!-- end of cite check cost -->",
)
CHECK_LENGTHS = (512, 2048)
CHECK_FORWARDS = 40
"""The check's goal: at most the time of this many full forwards (issue 42)."""
BOTH_FACTS = 0.8
"""The two-hop goal: both facts in the top 2 spans on this share of the right answers
(issue 42)."""
"""The check's goal: at most the time of this many full forwards (issue 42)."""
ABLATIONS = (32, 64, 256)
TOP = (1, 3, 5)
WHY_LDS = (
    "Why ContextCite leads on LDS: it fits its scores (a LASSO over its own ablations) to "
    "exactly what the LDS measures, the answer's log-probability under random halves of "
    "the spans, while a single-backward method reads the model at the whole context. "
    "Where one span carries the answer, the best rankings agree on the top span; the LDS "
    "then also ranks the weak spans, where a linear fit to ablations has the edge. Its "
    "time grows with the ablations; ours is one explanation."
)
MANY_PASSES = frozenset({Need.EMBEDDING_COPIES})
"""The needs of methods that take many forwards (or backwards): not single-backward."""
LONG_ANSWER = 4
"""Answer tokens of the 8,192-token cost case."""
SHORT_PROMPT = 360
"""Tokens of the short cost case (32 of them the answer): below CPU_FUSED_MIN_TOKENS,
where `choose_path` weighs the answer's columns (issue 42: 359 x 32 took 1.04 s on the
explicit path against 0.36 s streamed)."""
FILLER_WORDS = 16
"""The most filler words one span holds by default (a sentence's length)."""
LENGTH = 512
"""The prompts' length in tokens by default: recall-llama's trained length."""


def quality_markers(hops: int, length: int) -> tuple[str, str]:
    """The markers of the quality section: one section per number of hops and prompt
    length, so that the 512- and 1,024-token tables are each regenerated by their command
    (the default length keeps the markers it always had)."""
    begin, end = QUALITY_TWO_HOPS if hops == 2 else QUALITY
    if length == LENGTH:
        return begin, end
    return (
        begin.replace(" attribution:", f" attribution at {length} tokens:"),
        end.replace(" -->", f" at {length} tokens -->"),
    )


@dataclass(frozen=True)
class Case:
    """A recall example as `cite` takes it: the context one span per line, the question,
    the answer, and the lines of the asked fact(s) (the evidence spans: one, or the
    chain's two, in the order of the context)."""

    context: str
    question: str
    answer: str
    evidence: tuple[int, ...]


def recall_case(example: recall.RecallExample, filler_words: int = FILLER_WORDS) -> Case:
    """`example` cut into sentence-like spans: each fact `key value .` a line, the filler
    words between two facts a line, cut every `filler_words` words; the question (the
    prompt's last words) apart."""
    words = example.text.split(" ")  # word i is token i + 1
    first_question = example.question_positions[0] - 1
    facts = {fact.start - 1: index for index, fact in enumerate(example.facts)}
    lines: list[str] = []
    filler: list[str] = []
    evidence: list[int] = []

    def flush() -> None:
        for at in range(0, len(filler), filler_words):
            lines.append(" ".join(filler[at : at + filler_words]))
        filler.clear()

    at = 0
    while at < first_question:
        if at in facts:
            flush()
            fact = example.facts[facts[at]]
            end = at + len(fact.key) + len(fact.value) + 1  # key value .
            if facts[at] in example.asked:
                evidence.append(len(lines))
            lines.append(" ".join(words[at:end]))
            at = end
        else:
            filler.append(words[at])
            at += 1
    flush()
    question = " ".join(words[first_question:])
    return Case("\n".join(lines), question, example.answer_text, tuple(evidence))


def with_section(path: Path, markers: tuple[str, str], section: str) -> None:
    """Replace the text between `markers` in `path` with `section` (appended if absent)."""
    begin, end = markers
    text = path.read_text() if path.exists() else ""
    if begin in text and end in text:
        text = text[: text.index(begin)] + section + text[text.index(end) + len(end) :]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    with atomic_write(path, "w") as handle:
        handle.write(text)


def mean_and_error(values: Sequence[float]) -> str:
    """'mean ± bootstrap standard error' over the examples (the same draws for all)."""
    data = torch.tensor(values, dtype=torch.float64)
    means = torch.cat([data[indices].mean(dim=1) for indices in draws(len(data))])
    return f"{float(data.mean()):.3f} ± {standard_error(means):.3f}"


def context_cite_partitioner(context: str, spans: Sequence[Span]):
    """A ContextCite partitioner whose sources are our spans (each with the whitespace
    before it, so the kept spans joined are the ablated context)."""
    from context_cite.context_partitioner import BaseContextPartitioner

    class OurSpans(BaseContextPartitioner):
        @property
        def num_sources(self) -> int:
            return len(spans)

        def split_context(self) -> None:  # the spans are given
            return None

        def get_source(self, index: int) -> str:
            return spans[index].text

        def get_context(self, mask=None) -> str:
            kept = range(len(spans)) if mask is None else np.flatnonzero(mask)
            return "".join(spans[i].text for i in kept)

    return OurSpans(context)


def context_cite_scores(loaded, result, ablations: int) -> np.ndarray:
    """ContextCite's span scores for `result`'s answer, from `ablations` ablations."""
    from context_cite import ContextCiter

    tokenizer = loaded.tokenizer
    tokenizer.padding_side = "left"  # ContextCite batches with left padding
    citer = ContextCiter(
        loaded.model,
        tokenizer,
        result.context,
        result.question,
        num_ablations=ablations,
        batch_size=32,
        prompt_template="{context}\n\n{query}",
        partitioner=context_cite_partitioner(result.context, result.spans),
    )
    # The prompt ContextCite builds must be ours, token for token; the response is ours.
    prompt_ids = citer._get_prompt_ids()
    assert prompt_ids == result.prompt_ids.tolist(), "ContextCite reads another prompt"
    citer._cache["output"] = citer._get_prompt_ids(return_prompt=True)[1] + " " + result.answer
    assert citer._response_ids == result.answer_ids.tolist(), "another response"
    return citer.get_attributions(verbose=False)


def quality(args: argparse.Namespace) -> str:
    from explain.loading import load_model

    loaded = load_model(args.model)
    tokenizer = loaded.tokenizer
    tokenizer.chat_template = (
        "{{ bos_token }} {% for m in messages %}{{ m['content'] }}{% endfor %}"
    )
    explainer = Explainer(loaded.model, tokenizer=tokenizer)
    methods = args.methods or supported_methods(explainer.adapter, Request(prompt_length=1))
    # Each of --sparse-methods again with sparse=--sparse (explain.cite.cite): one pass.
    sparse = {f"{m}, sparse {args.sparse:g}": m for m in args.sparse_methods if args.sparse}
    # Each of --ablate-methods again with each ablate=k of --ablate: one pass and k + 1
    # ablated forwards (explain.cite.leave_one_out).
    ablated = {f"{m}, ablate {k}": (m, k) for m in args.ablate_methods for k in args.ablate if k}
    cited = [*methods, *sparse, *ablated]
    names = [*cited, *(f"ContextCite, {n} ablations" for n in args.ablations)]
    rows: dict[str, dict[str, list[float]]] = {
        name: {key: [] for key in ("seconds", "lds", "hit1", "hit3", "all", *map(str, TOP), "r1")}
        for name in names
    }
    correct = 0
    counts: list[int] = []
    held_out = recall.examples("heldout", args.examples, args.length, hops=args.hops)
    right: list[bool] = []
    for index, example in enumerate(tqdm(held_out, desc="examples", unit="example")):
        case = recall_case(example, args.filler_words)
        scores: dict[str, Any] = {}
        first = None
        for name, method, share, ablate in [
            *((m, m, 0.0, 0) for m in methods),
            *((name, m, args.sparse, 0) for name, m in sparse.items()),
            *((name, m, 0.0, k) for name, (m, k) in ablated.items()),
        ]:
            started = time.perf_counter()
            result = cite(
                explainer,
                case.context,
                case.question,
                case.answer,
                spans="lines",
                method=method,
                sparse=share,
                ablate=ablate,
                check=False,
            )
            rows[name]["seconds"].append(time.perf_counter() - started)
            scores[name] = result.scores
            first = first or result
        assert first is not None
        # The prompt is the example's, token for token, and its evidence the case's line.
        assert first.prompt_ids.tolist() == list(example.input_ids), "another prompt"
        assert first.answer_ids.tolist() == list(example.answer), "another answer"
        at = first.token_spans[list(example.evidence_positions)]
        assert set(at.tolist()) == set(case.evidence), "the evidence is not the fact spans"
        for ablations in args.ablations:
            name = f"ContextCite, {ablations} ablations"
            started = time.perf_counter()
            found = context_cite_scores(loaded, first, ablations)
            rows[name]["seconds"].append(time.perf_counter() - started)
            scores[name] = torch.from_numpy(np.asarray(found, dtype=np.float64))
        ids = first.prompt_ids[None]
        with torch.no_grad():
            out = loaded.model.generate(
                ids, max_new_tokens=len(example.answer), do_sample=False, pad_token_id=0
            )
        right.append(out[0, ids.shape[1] :].tolist() == list(example.answer))
        correct += right[-1]
        evidence = set(case.evidence)
        counts.append(len(first.spans))
        for name, ranking in scores.items():
            check = check_ranking(
                explainer.adapter,
                first.prompt_ids,
                first.token_spans,
                [(first.answer_ids, 1.0)],
                ranking,
                lds=args.lds,
                seed=index,
            )
            drops = {d.k: d for d in check.drops}
            for k in TOP:
                rows[name][str(k)].append(drops[k].top)
            rows[name]["r1"].append(drops[1].random)
            rows[name]["lds"].append(float("nan") if check.lds is None else check.lds)
            order = ranking.double().argsort(descending=True, stable=True).tolist()
            rows[name]["hit1"].append(float(order[0] in evidence))
            rows[name]["hit3"].append(float(bool(set(order[:3]) & evidence)))
            rows[name]["all"].append(float(evidence <= set(order[: len(evidence)])))
    compared = bool(args.ablations)  # ContextCite ran: its last row is the reference
    reference = statistics.median(rows[names[-1]]["seconds"]) if compared else None
    date = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    two_hops = args.hops == 2
    kept = [i for i, good in enumerate(right) if good]
    markers = quality_markers(args.hops, args.length)
    at_length = "" if args.length == LENGTH else f" at {args.length:,} tokens"
    lines = [
        markers[0],
        f"## {'Two-hop span' if two_hops else 'Span'} attribution"
        + (" against ContextCite" if compared else "")
        + at_length,
        "",
        f"Generated by `python {' '.join(['scripts/bench_cite.py', *sys.argv[1:]])}` on {date}, "
        f"{machine()}.",
        "",
        f"Model: `{args.model}`; {args.examples} held-out prompts of {args.length} tokens of "
        + (
            "explain.data.recall with two hops (chains `a b .` and `b c .` among other "
            "chains and filler words, then `?? a`; the answer explained is c, two tokens, "
            "found through the bridge b); the "
            if two_hops
            else "explain.data.recall (facts `key value .` among distractor facts and filler "
            "words, then `? key`; the answer explained is the asked fact's value, two "
            "tokens); the "
        )
        + f"model answers {correct} of them exactly (greedy). Spans: each fact one span, the "
        f"filler words between two facts one span, cut every {args.filler_words} words "
        f"({statistics.mean(counts):.1f} spans a context on average); the question is "
        "ContextCite's query, never ranked; the evidence is "
        + ("the chain's two fact spans" if two_hops else "the asked fact's span")
        + ". The same "
        "spans, prompt and answer for every ranking. Every ranking is scored by "
        "explain.cite.check: the drop of log p(answer) when its top-k spans are removed "
        "(random k = 1: the mean drop for one random span), and the LDS from "
        f"{args.lds} random ablations of half the spans (Spearman; the same ablations for "
        "every ranking of an example); evidence: "
        + (
            "a fact of the chain is the top-ranked span (top-1) or among the top 3, both "
            "facts are the top 2 spans (over every prompt, and over those answered right). "
            if two_hops
            else "the asked fact's span is the top-ranked span (top-1) or among the top 3. "
        )
        + (
            "Rows `M, ablate k`: method M's scores with its k spans of largest |score| each "
            "removed alone and scored by the drop of log p(answer) (`cite(..., ablate=k)`: "
            "one backward and k + 1 ablated forwards). "
            if ablated
            else ""
        )
        + "Time: the median seconds per "
        "example (explain: `cite` with check=False; ContextCite: its ablation forwards, "
        "batch 32, and its LASSO fit). Means ± bootstrap standard errors over the examples."
        + (
            ""
            if compared
            else " ContextCite: not run (`--ablations` with no count: the package "
            "context-cite was not installed for this run)."
        ),
        "",
        "| ranking | s per example | "
        + (f"x less time than ContextCite-{args.ablations[-1]} | " if compared else "")
        + "LDS | evidence top-1 | evidence top-3 | "
        + ("both facts top-2 | both facts top-2, right answers | " if two_hops else "")
        + "top-1 drop | top-3 drop | top-5 drop | random-1 drop |",
        "|---|" + "---:|" * (8 + 2 * two_hops + compared),
    ]
    for name in names:
        row = rows[name]
        seconds = statistics.median(row["seconds"])
        lds = [v for v in row["lds"] if v == v]
        less = f"{reference / seconds:.1f} | " if reference is not None else ""
        lines.append(
            f"| {name} | {seconds:.3f} | {less}{mean_and_error(lds)} | "
            f"{mean_and_error(row['hit1'])} | {mean_and_error(row['hit3'])} | "
            + (
                f"{mean_and_error(row['all'])} | "
                f"{mean_and_error([row['all'][i] for i in kept]) if kept else 'none right'} | "
                if two_hops
                else ""
            )
            + " | ".join(mean_and_error(row[str(k)]) for k in TOP)
            + f" | {mean_and_error(row['r1'])} |"
        )
    lines.append("")
    if two_hops:
        default = generation_default(explainer).method
        lines.append(both_facts_goal(rows, kept, default, ablated))
    if compared:
        assert reference is not None
        # The goal's candidates: one forward and at most one backward (not integrated
        # gradients' path, not occlusion's forwards, not the ablate rows' forwards).
        single = [
            name
            for name in [*methods, *sparse]
            if not get_method(sparse.get(name, name)).needs & MANY_PASSES
        ]
        best = max(single, key=lambda m: np.nanmean(rows[m]["lds"]))
        # Paired over the examples where both LDS are defined: the mean difference and its
        # bootstrap standard error.
        pairs = [
            (x, y)
            for x, y in zip(rows[best]["lds"], rows[names[-1]]["lds"], strict=True)
            if x == x and y == y
        ]
        difference = mean_and_error([x - y for x, y in pairs])
        gap = float(np.mean([x - y for x, y in pairs]))
        ratio = reference / statistics.median(rows[best]["seconds"])
        met = gap > 0 and ratio >= 20
        lines.append(
            f"- goal: a single-backward method with an LDS above ContextCite's with "
            f"{args.ablations[-1]} ablations at 20x less time or more; best LDS among "
            f"{', '.join(single)}: {best}, {difference} against ContextCite's (paired over "
            f"{len(pairs)} prompts), {ratio:.0f}x less time: {'met' if met else 'not met'}"
        )
        if gap < 0:
            lines += ["", WHY_LDS]
    lines.append(markers[1])  # the section's own (two hops, another length: theirs)
    return "\n".join(lines)


def both_facts_goal(
    rows: dict[str, dict[str, list[float]]],
    right: Sequence[int],
    default: str,
    ablated: dict[str, tuple[str, int]],
) -> str:
    """The two-hop goal's line: the share of right answers whose both facts the language
    models' `default` method puts in its top 2, and the same with its `ablated` rows."""

    def share(name: str) -> str:
        hits = [rows[name]["all"][i] for i in right]
        return f"{name} {sum(hits):.0f} of {len(hits)}" if hits else f"{name}: none right"

    names = [default, *(name for name, (m, _) in ablated.items() if m == default)]
    found = [share(name) for name in names]
    met = [
        name
        for name in names
        if right and statistics.mean(rows[name]["all"][i] for i in right) >= BOTH_FACTS
    ]
    return (
        f"- goal (two hops): the default method of a language model (`{default}`) puts both "
        f"facts in the top 2 on at least {BOTH_FACTS:.0%} of the right answers: "
        + ", ".join(found)
        + (f": met by {', '.join(met)}" if met else ": not met")
    )


def cost_case(tokens: int, answer_tokens: int = 32) -> tuple[Case, str]:
    """The first held-out recall prompt of `tokens - answer_tokens` tokens as a case (its
    spans as in the quality benchmark), and an answer of `answer_tokens` random words of
    the recall vocabulary: `tokens` tokens in all."""
    rng = np.random.default_rng(0)
    (example,) = recall.examples("heldout", 1, tokens - answer_tokens)
    words = [*recall.ADJECTIVES, *recall.NUMBERS, *recall.FILLER]
    return recall_case(example), " ".join(rng.choice(words, size=answer_tokens))


def cite_variant(method: str, path: str) -> str:
    """A cost table's row name for `cite` with `method` on attention path `path`."""
    return f"cite, {method}" if path == "auto" else f"cite, {method}, {path} path"


def probe_path(explainer: Explainer, case: Case, answer: str, method: str) -> str:
    """The attention path `cite` takes for `case` and `answer` (`Explanation.settings`)."""
    result = cite(explainer, case.context, case.question, answer, spans="lines",
                  method=method, check=False)  # fmt: skip
    assert result.explanation is not None
    return result.explanation.explanation.settings["attention_path"]


def cost(args: argparse.Namespace) -> str:
    torch.manual_seed(0)
    model = narrow_model("llama-narrow").eval()
    tokenizer = recall.build_tokenizer()
    explainers = {
        path: Explainer(model, tokenizer=tokenizer, attention_path=path)
        for path in ("auto", "explicit")
    }
    explainer = explainers["auto"]
    device = torch.device("cpu")
    lines = [
        COST[0],
        "## Span attribution: cost against the batched floor",
        "",
        f"Generated by `python {' '.join(['scripts/bench_cite.py', *sys.argv[1:]])}` on "
        f"{datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}, {machine()}. The narrow "
        "random Llama of the long prompts (4 blocks, width 64, 4 heads, vocabulary 1024); a "
        "held-out recall prompt (explain.data.recall; its spans as in the quality "
        f"benchmark: a fact, or at most {FILLER_WORDS} filler words) and an answer of random "
        "recall words, 2,000 tokens in all with a 32-token answer. The floor: one forward "
        "and one backward of every answer token's log-probability to the first "
        "block's input, batched over the answer's tokens (scripts/bench.py's generation "
        "floor). `cite`: the whole span attribution (tokenizing with offsets, the "
        "generation explanation, the span sums), check off. Medians of "
        f"{args.rounds} interleaved rounds after a warm-up round at 2,000 tokens; peak: the "
        "memory one more call adds. Goals: at 2,000 tokens, at most 1.5x the floor's time; "
        f"at 8,192 tokens (generic, on the streamed fold; a {LONG_ANSWER}-token answer: "
        "32 batched columns at 8,192 tokens take over 15 minutes a call on this shared "
        "2-core machine, floor and explanation alike), at most 2x its time and 1.5x its "
        f"memory. At {SHORT_PROMPT} tokens with a 32-token answer (below the 384 tokens "
        "from which the fused path is taken whatever the columns), the path "
        '`attention_path="auto"` takes for generic against the explicit path, which it '
        "took before `choose_path` weighed the answer's columns: auto at most the explicit "
        "path's time.",
    ]
    cases = (
        (2000, 32, (1.5, None), args.cost_methods, ("auto",)),
        (8192, LONG_ANSWER, (2.0, 1.5), ["generic"], ("auto",)),
        (SHORT_PROMPT, 32, (None, None), ["generic"], ("auto", "explicit")),
    )
    for tokens, answer_tokens, limits, methods, paths in cases:
        case, answer = cost_case(tokens, answer_tokens)
        probe = cite(explainer, case.context, case.question, answer, spans="lines", check=False)
        width = probe.prompt_ids.shape[0]
        ids = torch.cat([probe.prompt_ids, probe.answer_ids])[None]
        inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        calls: dict[str, Callable[[], Any]] = {
            "floor (forward + batched backward)": generation_floor(
                model, inputs, width, log_probability=True
            )
        }
        for method in methods:
            for path in paths:
                calls[cite_variant(method, path)] = functools.partial(
                    cite,
                    explainers[path],
                    case.context,
                    case.question,
                    answer,
                    spans="lines",
                    method=method,
                    check=False,
                )
        if tokens == cases[0][0]:  # a warm-up round (the longer case runs warm after it)
            for call in calls.values():
                call()
        seconds: dict[str, list[float]] = {name: [] for name in calls}
        for _ in tqdm(range(args.rounds), desc=f"{tokens} tokens", unit="round"):
            for name, call in calls.items():
                seconds[name].append(timed(call, device))
        peaks = {name: peak_memory(call, device) for name, call in calls.items()}
        floor_s = statistics.median(next(iter(seconds.values())))
        floor_peak = next(iter(peaks.values()))
        lines += [
            "",
            f"### {width + probe.answer_ids.shape[0]} tokens ({width}-token prompt, "
            f"{probe.answer_ids.shape[0]}-token answer, {len(probe.spans)} spans)",
            "",
            "| variant | median s | time / floor | peak MiB | memory / floor |",
            "|---|---:|---:|---:|---:|",
        ]
        for name in calls:
            median = statistics.median(seconds[name])
            lines.append(
                f"| {name} | {median:.2f} | {median / floor_s:.2f} | {peaks[name] / 2**20:.0f} "
                f"| {peaks[name] / floor_peak:.2f} |"
            )
        time_limit, memory_limit = limits
        lines.append("")
        print("\n".join(lines), flush=True)  # each case as soon as it is measured
        for method in methods:
            name = f"cite, {method}"
            if "explicit" in paths:
                ratio = statistics.median(seconds[name]) / statistics.median(
                    seconds[cite_variant(method, "explicit")]
                )
                verdict = "met" if ratio <= 1 else "not met"
                taken = probe_path(explainer, case, answer, method)
                lines.append(
                    f"- goal {method}, auto ({taken}) time / explicit path at most 1: "
                    f"{ratio:.2f}, {verdict}"
                )
            if time_limit is None:
                continue
            ratio = statistics.median(seconds[name]) / floor_s
            verdict = "met" if ratio <= time_limit else "not met"
            lines.append(
                f"- goal {method} time / floor at most {time_limit}: {ratio:.2f}, {verdict}"
            )
            if memory_limit is not None:
                ratio = peaks[name] / floor_peak
                verdict = "met" if ratio <= memory_limit else "not met"
                lines.append(
                    f"- goal {method} memory / floor at most {memory_limit}: {ratio:.2f}, {verdict}"
                )
    lines.append(COST[1])
    return "\n".join(lines)


def kv_reuse_bound(explainer: Explainer, probe: Any, lds: int) -> tuple[float, float]:
    """The check's ablated sequences (`check_scores`' own ablations of `probe`'s scores)
    in whole sequences' worth (prompt and answer), and what is left of them if each
    ablation reused the full prompt's KV cache up to its first removed token: the most a
    prefix cache could save (issue 42, item 5)."""
    seen: list[torch.Tensor] = []

    def recorded(keep: torch.Tensor) -> torch.Tensor:
        seen.append(keep)
        answers = [(probe.answer_ids, 1.0)]
        return ablated_targets(
            explainer.adapter, probe.prompt_ids, probe.token_spans, answers, keep
        )

    check_scores(probe.scores, recorded, lds=lds)
    (keep,) = seen
    kept = kept_tokens(probe.token_spans, keep)  # (R, P)
    prompt = kept.shape[1]
    # The prefix before each ablation's first removed token (all of it: nothing removed).
    prefix = torch.where(kept.all(dim=1), prompt, (~kept).int().argmax(dim=1))
    whole = prompt + probe.answer_ids.shape[0]
    tokens = kept.sum(dim=1) + probe.answer_ids.shape[0]
    return float(tokens.sum()) / whole, float((tokens - prefix).sum()) / whole


def check_cost(args: argparse.Namespace) -> str:
    from explain.loading import load_model

    explainer = Explainer(load_model(args.model).model, tokenizer=recall.build_tokenizer())
    model, device = explainer.adapter.model, torch.device("cpu")
    lines = [
        CHECK_COST[0],
        "## The cite check's cost, in full forwards",
        "",
        f"Generated by `python {' '.join(['scripts/bench_cite.py', *sys.argv[1:]])}` on "
        f"{datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}, {machine()}. `{args.model}`; "
        "a held-out recall prompt of each length, its spans as in the quality benchmark, "
        "its answer (two tokens), cp_lrp's span scores. The check: explain.cite.check's "
        f"check_ranking with the top-1/3/5 drops (16 random draws each) and --lds "
        f"{args.lds} random halves. One forward: the model on the whole prompt and answer, "
        f"batch 1, no gradient. Medians of {args.rounds} interleaved rounds after a warm-up "
        f"round. Goal: the check at most {CHECK_FORWARDS} forwards' time.",
        "",
        "KV reuse bound: the ablated sequences' tokens (each ablation's kept prompt tokens "
        "and the answer) in whole sequences' worth, and what would be left if every "
        "ablation reused the KV cache of the full prompt up to its first removed token "
        "(its tokens minus that prefix; the full context then forwards its answer only).",
        "",
        "| prompt tokens | spans | ablations | one forward, ms | check, s | check / forward "
        "| ablated tokens, sequences | with KV reuse, sequences |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    ratios = []
    for length in CHECK_LENGTHS:
        (example,) = recall.examples("heldout", 1, length)
        case = recall_case(example, args.filler_words)
        probe = cite(
            explainer, case.context, case.question, case.answer, spans="lines",
            method="cp_lrp", check=False,
        )  # fmt: skip
        ids = torch.cat([probe.prompt_ids, probe.answer_ids])[None]

        def forward(ids: torch.Tensor = ids) -> None:
            with torch.no_grad():
                model(input_ids=ids)

        check = functools.partial(
            check_ranking, explainer.adapter, probe.prompt_ids, probe.token_spans,
            [(probe.answer_ids, 1.0)], probe.scores, lds=args.lds,
        )  # fmt: skip
        seconds: dict[str, list[float]] = {"forward": [], "check": []}
        forward(), check()
        for _ in tqdm(range(args.rounds), desc=f"{length} tokens", unit="round"):
            seconds["forward"].append(timed(forward, device))
            seconds["check"].append(timed(check, device))
        one, whole = (statistics.median(seconds[name]) for name in ("forward", "check"))
        ratios.append(whole / one)
        rows = 1 + len(TOP) * (1 + DRAWS) + args.lds  # spans > 16: sampled draws
        tokens, reused = kv_reuse_bound(explainer, probe, args.lds)
        lines.append(
            f"| {length} | {len(probe.spans)} | {rows} | {one * 1e3:.1f} | {whole:.2f} "
            f"| {whole / one:.0f} | {tokens:.1f} | {reused:.1f} |"
        )
    lines.append("")
    for length, ratio in zip(CHECK_LENGTHS, ratios, strict=True):
        verdict = "met" if ratio <= CHECK_FORWARDS else "not met"
        lines.append(
            f"- goal at {length} tokens, at most {CHECK_FORWARDS} forwards: {ratio:.0f}, {verdict}"
        )
    lines.append(CHECK_COST[1])
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model", default="zoo:recall-llama", help="the recall language model (quality)"
    )
    parser.add_argument(
        "--hops", type=int, choices=(1, 2), default=1, help="2: two-hop prompts (quality)"
    )
    parser.add_argument("--examples", type=int, default=40)
    parser.add_argument("--length", type=int, default=LENGTH, help="prompt tokens (quality)")
    parser.add_argument(
        "--filler-words", type=int, default=FILLER_WORDS, help="the most filler words a span holds"
    )
    parser.add_argument("--lds", type=int, default=64, help="ablations of the LDS")
    parser.add_argument(
        "--ablations",
        type=int,
        nargs="*",
        default=list(ABLATIONS),
        help="ContextCite's ablation counts, the last one the time reference (none: "
        "ContextCite not run)",
    )
    parser.add_argument("--methods", nargs="+", help="default: every method an LM takes")
    parser.add_argument(
        "--sparse", type=float, default=0.05, help="the sparse rows' share of the top score"
    )
    parser.add_argument(
        "--sparse-methods", nargs="*", default=["cp_lrp"], help="methods also run sparse"
    )
    parser.add_argument(
        "--ablate",
        type=int,
        nargs="*",
        default=[8],
        help="per ablate row, the spans it removes one at a time (none: no such rows)",
    )
    parser.add_argument(
        "--ablate-methods", nargs="*", default=["cp_lrp"], help="methods also run with --ablate"
    )
    parser.add_argument("--cost", action="store_true", help="the cost goals instead")
    parser.add_argument(
        "--check-cost", action="store_true", help="the check's cost in forwards instead"
    )
    parser.add_argument("--cost-methods", nargs="+", default=["generic", "attnlrp"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, help="write the section into this file")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.cost:
        section, markers = cost(args), COST
    elif args.check_cost:
        section, markers = check_cost(args), CHECK_COST
    else:
        section, markers = quality(args), quality_markers(args.hops, args.length)
    print(section)
    if args.out:
        with_section(args.out, markers, section)


if __name__ == "__main__":
    main()
