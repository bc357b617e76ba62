"""``cuda/quantize.cu`` compiled for the host CPU and run warp by warp, so that a machine
without a GPU executes the kernels' own source, not a transcription of it.

The source is compiled by the system C++ compiler with a prelude that stands in for what
CUDA provides: each warp of the launch runs as 32 threads (its lanes), and a warp shuffle or
vote is an exchange through 32 slots between two barrier phases, which is what the lockstep
lanes of a GPU warp compute. Float intrinsics are the IEEE operations they name
(``-ffp-contract=off``: no fused multiply-add, as ``__fmul_rn``/``__fadd_rn`` forbid on the
GPU). The float16 and bfloat16 conversions are PTX, so those two element types do not run
here; float32 and float64 do.

What this checks on a CPU: index arithmetic, vector accesses through the ``Octet`` union,
the range reduction across lanes, the rounding and the packing, all against
``gnnact.quant.reference``. What it does not: the GPU's memory system (coalescing, speed), the
``-ftz=true`` flush of subnormal values, and anything NVRTC compiles differently.
"""

from __future__ import annotations

import ctypes
import functools
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch
from torch import Tensor

from gnnact.kernels._cupy import kernel_source
from gnnact.kernels.quantize import _THREADS, _group_grid
from gnnact.quant.packed import QUANT_BITS, packed_code_bytes
from gnnact.quant.rng import split_seed

#: Element types whose kernels run on the host (the others convert with PTX).
HOST_DTYPES = {torch.float32: "f32", torch.float64: "f64"}

_PRELUDE = r"""
#include <barrier>
#include <cmath>
#include <cstring>
#include <functional>
#include <math.h>
#include <thread>
#include <vector>

#define __device__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define asm(...) ((void)0)  // PTX: only the float16/bfloat16 conversions use it

struct HostDim { unsigned x; };
static thread_local HostDim threadIdx, blockIdx, blockDim, gridDim;

static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline float __double2float_rn(double v) { return (float)v; }
static inline float __int_as_float(int v) { float f; std::memcpy(&f, &v, 4); return f; }
static inline float __uint_as_float(unsigned v) { float f; std::memcpy(&f, &v, 4); return f; }
template <typename T> static inline T min(T a, T b) { return b < a ? b : a; }
using std::isfinite;

// One warp at a time: its 32 lanes are threads, a shuffle or vote is an exchange through
// warp_slots between two barrier phases.
static std::barrier<>* warp_barrier;
static unsigned long long warp_slots[32];
static thread_local int lane_of;

template <typename T> static T warp_exchange(T v, int source) {
    unsigned long long bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    warp_slots[lane_of] = bits;
    warp_barrier->arrive_and_wait();
    const unsigned long long got = warp_slots[source];
    warp_barrier->arrive_and_wait();
    T r;
    std::memcpy(&r, &got, sizeof(T));
    return r;
}
template <typename T> static T __shfl_xor_sync(unsigned, T v, int offset) {
    return warp_exchange(v, lane_of ^ offset);
}
static int __all_sync(unsigned, int p) {
    warp_slots[lane_of] = p != 0;
    warp_barrier->arrive_and_wait();
    int all = 1;
    for (int i = 0; i < 32; ++i) all &= (int)warp_slots[i];
    warp_barrier->arrive_and_wait();
    return all;
}
"""

_LAUNCHER = r"""
static void run_grid(int grid, int block, const std::function<void()>& kernel) {
    for (int b = 0; b < grid; ++b) {
        for (int w = 0; w < block / 32; ++w) {
            std::barrier<> barrier(32);
            warp_barrier = &barrier;
            std::vector<std::thread> lanes;
            for (int lane = 0; lane < 32; ++lane) {
                lanes.emplace_back([&, b, w, lane] {
                    threadIdx.x = w * 32 + lane;
                    blockIdx.x = b;
                    blockDim.x = block;
                    gridDim.x = grid;
                    lane_of = lane;
                    kernel();
                });
            }
            for (auto& t : lanes) t.join();
        }
    }
}
"""


