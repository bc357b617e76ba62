"""``cuda/quantize.cu`` and ``cuda/mask.cu`` compiled for the host CPU and run warp by warp,
so that a machine without a GPU executes the kernels' own source, not a transcription of it.

The sources are compiled by the system C++ compiler with a prelude that stands in for what
CUDA provides: each warp of the launch runs as 32 threads (its lanes), and a warp shuffle,
vote or ballot is an exchange through 32 slots between two barrier phases, which is what the
lockstep lanes of a GPU warp compute. Float intrinsics are the IEEE operations they name
(``-ffp-contract=off``: no fused multiply-add, as ``__fmul_rn``/``__fadd_rn`` forbid on the
GPU). Each inline PTX statement of the sources (:data:`PTX`: float16 and bfloat16
conversions, the mask ops' product, sign test and scale, bit operations) becomes a call of its
host twin; one the harness does not know fails the build.

What this checks on a CPU: index arithmetic, vector accesses through the ``Octet`` union,
the range reduction across lanes, rounding and packing, the mask ops, every element type, all
against the torch path. What it does not: the GPU's memory system (coalescing, speed),
``quantize.cu``'s ``-ftz=true`` flush of subnormal values (the host keeps them), and anything
NVRTC compiles differently.
"""

from __future__ import annotations

import ctypes
import functools
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from gnnact.kernels._cupy import device_ptr, kernel_source
from gnnact.kernels.quantize import _DTYPE_NAMES, _THREADS, _dtype_name, _group_grid
from gnnact.quant.packed import QUANT_BITS, packed_code_bytes
from gnnact.quant.rng import split_seed

_C_TYPES = {"f32": "float", "f64": "double", "f16": "u16", "bf16": "u16"}

#: The inline PTX statements the sources may use, each with a host twin in the prelude.
PTX = ("cvt.f32.f16 %0, %1;", "cvt.rn.f16.f32 %0, %1;", "cvt.rn.bf16.f32 %0, %1;",
       "mul.rn.f32 %0, %1, %2;", "cvt.rn.f32.f64 %0, %1;", "fma.rn.f32 %0, %1, %2, %3;",
       r"{\n\t.reg .pred q;\n\tsetp.gt.f32 q, %1, 0f00000000;\n\tselp.u32 %0, 1, 0, q;\n\t}",
       "min.f16x2 %0, %1, %2;", "max.NaN.f16x2 %0, %1, %2;", "min.bf16x2 %0, %1, %2;",
       "max.NaN.bf16x2 %0, %1, %2;", "max.NaN.f32 %0, %1, %2;",
       "lop3.b32 %0, %1, %2, %3, 0xea;", "and.b32 %0, %1, 0xffff0000;")

