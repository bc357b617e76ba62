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

// Elements [at, at + count) of x, count in 1..8: one or more 16-byte loads when `vec` (x + at
// is then 16-byte aligned) and the octet is whole.
template <typename T>
__device__ __forceinline__ void load_elements(const T* x, i64 at, int count, bool vec,
                                              T (&v)[8]) {
    if (vec && count == 8) {
        load8(x + at, v);
    } else {
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            if (k < count) v[k] = x[at + k];
        }
    }
}

template <typename T>
__device__ __forceinline__ void store_elements(T* y, i64 at, int count, bool vec,
                                               const T (&v)[8]) {
    if (vec && count == 8) {
        store8(y + at, v);
    } else {
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            if (k < count) y[at + k] = v[k];
        }
    }
}

// One thread per octet, 8 consecutive elements, which is one byte of the packed mask: it
// tests and writes its elements (16-byte loads and stores where the launcher found x and y
// aligned, `vec`) and stores their byte, so no two threads share a byte and no ballot is
// needed; a warp stores 32 consecutive bytes. y may be x (in place): each thread reads its
// octet before it writes it.
template <class D>
__device__ __forceinline__ void sign_mask_impl(const typename D::T* x, typename D::T* y,
                                               u8* __restrict__ packed, i64 n, int mode,
                                               double s, int vec_flag) {
    typedef typename D::Op Op;
    const bool vec = vec_flag != 0;
    const i64 octets = (n + 7) >> 3;
    const i64 stride = (i64)gridDim.x * blockDim.x;
    const Op so = op_scale<Op>(s);
    for (i64 o = (i64)blockIdx.x * blockDim.x + threadIdx.x; o < octets; o += stride) {
        const i64 at = o << 3;
        const int count = (int)min((i64)8, n - at);
        typename D::T v[8];
        load_elements(x, at, count, vec, v);
        u32 byte = 0;  // bits past count (the last byte's) stay 0
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            if (k < count) {
                const bool m = positive(D::op_load(v[k]));
                byte |= (u32)m << k;
                v[k] = combine<D>(v[k], m, mode, so);
            }
        }
        store_elements(y, at, count, vec, v);
        packed[o] = (u8)byte;
    }
}

// One thread per octet: it reads its mask byte once and its 8 elements (16-byte accesses
// where `vec`).
template <class D>
__device__ __forceinline__ void apply_packed_mask_impl(const typename D::T* x,
                                                       const u8* __restrict__ packed,
                                                       typename D::T* y, i64 n, int mode,
                                                       double s, int vec_flag) {
    const bool vec = vec_flag != 0;
    const i64 octets = (n + 7) >> 3;
    const i64 stride = (i64)gridDim.x * blockDim.x;
    const typename D::Op so = op_scale<typename D::Op>(s);
    for (i64 o = (i64)blockIdx.x * blockDim.x + threadIdx.x; o < octets; o += stride) {
        const i64 at = o << 3;
        const int count = (int)min((i64)8, n - at);
        const u32 byte = packed[o];
        typename D::T v[8];
        load_elements(x, at, count, vec, v);
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            if (k < count) v[k] = combine<D>(v[k], (byte >> k) & 1u, mode, so);
        }
        store_elements(y, at, count, vec, v);
    }
}

// ---- extern "C" entry points: sign_mask_<dtype>, apply_packed_mask_<dtype> ----
#define GNNACT_MASK_OPS(NAME, D)                                                              \
    extern "C" __global__ void sign_mask_##NAME(const D::T* x, D::T* y,                     \
                                                u8* __restrict__ packed, i64 n, int mode,    \
                                                double s, int vec) {                         \
        sign_mask_impl<D>(x, y, packed, n, mode, s, vec);                                    \
    }                                                                                        \
    extern "C" __global__ void apply_packed_mask_##NAME(const D::T* x,                      \
                                                        const u8* __restrict__ packed,       \
                                                        D::T* y, i64 n, int mode, double s,  \
                                                        int vec) {                           \
        apply_packed_mask_impl<D>(x, packed, y, n, mode, s, vec);                            \
    }

GNNACT_MASK_OPS(f32, F32)
GNNACT_MASK_OPS(f64, F64)
GNNACT_MASK_OPS(f16, F16)
GNNACT_MASK_OPS(bf16, BF16)
