"""CuPy plumbing shared by every kernel launcher: import guard, source lookup, per-device module
cache and launches on torch's current stream.

Rules this module enforces (see prior-art.md §5 for why each matters):

* CuPy is optional. ``import gnnact`` never imports it; :func:`cupy_available` probes it once.
* Torch allocates every buffer; kernels receive raw device pointers (``numpy.uint64``), so all
  memory stays in torch's caching allocator and its counters.
* Scalars are passed as NumPy fixed-width types: a Python ``int`` would be passed as a 64-bit
  ``long long`` and a Python ``float`` as a ``double`` whatever the kernel declares.
* Launches go on torch's current stream of the tensor's device, never on CuPy's own current
  stream (the legacy null stream by default), so they are ordered with surrounding torch ops.
* Each source file is compiled once per device and set of ``defines`` (NVRTC, then CuPy's
  on-disk cache). ``defines`` (``("CACHED=4",)``) are the sources' compile-time settings, for
  tuning (``benchmarks/tune_kernels.py``); every build gives the same results.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from gnnact.env import cuda_index

__all__ = ["LAUNCHER_SETTINGS", "compile_options", "cupy_available", "device_ptr",
           "get_function", "kernel_source", "kernel_source_dir", "launch", "require_cupy",
           "settings_of"]

#: NVRTC options for every module (CuPy appends ``-ftz=true`` itself).
COMPILE_OPTIONS: tuple[str, ...] = ("--std=c++17",)


@functools.cache
def _import_cupy() -> Any | None:
    try:
        import cupy
    except Exception:  # ImportError, or a broken CUDA install raising at import time
        return None
    return cupy


def cupy_available() -> bool:
    """Whether CuPy can be imported (says nothing about a GPU being present)."""
    return _import_cupy() is not None


def require_cupy() -> Any:
    cupy = _import_cupy()
    if cupy is None:
        raise ImportError("backend='cupy' needs CuPy: pip install 'gnnact[cuda12]' or "
                          "'gnnact[cuda13]' (matching your CUDA driver), or use backend='torch'")
    return cupy


def kernel_source_dir() -> Path:
    """Folder holding the ``.cu`` sources: inside the installed package (wheels carry them as
    ``gnnact/cuda``), else the top-level ``cuda/`` of a source checkout."""
    package = Path(__file__).resolve().parent.parent
    for candidate in (package / "cuda", package.parent / "cuda"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"gnnact kernel sources not found in {package / 'cuda'} or "
                            f"{package.parent / 'cuda'}")


_INCLUDE = re.compile(r'^#include "([\w.]+)"[^\n]*$', re.MULTILINE)


def kernel_source(filename: str, folder: Path | None = None) -> str:
    """The text of ``cuda/<filename>`` (or ``folder/<filename>``) with each local
    ``#include "name.cuh"`` replaced by that file's text: NVRTC compiles one self-contained
    program, with nothing to find on an include path."""
    folder = kernel_source_dir() if folder is None else folder
    text = (folder / filename).read_text()
    return _INCLUDE.sub(lambda m: kernel_source(m.group(1), folder), text)


#: Settings a launcher reads from a build's defines, not the sources
#: (:mod:`gnnact.kernels.quantize`'s grid cap).
LAUNCHER_SETTINGS = frozenset({"WAVES"})

_SETTING = re.compile(r"#\s*ifn?def\s+([A-Z_][A-Z0-9_]*)|defined\s*\(\s*([A-Z_][A-Z0-9_]*)\s*\)")


def settings_of(*sources: str) -> set[str]:
    """The compile-time settings ``sources`` read: the names their ``#ifdef``, ``#ifndef``
    and ``defined()`` test, and :data:`LAUNCHER_SETTINGS`."""
    return {a or b for source in sources for a, b in _SETTING.findall(source)} | LAUNCHER_SETTINGS


def compile_options(defines: tuple[str, ...] = (), sources: tuple[str, ...] = ()
                    ) -> tuple[str, ...]:
    """NVRTC's options for a build with ``defines`` (each ``NAME=VALUE``); with ``sources``,
    each ``NAME`` must be a setting they read (:func:`settings_of`): a removed variant's name
    would otherwise build the default, and time it against itself."""
    for define in defines:
        if not re.fullmatch(r"[A-Z_][A-Z0-9_]*=\w+", define):
            raise ValueError(f"defines must be NAME=VALUE, got {define!r}")
    if sources:
        known = settings_of(*sources)
        unknown = sorted({d.partition("=")[0] for d in defines} - known)
        if unknown:
            raise ValueError(f"defines {unknown} are not settings of the kernel sources "
                             f"(they read {sorted(known)})")
    return (*COMPILE_OPTIONS, *(f"-D{d}" for d in defines))


@functools.cache
def _module(filename: str, device_index: int, defines: tuple[str, ...] = ()) -> Any:
    cupy = require_cupy()
    source = kernel_source(filename)
    with cupy.cuda.Device(device_index):
        return cupy.RawModule(code=source, options=compile_options(defines, (source,)))


@functools.cache
def get_function(filename: str, name: str, device_index: int,
                 defines: tuple[str, ...] = ()) -> Any:
    """The kernel ``name`` of ``cuda/<filename>``, compiled for device ``device_index``
    with ``defines``."""
    cupy = require_cupy()
    module = _module(filename, device_index, defines)
    with cupy.cuda.Device(device_index):
        return module.get_function(name)


def resident_blocks(filename: str, name: str, device: torch.device, block: int,
                    defines: tuple[str, ...] = ()) -> int:
    """Blocks of ``block`` threads of the kernel ``name`` that ``device`` holds at once: per
    multiprocessor as many as its registers (the kernel's, rounded up to 8 a thread, as they
    are allocated) and its thread limit allow, times the multiprocessors."""
    index = cuda_index(device)
    registers = -(-get_function(filename, name, index, defines).num_regs // 8) * 8
    properties = torch.cuda.get_device_properties(index)
    register_file = getattr(properties, "regs_per_multiprocessor", 65536)
    per_sm = min(properties.max_threads_per_multi_processor // block,
                 register_file // (registers * block))
    return properties.multi_processor_count * max(1, per_sm)


class _Stream(NamedTuple):
    # CuPy's launch reads only ``.ptr`` of the stream argument.
    ptr: int


def device_ptr(t: torch.Tensor | None) -> np.uint64:
    """A kernel ``T*`` argument for ``t`` (a null pointer for ``None``)."""
    return np.uint64(0 if t is None else t.data_ptr())


def launch(filename: str, name: str, device: torch.device, grid: int, block: int,
           args: tuple, defines: tuple[str, ...] = ()) -> None:
    """Launch ``name`` from ``cuda/<filename>`` (built with ``defines``) on torch's current
    stream of ``device``."""
    index = cuda_index(device)
    fn = get_function(filename, name, index, defines)
    stream = _Stream(torch.cuda.current_stream(index).cuda_stream)
    with require_cupy().cuda.Device(index):
        fn((grid,), (block,), args, stream=stream)
