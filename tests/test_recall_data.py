"""The associative-recall data (explain.data.recall): pure functions of their seeds, disjoint
splits, evidence positions that hold the asked fact, and a tokenizer that reads the texts
back to the same token ids."""

from __future__ import annotations

import pytest

from explain.data import recall

LENGTHS = [64, 512, 1024, 2048, 4096]


def _words(ids) -> list[str]:
    return [recall.VOCABULARY[token] for token in ids]


def test_vocabularies_are_disjoint_and_ids_follow_their_order():
    groups = [
        tuple(recall.SPECIAL_TOKENS.values()),
        (".", "?", "??"),
        recall.ADJECTIVES,
        recall.ANIMALS,
        recall.NUMBERS,
        recall.THINGS,
        recall.FILLER,
    ]
    assert sum(len(group) for group in groups) == len(recall.VOCABULARY)
    assert len(set(recall.VOCABULARY)) == len(recall.VOCABULARY)
    assert tuple(word for group in groups for word in group) == recall.VOCABULARY


def test_an_example_is_a_pure_function_of_its_seed():
    first = recall.make_example(17, 256)
    assert first == recall.make_example(17, 256)
    assert first.input_ids != recall.make_example(18, 256).input_ids
    two_hops = recall.make_example(17, 256, hops=2)
    assert two_hops == recall.make_example(17, 256, hops=2)
    assert recall.training_sequence(first) == recall.training_sequence(first)
    assert recall.with_evidence_replaced(first) == recall.with_evidence_replaced(first)
    assert recall.with_distractors_replaced(first) == recall.with_distractors_replaced(first)


def test_splits_are_disjoint_and_bounded():
    train, heldout = recall.SPLITS["train"], recall.SPLITS["heldout"]
    assert train.stop <= heldout.start
    first_train = recall.examples("train", 3, 128)
    first_heldout = recall.examples("heldout", 3, 128)
    assert [e.seed for e in first_train] == [0, 1, 2]
    assert [e.seed for e in first_heldout] == [heldout.start + i for i in range(3)]
    assert first_train[0] == recall.make_example(0, 128)
    with pytest.raises(ValueError, match="outside split"):
        recall.examples("heldout", 2, 128, start=len(heldout) - 1)
    with pytest.raises(ValueError, match="unknown split"):
        recall.examples("test", 1)


@pytest.mark.parametrize("length", LENGTHS)
def test_prompts_have_the_asked_length_and_facts(length):
    for example in recall.examples("heldout", 3, length):
        assert example.length == len(example.input_ids) == length
        assert len(example.facts) == recall.default_facts(length)
        assert example.input_ids[0] == recall.BOS
        assert _words(example.input_ids[-3:]) == ["?", *_words(example.facts[example.asked[0]].key)]


@pytest.mark.parametrize("hops", [1, 2])
def test_no_two_facts_of_a_context_share_a_word(hops):
    for example in recall.examples("heldout", 20, 1024, hops=hops):
        # two hops: a chain's middle key is the first fact's value and the second's key
        words = [w for f in example.facts for w in (f.key + f.value if hops == 1 else f.key)]
        assert len(words) == len(set(words))
        for changed in (recall.with_evidence_replaced(example),
                        recall.with_distractors_replaced(example)):  # fmt: skip
            words = [w for f in changed.facts for w in f.key + f.value]
            counts = {w: words.count(w) for w in words}
            assert max(counts.values()) <= (1 if hops == 1 else 2)


@pytest.mark.parametrize("hops", [1, 2])
def test_evidence_positions_hold_the_asked_facts_and_the_answer_is_its_value(hops):
    for example in recall.examples("heldout", 20, 512, hops=hops):
        ids = example.input_ids
        facts = [example.facts[i] for i in example.asked]
        assert len(facts) == hops
        positions = []
        for fact in facts:
            # key, value, then the closing "."
            assert tuple(ids[p] for p in fact.key_positions) == fact.key
            assert tuple(ids[p] for p in fact.value_positions) == fact.value
            assert fact.positions == fact.key_positions + fact.value_positions
            assert recall.VOCABULARY[ids[fact.value_positions[-1] + 1]] == "."
            positions.extend(fact.positions)
        assert example.evidence_positions == tuple(sorted(positions))
        # the question asks the (first) asked fact's key; the answer is the (last) one's value
        assert ids[-2:] == facts[0].key
        assert example.answer == facts[-1].value
        if hops == 2:  # a chain: a's value is b, the key of the second fact
            assert facts[0].value == facts[1].key
            assert recall.VOCABULARY[ids[-3]] == "??"
        # every other fact is a distractor; together they are all the facts
        others = [f for i, f in enumerate(example.facts) if i not in example.asked]
        assert example.distractor_positions == tuple(sorted(p for f in others for p in f.positions))
        assert not set(example.evidence_positions) & set(example.distractor_positions)
        # keys are distinct, so the question has one answer
        keys = [fact.key for fact in example.facts]
        assert len(set(keys)) == len(keys)
        # no fact or question token outside the facts and the question: filler only
        covered = {p for f in example.facts for p in (*f.positions, f.positions[-1] + 1)}
        covered |= set(example.question_positions) | {0}
        filler = {recall.VOCABULARY.index(w) for w in recall.FILLER}
        assert all(ids[p] in filler for p in range(example.length) if p not in covered)


