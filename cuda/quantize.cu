// gnnact: fused per-group stochastic quantization and dequantization.
//
// The packed format and the arithmetic are defined by gnnact/quant/reference.py; this file
// reproduces it bit for bit. Compiled by CuPy (NVRTC) from gnnact/kernels/quantize.py.
//
// A segment of a warp's lanes (16 to quantize, the whole warp to dequantize: OP_LANES, each
// op's shape below) owns one group of `group_size` consecutive elements, and each lane handles
// octets: 8 consecutive elements of the group. Code j sits at bits [j BITS, (j + 1) BITS) of the
// group's LSB-first bit stream (the reference's layout), so octet o owns exactly the BITS
// bytes [o BITS, (o + 1) BITS) at every width 1-8: no two lanes share a byte, and no shuffles
// are needed to pack.
//   quantize: a lane loads its octets (16-byte vector loads where the launcher found the
//     buffers aligned, `vec`), keeps min/max (the maximum NaN once a value is; float16 and
//     bfloat16: two values an instruction on the loaded words, Range), and the warp combines
//     them with shuffles (no shared memory, no __syncthreads). Noise: one hash per pair of
//     elements, an octet's 4 sharing their inner mix. Seeded rounding is integer arithmetic
//     on a float's bits (round_hashed): no conversion instruction. Groups of up to
//     8 * OP_LANES * OP_CACHED elements (the default 512) stay in registers for the rounding pass;
//     larger ones are read again (L1/L2). Each octet's 8 codes are stored as one BITS-byte
//     word (a single store for 1, 2, 4 and 8 bits with `vec`), or, in whole groups at the
//     widths WORD_STORES names, as aligned 4-byte words gathered across lanes by shuffles.
//     Groups of the default size read by vectors, all of them but a short last one, take a
//     path compiled for that size (quantize_group<..., Whole = true>): no length tests.
//   dequantize: a lane reads an octet's BITS code bytes (one load for 1, 2, 4 and 8 bits with
//     `vec`; a whole group's 3, 5, 6 and 7-bit codes from a copy in shared memory) and writes
//     16-byte chunks, a warp's store 512 consecutive bytes (dequantize_impl).
// Compile-time settings (LANES, CACHED, MIN_BLOCKS, one op's QUANTIZE_/DEQUANTIZE_ LANES,
// CACHED and MIN_BLOCKS, QUANTIZE_HALF_MIN_BLOCKS, WORD_STORES and HALF_WORD_STORES; the
// launcher's WAVES; defaults below, each beside the tuning rows that chose it) change speed,
// never results: benchmarks/tune_kernels.py times the builds side by side. They are the
// launch shape and, per width and element size, the store path: one code path for each case.
// The variants that lost their timings (ALU_CONVERSIONS, FLOOR_ROUNDING, MUL_SHIFTS,
// NOISE_FIRST, PREFETCH, WIDE_CODE_LOADS, the octet stores and global-memory code loads of
// CHUNK_STORES=0 and SHARED_CODES=0; last in 6570339) and CODES_FIRST (the dequantizer by
// octets, a lane loading its group's code words before restoring any: 2 points of a copy
// faster for bfloat16 at 4 bits on an H200, 92.6 % against 90.5 %, slower at every other width
// and for float32; last in bd304d0) were removed; git history keeps them, their rows stay in
// benchmarks/results/tune_kernels.jsonl.
// A lane has 32 bytes of float32 in flight per octet, not 4.
// Every float operation is an explicit round-to-nearest intrinsic so that NVRTC cannot
// contract a multiply and an add into an FMA, which would round differently from torch.
// CuPy compiles with -ftz=true, so denormal inputs (|x| < 1.2e-38) are flushed to zero here.
//
// No system headers: half and bfloat16 are handled as raw 16-bit words converted with PTX cvt
// (dtypes.cuh), which avoids NVRTC's fragile cuda_fp16.h.

#include "dtypes.cuh"

// ---- counter-based noise, identical to gnnact/quant/rng.py ----
// Element i takes 16 bits of the hash g of its pair j = i / 2, which mixes the pair's octet
// o = j / 4 (64 bits, o_lo and o_hi) and its place k = j % 4 in it:
//   g = mix32(mix32(o_lo ^ s0) ^ o_hi ^ s1 ^ phi_k),   phi_k = k 0x9e3779b9 mod 2^32,
//   r_i = (65535 - g_i) 2^-16,   g_i = (g >> 16 (i & 1)) & 0xffff.
// An octet's 4 pairs share the inner mix32 (octet_hashes): the noise of 8 elements for 4 outer
// and 1 inner mix32, which are most of the quantize kernel's arithmetic.
// mix32(x) = mix32_rest(x ^ (x >> 16)): octet_hashes shares the first step between pairs.
__device__ __forceinline__ u32 mix32_rest(u32 x) {
    x *= 0x21f0aaadu;
    x ^= x >> 15;
    x *= 0x735a2d97u;
    x ^= x >> 15;
    return x;
}

__device__ __forceinline__ u32 mix32(u32 x) { return mix32_rest(x ^ (x >> 16)); }

// phi_k: what the place k of a pair in its octet adds to the outer mix32's input.
__device__ __forceinline__ constexpr u32 pair_phi(u32 k) { return k * 0x9e3779b9u; }

// The inner part of octet o's hashes: mix32(o_lo ^ s0) ^ o_hi ^ s1.
__device__ __forceinline__ u32 octet_key(u64 o, u32 s0, u32 s1) {
    return mix32(((u32)o) ^ s0) ^ ((u32)(o >> 32)) ^ s1;
}

// g of pair j.
__device__ __forceinline__ u32 hash_pair(u64 j, u32 s0, u32 s1) {
    return mix32(octet_key(j >> 2, s0, s1) ^ pair_phi((u32)j & 3u));
}

// The integer word that holds an octet's 8 codes: 32 bits up to 4 bits a code (cheaper shifts
// and masks), 64 above.
template <bool Wide>
struct WordOf {
    typedef u32 T;
};
template <>
struct WordOf<true> {
    typedef u64 T;
};

