"""`explain text`: prints highlighted tokens, writes escaped HTML, refuses bad requests."""

from __future__ import annotations

import pytest
import reference_hf as ref
import torch

from explain.cli import main


@pytest.fixture(scope="module")
def classifier_folder(tmp_path_factory):
    """A tiny random BERT sentiment classifier saved with MiniLM's tokenizer, loaded the
    way a user's fine-tuned checkpoint folder would be."""
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    tokenizer = AutoTokenizer.from_pretrained(ref.minilm_path())
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=37,
        max_position_embeddings=64,
        id2label={0: "negative", 1: "positive"},
        label2id={"negative": 0, "positive": 1},
    )
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = BertForSequenceClassification(config)
    folder = tmp_path_factory.mktemp("classifier")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_classifier_prints_and_writes_escaped_html(classifier_folder, tmp_path, capsys):
    page = tmp_path / "out" / "text.html"
    status = main(
        [
            "text",
            "A <script>alert(1)</script> film.",
            "Fine.",
            "--model",
            str(classifier_folder),
            "--target",
            "positive",
            "--words",
            "--color",
            "never",
            "--html",
            str(page),
        ]
    )
    assert status == 0
    printed = capsys.readouterr().out
    assert printed.count("positive (p = ") == 2
    assert "film(" in printed and "[CLS]" not in printed
    html = page.read_text()
    assert "<script>" not in html and "&lt;" in html
    assert not list(page.parent.glob("*.partial"))


def test_colour_output(classifier_folder, tmp_path, capsys):
    args = ["text", "Good.", "--model", str(classifier_folder), "--color", "always"]
    assert main([*args, "--html", str(tmp_path / "a.html")]) == 0
    assert "\x1b[48;2;" in capsys.readouterr().out


def test_encoder_explains_similarity_with_the_pair(tmp_path, capsys):
    args = ["text", "A man plays guitar.", "--model", str(ref.minilm_path())]
    status = main([*args, "--pair", "Music on stage.", "--html", str(tmp_path / "s.html")])
    assert status == 0
    assert "similarity with the pair" in capsys.readouterr().out
    assert main([*args, "--html", str(tmp_path / "t.html")]) == 2
    assert "--pair" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "message"),
    [(["--pair", "x"], "--pair TEXT is for sentence encoders"), (["--target", "joy"], "joy")],
)
def test_bad_requests(classifier_folder, tmp_path, capsys, extra, message):
    page = tmp_path / "never.html"
    args = ["text", "Fine.", "--model", str(classifier_folder), "--html", str(page), *extra]
    assert main(args) == 2
    assert message in capsys.readouterr().err
    assert not page.exists()


def test_empty_text_is_an_error(classifier_folder, tmp_path, capsys):
    args = ["text", "  ", "--model", str(classifier_folder), "--html", str(tmp_path / "e.html")]
    assert main(args) == 2
    assert "empty" in capsys.readouterr().err


def test_nothing_is_written_unasked(classifier_folder, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["text", "Fine.", "--model", str(classifier_folder), "--color", "never"]) == 0
    assert list(tmp_path.iterdir()) == []  # no explain_text.html, no explanations/
    captured = capsys.readouterr()
    assert "fine(" in captured.out
    assert "Loading weights" not in captured.err  # no progress bar on every load


@pytest.mark.parametrize("fmt", ["json", "safetensors"])
def test_save_writes_the_raw_relevance(classifier_folder, tmp_path, capsys, fmt):
    from transformers import AutoTokenizer, BertForSequenceClassification

    from explain import Explainer, Explanation

    texts = ["A warm film.", "Not good at all."]
    args = ["text", *texts, "--model", str(classifier_folder), "--target", "1"]
    assert main([*args, "--save", fmt, "--out", str(tmp_path)]) == 0
    saved = Explanation.load(tmp_path / f"text.{fmt}")
    assert str(tmp_path / f"text.{fmt}") in capsys.readouterr().out.split()
    model = BertForSequenceClassification.from_pretrained(classifier_folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(classifier_folder)
    direct = Explainer(model, tokenizer=tokenizer).explain(texts, target=1)
    torch.testing.assert_close(saved.relevance, direct.relevance)
    assert saved.tokens == direct.tokens and saved.target.tolist() == [1, 1]
    assert saved.settings == {"model": str(classifier_folder), "texts": texts}


def test_encoder_save_keeps_both_sides(tmp_path, capsys):
    from explain import Explanation

    args = ["text", "A man plays guitar.", "--model", str(ref.minilm_path())]
    assert main([*args, "--pair", "Music on stage.", "--save", "npz", "--out", str(tmp_path)]) == 0
    saved = Explanation.load(tmp_path / "text.npz")
    assert set(saved.relevances) == {"text", "pair"} and saved.score == "cosine_similarity"
    assert saved.settings["pair"] == "Music on stage." and saved.logits.shape == (1, 1)
    assert saved.settings["pair_tokens"][0][0] == "[CLS]"
