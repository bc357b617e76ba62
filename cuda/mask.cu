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

// ---- dropout_keep_bits: F.dropout's keep-mask on a GPU, drawn straight into packed bits ----
// gnnact/quant/philox.py, bit for bit: aten's fused_dropout_kernel_vec (4 values a thread and
// draw) takes curand's Philox4x32-10 output for the counter (ctr0 + pass, thread) under the
// key (k0, k1); value e is lane e % 4 of the draw of thread (e % stride) / 4 in pass
// e / stride (stride = 4 x the launch's threads), kept where curand's uniform
// fma(float(r), 2^-32, 2^-33) < keep. One thread per output byte: two draws, 8 values.
__device__ __forceinline__ void philox_round(u32& c0, u32& c1, u32& c2, u32& c3, u32 k0,
                                             u32 k1) {
    const u32 hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
    const u32 hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
}

extern "C" __global__ void dropout_keep_bits(u8* __restrict__ out, i64 n, i64 nbytes, u32 k0,
                                             u32 k1, i64 ctr0, i64 stride, float keep) {
    const i64 step = (i64)gridDim.x * blockDim.x;
    for (i64 b = (i64)blockIdx.x * blockDim.x + threadIdx.x; b < nbytes; b += step) {
        unsigned int packed = 0;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const i64 first = b * 8 + half * 4;
            if (first >= n) break;
            const u64 ctr = (u64)(ctr0 + first / stride), thread = (u64)((first % stride) / 4);
            u32 r[4] = {(u32)ctr, (u32)(ctr >> 32), (u32)thread, (u32)(thread >> 32)};
            u32 key0 = k0, key1 = k1;
#pragma unroll
            for (int round = 0; round < 10; ++round) {
                if (round > 0) {
                    key0 += 0x9E3779B9u;
                    key1 += 0xBB67AE85u;
                }
                philox_round(r[0], r[1], r[2], r[3], key0, key1);
            }
#pragma unroll
            for (int lane = 0; lane < 4; ++lane) {
                // In PTX without .ftz, as the mask ops below (never subnormal here, but
                // tools/check_kernels.py holds this file to it); u and keep are positive,
                // so their bit patterns order as they do.
                const float word = __uint2float_rn(r[lane]), scale = 2.3283064365386963e-10f,
                            centre = 1.1641532182693481e-10f;  // 2^-32, 2^-33
                float u;
                asm("fma.rn.f32 %0, %1, %2, %3;" : "=f"(u) : "f"(word), "f"(scale), "f"(centre));
                if (first + lane < n && __float_as_uint(u) < __float_as_uint(keep))
                    packed |= 1u << (half * 4 + lane);
            }
        }
        out[b] = (u8)packed;
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
