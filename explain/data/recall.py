"""Associative recall in long contexts: a language-model task whose evidence is known.

A context states facts `key value .` (keys are two words, an adjective and an animal,
"red fox"; values are a number and a thing, "17 cups": the fact "red fox 17 cups ."),
scattered among
distractor facts and filler words, and ends with a question about one key, `? red fox`;
the answer is its value, `17 cups`. The two-hop variant states chains `a b .` and `b c .`
(b is itself a key: "red fox blue owl . ... blue owl 17 cups .") and asks `?? a` for a's
c. Each example records where its evidence is (the token positions of the asked fact, or
of both facts of the asked chain), the answer's tokens, and the positions of the
distractor facts, so that an explanation can be scored against them;
`with_evidence_replaced` and `with_distractors_replaced` make the counterfactual contexts
that check that the evidence really is what the answer rests on; for two hops,
`with_bridge_redirected` and `without_fact` check that each fact of the chain is needed.

Keys, values, filler and the markers are disjoint vocabularies, and the words of a text
are separated by single spaces, so that the word-level tokenizer (`build_tokenizer`)
maps word i of `text` to token i + 1 of `input_ids` (token 0 is the start token `<s>`).

Like the other data sets, an example is a pure function of its seed (and its length, hop
count and number of facts), and the "train" and "heldout" seeds never overlap. Contexts
can have any length from a few dozen tokens up: by default one fact per 32 tokens.

`training_sequence` is the training-only format: the evaluation prompt with its answer,
followed by a question and answer for every other fact (and chain), so that one sequence
supervises many answers (multi-query associative recall, Arora et al., "Zoology", 2023).
Its first answer is exactly the evaluation example's: a model trained on it answers the
evaluation format, which is its prefix.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # transformers is imported only when a tokenizer is built
    from transformers import PreTrainedTokenizerFast

__all__ = [
    "ADJECTIVES",
    "ANIMALS",
    "BOS",
    "FILLER",
    "IGNORE",
    "NUMBERS",
    "REPLACEMENT",
    "SPECIAL_TOKENS",
    "SPLITS",
    "THINGS",
    "VOCABULARY",
    "Fact",
    "RecallExample",
    "build_tokenizer",
    "default_facts",
    "examples",
    "make_example",
    "training_sequence",
    "with_bridge_redirected",
    "with_distractors_replaced",
    "with_evidence_replaced",
    "without_fact",
]

SPLITS: dict[str, range] = {
    "train": range(0, 100_000_000),
    "heldout": range(100_000_000, 101_000_000),
}
"""Disjoint seed ranges: an example's seed says which split it belongs to."""

SPECIAL_TOKENS: dict[str, str] = {
    "pad_token": "<pad>",
    "bos_token": "<s>",
    "eos_token": "</s>",
    "unk_token": "<unk>",
}
END, ASK, ASK_TWO_HOPS = ".", "?", "??"
"""The markers: a fact is `key value .`, a question `? key` (two hops: `?? key`).

Why no word between a key and its value ("red fox = 17 42"): measured here, a 2-block
Llama learns to match two-word keys several times faster when the value's first token
directly follows the key (its previous two tokens are the key, as the question's last two
are) than with a marker between them (three tokens back)."""

