// gnnact: fused per-group stochastic quantization and dequantization.
//
// The packed format and the arithmetic are defined by gnnact/quant/reference.py; this file
// reproduces it bit for bit. Compiled by CuPy (NVRTC) from gnnact/kernels/quantize.py.
//
// One warp owns one group of `group_size` consecutive elements:
//   1. range reduce: lanes stride over the group, keep min/max and a non-finite flag, and
//      combine with warp shuffles (no shared memory, no __syncthreads);
//   2. round and pack: 32 consecutive elements per pass, one per lane (coalesced loads); the
//      lanes that share bytes (8/BITS of them for 1, 2, 4 and 8 bits; 8 codes in BITS bytes
//      for 3, 5, 6 and 7) combine their codes with warp shuffles and one of them stores the
//      bytes, in the layout of the reference (gnnact/quant/reference.py: each group's
//      LSB-first bit stream, code j in bits [j BITS, (j + 1) BITS)). No two lanes (or groups)
//      write the same byte. The second read of the group hits L1/L2.
//   Dequantization reads code j from that stream, one element per lane per pass, so its
//   stores coalesce at every width.
// Every float operation is an explicit round-to-nearest intrinsic so that NVRTC cannot
// contract a multiply and an add into an FMA, which would round differently from torch.
// CuPy compiles with -ftz=true, so denormal inputs (|x| < 1.2e-38) are flushed to zero here.
//
// No system headers: half and bfloat16 are handled as raw 16-bit words converted with PTX cvt
// (dtypes.cuh), which avoids NVRTC's fragile cuda_fp16.h.

#include "dtypes.cuh"

// ---- counter-based noise, identical to gnnact/quant/rng.py ----
__device__ __forceinline__ u32 mix32(u32 x) {
    x ^= x >> 16;
    x *= 0x21f0aaadu;
    x ^= x >> 15;
    x *= 0x735a2d97u;
    x ^= x >> 15;
    return x;
}

__device__ __forceinline__ float hash_uniform(u64 i, u32 s0, u32 s1) {
    u32 h = mix32(mix32(((u32)i) ^ s0) ^ ((u32)(i >> 32)) ^ s1);
    return (float)(h >> 8) * 5.9604644775390625e-08f;  // 2^-24: exact
}

__device__ __forceinline__ float warp_min(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fminf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// The code of element idx: q = floor(u) + [r < u - floor(u)], u = (v - zero) * inv. The
// fractional part is exact (Sterbenz), so no rounding of u + r can push a code past its
// neighbour; fmaxf(NaN, 0) = 0 turns a NaN code (non-finite group) into 0.
template <typename L>
__device__ __forceinline__ u32 round_code(const typename L::T* __restrict__ x,
                                          const float* __restrict__ noise, i64 idx, float zero,
                                          float inv, float levels, u32 s0, u32 s1) {
    const float v = L::load(x[idx]);
    const float r = noise != nullptr ? noise[idx] : hash_uniform((u64)idx, s0, s1);
    const float u = __fmul_rn(__fsub_rn(v, zero), inv);
    const float fl = floorf(u);
    const float up = r < __fsub_rn(u, fl) ? 1.0f : 0.0f;
    return (u32)fminf(fmaxf(__fadd_rn(fl, up), 0.0f), levels);
}

template <typename L, int BITS>
__device__ __forceinline__ void quantize_impl(
    const typename L::T* __restrict__ x, const float* __restrict__ noise, u8* __restrict__ codes,
    float* __restrict__ scales, float* __restrict__ zeros, i64 n, i64 group_size,
    i64 num_groups, i64 bytes_per_group, u32 s0, u32 s1) {
    const float levels = (float)((1 << BITS) - 1);
    const int lane = threadIdx.x & 31;
    const i64 warps = (i64)gridDim.x * (blockDim.x >> 5);
    for (i64 g = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); g < num_groups;
         g += warps) {
        const i64 start = g * group_size;
        const i64 len = min(group_size, n - start);

        float lo = __int_as_float(0x7f800000);   // +inf
        float hi = __int_as_float(0xff800000);   // -inf
        int finite = 1;
        for (i64 j = lane; j < len; j += 32) {
            const float v = L::load(x[start + j]);
            lo = fminf(lo, v);
            hi = fmaxf(hi, v);
            finite &= isfinite(v) ? 1 : 0;
        }
        lo = warp_min(lo);
        hi = warp_max(hi);
        finite = __all_sync(0xffffffffu, finite);

        const float range = __fsub_rn(hi, lo);
        float scale, zero, inv;
        if (!finite || !isfinite(range)) {
            // NaN/Inf in the group, or a range that overflows: the whole group reads back as
            // NaN (zero = NaN also forces every code below to 0).
            scale = __int_as_float(0x7fc00000);
            zero = scale;
            inv = 0.0f;
        } else {
            scale = __fdiv_rn(range, levels);
            zero = lo;
            inv = range > 0.0f ? __fdiv_rn(levels, range) : 0.0f;
        }
        if (lane == 0) {
            scales[g] = scale;
            zeros[g] = zero;
        }

        // Round and pack, 32 consecutive elements per pass, one per lane: loads coalesce. A
        // unit is the codes that fill whole bytes together (one byte of 8/BITS codes for the
        // byte-aligned widths, BITS bytes of 8 codes for the others); the lanes of a unit OR
        // their shifted codes together through shuffles, and its first lane stores the bytes.
        // Every lane runs every pass (codes past len are 0), so the shuffles see all 32.
        constexpr int UNIT = (8 % BITS == 0) ? 8 / BITS : 8;
        u8* out = codes + g * bytes_per_group;
        for (i64 base = 0; base < len; base += 32) {
            const i64 j = base + lane;
            const u32 code =
                j < len ? round_code<L>(x, noise, start + j, zero, inv, levels, s0, s1) : 0u;
            u64 word = (u64)code << ((lane % UNIT) * BITS);
#pragma unroll
            for (int d = 1; d < UNIT; d <<= 1) {
                const u32 lo = __shfl_xor_sync(0xffffffffu, (u32)word, d);
                const u32 hi = __shfl_xor_sync(0xffffffffu, (u32)(word >> 32), d);
                word |= ((u64)hi << 32) | (u64)lo;
            }
            if (lane % UNIT == 0 && j < len) {
                const i64 unit = j / UNIT;
                if (8 % BITS == 0) {
                    out[unit] = (u8)word;
                } else {
#pragma unroll
                    for (int k = 0; k < BITS; ++k) {
                        const i64 b = unit * BITS + k;
                        if (b < bytes_per_group) out[b] = (u8)(word >> (8 * k));
                    }
                }
            }
        }
        // Bytes past the last code (a short last group) are zero bytes, as in the reference.
        const i64 used = (8 % BITS == 0) ? (len + UNIT - 1) / UNIT : ((len + 7) / 8) * BITS;
        for (i64 b = used + lane; b < bytes_per_group; b += 32) out[b] = 0;
    }
}

