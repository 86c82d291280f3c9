"""Every code block of README.md and docs/*.md runs, so that no example can rot, those
indented inside list items included.

A block may be preceded by one HTML comment (invisible on GitHub) that tells this test how
to run it:

- `<!-- skip: REASON -->`: not run (network, pretrained weights, large data, long runs);
  a skipped Python block is still compiled, so its syntax cannot rot either.
- `<!-- continues -->`: a Python block that builds on the one before it (same namespace);
  every other Python block runs in a fresh namespace, so each is self-contained.
- a block in the language `text` (a file tree) is a listing, not run.
- `<!-- needs: demo-scenes -->`: a shell block that reads `outputs/demo/scenes/`, which
  `make demo` writes; the test writes two held-out scenes there first.

Python blocks run in a temporary folder (they may write files); shell blocks run there
with bash, where `explain` and `python` are this interpreter running this checkout (each
command a process forked from one warm interpreter: tests/warm_commands.py).
"""

from __future__ import annotations

import os
import re
import subprocess
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from warm_commands import WarmCommands

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELLS = ("bash", "sh", "shell")

# A fence may be indented (a block inside a list item): the closing fence has the same
# indentation, and the code is dedented by it before it runs.
_BLOCK = re.compile(
    r"(?:^[ \t]*<!--\s*(?P<marker>[^\n]*?)\s*-->\n)?"
    r"^(?P<indent>[ \t]*)```(?P<lang>[\w-]*)\n(?P<code>.*?)^(?P=indent)```[ \t]*$",
    flags=re.DOTALL | re.MULTILINE,
)
_FENCE = re.compile(r"^[ \t]*```", flags=re.MULTILINE)


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    lang: str
    code: str
    marker: str

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The fenced code blocks of a page, in order, each with its marker comment."""
    text = page.read_text(encoding="utf-8")
    return [
        Block(
            page,
            text.count("\n", 0, match.start("code")) + 1,
            match["lang"],
            textwrap.dedent(match["code"]),
            match["marker"] or "",
        )
        for match in _BLOCK.finditer(text)
    ]


def _check_marker(block: Block) -> None:
    known = block.marker == "" or block.marker == "continues"
    known |= block.marker.startswith("skip: ") or block.marker == "needs: demo-scenes"
    assert known, f"{block.name}: unknown marker <!-- {block.marker} -->"
    assert block.lang in ("python", "text", *SHELLS), (
        f"{block.name}: a code block needs a language (python, bash, or text for listings "
        f"that are not run), got {block.lang!r}"
    )


def _write_demo_scenes(folder: Path) -> None:
    from explain.data import shapes
    from explain.viz import save_image

    heldout = shapes.ShapesDataset("heldout", 2)
    for index in range(2):
        save_image(heldout.scene(index).image, folder / f"scene_{index}.png")


@pytest.fixture(scope="module")
def shell_env(tmp_path_factory) -> Iterator[dict[str, str]]:
    """The shell blocks' environment: PATH with `explain` and `python` for this interpreter
    and checkout first, each run warm (warm_commands: about 1.5 instead of 8 CPU seconds
    a command)."""
    pythonpath = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": pythonpath, "OMP_NUM_THREADS": "1"}
    warm = WarmCommands(tmp_path_factory.mktemp("warm"), env)
    yield warm.environment
    warm.close()


def run_shell(code: str, cwd: Path, name: str, env: dict[str, str]) -> str:
    """Run shell code with bash (-e: the first failing command fails the block)."""
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", code],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"{name} failed ({done.returncode}):\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf")
def test_page_examples_run(page: Path, tmp_path: Path, monkeypatch, shell_env) -> None:
    """Each page's blocks, in order: Python exec'd, shell run by bash, skips compiled."""
    found = blocks(page)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    ran = 0
    for block in found:
        _check_marker(block)
        if block.lang == "text":  # a listing (a file tree), nothing to run
            continue
        if block.marker.startswith("skip: "):
            if block.lang == "python":
                compile(block.code, block.name, "exec")
            continue
        if block.lang == "python":
            if block.marker != "continues":
                namespace = {"__name__": "__doc_example__"}
            exec(compile(block.code, block.name, "exec"), namespace)
        else:
            if block.marker == "needs: demo-scenes":
                _write_demo_scenes(tmp_path / "outputs" / "demo" / "scenes")
            run_shell(block.code, tmp_path, block.name, shell_env)
        ran += 1
    skipped = [b for b in found if b.marker.startswith("skip: ") or b.lang == "text"]
    assert ran + len(skipped) == len(found)
    if not found:
        pytest.skip(f"{page.name} has no code blocks")


def test_every_page_has_its_examples_found() -> None:
    """The block parser sees the examples (a broken regex must not pass as 'nothing to run')."""
    counts = {page.relative_to(ROOT).as_posix(): len(blocks(page)) for page in PAGES}
    assert counts["README.md"] >= 8
    assert counts["docs/gradients.md"] >= 6
    assert counts["docs/multimodal.md"] >= 6
    assert counts["docs/custom-models.md"] >= 3
    for page in PAGES:  # every fence, indented or not, opens or closes a found block
        fences = len(_FENCE.findall(page.read_text(encoding="utf-8")))
        name = page.relative_to(ROOT).as_posix()
        assert 2 * counts[name] == fences, f"{name}: a code block is not found"


def test_help_examples_run(tmp_path: Path, shell_env) -> None:
    """The example in `explain image --help` runs as printed (after `make demo`)."""
    from explain.cli import build_parser

    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.choices and "image" in a.choices)
    epilog = subparsers.choices["image"].epilog
    example = epilog.split("Example (after `make demo`): ", 1)[1]
    _write_demo_scenes(tmp_path / "outputs" / "demo" / "scenes")
    run_shell(example, tmp_path, "explain image --help", shell_env)
    assert (tmp_path / "maps" / "scene_0_grid.png").is_file()


def test_a_block_runs_as_bash_would_run_it(tmp_path: Path, shell_env) -> None:
    """The warm commands keep what the blocks rely on: a failing command fails its block
    with its status, the streams and arguments are the command's, and a command given an
    environment of its own runs cold with it; the others run warm (timm is loaded)."""
    with pytest.raises(AssertionError, match=r"(?s)failed \(2\):.*unrecognized arguments"):
        run_shell("explain models --no-such-flag", tmp_path, "a typo", shell_env)
    code = """
    python -c 'raise SystemExit(3)' || echo "status $?"
    echo words | python -c 'import sys; print(sys.stdin.read().upper() + sys.argv[1])' A
    X=1 python -c 'import os, sys; print(os.environ["X"], "timm" in sys.modules)'
    python -c 'import os, sys; print(os.getcwd(), "timm" in sys.modules)'
    """
    printed = run_shell(textwrap.dedent(code), tmp_path, "commands", shell_env)
    assert printed.splitlines() == ["status 3", "WORDS", "A", "1 False", f"{tmp_path} True"]


def test_evaluate_help_example_is_two_lines() -> None:
    """The shell continuation in `explain evaluate --help` survives as a line break."""
    from explain.cli import evaluate

    assert "random \\\n        --limit" in evaluate.__doc__


_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _prose(page: Path) -> str:
    """A page without its fenced code blocks (a `# comment` in code is no heading)."""
    lines, in_code = [], False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            in_code = not in_code
        elif not in_code:
            lines.append(line)
    return "\n".join(lines)


def _anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation but hyphens
    and underscores dropped, spaces as hyphens (a repeated heading gets -1, -2, ...)."""
    found: set[str] = set()
    for heading in re.findall(r"^#+ (.+)$", _prose(page), flags=re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        count = 0
        while (slug if count == 0 else f"{slug}-{count}") in found:
            count += 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_link_between_the_pages_resolves(page: Path) -> None:
    """Every relative link of README.md and docs/ names a file that exists and, for a
    page, a heading it has: the docs index and the guides never send a reader nowhere."""
    for target in _LINK.findall(_prose(page)):
        if re.match(r"[a-z]+:", target):  # https:, mailto: (not checked offline)
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        assert linked.exists(), f"{page.name}: {target} names no file"
        if anchor:
            assert linked.suffix == ".md", f"{page.name}: {target}: an anchor into a non-page"
            assert anchor in _anchors(linked), f"{page.name}: {target}: no such heading"


def test_the_docs_index_leads_to_every_page_and_every_kind_of_model() -> None:
    """docs/README.md: from a ViT, a Llama, a LLaVA and a DETR (and the other kinds) to
    their pages, and a link to every guide; README's list links every guide too."""
    index = ROOT / "docs" / "README.md"
    rows = {
        line.split("|")[1].strip(): _LINK.findall(line)
        for line in _prose(index).splitlines()
        if line.startswith("| a")
    }
    for kind in ("a ViT", "a Llama", "a LLaVA", "a DETR"):
        row = next((links for name, links in rows.items() if name.startswith(kind)), None)
        assert row, f"the docs index has no row for {kind}"
    guides = {page.name for page in (ROOT / "docs").glob("*.md")} - {"README.md"}
    linked = {Path(target.partition("#")[0]).name for target in _LINK.findall(_prose(index))}
    assert guides <= linked, f"the docs index does not link {sorted(guides - linked)}"
    readme = _LINK.findall(_prose(ROOT / "README.md"))
    listed = {Path(t.partition("#")[0]).name for t in readme if t.startswith("docs/")}
    assert guides | {"README.md"} <= listed, f"README does not link {guides - listed}"


def test_readme_keeps_each_story_under_its_own_heading() -> None:
    """The walkthroughs are sections of their own (not inside a list item), and the
    Promises section holds every promise (none left under Attention paths)."""
    text = _prose(ROOT / "README.md")
    sections = {
        part.split("\n", 1)[0]: part for part in re.split(r"^## ", text, flags=re.MULTILINE)
    }
    bold = re.compile(r"^- \*\*([^*]+)\*\*", flags=re.MULTILINE)
    assert bold.findall(sections["Attention paths"]) == ["explicit", "streamed", "fused"]
    promises = [title.rstrip(".") for title in bold.findall(sections["Promises"])]
    assert {"Finite numbers only", "Clear errors"} <= set(promises)
    code = {block.code: block for block in blocks(ROOT / "README.md")}
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for heading, command in (
        ("Language models: every token they generate", "save_tiny_lm('tiny-llama')"),
        ("Vision-language models: which part of the photo", "save_tiny_llava('tiny-llava')"),
    ):
        block = next(b for source, b in code.items() if command in source)
        start = readme.index(f"## {heading}\n")
        end = readme.index("\n## ", start + 1)
        assert start < readme.index(command) < end, heading
        assert block.lang == "bash" and not block.marker  # run as written, at top level
        line = readme.splitlines()[block.line - 1]
        assert not line.startswith(" "), heading