ADJECTIVES: tuple[str, ...] = (
    "red", "blue", "green", "black", "white", "grey", "brown", "pink",
    "tall", "short", "quick", "slow", "old", "young", "wild", "calm",
    "bold", "shy", "loud", "quiet", "happy", "sad", "brave", "proud",
    "tiny", "huge", "warm", "cold", "dark", "pale", "wise", "odd",
)  # fmt: skip
ANIMALS: tuple[str, ...] = (
    "fox", "owl", "cat", "dog", "bee", "elk", "yak", "ant",
    "bear", "wolf", "deer", "hare", "lion", "seal", "crow", "duck",
    "frog", "goat", "mole", "moth", "newt", "swan", "toad", "wasp",
    "crab", "lynx", "mule", "puma", "boar", "dove", "ibex", "orca",
)  # fmt: skip
NUMBERS: tuple[str, ...] = tuple(str(number) for number in range(10, 100))
"""The first words of values."""
THINGS: tuple[str, ...] = (
    "apples", "books", "coins", "cups", "doors", "eggs", "forks", "gems",
    "hats", "jars", "lamps", "maps", "nails", "pens", "rings", "shoes",
    "tents", "vases", "wheels", "bells", "boats", "bowls", "clocks", "drums",
    "flags", "gloves", "kites", "masks", "pipes", "ropes", "spoons", "stones",
)  # fmt: skip
"""The second words of values.

Why a value's two words come from different vocabularies (and a key's: an adjective,
then an animal): a token's kind then says where in a fact it stands, so the attention that
gathers a fact's key into its value can select by content. With both value words numbers,
a 2-block Llama found the first answer word (whose place is known only by its position
after the key) many times more slowly than the second."""
FILLER: tuple[str, ...] = (
    "the", "of", "and", "a", "to", "in", "is", "it", "that", "was", "for", "on", "are",
    "as", "with", "his", "they", "at", "be", "this", "have", "from", "or", "one", "had",
    "by", "word", "but", "not", "what", "all", "were", "we", "when", "your", "can", "said",
    "there", "use", "an", "each", "which", "she", "do", "how", "their", "if", "will", "up",
    "other", "about", "out", "many", "then", "them", "these", "so", "some", "her", "would",
    "make", "like", "him", "into",
)  # fmt: skip
"""Filler words between the facts (64 common English words, none a key or value word)."""
REPLACEMENT = FILLER[0]
"""The word that stands for a removed token when the evidence protocols remove tokens: a
filler word ("the"), so that a removed fact reads as filler, not as a token the model never
saw in training (`<unk>`)."""

VOCABULARY: tuple[str, ...] = (
    *SPECIAL_TOKENS.values(),
    END,
    ASK,
    ASK_TWO_HOPS,
    *ADJECTIVES,
    *ANIMALS,
    *NUMBERS,
    *THINGS,
    *FILLER,
)
"""Every token, in id order."""

_ID = {word: index for index, word in enumerate(VOCABULARY)}
BOS = _ID[SPECIAL_TOKENS["bos_token"]]
"""The id of `<s>`, the first token of every prompt."""
IGNORE = -100
"""The label of a position that carries no loss (transformers' ignore index)."""

KEY_TOKENS, VALUE_TOKENS = 2, 2
FACT_TOKENS = KEY_TOKENS + VALUE_TOKENS + 1  # key value .
QUESTION_TOKENS = 1 + KEY_TOKENS  # ? key
_ADJECTIVE_IDS = np.array([_ID[word] for word in ADJECTIVES])
_ANIMAL_IDS = np.array([_ID[word] for word in ANIMALS])
_NUMBER_IDS = np.array([_ID[word] for word in NUMBERS])
_THING_IDS = np.array([_ID[word] for word in THINGS])
_FILLER_IDS = np.array([_ID[word] for word in FILLER])
MAX_FACTS = min(len(ADJECTIVES), len(ANIMALS), len(THINGS)) // 2
"""The most facts a context holds. No two facts of a context share a word, and the
counterfactual contexts draw fresh words for the facts they replace: half of each word
list each."""


@dataclass(frozen=True)
class Fact:
    """One fact `key value .` of a context, starting at token position `start`.

    For a one-hop fact the value is a number and a thing; the first fact of a two-hop chain has
    a key (adjective, animal) as its value.
    """

    key: tuple[int, ...]
    value: tuple[int, ...]
    start: int

    @property
    def key_positions(self) -> tuple[int, ...]:
        return tuple(range(self.start, self.start + len(self.key)))

    @property
    def value_positions(self) -> tuple[int, ...]:
        first = self.start + len(self.key)
        return tuple(range(first, first + len(self.value)))

    @property
    def positions(self) -> tuple[int, ...]:
        """The fact's evidence: its key and value tokens (not the closing ".")."""
        return tuple(range(self.start, self.start + len(self.key) + len(self.value)))


