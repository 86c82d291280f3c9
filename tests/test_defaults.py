"""The default method of each kind of model (explain.defaults): what each kind
resolves to, the fallback rule, and that a call naming no method runs it while an explicit
method still wins."""

from __future__ import annotations

import argparse
import functools
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from explain import Explainer
from explain.architectures.custom import CustomTransformer
from explain.architectures.hf_causal_lm import HFCausalLM
from explain.architectures.registry import adapter_classes
from explain.cite import cite, explain_contrast
from explain.cli import build_parser, main
from explain.cli.method_options import DEFAULT_HELP
from explain.defaults import DEFAULTS, FALLBACK_METHOD, default_method
from explain.engine import Request, refusals, supported_methods
from explain.generation import explain_generation
from explain.rules import METHODS
from explain.testing import TINY_MODELS, tiny_case, tiny_lm

VISION_LANGUAGE = {
    "hf_llava",
    "hf_paligemma",
    "hf_gemma3",
    "hf_qwen2_vl",
    "hf_qwen2_5_vl",
    "hf_idefics3",
    "hf_smolvlm",
}
"""The tiny models of the vision-language families."""


def _expected(name: str) -> str:
    """The default each tiny model's family should get, written out here as docs/methods.md
    states it: CP-LRP for decoder-only language models, AttnLRP for vision-language
    models, generic for every other kind."""
    if name.startswith("hf_causal_lm"):
        return "cp_lrp"
    return "attnlrp" if name in VISION_LANGUAGE else "generic"


@functools.cache
def _case(name: str):
    return tiny_case(name)


def test_every_row_names_a_registered_method() -> None:
    assert {row.method for row in DEFAULTS} <= set(METHODS)
    assert FALLBACK_METHOD in METHODS
    assert len({row.kind for row in DEFAULTS}) == len(DEFAULTS)


@pytest.mark.parametrize("request_kind", [None, Request(prompt_length=1)], ids=["call", "gen"])
def test_every_family_resolves_to_a_method_it_takes(request_kind) -> None:
    """Every family, in plain calls and generations, gets a method it takes, and takes the
    fallback (so the fallback rule never leaves a model without a default)."""
    for adapter in [*adapter_classes(), CustomTransformer]:
        taken = supported_methods(adapter, request_kind)
        assert FALLBACK_METHOD in taken, adapter.family
        assert default_method(adapter, request_kind).method in taken, adapter.family


@pytest.mark.parametrize("name", sorted(TINY_MODELS))
def test_each_kind_resolves_to_its_measured_default(name: str) -> None:
    case = _case(name)
    explainer = Explainer(case.model, spec=case.spec)
    chosen = explainer.default_method
    assert chosen.method == _expected(name)
    assert chosen.why and "\n" not in chosen.why  # one line, shown by `explain methods`


def test_text_and_image_one_stack_models_are_told_apart() -> None:
    text = Explainer(_case("hf_text_encoder").model).default_method
    image = Explainer(_case("timm_vit").model).default_method
    assert text.kind.startswith("text encoder")
    assert image.kind.startswith("image classifier")
    assert "minilm-sentiment" in text.why and "shapes-vit" in image.why


def test_each_measured_kind_is_stated_by_its_zoo_models_and_only_those() -> None:
    """A row without a `reason` quotes the zoo models whose config states the evidence for
    its kind and method; every such statement is of a measured row, with its method (a
    statement for another method would be shown nowhere)."""
    from explain.loading.zoo import ZOO

    stated = {name: entry.evidence for name, entry in ZOO.items() if entry.evidence}
    assert sorted(stated) == ["minilm-sentiment", "recall-llama", "shapes-llava", "shapes-vit"]
    measured = {row.kind: row for row in DEFAULTS if row.reason is None}
    for name, evidence in stated.items():
        row = measured[evidence.kind]
        assert evidence.method == row.method, name
        assert f"on zoo:{name} {evidence.measured}" in row.why
    assert all(row.why.startswith("on zoo:") for row in measured.values())


def _zoo_of(tmp_path: Path, name: str, change) -> Path:
    """A private zoo holding the shipped folder `name` (its config only, what the evidence
    is read from), its config changed by `change`."""
    from explain.loading.zoo import CONFIG, zoo_root

    (tmp_path / name).mkdir()
    config = json.loads((zoo_root() / name / CONFIG).read_text())
    (tmp_path / name / CONFIG).write_text(change(config))
    return tmp_path / name / CONFIG


