"""The notebooks in notebooks/ are stored clean and run from top to bottom without error."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import nbformat
import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))
CELL_TIMEOUT_S = 600


def test_there_are_notebooks():
    names = {path.name for path in NOTEBOOKS}
    assert {
        "vit_explainability.ipynb",
        "text_explainability.ipynb",
        "clip_explainability.ipynb",
        "evaluation.ipynb",
        "language_model_methods.ipynb",
    } <= names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_stored_without_outputs(path):
    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [], f"{path.name} cell {index} has stored outputs"
            assert cell.execution_count is None, f"{path.name} cell {index} has a count"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_executes(path):
    from nbclient import NotebookClient

    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(
        notebook,
        timeout=CELL_TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
    )
    client.execute()  # raises CellExecutionError with the failing cell's traceback
    errors = [
        output
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.outputs
        if output.output_type == "error"
    ]
    assert errors == []


def _shell_lines(notebook) -> list[str]:
    """Every `explain` command a notebook shows or runs: `!explain ...` lines and `%%bash`
    cells in its code, ```bash blocks in its text; a line ending in a backslash continues
    on the next."""
    found = []
    for cell in notebook.cells:
        source = cell.source
        if cell.cell_type == "markdown":
            blocks = re.findall(r"```(?:bash|sh|shell)\n(.*?)```", source, flags=re.DOTALL)
        elif source.startswith("%%bash"):
            blocks = [source.split("\n", 1)[1]]
        else:
            blocks = [
                "\n".join(
                    line.lstrip()[1:]
                    for line in source.splitlines()
                    if line.lstrip().startswith("!")
                )
            ]
        for block in blocks:
            for line in block.replace("\\\n", " ").splitlines():
                if line.strip().startswith("explain"):
                    found.append(line.strip())
    return found


SHELL_LINES = [
    (path.name, line)
    for path in NOTEBOOKS
    for line in _shell_lines(nbformat.read(path, as_version=4))
]


def test_the_notebooks_show_shell_lines():
    assert SHELL_LINES  # the parsing test below would pass on none


@pytest.mark.parametrize(("notebook", "line"), SHELL_LINES, ids=lambda value: str(value)[:60])
def test_every_shell_line_in_the_notebooks_parses(notebook, line):
    """Parsed by the real parser, not run: the lines name the reader's own model and data
    (./my-llm), which do not exist here. Every flag and value argparse checks, and every
    method name, must be accepted."""
    from explain.cli import build_parser
    from explain.cli.method_options import parse_methods

    argv = shlex.split(line)
    assert argv[0] == "explain", line
    args = build_parser().parse_args(argv[1:])  # unknown arguments: SystemExit
    if getattr(args, "method", None) is not None:
        parse_methods(args.method)
