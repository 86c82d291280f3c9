"""Through which path does the bridge fact of a two-hop question reach the answer?

On held-out two-hop prompts of `zoo:twohop-llama` (`?? a` answered c through `a b .` and
`b c .`), each fact of the chain in turn has its key and value words replaced by the
filler word the evidence protocols use (`recall.REPLACEMENT`, same positions), and the
answer's log-probability is measured:

- clean: the prompt as it is; removed: the fact replaced;
- removed, clean attention of block l: the replaced prompt with block l's attention
  weights (every head's softmax) taken from the clean prompt, everything else (values,
  MLPs, the other blocks) computed on the replaced prompt; "all" patches every block;
- clean, removed attention: the other way, the clean prompt with every block's attention
  weights from the replaced one.

If the clean attention weights of one block bring the answer back, the fact acts through
that block's attention weights (its queries and keys) and not through its values: what a
score that holds the attention weights constant (CP-LRP) cannot see. Attention runs in
float64 on an explicit softmax (`patched_attention`), on the model's own projections and
rotary embeddings (transformers' attention interface).

    OMP_NUM_THREADS=1 python scripts/probe_twohop.py --examples 6
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from explain.data import recall

NAME = "probe_twohop"
"""The attention implementation's name in transformers' registry."""


@dataclass
class Patch:
    """What `patched_attention` does: "record" stores each block's weights, "patch"
    replaces the weights of the blocks in `blocks` by the stored ones, "plain" neither."""

    mode: str = "plain"
    blocks: frozenset[int] = frozenset()
    stored: dict[int, Tensor] = field(default_factory=dict)


def patched_attention(
    patch: Patch,
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs: object,
) -> tuple[Tensor, Tensor]:
    """Causal attention of one unpadded sequence, its weights recorded or replaced as
    `patch` says (transformers' attention-function signature)."""
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    scores = (query @ key.transpose(-1, -2)).double() * scaling
    size = scores.shape[-1]
    causal = torch.ones(size, size, dtype=torch.bool, device=scores.device).tril()
    weights = scores.masked_fill(~causal, float("-inf")).softmax(dim=-1)
    block = int(module.layer_idx)
    if patch.mode == "record":
        patch.stored[block] = weights
    elif patch.mode == "patch" and block in patch.blocks:
        weights = patch.stored[block]
    output = weights.to(value.dtype) @ value
    return output.transpose(1, 2).contiguous(), weights


@contextlib.contextmanager
def patchable(model: nn.Module) -> Iterator[Patch]:
    """`model` (a transformers decoder) running `patched_attention` inside the block, its
    own attention implementation restored after it."""
    import functools

    from transformers import AttentionInterface

    patch = Patch()
    AttentionInterface.register(NAME, functools.partial(patched_attention, patch))
    configs = {id(c): c for c in (m.config for m in model.modules() if hasattr(m, "config"))}
    before = {key: config._attn_implementation for key, config in configs.items()}
    try:
        for config in configs.values():
            config._attn_implementation = NAME
        yield patch
    finally:
        for key, config in configs.items():
            config._attn_implementation = before[key]


def log_probability(model: nn.Module, ids: Sequence[int], answer: Sequence[int]) -> float:
    """log p(answer | ids) from one forward of the unpadded sequence."""
    sequence = torch.tensor([[*ids, *answer]])
    with torch.no_grad():
        logits = model(input_ids=sequence).logits[0].double().log_softmax(dim=-1)
    at = torch.arange(len(ids) - 1, len(ids) + len(answer) - 1)
    return float(logits[at, torch.tensor(list(answer))].sum())


@dataclass(frozen=True)
class Probe:
    """One fact of one prompt: the log-probabilities of the module doc."""

    clean: float
    removed: float
    patched: tuple[float, ...]
    """Per block, then every block: the removed prompt with clean attention weights."""
    swapped: float


def probe(
    model: nn.Module,
    patch: Patch,
    ids: Sequence[int],
    answer: Sequence[int],
    removed: Sequence[int],
) -> Probe:
    """The probe of one prompt `ids` and its copy `removed` (a fact replaced), inside
    `patchable(model)`."""
    blocks = model.config.num_hidden_layers

    def run(mode: str, prompt: Sequence[int], chosen: Sequence[int] = ()) -> float:
        patch.mode, patch.blocks = mode, frozenset(chosen)
        return log_probability(model, prompt, answer)

    clean = run("record", ids)
    patched = [run("patch", removed, [b]) for b in range(blocks)]
    patched.append(run("patch", removed, range(blocks)))
    removed_value = run("record", removed)
    swapped = run("patch", ids, range(blocks))
    patch.mode = "plain"
    return Probe(clean, removed_value, tuple(patched), swapped)


def replaced(example: recall.RecallExample, fact: recall.Fact) -> list[int]:
    """The example's prompt with `fact`'s key and value words replaced by the filler word."""
    filler = recall.VOCABULARY.index(recall.REPLACEMENT)
    ids = list(example.input_ids)
    for position in fact.positions:
        ids[position] = filler
    return ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="zoo:twohop-llama")
    parser.add_argument("--examples", type=int, default=6)
    parser.add_argument("--length", type=int, default=512)
    args = parser.parse_args()
    from explain.loading import load_model

    torch.set_num_threads(1)
    model = load_model(args.model).model.double().eval()
    blocks = model.config.num_hidden_layers
    print(
        "| prompt | fact | clean | removed | "
        + " | ".join(f"removed, clean attention of block {b}" for b in range(blocks))
        + " | removed, clean attention of every block | clean, removed attention |"
    )
    print("|---|---|" + "---:|" * (blocks + 4))
    with patchable(model) as patch:
        for index, example in enumerate(
            recall.examples("heldout", args.examples, args.length, hops=2)
        ):
            for name, at in (("bridge a b", 0), ("answer's fact b c", 1)):
                fact = example.facts[example.asked[at]]
                found = probe(
                    model, patch, example.input_ids, example.answer, replaced(example, fact)
                )
                cells = [found.clean, found.removed, *found.patched, found.swapped]
                print(f"| {index} | {name} | " + " | ".join(f"{v:.3f}" for v in cells) + " |")


if __name__ == "__main__":
    main()
