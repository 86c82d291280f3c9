"""`--method` on every command: comma-separated names or `all` (every method the model
takes, nothing it cannot), read by one function (explain.cli.methods); a method the model
cannot take is refused naming only those it takes, before any file is written."""

from __future__ import annotations

import argparse

import numpy as np
import pytest
from PIL import Image
from test_detr import tiny_detr
from test_seq2seq import save_tiny_bart

from explain.architectures.registry import adapter_for
from explain.cli import build_parser, main
from explain.cli.method_options import method_file, methods_the_model_takes, parse_methods
from explain.engine import Request, refusals, supported_methods
from explain.errors import OptionError, UnknownMethodError, UnsupportedModelError
from explain.rules import METHODS
from explain.testing import tiny_lm
from explain.testing.tiny_vlm import save_tiny_llava

LM_METHODS = supported_methods(
    adapter_for(tiny_lm.tiny_causal_lm("llama")), Request(prompt_length=1)
)
"""What a language model takes in a generation (an independent call of the engine)."""


def _run(capsys, *argv):
    status = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return tiny_lm.save_tiny_lm(tmp_path_factory.mktemp("tiny-llama"), "llama")


@pytest.fixture(scope="module")
def photo(tmp_path_factory):
    path = tmp_path_factory.mktemp("photo") / "photo.png"
    pixels = (np.random.default_rng(0).random((40, 60, 3)) * 255).astype(np.uint8)
    Image.fromarray(pixels).save(path)
    return path


def test_every_command_that_explains_takes_method_lists_and_all():
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    taking = {
        name for name, sub in commands.choices.items() if "--method" in sub._option_string_actions
    }
    assert taking == {"cite", "clip", "detect", "evaluate", "generate", "image", "seq2seq", "text"}
    for name in taking:
        option = commands.choices[name]._option_string_actions["--method"]
        assert option.metavar == "M[,M2]" and "`all`" in option.help, name


def test_parse_methods_reads_lists_and_all_and_refuses_what_it_cannot_read():
    assert parse_methods("attnlrp, generic,attnlrp") == ["attnlrp", "generic"]
    assert parse_methods(" all ") == sorted(METHODS)
    with pytest.raises(OptionError, match="empty entry in --method"):
        parse_methods("generic,")
    with pytest.raises(UnknownMethodError, match="did you mean generic"):
        parse_methods("generic,generc")


def test_method_files_are_named_from_the_arguments_alone(tmp_path):
    page = tmp_path / "cite.html"
    assert method_file(page, "attnlrp", "attnlrp") == page
    assert method_file(page, "attnlrp", "attnlrp,generic") == tmp_path / "cite_attnlrp.html"
    assert method_file(page, "generic", "all") == tmp_path / "cite_generic.html"


def test_all_is_what_the_model_takes_and_a_refusal_names_only_that(capsys):
    adapter = adapter_for(tiny_lm.tiny_causal_lm("llama"))
    refused = refusals(adapter, Request(prompt_length=1))
    assert {"lrp", "partial_lrp", "transformer_attribution"} <= set(refused)
    assert methods_the_model_takes("all", adapter, "lm", generation=True) == LM_METHODS
    note = capsys.readouterr().err
    assert "--method all: lm does not take lrp, partial_lrp, transformer_attribution" in note
    with pytest.raises(UnsupportedModelError) as error:
        methods_the_model_takes("generic,lrp", adapter, "lm", generation=True)
    message = str(error.value)
    assert message.startswith("lm does not take lrp (") and "\n" not in message
    assert message.endswith(f"; it takes {', '.join(LM_METHODS)}")


def test_generate_all_explains_one_continuation_with_every_method_it_takes(llama, tmp_path, capsys):
    out = tmp_path / "out"
    status, printed, err = _run(
        capsys, "generate", "w1 w2 w3", "--model", llama, "--max-new-tokens", "2",
        "--method", "all", "--out", out,
    )  # fmt: skip
    assert status == 0, err
    assert printed.count("continuation:") == 1
    assert [line[1:-1] for line in printed.splitlines() if line.startswith("[")] == LM_METHODS
    expected = {f"generation_{m}.{suffix}" for m in LM_METHODS for suffix in ("html", "png")}
    assert {path.name for path in out.iterdir()} == expected
    assert "does not take lrp, partial_lrp, transformer_attribution" in err


def test_generate_refuses_a_listed_method_it_cannot_take_before_writing(llama, tmp_path, capsys):
    out = tmp_path / "out"
    status, _, err = _run(
        capsys, "generate", "w1 w2", "--model", llama, "--method", "generic,lrp", "--out", out
    )
    assert status == 2 and "does not take lrp" in err
    taken = err.rsplit("; it takes ", 1)[1].strip().split(", ")
    assert taken == LM_METHODS and "transformer_attribution" not in taken
    assert not out.exists()


