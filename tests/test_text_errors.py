"""Text input that is misused or degenerate gets an error that says what is wrong, and raw
texts work whatever the tokenizer's padding side (on the real MiniLM tokenizer)."""

from __future__ import annotations

import logging

import pytest
import reference_hf as ref
import torch
from tolerances import FLOAT32

from explain import Explainer, InputError, TargetError
from explain.testing import ModelState, tiny_vit


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(ref.minilm_path())


@pytest.fixture(scope="module")
def classifier(tokenizer):
    """A tiny random BERT classifier over MiniLM's vocabulary (its CLS token is read)."""
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=37,
        max_position_embeddings=64,
        num_labels=2,
    )
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return BertForSequenceClassification(config).eval()


@pytest.fixture(scope="module")
def encoder():
    from transformers import AutoModel

    return AutoModel.from_pretrained(ref.minilm_path())


@pytest.mark.parametrize("text", ["\u200b", "\x00\x01", "\xad", "\u200b \u200b"])
def test_text_that_tokenizes_to_nothing_is_refused(classifier, tokenizer, text):
    explainer = Explainer(classifier, tokenizer=tokenizer)
    with pytest.raises(InputError, match=r"text 1 .* has no token"):
        explainer.explain(["a fine film", text])


def test_raw_texts_with_a_left_padding_tokenizer(classifier, tokenizer):
    """The Explainer tokenizes raw texts itself: it pads on the right, which a CLS
    classifier needs, without touching the user's tokenizer."""
    from transformers import AutoTokenizer

    left = AutoTokenizer.from_pretrained(ref.minilm_path(), padding_side="left")
    texts = ["good", "a long and winding film that never ends"]
    batch = Explainer(classifier, tokenizer=left).explain(texts)
    assert left.padding_side == "left"
    right = Explainer(classifier, tokenizer=tokenizer).explain(texts)
    torch.testing.assert_close(batch.relevance, right.relevance, **FLOAT32)  # other padding
    assert batch.tokens == right.tokens
    alone = Explainer(classifier, tokenizer=left).explain(texts[:1])
    length = alone.relevance.shape[1]
    torch.testing.assert_close(batch.relevance[0, :length], alone.relevance[0], **FLOAT32)
    assert (batch.relevance[0, length:] == 0).all()


def test_a_non_string_in_a_list_of_texts_is_named(classifier, tokenizer):
    with pytest.raises(InputError, match=r"text 1 is a int \(3\), not a string"):
        Explainer(classifier, tokenizer=tokenizer).explain(["good", 3])
    with pytest.raises(InputError, match=r"text 0 is a int \(3\), not a string"):
        Explainer(classifier, tokenizer=tokenizer).explain([3, "good"])


def test_an_empty_list_is_an_empty_batch(classifier, tokenizer):
    with pytest.raises(InputError, match="empty"):
        Explainer(classifier, tokenizer=tokenizer).explain([])
    with pytest.raises(InputError, match="the batch is empty: pass at least one text"):
        Explainer(classifier).explain([])
    with pytest.raises(InputError, match="the batch is empty: pass at least one image"):
        Explainer(tiny_vit()).explain([])


def test_token_type_ids_out_of_range_are_refused(classifier, tokenizer):
    inputs = dict(tokenizer(["good film"], return_tensors="pt"))
    inputs["token_type_ids"] = torch.full_like(inputs["input_ids"], 7)
    before = ModelState.capture(classifier)
    with pytest.raises(InputError, match=r"token type id 7 is outside .* \(0\.\.1\)"):
        Explainer(classifier).explain(inputs)
    inputs["token_type_ids"][0, 0] = -1
    with pytest.raises(InputError, match="token type id -1"):
        Explainer(classifier).explain(inputs)
    assert before.differences(ModelState.capture(classifier)) == []


def test_an_over_long_text_logs_no_warning_before_the_error(classifier, tokenizer, caplog):
    with caplog.at_level(logging.WARNING), pytest.raises(InputError, match="too long"):
        Explainer(classifier, tokenizer=tokenizer).explain(" ".join(["word"] * 600))
    assert caplog.records == []


def test_a_sentence_encoder_needs_a_score_not_a_class(encoder, tokenizer):
    explainer = Explainer(encoder, tokenizer=tokenizer)
    with pytest.raises(TargetError, match=r"sentence encoder.*explain\.text\.similarity"):
        explainer.explain("a man plays guitar")
    with pytest.raises(TargetError, match="sentence encoder"):
        explainer.trace("a man plays guitar")
    direction = torch.randn(encoder.config.hidden_size, generator=torch.Generator().manual_seed(0))
    found = explainer.explain("a man plays guitar", target=lambda e: e @ direction)
    assert found.relevance.shape == (1, 6)
    assert int(found.target[0]) == -1


def test_an_image_model_without_classifier_needs_a_score():
    model = tiny_vit(num_classes=0)
    images = torch.randn(2, 3, 32, 32)
    with pytest.raises(TargetError, match=r"no classifier \(num_classes=0\)"):
        Explainer(model).explain(images)
    with pytest.raises(TargetError, match="no classifier"):
        Explainer(model).explain(images, method="lrp")
    found = Explainer(model).explain(images, target=lambda features: features[:, 0])
    assert found.relevance.shape == (2, 4, 4)
    feature = Explainer(model).explain(images, target=0)  # explicit: feature 0
    torch.testing.assert_close(feature.relevance, found.relevance)
    Explainer(model).explain(images, method="rollout")  # class-agnostic: no target needed


def test_clip_tokenizes_raw_texts_with_the_explainers_tokenizer():
    from explain.loading.specs import load_model

    loaded = load_model("zoo:shapes-clip")
    images = torch.randn(2, 3, *loaded.image_size, generator=torch.Generator().manual_seed(0))
    texts = ["a circle", "a star and a square"]
    explainer = Explainer(loaded.model, tokenizer=loaded.tokenizer)
    raw = explainer.explain({"pixel_values": images, "text": texts})
    ids = loaded.tokenizer(texts, padding=True, return_tensors="pt")
    tokenized = explainer.explain({"pixel_values": images, **ids})
    # the same ids from the same tokenizer: the same computation
    torch.testing.assert_close(raw.relevances["text"], tokenized.relevances["text"], rtol=0, atol=0)
    torch.testing.assert_close(raw.relevance, tokenized.relevance, rtol=0, atol=0)
    with pytest.raises(InputError, match=r"got raw texts: give the Explainer the model's tok"):
        Explainer(loaded.model).explain({"pixel_values": images, "input_ids": texts})


def test_a_text_with_a_lone_surrogate_is_one_clear_error(tokenizer, classifier, capsys, tmp_path):
    # Issue 46: invalid UTF-8 on the command line (a lone surrogate in Python) reached the
    # fast tokenizer's TypeError from explain text, explain cite and the viewer.
    from explain.cli import main
    from explain.inputs import encode

    with pytest.raises(InputError, match="text 0 is not valid Unicode: character 2 is a lone"):
        encode(tokenizer, ["a \udcff b"])
    assert main(["text", "a \udcff b", "--model", "zoo:minilm-sentiment"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "lone surrogate" in err[0] and err[0].startswith("explain: error:")
    context = tmp_path / "context.txt"
    context.write_text("One. Two.")
    argv = ["cite", "--model", "zoo:recall-llama", "--context", str(context)]
    assert main([*argv, "--question", "q \udcff", "--answer", "x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "prompt (context, question or template) is not valid" in err[0]
    assert main([*argv, "--question", "q", "--answer", "x \udcff"]) == 2
    assert "the answer is not valid Unicode" in capsys.readouterr().err
