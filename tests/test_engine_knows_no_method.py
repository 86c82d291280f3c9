"""The engine keeps only mechanisms: it imports no module of explain.rules that registers
a method, and names no method; a method is its file in rules/ and its registry line."""

from __future__ import annotations

import ast
from pathlib import Path

from explain.rules import METHODS

ROOT = Path(__file__).resolve().parents[1] / "explain"
ENGINE = sorted((ROOT / "engine").rglob("*.py"))


def _rules_imports(path: Path) -> set[str]:
    """The modules of explain.rules that `path` imports (the package itself as
    "explain.rules")."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "explain.rules":
                found |= {f"explain.rules.{alias.name}" for alias in node.names}
            elif node.module.startswith("explain.rules"):
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("explain.rules")}
    return found


def _registers_a_method(module: str) -> bool:
    path = ROOT.parent / (module.replace(".", "/") + ".py")
    if not path.exists():  # a name the package re-exports (the registry's)
        return False
    tree = ast.parse(path.read_text())
    return any(
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "register_method"
        for node in ast.walk(tree)
    )


def test_the_engine_imports_the_registry_and_no_method():
    imported = {module: path for path in ENGINE for module in _rules_imports(path)}
    assert "explain.rules.registry" in imported
    methods = {m: str(p.relative_to(ROOT)) for m, p in imported.items() if _registers_a_method(m)}
    assert methods == {}


def test_the_engine_names_no_method():
    named = [
        (str(path.relative_to(ROOT)), node.lineno, node.value)
        for path in ENGINE
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and node.value in METHODS
    ]
    assert named == []


def test_the_checks_see_what_they_look_for(tmp_path):
    # the two checks fail on a file that imports a method module and names a method
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from explain.rules.occlusion import occluded_spans\n"
        "from explain.rules import integrated_gradients\n"
        "METHOD = 'occlusion'\n"
    )
    imported = _rules_imports(probe)
    assert imported == {"explain.rules.occlusion", "explain.rules.integrated_gradients"}
    assert all(_registers_a_method(m) for m in imported)
    assert any(
        isinstance(n, ast.Constant) and n.value in METHODS
        for n in ast.walk(ast.parse(probe.read_text()))
    )