def test_cite_takes_a_method_list(llama, tmp_path, capsys):
    context = tmp_path / "context.txt"
    context.write_text("w1 w2. w3 w4. w5 w6.")
    out = tmp_path / "out"
    status, printed, err = _run(
        capsys, "cite", "--model", llama, "--context", context, "--question", "w7",
        "--answer", "w8", "--method", "generic,attnlrp", "--out", out,
    )  # fmt: skip
    assert status == 0, err
    assert "[generic]" in printed and "[attnlrp]" in printed
    assert {path.name for path in out.iterdir()} == {
        f"cite_{m}.{suffix}" for m in ("generic", "attnlrp") for suffix in ("html", "png", "json")
    }


def test_cite_all_with_a_foil_runs_the_methods_that_contrast(llama, tmp_path, capsys):
    context = tmp_path / "context.txt"
    context.write_text("w1 w2. w3 w4.")
    out = tmp_path / "out"
    status, _, err = _run(
        capsys, "cite", "--model", llama, "--context", context, "--question", "w7",
        "--answer", "w8", "--foil", "w9", "--method", "all", "--out", out,
    )  # fmt: skip
    assert status == 0, err
    linear = [m for m in LM_METHODS if METHODS[m].linear_in_score]
    assert linear and {path.name for path in out.glob("*.json")} == {
        f"cite_{m}.json" for m in linear
    }
    assert "with --foil: " in err and "generic" in err.split("with --foil: ")[1]


def test_generate_image_takes_a_method_list(tmp_path, photo, capsys):
    folder = save_tiny_llava(tmp_path / "llava")
    out = tmp_path / "out"
    status, printed, err = _run(
        capsys, "generate", "--image", photo, "What is it?", "--model", folder,
        "--max-new-tokens", "2", "--method", "generic,raw_attention", "--out", out,
    )  # fmt: skip
    assert status == 0, err
    assert printed.count("answer:") == 1 and "[raw_attention]" in printed
    assert {path.name for path in out.iterdir()} == {
        f"generation_{m}.{suffix}"
        for m in ("generic", "raw_attention")
        for suffix in ("html", "png")
    }


def test_clip_all_runs_every_method_both_towers_take(photo, tmp_path, capsys):
    out = tmp_path / "out"
    status, _, err = _run(
        capsys, "clip", photo, "--text", "a circle", "--model", "zoo:shapes-clip",
        "--method", "all", "--out", out,
    )  # fmt: skip
    assert status == 0, err
    from explain.loading import load_model

    taken = supported_methods(adapter_for(load_model("zoo:shapes-clip").model))
    assert {path.name for path in out.iterdir()} == {f"photo_clip_{m}.png" for m in taken}
    assert "lrp" in err.split("does not take ")[1]


def test_seq2seq_and_detect_take_all(photo, tmp_path, capsys):
    bart = save_tiny_bart(tmp_path / "bart")
    status, _, err = _run(
        capsys, "seq2seq", "the cat", "--model", bart, "--target", "a dog", "--method", "all",
        "--out", tmp_path / "seq2seq",
    )  # fmt: skip
    assert status == 0, err
    names = {path.name for path in (tmp_path / "seq2seq").iterdir()}
    assert names == {"seq2seq_matrix_generic.png", "seq2seq_source_generic.png"}
    from transformers import DetrImageProcessor

    detr = tmp_path / "detr"
    tiny_detr().save_pretrained(detr)
    DetrImageProcessor(size={"shortest_edge": 64, "longest_edge": 96}).save_pretrained(detr)
    status, _, err = _run(
        capsys, "detect", photo, "--model", detr, "--threshold", "0", "--method", "all",
        "--out", tmp_path / "detect",
    )  # fmt: skip
    assert status == 0, err
    assert {path.name for path in (tmp_path / "detect").iterdir()} == {"photo_grid_generic.png"}
    status, _, err = _run(capsys, "detect", photo, "--model", detr, "--method", "rollout")
    assert status == 2 and err.strip().endswith("; it takes generic")


def test_evaluate_all_scores_only_what_the_model_takes(tmp_path, capsys):
    import json

    output = tmp_path / "recall.json"
    status, _, err = _run(
        capsys, "evaluate", "language-evidence", "--model", "zoo:recall-llama", "--length", "96",
        "--limit", "1", "--method", "all", "--output", output, "--quiet",
    )  # fmt: skip
    assert status == 0, err
    assert list(json.loads(output.read_text())["results"]) == LM_METHODS
    status, _, err = _run(
        capsys, "evaluate", "language-evidence", "--model", "zoo:recall-llama", "--method",
        "generic,lrp", "--output", tmp_path / "refused.json",
    )  # fmt: skip
    assert status == 2 and err.strip().endswith(f"; it takes {', '.join(LM_METHODS)}")
    assert not (tmp_path / "refused.json").exists()


def test_methods_given_apart_are_shown_comma_separated(capsys):
    with pytest.raises(SystemExit) as exited:  # argparse's own usage error
        main(["evaluate", "language-evidence", "--model", "x", "--methods", "generic", "attnlrp",
              "random", "--output", "x.json"])  # fmt: skip
    assert exited.value.code == 2
    assert "comma-separated: --method generic,attnlrp,random" in capsys.readouterr().err
