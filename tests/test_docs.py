"""The documentation: the Sphinx build (warnings are errors; gnnact cross-references must
resolve), the paths the README and the docs mention, and the quickstart snippets, executed."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", ROOT / "datasets" / "README.md", *sorted(DOCS.glob("*.rst"))]


def test_sphinx_build_has_no_warnings(tmp_path):
    pytest.importorskip("sphinx")
    result = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(DOCS),
         str(tmp_path / "html")], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    benchmarks = (tmp_path / "html" / "benchmarks.html").read_text()
    # The committed result rows are rendered with where they came from.
    assert "saved_bytes.jsonl" in benchmarks and "commit" in benchmarks
    for page in ("quickstart", "architecture", "math", "api", "troubleshooting", "notebooks"):
        assert (tmp_path / "html" / f"{page}.html").exists()


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


def _snippet(text: str, start: str, fence: str) -> str:
    after = text.split(start, 1)[1]
    if fence == "```python":
        return after.split("```python", 1)[1].split("```", 1)[0]
    block = after.split(".. code-block:: python", 1)[1].split("\n\n", 1)[1]
    lines = []
    for line in block.splitlines():
        if line and not line.startswith("    "):
            break
        lines.append(line[4:])
    return "\n".join(lines)


@pytest.mark.parametrize(("page", "start", "fence"), [
    ("README.md", "## Quickstart", "```python"),
    ("docs/quickstart.rst", "Replace PyG convs", ".. code-block:: python"),
])
def test_quickstart_runs(page, start, fence, capsys):
    code = _snippet((ROOT / page).read_text(), start, fence)
    assert "gnnact.convert" in code
    exec(compile(code, f"{page}:quickstart", "exec"), {"__name__": "__quickstart__"})
    saved = int(capsys.readouterr().out.split()[0])
    assert saved > 0