// Each op's shape: the lanes that share a group (32, 16 or 8; a warp takes 32 / lanes groups
// at once, each lane lanes-strided octets of its own group) and the octets a lane keeps in
// registers (quantize: between the range and the rounding pass, so that a group of up to
// 8 lanes cached elements is read from memory once; dequantize: the code words it loads before
// restoring any, dequantize_impl). The defaults are the fastest shapes
// benchmarks/tune_kernels.py timed on an H200. A build's LANES and CACHED (and MIN_BLOCKS,
// below) set both ops' shape, QUANTIZE_LANES, DEQUANTIZE_CACHED and the like one op's. The
// results are the same.
#ifdef LANES
#define QUANTIZE_LANES LANES
#define DEQUANTIZE_LANES LANES
#endif
#ifdef CACHED
#define QUANTIZE_CACHED CACHED
#define DEQUANTIZE_CACHED CACHED
#endif
// Quantize 16 lanes and 4 octets a lane (a warp's range reductions, scale divisions and stores
// of scale and zero serve two groups at once; MIN_BLOCKS 3, below). Tuning rows:
// tune_kernels.jsonl, H200, 7116a3f "LANES=16,CACHED=4,MIN_BLOCKS=3" against 32 lanes and 2
// octets: 5-10 points of a copy faster at every width but 7 bits (float32 7 slower there);
// 0d248a9 "QUANTIZE_LANES=8,QUANTIZE_CACHED=8,QUANTIZE_MIN_BLOCKS=2" (4 groups a warp): within
// 1.7 points at 1, 2, 4 and 8 bits, 7-35 slower at the others.
#ifndef QUANTIZE_LANES
#define QUANTIZE_LANES 16
#endif
#ifndef QUANTIZE_CACHED
#define QUANTIZE_CACHED 4
#endif
// Dequantize 32 lanes and 2 octets a lane. Tuning rows: tune_kernels.jsonl, H200, 7116a3f
// "SHARED_CODES=1,CHUNK_STORES=1" (this shape; today's dequantizer, the fastest there) against
// "LANES=16,CACHED=4,MIN_BLOCKS=3" (octet stores: mixed, -9.5 to +9.9 points against the
// octet-store default); 80d87ec and e4ba981 "CACHED=1" and "CACHED=4": within 0.4 points of 2.
#ifndef DEQUANTIZE_LANES
#define DEQUANTIZE_LANES 32
#endif
#ifndef DEQUANTIZE_CACHED
#define DEQUANTIZE_CACHED 2
#endif
// The shape of the op whose code follows: the quantizer's up to quantize_impl, the
// dequantizer's after it (where these are defined again).
#define OP_LANES QUANTIZE_LANES
#define OP_CACHED QUANTIZE_CACHED
#define SEGMENTS (32 / OP_LANES)
// The group a lane's segment caches whole: 8 elements an octet, OP_CACHED octets a lane (512
// with either default shape).
#define WHOLE_GROUP (8 * OP_LANES * OP_CACHED)

// The minimum (fminf) and maximum (max_nan: NaN if a lane's is) over the OP_LANES lanes of a
// segment.
__device__ __forceinline__ float segment_min(float v) {
    for (int o = OP_LANES / 2; o > 0; o >>= 1) {
        v = fminf(v, __shfl_xor_sync(0xffffffffu, v, o));
    }
    return v;
}

__device__ __forceinline__ float segment_max(float v) {
    for (int o = OP_LANES / 2; o > 0; o >>= 1) {
        v = max_nan(v, __shfl_xor_sync(0xffffffffu, v, o));
    }
    return v;
}

// q = floor(u) + [r < u - floor(u)], u = (v - zero) * inv, for v of a finite group: then
// 0 <= u <= levels, as inv is levels / width rounded down (the reference's; to nearest, u could
// pass levels by a rounding), so q needs no clamp (the codes of a non-finite group are 0
// without rounding, quantize_group). The fractional part is exact (Sterbenz), so no rounding
// of u + r can push a code past its neighbour.
__device__ __forceinline__ u32 round_code(float v, float r, float zero, float inv) {
    const float u = __fmul_rn(__fsub_rn(v, zero), inv);
    const float fl = floorf(u);
    const float up = r < __fsub_rn(u, fl) ? 1.0f : 0.0f;
    const float q = __fadd_rn(fl, up);
    return (u32)q;
}

// Seeded noise is rounded in integers (round_hashed), not as round_code rounds given noise: r as
// a float, then floor, compare and convert would be three conversion instructions a value,
// which an SM issues at an eighth of the rate of an add.
// round_hashed<BITS> returns a word whose byte HASHED_CODE_AT / 8 is q (packed_codes).
#define HASHED_CODE_AT 16

// Hashed noise as round_hashed takes it: the bits of the float 2^23 + g_i (g_i = 65535 - m for
// r = m 2^-16: the 16 bits of the pair's hash g that element `half` takes). The low half in
// PTX: one LOP3, where ptxas makes two of its two constants.
__device__ __forceinline__ u32 hashed_noise(u32 g, int half) {
    if (half) return 0x4b000000u + (g >> 16);
    u32 d;
    asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(d) : "r"(g), "r"(0xffffu), "r"(0x4b000000u));
    return d;
}

// round_code's q for noise r = m 2^-16 (`word`: hashed_noise), with no conversion instruction
// below 8 bits. With U = u 2^16 and m' = 65535 - m, the reference's q = floor(u) +
// [m < 2^16 frac(u)] is floor(ceil(U + m') / 2^16): it rounds up exactly when
// ceil(U) >= 2^16 floor(u) + m + 1. As u <= levels (round_code), below 8 bits U + m' < 2^23,
// and one fma rounded upwards gives 2^23 + ceil(U + m') exactly (the floats in [2^23, 2^24)
// are the integers): q is bits 16-22 of its word, and bit 23 (the exponent's lowest) is 0.
// Nor is u clamped to levels: one instruction a value fewer. At 8 bits
// U + m' reaches 2^24 - 1, so the sum is formed without 2^23 and converted rounding up (a float
// rounded up keeps its ceiling): q is bits 16-23 of that integer. Either way byte 2 is q.
template <int BITS>
__device__ __forceinline__ u32 round_hashed(float v, u32 word, float zero, float inv) {
    const float u = __fmul_rn(__fsub_rn(v, zero), inv);
    if (BITS < 8) return __float_as_uint(__fmaf_ru(u, 65536.0f, __uint_as_float(word)));
    const float m = __fsub_rn(__uint_as_float(word), 8388608.0f);  // m', exact
    return __float2uint_ru(__fmaf_ru(u, 65536.0f, m));
}

// x moved d bits up (down when d < 0; a constant once the caller's loop is unrolled).
template <typename W>
__device__ __forceinline__ W moved(u32 x, int d) {
    return d >= 0 ? (W)x << d : (W)(x >> -d);
}

// Byte B of each of a, b, c and d, as the 4 bytes of one word: three PRMTs.
template <int B>
__device__ __forceinline__ u32 bytes_of(u32 a, u32 b, u32 c, u32 d) {
    const u32 low = __byte_perm(a, b, B | (B + 4) << 4);
    const u32 high = __byte_perm(c, d, B << 8 | (B + 4) << 12);
    return __byte_perm(low, high, 0x7610);
}