_PRELUDE = r"""
#include <barrier>
#include <cfenv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <math.h>
#include <thread>
#include <vector>

#define __device__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(...)
// A block's shared memory: the warps run one at a time on the same 32 threads, so a static
// array is what each warp of a block sees of it.
#define __shared__ static

struct HostDim { unsigned x; };
static thread_local HostDim threadIdx, blockIdx, blockDim, gridDim;

static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
// Rounded upwards: the host's fma in that mode (-frounding-math keeps the compiler from moving
// it across the mode switches; each lane is a thread with a mode of its own).
static inline float __fmaf_ru(float a, float b, float c) {
    const int mode = std::fegetround();
    std::fesetround(FE_UPWARD);
    const float r = std::fma(a, b, c);
    std::fesetround(mode);
    return r;
}
static inline unsigned __float2uint_ru(float v) {  // saturating, NaN to 0, as cvt.rpi.u32
    if (!(v > 0.0f)) return 0u;
    return v >= 4294967296.0f ? 0xffffffffu : (unsigned)std::ceil(v);
}
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline float __double2float_rn(double v) { return (float)v; }
static inline float __int_as_float(int v) { float f; std::memcpy(&f, &v, 4); return f; }
static inline int __float_as_int(float v) { int i; std::memcpy(&i, &v, 4); return i; }
static inline unsigned __umulhi(unsigned a, unsigned b) {
    return (unsigned)(((unsigned long long)a * b) >> 32);
}
static inline float __uint2float_rn(unsigned v) { return (float)v; }
// PRMT: byte n of the result is byte (s >> 4n) & 7 of x's and y's 8.
static inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    const unsigned long long bytes = x | (unsigned long long)y << 32;
    unsigned r = 0;
    for (int n = 0; n < 4; ++n) {
        r |= (unsigned)((bytes >> (8 * ((s >> (4 * n)) & 7))) & 0xff) << (8 * n);
    }
    return r;
}
static inline float __uint_as_float(unsigned v) { float f; std::memcpy(&f, &v, 4); return f; }
static inline unsigned __float_as_uint(float v) { unsigned u; std::memcpy(&u, &v, 4); return u; }
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
static unsigned __ballot_sync(unsigned, int p) {
    warp_slots[lane_of] = p != 0;
    warp_barrier->arrive_and_wait();
    unsigned word = 0;
    for (int i = 0; i < 32; ++i) word |= (unsigned)warp_slots[i] << i;
    warp_barrier->arrive_and_wait();
    return word;
}
static void __syncwarp(unsigned = 0xffffffffu) { warp_barrier->arrive_and_wait(); }
template <typename T> static T __shfl_xor_sync(unsigned, T v, int offset) {
    return warp_exchange(v, lane_of ^ offset);
}
// Lane src of the lane's segment of `width` lanes (src taken modulo width, as on a GPU).
template <typename T> static T __shfl_sync(unsigned, T v, int src, int width = 32) {
    return warp_exchange(v, (lane_of & ~(width - 1)) | (src & (width - 1)));
}
// The host twins of the sources' inline PTX (asm statements are rewritten into calls of
// host_ptx); an unknown statement stops the run.
static void ptx_check(const char* ptx, const char* want) {
    if (std::strcmp(ptx, want) != 0) {
        std::fprintf(stderr, "host_kernels: no host twin for PTX \"%s\"\n", ptx);
        std::abort();
    }
}
static void host_ptx(const char* ptx, float& out, unsigned short in) {  // float16 -> float
    ptx_check(ptx, "cvt.f32.f16 %0, %1;");
    _Float16 h;
    std::memcpy(&h, &in, 2);
    out = (float)h;
}
static void host_ptx(const char* ptx, unsigned short& out, float in) {  // float -> 16 bits
    if (std::strcmp(ptx, "cvt.rn.bf16.f32 %0, %1;") == 0) {  // round to nearest even
        unsigned b;
        std::memcpy(&b, &in, 4);
        const bool nan = (b & 0x7fffffffu) > 0x7f800000u;
        out = nan ? (unsigned short)0x7fff  // PTX's canonical NaN
                  : (unsigned short)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
        return;
    }
    ptx_check(ptx, "cvt.rn.f16.f32 %0, %1;");
    const _Float16 h = (_Float16)in;
    std::memcpy(&out, &h, 2);
}
static void host_ptx(const char* ptx, float& out, float a, float b) {
    if (std::strcmp(ptx, "max.NaN.f32 %0, %1, %2;") == 0) {
        out = std::isnan(a) || std::isnan(b) ? NAN : std::fmax(a, b);
        return;
    }
    ptx_check(ptx, "mul.rn.f32 %0, %1, %2;");
    out = a * b;
}
static void host_ptx(const char* ptx, float& out, float a, float b, float c) {
    ptx_check(ptx, "fma.rn.f32 %0, %1, %2, %3;");
    out = std::fma(a, b, c);
}
static void host_ptx(const char* ptx, unsigned& out, float v) {
    ptx_check(ptx, "{\n\t.reg .pred q;\n\tsetp.gt.f32 q, %1, 0f00000000;\n\t"
                   "selp.u32 %0, 1, 0, q;\n\t}");
    out = v > 0.0f;
}
static void host_ptx(const char* ptx, unsigned& out, unsigned w) {
    ptx_check(ptx, "and.b32 %0, %1, 0xffff0000;");
    out = w & 0xffff0000u;
}
static void host_ptx(const char* ptx, float& out, double v) {
    ptx_check(ptx, "cvt.rn.f32.f64 %0, %1;");
    out = (float)v;
}

// Packed pairs of float16 or bfloat16 (the first value in the low half): each half through
// float, where min, max and v * 0 + a are exact.
static float pair_half(unsigned w, int k, bool bf16) {
    const unsigned short h = (unsigned short)(w >> (16 * k));
    if (bf16) {
        const unsigned b = (unsigned)h << 16;
        float f;
        std::memcpy(&f, &b, 4);
        return f;
    }
    _Float16 f;
    std::memcpy(&f, &h, 2);
    return (float)f;
}
static unsigned pair_word(float lo, float hi, bool bf16) {
    unsigned short h[2];
    const float v[2] = {lo, hi};
    for (int k = 0; k < 2; ++k) {
        if (bf16) {  // min, max, zeros and NaN: exact in bfloat16 (NaN made canonical)
            unsigned b;
            std::memcpy(&b, &v[k], 4);
            h[k] = std::isnan(v[k]) ? (unsigned short)0x7fff : (unsigned short)(b >> 16);
        } else {
            const _Float16 f = (_Float16)v[k];
            std::memcpy(&h[k], &f, 2);
        }
    }
    return h[0] | ((unsigned)h[1] << 16);
}
static void host_ptx(const char* ptx, unsigned& out, unsigned a, unsigned b) {
    const bool bf16 = std::strstr(ptx, "bf16x2") != nullptr;
    const bool is_min = std::strncmp(ptx, "min.", 4) == 0;
    if (!is_min && std::strncmp(ptx, "max.NaN.", 8) != 0) ptx_check(ptx, "min/max pairs");
    float r[2];
    for (int k = 0; k < 2; ++k) {
        const float x = pair_half(a, k, bf16), y = pair_half(b, k, bf16);
        r[k] = is_min ? std::fmin(x, y)
                      : std::isnan(x) || std::isnan(y) ? NAN : std::fmax(x, y);
    }
    out = pair_word(r[0], r[1], bf16);
}
static void host_ptx(const char* ptx, unsigned& out, unsigned x, unsigned y, unsigned z) {
    if (std::strncmp(ptx, "lop3.b32 ", 9) != 0) ptx_check(ptx, "lop3.b32");
    // Bit by bit: LUT bit 4 x + 2 y + z.
    const unsigned lut = (unsigned)std::strtoul(std::strrchr(ptx, ',') + 1, nullptr, 16);
    out = 0;
    for (int k = 0; k < 32; ++k) {
        const unsigned at = ((x >> k) & 1u) << 2 | ((y >> k) & 1u) << 1 | ((z >> k) & 1u);
        out |= ((lut >> at) & 1u) << k;
    }
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
// The launch's warps one after another; 32 threads are the lanes of each in turn (all lanes
// finish a warp before any starts the next, so warp_slots serves one warp at a time).
static void run_grid(int grid, int block, const std::function<void()>& kernel) {
    std::barrier<> barrier(32);
    warp_barrier = &barrier;
    std::vector<std::thread> lanes;
    for (int lane = 0; lane < 32; ++lane) {
        lanes.emplace_back([&, lane] {
            lane_of = lane;
            blockDim.x = block;
            gridDim.x = grid;
            for (int b = 0; b < grid; ++b) {
                for (int w = 0; w < block / 32; ++w) {
                    threadIdx.x = w * 32 + lane;
                    blockIdx.x = b;
                    kernel();
                    barrier.arrive_and_wait();
                }
            }
        });
    }
    for (auto& t : lanes) t.join();
}
"""


