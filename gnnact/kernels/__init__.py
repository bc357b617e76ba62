"""Kernels with the signatures of the torch reference: CUDA kernels (``cuda/*.cu``) loaded
with CuPy (:mod:`gnnact.kernels.quantize`), and the quantizer compiled for the CPU
(:mod:`gnnact.kernels.cpu`, ``quantize_cpu.cpp``).

Nothing here imports CuPy until a kernel is launched; :func:`cupy_available` says whether it can.
"""

from gnnact.kernels._cupy import cupy_available, kernel_source_dir

__all__ = ["cupy_available", "kernel_source_dir"]
