"""The API documentation requirement: every public class and function (the callable names in
``__all__`` of the public modules) has a docstring with an ``Example:`` section and, if it takes
arguments, an ``Args:`` section with an entry per argument (``name (type): text``); and every
example in gnnact's docstrings runs."""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Iterator
from typing import Any

import pytest

MODULES = [
    "gnnact",
    "gnnact.nn",
    "gnnact.compress",
    "gnnact.adaptive",
    "gnnact.memory",
    "gnnact.data",
    "gnnact.training",
    "gnnact.swap",
    "gnnact.planner",
    "gnnact.quant",
]


def _public() -> Iterator[Any]:
    """One ``pytest.param`` per public callable, named by where it is first exported."""
    seen: set[int] = set()
    for module_name in MODULES:
        module = importlib.import_module(module_name)
        for name in getattr(module, "__all__", []):
            obj = getattr(module, name)
            if inspect.ismodule(obj) or not callable(obj) or id(obj) in seen:
                continue
            seen.add(id(obj))
            yield pytest.param(obj, id=f"{module_name}.{name}")


PUBLIC = list(_public())


def _doc(obj: Any) -> str:
    # ``__doc__`` itself, not inspect.getdoc: a class without a docstring must not pass on its
    # base class's.
    return inspect.cleandoc(obj.__doc__ or "")


def _parameters(obj: Any) -> list[str]:
    """The names of the arguments a caller passes: a function's, or a class's constructor's
    (documented in the class docstring). Empty when the signature is unavailable, and for a
    class whose constructor is ``object``'s, a builtin's (exceptions) or ``typing.Protocol``'s:
    there is no argument of the class's own to document."""
    if inspect.isclass(obj):
        target = obj.__init__
        if not inspect.isfunction(target) or target.__module__ == "typing":
            return []
    else:
        target = obj
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return []
    return [name for name in signature.parameters if name not in ("self", "cls")]


def test_public_objects_found():
    assert len(PUBLIC) > 40  # the modules were imported and their __all__ read


@pytest.mark.parametrize("obj", PUBLIC)
def test_docstring_has_example(obj):
    assert "Example" in _doc(obj), f"{obj.__qualname__}: no Example section"


@pytest.mark.parametrize("obj", PUBLIC)
def test_docstring_has_args(obj):
    if _parameters(obj):
        assert "Args" in _doc(obj), f"{obj.__qualname__}: no Args section"


@pytest.mark.parametrize("obj", PUBLIC)
def test_every_argument_is_documented(obj):
    doc = _doc(obj)
    missing = [name for name in _parameters(obj)
               if not re.search(rf"^\s*\**{re.escape(name)} \(", doc, re.MULTILINE)]
    assert not missing, f"{obj.__qualname__}: no 'name (type): ...' entry for {missing}"


def _modules() -> list[str]:
    import pkgutil

    import gnnact

    return sorted(info.name for info in pkgutil.walk_packages(gnnact.__path__, "gnnact.")
                  if not info.name.endswith("__main__"))


@pytest.mark.default_floor  # (as a reader runs them: small tensors kept as they are)
@pytest.mark.parametrize("module_name", _modules())
def test_examples_run(module_name, monkeypatch):
    """Every ``>>>`` example in gnnact's docstrings runs and prints what it says (those marked
    ``# doctest: +SKIP`` need a GPU, several processes or a download), from the repository's
    root as a reader runs them."""
    import doctest
    from pathlib import Path

    import torch

    import gnnact

    root = Path(__file__).resolve().parents[1]
    if module_name == "gnnact.data.datasets" and not (root.parent / "shared/datasets").is_dir():
        pytest.skip("load_dataset's example reads Cora from ../shared/datasets")
    monkeypatch.chdir(root)
    module = importlib.import_module(module_name)
    result = doctest.testmod(module, extraglobs={"torch": torch, "gnnact": gnnact},
                             optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
                             report=True, verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed"