// The word of an octet's 8 codes, code k at bits [k BITS, (k + 1) BITS), from q[k], whose byte
// AT / 8 is code k. At 1, 2, 4 and 8 bits those bytes are gathered by PRMTs and packed together,
// about 9 instructions an octet instead of two a code: 4 and 8 bits by a shift and an add;
// 2 bits by a multiply (with code k in byte k, the product with 2^6 + 2^12 + 2^18 + 2^24 holds
// code k at bit 24 + 2k, and its other terms, 2-bit values at other even bits, carry into
// none of them); 1 bit as pairs of codes packed so. Other widths shift each code into place.
template <int BITS, int AT, typename W = typename WordOf<(BITS > 4)>::T>
__device__ __forceinline__ W packed_codes(const u32 (&q)[8]) {
    constexpr int B = AT / 8;
    constexpr u32 SPREAD = 0x1041040u;  // 2^6 + 2^12 + 2^18 + 2^24
    if constexpr (BITS == 8) {
        return bytes_of<B>(q[0], q[1], q[2], q[3]) | (W)bytes_of<B>(q[4], q[5], q[6], q[7]) << 32;
    } else if constexpr (BITS == 4) {
        return bytes_of<B>(q[0], q[2], q[4], q[6]) + (bytes_of<B>(q[1], q[3], q[5], q[7]) << 4);
    } else if constexpr (BITS == 2) {
        const u32 low = bytes_of<B>(q[0], q[1], q[2], q[3]) * SPREAD;
        const u32 high = bytes_of<B>(q[4], q[5], q[6], q[7]) * SPREAD;
        return __byte_perm(low, high, 0x0073) & 0xffffu;
    } else if constexpr (BITS == 1) {
        const u32 pairs = bytes_of<B>(q[0], q[2], q[4], q[6])
                          + (bytes_of<B>(q[1], q[3], q[5], q[7]) << 1);
        return (pairs * SPREAD) >> 24;
    } else {
        const W mask = (1u << BITS) - 1u;
        W word = 0;
#pragma unroll
        for (int k = 0; k < 8; ++k) word |= moved<W>(q[k], k * BITS - AT) & (mask << (k * BITS));
        return word;
    }
}

// Elements [at, at + count) of x, count in 1..8; the slots past count repeat the first
// element, which changes neither a minimum, a maximum nor the finite test. One or more 16-byte
// loads when `vec` (x + at is then 16-byte aligned) and the octet is whole.
template <typename L>
__device__ __forceinline__ void load_raw(const typename L::T* __restrict__ x, i64 at, int count,
                                         bool vec, typename L::T (&raw)[8]) {
    if (vec && count == 8) {
        load8(x + at, raw);
    } else {
        const typename L::T first = x[at];
#pragma unroll
        for (int k = 0; k < 8; ++k) raw[k] = k < count ? x[at + k] : first;
    }
}

// The 32-bit word values k and k + 1 of a 16-bit octet were loaded in (k even).
__device__ __forceinline__ u32 pair_at(const u16 (&raw)[8], int k) {
    return raw[k] | ((u32)raw[k + 1] << 16);
}

// An octet's elements as float, L::load each.
template <typename L>
struct OctetValues {
    static __device__ __forceinline__ void of(const typename L::T (&raw)[8], float (&v)[8]) {
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = L::load(raw[k]);
    }
};

// bfloat16 by the 32-bit words it was loaded in: a word's second value is the word with its
// low half cleared, one instruction (in PTX: NVVM would make it the 16 bits extracted and
// shifted back, two).
template <>
struct OctetValues<BF16> {
    static __device__ __forceinline__ void of(const u16 (&raw)[8], float (&v)[8]) {
#pragma unroll
        for (int k = 0; k < 8; k += 2) {
            const u32 w = pair_at(raw, k);
            u32 high;
            asm("and.b32 %0, %1, 0xffff0000;" : "=r"(high) : "r"(w));
            v[k] = __uint_as_float(w << 16);
            v[k + 1] = __uint_as_float(high);
        }
    }
};

// The same elements as float.
template <typename L>
__device__ __forceinline__ void load_octet(const typename L::T* __restrict__ x, i64 at,
                                           int count, bool vec, float (&v)[8]) {
    typename L::T raw[8];
    load_raw<L>(x, at, count, vec, raw);
    OctetValues<L>::of(raw, v);
}

// The quantizer's range pass over the values a lane loads: their minimum, and their maximum
// by max_nan, NaN once one was. A group holds a value that is not finite exactly when its
// width, maximum minus minimum, is not (NaN, or +inf with an infinite bound): no test of its
// own a value.
template <typename L, bool Paired = L::paired>
struct Range {
    float lo, hi;
    __device__ __forceinline__ Range()
        : lo(__int_as_float(0x7f800000)), hi(__int_as_float(0xff800000)) {}
    __device__ __forceinline__ void add_octet(const typename L::T (&raw)[8]) {
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const float v = L::load(raw[k]);
            lo = fminf(lo, v);
            hi = max_nan(hi, v);
        }
    }
    __device__ __forceinline__ float low() const { return lo; }
    __device__ __forceinline__ float high() const { return hi; }
};

// float16 and bfloat16: two values an instruction, on the words they were loaded in
// (dtypes.cuh: the same minimum and maximum as on their float values), converted to float
// once the octets are all in, not value by value.
template <typename L>
struct Range<L, true> {
    u32 lo, hi;
    __device__ __forceinline__ Range() : lo(L::pair_inf), hi(L::pair_minus_inf) {}
    __device__ __forceinline__ void add_octet(const u16 (&raw)[8]) {
#pragma unroll
        for (int k = 0; k < 8; k += 2) {
            const u32 w = pair_at(raw, k);
            lo = L::pair_min(lo, w);
            hi = L::pair_max_nan(hi, w);
        }
    }
    __device__ __forceinline__ float low() const {
        return fminf(L::load((u16)lo), L::load((u16)(lo >> 16)));
    }
    __device__ __forceinline__ float high() const {
        return max_nan(L::load((u16)hi), L::load((u16)(hi >> 16)));
    }
};

// What a lane keeps of an octet between the quantizer's two passes (T): float16 and bfloat16
// the 4 words of its loaded pairs (converted in the rounding pass, `values`: half the
// registers, and no copy of a word kept to convert its other half), other types their float
// values.
template <typename L, bool Raw = L::paired>
struct Kept {
    struct T {
        float v[8];
    };
    static __device__ __forceinline__ void keep(const typename L::T (&raw)[8], T& k) {
        OctetValues<L>::of(raw, k.v);
    }
    static __device__ __forceinline__ void values(const T& k, float (&v)[8]) {
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = k.v[i];
    }
};
template <typename L>
struct Kept<L, true> {
    struct T {
        u32 w[4];
    };
    static __device__ __forceinline__ void keep(const u16 (&raw)[8], T& k) {
#pragma unroll
        for (int i = 0; i < 4; ++i) k.w[i] = pair_at(raw, 2 * i);
    }
    static __device__ __forceinline__ void values(const T& k, float (&v)[8]) {
        u16 raw[8];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            raw[2 * i] = (u16)k.w[i];
            raw[2 * i + 1] = (u16)(k.w[i] >> 16);
        }
        OctetValues<L>::of(raw, v);
    }
};

