"""Modules that moved and classes that were renamed (issue 32) keep their old paths for
one release: each old name gives the object at its new home, with a DeprecationWarning
that says where it is now."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import explain

MOVED = [
    ("explain.io", "atomic_write", "explain.export"),
    ("explain.io", "check_writable", "explain.export"),
    ("explain.io", "load_images", "explain.loading.preprocessing"),
    ("explain.zoo", "minilm_folder", "explain.loading.zoo"),
    ("explain.hub", "hub_reachable", "explain.loading.hub"),
    ("explain.loaded_model", "LoadedModel", "explain.loading.loaded_model"),
    ("explain.preprocessing", "ImagePreprocessing", "explain.loading.preprocessing"),
    ("explain.preprocessing", "read_image", "explain.inputs"),
    ("explain.image_prompts", "encode_image_prompt", "explain.inputs"),
    ("explain.image_prompts", "photo_preprocessing", "explain.loading.preprocessing"),
    ("explain.tokenizing", "token_strings", "explain.inputs"),
    ("explain.fused", "choose_path", "explain.engine.fused"),
    ("explain.targets", "select_scores", "explain.engine.targets"),
    ("explain.lrp.rules", "sdiv", "explain.lrp.propagation"),
    ("explain.rules.windowed", "WindowedFold", "explain.rules.fold"),
]


@pytest.mark.parametrize(("old", "name", "home"), MOVED)
def test_a_moved_module_still_gives_its_names_with_a_warning(old, name, home):
    with pytest.warns(DeprecationWarning, match=rf"{old} moved: import {name} from {home}"):
        found = getattr(importlib.import_module(old), name)
    assert found is getattr(importlib.import_module(home), name)


def test_every_moved_module_is_covered_and_every_home_exists():
    assert {old for old, _, _ in MOVED} == set(explain._MOVED)
    for homes in explain._MOVED.values():
        for home in homes:
            importlib.import_module(home)


def test_a_name_a_moved_module_never_had_is_an_import_error():
    with pytest.raises(ImportError, match="cannot import name 'nothing'"):
        from explain.io import nothing  # noqa: F401


@pytest.mark.parametrize(
    ("module", "old", "new"),
    [
        (module, old, new)
        for module, names in explain._RENAMED.items()
        for old, new in names.items()
    ],
)
def test_a_renamed_class_keeps_its_old_name_with_a_warning(module, old, new):
    loaded = importlib.import_module(module)
    with pytest.warns(DeprecationWarning, match=rf"{module}.{old} is now {new}"):
        found = getattr(loaded, old)
    assert found is getattr(loaded, new)
    with pytest.raises(AttributeError):
        loaded.NoSuchAdapter  # noqa: B018


def test_old_paths_work_in_a_fresh_process_whatever_was_imported_first():
    """The renamed classes of modules imported while `explain` itself was imported (before
    the finder was in place) answer too, and the warning points at the importing line."""
    code = (
        "import warnings; warnings.simplefilter('error')\n"
        "try:\n"
        "    from explain.architectures.hf_common import HuggingFaceAdapter\n"
        "except DeprecationWarning as warning:\n"
        "    print('warned', warning)\n"
        "from explain.architectures.hf_common import HFAdapter\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("warned explain.architectures.hf_common.HuggingFaceAdapter")