def test_facts_are_key_then_value_words_of_their_kinds():
    kinds = {
        "adjective": set(recall.ADJECTIVES),
        "animal": set(recall.ANIMALS),
        "number": set(recall.NUMBERS),
        "thing": set(recall.THINGS),
    }
    example = recall.make_example(3, 512)
    for fact in example.facts:
        adjective, animal = _words(fact.key)
        number, thing = _words(fact.value)
        assert adjective in kinds["adjective"] and animal in kinds["animal"]
        assert number in kinds["number"] and thing in kinds["thing"]


def test_training_sequence_starts_with_the_prompt_and_asks_every_fact():
    example = recall.make_example(5, 256)
    ids, labels = recall.training_sequence(example)
    assert len(ids) == len(labels)
    assert ids[: example.length] == list(example.input_ids)
    assert ids[example.length : example.length + 2] == list(example.answer)
    # labels are the answer tokens, at their own positions; everything else is ignored
    answered = [i for i, label in enumerate(labels) if label != recall.IGNORE]
    assert all(labels[i] == ids[i] for i in answered)
    assert len(answered) == 2 * len(example.facts)
    # after the prompt: "? key value" for every other fact, once
    rest = ids[example.length + 2 :]
    questions = [tuple(rest[i + 1 : i + 5]) for i in range(0, len(rest), 5)]
    assert all(recall.VOCABULARY[rest[i]] == "?" for i in range(0, len(rest), 5))
    expected = {(*f.key, *f.value) for i, f in enumerate(example.facts) if i != example.asked[0]}
    assert sorted(questions) == sorted(expected)


def test_two_hop_training_sequence_asks_every_chain_and_every_fact():
    example = recall.make_example(5, 256, hops=2)
    ids, _ = recall.training_sequence(example)
    assert ids[: example.length] == list(example.input_ids)
    rest = ids[example.length + 2 :]
    follows = {fact.key: fact.value for fact in example.facts}
    asked = []
    for i in range(0, len(rest), 5):
        marker, key, value = (
            recall.VOCABULARY[rest[i]],
            tuple(rest[i + 1 : i + 3]),
            rest[i + 3 : i + 5],
        )
        expected = follows[key] if marker == "?" else follows[follows[key]]
        assert tuple(value) == expected
        asked.append((marker, key))
    chains = [f.key for f in example.facts if f.value in follows]
    assert sorted(k for m, k in asked if m == "??") == sorted(
        k for k in chains if k != example.facts[example.asked[0]].key
    )
    assert sorted(k for m, k in asked if m == "?") == sorted(f.key for f in example.facts)


@pytest.mark.parametrize("hops", [1, 2])
def test_replacing_the_evidence_changes_the_asked_value_only(hops):
    for example in recall.examples("heldout", 20, 256, hops=hops):
        replaced = recall.with_evidence_replaced(example)
        changed = [
            p for p in range(example.length) if replaced.input_ids[p] != example.input_ids[p]
        ]
        last = example.facts[example.asked[-1]]
        assert changed == list(last.value_positions)  # both words differ
        assert replaced.answer == replaced.facts[example.asked[-1]].value != example.answer
        assert replaced.answer not in {fact.value for fact in example.facts}
        assert replaced.evidence_positions == example.evidence_positions


@pytest.mark.parametrize("hops", [1, 2])
def test_replacing_the_distractors_keeps_the_evidence_and_the_answer(hops):
    for example in recall.examples("heldout", 20, 256, hops=hops):
        replaced = recall.with_distractors_replaced(example)
        changed = {
            p for p in range(example.length) if replaced.input_ids[p] != example.input_ids[p]
        }
        assert changed <= set(example.distractor_positions)
        assert replaced.answer == example.answer
        for index in example.asked:
            assert replaced.facts[index] == example.facts[index]
        old_keys = {f.key for f in example.facts}
        for index, fact in enumerate(replaced.facts):
            if index not in example.asked:
                assert fact.key not in old_keys
        keys = [fact.key for fact in replaced.facts]
        assert len(set(keys)) == len(keys)
        if hops == 2:  # the replaced chains are still chains
            follows = {fact.key: fact.value for fact in replaced.facts}
            starts = [f for f in replaced.facts if f.value in follows]
            assert len(starts) == len(replaced.facts) // 2


