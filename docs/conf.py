"""Sphinx configuration of gnnact's documentation. Build (warnings are errors, as in CI)::

    python -m sphinx -W --keep-going -b html docs docs/_build/html
"""

from __future__ import annotations

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
extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon", "sphinx.ext.mathjax"]
exclude_patterns = ["_build", "_generated", "notebooks/.ipynb_checkpoints"]
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

# The benchmarks page renders the committed result rows (benchmarks/results/*.jsonl).
write_tables(ROOT / "benchmarks" / "results", Path(__file__).resolve().parent / "_generated")
