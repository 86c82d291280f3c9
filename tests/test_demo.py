"""scripts/demo.py (`make demo`): its language and vision-language parts explain the zoo's
trained models (recall-llama, shapes-llava) through the commands, and their answers are
the known ones; the README's pictures are copies of what the demo writes."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from explain.data import recall

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def demo():
    """scripts/demo.py as a module."""
    spec = importlib.util.spec_from_file_location("demo", ROOT / "scripts" / "demo.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_recall_llama_answers_the_held_out_prompt_and_its_citation_is_checked(
    demo, tmp_path, capsys
):
    written = demo.recall_demo(tmp_path)
    assert all(path.is_file() for path in written)
    example = demo.recall_example()
    printed = capsys.readouterr().out
    assert f"continuation: {example.answer_text}" in printed  # the known value, generated
    cited = json.loads((tmp_path / "recall" / "cite" / "cite.json").read_text())
    assert cited["answer"] == example.answer_text and cited["method"] == "cp_lrp"
    assert cited["check"]["verdict"] == "supported"
    # the top span holds the asked fact: the key and the value the answer came from
    fact = example.facts[example.asked[0]]
    words = [recall.VOCABULARY[token] for token in (*fact.key, *fact.value)]
    top = max(cited["spans"], key=lambda span: span["score"])
    assert " ".join(words) in top["text"]
    page = (tmp_path / "recall" / "generation.html").read_text()
    assert "zoo:recall-llama" in page and "cp_lrp" in page


def test_shapes_llava_answers_the_held_out_question_about_its_object(demo, tmp_path, capsys):
    written = demo.vision_language_demo(tmp_path)
    assert all(path.is_file() for path in written)
    example = demo.scene_question()
    assert f"answer: {example.answer} " in capsys.readouterr().out  # then the end token
    cited = json.loads((tmp_path / "llava" / "cite" / "cite.json").read_text())
    assert cited["answer"] == example.answer and cited["method"] == "attnlrp"
    regions = json.loads((tmp_path / "llava" / "regions.json").read_text())
    assert len(regions) == len(example.scene.kinds) == len(cited["regions"])
    top = max(cited["regions"], key=lambda region: region["score"])
    assert top["name"] == regions[example.target]["name"]  # the object the answer is about
    assert cited["check"]["verdict"] == "supported"


def test_the_readme_shows_the_demos_pictures(demo):
    """Every picture of docs/images the README shows is a copy of a demo output
    (README_IMAGES) or a screenshot of the viewer (scripts/serve_screenshots.py)."""
    readme = (ROOT / "README.md").read_text()
    shown = set(re.findall(r"docs/images/([\w.-]+\.png)", readme))
    screenshots = {"serve-gallery.png", "serve-image.png"}
    assert set(demo.README_IMAGES) <= shown
    assert shown == set(demo.README_IMAGES) | screenshots
    assert all((ROOT / "docs" / "images" / name).is_file() for name in shown)
    # the caption quotes the demo's own examples
    caption = " ".join(readme.split("## Quickstart")[0].split())
    prompt = demo.recall_example()
    question = " ".join(prompt.text.split()[-3:])
    assert f"asks `{question}`: it answers `{prompt.answer_text}`" in caption
    scene = demo.scene_question()
    assert f'asked "{scene.text}"' in caption and f'it answers "{scene.answer}"' in caption
