"""docs/architecture.md's picture is the package graph as the code has it: every arrow is
an import of a package's modules (test_module_graph's graph), every package is drawn, and
every import is an arrow or a path of arrows (the picture leaves out what a path implies)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_module_graph import package_graph

DOC = Path(__file__).parents[1] / "docs" / "architecture.md"


def _node(drawn: str) -> str:
    """A name as the picture writes it (`cli/`, `api.py`, `__init__.py`) -> its module."""
    if drawn == "__init__.py":
        return "explain"
    if not re.fullmatch(r"[a-z_]+(/|\.py)", drawn):
        raise ValueError(
            f"the picture names {drawn!r}: write a package as pkg/, a module as mod.py"
        )
    return "explain." + drawn.removesuffix("/").removesuffix(".py")


def picture_graph(text: str) -> dict[str, set[str]]:
    """The arrows of the first ```text block after "## The picture": each line
    `name -> name, name` (or a name alone), a trailing "(...)" a comment."""
    section = text.split("## The picture", 1)[1]
    block = section.split("```text\n", 1)[1].split("```", 1)[0]
    graph: dict[str, set[str]] = {}
    for line in block.splitlines():
        line = re.sub(r"\s+\(.*\)$", "", line).strip()
        if not line:
            continue
        source, _, targets = line.partition("->")
        node = _node(source.strip())
        if node in graph:
            raise ValueError(f"the picture draws {source.strip()} twice")
        graph[node] = {_node(name.strip()) for name in targets.split(",") if name.strip()}
    return graph


def _reach(graph: dict[str, set[str]], start: str) -> set[str]:
    """Everything `start` reaches along the arrows of `graph`, itself left out."""
    seen: set[str] = set()
    stack = [start]
    while stack:
        for successor in graph.get(stack.pop(), ()):
            if successor not in seen:
                seen.add(successor)
                stack.append(successor)
    return seen


def differences(picture: dict[str, set[str]], imports: dict[str, set[str]]) -> list[str]:
    """What the picture says that the imports do not, and the reverse, one line each."""
    found = [f"{name} is not drawn" for name in sorted(imports.keys() - picture.keys())]
    found += [
        f"{name} is drawn but is no package" for name in sorted(picture.keys() - imports.keys())
    ]
    for source in sorted(picture.keys() & imports.keys()):
        for target in sorted(picture[source] - imports[source]):
            found.append(f"the picture draws {source} -> {target}, which no import makes")
        for target in sorted(imports[source] - _reach(picture, source)):
            found.append(f"{source} imports {target}; no arrow or path of arrows leads there")
    return found


def test_the_picture_is_the_package_graph():
    found = differences(picture_graph(DOC.read_text()), package_graph())
    assert not found, "docs/architecture.md's picture: " + "; ".join(found)


PICTURE = """## The picture
```text
a/      -> b.py      (a comment)
b.py    -> c/
c/
```
"""


def test_the_picture_is_read_as_drawn():
    assert picture_graph(PICTURE) == {
        "explain.a": {"explain.b"},
        "explain.b": {"explain.c"},
        "explain.c": set(),
    }


def test_the_check_fails_on_a_false_arrow_a_missing_one_and_a_missing_package():
    """The check itself can fail: an arrow no import makes, an import no path of arrows
    reaches (a -> c is drawn as a path, so it passes), a package left out."""
    picture = picture_graph(PICTURE)
    imports = {
        "explain.a": {"explain.b", "explain.c"},
        "explain.b": {"explain.c"},
        "explain.c": set(),
    }
    assert differences(picture, imports) == []
    assert differences(picture, {**imports, "explain.b": set()}) == [
        "the picture draws explain.b -> explain.c, which no import makes"
    ]
    assert differences(picture, {**imports, "explain.c": {"explain.d"}, "explain.d": set()}) == [
        "explain.d is not drawn",
        "explain.c imports explain.d; no arrow or path of arrows leads there",
    ]


def test_a_misspelt_name_is_refused():
    with pytest.raises(ValueError, match="pkg/"):
        picture_graph(PICTURE.replace("c/\n", "C\n"))
