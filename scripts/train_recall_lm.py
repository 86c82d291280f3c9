"""Train the zoo's `recall-llama`: a small Llama that recalls values from long contexts.

A stock Hugging Face `LlamaForCausalLM` (2 blocks, tied embeddings, the word-level
vocabulary of `explain.data.recall`) trained from scratch on associative recall: facts
`key value .` scattered among distractor facts and filler words, then a question `? key`
whose answer is the value.

Measured here, a 2-block Llama trained on recall from scratch stays at chance (for 16 CPU
minutes, even on 8 single-token pairs). Three things make it learn in minutes:
- an induction stage first: repeated random word sequences (`<s> x gap x`, the loss on
  the repeat) until `--threshold` of the repeated words are right; it forms the heads that
  copy the word after an earlier occurrence of the current one, which is what recall is;
- the multi-query format (`recall.training_sequence`, whose first question is the
  evaluation prompt): every training sequence asks about every fact it states;
- a curriculum from short, dense contexts to long ones: each stage trains until the
  running exact-match accuracy of its answers (teacher-forced, over the last `--window`
  steps) passes `--threshold`.
The last stage alternates its lengths step by step (512, 1,024 and 2,048 tokens) for
`--last-steps` steps while the learning rate decays linearly to 0; every `--check-every`
steps the greedy accuracy on validation prompts is measured at each of its lengths, and
the model whose worst length is best so far is written (training stops early only when
that reaches `--target`, or, as a guard, after `--cpu-minutes` of CPU time). The trained
length is the last stage's longest. Everything follows from the seed: on one thread the
run is reproducible bit for bit (short of the CPU-time guard).

Training examples are the "train" split's first seeds, validation examples the last seeds
of the same split; the "heldout" split is only read by scripts/zoo_accuracy.py, which
writes the card's numbers.

    .venv/bin/python scripts/train_recall_lm.py        # writes models/recall-llama/

Two hops (--hops 2, chains `a b .` `b c .` asked as `?? a`), measured here with --depth 4
--stages 24:4:64,55:8:32,128:12:16,256:16:8,512:16:8 --validation 100 on one shared
thread: the induction stage passed 0.907 after 1,227 steps (4.2 CPU minutes); the 24-token
stage (4 facts, 2 chains) reached 0.90 of its answers after 1,152 steps (9.6 CPU minutes in
all; greedy validation 0.69); the 55-token stage (8 facts) was at 0.77 after about 590
more steps when the 25-minute wall guard stopped it (about 19 CPU minutes): no model was
written. At that pace the curriculum to 512 tokens needs several times the 20-CPU-minute
budget.

A warm start does it (--warm-start models/recall-llama: a 4-block Llama whose embeddings,
final norm and blocks are recall-llama's, --warm-blocks 0,1,0,1 each block twice; no
induction stage). Measured here on one thread of a busy machine, the first stage decides:
- 24 tokens (4 facts, no filler) first, as above: the running share of answers right rose
  to 0.80 in 100 steps (the one-hop answers, which recall-llama's blocks already give),
  stayed at 0.81-0.84 until step 800 (the two-hop ones about as often right as a guess
  of one of the 2 chains), and passed 0.90 at step 1,229 (7.8 CPU minutes; greedy
  validation 0.96); the 55-token stage (4 chains, filler between the facts) then stayed
  at 0.74-0.75 for 515 steps (11.5 CPU minutes in all), so that skill did not carry over
  to facts at varying places. With the top blocks fresh (--warm-blocks 0,1,-,-) the
  first 60 steps went slower (0.46 against 0.54 of the answers right).
- 48 tokens (4 facts among 24 filler words) first: passed after 128 steps (1.3 CPU
  minutes; validation 1.000), then 128 tokens after 24 steps (validation 1.000), 256
  after 20 (0.970), and 512 reached greedy validation 0.980 at the last stage's first
  check, after 200 steps: 372 steps, 4.4 CPU minutes in all. That is the zoo's
  twohop-llama (its card has the command and its held-out numbers; the trained length is
  512, not 2,048, for the CPU time).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from explain.data import recall
from explain.evaluation.recall_answers import answer_accuracy
from explain.loading.zoo import build_model, load_zoo_folder, read_config, save_zoo_model

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json"]


@dataclass(frozen=True)
class Stage:
    """Training sequences of prompts of `length` tokens with `facts` facts, `batch` a step."""

    length: int
    facts: int
    batch: int


def parse_stages(text: str) -> list[list[Stage]]:
    """ "55:8:32,128:12:16/256:16:8" -> stages, shortest first; a stage of several
    (length:facts:batch) alternates between them step by step."""
    return [
        [Stage(*(int(part) for part in alternative.split(":"))) for alternative in item.split("/")]
        for item in text.split(",")
    ]


def config(
    width: int, depth: int, heads: int, init: float, length: int, rope_theta: float, hops: int
) -> dict[str, Any]:
    """The zoo config: LlamaConfig's arguments, the task, the tokenizer files."""
    tokenizer = recall.build_tokenizer()
    return {
        "builder": "hf_llama",
        "summary": (
            f"Llama ({depth} blocks) recalling the value of a key among distractor facts and "
            "filler in long contexts: a language model whose evidence is known"
            if hops == 1
            else f"Llama ({depth} blocks) answering two-hop questions (a key's value found "
            "through a bridge fact) among distractor facts and filler in long contexts: a "
            "language model whose evidence, both facts of the chain, is known"
        ),
        "modality": "text",
        "classes": None,
        "llama": {
            "vocab_size": len(recall.VOCABULARY),
            "hidden_size": width,
            "intermediate_size": 2 * width,
            "num_hidden_layers": depth,
            "num_attention_heads": heads,
            "num_key_value_heads": heads,
            # Rotary positions have no table: this is not a limit of the weights, only
            # what the engine allows: twice the longest prompts the card measures (4x the
            # trained length), for the evidence protocols' longer prompts.
            "max_position_embeddings": 8 * length,
            "tie_word_embeddings": True,
            "rope_theta": rope_theta,
            "initializer_range": init,
            "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id,
        },
        "task": {
            "data": "explain.data.recall",
            "length": length,
            "facts": recall.default_facts(length),
            "hops": hops,
            "answer_tokens": recall.VALUE_TOKENS,
        },
        "tokenizer_files": TOKENIZER_FILES,
    }


