"""The module graph of `explain` has no cycles, counting every import: at the top of a
module, inside functions, and under TYPE_CHECKING (a cycle hidden there is still a loop in
the design). An edge goes to the module an import names: `from explain.pkg import name`
names the submodule `explain.pkg.name` when there is one, and the package otherwise."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import explain

ROOT = Path(explain.__file__).parent


def _modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Every explain module `name` imports, wherever the import statement is."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:  # `from pkg import submodule` imports the submodule
                submodule = f"{base}.{alias.name}"
                targets.add(submodule if submodule in modules else base)
    return {target for target in targets if target in modules and target != name}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph`, as the list of its modules, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for successor in sorted(graph[node]):
            if state.get(successor) == 1:
                return [*stack[stack.index(successor) :], successor]
            if successor not in state:
                found = visit(successor)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_module_graph_has_no_cycle():
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_sees_imports_inside_functions_and_type_checking(tmp_path):
    """The check itself can fail: a loop made only of a function-level import and a
    TYPE_CHECKING import is found."""
    package = tmp_path / "explain"
    package.mkdir()
    (package / "a.py").write_text("def f():\n    from explain import b\n")
    (package / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from explain.a import f\n"
    )
    modules = {"explain.a": package / "a.py", "explain.b": package / "b.py"}
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert _cycle(graph) in (
        ["explain.a", "explain.b", "explain.a"],
        ["explain.b", "explain.a", "explain.b"],
    )


def test_the_registry_imports_no_family():
    """Like timm's _registry: family modules are named, and imported only on use."""
    from explain.architectures.registry import FAMILIES

    modules = _modules()
    imported = _imports(
        "explain.architectures.registry", modules["explain.architectures.registry"], modules
    )
    family_modules = {family.module for family in FAMILIES.values()}
    assert family_modules <= set(modules)
    assert not imported & family_modules
    code = (
        "import sys, explain, explain.architectures; "
        f"print(sorted(m for m in {sorted(family_modules)!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def _package_of(module: str, modules: dict[str, Path]) -> str:
    """The package a module belongs to: `explain.pkg` for anything under explain/pkg/,
    and the module itself for a top-level module (explain.errors)."""
    parts = module.split(".")
    if len(parts) > 2 or modules[module].name == "__init__.py":
        return ".".join(parts[:2])
    return module


def package_graph() -> dict[str, set[str]]:
    """Every package (and top-level module) -> the others its modules import."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        source = _package_of(name, modules)
        targets = {_package_of(target, modules) for target in _imports(name, path, modules)}
        graph.setdefault(source, set()).update(targets - {source})
    return graph


def test_the_package_graph_has_no_cycle():
    """Packages import one way too: no module of a package imports a package (or
    top-level module) that imports back into it, however indirectly."""
    cycle = _cycle(package_graph())
    assert cycle is None, "package import cycle: " + " -> ".join(cycle)


def test_the_shared_data_types_import_nothing_of_explain():
    """explain.layout is the bottom of the house: every package may import it, and it
    imports none."""
    modules = _modules()
    assert _imports("explain.layout", modules["explain.layout"], modules) == set()


def test_no_rule_module_imports_a_family_or_the_adapters():
    """The rules are family-free maths: neither the method package (explain.rules) nor the
    LRP maths (explain.lrp) imports explain.architectures; what differs per family comes
    through the adapter contract and the data of explain.layout."""
    modules = _modules()
    for name, path in modules.items():
        if _package_of(name, modules) in ("explain.rules", "explain.lrp"):
            imported = _imports(name, path, modules)
            assert not {m for m in imported if m.startswith("explain.architectures")}, name


def test_the_engine_imports_no_family_module():
    """A plan or pass knows the adapter contract (base.py) and the shared data, never one
    family's file."""
    from explain.architectures.registry import FAMILIES

    modules = _modules()
    family_modules = {family.module for family in FAMILIES.values()}
    family_modules |= {
        "explain.architectures.hf_vision_language",
        "explain.architectures.hf_common",
    }
    for name, path in modules.items():
        if _package_of(name, modules) == "explain.engine":
            assert not _imports(name, path, modules) & family_modules, name


def _string_imports(path: Path) -> list[str]:
    """Calls in `path` that import an explain module named by a string constant."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and node.args:
            first = node.args[0]
            named = isinstance(first, ast.Constant) and isinstance(first.value, str)
            if named and first.value.startswith("explain"):
                function = ast.unparse(node.func)
                if function.endswith(("import_module", "__import__", "LazyImport")):
                    found.append(ast.unparse(node))
    return found


def test_no_module_imports_another_by_a_string():
    """A string import is an edge the graph tests cannot see. The registry names its
    families by module, but only modules of its own package, imported on use."""
    from explain.architectures.registry import FAMILIES

    modules = _modules()
    found = {name: _string_imports(path) for name, path in modules.items()}
    assert {name: calls for name, calls in found.items() if calls} == {}
    assert all(family.module.startswith("explain.architectures.") for family in FAMILIES.values())


def test_the_string_import_finder_sees_one(tmp_path):
    path = tmp_path / "m.py"
    path.write_text('import importlib\nimportlib.import_module("explain.lrp.walk")\n')
    assert _string_imports(path) == ["importlib.import_module('explain.lrp.walk')"]
