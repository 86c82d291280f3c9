"""Bad text inputs get clear errors that say what to do, and leave the model untouched;
optional inputs (token types, a missing mask, lists) work."""

from __future__ import annotations

import functools

import pytest
import reference_hf as ref
import torch
from tolerances import FLOAT32

from explain import Explainer, InputError, supported_families
from explain.testing import ModelState


@functools.cache
def _model(name: str):
    return ref.tiny_text_model(name)


BAD_INPUTS = {
    "raw string": ("some text", "tokenize it first"),
    "not a mapping": (torch.ones(1, 3, dtype=torch.long), "mapping with input_ids"),
    "one sequence": ({"input_ids": torch.tensor([2, 5, 3])}, "unsqueeze"),
    "floats": ({"input_ids": torch.ones(1, 3)}, "integers"),
    "ragged lists": ({"input_ids": [[2, 5, 3], [2, 3]]}, "padded"),
    "empty batch": ({"input_ids": torch.zeros(0, 3, dtype=torch.long)}, "batch is empty"),
    "no tokens": ({"input_ids": torch.zeros(2, 0, dtype=torch.long)}, "empty"),
    "all padding": (
        {
            "input_ids": torch.tensor([[2, 5], [0, 0]]),
            "attention_mask": torch.tensor([[1, 1], [0, 0]]),
        },
        "text 1 of the batch is empty",
    ),
    "mask shape": (
        {"input_ids": torch.tensor([[2, 5]]), "attention_mask": torch.tensor([[1, 1, 1]])},
        "attention_mask has shape",
    ),
    "mask values": (
        {"input_ids": torch.tensor([[2, 5]]), "attention_mask": torch.tensor([[1, 2]])},
        "0 \\(padding\\) and 1",
    ),
    "too long": (
        {"input_ids": torch.full((1, ref.MAX_POSITIONS + 1), 5)},
        f"too long: {ref.MAX_POSITIONS + 1} tokens.*at most {ref.MAX_POSITIONS}",
    ),
    "outside vocabulary": ({"input_ids": torch.tensor([[2, ref.VOCAB, 3]])}, "vocabulary"),
    "outside vocabulary at a pad": (
        {"input_ids": torch.tensor([[2, 5, -100]]), "attention_mask": torch.tensor([[1, 1, 0]])},
        "token id -100 at padding position 2 of text 0 is outside the model's vocabulary",
    ),
    "left padding for CLS": (
        {"input_ids": torch.tensor([[0, 2, 3]]), "attention_mask": torch.tensor([[0, 1, 1]])},
        "padding_side = 'right'",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_text_input_is_refused_clearly(case):
    inputs, message = BAD_INPUTS[case]
    model = _model("bert-classifier")
    before = ModelState.capture(model)
    with pytest.raises(InputError, match=message):
        Explainer(model).explain(inputs)
    assert before.differences(ModelState.capture(model)) == []


def test_narrow_integer_ids_are_compared_as_the_numbers_they_hold():
    """A uint8 id of 200 is inside a 30522-token vocabulary: compared in uint8, 30522 would
    wrap to 58 and refuse it."""
    from explain.architectures.hf_common import prepare_text

    for dtype in (torch.uint8, torch.int8, torch.int16, torch.int32):
        ids = torch.tensor([[2, 100, 3]], dtype=dtype)
        found = prepare_text(
            {"input_ids": ids}, max_tokens=8, vocab_size=30522, device=torch.device("cpu"),
            token_types=False,
        )  # fmt: skip
        assert found["input_ids"].dtype == torch.long
        assert found["input_ids"].tolist() == [[2, 100, 3]]
    wide = prepare_text(
        {"input_ids": torch.tensor([[200]], dtype=torch.uint8)}, max_tokens=8, vocab_size=30522,
        device=torch.device("cpu"), token_types=False,
    )  # fmt: skip
    assert wide["input_ids"].tolist() == [[200]]


def test_roberta_limit_counts_its_position_offset():
    model = _model("roberta-classifier")
    config = model.config  # positions start after the pad id: pad_token_id + 1 fewer
    limit = config.max_position_embeddings - config.pad_token_id - 1
    Explainer(model).explain({"input_ids": torch.full((1, limit), 5)})
    with pytest.raises(InputError, match=f"at most {limit}"):
        Explainer(model).explain({"input_ids": torch.full((1, limit + 1), 5)})


def test_token_types_are_used_where_the_model_takes_them():
    ids = torch.tensor([[2, 5, 6, 3, 7, 8, 3]])
    types = torch.tensor([[0, 0, 0, 0, 1, 1, 1]])
    explainer = Explainer(_model("bert-classifier"))
    with_types = explainer.explain({"input_ids": ids, "token_type_ids": types}, target=0)
    without = explainer.explain({"input_ids": ids}, target=0)
    assert not torch.allclose(with_types.relevance, without.relevance)
    distil = Explainer(_model("distilbert-classifier"))
    distil.explain({"input_ids": ids, "token_type_ids": torch.zeros_like(ids)})
    with pytest.raises(InputError, match="no token_type_ids"):
        distil.explain({"input_ids": ids, "token_type_ids": types})


def test_lists_and_a_missing_mask_work():
    explainer = Explainer(_model("gpt2"))
    from_lists = explainer.explain({"input_ids": [[2, 5, 6]]}, target=4)
    from_tensor = explainer.explain(
        {"input_ids": torch.tensor([[2, 5, 6]]), "attention_mask": torch.ones(1, 3)}, target=4
    )
    # float32: a missing mask may take another attention path than a mask of ones
    torch.testing.assert_close(from_lists.relevance, from_tensor.relevance, **FLOAT32)


def test_families_are_listed():
    families = " ".join(supported_families())
    for name in ("BERT", "RoBERTa", "DistilBERT", "ALBERT", "ELECTRA", "GPT2", "ViT", "DeiT"):
        assert name in families
