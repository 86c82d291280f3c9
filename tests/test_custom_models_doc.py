"""docs/custom-models.md runs as written: every ```python block in a fresh namespace."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parent.parent / "docs" / "custom-models.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```", DOC.read_text(encoding="utf-8"), re.S | re.M)


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_block_runs(index):
    exec(compile(BLOCKS[index], f"{DOC.name} block {index}", "exec"), {})


def test_page_has_the_three_examples():
    assert len(BLOCKS) == 3
