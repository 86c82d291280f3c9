"""Text in words: tokens on the explanation, word aggregation, raw-text input, similarity
explanations on the real pretrained all-MiniLM-L6-v2."""

from __future__ import annotations

import pytest
import reference_hf as ref
import torch
from tolerances import FLOAT32

from explain import Explainer, InputError, UnsupportedModelError
from explain import text as text_module
from explain.testing import ModelState
from explain.text import Word, similarity, word_relevance, words


@pytest.fixture(scope="module")
def minilm():
    from transformers import AutoModel, AutoTokenizer

    path = ref.minilm_path()
    return AutoModel.from_pretrained(path), AutoTokenizer.from_pretrained(path)


def test_wordpiece_words_sum_and_max():
    tokens = ["[CLS]", "un", "##believ", "##able", "news", "[SEP]", "[PAD]"]
    relevance = torch.tensor([5.0, 1.0, 2.0, 0.5, 3.0, 7.0, 0.0])
    special = {"[CLS]", "[SEP]", "[PAD]"}
    assert word_relevance(tokens, relevance, special) == [
        Word("unbelievable", 3.5, (1, 2, 3)),
        Word("news", 3.0, (4,)),
    ]
    assert [w.relevance for w in word_relevance(tokens, relevance, special, "max")] == [2.0, 3.0]


def test_byte_level_and_sentencepiece_words():
    special = {"<s>", "</s>", "<pad>"}
    bpe = ["<s>", "Hello", "Ġwor", "ld", "Ġ!", "</s>"]
    found = word_relevance(bpe, [9, 1, 2, 3, 4, 9], special)
    assert [(w.text, w.relevance, w.positions) for w in found] == [
        ("Hello", 1.0, (1,)),
        ("world", 5.0, (2, 3)),
        ("!", 4.0, (4,)),
    ]
    piece = ["<pad>", "▁sun", "ny", "▁day", "</s>"]
    found = word_relevance(piece, [0, 1, 1, 2, 0], special, "max")
    assert [(w.text, w.relevance) for w in found] == [("sunny", 1.0), ("day", 2.0)]


def test_word_relevance_checks_lengths():
    with pytest.raises(InputError, match="3 tokens but 2"):
        word_relevance(["a", "b", "c"], [1.0, 2.0], set())


def test_tokens_raw_text_and_words(minilm):
    model, tokenizer = minilm
    explainer = Explainer(model, tokenizer=tokenizer)
    texts = ["Tokenization is unbelievable.", "Short one"]
    result = explainer.explain(texts, target=0)
    encoded = tokenizer(texts, padding=True, return_tensors="pt")
    assert result.tokens == [tokenizer.convert_ids_to_tokens(row) for row in encoded["input_ids"]]
    assert result.relevance.shape == encoded["input_ids"].shape
    same = explainer.explain(encoded, target=0)
    torch.testing.assert_close(same.relevance, result.relevance, rtol=0, atol=0)  # same ids
    first = words(result, tokenizer)[0]
    assert [w.text for w in first] == ["tokenization", "is", "unbelievable", "."]
    relevance = result.relevance[0]
    for word in first:
        assert word.relevance == pytest.approx(relevance[list(word.positions)].sum().item())


@pytest.mark.parametrize("bad", ["", "   ", ["fine", ""]])
def test_empty_text_is_refused(minilm, bad):
    model, tokenizer = minilm
    with pytest.raises(InputError, match="empty"):
        Explainer(model, tokenizer=tokenizer).explain(bad)


def test_over_long_text_is_refused_with_advice(minilm):
    model, tokenizer = minilm
    before = ModelState.capture(model)
    with pytest.raises(InputError, match=r"too long: 602 tokens.*at most 512.*truncation=True"):
        Explainer(model, tokenizer=tokenizer).explain(" ".join(["word"] * 600))
    assert before.differences(ModelState.capture(model)) == []


def test_raw_text_without_tokenizer_is_refused(minilm):
    model, _ = minilm
    with pytest.raises(InputError, match="tokenizer"):
        Explainer(model).explain("some text")


CONTENT = {"man", "guitar", "stage"}
STOP = {"a", "is", "on", "the"}