// load_octet that also adds the octet to `range`, kept as Kept<L> keeps it.
template <typename L>
__device__ __forceinline__ void load_ranged(const typename L::T* __restrict__ x, i64 at,
                                            int count, bool vec, typename Kept<L>::T& k,
                                            Range<L>& range) {
    typename L::T raw[8];
    load_raw<L>(x, at, count, vec, raw);
    range.add_octet(raw);
    Kept<L>::keep(raw, k);
}

// Elements [at, at + count) of out from v; vector stores when `vec` and the octet is whole.
template <typename L>
__device__ __forceinline__ void store_octet(typename L::T* __restrict__ out, i64 at, int count,
                                            bool vec, const float (&v)[8]) {
    if (vec && count == 8) {
        typename L::T raw[8];
#pragma unroll
        for (int k = 0; k < 8; ++k) raw[k] = L::store(v[k]);
        store8(out + at, raw);
    } else {
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            if (k < count) out[at + k] = L::store(v[k]);
        }
    }
}

// An octet's BITS code bytes, from byte b of a group's stream of `limit` bytes (bytes past it
// read as 0). One aligned load for 1, 2, 4 and 8 bits when `vec`.
template <int BITS, typename W = typename WordOf<(BITS > 4)>::T>
__device__ __forceinline__ W load_codes(const u8* __restrict__ in, i64 b, i64 limit, bool vec) {
    if (vec && BITS == 1) return in[b];
    if (vec && BITS == 2) return *reinterpret_cast<const u16*>(in + b);
    if (vec && BITS == 4) return *reinterpret_cast<const u32*>(in + b);
    if (vec && BITS == 8) return (W)*reinterpret_cast<const u64*>(in + b);
    W word = 0;
#pragma unroll
    for (int k = 0; k < BITS; ++k) {
        if (b + k < limit) word |= (W)in[b + k] << (8 * k);
    }
    return word;
}

// Stores an octet's BITS code bytes at byte b of a group's stream of `limit` bytes (bytes
// past it, which belong to the next group, are not written).
template <int BITS, typename W>
__device__ __forceinline__ void store_codes(u8* __restrict__ out, i64 b, i64 limit, bool vec,
                                            W word) {
    if (vec && BITS == 1) {
        out[b] = (u8)word;
    } else if (vec && BITS == 2) {
        *reinterpret_cast<u16*>(out + b) = (u16)word;
    } else if (vec && BITS == 4) {
        *reinterpret_cast<u32*>(out + b) = (u32)word;
    } else if (vec && BITS == 8) {
        *reinterpret_cast<u64*>(out + b) = (u64)word;
    } else if (vec && BITS == 6) {
        // With `vec` an octet's 6 bytes start on an even byte: three 2-byte stores.
#pragma unroll
        for (int k = 0; k < 3; ++k) {
            *reinterpret_cast<u16*>(out + b + 2 * k) = (u16)(word >> (16 * k));
        }
    } else {
#pragma unroll
        for (int k = 0; k < BITS; ++k) {
            if (b + k < limit) out[b + k] = (u8)(word >> (8 * k));
        }
    }
}

// WORD_STORES and HALF_WORD_STORES: the widths (bit b for b bits, of 3, 5, 6 and 7) at which a
// whole group's codes are stored as aligned 4-byte words gathered across the segment's lanes by
// shuffles (store_slot_words) instead of BITS bytes (three 2-byte words at 6 bits) an octet:
// a warp's store then writes one contiguous run a group, not each lane's bytes BITS apart.
// WORD_STORES for float32 and float64, HALF_WORD_STORES for float16 and bfloat16. The defaults
// are the faster on an H200, 8254d6c: 3, 5, 6 and 7 bits for float32 (232 = 8 + 32 + 64 + 128:
// 98.8-99.7 % of a copy against 95-98.8 %, and 99.6 % against 69.6 % at 7 bits; quantize.jsonl,
// 8254d6c against 1af29d2), 7 bits alone for bfloat16 (128; tune_kernels.jsonl "WORD_STORES=0"
// rows: 75.6 % against 37.2 % at 7 bits, while the shuffles cost the quantizer, which is bound
// by the instructions it issues, 3.5-5.6 points at 3, 5 and 6 bits). The same codes.
#ifndef WORD_STORES
#define WORD_STORES 232
#endif
#ifndef HALF_WORD_STORES
#define HALF_WORD_STORES 128
#endif

// Stores the code words `word` of one slot's OP_LANES octets (lane sub's octet is the slot's
// sub-th; their bytes are OP_LANES BITS consecutive bytes from `out`, which is 4-byte
// aligned) as OP_LANES BITS / 4 aligned words. Word w of the slot, bits [32 w, 32 w + 32),
// is the part of octet a = floor(4 w / BITS) from its bit s = 32 w - 8 BITS a, then the low
// bits of octet a + 1 (8 BITS - s >= 8 of octet a's bits come first, so no third octet is
// needed); lane sub stores words sub, sub + OP_LANES, ... Every lane of the warp calls it.
template <int BITS, typename W>
__device__ __forceinline__ void store_slot_words(u32* __restrict__ out, int sub, W word) {
    constexpr int Words = OP_LANES * BITS / 4;
#pragma unroll
    for (int w0 = 0; w0 < Words; w0 += OP_LANES) {
        const int w = w0 + sub;
        const int a = 4 * w / BITS;
        const int s = 32 * w - 8 * BITS * a;
        // The shuffles read lanes of the segment (width OP_LANES): lane a + 1 is past it only
        // for the slot's last word, whose bits from it are shifted out (8 BITS - s = 32).
        const W first = __shfl_sync(0xffffffffu, word, a, OP_LANES);
        const u32 next = __shfl_sync(0xffffffffu, (u32)word, a + 1, OP_LANES);
        const u32 v = (u32)((first >> s) | ((W)next << (8 * BITS - s)));
        if (Words % OP_LANES == 0 || w < Words) out[w] = v;
    }
}

// The 4 hashes of an octet starting on a pair (`at` even): one per pair of its elements. An
// octet that starts on a multiple of 8 (every octet with `vec`: the caller passes it as
// `aligned`) is an octet o of the noise: its pairs share octet_key, and with x that key,
// (x ^ phi_k) ^ ((x ^ phi_k) >> 16) is t ^ phi_k ^ (phi_k >> 16) for t = x ^ (x >> 16): the
// outer mix32's first step is one xor a pair.
// keyed_hashes: those of noise octet o from lo = (u32)o ^ s0 and hi = (u32)(o >> 32) ^ s1.
__device__ __forceinline__ void keyed_hashes(u32 lo, u32 hi, u32 (&h)[4]) {
    const u32 x = mix32(lo) ^ hi;
    const u32 t = x ^ (x >> 16);
#pragma unroll
    for (int k = 0; k < 4; ++k) h[k] = mix32_rest(t ^ pair_phi(k) ^ (pair_phi(k) >> 16));
}

__device__ __forceinline__ void octet_hashes(i64 at, u32 s0, u32 s1, bool aligned,
                                             u32 (&h)[4]) {
    if (aligned || (at & 7) == 0) {
        const u64 o = (u64)at >> 3;
        keyed_hashes((u32)o ^ s0, (u32)(o >> 32) ^ s1, h);
    } else {
#pragma unroll
        for (int k = 0; k < 4; ++k) h[k] = hash_pair(((u64)at >> 1) + k, s0, s1);
    }
}

