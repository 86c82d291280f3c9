"""`import explain` stays light: no matplotlib, no transformers, no timm."""

from __future__ import annotations

import subprocess
import sys


def test_import_is_light():
    code = (
        "import sys, explain; "
        "heavy = [m for m in ('matplotlib', 'transformers', 'timm') if m in sys.modules]; "
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_explaining_a_timm_model_does_not_import_transformers_or_matplotlib():
    code = (
        "import sys, torch; from explain import Explainer; from explain.testing import tiny_vit; "
        "Explainer(tiny_vit()).explain(torch.randn(1, 3, 32, 32)); "
        "print(','.join(m for m in ('matplotlib', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_every_public_name_is_its_modules_own():
    """The names `explain` imports at their first use (its __getattr__) are the objects
    their modules define, and every name in __all__ resolves."""
    code = (
        "import importlib, explain; "
        "wrong = [n for n, m in explain._PUBLIC.items() "
        "if getattr(explain, n) is not getattr(importlib.import_module(m), n)]; "
        "missing = sorted(set(explain.__all__) - set(explain._PUBLIC) - {'__version__'}); "
        "print(wrong, missing)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[] []"


def test_import_loads_no_bridged_library():
    """The bridges' libraries are optional extras, imported only when a bridge is used."""
    bridged = ("captum", "inseq", "nnsight", "transformer_lens", "quantus")
    code = (
        "import sys, explain, explain.bridges, explain.generation; "
        f"print(','.join(m for m in {bridged!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
