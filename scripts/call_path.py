"""The path of one call through the package, and the shape of the house, measured.

Call path: `Explainer(vit).explain(images, method="generic")` on a tiny timm ViT (the
conformance suite's, batch 2), the Explainer built beforehand and one warm-up call made
so that imports and caches are not counted, profiled with `sys.setprofile`; then the
one-shot `explain.explain(vit, images, method="generic")`, which also finds the family.
Only Python functions defined in explain/ count (torch and timm frames are skipped):

- functions: distinct explain functions entered, by file and qualified name (a lambda or
  comprehension counts once per enclosing function);
- files: distinct explain files they live in;
- file switches: how often the file changes between two consecutive explain calls, i.e.
  how often a reader following the call opens another file;
- depth: the deepest explain call stack counted in files (consecutive frames of one file
  are one layer), and in frames.

`--functions` also lists the functions on each path, file by file in the order first
entered, each with how often it was entered.

Each call is then run once more under a TorchDispatchMode that counts its ATen ops (the
op-count tests' CPU stand-in for GPU launches).

House: lines of code per package, top-level modules of explain/, family modules found in
two places (a module outside explain/architectures/ named like a family module there),
modules named like the standard library, string imports between packages
(`LazyImport(...)` and `importlib.import_module("explain...")` calls), and rule modules
(explain/rules/) that import explain.architectures.

    PYTHONPATH=$PWD python scripts/call_path.py [--functions] [--json out.json]
"""

from __future__ import annotations

import argparse
import ast
import itertools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import explain
from explain.testing import tiny_vit

ROOT = Path(explain.__file__).resolve().parent


def _explain_file(code: Any) -> str | None:
    """The explain/ file of a code object, relative to explain/, or None."""
    path = Path(code.co_filename)
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return None


class _OpCounter(TorchDispatchMode):
    """Counts the ATen ops dispatched while active (the op-count tests' measure)."""

    def __init__(self) -> None:
        super().__init__()
        self.total = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.total += 1
        return func(*args, **(kwargs or {}))


def _profile(call: Callable[[], Any]) -> dict[str, Any]:
    """Functions, files, file switches and depth of the explain code that `call` runs."""
    functions: dict[tuple[str, str], int] = {}  # (file, qualified name) -> calls, in order
    calls: list[str] = []
    stack: list[str | None] = []
    deepest_frames = deepest_layers = 0

    def profile(frame: Any, event: str, _arg: Any) -> None:
        nonlocal deepest_frames, deepest_layers
        if event == "return" and stack:
            stack.pop()
        if event != "call":
            return
        file = _explain_file(frame.f_code)
        stack.append(file)
        if file is None:
            return
        key = (file, frame.f_code.co_qualname)
        functions[key] = functions.get(key, 0) + 1
        calls.append(file)
        frames = [entry for entry in stack if entry is not None]
        layers = sum(1 for i, entry in enumerate(frames) if i == 0 or frames[i - 1] != entry)
        deepest_frames = max(deepest_frames, len(frames))
        deepest_layers = max(deepest_layers, layers)

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    with _OpCounter() as ops:
        call()
    by_file: dict[str, list[str]] = {}
    for (file, name), count in functions.items():
        by_file.setdefault(file, []).append(name if count == 1 else f"{name} x{count}")
    files = sorted(by_file)
    return {
        "aten_ops": ops.total,
        "functions": len(functions),
        "files": len(files),
        "file_switches": sum(1 for a, b in itertools.pairwise(calls) if a != b),
        "depth_files": deepest_layers,
        "depth_frames": deepest_frames,
        "file_list": files,
        "functions_by_file": by_file,
    }


