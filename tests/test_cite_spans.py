"""Spans of a context: the splitter's rules, spans that cover the context exactly, offsets
that round-trip, and the token each span owns in the prompt (offset mapping, and the
piece-by-piece tokenization of a tokenizer without one)."""

from __future__ import annotations

import functools
import itertools

import pytest

from explain import InputError, OptionError
from explain.cite import TEMPLATE, build_prompt, read_context, split
from explain.testing.tiny_lm import tiny_tokenizer

TEXTS = {
    "abbreviations": (
        "Dr. Smith met Mrs. Jones at 5 p.m. on Jan. 3. They talked, e.g. about J. R. R. "
        "Tolkien. The U.S. team won! Did it? Yes."
    ),
    "numbers": "Pi is about 3.14 and e is 2.718. Version 1.2.3 shipped in 2024. It costs $4.50.",
    "newlines": "First line\nsecond line. Still second.\n\n  Indented paragraph.\r\nLast line",
    "non_ascii": (
        "Ça coûte 3,50 € à Zürich. Über alles! 東京は大きい。大阪も大きい！本当？ はい。"
        " «Fin.» Ελληνικά κείμενο. Конец…"
    ),
    "edges": "  leading spaces. “Quoted!” (Bracketed.) trailing spaces.   \n",
}

EXPECTED = {
    "abbreviations": [
        "Dr. Smith met Mrs. Jones at 5 p.m. on Jan. 3.",
        "They talked, e.g. about J. R. R. Tolkien.",
        "The U.S. team won!",
        "Did it?",
        "Yes.",
    ],
    "numbers": [
        "Pi is about 3.14 and e is 2.718.",
        "Version 1.2.3 shipped in 2024.",
        "It costs $4.50.",
    ],
    "newlines": ["First line", "second line.", "Still second.", "Indented paragraph.", "Last line"],
    "non_ascii": [
        "Ça coûte 3,50 € à Zürich.",
        "Über alles!",
        "東京は大きい。",
        "大阪も大きい！",
        "本当？",
        "はい。",
        "«Fin.»",
        "Ελληνικά κείμενο.",
        "Конец…",
    ],
    "edges": ["leading spaces.", "“Quoted!”", "(Bracketed.)", "trailing spaces."],
}


def _assert_covers(text, spans):
    """Consecutive, non-empty, no gap or overlap, each the text between its offsets."""
    assert spans[0].start == 0 and spans[-1].end == len(text)
    for before, after in itertools.pairwise(spans):
        assert before.end == after.start
    for span in spans:
        assert span.start < span.end
        assert text[span.start : span.end] == span.text
        assert span.text.strip(), "a span of whitespace only"
    assert "".join(span.text for span in spans) == text


@pytest.mark.parametrize("name", sorted(TEXTS))
@pytest.mark.parametrize("kind", ["sentences", "paragraphs", "lines"])
def test_spans_cover_the_text_without_gaps_or_overlaps(name, kind):
    _assert_covers(TEXTS[name], split(TEXTS[name], kind))


@pytest.mark.parametrize("name", sorted(TEXTS))
def test_sentences_follow_the_stated_rules(name):
    spans = split(TEXTS[name])
    assert [span.text.strip() for span in spans] == EXPECTED[name]
    # Each span holds the whitespace before its content, none after it (but the last).
    for span in spans[:-1]:
        assert not span.text[-1].isspace()


def test_paragraphs_end_at_blank_lines_and_lines_at_line_breaks():
    text = TEXTS["newlines"]
    assert [s.text for s in split(text, "paragraphs")] == [
        "First line\nsecond line. Still second.",
        "\n\n  Indented paragraph.\r\nLast line",
    ]
    assert [s.text for s in split(text, "lines")] == [
        "First line",
        "\nsecond line. Still second.",
        "\n\n  Indented paragraph.",
        "\r\nLast line",
    ]


def test_given_starts_are_span_starts_whatever_the_kind():
    text = "One sentence across. Two documents here"
    spans = split(text, "sentences", starts=[9])
    assert [s.text for s in spans] == ["One sente", "nce across.", " Two documents here"]
    assert [s.text for s in split(text, "documents", starts=[20])] == [
        "One sentence across.",
        " Two documents here",
    ]


def test_documents_and_chat_turns():
    documents = ["Alpha one. Alpha two.", "Beta.", "Gamma\nlines."]
    context = read_context(documents, "documents")
    assert context.text == "\n\n".join(documents)
    assert [s.text for s in context.spans] == [documents[0], "\n\nBeta.", "\n\nGamma\nlines."]
    finer = read_context(documents, "sentences")
    _assert_covers(finer.text, list(finer.spans))
    assert [s.text.strip() for s in finer.spans] == [
        "Alpha one.",
        "Alpha two.",
        "Beta.",
        "Gamma",
        "lines.",
    ]
    chat = [
        {"role": "user", "content": "w9 w10. w11"},
        {"role": "assistant", "content": "w12 w13"},
    ]
    tokenizer = tiny_tokenizer()
    turns = read_context(chat, "turns", tokenizer)
    rendered = tokenizer.apply_chat_template(chat, tokenize=False)
    assert turns.text == rendered
    first = tokenizer.apply_chat_template(chat[:1], tokenize=False)
    assert [s.start for s in turns.spans] == [0, len(first)]
    _assert_covers(turns.text, list(turns.spans))
    inside = read_context(chat, "sentences", tokenizer)
    assert len(first) in [s.start for s in inside.spans] and len(inside.spans) == 3


