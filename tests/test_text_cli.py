"""`explain text`: prints highlighted tokens, writes escaped HTML, refuses bad requests."""

from __future__ import annotations

import re

import pytest
import reference_hf as ref
import torch
from tolerances import FLOAT32

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


@pytest.fixture
def escaping_folder(classifier_folder, tmp_path):
    """The classifier, its class names holding terminal escape sequences."""
    import json
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(classifier_folder, folder)
    config = json.loads((folder / "config.json").read_text())
    config["id2label"] = {"0": "neg\x1b]0;pwned\x07", "1": "pos\x1b[2J\u202e"}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("color", ["never", "always"])
def test_terminal_control_characters_in_class_names_are_shown_not_obeyed(
    escaping_folder, capsys, color
):
    for target in ("0", "1"):
        argv = ["text", "Fine.", "--model", str(escaping_folder), "--target", target]
        assert main([*argv, "--color", color]) == 0
        printed = capsys.readouterr().out
        assert "\x07" not in printed and "\u202e" not in printed
        assert "\x1b]" not in printed and "\x1b[2J" not in printed
        assert "neg\\x1b]0;pwned\\x07" in printed or "pos\\x1b[2J\\u202e" in printed


def test_error_lines_show_control_characters_in_user_text(escaping_folder, capsys):
    argv = ["text", "Fine.", "--model", str(escaping_folder), "--target", "neutral"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "the classes are neg\\x1b]0;pwned\\x07" in err  # listed, escaped
    assert "\x1b" not in err and "\x07" not in err and err.count("\n") == 1


def test_printable_escapes_every_control_character():
    from explain.viz.text import printable

    assert printable("a\x1b[31mb\tc\u202ed é") == "a\\x1b[31mb\\tc\\u202ed é"


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
    [
        (["--pair", "x"], "--pair TEXT is for sentence encoders"),
        (["--target", "joy"], "joy"),
        (["--target", "²"], "neither a class index nor a class name"),
    ],
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


def _text(classifier_folder, tmp_path, *argv):
    page = tmp_path / "page.html"
    return ["text", *argv, "--model", str(classifier_folder), "--html", str(page)], page


def _messages(err: str) -> list[str]:
    """explain's own stderr lines (the model loader's progress bar left out)."""
    return [line for line in err.splitlines() if line.startswith("explain: ")]


@pytest.mark.parametrize("text", ["\u200b", "\x00\x01", "\xad"])
def test_text_that_tokenizes_to_nothing_is_an_error(classifier_folder, tmp_path, capsys, text):
    argv, page = _text(classifier_folder, tmp_path, text)
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert _messages(err) == [err.splitlines()[-1]] and "has no token" in err
    assert not page.exists()


def test_an_over_long_text_is_one_error_line(classifier_folder, tmp_path, capsys):
    argv, _ = _text(classifier_folder, tmp_path, " ".join(["word"] * 100))
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Token indices sequence length" not in err
    assert err.splitlines()[-1].startswith("explain: error: the text is too long")


def test_a_fixed_block_method_ignores_the_start_layer_with_a_note(
    classifier_folder, tmp_path, capsys
):
    argv, _ = _text(classifier_folder, tmp_path, "Fine.", "--color", "never")
    assert main([*argv, "--method", "raw_attention,generic", "--start-layer", "1"]) == 0
    out, err = capsys.readouterr()
    assert _messages(err) == [
        "explain: note: raw_attention reads one fixed block; --start-layer is ignored for it"
    ]
    assert "[raw_attention]" in out and "[generic]" in out


def test_the_score_goes_only_to_the_methods_that_differentiate_one(
    classifier_folder, tmp_path, capsys
):
    argv, _ = _text(classifier_folder, tmp_path, "Fine.", "--color", "never")
    assert main([*argv, "--method", "rollout,generic", "--score", "probability"]) == 0
    out, err = capsys.readouterr()
    assert _messages(err) == [
        "explain: note: rollout differentiates no score; --score is ignored for it"
    ]
    assert main([*argv, "--method", "rollout,generic"]) == 0
    rollout, generic = out.split("[generic]")
    by_logit = capsys.readouterr().out.split("[generic]")
    # rollout is the same map; generic got the probability, whose gradients differ.
    assert rollout == by_logit[0] and generic != by_logit[1]


@pytest.mark.parametrize("extra", [["--score", "logit"], ["--target", "0"]])
def test_the_pair_takes_no_target_or_score(tmp_path, capsys, extra):
    args = ["text", "A man plays guitar.", "--model", str(ref.minilm_path())]
    assert main([*args, "--pair", "Music.", "--html", str(tmp_path / "s.html"), *extra]) == 2
    assert "it takes no --target or --score" in capsys.readouterr().err


def test_all_methods(classifier_folder, tmp_path, capsys):
    from explain import METHODS

    argv, page = _text(classifier_folder, tmp_path, "Fine.", "--color", "never")
    assert main([*argv, "--method", "all"]) == 0
    out = capsys.readouterr().out
    assert all(f"[{method}]" in out for method in METHODS)
    titles = [line for line in out.splitlines() if "(p = " in line]
    assert titles and not any(t.startswith(tuple(METHODS)) for t in titles)  # named once
    html = page.read_text()
    assert html.count("<h3>") == len(METHODS)
    assert all(f"<h2>{method}</h2>" in html for method in METHODS)
    assert f"<h2>explain text: {classifier_folder}, {', '.join(sorted(METHODS))}</h2>" in html


def _printed_values(out: str) -> list[float]:
    line = next(line for line in out.splitlines() if line.startswith("  "))
    return [float(piece.rsplit("(", 1)[1].rstrip(")")) for piece in line.split()]


def test_full_lrp_values_are_normalised_and_say_why(classifier_folder, tmp_path, capsys):
    argv, page = _text(classifier_folder, tmp_path, "A warm , funny film .", "--color", "never")
    assert main([*argv, "--method", "lrp"]) == 0
    out = capsys.readouterr().out
    assert "note: lrp: full LRP with the original rules" in out
    assert "does not conserve relevance" in out and "largest magnitude" in out
    shown = _printed_values(out)
    assert max(abs(v) for v in shown) <= 1.0
    html = page.read_text()
    assert "<b>Note:</b> lrp: full LRP" in html and "does not conserve relevance" in html
    assert main([*argv, "--method", "lrp", "--raw-values"]) == 0
    out = capsys.readouterr().out
    assert "values shown as computed" in out
    raw = _printed_values(out)
    ratio = raw[0] / shown[0]
    assert ratio != pytest.approx(1.0)  # the scale is gone, the ratios stay
    assert [v / ratio for v in raw] == pytest.approx(shown, rel=2e-3, abs=2e-3)


def test_explanation_html_of_full_lrp_is_normalised_with_a_note(classifier_folder):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from explain import Explainer

    model = AutoModelForSequenceClassification.from_pretrained(classifier_folder)
    tokenizer = AutoTokenizer.from_pretrained(classifier_folder)
    result = Explainer(model, tokenizer=tokenizer).explain("a warm film", method="lrp")
    html = result.to_html()
    assert "<b>Note:</b> lrp: full LRP" in html
    largest = float(result.relevance.abs().max())
    shown = [float(t.split('"')[0]) for t in html.split('title="')[1:]]
    assert max(abs(v) for v in shown) == pytest.approx(1.0, abs=1e-3)
    assert largest != pytest.approx(1.0)
    assert "Note:" not in Explainer(model, tokenizer=tokenizer).explain("a film").to_html()


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
    saved = Explanation.load(tmp_path / f"text_generic.{fmt}")
    assert str(tmp_path / f"text_generic.{fmt}") in capsys.readouterr().out.split()
    model = BertForSequenceClassification.from_pretrained(classifier_folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(classifier_folder)
    direct = Explainer(model, tokenizer=tokenizer).explain(texts, target=1)
    torch.testing.assert_close(saved.relevance, direct.relevance, **FLOAT32)
    assert saved.tokens == direct.tokens and saved.target.tolist() == [1, 1]
    # The engine's settings (the attention path taken, the memory budget) travel along.
    assert saved.settings == {"model": str(classifier_folder), "texts": texts, **direct.settings}
    assert saved.settings["attention_path"] == "explicit"


def test_encoder_save_keeps_both_sides(tmp_path, capsys):
    from explain import Explanation

    args = ["text", "A man plays guitar.", "--model", str(ref.minilm_path())]
    assert main([*args, "--pair", "Music on stage.", "--save", "npz", "--out", str(tmp_path)]) == 0
    saved = Explanation.load(tmp_path / "text_generic.npz")
    assert set(saved.relevances) == {"text", "pair"} and saved.score == "cosine_similarity"
    assert saved.settings["pair"] == "Music on stage." and saved.logits.shape == (1, 1)
    assert saved.settings["pair_tokens"][0][0] == "[CLS]"


def test_all_methods_runs_every_method_a_language_model_takes(tmp_path, capsys):
    from explain.testing.tiny_lm import save_tiny_lm

    folder = save_tiny_lm(tmp_path / "tiny-llama")
    assert main(["text", "w12 w13", "--model", str(folder), "--method", "all"]) == 0
    captured = capsys.readouterr()
    ran = [line[1:-1] for line in captured.out.splitlines() if line.startswith("[")]
    assert ran == [
        "attention_gradcam", "attnlrp", "cp_lrp", "generic", "gradient_x_input",
        "integrated_gradients", "occlusion", "random", "raw_attention", "rollout",
        "smoothgrad",
    ]  # fmt: skip
    assert "does not take lrp, partial_lrp, transformer_attribution (the LRP methods" in (
        captured.err
    )


def test_words_carry_a_sign_only_on_signed_maps(classifier_folder, tmp_path, capsys):
    argv = ["text", "A warm , funny film .", "--model", str(classifier_folder), "--words"]
    argv += ["--color", "never", "--out", str(tmp_path)]
    assert main([*argv, "--method", "generic"]) == 0
    unsigned = capsys.readouterr().out.splitlines()[1]
    assert "(+" not in unsigned and re.search(r"film\(\d", unsigned)
    assert main([*argv, "--method", "attnlrp"]) == 0
    signed = capsys.readouterr().out
    values = [float(v) for v in re.findall(r"\(([-+][^)]*)\)", signed)]
    assert values and any(v < 0 for v in values)  # a signed map keeps its signs


def test_a_language_model_reads_out_at_its_last_token_as_explain_generate_draws_it(
    tmp_path, capsys
):
    """`explain text` on a language model: the text's last token (where the next token
    is read out) is off the scale in the terminal and on the page, and the line naming
    what the prediction rests on is `explain generate`'s for its first token (same
    ranking, positions and values), on the page too."""
    import ast
    import html

    from explain.cli.text import READOUT_NOTE
    from explain.testing.tiny_lm import save_tiny_lm

    folder = save_tiny_lm(tmp_path / "tiny-llama")
    page = tmp_path / "text.html"
    argv = ["text", "w10 w11 w12 w13", "--model", str(folder), "--color", "never"]
    assert main([*argv, "--html", str(page)]) == 0  # the default: cp_lrp, signed
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == f"note: {READOUT_NOTE}"
    assert printed[2].endswith(" w13(read out here, off the scale)")
    assert printed[3].startswith("  rests most on: ")
    rests = printed[3].removeprefix("  rests most on: ")
    written = page.read_text()
    assert (
        html.unescape(re.search(r'<p class="rests">rests most on: (.*?)</p>', written)[1]) == rests
    )
    assert re.search(
        r'<span class="tok readout" title="[^"]*off the scale\)"[^>]*>w13</span>', written
    )
    # the scale leaves the readout token out: the first-ranked token is at full colour
    first = ast.literal_eval(rests.split("@")[0])
    full = (
        "rgb(33, 102, 172)"
        if rests.split(",")[0].split()[-1].startswith("-")
        else "rgb(178, 24, 43)"
    )
    assert re.search(
        rf'<span class="tok[^"]*" style="background-color: {re.escape(full)};[^>]*>{first}</span>',
        written,
    )
    assert (
        main(["generate", "w10 w11 w12 w13", "--model", str(folder), "--max-new-tokens", "1"]) == 0
    )
    (line,) = [s for s in capsys.readouterr().out.splitlines() if " <- " in s]
    next_token, generated_rests = line.split(" <- ")
    assert printed[1].startswith(f"{next_token.strip()} (p = ")  # the same next token
    assert generated_rests == rests and "-" in rests  # evidence against is named, signed


def test_an_unknown_token_is_shown_as_the_model_read_it(classifier_folder, tmp_path, capsys):
    # MiniLM's vocabulary has no emoji: it becomes [UNK], which the model reads and which
    # has relevance, so the views show it where [CLS], [SEP] and padding are left out
    page = tmp_path / "text.html"
    arguments = ["text", "a great 🙂 film", "ok", "--model", str(classifier_folder)]
    assert main([*arguments, "--color", "never", "--html", str(page)]) == 0
    printed = capsys.readouterr().out
    assert re.search(r"great\(\S+\) \[UNK\]\(\S+\) film\(", printed)
    assert "[CLS]" not in printed and "[SEP]" not in printed and "[PAD]" not in printed
    shown = page.read_text()
    assert "[UNK]" in shown and "[CLS]" not in shown and "[PAD]" not in shown


def test_the_unknown_token_is_skipped_only_where_it_has_another_role():
    from types import SimpleNamespace

    from explain.inputs import skipped_tokens

    bert = SimpleNamespace(all_special_tokens=["[UNK]", "[SEP]", "[PAD]", "[CLS]", "[MASK]"],
                           unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]",
                           pad_token="[PAD]", mask_token="[MASK]")  # fmt: skip
    assert skipped_tokens(bert) == {"[SEP]", "[PAD]", "[CLS]", "[MASK]"}
    clip = SimpleNamespace(all_special_tokens=["<|startoftext|>", "<|endoftext|>"],
                           unk_token="<|endoftext|>", bos_token="<|startoftext|>",
                           eos_token="<|endoftext|>", pad_token="<|endoftext|>")  # fmt: skip
    assert skipped_tokens(clip) == {"<|startoftext|>", "<|endoftext|>"}
