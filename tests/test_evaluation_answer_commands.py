"""`explain evaluate language-evidence` and `vision-language-evidence` from the command
line: the JSON lines data, the zoo's registry of known-evidence sets, resuming, the
methods a generation takes, and one-line errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from explain.architectures import adapter_for
from explain.cli import main
from explain.cli.evaluate import _PROTOCOLS
from explain.engine import Request, supported_methods
from explain.errors import InputError
from explain.evaluation import PROTOCOLS
from explain.evaluation.datasets import ImageAnswerExample
from explain.evaluation.datasets.answers import AnswerFile
from explain.evaluation.zoo import ZooEvaluation, zoo_evaluations
from explain.inputs import encode_image_prompt
from explain.testing.tiny_lm import save_tiny_lm, tiny_causal_lm
from explain.testing.tiny_vlm import save_tiny_llava


def test_the_command_offers_every_protocol():
    assert set(_PROTOCOLS) == set(PROTOCOLS)


@pytest.fixture(scope="module")
def lm_folder(tmp_path_factory):
    return save_tiny_lm(tmp_path_factory.mktemp("lm") / "model")


def write_answers(path, count=5):
    """Prompts answered right by the tiny Llama (its own greedy two tokens), one wrong."""
    model = tiny_causal_lm("llama")
    generator = torch.Generator().manual_seed(1)
    with path.open("w") as handle:
        for index in range(count):
            ids = [1, *torch.randint(10, 58, (15 + index,), generator=generator).tolist()]
            answer = []
            for _ in range(2):
                with torch.no_grad():
                    answer.append(int(model(torch.tensor([ids + answer])).logits[0, -1].argmax()))
            if index == count - 1:
                answer[0] = 10 + (answer[0] - 9) % 48
            line = {"input_ids": ids, "answer": answer, "evidence": [3, 4], "kept": [len(ids) - 1]}
            handle.write(json.dumps(line) + "\n\n")
    return path


def test_language_evidence_from_a_json_lines_file_resumes(lm_folder, tmp_path):
    data = write_answers(tmp_path / "answers.jsonl")
    output = tmp_path / "results" / "evidence.json"
    command = [
        "evaluate", "language-evidence", "--model", str(lm_folder), "--data", str(data),
        "--batch-size", "2", "--replacement", "w9", "--output", str(output), "--quiet",
    ]  # fmt: skip
    assert main(command) == 0
    results = json.loads(output.read_text())
    expected = supported_methods(adapter_for(tiny_causal_lm("llama")), Request(prompt_length=1))
    assert list(results["results"]) == expected and results["skipped"] == {}
    assert (results["protocol"], results["n"]) == ("language-evidence", 5)
    assert "replaced by token 9 ('w9')" in results["scale"]
    generic = results["results"]["generic"]
    assert (generic["accuracy"], generic["right"], generic["wrong"]["count"]) == (0.8, 4, 1)
    assert set(generic["standard_errors"]) == {
        key for key, column in PROTOCOLS["language-evidence"].columns.items() if column.better
    }
    table = output.with_suffix(".md").read_text()
    assert "| `generic` | 0.800 |" in table and output.with_suffix(".png").exists()
    first = output.read_text()
    assert main(command) == 0  # every chunk is reused
    assert output.read_text() == first


def test_language_evidence_errors_are_one_line(lm_folder, tmp_path, capsys):
    data = write_answers(tmp_path / "answers.jsonl", count=2)
    output = str(tmp_path / "r.json")
    bad_word = ["evaluate", "language-evidence", "--model", str(lm_folder), "--data", str(data),
                "--replacement", "nonsense", "--output", output]  # fmt: skip
    assert main(bad_word) == 2
    assert "is not a token of the model's vocabulary" in capsys.readouterr().err
    assert (
        main(["evaluate", "language-evidence", "--model", str(lm_folder), "--output", output]) == 2
    )
    assert "no built-in prompts with known evidence" in capsys.readouterr().err


def test_answer_files_name_their_bad_lines(tmp_path):
    path = tmp_path / "a.jsonl"
    with pytest.raises(InputError, match="not found"):
        AnswerFile(path)
    for text, problem in (
        ('{"input_ids": [1, 2]}\n', "needs input_ids and answer"),
        ('{"input_ids": [1, 2], "answer": [3], "why": 1}\n', "unknown keys"),
        ('{"input_ids": [1, 2], "answer": [3], "evidence": [5]}\n', "outside the prompt"),
        ('{"input_ids": [1, 2], "answer": ["x"]}\n', "list of integers"),
        ("not json\n", "not an answer example"),
        ("\n", "holds no examples"),
    ):
        path.write_text(text)
        with pytest.raises(InputError, match=problem):
            AnswerFile(path)


def test_vision_language_evidence_runs_on_a_registered_set(tmp_path, monkeypatch):
    folder = save_tiny_llava(tmp_path / "llava")

    class Questions:
        name = "tiny-questions"

        def __init__(self, loaded):
            rng = np.random.default_rng(0)
            self.examples = []
            for text in ("w12 w13", "w14", "w15"):
                photo = (rng.random((32, 32, 3)) * 255).astype(np.uint8)
                encoded = encode_image_prompt({"image": photo, "text": text}, loaded.tokenizer)
                mask = torch.zeros(32, 32, dtype=torch.bool)
                mask[:8, :16] = True
                ids = tuple(encoded["input_ids"][0].tolist())
                self.examples.append(
                    ImageAnswerExample(
                        ids, encoded["pixel_values"][0], (20,), mask, (len(ids) - 3,)
                    )
                )

        def __len__(self):
            return len(self.examples)

        def __getitem__(self, index):
            return self.examples[index]

    registered = ZooEvaluation(
        str(folder), "", None, 0, (0, 0.0), answers=lambda loaded, length: Questions(loaded)
    )
    monkeypatch.setitem(zoo_evaluations(), str(folder), registered)
    output = tmp_path / "vl.json"
    status = main(
        ["evaluate", "vision-language-evidence", "--model", str(folder), "--depth", "tower",
         "--method", "generic,raw_attention", "--output", str(output), "--quiet"]
    )  # fmt: skip
    assert status == 0
    results = json.loads(output.read_text())
    assert (
        list(results["results"]) == ["generic"]
        and "fixed block" in results["skipped"]["raw_attention"]
    )
    assert "Depth 'tower'" in results["scale"] and results["dataset"] == "tiny-questions"
    assert output.with_suffix(".png").exists()


def test_answer_examples_from_text_mark_the_evidence_and_the_question_by_substring(tmp_path):
    # recall prompts know their evidence (the asked fact's key and value tokens) and their
    # question: the same positions, found from text alone, and a file AnswerFile reads.
    from explain.data import recall
    from explain.evaluation.datasets.answers import answer_example, write_answer_file

    tokenizer = recall.build_tokenizer()
    made, expected = [], []
    for example in recall.examples("heldout", 3, 128):
        (fact,) = (example.facts[index] for index in example.asked)
        words = [recall.VOCABULARY[token] for token in (*fact.key, *fact.value)]
        question = " ".join(
            recall.VOCABULARY[t] for t in example.input_ids[-recall.QUESTION_TOKENS :]
        )
        made.append(
            answer_example(
                tokenizer,
                example.text,
                example.answer_text,
                evidence=[" ".join(words)],
                kept=[question],
            )
        )
        expected.append(
            (
                example.input_ids,
                example.answer,
                example.evidence_positions,
                example.question_positions,
            )
        )
    for got, (ids, answer, evidence, question) in zip(made, expected, strict=True):
        assert (got.input_ids, got.answer, got.evidence, got.kept) == (
            ids,
            answer,
            evidence,
            question,
        )
    read = AnswerFile(write_answer_file(tmp_path / "answers.jsonl", made))
    assert list(read.examples) == made


@pytest.mark.parametrize(
    ("prompt", "evidence", "message"),
    [
        ("w10 w11 w10", ["w10"], "occurs 2 times"),
        ("w10 w11 w12", ["w13"], "occurs 0 times"),
        ("w10 w11 w12", "w10", "list of substrings"),
        ("w10 w11 w12", [""], "non-empty"),
        ("   ", ["w10"], "prompt must be a text"),
    ],
)
def test_answer_example_errors_say_what_to_fix(prompt, evidence, message):
    from explain.evaluation.datasets.answers import answer_example
    from explain.testing.tiny_lm import tiny_tokenizer

    with pytest.raises(InputError, match=message):
        answer_example(tiny_tokenizer(), prompt, "w20", evidence=evidence)