def test_the_evidence_is_the_zoos_read_when_shown(tmp_path, monkeypatch) -> None:
    """`why` says what the zoo's configs say when it is asked, and says so where no zoo
    model states it."""
    evidence = {"kind": "image classifier (or another one-stack transformer)"}
    evidence |= {"method": "generic", "measured": "it ties the best on a new measure"}
    _zoo_of(tmp_path, "shapes-vit", lambda c: json.dumps({**c, "default_evidence": evidence}))
    monkeypatch.setenv("EXPLAIN_ZOO", str(tmp_path))
    image = Explainer(_case("timm_vit").model).default_method
    assert image.why == "on zoo:shapes-vit it ties the best on a new measure"
    text = Explainer(_case("hf_text_encoder").model).default_method
    assert text.method == "generic" and "minilm-sentiment" not in text.why
    assert text.why.endswith(f"no model of the zoo read from {tmp_path} states the measurement")


def test_no_call_reads_the_evidence(tmp_path, monkeypatch) -> None:
    """The evidence is read only where it is shown: with the zoo's config unreadable, a
    call naming no method still runs its default, and only `why` fails, naming the file."""
    from explain.errors import ModelLoadError

    path = _zoo_of(tmp_path, "shapes-vit", lambda config: "{not json")
    monkeypatch.setenv("EXPLAIN_ZOO", str(tmp_path))
    case = _case("timm_vit")
    explainer = Explainer(case.model, spec=case.spec)
    chosen = explainer.default_method
    assert chosen.method == "generic" and explainer.explain(case.batch).method == "generic"
    with pytest.raises(ModelLoadError, match=f"{re.escape(str(path))} is not valid JSON"):
        _ = chosen.why


def test_a_family_without_the_kind_default_falls_back_with_the_reason() -> None:
    class NoGradientRules(HFCausalLM):
        family = "a language model without AttnLRP sites"
        attnlrp_sites = None

    assert "cp_lrp" in refusals(NoGradientRules)  # the premise: the family refuses it
    chosen = default_method(NoGradientRules)
    assert chosen.method == FALLBACK_METHOD
    assert chosen.kind == "decoder-only language model"
    assert "cp_lrp" in chosen.why and NoGradientRules.family in chosen.why


@pytest.mark.parametrize("name", ["hf_causal_lm", "hf_llava", "timm_vit"])
def test_a_call_naming_no_method_runs_the_default(name: str) -> None:
    case = _case(name)
    explainer = Explainer(case.model, spec=case.spec)
    implicit = explainer.explain(case.batch)
    explicit = explainer.explain(case.batch, method=_expected(name))
    assert implicit.method == _expected(name)
    torch.testing.assert_close(implicit.relevance, explicit.relevance, rtol=0, atol=0)


def test_an_explicit_method_still_wins() -> None:
    case = _case("hf_causal_lm")
    explainer = Explainer(case.model)
    assert explainer.explain(case.batch, method="generic").method == "generic"
    assert explainer.explain(case.batch, method="attnlrp").method == "attnlrp"


