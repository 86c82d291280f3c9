"""Train a small Llama that answers from a context whose evidence is known: the stand-in
for the zoo's recall language model in scripts/bench_cite.py until that model lands
(then run the benchmark with --model zoo:recall-llama).

The task is associative recall in sentences. A context is a run of sentences, each ending
with " .": facts `key value .` (a key is an animal, "fox"; a value two numbers, "17 42")
among filler sentences of common words, some of which start with an adjective; the
question `? fox` asks one fact's key, and the answer is its value, `17 42`. (One-word
keys: a 2-block model learns the lookup, an induction head.) The evidence of an example
is the asked fact's sentence: a span, in the benchmark's terms. Keys, values and filler are
disjoint vocabularies, words are separated by single spaces, and a word-level tokenizer
maps each word to one token.

Training uses the multi-query form (every fact of a context asked after it, the loss on
the answers only: "Zoology", Arora et al. 2023), which a small model learns in minutes on
one core; an evaluation prompt is the prefix up to the first question, so the trained
model answers it. Everything is a pure function of a seed.

    .venv/bin/python scripts/train_cite_toy_lm.py --out .cache/cite-toy-llama
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

ADJECTIVES: tuple[str, ...] = (
    "red", "blue", "green", "black", "white", "grey", "brown", "pink", "tall", "short",
    "quick", "slow", "old", "young", "wild", "calm", "bold", "shy", "loud", "quiet",
    "happy", "sad", "brave", "proud", "tiny", "huge", "warm", "cold", "dark", "pale",
    "wise", "odd",
)  # fmt: skip
ANIMALS: tuple[str, ...] = (
    "fox", "owl", "cat", "dog", "bee", "elk", "yak", "ant", "bear", "wolf", "deer",
    "hare", "lion", "seal", "crow", "duck", "frog", "goat", "mole", "moth", "newt",
    "swan", "toad", "wasp", "crab", "lynx", "mule", "puma", "boar", "dove", "ibex",
    "orca",
)  # fmt: skip
NUMBERS = tuple(str(n) for n in range(10, 100))
FILLER: tuple[str, ...] = (
    "the", "of", "and", "a", "to", "in", "is", "it", "that", "was", "for", "on", "are",
    "as", "with", "his", "they", "at", "be", "this", "have", "from", "or", "one", "had",
    "by", "word", "but", "not", "what", "all", "were", "we", "when", "your", "can",
    "said", "there", "use", "an", "each", "which", "she", "do", "how", "their", "if",
    "will", "up", "other", "about", "out", "many", "then", "them", "these", "so",
    "some", "her", "would", "make", "like", "him", "into",
)  # fmt: skip
SPECIAL = ["<pad>", "<s>", "</s>", "<unk>"]
END, ASK = ".", "?"
VOCABULARY = [*SPECIAL, END, ASK, *ADJECTIVES, *ANIMALS, *NUMBERS, *FILLER]
IGNORE = -100
FACTS, FILLERS = 8, 10
"""Facts and filler sentences per context (about 80 words)."""


@dataclass(frozen=True)
class Example:
    """One evaluation example: the context (sentences), the question, the answer, and
    the evidence: the character range of the asked fact's sentence in the context."""

    context: str
    question: str
    answer: str
    evidence: tuple[int, int]


def _sentences(rng: np.random.Generator, facts: int, fillers: int) -> tuple[list[str], list]:
    """`facts` facts with distinct keys among `fillers` filler sentences, shuffled; the
    sentences as texts, and each fact's (key, value) at its sentence index."""
    keys = rng.choice(ANIMALS, size=facts, replace=False)
    found = [(str(key), " ".join(rng.choice(NUMBERS, size=2))) for key in keys]
    sentences: list[str] = [f"{k} {v} {END}" for k, v in found]
    sentences += [
        " ".join(
            [
                *rng.choice(ADJECTIVES, size=int(rng.integers(0, 2))),
                *rng.choice(FILLER, size=int(rng.integers(3, 7))),
            ]
        )
        + f" {END}"
        for _ in range(fillers)
    ]
    order = rng.permutation(len(sentences))
    placed = [sentences[i] for i in order]
    where = {int(np.flatnonzero(order == f)[0]): found[f] for f in range(facts)}
    return placed, sorted(where.items())


def example(seed: int, facts: int = FACTS, fillers: int = FILLERS) -> Example:
    """The evaluation example of `seed`: one fact asked about its context."""
    rng = np.random.default_rng(seed)
    sentences, placed = _sentences(rng, facts, fillers)
    index, (key, value) = placed[int(rng.integers(len(placed)))]
    start = sum(len(s) + 1 for s in sentences[:index])
    context = " ".join(sentences)
    return Example(context, f"{ASK} {key}", value, (start, start + len(sentences[index])))