def _entry_points() -> str:
    """``host_quantize``/``host_dequantize``: the kernel of a dtype and width, on a grid."""
    quant, dequant = [], []
    for dtype_code, name in enumerate(HOST_DTYPES.values()):
        t = {"f32": "float", "f64": "double"}[name]
        for bits in QUANT_BITS:
            case = f"case {dtype_code * 16 + bits}:"
            quant.append(
                f"{case} run_grid(grid, block, [&] {{ quantize_{name}_{bits}((const {t}*)x, "
                "noise, codes, scales, zeros, n, group_size, num_groups, bytes_per_group, "
                "s0, s1, vec); }); return 0;")
            dequant.append(
                f"{case} run_grid(grid, block, [&] {{ dequantize_{name}_{bits}(codes, scales, "
                f"zeros, ({t}*)out, n, group_size, num_groups, bytes_per_group, vec); }}); "
                "return 0;")
    return (
        'extern "C" int host_quantize(int kernel, const void* x, const float* noise, u8* codes,'
        " float* scales, float* zeros, i64 n, i64 group_size, i64 num_groups,"
        " i64 bytes_per_group, u32 s0, u32 s1, int vec, int grid, int block) {\n"
        "    switch (kernel) {\n        " + "\n        ".join(quant)
        + "\n    }\n    return 1;\n}\n"
        'extern "C" int host_dequantize(int kernel, const u8* codes, const float* scales,'
        " const float* zeros, void* out, i64 n, i64 group_size, i64 num_groups,"
        " i64 bytes_per_group, int vec, int grid, int block) {\n"
        "    switch (kernel) {\n        " + "\n        ".join(dequant)
        + "\n    }\n    return 1;\n}\n")


def compiler() -> str | None:
    """The C++ compiler the host build uses, if there is one."""
    return shutil.which("g++") or shutil.which("clang++")


@functools.cache
def library() -> ctypes.CDLL:
    """``cuda/quantize.cu`` built for the host (once per process)."""
    cxx = compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler (g++ or clang++) on PATH")
    folder = Path(tempfile.mkdtemp(prefix="gnnact_host_kernels_"))
    source = folder / "quantize_host.cpp"
    source.write_text(_PRELUDE + kernel_source("quantize.cu") + _LAUNCHER + _entry_points())
    lib = folder / "quantize_host.so"
    result = subprocess.run(
        [cxx, "-std=c++20", "-O1", "-ffp-contract=off", "-fPIC", "-shared", "-pthread",
         "-w", "-o", str(lib), str(source)], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"host build of cuda/quantize.cu failed:\n{result.stderr[-4000:]}")
    return ctypes.CDLL(str(lib))


def _kernel(dtype: torch.dtype, bits: int) -> int:
    return list(HOST_DTYPES).index(dtype) * 16 + bits


def _ptr(t: Tensor | None) -> ctypes.c_void_p:
    return ctypes.c_void_p(0 if t is None else t.data_ptr())


def quantize_groups(x: Tensor, bits: int, group_size: int, *, seed: int | None = None,
                    noise: Tensor | None = None, vec: bool, grid: int | None = None
                    ) -> tuple[Tensor, Tensor, Tensor]:
    """The kernel's ``(codes, scales, zeros)`` for the CPU tensor ``x``, as
    :func:`gnnact.kernels.quantize.quantize_groups` launches it (``vec`` and ``grid`` chosen
    by the caller; the grid-stride loops cover any grid)."""
    n = x.numel()
    num_groups = -(-n // group_size)
    bytes_per_group = packed_code_bytes(group_size, bits)
    codes = torch.full((num_groups, bytes_per_group), 0xAB, dtype=torch.uint8)
    scales = torch.empty(num_groups, dtype=torch.float32)
    zeros = torch.empty(num_groups, dtype=torch.float32)
    s0, s1 = split_seed(seed or 0)
    status = library().host_quantize(
        _kernel(x.dtype, bits), _ptr(x), _ptr(noise), _ptr(codes), _ptr(scales), _ptr(zeros),
        ctypes.c_int64(n), ctypes.c_int64(group_size), ctypes.c_int64(num_groups),
        ctypes.c_int64(bytes_per_group), ctypes.c_uint32(s0), ctypes.c_uint32(s1),
        ctypes.c_int(int(vec)), ctypes.c_int(grid or _group_grid(num_groups)),
        ctypes.c_int(_THREADS))
    assert status == 0, f"no host kernel for {x.dtype}, {bits} bits"
    return codes, scales, zeros


def dequantize_groups(codes: Tensor, scales: Tensor, zeros: Tensor, bits: int, group_size: int,
                      numel: int, dtype: torch.dtype, *, vec: bool, out: Tensor | None = None,
                      grid: int | None = None) -> Tensor:
    """The kernel's restored values (into ``out``, a flat CPU tensor, when given)."""
    num_groups, bytes_per_group = codes.shape
    out = torch.full((numel,), float("nan"), dtype=dtype) if out is None else out
    status = library().host_dequantize(
        _kernel(dtype, bits), _ptr(codes), _ptr(scales), _ptr(zeros), _ptr(out),
        ctypes.c_int64(numel), ctypes.c_int64(group_size), ctypes.c_int64(num_groups),
        ctypes.c_int64(bytes_per_group), ctypes.c_int(int(vec)),
        ctypes.c_int(grid or _group_grid(num_groups)), ctypes.c_int(_THREADS))
    assert status == 0, f"no host kernel for {dtype}, {bits} bits"
    return out