template <typename L, int BITS>
__device__ __forceinline__ void dequantize_impl(
    const u8* __restrict__ codes, const float* __restrict__ scales,
    const float* __restrict__ zeros, typename L::T* __restrict__ out, i64 n, i64 group_size,
    i64 num_groups, i64 bytes_per_group) {
    const u32 mask = (1u << BITS) - 1u;
    const int lane = threadIdx.x & 31;
    const i64 warps = (i64)gridDim.x * (blockDim.x >> 5);
    for (i64 g = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); g < num_groups;
         g += warps) {
        const i64 start = g * group_size;
        const i64 len = min(group_size, n - start);
        const float scale = scales[g];
        const float zero = zeros[g];
        const u8* in = codes + g * bytes_per_group;
        // Element j's code is bits [j BITS, (j + 1) BITS) of the group's LSB-first stream, at
        // every width: one element per lane per pass, so the stores coalesce, and the lanes
        // read neighbouring bytes (a code of 3, 5, 6 or 7 bits may straddle two).
#pragma unroll 4
        for (i64 j = lane; j < len; j += 32) {
            const i64 bit = j * BITS;
            const int shift = (int)(bit & 7);
            u32 v = (u32)in[bit >> 3] >> shift;
            if (shift + BITS > 8) v |= (u32)in[(bit >> 3) + 1] << (8 - shift);
            const float q = (float)(v & mask);
            out[start + j] = L::store(__fadd_rn(__fmul_rn(q, scale), zero));
        }
    }
}

// ---- extern "C" entry points: quantize_<dtype>_<bits>, dequantize_<dtype>_<bits> ----
#define GNNACT_DEFINE(NAME, L, BITS)                                                          \
    extern "C" __global__ void quantize_##NAME##_##BITS(                                     \
        const L::T* __restrict__ x, const float* __restrict__ noise, u8* __restrict__ codes, \
        float* __restrict__ scales, float* __restrict__ zeros, i64 n, i64 group_size,        \
        i64 num_groups, i64 bytes_per_group, u32 s0, u32 s1) {                               \
        quantize_impl<L, BITS>(x, noise, codes, scales, zeros, n, group_size, num_groups,    \
                               bytes_per_group, s0, s1);                                     \
    }                                                                                        \
    extern "C" __global__ void dequantize_##NAME##_##BITS(                                   \
        const u8* __restrict__ codes, const float* __restrict__ scales,                      \
        const float* __restrict__ zeros, L::T* __restrict__ out, i64 n, i64 group_size,      \
        i64 num_groups, i64 bytes_per_group) {                                               \
        dequantize_impl<L, BITS>(codes, scales, zeros, out, n, group_size, num_groups,       \
                                 bytes_per_group);                                           \
    }

#define GNNACT_DEFINE_ALL_BITS(NAME, L) \
    GNNACT_DEFINE(NAME, L, 1)           \
    GNNACT_DEFINE(NAME, L, 2)           \
    GNNACT_DEFINE(NAME, L, 3)           \
    GNNACT_DEFINE(NAME, L, 4)           \
    GNNACT_DEFINE(NAME, L, 5)           \
    GNNACT_DEFINE(NAME, L, 6)           \
    GNNACT_DEFINE(NAME, L, 7)           \
    GNNACT_DEFINE(NAME, L, 8)

GNNACT_DEFINE_ALL_BITS(f32, F32)
GNNACT_DEFINE_ALL_BITS(f64, F64)
GNNACT_DEFINE_ALL_BITS(f16, F16)
GNNACT_DEFINE_ALL_BITS(bf16, BF16)
