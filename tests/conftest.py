"""Shared test configuration: tests marked ``cuda`` need a GPU and CuPy, and skip otherwise."""

from __future__ import annotations

import pytest
import torch

from gnnact.kernels import cupy_available

HAS_CUDA = torch.cuda.is_available() and cupy_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU and CuPy")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