@dataclass(frozen=True)
class RecallExample:
    """One evaluation example: a prompt of `length` tokens ending with a question.

    Attributes:
        seed: the seed it was made from (its split is the one whose range holds it).
        input_ids: the prompt's token ids: `<s>`, the context, the question.
        answer: the answer's token ids (the asked value).
        facts: every fact of the context, in the order they appear.
        asked: indices into `facts` of the evidence: the asked fact (one hop), or the
            chain's facts `a b` then `b c` (two hops).
        hops: 1 or 2.
    """

    seed: int
    input_ids: tuple[int, ...]
    answer: tuple[int, ...]
    facts: tuple[Fact, ...]
    asked: tuple[int, ...]
    hops: int

    @property
    def length(self) -> int:
        return len(self.input_ids)

    @property
    def text(self) -> str:
        """The prompt as words (without `<s>`, which the tokenizer adds)."""
        return " ".join(VOCABULARY[token] for token in self.input_ids[1:])

    @property
    def answer_text(self) -> str:
        return " ".join(VOCABULARY[token] for token in self.answer)

    @property
    def evidence_positions(self) -> tuple[int, ...]:
        """Token positions of the asked fact(s): key and value of each."""
        return tuple(sorted(p for index in self.asked for p in self.facts[index].positions))

    @property
    def distractor_positions(self) -> tuple[int, ...]:
        """Token positions of every other fact: key and value of each."""
        asked = set(self.asked)
        return tuple(
            sorted(
                p
                for index, fact in enumerate(self.facts)
                if index not in asked
                for p in fact.positions
            )
        )

    @property
    def question_positions(self) -> tuple[int, ...]:
        """Token positions of the question at the end of the prompt."""
        return tuple(range(self.length - QUESTION_TOKENS, self.length))