def parse_blocks(text: str, depth: int) -> list[int | None]:
    """ "0,1,-,-" -> [0, 1, None, None]: for each of the model's `depth` blocks, the warm
    start's block it copies (None, "-": freshly initialised)."""
    blocks = [None if item == "-" else int(item) for item in text.split(",")]
    if len(blocks) != depth:
        raise SystemExit(f"--warm-blocks {text!r} names {len(blocks)} blocks; --depth is {depth}")
    return blocks


def warm_start(model: nn.Module, folder: Path, blocks: list[int | None]) -> None:
    """Initialise `model` from the trained zoo model in `folder` (of the same width and
    vocabulary): its token embeddings (the tied head) and final norm, and block i from its
    block `blocks[i]` (None: block i keeps its fresh initialisation)."""
    trained = load_zoo_folder(folder).model.state_dict()
    copied = {}
    for name in model.state_dict():
        if name.startswith("model.layers."):
            index, rest = name.removeprefix("model.layers.").split(".", 1)
            if blocks[int(index)] is not None:
                copied[name] = trained[f"model.layers.{blocks[int(index)]}.{rest}"]
        elif name in trained:
            copied[name] = trained[name]
    model.load_state_dict(copied, strict=False)


def batch(stage: Stage, seeds: range, hops: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Training sequences of the `hops`-hop examples of `seeds` (train split): ids and
    labels."""
    rows = [
        recall.training_sequence(
            recall.make_example(seed, stage.length, hops=hops, facts=stage.facts)
        )
        for seed in seeds
    ]
    return torch.tensor([ids for ids, _ in rows]), torch.tensor([labels for _, labels in rows])


def induction_batch(
    generator: torch.Generator, size: int, length: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Repeated random word sequences `<s> x gap x` (ids and labels on the repeat after its
    first word): x of about `length` words and the gap of up to `length` words are drawn
    per batch, so that no fixed offset solves it and only matching a token's predecessor
    (an induction head) does."""
    words = len(recall.VOCABULARY)
    first = recall.VOCABULARY.index(recall.ADJECTIVES[0])  # the words, not the markers
    span = int(torch.randint(length // 2, length * 3 // 2 + 1, (1,), generator=generator))
    gap = int(torch.randint(0, length + 1, (1,), generator=generator))
    sequence = torch.randint(first, words, (size, span), generator=generator)
    between = torch.randint(first, words, (size, gap), generator=generator)
    start = torch.full((size, 1), recall.BOS)
    ids = torch.cat([start, sequence, between, sequence], 1)
    labels = torch.full_like(ids, recall.IGNORE)
    labels[:, span + gap + 2 :] = ids[:, span + gap + 2 :]
    return ids, labels


def tokens_right(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per labelled token of the batch (teacher-forced): predicted or not."""
    predicted = logits[:, :-1].argmax(-1)
    targets = labels[:, 1:]
    answered = targets != recall.IGNORE
    return predicted[answered] == targets[answered]


def answers_right(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per answer of the batch (teacher-forced): every one of its tokens predicted."""
    return tokens_right(logits, labels).reshape(-1, recall.VALUE_TOKENS).all(dim=1)


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=ROOT / "models" / "recall-llama")
    parser.add_argument(
        "--hops",
        type=int,
        choices=(1, 2),
        default=1,
        help="1: recall-llama's facts; 2: chains `a b .` `b c .` asked as `?? a` (twohop-llama)",
    )
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument(
        "--init", type=float, default=None, help="initializer_range (default 1 / sqrt(width))"
    )
    parser.add_argument("--rope-theta", type=float, default=10000.0)
    parser.add_argument(
        "--warm-start",
        type=Path,
        default=None,
        help="a trained zoo folder (models/recall-llama) whose embeddings, final norm and "
        "blocks initialise the model; the induction stage is skipped (its blocks have it)",
    )
    parser.add_argument(
        "--warm-blocks",
        default=None,
        help="with --warm-start: the block each of the model's blocks copies, - for a fresh "
        "one (e.g. 0,1,0,1 or 0,1,-,-; default: the warm start's blocks repeated)",
    )
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--warmup", type=int, default=50, help="steps of linear warm-up")
    parser.add_argument(
        "--stages",
        default="24:4:64,55:8:32,128:12:16,256:16:8,512:16:8/1024:16:4/2048:16:2",
        help="length:facts:batch of each curriculum stage, shortest first; a stage of several "
        "(joined by /) alternates between them; the last stage's longest is the trained length",
    )
    parser.add_argument(
        "--induction-length", type=int, default=16, help="repeated words of the first stage"
    )
    parser.add_argument("--induction-batch", type=int, default=64)
    parser.add_argument("--threshold", type=float, default=0.9)
    parser.add_argument("--window", type=int, default=20, help="steps the threshold averages")
    parser.add_argument("--check-every", type=int, default=400)
    parser.add_argument(
        "--last-steps",
        type=int,
        default=2000,
        help="steps of the last stage, over which the learning rate decays linearly to 0",
    )
    parser.add_argument(
        "--target", type=float, default=1.0, help="stop at this worst validation accuracy"
    )
    parser.add_argument("--cpu-minutes", type=float, default=19.0)
    parser.add_argument("--validation", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    # One thread: on a busy 2-core machine two threads ran six times slower than one.
    parser.add_argument("--threads", type=int, default=1)
    return parser.parse_args()


def main() -> None:
    args = arguments()
    torch.set_num_threads(args.threads)
    started, cpu_started = time.time(), time.process_time()
    stages = parse_stages(args.stages)
    init = args.init if args.init is not None else args.width**-0.5
    settings = config(
        args.width,
        args.depth,
        args.heads,
        init,
        max(s.length for s in stages[-1]),
        args.rope_theta,
        args.hops,
    )
    torch.manual_seed(args.seed)
    model = build_model(settings).train()
    warm: dict[str, Any] | None = None
    if args.warm_start is not None:
        source = read_config(args.warm_start)
        depth = source["llama"]["num_hidden_layers"]
        blocks = parse_blocks(
            args.warm_blocks or ",".join(str(i % depth) for i in range(args.depth)), args.depth
        )
        warm_start(model, args.warm_start, blocks)
        warm = {
            "from": args.warm_start.resolve().relative_to(ROOT).as_posix(),
            "sha256": source["sha256"],
            "blocks": blocks,
        }
    optimiser = torch.optim.AdamW(
        model.parameters(), lr=args.lr, betas=(0.9, 0.98), weight_decay=0.01
    )
    validation_start = len(recall.SPLITS["train"]) - args.validation

    def validate(length: int) -> float:
        model.eval()
        examples = recall.examples(
            "train", args.validation, length, hops=args.hops, start=validation_start
        )
        score = answer_accuracy(model, examples)
        model.train()
        return score

    def cpu_minutes() -> float:
        return (time.process_time() - cpu_started) / 60

    def save(step: int, seed: int, history: list[dict], stopped: str) -> None:
        settings["training"] = {
            "script": "scripts/train_recall_lm.py",
            # What `make zoo` reruns (scripts/train_zoo.py): this run's own arguments.
            **({"arguments": sys.argv[1:]} if len(sys.argv) > 1 else {}),
            "seed": args.seed,
            "examples": f"train split, seeds 0..{seed - 1}, in order",
            "validation": f"train split, the last {args.validation} seeds (greedy answers)",
            "initializer_range": init,
            **({"warm_start": warm} if warm is not None else {}),
            "learning_rate": args.lr,
            "optimiser": f"AdamW (betas 0.9, 0.98, weight decay 0.01), {args.warmup} steps of "
            f"linear warm-up, constant until the last stage, then a linear decay to 0 over its "
            f"{args.last_steps} steps; gradient norm clipped at 1",
            "check_every": args.check_every,
            "threshold": args.threshold,
            "window": args.window,
            "target": args.target,
            "stages": history,
            "steps": step,
            "stopped": stopped,
            "minutes": round((time.time() - started) / 60, 1),
            "cpu_minutes": round(cpu_minutes(), 1),
            "threads": args.threads,
        }
        recall.build_tokenizer().save_pretrained(args.out)
        # Tied embeddings: the head is the embedding matrix, shipped once.
        save_zoo_model(args.out, model.eval(), settings, trained=["model."])
        model.train()

    def train_step(
        ids: torch.Tensor, labels: torch.Tensor, decayed: float = 0.0
    ) -> tuple[float, torch.Tensor]:
        """One optimisation step on a batch: its loss and its logits. `decayed`: how far
        the learning rate has decayed linearly towards 0 (the last stage's share done)."""
        for group in optimiser.param_groups:
            group["lr"] = args.lr * min(1.0, (step + 1) / args.warmup) * (1.0 - decayed)
        logits = model(input_ids=ids).logits
        loss = F.cross_entropy(
            logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=recall.IGNORE
        )
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimiser.step()
        return loss.item(), logits.detach()

    history: list[dict] = []
    step, recent = 0, []
    bar = tqdm(desc="training", unit="step", mininterval=10)
    # First the induction stage: it forms the heads that copy the word after an earlier
    # occurrence of the current one, which is what recall is (measured here, recall alone
    # stayed at chance for 16 CPU minutes; after this stage it starts at once). A warm
    # start's blocks have those heads already.
    words = torch.Generator().manual_seed(args.seed)
    while warm is None and cpu_minutes() < args.cpu_minutes:
        ids, labels = induction_batch(words, args.induction_batch, args.induction_length)
        loss, logits = train_step(ids, labels)
        recent = [*recent[-(args.window - 1) :], tokens_right(logits, labels).float().mean().item()]
        step += 1
        bar.update(1)
        bar.set_postfix(stage="induction", loss=f"{loss:.3f}", refresh=False)
        if len(recent) == args.window and sum(recent) / len(recent) >= args.threshold:
            history.append({"induction": args.induction_length, "steps": step,
                            "tokens_right": round(sum(recent) / len(recent), 3)})  # fmt: skip
            bar.write(f"induction: {history[-1]['tokens_right']} of the repeated words right "
                      f"after {step} steps ({cpu_minutes():.1f} CPU minutes)")  # fmt: skip
            break
    stage, stage_steps, seed, recent, best = 0, 0, 0, [], -1.0
    stopped = f"the CPU-time guard ({args.cpu_minutes} minutes)"
    while cpu_minutes() < args.cpu_minutes:
        current = stages[stage][stage_steps % len(stages[stage])]
        ids, labels = batch(current, range(seed, seed + current.batch), args.hops)
        seed += current.batch
        last = stage == len(stages) - 1
        loss, logits = train_step(ids, labels, stage_steps / args.last_steps if last else 0.0)
        with torch.no_grad():
            right = answers_right(logits, labels).float().mean().item()
        recent = [*recent[-(args.window - 1) :], right]
        running = sum(recent) / len(recent)
        step, stage_steps = step + 1, stage_steps + 1
        bar.update(1)
        bar.set_postfix(
            length=current.length,
            loss=f"{loss:.3f}",
            answers=f"{running:.3f}",
            refresh=False,
        )
        if stage < len(stages) - 1:
            if len(recent) == args.window and running >= args.threshold:
                score = validate(current.length)
                history.append({**asdict(current), "steps": stage_steps, "validation": score})
                bar.write(
                    f"length {current.length}: {running:.3f} of the answers right after "
                    f"{stage_steps} steps ({cpu_minutes():.1f} CPU minutes); validation "
                    f"{score:.3f}"
                )
                stage, stage_steps, recent = stage + 1, 0, []
        elif stage_steps % args.check_every == 0:
            # The last stage's score: its worst length (a model for all of them).
            scores = {each.length: validate(each.length) for each in stages[-1]}
            score = min(scores.values())
            bar.write(
                f"step {stage_steps} of the last stage: validation "
                + ", ".join(f"{value:.3f} at {length}" for length, value in scores.items())
                + f" ({cpu_minutes():.1f} CPU minutes)"
            )
            if score > best:
                best = score
                record = {
                    "stage": [asdict(each) for each in stages[-1]],
                    "steps": stage_steps,
                    "validation": scores,
                }
                done = score >= args.target
                reason = f"validation reached {args.target}" if done else "best so far"
                save(step, seed, [*history, record], reason)
                if done:
                    stopped = reason
                    break
            if stage_steps == args.last_steps:
                stopped = f"the last stage's {args.last_steps} steps"
                break
    bar.close()
    print(f"stopped at step {step}: {stopped}; best validation {best:.3f}")
    if best < 0:
        raise SystemExit(
            f"the curriculum did not reach its last stage (stopped at length "
            f"{stages[stage][0].length}) in {args.cpu_minutes} CPU minutes; nothing was written"
        )


if __name__ == "__main__":
    main()
