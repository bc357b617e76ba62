"""The notebooks of ``docs/notebooks``: each one is committed without outputs, and each one is
rendered by the documentation. The documentation build (``tests/test_docs.py``) executes every
notebook top to bottom (myst-nb, ``nb_execution_mode = "force"``, a cell error fails the build)
and checks that their figures are on their pages, so they are not executed a second time here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

# Test extras (the dev install has them); a bare GPU image may not.
nbformat = pytest.importorskip("nbformat")

DOCS = Path(__file__).resolve().parent.parent / "docs"
NB_DIR = DOCS / "notebooks"
NOTEBOOKS = sorted(NB_DIR.glob("*.ipynb"))


def test_the_notebooks_are_there():
    assert len(NOTEBOOKS) >= 4, f"expected the notebooks under {NB_DIR}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_is_committed_without_outputs(path: Path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    dirty = [i for i, cell in enumerate(nb.cells) if cell.cell_type == "code"
             and (cell.get("outputs") or cell.get("execution_count") is not None)]
    assert not dirty, f"{path.name}: cells {dirty} have outputs or an execution count"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_is_rendered_and_executed_by_the_docs(path: Path):
    """Each notebook is in the notebooks page's toctree, and the Sphinx configuration executes
    notebooks at every build (unless ``GNNACT_NB_EXECUTION`` says otherwise)."""
    toctree = (DOCS / "notebooks.rst").read_text()
    assert f"notebooks/{path.stem}" in toctree, f"{path.name} is not rendered in the docs"
    conf = (DOCS / "conf.py").read_text()
    assert '"myst_nb"' in conf
    assert 'nb_execution_mode = os.environ.get("GNNACT_NB_EXECUTION", "force")' in conf
    assert "nb_execution_raise_on_error = True" in conf
