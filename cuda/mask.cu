// gnnact: 1-bit masks (ReLU / LeakyReLU sign, dropout keep mask), and the mask ops built on
// them in one pass each.
//
// Layout (gnnact/quant/reference.py, pack_mask_bits): element i of the flat mask is bit i % 8
// of byte i / 8; unused bits of the last byte are 0. torch.bool stores one byte per element,
// so packing keeps 8x less. Compiled by CuPy (NVRTC) from gnnact/kernels/quantize.py.

#include "dtypes.cuh"

// One thread per output byte: reads 8 consecutive bool bytes (a warp reads 256 contiguous
// bytes) and writes one byte, so no atomics are needed.
extern "C" __global__ void pack_mask(const u8* __restrict__ mask, u8* __restrict__ out, i64 n,
                                     i64 nbytes) {
    const i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 b = (i64)blockIdx.x * blockDim.x + threadIdx.x; b < nbytes; b += stride) {
        const i64 base = b * 8;
        unsigned int packed = 0;
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            if (base + k < n && mask[base + k] != 0) packed |= 1u << k;
        }
        out[b] = (u8)packed;
    }
}

// One thread per element: bool output bytes are 0 or 1.
extern "C" __global__ void unpack_mask(const u8* __restrict__ packed, u8* __restrict__ out,
                                       i64 n) {
    const i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        out[i] = (packed[i >> 3] >> (i & 7)) & 1;
    }
}

// ---- mask ops: gnnact.quant.reference.sign_mask / apply_packed_mask, bit for bit ----
// How a value v meets its mask bit m (gnnact.quant.reference.MASK_*), each the branch
// PyTorch's own op takes, computed in PyTorch's opmath type (D::Op) with one rounding:
//   MASK_MUL     v * (m ? s : 0)   ReLU forward (s = 1), dropout forward and backward
//   MASK_ZERO    m ? v : +0        ReLU backward
//   MASK_SELECT  m ? v : v * s     LeakyReLU forward and backward
// CuPy compiles with -ftz=true, which flushes subnormal float inputs and results of float
// arithmetic and comparisons to zero; PyTorch's kernels keep them. The float product and the
// sign test are therefore written as PTX without .ftz (ptxas takes inline PTX as written), so
// a subnormal is multiplied, kept and found positive as in PyTorch. tools/check_kernels.py
// fails on any .ftz instruction in this file's PTX.
#define MASK_MUL 0
#define MASK_ZERO 1
#define MASK_SELECT 2

__device__ __forceinline__ float mul_rn(float a, float b) {
    float r;
    asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }
// v > 0: false for NaN, -0.0 and +0.0, true for a positive subnormal.
__device__ __forceinline__ bool positive(float v) {
    u32 p;
    asm("{\n\t.reg .pred q;\n\tsetp.gt.f32 q, %1, 0f00000000;\n\tselp.u32 %0, 1, 0, q;\n\t}"
        : "=r"(p) : "f"(v));
    return p != 0;
}
__device__ __forceinline__ bool positive(double v) { return v > 0.0; }
// The scale s (a double from the host) in the op's type, rounded to nearest; and s == 1.
template <class Op> __device__ __forceinline__ Op op_scale(double s);
template <> __device__ __forceinline__ float op_scale<float>(double s) {
    float r;
    asm("cvt.rn.f32.f64 %0, %1;" : "=f"(r) : "d"(s));
    return r;
}
template <> __device__ __forceinline__ double op_scale<double>(double s) { return s; }
__device__ __forceinline__ bool is_one(float s) { return __float_as_uint(s) == 0x3f800000u; }
__device__ __forceinline__ bool is_one(double s) { return s == 1.0; }

template <class D>
__device__ __forceinline__ typename D::T combine(typename D::T v, bool m, int mode,
                                                 typename D::Op s) {
    typedef typename D::Op Op;
    if (mode == MASK_ZERO) return m ? v : D::op_store((Op)0);
    if (mode == MASK_SELECT) return m ? v : D::op_store(mul_rn(D::op_load(v), s));
    if (m && is_one(s)) return v;
    return D::op_store(mul_rn(D::op_load(v), m ? s : (Op)0));
}

// One warp per 32 consecutive elements at a time (coalesced loads and stores): each lane
// tests and writes its element, __ballot_sync gathers the 32 tests in lane order, which is
// the packed layout (the word's little-endian bytes), and lanes 0-3 store its bytes. y may be
// x (in place): each element is read before the same lane writes it.
template <class D>
__device__ __forceinline__ void sign_mask_impl(const typename D::T* x, typename D::T* y,
                                               u8* __restrict__ packed, i64 n, int mode,
                                               double s) {
    typedef typename D::Op Op;
    const int lane = threadIdx.x & 31;
    const i64 warp = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const i64 warps = ((i64)gridDim.x * blockDim.x) >> 5;
    const i64 nbytes = (n + 7) >> 3;
    const Op so = op_scale<Op>(s);
    for (i64 base = warp << 5; base < n; base += warps << 5) {
        const i64 i = base + lane;
        bool m = false;
        if (i < n) {
            const typename D::T v = x[i];
            m = positive(D::op_load(v));
            y[i] = combine<D>(v, m, mode, so);
        }
        const u32 word = __ballot_sync(0xffffffffu, m);
        const i64 b = (base >> 3) + lane;
        if (lane < 4 && b < nbytes) packed[b] = (u8)(word >> (8 * lane));
    }
}

// One thread per element; the 8 lanes that share a mask byte read it once (broadcast).
template <class D>
__device__ __forceinline__ void apply_packed_mask_impl(const typename D::T* x,
                                                       const u8* __restrict__ packed,
                                                       typename D::T* y, i64 n, int mode,
                                                       double s) {
    const i64 stride = (i64)gridDim.x * blockDim.x;
    const typename D::Op so = op_scale<typename D::Op>(s);
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const bool m = (packed[i >> 3] >> (i & 7)) & 1;
        y[i] = combine<D>(x[i], m, mode, so);
    }
}

// ---- extern "C" entry points: sign_mask_<dtype>, apply_packed_mask_<dtype> ----
#define GNNACT_MASK_OPS(NAME, D)                                                              \
    extern "C" __global__ void sign_mask_##NAME(const D::T* x, D::T* y,                     \
                                                u8* __restrict__ packed, i64 n, int mode,    \
                                                double s) {                                  \
        sign_mask_impl<D>(x, y, packed, n, mode, s);                                         \
    }                                                                                        \
    extern "C" __global__ void apply_packed_mask_##NAME(const D::T* x,                      \
                                                        const u8* __restrict__ packed,       \
                                                        D::T* y, i64 n, int mode, double s) { \
        apply_packed_mask_impl<D>(x, packed, y, n, mode, s);                                 \
    }

GNNACT_MASK_OPS(f32, F32)
GNNACT_MASK_OPS(f64, F64)
GNNACT_MASK_OPS(f16, F16)
GNNACT_MASK_OPS(bf16, BF16)
