"""Benchmark: the language-evidence test, one method on prompts of a given length.

The issue's goal: one method on 256 examples of 1024 tokens in at most 3 minutes on 2
cores. This runs the test chunk by chunk on `--examples` prompts (fewer than 256 when the
machine is shared: the time per example does not depend on their number) and reports,
per chunk (medians), the wall seconds and the CPU seconds the process used (all its
threads; on a shared machine the wall time says how busy the others were, the CPU time
what the test costs), the explanation's share (one forward and one batched backward per
chunk; the rest scores the removal copies, every distinct copy of the chunk in batched
forwards), the copies per example, and the estimates for 256 examples: the CPU time
(what one unloaded core takes) and that time over the threads (the least that many
unloaded cores take).

The model is the zoo's recall model where it is trained (`--model zoo:recall-llama`),
else a random Llama of the recall model's shape (2 blocks of width 128, 8 heads, its
224-word vocabulary): speed does not depend on the weights' values. Prompts are random
words with a two-token answer; whether the model answers them right changes no cost.

    OMP_NUM_THREADS=2 python scripts/bench_evidence.py --examples 32 --length 1024
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

ANSWER_TOKENS = 2


def _stand_in() -> tuple[torch.nn.Module, object]:
    """A random Llama of the recall model's shape, and a word-level tokenizer over its
    vocabulary (ids 0..223: pad, start, end, unknown, then words)."""
    import transformers as tf
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["<pad>", "<s>", "</s>", "<unk>", *(f"w{i}" for i in range(4, 224))]
    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = tf.PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
        unk_token="<unk>", padding_side="left",
    )  # fmt: skip
    config = tf.LlamaConfig(
        vocab_size=len(words),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=8,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        attn_implementation="sdpa",
    )
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = tf.LlamaForCausalLM(config).eval()
    return model, tokenizer


def _examples(count: int, length: int, vocabulary: int) -> list:
    from explain.evaluation.datasets import AnswerExample

    generator = torch.Generator().manual_seed(0)
    made = []
    for _ in range(count):
        ids = [1, *torch.randint(4, vocabulary, (length - 1,), generator=generator).tolist()]
        answer = tuple(torch.randint(4, vocabulary, (ANSWER_TOKENS,), generator=generator).tolist())
        evidence = tuple(
            sorted(torch.randperm(length - 4, generator=generator)[:4].add(1).tolist())
        )
        kept = tuple(range(length - 3, length))
        made.append(AnswerExample(tuple(ids), answer, evidence=evidence, kept=kept))
    return made


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", help="a model spec (default: a random recall-shaped Llama)")
    parser.add_argument("--method", default="generic")
    parser.add_argument("--examples", type=int, default=32)
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=16, help="examples per chunk")
    parser.add_argument("--forward-batch", type=int, default=32)
    args = parser.parse_args()

    from explain.evaluation import LanguageEvidenceTest
    from explain.evaluation.answers import AnswerBatch
    from explain.evaluation.language import removed_tokens

    if args.model:
        from explain.loading import load_model

        loaded = load_model(args.model)
        model, tokenizer = loaded.model, loaded.tokenizer
    else:
        model, tokenizer = _stand_in()
    vocabulary = model.get_input_embeddings().num_embeddings
    protocol = LanguageEvidenceTest(model, tokenizer, 3, forward_batch=args.forward_batch)
    examples = _examples(args.examples, args.length, vocabulary)
    chunks = [examples[i : i + args.batch_size] for i in range(0, len(examples), args.batch_size)]

    explained, walls, cpus, copies = [], [], [], []
    for chunk in chunks:
        batch = AnswerBatch.of([e.input_ids for e in chunk], [e.answer for e in chunk], 0)
        start = time.process_time()
        explanation = protocol.explained(args.method, batch, seed=0)
        explained.append(time.process_time() - start)
        relevance = explanation.relevance.sum(dim=1)[:, : batch.prompt_length].double()
        removable = torch.ones_like(relevance, dtype=torch.bool)
        removable[:, -3:] = False
        copies.append(len(removed_tokens(relevance, removable)[0]) / len(chunk))
        start, cpu = time.perf_counter(), time.process_time()
        protocol.evaluate(args.method, chunk, seed=0)
        walls.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu)

    threads = torch.get_num_threads()
    cpu_per_example = statistics.median(cpus) / args.batch_size
    print(
        f"{args.method} on {args.examples} prompts of {args.length} tokens, chunks of "
        f"{args.batch_size}, {threads} threads, load average {os.getloadavg()[0]:.1f} on "
        f"{os.cpu_count()} cores"
    )
    print(f"model: {args.model or 'random recall-shaped Llama (2 x 128, 8 heads)'}")
    print(
        f"median per chunk: {statistics.median(walls):.2f} s wall, {statistics.median(cpus):.2f} "
        f"s CPU ({cpu_per_example:.3f} s CPU per example)"
    )
    share = statistics.median(explained) / statistics.median(cpus)
    print(f"  of which the explanation: {100 * share:.0f}% of the CPU time")
    print(f"forward copies per example: {statistics.mean(copies):.1f} (prompt + removals)")
    print(
        f"estimate for 256 examples: {256 * cpu_per_example:.0f} s on one unloaded core, "
        f"{256 * cpu_per_example / threads:.0f} s at best on {threads} (goal: 180 s on 2 cores)"
    )


if __name__ == "__main__":
    main()
