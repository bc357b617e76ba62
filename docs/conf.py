"""Sphinx configuration of gnnact's documentation. Build (warnings are errors, as in CI)::

    python -m sphinx -W --keep-going -b html docs docs/_build/html

The build executes the notebooks of ``docs/notebooks`` (myst-nb) and renders them with their
outputs, which takes a few minutes on a CPU. ``GNNACT_NB_EXECUTION=off`` builds without
executing them (the notebook pages then show code only), for a quick look at the prose.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from results_tables import write_tables  # noqa: E402

import gnnact  # noqa: E402

project = "gnnact"
author = "gnnact developers"
release = version = gnnact.__version__
extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon", "sphinx.ext.mathjax", "myst_nb"]
exclude_patterns = ["_build", "_generated", "**/.ipynb_checkpoints", "**/.jupyter_cache"]
source_suffix = {".rst": "restructuredtext", ".ipynb": "myst-nb"}
html_theme = "alabaster"
autodoc_member_order = "bysource"
autodoc_typehints = "none"  # the docstrings state types; signatures stay readable
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
# Cross-references to gnnact's own objects must resolve (a broken one is an error); those to
# torch, PyG and the standard library are not checked (no intersphinx inventories offline).
nitpicky = True
nitpick_ignore_regex = [(r"py:.*", r"(?!gnnact\.).*")]

# Notebooks: executed at every build (they are committed without outputs), top to bottom, in
# their own folder, on one thread; a cell error fails the build.
nb_execution_mode = os.environ.get("GNNACT_NB_EXECUTION", "force")
nb_execution_timeout = 600
nb_execution_raise_on_error = True
nb_execution_show_tb = True
nb_merge_streams = True
myst_enable_extensions = ["dollarmath"]
os.environ.setdefault("OMP_NUM_THREADS", "1")  # the kernels inherit it: small graphs, shared CI

# The results and benchmarks pages render the committed result rows (benchmarks/results/*.jsonl).
write_tables(ROOT / "benchmarks" / "results", Path(__file__).resolve().parent / "_generated")
