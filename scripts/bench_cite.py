"""Span attribution (explain cite) side by side with ContextCite, and its cost against the
batched floor.

Quality (default): on a trained language model whose evidence is known, the same
contexts, spans and answers for every method a language model takes and for ContextCite
at 32, 64 and 256 ablations; each ranking is scored by the same ablation check
(explain.cite.check: the answer's log-probability drop when the top-1/3/5 spans are
removed, against as many random spans; the LDS from --lds random ablations of half the
spans), by span-level evidence recall (the asked fact's sentence among the top 1 and 3
spans) and by its time per example. ContextCite gets our spans through a partitioner
(its own sentence splitter needs nltk's punkt_tab, which cannot be downloaded offline),
its prompt is ours (the tokenizer's chat template renders the message as it is), and its
response is the answer explained.

Cost (--cost): span attribution of a 2,000-token context with a 32-token answer, and of
an 8,192-token one (the streamed path), against the batched floor: one forward and one
backward of every answer token's log-probability (scripts/bench.py's generation floor),
on the narrow random Llama of scripts/bench.py's long prompts; medians of interleaved
rounds and the peak memory each call adds.

ContextCite is not a dependency of explain. To run the quality benchmark:

    pip install context-cite     # imports nltk, spacy, datasets, pandas, scikit-learn
    python scripts/train_cite_toy_lm.py --out /tmp/cite-toy-llama    # ~10 min, 1 core
    python scripts/bench_cite.py --model /tmp/cite-toy-llama --out docs/benchmarks.md
    python scripts/bench_cite.py --cost --out docs/benchmarks.md

--model takes any model spec explain loads (zoo:NAME, a folder); the contexts come from
scripts/train_cite_toy_lm.py's task, whose words the model's tokenizer must know.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch
from bench import generation_floor, machine, narrow_model, peak_memory, timed
from tqdm import tqdm
from train_cite_toy_lm import ADJECTIVES, ANIMALS, FILLER, NUMBERS, build_tokenizer, example

from explain import Explainer
from explain.cite import Span, check_ranking, cite
from explain.engine import Request, supported_methods
from explain.evaluation.bootstrap import draws, standard_error
from explain.export import atomic_write

QUALITY = ("<!-- span attribution: scripts/bench_cite.py -->", "<!-- end of span attribution -->")
COST = (
    "<!-- span attribution cost: scripts/bench_cite.py -->",
    "<!-- end of span attribution cost -->",
)
ABLATIONS = (32, 64, 256)
TOP = (1, 3, 5)
WHY_LDS = (
    "Why ContextCite leads on LDS: it fits its scores (a LASSO over its own ablations) to "
    "exactly what the LDS measures, the answer's log-probability under random halves of "
    "the spans, while a single-backward method reads the model at the whole context; the "
    "top-1 span (the evidence, when one span carries the answer) is where all agree, and "
    "the LDS then ranks the weak spans, where a linear fit to ablations has the edge. Its "
    "time grows with the ablations; ours is one explanation."
)
LONG_ANSWER = 4
"""Answer tokens of the 8,192-token cost case."""
FIRST_SEED = 1_000_000
"""Evaluation examples' seeds (training used 10_000_000 on)."""


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
    names = [*methods, *(f"ContextCite, {n} ablations" for n in args.ablations)]
    rows: dict[str, dict[str, list[float]]] = {
        name: {key: [] for key in ("seconds", "lds", "hit1", "hit3", *map(str, TOP), "r1")}
        for name in names
    }
    correct = 0
    progress = tqdm(range(args.examples), desc="examples", unit="example")
    for index in progress:
        case = example(FIRST_SEED + index)
        scores: dict[str, Any] = {}
        first = None
        for method in methods:
            started = time.perf_counter()
            result = cite(
                explainer, case.context, case.question, case.answer, method=method, check=False
            )
            rows[method]["seconds"].append(time.perf_counter() - started)
            scores[method] = result.scores
            first = first or result
        assert first is not None
        for ablations in args.ablations:
            name = f"ContextCite, {ablations} ablations"
            started = time.perf_counter()
            found = context_cite_scores(loaded, first, ablations)
            rows[name]["seconds"].append(time.perf_counter() - started)
            scores[name] = torch.from_numpy(np.asarray(found, dtype=np.float64))
        ids = tokenizer(f"{case.context}\n\n{case.question}", return_tensors="pt")["input_ids"]
        with torch.no_grad():
            out = loaded.model.generate(ids, max_new_tokens=2, do_sample=False, pad_token_id=0)
        correct += tokenizer.decode(out[0, ids.shape[1] :]) == case.answer
        evidence = {
            s
            for s, span in enumerate(first.spans)
            if span.start < case.evidence[1] and case.evidence[0] < span.end
        }
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
    reference = statistics.median(rows[names[-1]]["seconds"])
    date = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        QUALITY[0],
        "## Span attribution against ContextCite",
        "",
        f"Generated by `python {' '.join(['scripts/bench_cite.py', *sys.argv[1:]])}` on {date}, "
        f"{machine()}.",
        "",
        f"Model: `{args.model}`; {args.examples} held-out examples of scripts/"
        "train_cite_toy_lm.py's recall task (a context of facts and filler sentences, "
        "a question about one fact, the answer its value; the evidence is the fact's "
        f"sentence); the model answers {correct} of them exactly. The same spans "
        "(sentences), prompt and answer for every ranking. Every ranking is scored by "
        "explain.cite.check: the drop of log p(answer) when its top-k spans are removed "
        "(random k = 1: the mean drop for one random span), and the LDS from "
        f"{args.lds} random ablations of half the spans (Spearman; the same ablations for "
        "every ranking of an example); evidence: the asked fact's sentence is the "
        "top-ranked span (top-1) or among the top 3. Time: the median seconds per "
        "example (explain: `cite` with check=False; ContextCite: its ablation forwards, "
        "batch 32, and its LASSO fit). Means ± bootstrap standard errors over the examples.",
        "",
        "| ranking | s per example | x less time than ContextCite-256 | LDS | evidence top-1 "
        "| evidence top-3 | top-1 drop | top-3 drop | top-5 drop | random-1 drop |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in names:
        row = rows[name]
        seconds = statistics.median(row["seconds"])
        lds = [v for v in row["lds"] if v == v]
        lines.append(
            f"| {name} | {seconds:.3f} | {reference / seconds:.1f} | {mean_and_error(lds)} | "
            f"{mean_and_error(row['hit1'])} | {mean_and_error(row['hit3'])} | "
            + " | ".join(mean_and_error(row[str(k)]) for k in TOP)
            + f" | {mean_and_error(row['r1'])} |"
        )
    best = max(methods, key=lambda m: np.nanmean(rows[m]["lds"]))
    gap = np.nanmean(rows[names[-1]]["lds"]) - np.nanmean(rows[best]["lds"])
    ratio = reference / statistics.median(rows[best]["seconds"])
    met = gap <= 0.05 and ratio >= 20
    lines += [
        "",
        f"- goal: a single-backward method within 0.05 LDS of ContextCite with "
        f"{args.ablations[-1]} ablations at 20x less time or more; best LDS: {best}, "
        f"{gap:+.3f} below ContextCite, {ratio:.0f}x less time: {'met' if met else 'not met'}",
        "",
        WHY_LDS,
        QUALITY[1],
    ]
    return "\n".join(lines)