def default_facts(length: int) -> int:
    """The number of facts of a context of `length` tokens by default: one per 32 tokens,
    at least 2 (even, so that two-hop contexts hold whole chains) and at most MAX_FACTS
    (16: from 512 tokens on, longer contexts hold more filler, not more facts)."""
    return min(MAX_FACTS, max(2, length // 64 * 2))


def _draw_pairs(
    rng: np.random.Generator,
    count: int,
    used: set[int],
    firsts: np.ndarray,
    seconds: np.ndarray,
) -> list[tuple[int, ...]]:
    """`count` word pairs (a first word's id, then a second's) whose words are all distinct
    and none in `used` (which they join), drawn uniformly."""
    first = rng.permutation([word for word in firsts.tolist() if word not in used])[:count]
    second = rng.permutation([word for word in seconds.tolist() if word not in used])[:count]
    if len(first) < count or len(second) < count:
        raise ValueError(f"not enough unused words for {count} more pairs")
    used.update(first.tolist(), second.tolist())
    return [(int(a), int(b)) for a, b in zip(first, second, strict=True)]


def _draw_keys(rng: np.random.Generator, count: int, used: set[int]) -> list:
    return _draw_pairs(rng, count, used, _ADJECTIVE_IDS, _ANIMAL_IDS)


def _draw_values(rng: np.random.Generator, count: int, used: set[int]) -> list:
    return _draw_pairs(rng, count, used, _NUMBER_IDS, _THING_IDS)


def _check(length: int, hops: int, facts: int) -> None:
    if hops not in (1, 2):
        raise ValueError(f"hops must be 1 or 2, got {hops}")
    if facts < hops or facts % hops:
        raise ValueError(f"a {hops}-hop context needs a positive multiple of {hops} facts")
    if facts > MAX_FACTS:
        raise ValueError(f"a context holds at most {MAX_FACTS} facts, got {facts}")
    if 1 + facts * FACT_TOKENS + QUESTION_TOKENS > length:
        raise ValueError(
            f"{facts} facts of {FACT_TOKENS} tokens and a question do not fit in {length} "
            "tokens; ask for fewer facts or a longer context"
        )


def make_example(
    seed: int, length: int = 512, *, hops: int = 1, facts: int | None = None
) -> RecallExample:
    """The example of `seed`: a prompt of exactly `length` tokens (deterministic).

    `facts` (default `default_facts(length)`) facts are laid out in a random order with
    filler words between them (random gaps); one of them (two hops: one chain) is asked.
    No two facts of a context share a word (each word of a key names its fact).
    """
    facts = default_facts(length) if facts is None else facts
    _check(length, hops, facts)
    rng = np.random.default_rng((seed, length, hops, facts))
    if hops == 1:
        used: set[int] = set()
        keys = _draw_keys(rng, facts, used)
        contents = list(zip(keys, _draw_values(rng, facts, used), strict=True))
    else:  # facts / 2 chains a b, b c: two distinct keys a and b, and a value c
        used = set()
        starts = _draw_keys(rng, facts // 2, used)
        middles = _draw_keys(rng, facts // 2, used)
        ends = _draw_values(rng, facts // 2, used)
        contents = [pair for chain in zip(starts, middles, ends, strict=True) for pair in
                    ((chain[0], chain[1]), (chain[1], chain[2]))]  # fmt: skip
    chosen = int(rng.integers(facts // hops)) * hops  # the asked fact, or chain's first fact
    asked_contents = contents[chosen : chosen + hops]

    filler = length - 1 - facts * FACT_TOKENS - QUESTION_TOKENS
    cuts = np.sort(rng.integers(0, filler + 1, size=facts))
    gaps = np.diff(np.concatenate([[0], cuts, [filler]]))
    words = iter(_FILLER_IDS[rng.integers(len(FILLER), size=filler)].tolist())
    order = rng.permutation(facts)

    input_ids = [BOS]
    laid_out: list[Fact] = []
    for gap, index in zip(gaps, order, strict=False):  # one gap before each fact
        input_ids.extend(next(words) for _ in range(gap))
        key, value = contents[index]
        laid_out.append(Fact(key=key, value=value, start=len(input_ids)))
        input_ids.extend([*key, *value, _ID[END]])
    input_ids.extend(words)  # the last gap
    start_key = asked_contents[0][0]
    input_ids.extend([_ID[ASK if hops == 1 else ASK_TWO_HOPS], *start_key])
    position = {(fact.key, fact.value): i for i, fact in enumerate(laid_out)}
    return RecallExample(
        seed=seed,
        input_ids=tuple(input_ids),
        answer=asked_contents[-1][1],
        facts=tuple(laid_out),
        asked=tuple(position[content] for content in asked_contents),
        hops=hops,
    )


def examples(
    split: str,
    count: int,
    length: int = 512,
    *,
    hops: int = 1,
    facts: int | None = None,
    start: int = 0,
) -> list[RecallExample]:
    """Examples `start .. start + count - 1` of `split`."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {sorted(SPLITS)}")
    seeds = SPLITS[split]
    if start < 0 or count < 0 or start + count > len(seeds):
        raise ValueError(f"examples {start}..{start + count - 1} are outside split {split!r}")
    return [
        make_example(seeds[start + index], length, hops=hops, facts=facts) for index in range(count)
    ]


def training_sequence(example: RecallExample) -> tuple[list[int], list[int]]:
    """The multi-query training format of `example`: (input ids, labels).

    The prompt and its answer, then a question and its answer about every other fact (and,
    two hops, about every other chain, plus a one-hop question about each fact), in a
    random order drawn from the example's seed. Labels are the next token at each answer
    token's preceding position and IGNORE elsewhere (as transformers' causal LM loss
    shifts them: label i is the token at i, predicted from positions before it).
    """
    rng = np.random.default_rng((example.seed, example.length, example.hops, len(example.facts), 1))
    questions: list[tuple[int, tuple[int, ...], tuple[int, ...]]] = []
    first = example.asked[0]
    for index, fact in enumerate(example.facts):
        if index != first or example.hops == 2:
            questions.append((_ID[ASK], fact.key, fact.value))
    if example.hops == 2:
        follows = {fact.key: fact.value for fact in example.facts}
        for fact in example.facts:
            if fact.value in follows and fact.key != example.facts[first].key:
                questions.append((_ID[ASK_TWO_HOPS], fact.key, follows[fact.value]))
    ids = list(example.input_ids) + list(example.answer)
    labels = [IGNORE] * len(example.input_ids) + list(example.answer)
    for marker, key, value in (questions[i] for i in rng.permutation(len(questions))):
        ids.extend([marker, *key, *value])
        labels.extend([IGNORE] * (len(key) + 1) + list(value))
    return ids, labels


def _substituted(example: RecallExample, changes: dict[int, tuple]) -> RecallExample:
    """`example` with the facts at the given indices replaced by (key, value) pairs, laid
    out at the same positions (the lengths of keys and values do not change)."""
    input_ids = list(example.input_ids)
    facts = list(example.facts)
    for index, (key, value) in changes.items():
        fact = replace(facts[index], key=key, value=value)
        for position, token in zip(fact.key_positions, key, strict=True):
            input_ids[position] = token
        for position, token in zip(fact.value_positions, value, strict=True):
            input_ids[position] = token
        facts[index] = fact
    return replace(example, input_ids=tuple(input_ids), facts=tuple(facts))


def with_evidence_replaced(example: RecallExample) -> RecallExample:
    """`example` with the value of the asked fact (two hops: of the chain's second fact,
    `b c`) replaced by a value no fact of the context holds, each of its two
    words different from the one it replaces; the returned example's answer is that new
    value. Deterministic: drawn from the example's seed.

    A model whose answer rests on the recorded evidence answers differently here (and,
    when it reads the value from there, answers the new value).
    """
    rng = np.random.default_rng((example.seed, example.length, example.hops, len(example.facts), 2))
    index = example.asked[-1]
    fact = example.facts[index]
    # Fresh words are never the replaced fact's own: each word of the new value differs.
    (value,) = _draw_values(rng, 1, {word for other in example.facts for word in other.value})
    changed = _substituted(example, {index: (fact.key, value)})
    return replace(changed, answer=value)


def with_distractors_replaced(example: RecallExample) -> RecallExample:
    """`example` with every distractor fact's key and value replaced by ones no fact of
    the context holds (two hops: consistently, so that the other chains stay chains); the
    asked fact(s), the filler and the question are untouched, and so is the answer.
    Deterministic: drawn from the example's seed."""
    rng = np.random.default_rng((example.seed, example.length, example.hops, len(example.facts), 3))
    asked = set(example.asked)
    keys = {fact.key for fact in example.facts}
    words = {word for fact in example.facts for word in (*fact.key, *fact.value)}
    old_keys = sorted({fact.key for i, fact in enumerate(example.facts) if i not in asked})
    old_values = sorted(
        {fact.value for i, fact in enumerate(example.facts) if i not in asked} - keys
    )
    mapping = dict(zip(old_keys, _draw_keys(rng, len(old_keys), words), strict=True))
    mapping.update(zip(old_values, _draw_values(rng, len(old_values), words), strict=True))
    changes = {
        i: (mapping[fact.key], mapping[fact.value])
        for i, fact in enumerate(example.facts)
        if i not in asked
    }
    return _substituted(example, changes)


def with_bridge_redirected(example: RecallExample) -> RecallExample:
    """A two-hop `example` with its chain's first fact `a b` redirected to the bridge of
    another chain, `a b2` (b2 the key of the other chain's second fact `b2 c2`, laid out
    where `b` was); the returned example's answer is c2 and its evidence `a b2`, `b2 c2`.
    Deterministic: the other chain is drawn from the example's seed.

    A model that finds the answer through the bridge answers c2 here: the first fact is
    needed, and it is read for its value (the bridge), not only for its key.
    """
    if example.hops != 2:
        raise ValueError("only a two-hop example has a bridge to redirect")
    first, second = example.asked
    bridges = [
        index
        for index, fact in enumerate(example.facts)
        if index != second and any(other.value == fact.key for other in example.facts)
    ]
    if not bridges:
        raise ValueError("a context of one chain has no other bridge to redirect to")
    rng = np.random.default_rng((example.seed, example.length, example.hops, len(example.facts), 4))
    target = bridges[int(rng.integers(len(bridges)))]
    bridge = example.facts[target].key
    changed = _substituted(example, {first: (example.facts[first].key, bridge)})
    return replace(changed, answer=example.facts[target].value, asked=(first, target))


def without_fact(example: RecallExample, index: int) -> RecallExample:
    """`example` with its fact `index` removed: its key, value and "." read as filler
    (REPLACEMENT, as the evidence protocols remove tokens); everything else stays at its
    position. The returned example keeps the facts and the answer of `example` (what a
    model that needs that fact can no longer say) but its prompt is the edited one."""
    fact = example.facts[index]
    input_ids = list(example.input_ids)
    end = fact.start + len(fact.key) + len(fact.value) + 1
    input_ids[fact.start : end] = [_ID[REPLACEMENT]] * (end - fact.start)
    return replace(example, input_ids=tuple(input_ids))


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A fresh word-level tokenizer over VOCABULARY: split at spaces, `<s>` prepended to
    every text (as Llama's tokenizer does), `<pad>` for padding (on the left, as
    generation pads). Any other word is `<unk>`."""
    from tokenizers import Tokenizer, pre_tokenizers, processors
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(WordLevel(dict(_ID), unk_token=SPECIAL_TOKENS["unk_token"]))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    bos = SPECIAL_TOKENS["bos_token"]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", special_tokens=[(bos, BOS)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, padding_side="left", **SPECIAL_TOKENS
    )
