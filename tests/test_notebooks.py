"""The notebooks of ``docs/notebooks``: each one runs top to bottom without an error (executed
headless by nbclient, in the notebook's folder, on one thread), and each one is committed
without outputs."""

from __future__ import annotations

from pathlib import Path

import pytest

# Test extras (the dev install has them); a bare GPU image may not.
nbformat = pytest.importorskip("nbformat")
NotebookClient = pytest.importorskip("nbclient").NotebookClient

NB_DIR = Path(__file__).resolve().parent.parent / "docs" / "notebooks"
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
def test_notebook_runs(path: Path, monkeypatch: pytest.MonkeyPatch):
    # The kernel inherits this process's environment: one thread (the graphs are small, and a
    # second intra-op thread only adds synchronisation on a loaded runner).
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    # Cell errors raise CellExecutionError, which names the cell and shows the traceback.
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, kernel_name="python3", timeout=600,
                            resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    errors = [output for cell in nb.cells if cell.cell_type == "code"
              for output in cell.outputs if output.output_type == "error"]
    assert not errors, f"{path.name}: {errors}"