def call_path() -> dict[str, dict[str, Any]]:
    """The profile of `Explainer(vit).explain(images, method="generic")` (the Explainer
    built beforehand, as the issue measured), and of the one-shot `explain.explain`,
    which also finds the model's family."""
    model = tiny_vit().eval()
    images = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    explainer = explain.Explainer(model)
    explainer.explain(images, method="generic")  # warm-up: imports and caches
    return {
        "explainer.explain": _profile(lambda: explainer.explain(images, method="generic")),
        "explain.explain": _profile(lambda: explain.explain(model, images, method="generic")),
    }


def _imports(path: Path) -> set[str]:
    """The explain modules (and packages) `path` imports, wherever the statement is."""
    package = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts[:-1])
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.update(f"{base}.{alias.name}" for alias in node.names)
            found.add(base)
    return {name for name in found if name.startswith("explain")}


def _string_imports(path: Path) -> list[str]:
    """Calls that import an explain module named by a string: LazyImport("explain...")
    and importlib.import_module("explain...")."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        name = ast.unparse(node.func)
        first = node.args[0]
        named = isinstance(first, ast.Constant) and str(first.value).startswith("explain.")
        if named and (name.endswith("LazyImport") or name.endswith("import_module")):
            found.append(f"{path.relative_to(ROOT.parent)}: {ast.unparse(node)}")
    return found


def house() -> dict[str, Any]:
    """The counts of the issue's goals on the package as it is on disk."""
    top = sorted(path.stem for path in ROOT.glob("*.py"))
    families = {path.stem for path in (ROOT / "architectures").glob("*.py")}
    twins = sorted(
        str(path.relative_to(ROOT))
        for path in ROOT.rglob("*.py")
        if path.parent != ROOT / "architectures"
        and path.stem in families
        and path.stem not in ("__init__", "base", "registry")
        and (path.stem.startswith(("hf_", "timm_", "open_clip")))
    )
    stdlib = sorted(
        str(path.relative_to(ROOT))
        for path in ROOT.rglob("*.py")
        if path.stem in sys.stdlib_module_names and path.stem != "__init__"
    )
    strings = [hit for path in sorted(ROOT.rglob("*.py")) for hit in _string_imports(path)]
    rules_importing_architectures = sorted(
        str(path.relative_to(ROOT))
        for path in (ROOT / "rules").rglob("*.py")
        if any(name.startswith("explain.architectures") for name in _imports(path))
    )
    lines = {
        package.name: sum(len(path.read_text().splitlines()) for path in package.rglob("*.py"))
        for package in sorted(ROOT.iterdir())
        if (package / "__init__.py").exists()
    }
    return {
        "lines_per_package": lines,
        "top_level_modules": len(top),
        "top_level_list": top,
        "family_modules_in_two_places": twins,
        "stdlib_named_modules": stdlib,
        "string_imports": strings,
        "rule_modules_importing_architectures": rules_importing_architectures,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--functions", action="store_true", help="list the functions on each path, by file"
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    figures = {"call_path": call_path(), "house": house()}
    shape = figures["house"]
    for name, path in figures["call_path"].items():
        print(
            f"{name}(vit, method='generic'): {path['functions']} functions in "
            f"{path['files']} files, {path['file_switches']} file switches, "
            f"{path['depth_files']} files deep ({path['depth_frames']} frames), "
            f"{path['aten_ops']} ATen ops"
        )
        print("  files:", ", ".join(path["file_list"]))
        if args.functions:
            for file, names in path["functions_by_file"].items():
                print(f"    {file} ({len(names)}): {', '.join(names)}")
    print(f"top-level modules: {shape['top_level_modules']} ({', '.join(shape['top_level_list'])})")
    for key in ("family_modules_in_two_places", "stdlib_named_modules", "string_imports"):
        print(f"{key.replace('_', ' ')}: {len(shape[key])} {shape[key]}")
    print(
        "lines per package:", ", ".join(f"{k} {v}" for k, v in shape["lines_per_package"].items())
    )
    key = "rule_modules_importing_architectures"
    print(f"{key.replace('_', ' ')}: {len(shape[key])} {shape[key]}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