def test_similarity_of_paraphrases_ranks_shared_content_words_first(minilm):
    model, tokenizer = minilm
    explainer = Explainer(model, tokenizer=tokenizer)
    before = ModelState.capture(model)
    result = similarity(
        explainer,
        ["A man is playing a guitar on the stage.", "The cat sleeps on the warm windowsill."],
        ["On stage, a man plays the guitar.", "A kitten is napping by the sunny window."],
    )
    assert before.differences(ModelState.capture(model)) == []
    assert result.similarity[0] > 0.9 > result.similarity[1]
    special = set(tokenizer.all_special_tokens)
    for tokens, relevance in (
        (result.tokens_a[0], result.relevance_a[0]),
        (result.tokens_b[0], result.relevance_b[0]),
    ):
        scores = {w.text: w.relevance for w in word_relevance(tokens, relevance, special)}
        assert min(scores[w] for w in CONTENT) > max(scores[w] for w in STOP if w in scores)


# (text a, text b, words the two share in meaning): hand-written pairs.
PAIRS = [
    (
        "A man is playing a guitar on the stage.",
        "On stage, a man plays the guitar.",
        {"guitar", "stage"},
    ),
    (
        "The cat sleeps on the warm windowsill.",
        "A kitten is napping by the sunny window.",
        {"cat", "sleeps", "kitten", "napping"},
    ),
    (
        "She is cooking pasta in the kitchen.",
        "A woman prepares spaghetti at home.",
        {"pasta", "spaghetti"},
    ),
    (
        "The children are playing football in the park.",
        "Kids play soccer on the grass.",
        {"children", "football", "kids", "soccer"},
    ),
]
FUNCTION_WORDS = {"a", "an", "the", "is", "are", "on", "in", "at", "by", ",", "."}


@pytest.mark.parametrize(("method", "ratio"), [("attnlrp", 3.0), ("generic", 2.0)])
def test_words_shared_in_meaning_outweigh_function_words(minilm, method, ratio):
    """Each side's words that the other side shares in meaning get clearly more relevance
    than any function word: `ratio` times as much at least (the maps are not flat)."""
    model, tokenizer = minilm
    explainer = Explainer(model, tokenizer=tokenizer)
    result = similarity(explainer, [p[0] for p in PAIRS], [p[1] for p in PAIRS], method=method)
    special = set(tokenizer.all_special_tokens)
    for i, (_, _, shared) in enumerate(PAIRS):
        for tokens, relevance in (
            (result.tokens_a[i], result.relevance_a[i]),
            (result.tokens_b[i], result.relevance_b[i]),
        ):
            scores = {w.text: w.relevance for w in word_relevance(tokens, relevance, special)}
            content = min(scores[w] for w in shared if w in scores)
            function = max(abs(scores[w]) for w in FUNCTION_WORDS if w in scores)
            assert content > ratio * function, (method, scores)


def test_similarity_holds_the_other_side_constant(minilm):
    """Side a's relevance is that of cos(e_a, e_b) with e_b fixed (and e_a's norm a
    constant): the same as explaining a target that uses a precomputed, constant e_b,
    less the readout row for an aggregating method."""
    model, tokenizer = minilm
    explainer = Explainer(model, tokenizer=tokenizer)
    a, b = "A man is playing a guitar.", "Someone plays music."
    fixed = explainer.explain([b], method="raw_attention").logits[0]
    for method in ("generic", "attnlrp"):
        result = similarity(explainer, a, b, method=method)
        alone = explainer.explain(
            [a], target=lambda e: text_module.aligned_cosine(e, fixed[None]), method=method
        )
        expected = alone.relevance[0]
        if method == "generic":  # r @ (M - I): the mean-pooling row r is taken out
            expected = expected - 1 / expected.shape[0]
        length = alone.relevance.shape[1]
        torch.testing.assert_close(result.relevance_a[0, :length], expected, **FLOAT32)
        assert (result.relevance_a[0, length:] == 0).all()
    torch.testing.assert_close(
        text_module.aligned_cosine(fixed[None] * 3, fixed[None]), torch.ones(1), **FLOAT32
    )


def test_similarity_needs_an_encoder():
    model = ref.tiny_text_model("bert-classifier")
    with pytest.raises(UnsupportedModelError, match="sentence encoder"):
        similarity(Explainer(model, tokenizer=object()), "a", "b")


def test_encode_refuses_non_strings():
    with pytest.raises(InputError, match="not a string"):
        text_module.encode(None, ["fine", 3])