// The BITS-byte word of an octet's 8 codes (code k at bits [k BITS, (k + 1) BITS); codes past
// count are 0), elements [at, at + count) with values v of a usable group (the codes of
// another are garbage, which the caller masks), noise from `noise` or hashed, one hash a pair
// of elements. An octet that starts on a pair (every octet does with `vec`) takes `hashes`
// where the caller has them (Hashed), else octet_hashes: an array either way, not a pointer
// that may point to one or the other, which would put them in local memory.
template <int BITS, bool Hashed = false, typename W = typename WordOf<(BITS > 4)>::T>
__device__ __forceinline__ W pack_octet(const float (&v)[8], const float* __restrict__ noise,
                                        i64 at, int count, bool vec, float zero, float inv,
                                        u32 s0, u32 s1, const u32 (&hashes)[4] = {}) {
    W word;
    u32 q[8];
    if (noise != nullptr) {
        float r[8];
        load_octet<F32>(noise, at, count, vec, r);
#pragma unroll
        for (int k = 0; k < 8; ++k) q[k] = round_code(v[k], r[k], zero, inv);
        word = packed_codes<BITS, 0>(q);
    } else {
        // The noise of each element: from one hash a pair (an octet's 4 when it starts on one).
        u32 n[8];
        if ((at & 1) == 0) {
            u32 h[4];
            if constexpr (Hashed) {
#pragma unroll
                for (int k = 0; k < 4; ++k) h[k] = hashes[k];
            } else {
                octet_hashes(at, s0, s1, vec, h);
            }
#pragma unroll
            for (int k = 0; k < 8; ++k) n[k] = hashed_noise(h[k / 2], k & 1);
        } else {
#pragma unroll
            for (int k = 0; k < 8; ++k) {
                n[k] = hashed_noise(hash_pair((u64)(at + k) >> 1, s0, s1), (k + 1) & 1);
            }
        }
#pragma unroll
        for (int k = 0; k < 8; ++k) q[k] = round_hashed<BITS>(v[k], n[k], zero, inv);
        word = packed_codes<BITS, HASHED_CODE_AT>(q);
    }
    // All 8 codes were rounded, and the ones past count are masked off: no branch a code.
    return count < 8 ? word & (((W)1 << (count * BITS)) - 1) : word;
}

// WAVES=k builds are the default kernels on a grid of at most k waves of the blocks the device
// holds at once (the launcher reads it, gnnact/kernels/quantize.py): each warp takes groups in
// turn through the grid-stride loops, where the default grid gives each warp one group (a
// block's place on its SM is then held until its slowest warp ends). The results are the same.

// A group's first OP_CACHED octets per lane of its segment (those of a short group only), as
// load_octet reads them, added to `range`.
template <typename L>
__device__ __forceinline__ void load_cached(const typename L::T* __restrict__ x, i64 start,
                                            i64 len, int sub, bool vec,
                                            typename Kept<L>::T (&kept)[OP_CACHED],
                                            Range<L>& range) {
    const i64 octets = (len + 7) >> 3;
#pragma unroll
    for (int c = 0; c < OP_CACHED; ++c) {
        const i64 o = sub + OP_LANES * c;
        if (o < octets) {
            load_ranged<L>(x, start + 8 * o, (int)min((i64)8, len - 8 * o), vec, kept[c],
                           range);
        }
    }
}

// The length of group g (0 past the last group: a segment without a group idles through the
// warp's shuffles).
__device__ __forceinline__ i64 group_length(i64 g, i64 num_groups, i64 group_size, i64 n) {
    return g < num_groups ? min(group_size, n - g * group_size) : 0;
}

// The quantize kernel's arguments, as quantize_group reads them.
template <typename L>
struct QuantizeArgs {
    const typename L::T* __restrict__ x;
    const float* __restrict__ noise;
    u8* __restrict__ codes;
    float* __restrict__ scales;
    float* __restrict__ zeros;
    i64 n, group_size, num_groups, bytes_per_group;
    u32 s0, s1;
    bool vec;
};