def test_bad_contexts_and_kinds_are_refused():
    with pytest.raises(InputError, match="empty"):
        split(" \n\t ")
    with pytest.raises(OptionError, match="spans must be one of"):
        split("text.", "words")
    with pytest.raises(OptionError, match="list of documents"):
        read_context("one text", "documents")
    with pytest.raises(OptionError, match="not a chat"):
        read_context(["a", "b"], "turns")
    with pytest.raises(InputError, match="document 1 is empty"):
        read_context(["a", " "], "sentences")
    with pytest.raises(InputError, match="a context is a text"):
        read_context(42, "sentences")
    context = read_context("w9 w10.", "sentences")
    with pytest.raises(OptionError, match="before"):
        build_prompt(tiny_tokenizer(), context, "w11", template="{question} {context}")
    with pytest.raises(OptionError, match="once each"):
        build_prompt(tiny_tokenizer(), context, "w11", template="{context}")
    with pytest.raises(InputError, match="question is empty"):
        build_prompt(tiny_tokenizer(), context, " ")


@functools.cache
def _byte_level_tokenizer():
    """A byte-level BPE tokenizer trained here on TEXTS (offline): its tokens carry their
    leading space (" The"), as GPT-2's and Llama 3's do, and it adds a start token."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<s>"],
    )
    core.train_from_iterator(list(TEXTS.values()) * 4, trainer)
    core.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", core.token_to_id("<s>"))]
    )
    return PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>")


class _WithoutOffsets:
    """A tokenizer that, like transformers' Python tokenizers, has no offset mapping."""

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer

    def __call__(self, text, **options):
        if options.get("return_offsets_mapping"):
            raise NotImplementedError("return_offset_mapping is not available")
        return self._tokenizer(text, **options)

    def build_inputs_with_special_tokens(self, ids):
        return [self._tokenizer.bos_token_id, *ids]


def _check_ownership(prompt, tokenizer):
    """Every token of the prompt belongs to the span that holds its first non-whitespace
    character (the module's rule), tokens outside the context to none, and every span's
    content has tokens."""
    encoded = tokenizer(prompt.text, return_offsets_mapping=True)
    assert encoded["input_ids"] == prompt.input_ids.tolist()
    start = prompt.offset
    for (a, b), owner in zip(encoded["offset_mapping"], prompt.token_spans.tolist(), strict=True):
        if a == b:
            assert owner == -1  # the start token the tokenizer adds
            continue
        piece = prompt.text[a:b]
        at = a + (len(piece) - len(piece.lstrip()) if piece.strip() else 0)
        spans = [
            index
            for index, span in enumerate(prompt.context.spans)
            if start + span.start <= at < start + span.end
        ]
        assert [owner] == (spans or [-1])
    assert set(prompt.token_spans.tolist()) >= set(range(len(prompt.context.spans)))


@pytest.mark.parametrize("name", sorted(TEXTS))
def test_tokens_belong_to_the_span_of_their_first_character(name):
    tokenizer = _byte_level_tokenizer()
    prompt = build_prompt(tokenizer, read_context(TEXTS[name]), "Which one?")
    context = prompt.context
    assert prompt.text[prompt.offset : prompt.offset + len(context.text)] == context.text
    assert prompt.text == TEMPLATE.replace("{context}", context.text).replace(
        "{question}", "Which one?"
    )
    _check_ownership(prompt, tokenizer)


def test_a_tokenizer_without_offsets_is_tokenized_span_by_span():
    tokenizer = _byte_level_tokenizer()
    context = read_context(TEXTS["abbreviations"])
    prompt = build_prompt(_WithoutOffsets(tokenizer), context, "Which one?")
    ids, owners = prompt.input_ids.tolist(), prompt.token_spans.tolist()
    assert ids[0] == tokenizer.bos_token_id and owners[0] == -1
    expected = tokenizer(prompt.text[: prompt.offset], add_special_tokens=False)["input_ids"]
    for index, span in enumerate(context.spans):
        piece = tokenizer(span.text, add_special_tokens=False)["input_ids"]
        expected += piece
        at = [i for i, owner in enumerate(owners) if owner == index]
        assert [ids[i] for i in at] == piece and at == list(range(at[0], at[-1] + 1))
    tail = prompt.text[prompt.offset + len(context.text) :]
    expected += tokenizer(tail, add_special_tokens=False)["input_ids"]
    assert ids[1:] == expected


def test_chat_prompts_hold_the_context_as_the_template_renders_it():
    tokenizer = tiny_tokenizer()
    chat = [{"role": "user", "content": "w9 w10. w11"}, {"role": "assistant", "content": "w12"}]
    context = read_context(chat, "turns", tokenizer)
    prompt = build_prompt(tokenizer, context, "w20 w21")
    assert prompt.offset == 0 and prompt.text.startswith(context.text)
    assert prompt.text == tokenizer.apply_chat_template(
        [*chat, {"role": "user", "content": "w20 w21"}], add_generation_prompt=True, tokenize=False
    )
    _check_ownership(prompt, tokenizer)
    plain = build_prompt(tokenizer, read_context("w9 w10. w11"), "w20", chat=True)
    assert plain.text.startswith("<s> user w9 w10. w11")
    assert plain.text[plain.offset : plain.offset + 11] == "w9 w10. w11"
    _check_ownership(plain, tokenizer)