def cost_case(tokens: int, answer_tokens: int = 32):
    """A toy-task context of about `tokens` tokens, its question, a 32-token answer, and
    the word tokenizer."""
    rng = np.random.default_rng(0)
    fillers = max(1, (tokens - 5 * len(ANIMALS)) // 6)
    case = example(FIRST_SEED, facts=len(ANIMALS), fillers=fillers)
    tokenizer = build_tokenizer()
    words = [*ADJECTIVES, *NUMBERS, *FILLER]
    answer = " ".join(rng.choice(words, size=answer_tokens))
    return case, answer, tokenizer


def cost(args: argparse.Namespace) -> str:
    torch.manual_seed(0)
    model = narrow_model("llama-narrow").eval()
    device = torch.device("cpu")
    lines = [
        COST[0],
        "## Span attribution: cost against the batched floor",
        "",
        f"Generated by `python {' '.join(['scripts/bench_cite.py', *sys.argv[1:]])}` on "
        f"{datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}, {machine()}. The narrow "
        "random Llama of the long prompts (4 blocks, width 64, 4 heads, vocabulary 1024); a "
        "context of toy-task sentences, a question and a 32-token answer. The floor: one "
        "forward and one backward of every answer token's log-probability to the first "
        "block's input, batched over the answer's tokens (scripts/bench.py's generation "
        "floor). `cite`: the whole span attribution (tokenizing with offsets, the "
        "generation explanation, the span sums), check off. Medians of "
        f"{args.rounds} interleaved rounds after a warm-up round at 2,000 tokens; peak: the "
        "memory one more call adds. Goals: at 2,000 tokens, at most 1.5x the floor's time; "
        f"at 8,192 tokens (generic, on the streamed fold; a {LONG_ANSWER}-token answer: "
        "32 batched columns at 8,192 tokens take over 15 minutes a call on this shared "
        "2-core machine, floor and explanation alike), at most 2x its time and 1.5x its "
        "memory.",
    ]
    cases = (
        (2000, 32, (1.5, None), args.cost_methods),
        (8192, LONG_ANSWER, (2.0, 1.5), ["generic"]),
    )
    for tokens, answer_tokens, limits, methods in cases:
        case, answer, tokenizer = cost_case(tokens, answer_tokens)
        explainer = Explainer(model, tokenizer=tokenizer)
        probe = cite(explainer, case.context, case.question, answer, check=False)
        width = probe.prompt_ids.shape[0]
        ids = torch.cat([probe.prompt_ids, probe.answer_ids])[None]
        inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        calls: dict[str, Callable[[], Any]] = {
            "floor (forward + batched backward)": generation_floor(
                model, inputs, width, log_probability=True
            )
        }
        for method in methods:
            calls[f"cite, {method}"] = functools.partial(
                cite, explainer, case.context, case.question, answer, method=method, check=False
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


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", help="the trained language model (quality benchmark)")
    parser.add_argument("--examples", type=int, default=40)
    parser.add_argument("--lds", type=int, default=64, help="ablations of the LDS")
    parser.add_argument("--ablations", type=int, nargs="+", default=list(ABLATIONS))
    parser.add_argument("--methods", nargs="+", help="default: every method an LM takes")
    parser.add_argument("--cost", action="store_true", help="the cost goals instead")
    parser.add_argument("--cost-methods", nargs="+", default=["generic", "attnlrp"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, help="write the section into this file")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.cost:
        section, markers = cost(args), COST
    else:
        if args.model is None:
            parser.error("--model is required (or --cost)")
        section, markers = quality(args), QUALITY
    print(section)
    if args.out:
        with_section(args.out, markers, section)


if __name__ == "__main__":
    main()