// Quantizes group g (`kept`: the lane's cached octets of it and `range` their range pass, loaded
// here).
// Whole = true: g is a group of WHOLE_GROUP elements, all of it in the input, and `vec` holds;
// its length, octet counts and byte offsets are then constants, and the tests and the loops
// for octets past the cached ones, for short octets and for the bytes past the last octet
// compile away (the same results, fewer instructions).
// Seeded = true: the noise is hashed (a.noise is null). Compiled apart from the given noise's
// path, so that neither holds registers for the other's.
template <typename L, int BITS, bool Whole, bool Seeded>
__device__ __forceinline__ void quantize_group(const QuantizeArgs<L>& a, i64 g, int sub,
                                               typename Kept<L>::T (&kept)[OP_CACHED],
                                               Range<L>& range) {
    const float levels = (float)((1 << BITS) - 1);
    const bool vec = Whole || a.vec;
    const i64 group_size = Whole ? WHOLE_GROUP : a.group_size;
    const i64 bytes_per_group = Whole ? WHOLE_GROUP / 8 * BITS : a.bytes_per_group;
    const float* __restrict__ noise = Seeded ? nullptr : a.noise;
    const u32 s0 = a.s0, s1 = a.s1;
    const bool exists = Whole || g < a.num_groups;
    const i64 start = g * group_size;
    const i64 len = Whole ? WHOLE_GROUP : group_length(g, a.num_groups, group_size, a.n);
    const i64 octets = (len + 7) >> 3;

    load_cached<L>(a.x, start, len, sub, vec, kept, range);
    // Octets past the cached ones (groups larger than WHOLE_GROUP): not unrolled, so that the
    // common group, which has none, pays one test for them.
#pragma unroll 1
    for (i64 o = sub + OP_LANES * OP_CACHED; o < octets; o += OP_LANES) {
        typename Kept<L>::T v;
        load_ranged<L>(a.x, start + 8 * o, (int)min((i64)8, len - 8 * o), vec, v, range);
    }
    const float lo = segment_min(range.low());
    const float hi = segment_max(range.high());
    const float width = __fsub_rn(hi, lo);
    float scale, zero, inv;
    const bool usable = isfinite(width);
    if (!usable) {
        // NaN/Inf in the group, or a range that overflows: the whole group reads back as
        // NaN, its codes are 0.
        scale = __int_as_float(0x7fc00000);
        zero = scale;
        inv = 0.0f;
    } else {
        scale = __fdiv_rn(width, levels);
        zero = lo;
        // levels / width rounded down (round_code): to nearest, then one float lower where
        // that rounded up, as the fma's residual inv width - levels, exact in sign, tells
        // (__fdiv_rd would call a subroutine).
        inv = 0.0f;
        if (width > 0.0f) {
            inv = __fdiv_rn(levels, width);
            if (__fmaf_rn(inv, width, -levels) > 0.0f) {
                inv = __int_as_float(__float_as_int(inv) - 1);
            }
        }
    }
    if (sub == 0 && exists) {
        a.scales[g] = scale;
        a.zeros[g] = zero;
    }

    // A whole group's noise octets, when it has a power of two of them, are g 2^m + o with
    // o = sub + OP_LANES c < 2^m: the low word of octet o's index is that of g 2^m with the
    // bits of sub and OP_LANES c set, and its high word is the group's. Their keys' halves
    // (keyed_hashes) are then the lane's own, with OP_LANES c xored in: one instruction an
    // octet instead of the index's 64-bit arithmetic.
    constexpr bool Keyed = Whole && ((WHOLE_GROUP / 8) & (WHOLE_GROUP / 8 - 1)) == 0;
    const u64 first_octet = (u64)start >> 3;
    const u32 key_lo = ((u32)first_octet | (u32)sub) ^ s0;
    const u32 key_hi = (u32)(first_octet >> 32) ^ s1;
    u8* out = a.codes + g * bytes_per_group;
#pragma unroll
    for (int c = 0; c < OP_CACHED; ++c) {
        const i64 o = sub + OP_LANES * c;
        // Every octet of a whole group is there (and every lane at the shuffles of
        // store_slot_words).
        if (Whole || o < octets) {
            const int count = (int)min((i64)8, len - 8 * o);
            // The octet's hashes, where this pass has them: a whole group's from its keys;
            // else pack_octet hashes.
            constexpr bool Hashed = Seeded && Keyed;
            u32 h[4];
            if (Hashed) keyed_hashes(key_lo ^ (u32)(OP_LANES * c), key_hi, h);
            // With one store an octet (1, 2, 4 and 8 bits) or a whole group's words (at the
            // widths WORD_STORES or HALF_WORD_STORES name), rounded whether or not the group
            // is usable, and then masked: a select an octet rather than a branch around its
            // arithmetic, which the compiler may then interleave across octets. With BITS byte
            // stores an octet, the branch stays: it keeps each octet's stores apart from the
            // next's. Without it (0d248a9) the compiler ran a lane's 28 byte stores together,
            // and 6 and 7 bits were 9-16 points of a copy slower than the build before on an
            // H200 (tune_kernels.jsonl).
            constexpr int Widths = sizeof(typename L::T) == 2 ? HALF_WORD_STORES : WORD_STORES;
            constexpr bool Words = Whole && (BITS & (BITS - 1)) != 0 && ((Widths >> BITS) & 1);
            constexpr bool OneStore = (BITS & (BITS - 1)) == 0 || Words;
            typename WordOf<(BITS > 4)>::T word = 0;
            if (OneStore || usable) {
                float v[8];
                Kept<L>::values(kept[c], v);
                word = pack_octet<BITS, Hashed>(v, noise, start + 8 * o, count, vec, zero, inv,
                                                s0, s1, h);
            }
            if (!usable) word = 0;
            if (Words) {
                store_slot_words<BITS>(reinterpret_cast<u32*>(out + OP_LANES * c * BITS), sub,
                                       word);
            } else {
                // A whole group's octets end inside it: their bytes need no test against its
                // end.
                store_codes<BITS>(out, o * BITS, Whole ? (o + 1) * BITS : bytes_per_group, vec,
                                  word);
            }
        }
    }
#pragma unroll 1
    for (i64 o = sub + OP_LANES * OP_CACHED; o < octets; o += OP_LANES) {
        const int count = (int)min((i64)8, len - 8 * o);
        float v[8];
        load_octet<L>(a.x, start + 8 * o, count, vec, v);
        store_codes<BITS>(out, o * BITS, bytes_per_group, vec,
                          usable ? pack_octet<BITS>(v, noise, start + 8 * o, count, vec, zero,
                                                    inv, s0, s1)
                                 : 0);
    }
    // Bytes past the last octet (a short last group) are zero bytes, as in the reference.
    if (exists) {
        for (i64 b = octets * BITS + sub; b < bytes_per_group; b += OP_LANES) out[b] = 0;
    }
}