def training_sequence(seed: int, facts: int, fillers: int) -> tuple[list[str], list[bool]]:
    """The words of one training sequence (a context, then every fact asked and answered
    in random order) and which words carry the loss (the answers)."""
    rng = np.random.default_rng(seed)
    sentences, placed = _sentences(rng, facts, fillers)
    words = ["<s>", *" ".join(sentences).split()]
    loss = [False] * len(words)
    for position in rng.permutation(len(placed)):
        key, value = placed[position][1]
        words += [ASK, key]
        loss += [False, False]
        words += value.split()
        loss += [True, True]
    return words, loss


def build_tokenizer():
    """A word-level tokenizer over VOCABULARY (ids in its order) that adds `<s>` first."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(VOCABULARY)}, "<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", VOCABULARY.index("<s>"))]
    )
    # A chat template that renders the messages' text as it is: ContextCite puts every
    # prompt through the chat template, so both methods then read the very same prompt.
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        chat_template="{% for m in messages %}{{ m['content'] }}{% endfor %}",
    )


def batch(seeds: range) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids (B, T) right-padded and labels (B, T): the next word where it carries the
    loss, IGNORE elsewhere. The sequences mix difficulties: 2 to FACTS facts among 0 to
    FILLERS filler sentences (the short ones teach the lookup fast, the long ones the
    evaluation's length)."""
    ids = {w: i for i, w in enumerate(VOCABULARY)}
    sizes = np.random.default_rng(seeds.start).integers(0, 1 << 16, size=(len(seeds), 2))
    rows = [
        training_sequence(seed, 2 + int(f) % (FACTS - 1), int(g) % (FILLERS + 1))
        for seed, (f, g) in zip(seeds, sizes, strict=True)
    ]
    width = max(len(words) for words, _ in rows)
    tokens = torch.zeros(len(rows), width, dtype=torch.long)
    labels = torch.full((len(rows), width), IGNORE, dtype=torch.long)
    for row, (words, loss) in enumerate(rows):
        tokens[row, : len(words)] = torch.tensor([ids[w] for w in words])
        for at, counted in enumerate(loss):
            if counted:
                labels[row, at - 1] = ids[words[at]]
    return tokens, labels


def accuracy(model, tokenizer, seeds: range) -> float:
    """Greedy exact-match accuracy of the evaluation examples of `seeds`."""
    right = 0
    for seed in seeds:
        case = example(seed)
        ids = tokenizer(f"{case.context}\n\n{case.question}", return_tensors="pt")["input_ids"]
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=2, do_sample=False, pad_token_id=0)
        right += tokenizer.decode(out[0, ids.shape[1] :]) == case.answer
    return right / len(seeds)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=6000)
    parser.add_argument("--minutes", type=float, default=60.0, help="stop (and save) after")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--init", type=Path, help="go on training the model saved in this folder (its record too)"
    )
    args = parser.parse_args()
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(VOCABULARY),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        attn_implementation="sdpa",
    )
    model = LlamaForCausalLM(config)
    earlier = {"steps": 0, "minutes": 0.0, "seed": 10_000_000}
    if args.init is not None:
        model = LlamaForCausalLM.from_pretrained(args.init)
        earlier = json.loads((args.init / "training.json").read_text())
    optimiser = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    # A short warm-up, then the rate held: the lookup is learnt in a sudden drop of the
    # loss whose step is not known in advance.
    schedule = torch.optim.lr_scheduler.LambdaLR(optimiser, lambda s: min(1.0, (s + 1) / 200))
    tokenizer = build_tokenizer()
    started = time.time()
    # Training seeds go on from 10_000_000 (a resumed run's where the last stopped); the
    # evaluation examples' are below.
    seed = earlier.get("seed", 10_000_000 + earlier["steps"] * args.batch_size)
    with tqdm(range(args.steps), desc="training", unit="step", mininterval=30) as steps:
        for _ in steps:
            if time.time() - started > args.minutes * 60:
                break
            tokens, labels = batch(range(seed, seed + args.batch_size))
            seed += args.batch_size
            logits = model(input_ids=tokens, attention_mask=(tokens != 0).long()).logits
            loss = torch.nn.functional.cross_entropy(
                logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE
            )
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            schedule.step()
            steps.set_postfix(loss=f"{loss.item():.3f}", refresh=False)
    model.eval()
    found = accuracy(model, tokenizer, range(200))
    print(f"held-out exact-match accuracy {found:.3f}")
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out)
    tokenizer.save_pretrained(args.out)
    record = {
        "steps": earlier["steps"] + steps.n,
        "seed": seed,
        "batch_size": args.batch_size,
        "minutes": round(earlier["minutes"] + (time.time() - started) / 60, 1),
        "accuracy": found,
        "examples": f"seeds 0..199, {FACTS} facts and {FILLERS} filler sentences",
    }
    (args.out / "training.json").write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
