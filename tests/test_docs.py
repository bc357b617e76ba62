"""The documentation: the Sphinx build (warnings are errors; gnnact cross-references must
resolve; it executes the notebooks), the paths the README and the docs mention, and every python
code block of the README and the docs pages, executed.

Code blocks: the python blocks of one page run in order in one namespace, so a later block may
use what an earlier one defined. A block that holds ``if __name__ == "__main__":`` runs on its
own as a script, in a subprocess (multiprocessing examples). A block that cannot run on a CPU
test runner is marked: in reST with the option ``:class: no-run`` of ``code-block``, in
markdown with a ``<!-- no-run -->`` line just before the fence. ``:class: needs-<module>``
runs the block only where ``<module>`` imports.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", ROOT / "datasets" / "README.md", *sorted(DOCS.glob("*.rst"))]


def test_sphinx_build_has_no_warnings(tmp_path):
    pytest.importorskip("sphinx")
    pytest.importorskip("myst_nb")  # renders and executes the notebooks (the dev extra)
    result = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(DOCS),
         str(tmp_path / "html")], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    html = tmp_path / "html"
    benchmarks = (html / "benchmarks.html").read_text()
    # The committed result rows are rendered with where they came from.
    assert "saved_bytes.jsonl" in benchmarks and "commit" in benchmarks
    results = (html / "results.html").read_text()
    assert "suite.jsonl" in results and "saved_bytes.jsonl" in results
    for page in ("quickstart", "guide", "scale_out", "results", "architecture", "math", "api",
                 "troubleshooting", "notebooks"):
        assert (html / f"{page}.html").exists()
    # The notebooks were executed by the build: their figures are on their pages.
    for name in ("01_sensitivity", "02_memory_vs_accuracy", "03_where_the_bytes_go"):
        assert "<img" in (html / "notebooks" / f"{name}.html").read_text(), name


# A repository path in backticks: `gnnact/swap.py`, ``benchmarks/gpu_all.sh``,
# `tests/test_plan.py::test_name`.
_PATH = re.compile(r"`+((?:gnnact|benchmarks|tests|docs|datasets|tools|cuda|\.ci)/"
                   r"[\w./-]*[\w/])(?:::[\w\[\]-]+)?`+")


# Paths of the installed package, not of the repository (the wheel carries cuda/ there).
_INSTALLED = {"gnnact/cuda"}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_mentioned_paths_exist(page):
    missing = []
    for match in _PATH.finditer(page.read_text()):
        path = match.group(1)
        if any(c in path for c in "*<>{}") or path.endswith("/_build") or path in _INSTALLED:
            continue  # a pattern or a build output, not a file
        if not (ROOT / path).exists() and not (ROOT / f"{path}.py").exists():  # a module
            missing.append(path)
    assert not missing, missing


_RST_BLOCK = re.compile(r"^(?P<indent> *)\.\. code-block:: python3?\s*$")


def _rst_blocks(text: str) -> list[tuple[int, str, set[str]]]:
    """(line, code, classes) of every ``code-block:: python`` of a reST page."""
    lines = text.splitlines()
    blocks = []
    i = 0
    while i < len(lines):
        match = _RST_BLOCK.match(lines[i])
        i += 1
        if not match:
            continue
        indent, classes = len(match["indent"]), set()
        while i < len(lines) and lines[i].strip().startswith(":"):  # options
            option = lines[i].strip()
            if option.startswith(":class:"):
                classes |= set(option.split(":", 2)[2].split())
            i += 1
        start, body = i, []
        while i < len(lines) and (not lines[i].strip()
                                  or len(lines[i]) - len(lines[i].lstrip()) > indent):
            body.append(lines[i])
            i += 1
        blocks.append((start + 1, textwrap.dedent("\n".join(body)).strip("\n"), classes))
    return blocks


def _markdown_blocks(text: str) -> list[tuple[int, str, set[str]]]:
    """(line, code, classes) of every python fence of a markdown page."""
    blocks, lines = [], text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].strip() in ("```python", "```py"):
            before = next((line.strip() for line in reversed(lines[:i]) if line.strip()), "")
            classes = {"no-run"} if before == "<!-- no-run -->" else set()
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
            blocks.append((i + 2, "\n".join(lines[i + 1:end]), classes))
            i = end
        i += 1
    return blocks


def _blocks(page: Path) -> list[tuple[int, str, set[str]]]:
    text = page.read_text()
    return _markdown_blocks(text) if page.suffix == ".md" else _rst_blocks(text)


CODE_PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.rst"))]


def _runnable(classes: set[str]) -> bool:
    if "no-run" in classes:
        return False
    needs = [c.removeprefix("needs-") for c in classes if c.startswith("needs-")]
    return all(importlib.util.find_spec(module) is not None for module in needs)


@pytest.mark.parametrize("page", [p for p in CODE_PAGES if _blocks(p)],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_code_blocks_run(page, tmp_path, monkeypatch):
    """Every python block of the page runs: in order, in one namespace per page; a block with
    ``if __name__ == "__main__":`` as a script of its own."""
    monkeypatch.chdir(tmp_path)  # a block that writes files writes them here
    namespace = {"__name__": "__docs__"}
    ran = 0
    for line, code, classes in _blocks(page):
        if not _runnable(classes):
            continue
        where = f"{page.relative_to(ROOT)}:{line}"
        if 'if __name__ == "__main__":' in code:
            script = tmp_path / f"block_{line}.py"
            script.write_text(code + "\n")
            env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
            result = subprocess.run([sys.executable, str(script)], capture_output=True,
                                    text=True, env=env, timeout=300)
            assert result.returncode == 0, f"{where}\n{result.stderr[-3000:]}"
        else:
            exec(compile(code, where, "exec"), namespace)
        ran += 1
    assert ran, f"no runnable python block in {page.name}"


def test_code_block_markers():
    """The block finder sees the documented markers."""
    rst = """Text.

.. code-block:: python
   :class: no-run

    a = 1

.. code-block:: python

    b = 2
    if b:
        c = 3

After.
"""
    assert [(code, classes) for _, code, classes in _rst_blocks(rst)] == [
        ("a = 1", {"no-run"}), ("b = 2\nif b:\n    c = 3", set())]
    markdown = "x\n\n<!-- no-run -->\n```python\nd = 4\n```\n\n```python\ne = 5\n```\n"
    assert [(code, classes) for _, code, classes in _markdown_blocks(markdown)] == [
        ("d = 4", {"no-run"}), ("e = 5", set())]
    assert not _runnable({"no-run"}) and _runnable({"needs-torch"})
    assert not _runnable({"needs-a_module_that_is_not_there"})


def test_readme_is_one_screen_for_users():
    """The front door: at most 150 lines, no commit hashes, no paths outside the repository,
    and its results table exactly what benchmarks/headline.py makes of the committed rows."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 150
    assert "../" not in text and "gpu_all.sh" not in text
    assert not re.search(r"\b[0-9a-f]{7,40}\b", text), "a commit hash in the README"
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from headline import headline
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    assert headline() in text