template <typename L, int BITS>
__device__ __forceinline__ void quantize_impl(const QuantizeArgs<L>& a) {
    const int lane = threadIdx.x & 31;
    const int sub = lane % OP_LANES, segment = lane / OP_LANES;
    // Warp-uniform loop: each pass the warp takes SEGMENTS consecutive groups.
    const i64 stride = (i64)gridDim.x * (blockDim.x >> 5) * SEGMENTS;
    i64 base = ((i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * SEGMENTS;
    // Groups of WHOLE_GROUP elements (the default group size) by vectors: every pass whose
    // groups all lie whole in the input takes the constant-size path.
    const bool whole_groups = a.vec && a.group_size == WHOLE_GROUP;
    for (; base < a.num_groups; base += stride) {
        // A pass's own: nothing is carried to the next.
        typename Kept<L>::T kept[OP_CACHED];
        Range<L> range;
        const bool whole = whole_groups && (base + SEGMENTS) * WHOLE_GROUP <= a.n;
        // Seeded and given noise compiled apart (quantize_group's Seeded).
        if (a.noise == nullptr) {
            if (whole) {
                quantize_group<L, BITS, true, true>(a, base + segment, sub, kept, range);
            } else {
                quantize_group<L, BITS, false, true>(a, base + segment, sub, kept, range);
            }
        } else if (whole) {
            quantize_group<L, BITS, true, false>(a, base + segment, sub, kept, range);
        } else {
            quantize_group<L, BITS, false, false>(a, base + segment, sub, kept, range);
        }
    }
}

// ---- dequantize: its own shape from here on ----
#undef OP_LANES
#undef OP_CACHED
#define OP_LANES DEQUANTIZE_LANES
#define OP_CACHED DEQUANTIZE_CACHED

// An octet's code word, from octet o of the group whose stream starts at `in`.
template <int BITS, typename W = typename WordOf<(BITS > 4)>::T>
__device__ __forceinline__ W octet_codes(const u8* __restrict__ in, i64 o, i64 bytes_per_group,
                                         bool vec) {
    return load_codes<BITS>(in, o * BITS, bytes_per_group, vec);
}

// The E values the codes (word >> k BITS) & mask, k < E, restore to: q scale + zero, each
// operation rounded as the reference rounds it.
template <int BITS, int E, typename W>
__device__ __forceinline__ void restored_values(W word, float scale, float zero, float (&v)[E]) {
    const W mask = (1u << BITS) - 1u;
#pragma unroll
    for (int k = 0; k < E; ++k) {
        const float q = (float)((word >> (k * BITS)) & mask);
        v[k] = __fadd_rn(__fmul_rn(q, scale), zero);
    }
}

// Restores the octet with code word `word` to elements [at, at + count) of out.
template <typename L, int BITS, typename W>
__device__ __forceinline__ void restore_octet(W word, float scale, float zero,
                                              typename L::T* __restrict__ out, i64 at,
                                              int count, bool vec) {
    float v[8];
    restored_values<BITS>(word, scale, zero, v);
    store_octet<L>(out, at, count, vec, v);
}

// Elements per 16-byte chunk of T (dequantize_impl), at most an octet.
template <typename T>
struct ChunkOf {
    static constexpr int E = 16 / sizeof(T) < 8 ? 16 / sizeof(T) : 8;
};

// Restores E values, codes (word >> k BITS) & mask for k < E, to elements [at, at + count)
// of out; one 16-byte store when `vec` and the chunk is whole.
template <typename L, int BITS, int E, typename W>
__device__ __forceinline__ void restore_chunk(W word, float scale, float zero,
                                              typename L::T* __restrict__ out, i64 at,
                                              int count, bool vec) {
    float v[E];
    restored_values<BITS>(word, scale, zero, v);
    union {
        Word16 w;
        typename L::T t[E];
    } chunk;
#pragma unroll
    for (int k = 0; k < E; ++k) chunk.t[k] = L::store(v[k]);
    if (vec && count == E) {
        *reinterpret_cast<Word16*>(out + at) = chunk.w;
    } else {
#pragma unroll
        for (int k = 0; k < E; ++k) {
            if (k < count) out[at + k] = chunk.t[k];
        }
    }
}

// Whether a kernel of this width stages whole groups' codes in shared memory (dequantize_impl),
// and the 16-byte vectors a whole group's code stream takes.
template <int BITS>
struct Staged {
    static constexpr bool used = BITS == 3 || (BITS >= 5 && BITS <= 7);
    static constexpr int vectors = WHOLE_GROUP / 8 * BITS / 16;
};

// Copies the code stream of the whole group at `in` (16-byte aligned) into `slice`, the
// segment's part of the block's shared memory: a vector a lane. The first __syncwarp keeps the
// copy from overwriting what lanes still read of the previous group, the second makes it
// visible to the whole segment.
template <int BITS>
__device__ __forceinline__ void stage_codes(const u8* __restrict__ in, Word16* slice, int sub) {
    __syncwarp();
    const Word16* src = reinterpret_cast<const Word16*>(in);
#pragma unroll 1
    for (int k = sub; k < Staged<BITS>::vectors; k += OP_LANES) slice[k] = src[k];
    __syncwarp();
}

// The code word of octet o from a staged group's stream: two aligned 8-byte reads at most.
template <int BITS>
__device__ __forceinline__ u64 staged_codes(const Word16* slice, int o) {
    const u64* words = reinterpret_cast<const u64*>(slice);
    const int b = o * BITS, i = b >> 3, off = b & 7;
    u64 word = words[i] >> (8 * off);
    if (off + BITS > 8) word |= words[i + 1] << (64 - 8 * off);  // off >= 2: the shift is < 64
    return word & (~0ull >> (64 - 8 * BITS));
}

// Restores whole group g from a staged copy of its code stream, E values a store: an octet
// (E = 8), or a chunk (E = 4 or 2, PER chunks an octet).
template <typename L, int BITS, int E>
__device__ __forceinline__ void restore_staged(const u8* __restrict__ codes,
                                               const float* __restrict__ scales,
                                               const float* __restrict__ zeros,
                                               typename L::T* __restrict__ out, i64 g,
                                               i64 bytes_per_group, Word16* slice, int sub) {
    typedef typename WordOf<(BITS > 4)>::T W;
    constexpr int PER = 8 / E;
    const float scale = scales[g];
    const float zero = zeros[g];
    stage_codes<BITS>(codes + g * bytes_per_group, slice, sub);
#pragma unroll
    for (int c = 0; c < OP_CACHED * PER; ++c) {
        const int q = sub + OP_LANES * c;  // the octet or chunk; q % PER is sub % PER
        const W word = (W)staged_codes<BITS>(slice, q / PER) >> ((sub % PER) * E * BITS);
        if constexpr (E == 8) {
            restore_octet<L, BITS>(word, scale, zero, out, g * WHOLE_GROUP + 8 * q, 8, true);
        } else {
            restore_chunk<L, BITS, E>(word, scale, zero, out, g * WHOLE_GROUP + E * q, E, true);
        }
    }
}

// Dequantizes by 16-byte chunks (4 float32, 2 float64 or 8 16-bit values, ChunkOf): lane l
// writes chunk l of a warp's 32, so each store instruction of a warp writes 512 consecutive
// bytes, whole sectors, and a lane loads the code words of its cached chunks (OP_CACHED
// octets' worth) before it restores them. Whole groups of the default size at 3, 5, 6 and 7
// bits are restored from a copy of their code bytes in shared memory (Staged): the segment's
// lanes load the group's 64 BITS bytes together by 16-byte vectors (aligned: `vec` has the
// buffer, and the group's bytes are a multiple of 16), then each lane reads its octets' BITS
// bytes from the copy. Tuning rows: tune_kernels.jsonl, H200, 7116a3f
// "SHARED_CODES=1,CHUNK_STORES=1" against octet stores with codes read from global memory (the
// default then): float32 +3.6 to +34 points of a copy, bfloat16 +3.3 to +21, at every width
// (an octet's 32 bytes of float32 by two stores, each half of every sector, had the L2 take
// 1.65 times the sector writes at 1 bit: kernel_profile.jsonl).
template <typename L, int BITS>
__device__ __forceinline__ void dequantize_impl(
    const u8* __restrict__ codes, const float* __restrict__ scales,
    const float* __restrict__ zeros, typename L::T* __restrict__ out, i64 n, i64 group_size,
    i64 num_groups, i64 bytes_per_group, int vec_flag) {
    typedef typename WordOf<(BITS > 4)>::T W;
    const bool vec = vec_flag != 0;
    const int lane = threadIdx.x & 31;
    const int sub = lane % OP_LANES, segment = lane / OP_LANES;
    const i64 stride = (i64)gridDim.x * (blockDim.x >> 5) * SEGMENTS;
    i64 base = ((i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * SEGMENTS;
    // One slice a segment of the block's 8 warps (256 threads, DEQUANTIZE_BOUNDS).
    __shared__ Word16 staged[8 * SEGMENTS][Staged<BITS>::used ? Staged<BITS>::vectors : 1];
    Word16* slice = staged[(threadIdx.x >> 5) * SEGMENTS + segment];
    const bool staging = Staged<BITS>::used && vec && group_size == WHOLE_GROUP;
    constexpr int E = ChunkOf<typename L::T>::E;  // values a chunk
    constexpr int PER = 8 / E;                     // chunks an octet
    for (; base < num_groups; base += stride) {
        if (staging && (base + SEGMENTS) * WHOLE_GROUP <= n) {  // the warp's groups are whole
            restore_staged<L, BITS, E>(codes, scales, zeros, out, base + segment,
                                       bytes_per_group, slice, sub);
            continue;
        }
        const i64 g = base + segment;
        if (g >= num_groups) continue;  // no shuffles below: a segment may skip its pass
        const i64 start = g * group_size;
        const i64 len = min(group_size, n - start);
        const i64 chunks = (len + E - 1) / E;
        const float scale = scales[g];
        const float zero = zeros[g];
        const u8* in = codes + g * bytes_per_group;
        // Chunk q is part q % PER of octet q / PER; q % PER is sub % PER in every pass.
        const int shift = (sub % PER) * E * BITS;
        W words[OP_CACHED * PER];
#pragma unroll
        for (int c = 0; c < OP_CACHED * PER; ++c) {
            const i64 q = sub + OP_LANES * c;
            if (q < chunks) words[c] = octet_codes<BITS>(in, q / PER, bytes_per_group, vec);
        }
#pragma unroll
        for (int c = 0; c < OP_CACHED * PER; ++c) {
            const i64 q = sub + OP_LANES * c;
            if (q < chunks) {
                restore_chunk<L, BITS, E>(words[c] >> shift, scale, zero, out, start + E * q,
                                          (int)min((i64)E, len - E * q), vec);
            }
        }
#pragma unroll 1
        for (i64 q = sub + OP_LANES * OP_CACHED * PER; q < chunks; q += OP_LANES) {
            restore_chunk<L, BITS, E>(
                octet_codes<BITS>(in, q / PER, bytes_per_group, vec) >> shift, scale, zero, out,
                start + E * q, (int)min((i64)E, len - E * q), vec);
        }
    }
}

// ---- extern "C" entry points: quantize_<dtype>_<bits>, dequantize_<dtype>_<bits> ----
// Launched with 256 threads a block (gnnact/kernels/quantize.py, _THREADS). The blocks an SM
// is to hold at once bound a kernel's registers: quantize 3 (at most 85 registers; its default
// shape takes 80, no spills), or 2 for float64, whose cached octets take twice the registers
// (at most 128), or 4 for float16 and bfloat16, whose cached octets take half (at most 64, no
// spills): a warp has half float32's bytes in flight, so it takes more warps to keep as many
// loads going; dequantize 4 (at most 64; it takes 40 or fewer, so 6 blocks fit). A build's
// MIN_BLOCKS sets them all, QUANTIZE_MIN_BLOCKS (float64: at most 2, float16 and bfloat16 the
// same unless QUANTIZE_HALF_MIN_BLOCKS) or DEQUANTIZE_MIN_BLOCKS one op's.
#ifdef MIN_BLOCKS
#define QUANTIZE_MIN_BLOCKS MIN_BLOCKS
#define QUANTIZE_F64_MIN_BLOCKS MIN_BLOCKS
#define DEQUANTIZE_MIN_BLOCKS MIN_BLOCKS
#endif
#if defined(QUANTIZE_MIN_BLOCKS) && !defined(QUANTIZE_HALF_MIN_BLOCKS)
#define QUANTIZE_HALF_MIN_BLOCKS QUANTIZE_MIN_BLOCKS
#endif
// Tuning rows (tune_kernels.jsonl, H200): 3 timed with the quantize shape, 7116a3f
// "LANES=16,CACHED=4,MIN_BLOCKS=3".
#ifndef QUANTIZE_MIN_BLOCKS
#define QUANTIZE_MIN_BLOCKS 3
#endif
// 8254d6c "QUANTIZE_HALF_MIN_BLOCKS=3" (bfloat16): 3-8 points slower than 4 at every width (5
// blocks spill, benchmarks/tune_kernels.py's notes).
#ifndef QUANTIZE_HALF_MIN_BLOCKS
#define QUANTIZE_HALF_MIN_BLOCKS 4
#endif
// float64 has no tuning rows: 2 keeps its cached octets, twice float32's registers, without
// spills (ptxas.jsonl).
#ifndef QUANTIZE_F64_MIN_BLOCKS
#define QUANTIZE_F64_MIN_BLOCKS (QUANTIZE_MIN_BLOCKS < 2 ? QUANTIZE_MIN_BLOCKS : 2)
#endif
// The bound of the dequantizer 7116a3f timed ("SHARED_CODES=1,CHUNK_STORES=1"); 80d87ec and
// e4ba981 "MIN_BLOCKS=6": within 0.5 points of 4 for dequantize.
#ifndef DEQUANTIZE_MIN_BLOCKS
#define DEQUANTIZE_MIN_BLOCKS 4
#endif
#define DEQUANTIZE_BOUNDS __launch_bounds__(256, DEQUANTIZE_MIN_BLOCKS)
#define GNNACT_DEFINE(NAME, L, BITS, BLOCKS)                                                 \
    extern "C" __global__ void __launch_bounds__(256, BLOCKS) quantize_##NAME##_##BITS(      \
        const L::T* __restrict__ x, const float* __restrict__ noise, u8* __restrict__ codes, \
        float* __restrict__ scales, float* __restrict__ zeros, i64 n, i64 group_size,        \
        i64 num_groups, i64 bytes_per_group, u32 s0, u32 s1, int vec) {                      \
        quantize_impl<L, BITS>({x, noise, codes, scales, zeros, n, group_size, num_groups,   \
                                bytes_per_group, s0, s1, vec != 0});                         \
    }                                                                                        \
    extern "C" __global__ void DEQUANTIZE_BOUNDS dequantize_##NAME##_##BITS(                 \
        const u8* __restrict__ codes, const float* __restrict__ scales,                      \
        const float* __restrict__ zeros, L::T* __restrict__ out, i64 n, i64 group_size,      \
        i64 num_groups, i64 bytes_per_group, int vec) {                                      \
        dequantize_impl<L, BITS>(codes, scales, zeros, out, n, group_size, num_groups,       \
                                 bytes_per_group, vec);                                      \
    }

#define GNNACT_DEFINE_ALL_BITS(NAME, L, BLOCKS) \
    GNNACT_DEFINE(NAME, L, 1, BLOCKS)           \
    GNNACT_DEFINE(NAME, L, 2, BLOCKS)           \
    GNNACT_DEFINE(NAME, L, 3, BLOCKS)           \
    GNNACT_DEFINE(NAME, L, 4, BLOCKS)           \
    GNNACT_DEFINE(NAME, L, 5, BLOCKS)           \
    GNNACT_DEFINE(NAME, L, 6, BLOCKS)           \
    GNNACT_DEFINE(NAME, L, 7, BLOCKS)           \
    GNNACT_DEFINE(NAME, L, 8, BLOCKS)

GNNACT_DEFINE_ALL_BITS(f32, F32, QUANTIZE_MIN_BLOCKS)
GNNACT_DEFINE_ALL_BITS(f64, F64, QUANTIZE_F64_MIN_BLOCKS)
GNNACT_DEFINE_ALL_BITS(f16, F16, QUANTIZE_HALF_MIN_BLOCKS)
GNNACT_DEFINE_ALL_BITS(bf16, BF16, QUANTIZE_HALF_MIN_BLOCKS)
