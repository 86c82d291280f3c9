"""`import explain` stays light: no matplotlib, no transformers, no timm; nor loads what
its model does not use."""

from __future__ import annotations

import subprocess
import sys


def _printed(code: str) -> str:
    """What `code` prints, run in a fresh interpreter (its imports are its own)."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_import_is_light():
    code = (
        "import sys, explain; "
        "heavy = [m for m in ('matplotlib', 'transformers', 'timm') if m in sys.modules]; "
        "print(','.join(heavy))"
    )
    assert _printed(code) == ""


def test_explaining_a_timm_model_does_not_import_transformers_or_matplotlib():
    code = (
        "import sys, torch; from explain import Explainer; from explain.testing import tiny_vit; "
        "Explainer(tiny_vit()).explain(torch.randn(1, 3, 32, 32)); "
        "print(','.join(m for m in ('matplotlib', 'transformers') if m in sys.modules))"
    )
    assert _printed(code) == ""


def test_loading_a_zoo_image_model_does_not_import_transformers():
    """`explain image --model zoo:shapes-vit` pays for timm, not for transformers too (3 of
    its 11 CPU seconds)."""
    code = (
        "import sys; from explain.loading import load_model; "
        "loaded = load_model('zoo:shapes-vit'); "
        "print(loaded.tokenizer, 'transformers' in sys.modules)"
    )
    assert _printed(code) == "None False"


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
    assert _printed(code) == "[] []"


def test_import_loads_no_bridged_library():
    """The bridges' libraries are optional extras, imported only when a bridge is used
    (the modules that hold the bridges, and making an Explainer, which asks whether its
    model is a bridge's, import none)."""
    bridged = ("captum", "inseq", "nnsight", "transformer_lens", "quantus")
    code = (
        "import sys, explain, explain.bridges, explain.generation, explain.evaluation.quantus; "
        "from explain.testing import tiny_vit; explain.Explainer(tiny_vit()); "
        f"print(','.join(m for m in {bridged!r} if m in sys.modules))"
    )
    assert _printed(code) == ""


def test_a_bridge_without_its_library_names_the_extra():
    """A bridge whose library is missing says which extra installs it (inseq hidden here,
    so that the check runs where it is installed too)."""
    code = (
        "import sys; sys.modules['inseq'] = None\n"
        "from explain import Explainer, ExplainError\n"
        "from explain.generation import explain_generation\n"
        "from explain.testing import tiny_lm\n"
        "model, tokenizer = tiny_lm.tiny_causal_lm('llama'), tiny_lm.tiny_tokenizer()\n"
        "explainer = Explainer(model, tokenizer=tokenizer)\n"
        "explained = explain_generation(explainer, 'user w10', max_new_tokens=1)\n"
        "try:\n"
        "    explained.to_inseq()\n"
        "except ExplainError as error:\n"
        "    print(error)\n"
    )
    assert _printed(code) == (
        "this needs inseq (inseq is missing): pip install 'explain-transformers[inseq]'"
    )