def test_docs_table_is_the_code_table() -> None:
    """docs/methods.md's "Default method per model kind" lists the kinds and methods of
    `DEFAULTS`, in its order."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "methods.md").read_text()
    section = text.split("## Default method per model kind", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1:3] for line in section.splitlines() if line.startswith("| ")]
    assert [(kind.strip(), method.strip()) for kind, method in rows[1:]] == [
        (row.kind, f"`{row.method}`") for row in DEFAULTS
    ]


@pytest.mark.parametrize("command", ["image", "text", "cite", "generate", "clip"])
def test_every_method_option_says_the_default(command: str) -> None:
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    shown = " ".join(commands.choices[command].format_help().split())
    assert " ".join(DEFAULT_HELP.split()) in shown
    assert "cp_lrp (decoder-only language model)" in shown


@pytest.fixture(scope="module")
def saved_lm(tmp_path_factory):
    return tiny_lm.save_tiny_lm(tmp_path_factory.mktemp("tiny-llama"), "llama")


def test_explain_methods_shows_the_default_and_why(saved_lm, capsys) -> None:
    assert main(["methods", "--model", str(saved_lm)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "  kind: decoder-only language model" in lines
    assert "  default method: cp_lrp" in lines
    why = next(line for line in lines if line.startswith("  why: "))
    assert "recall-llama" in why and "100%" in why


def test_every_language_model_entry_point_runs_the_default(saved_lm, tmp_path, capsys) -> None:
    """Python's generation, contrast and citation fronts and the text, generate and cite
    commands, each without a method, run the kind's default, cp_lrp."""
    model, tokenizer = tiny_lm.tiny_causal_lm("llama"), tiny_lm.tiny_tokenizer()
    explainer = Explainer(model, tokenizer=tokenizer)
    found = explain_generation(explainer, "w12 w30 w41", max_new_tokens=2)
    assert found.explanation.method == "cp_lrp"
    contrast = explain_contrast(explainer, "w12 w30", "w41", "w42")
    assert contrast.explanation.explanation.method == "cp_lrp"
    cited = cite(explainer, "w10 w11. w12 w13.", "w14", "w15", check=False)
    assert cited.method == "cp_lrp"

    model_args = ["--model", str(saved_lm)]
    assert main(["text", "w12 w30 w41", *model_args, "--save", "json", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "text_cp_lrp.json").is_file()
    generate = ["generate", "w12 w30", *model_args, "--max-new-tokens", "2"]
    assert main([*generate, "--out", str(tmp_path / "gen")]) == 0
    assert " (cp_lrp)</h2>" in (tmp_path / "gen" / "generation.html").read_text()
    asked = ["--context", str(_context(tmp_path)), "--question", "w14", "--answer", "w15"]
    assert main(["cite", *model_args, *asked, "--out", str(tmp_path / "cite")]) == 0
    assert json.loads((tmp_path / "cite" / "cite.json").read_text())["method"] == "cp_lrp"


def _context(folder: Path) -> Path:
    path = folder / "context.txt"
    path.write_text("w10 w11. w12 w13.")
    return path


def test_an_explicit_method_wins_on_the_command_line(saved_lm, tmp_path, capsys) -> None:
    generate = ["generate", "w12 w30", "--model", str(saved_lm), "--max-new-tokens", "2"]
    assert main([*generate, "--method", "generic", "--out", str(tmp_path)]) == 0
    assert " (generic)</h2>" in (tmp_path / "generation.html").read_text()


@pytest.mark.parametrize(
    ("model", "modality", "expected"),
    [("hf_causal_lm", "text", "cp_lrp"), ("timm_vit", "image", "generic")],
)
def test_the_viewer_offers_and_runs_the_default(model, modality, expected, tmp_path) -> None:
    from explain.loading.loaded_model import LoadedModel
    from explain.serve import ResultCache, Workbench

    case = _case(model)
    tokenizer = tiny_lm.tiny_tokenizer() if modality == "text" else None
    loaded = LoadedModel(name=model, model=case.model, modality=modality, tokenizer=tokenizer)
    workbench = Workbench(loaded, ResultCache(tmp_path / "cache"), model)
    info = workbench.info()
    assert info["default_method"] == expected
    assert expected in info["methods"] and info["default_reason"].startswith("the default")


def test_the_defaults_save_files_are_checked_before_any_work(saved_lm, tmp_path, capsys) -> None:
    """Without --method the --save file is named once the model is loaded: it is checked
    then, before anything is explained or written."""
    (tmp_path / "text_cp_lrp.json").mkdir()  # a folder where the file would go
    argv = ["text", "w12 w30", "--model", str(saved_lm), "--save", "json", "--out", str(tmp_path)]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("explain: error: --save ")
    assert "text_cp_lrp.json" in captured.err


def test_citing_a_photo_runs_the_vision_language_default() -> None:
    from explain.cite.image import cite_image
    from explain.testing.tiny_vlm import tiny_llava, tiny_llava_processor

    explainer = Explainer(tiny_llava("clip"), tokenizer=tiny_llava_processor("clip"))
    photo = np.full((40, 60, 3), 128, dtype=np.uint8)
    cited = cite_image(explainer, photo, "w12 w13", "w14 w15", check=False)
    assert cited.method == "attnlrp"
    explicit = cite_image(explainer, photo, "w12 w13", "w14 w15", method="generic", check=False)
    assert explicit.method == "generic"