def test_a_two_hop_question_is_answered_through_one_unique_bridge():
    for example in recall.examples("heldout", 20, 512, hops=2):
        first, second = (example.facts[i] for i in example.asked)
        asked_key = tuple(example.input_ids[-recall.KEY_TOKENS :])
        assert example.input_ids[-recall.QUESTION_TOKENS] == recall.VOCABULARY.index("??")
        assert first.key == asked_key and first.value == second.key  # chained by the bridge
        assert second.value == example.answer
        # The asked key names one fact and is no fact's value; the bridge is the value of
        # exactly one fact and the key of exactly one: the chain is the only route.
        assert [f.key for f in example.facts].count(asked_key) == 1
        assert asked_key not in {f.value for f in example.facts}
        assert [f.value for f in example.facts].count(first.value) == 1
        assert [f.key for f in example.facts].count(first.value) == 1
        assert example.evidence_positions == tuple(sorted((*first.positions, *second.positions)))
        assert [example.input_ids[p] for p in first.positions] == [*first.key, *first.value]
        assert [example.input_ids[p] for p in second.positions] == [*second.key, *second.value]


def test_redirecting_the_bridge_leads_to_another_chain():
    for example in recall.examples("heldout", 20, 256, hops=2):
        redirected = recall.with_bridge_redirected(example)
        first = example.facts[example.asked[0]]
        changed = [
            p for p in range(example.length) if redirected.input_ids[p] != example.input_ids[p]
        ]
        assert changed == list(first.value_positions)
        new_first, new_second = (redirected.facts[i] for i in redirected.asked)
        assert redirected.asked[0] == example.asked[0]
        assert redirected.asked[1] not in example.asked
        assert new_first.key == first.key and new_first.value == new_second.key
        assert redirected.answer == new_second.value != example.answer
        assert [redirected.input_ids[p] for p in new_first.positions] == [
            *new_first.key,
            *new_first.value,
        ]
    with pytest.raises(ValueError, match="two-hop"):
        recall.with_bridge_redirected(recall.make_example(0, 256))
    with pytest.raises(ValueError, match="one chain"):
        recall.with_bridge_redirected(recall.make_example(0, 64, hops=2, facts=2))


@pytest.mark.parametrize("hops", [1, 2])
def test_removing_a_fact_reads_it_as_filler_and_keeps_the_rest(hops):
    example = recall.make_example(5, 256, hops=hops)
    for index in range(len(example.facts)):
        removed = recall.without_fact(example, index)
        fact = example.facts[index]
        span = range(fact.start, fact.start + recall.FACT_TOKENS)
        assert _words(removed.input_ids[p] for p in span) == [recall.REPLACEMENT] * 5
        assert all(
            removed.input_ids[p] == example.input_ids[p]
            for p in range(example.length)
            if p not in span
        )
        assert removed.answer == example.answer and removed.length == example.length


def test_tokenizer_reads_the_texts_back_to_their_ids():
    tokenizer = recall.build_tokenizer()
    for example in [recall.make_example(1, 512), recall.make_example(2, 128, hops=2)]:
        encoded = tokenizer(example.text)["input_ids"]
        assert encoded == list(example.input_ids)
        assert tokenizer.decode(encoded, skip_special_tokens=True) == example.text
    assert tokenizer.convert_tokens_to_ids(list(recall.VOCABULARY)) == list(
        range(len(recall.VOCABULARY))
    )
    assert tokenizer("zebra")["input_ids"] == [recall.BOS, tokenizer.unk_token_id]
    batch = tokenizer(["? red fox", "the ? red fox"], padding=True)
    assert batch["input_ids"][0][0] == tokenizer.pad_token_id  # left padding


def test_impossible_requests_are_refused():
    with pytest.raises(ValueError, match="do not fit"):
        recall.make_example(0, 64, facts=14)
    with pytest.raises(ValueError, match="at most 16 facts"):
        recall.make_example(0, 512, facts=recall.MAX_FACTS + 2)
    with pytest.raises(ValueError, match="hops"):
        recall.make_example(0, 128, hops=3)
    with pytest.raises(ValueError, match="multiple of 2"):
        recall.make_example(0, 128, hops=2, facts=3)