def _quantize_entries() -> str:
    """``host_quantize``/``host_dequantize``: the kernel of a dtype and width, on a grid."""
    quant, dequant = [], []
    for code, name in enumerate(_DTYPE_NAMES.values()):
        t = _C_TYPES[name]
        for bits in QUANT_BITS:
            case = f"case {code * 16 + bits}:"
            quant.append(
                f"{case} run_grid(grid, block, [&] {{ quantize_{name}_{bits}((const {t}*)x, "
                "noise, codes, scales, zeros, n, group_size, num_groups, bytes_per_group, "
                "s0, s1, vec); }); return 0;")
            dequant.append(
                f"{case} run_grid(grid, block, [&] {{ dequantize_{name}_{bits}(codes, scales, "
                f"zeros, ({t}*)out, n, group_size, num_groups, bytes_per_group, vec); }}); "
                "return 0;")
    # The byte of round_hashed's word that packed_codes takes as the code.
    rounding = [f"case {bits}: for (i64 i = 0; i < n; ++i) out[i] = (round_hashed<{bits}>(v[i], "
                "hashed_noise(g[i >> 1], (int)(i & 1)), zero, inv) >> "
                "HASHED_CODE_AT) & 0xffu; return 0;" for bits in QUANT_BITS]
    return (
        'extern "C" int host_round_hashed(int bits, const float* v, const u32* g, i64 n,'
        " float zero, float inv, u32* out) {\n"
        "    switch (bits) {\n        " + "\n        ".join(rounding)
        + "\n    }\n    return 1;\n}\n"
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


def _mask_entries() -> str:
    """``host_sign_mask``/``host_apply_packed_mask``: the kernel of a dtype, on a grid."""
    sign, apply = [], []
    for code, name in enumerate(_DTYPE_NAMES.values()):
        t = _C_TYPES[name]
        sign.append(f"case {code}: run_grid(grid, block, [&] {{ sign_mask_{name}((const {t}*)x, "
                    f"({t}*)y, packed, n, mode, s, vec); }}); return 0;")
        apply.append(f"case {code}: run_grid(grid, block, [&] {{ apply_packed_mask_{name}("
                     f"(const {t}*)x, packed, ({t}*)y, n, mode, s, vec); }}); return 0;")
    return (
        'extern "C" void host_pack_mask(const u8* mask, u8* out, i64 n, i64 nbytes, int grid,'
        " int block) {\n    run_grid(grid, block, [&] { pack_mask(mask, out, n, nbytes); });\n}\n"
        'extern "C" void host_unpack_mask(const u8* packed, u8* out, i64 n, int grid,'
        " int block) {\n    run_grid(grid, block, [&] { unpack_mask(packed, out, n); });\n}\n"
        'extern "C" void host_dropout_keep_bits(u8* out, i64 n, i64 nbytes, u32 k0, u32 k1,'
        " i64 ctr0, i64 stride, float keep, int grid, int block) {\n    run_grid(grid, block,"
        " [&] { dropout_keep_bits(out, n, nbytes, k0, k1, ctr0, stride, keep); });\n}\n"
        'extern "C" int host_sign_mask(int kernel, const void* x, void* y, u8* packed, i64 n,'
        " int mode, double s, int vec, int grid, int block) {\n"
        "    switch (kernel) {\n        " + "\n        ".join(sign)
        + "\n    }\n    return 1;\n}\n"
        'extern "C" int host_apply_packed_mask(int kernel, const void* x, const u8* packed,'
        " void* y, i64 n, int mode, double s, int vec, int grid, int block) {\n"
        "    switch (kernel) {\n        " + "\n        ".join(apply)
        + "\n    }\n    return 1;\n}\n")


_ASM = re.compile(r'asm\(\s*"((?:[^"\\]|\\.)*)"\s*:\s*"=\w"\((\w+)\)\s*:\s*'
                  r'((?:"\w"\(\w+\)\s*,?\s*)+)\)')


def host_source(text: str) -> str:
    """``text`` with each inline PTX statement ``asm("ptx" : "=f"(out) : "f"(a), ...)`` made a
    call ``host_ptx("ptx", out, a, ...)`` of its host twin; a statement not in :data:`PTX`
    (or of another form) raises."""
    def call(m: re.Match) -> str:
        ptx, out, inputs = m.groups()
        if ptx not in PTX:
            raise ValueError(f"no host twin for the PTX statement {ptx!r}: add one")
        args = re.findall(r'"\w"\((\w+)\)', inputs)
        return f'host_ptx("{ptx}", {", ".join([out, *args])})'

    text = _ASM.sub(call, text)
    if re.search(r"\basm\b", text):
        raise ValueError("an asm statement the host build cannot translate")
    return text


_ENTRIES = {"quantize.cu": _quantize_entries, "mask.cu": _mask_entries}


def compiler() -> str | None:
    """The C++ compiler the host build uses, if there is one."""
    return shutil.which("g++") or shutil.which("clang++")


_BUILDS: list[tempfile.TemporaryDirectory] = []  # removed when the process exits


@functools.cache
def library(filename: str, defines: tuple[str, ...] = ()) -> ctypes.CDLL:
    """``cuda/<filename>`` built for the host with ``defines`` (``NAME=VALUE``, the sources'
    compile-time settings; once per process each)."""
    cxx = compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler (g++ or clang++) on PATH")
    _BUILDS.append(tempfile.TemporaryDirectory(prefix="gnnact_host_kernels_"))
    folder = Path(_BUILDS[-1].name)
    source = folder / f"{Path(filename).stem}_host.cpp"
    source.write_text(_PRELUDE + host_source(kernel_source(filename)) + _LAUNCHER
                      + _ENTRIES[filename]())
    lib = folder / f"{Path(filename).stem}_host.so"
    result = subprocess.run(
        [cxx, "-std=c++20", "-O1", "-ffp-contract=off", "-frounding-math", "-fPIC", "-shared",
         "-pthread", "-w", *(f"-D{d}" for d in defines), "-o", str(lib), str(source)],
        capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"host build of cuda/{filename} failed:\n{result.stderr[-4000:]}")
    return ctypes.CDLL(str(lib))


def quantize_groups(x: Tensor, bits: int, group_size: int, *, seed: int | None = None,
                    noise: Tensor | None = None, vec: bool, grid: int | None = None,
                    defines: tuple[str, ...] = ()) -> tuple[Tensor, Tensor, Tensor]:
    """The kernel's ``(codes, scales, zeros)`` for the CPU tensor ``x``, launched as
    :func:`gnnact.kernels.quantize.quantize_groups` launches it but with ``vec`` and ``grid``
    chosen by the caller (the grid-stride loops cover any grid)."""
    n = x.numel()
    num_groups = -(-n // group_size)
    bytes_per_group = packed_code_bytes(group_size, bits)
    codes = torch.full((num_groups, bytes_per_group), 0xAB, dtype=torch.uint8)
    scales = torch.empty(num_groups, dtype=torch.float32)
    zeros = torch.empty(num_groups, dtype=torch.float32)
    s0, s1 = split_seed(seed or 0)
    launch("quantize.cu", f"quantize_{_dtype_name(x.dtype)}_{bits}", x.device,
           grid or _group_grid(num_groups), _THREADS,
           (device_ptr(x), device_ptr(noise), device_ptr(codes), device_ptr(scales),
            device_ptr(zeros), np.int64(n), np.int64(group_size), np.int64(num_groups),
            np.int64(bytes_per_group), np.uint32(s0), np.uint32(s1), np.int32(vec)), defines)
    return codes, scales, zeros


def round_hashed(v: Tensor, g: Tensor, bits: int, zero: float, inv: float,
                 defines: tuple[str, ...] = ()) -> Tensor:
    """The codes ``quantize.cu`` rounds the values ``v`` (float32) of a finite group with
    ``zero`` and ``inv`` to, element ``i`` with the hash ``g[i // 2]`` of its pair (int64
    holding 32-bit words) as the seeded kernels do: ``round_hashed`` on ``hashed_noise``, the
    byte of its word that ``packed_codes`` takes for the code (``HASHED_CODE_AT``)."""
    values = np.ascontiguousarray(v.numpy(), dtype=np.float32)
    words = np.ascontiguousarray(g.numpy(), dtype=np.uint32)
    out = np.zeros(values.size, dtype=np.uint32)
    assert library("quantize.cu", defines).host_round_hashed(
        ctypes.c_int(bits), ctypes.c_void_p(values.ctypes.data),
        ctypes.c_void_p(words.ctypes.data), ctypes.c_int64(values.size), ctypes.c_float(zero),
        ctypes.c_float(inv), ctypes.c_void_p(out.ctypes.data)) == 0
    return torch.from_numpy(out.astype(np.int64))


def dequantize_groups(codes: Tensor, scales: Tensor, zeros: Tensor, bits: int, group_size: int,
                      numel: int, dtype: torch.dtype, *, vec: bool, out: Tensor | None = None,
                      grid: int | None = None, defines: tuple[str, ...] = ()) -> Tensor:
    """The kernel's restored values (into ``out``, a flat CPU tensor, when given)."""
    num_groups, bytes_per_group = codes.shape
    out = torch.full((numel,), float("nan"), dtype=dtype) if out is None else out
    launch("quantize.cu", f"dequantize_{_dtype_name(dtype)}_{bits}", codes.device,
           grid or _group_grid(num_groups), _THREADS,
           (device_ptr(codes), device_ptr(scales), device_ptr(zeros), device_ptr(out),
            np.int64(numel), np.int64(group_size), np.int64(num_groups),
            np.int64(bytes_per_group), np.int32(vec)), defines)
    return out


def sign_mask(x: Tensor, out: Tensor, mode: int, s: float, *, vec: bool, grid: int) -> Tensor:
    """The kernel's packed ``[x > 0]``, with the mode's output written into ``out`` (which may
    be ``x``), on ``grid`` blocks."""
    n = x.numel()
    data = torch.full(((n + 7) // 8,), 0xAB, dtype=torch.uint8)
    launch("mask.cu", f"sign_mask_{_dtype_name(x.dtype)}", x.device, grid, _THREADS,
           (device_ptr(x), device_ptr(out), device_ptr(data), np.int64(n), np.int32(mode),
            np.float64(s), np.int32(vec)))
    return data


def apply_packed_mask(x: Tensor, data: Tensor, out: Tensor, mode: int, s: float, *,
                      vec: bool, grid: int) -> Tensor:
    """The kernel's ``out`` for ``x`` and the packed mask ``data``, on ``grid`` blocks."""
    launch("mask.cu", f"apply_packed_mask_{_dtype_name(x.dtype)}", x.device, grid, _THREADS,
           (device_ptr(x), device_ptr(data), device_ptr(out), np.int64(x.numel()),
            np.int32(mode), np.float64(s), np.int32(vec)))
    return out


_C_ARGS = {np.uint64: ctypes.c_void_p, np.int64: ctypes.c_int64, np.uint32: ctypes.c_uint32,
           np.int32: ctypes.c_int, np.float64: ctypes.c_double, np.float32: ctypes.c_float}


def launch(filename: str, name: str, device: torch.device, grid: int, block: int,
           args: tuple, defines: tuple[str, ...] = ()) -> None:
    """A stand-in for :func:`gnnact.kernels._cupy.launch` that runs the kernel ``name`` on the
    host with the launcher's own arguments (NumPy scalars, pointers as ``numpy.uint64``), so
    that the Python launchers of :mod:`gnnact.kernels.quantize` run end to end on CPU
    tensors: their grids, argument order and types, and the choice of vectors."""
    assert device.type == "cpu", f"host kernels take CPU tensors, got {device}"
    values = [_C_ARGS[type(a)](int(a) if isinstance(a, np.uint64) else a.item()) for a in args]
    lib, launch_shape = library(filename, defines), (ctypes.c_int(grid), ctypes.c_int(block))
    op, _, rest = name.partition("_")
    if name in ("pack_mask", "unpack_mask", "dropout_keep_bits"):
        getattr(lib, f"host_{name}")(*values, *launch_shape)
        return
    names = list(_DTYPE_NAMES.values())  # a dtype's code in the generated entry points
    if op in ("quantize", "dequantize"):
        dtype_name, bits = rest.rsplit("_", 1)
        code = names.index(dtype_name) * 16 + int(bits)
        entry = lib.host_quantize if op == "quantize" else lib.host_dequantize
    else:  # sign_mask_<dtype>, apply_packed_mask_<dtype>
        kernel, dtype_name = name.rsplit("_", 1)
        code = names.index(dtype_name)
        entry = getattr(lib, f"host_{kernel}")
    assert entry(ctypes.c_int(code), *values, *launch_shape) == 0, f"no host kernel {name}"
