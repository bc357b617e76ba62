"""Shared test configuration: tests marked ``cuda`` need a GPU and CuPy, and skip otherwise."""

from __future__ import annotations

import pytest
import torch

from gnnact.kernels import cupy_available

HAS_CUDA = torch.cuda.is_available() and cupy_available()


@pytest.fixture(autouse=True)
def _one_thread():
    # The tensors in tests are tiny: a second intra-op thread only adds synchronisation, which
    # on a loaded 2-core runner made small matmuls ~100x slower (0.1 s instead of 4 ms a pass).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU and CuPy")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
