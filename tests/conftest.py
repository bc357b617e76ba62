"""Shared test configuration: tests marked ``cuda`` need a GPU and CuPy, and skip otherwise;
``shared_datasets`` is the offline dataset collection."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from gnnact.kernels import cupy_available

HAS_CUDA = torch.cuda.is_available() and cupy_available()

# $GNNACT_DATA, else ../shared/datasets beside the checkout.
SHARED = Path(os.environ.get("GNNACT_DATA", Path(__file__).resolve().parents[2] / "shared"
                             / "datasets"))


@pytest.fixture
def shared_datasets() -> Path:
    """The offline dataset collection (read only: load with ``workdir=``); skips if absent."""
    if not SHARED.is_dir():
        pytest.skip(f"no dataset collection at {SHARED}")
    return SHARED


@pytest.fixture(autouse=True)
def _one_thread():
    # The tensors in tests are tiny: a second intra-op thread only adds synchronisation, which
    # on a loaded 2-core runner made small matmuls ~100x slower (0.1 s instead of 4 ms a pass).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _compress_every_tensor(request, monkeypatch):
    """Every tensor is compressed however small (the tests' graphs are small; by default a
    tensor under ``gnnact.config.MIN_BYTES``, on a GPU a share of its memory, is kept as it
    is, and a pass whose context is under a share of a GPU's memory runs as PyTorch's),
    except in tests marked ``default_floor``."""
    if "default_floor" not in request.keywords:
        import gnnact.config

        monkeypatch.setattr(gnnact.config, "MIN_BYTES", 0)
        monkeypatch.setattr(gnnact.config, "GPU_FLOOR_SHARE", 0)
        monkeypatch.setattr(gnnact.config, "GPU_PASS_SHARE", 0)


@pytest.fixture
def fresh_dynamo():
    """Compiled code is cached per code object and guarded on the model: a test that compiles
    starts without the previous one's, and leaves none behind."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def small_messages_in_pieces(monkeypatch):
    """Convs run their message passing in pieces however small the messages (the tests'
    graphs are small; by default messages under ``message_floor`` run whole)."""
    from gnnact.nn import chunked

    monkeypatch.setattr(chunked, "MIN_MESSAGE_BYTES", 0)
    monkeypatch.setattr(chunked, "GPU_MEMORY_SHARE", 0)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU and CuPy")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
