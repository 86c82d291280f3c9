"""docs/gradients.md runs: its ```python blocks are executed in order in one namespace,
and each one's assertions are the claims the page makes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parent.parent / "docs" / "gradients.md"


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)


# Part 1 reads .grad of maps that were not retained, on purpose: PyTorch warns about it.
@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf")
def test_gradients_doc_examples_run():
    blocks = _python_blocks(DOC.read_text(encoding="utf-8"))
    assert len(blocks) >= 5
    namespace: dict = {}
    # The first block only shows trace()'s signature; it needs a model, defined later.
    for index, block in enumerate(blocks[1:], start=1):
        code = compile(block, f"{DOC.name} block {index}", "exec")
        exec(code, namespace)
    assert "probability" in namespace and "hidden_grads" in namespace
