// The packed format's quantizer and dequantizer for the CPU: one pass over a group's values
// for its range, one for its codes, the codes packed as they are made (gnnact.kernels.cpu
// builds this file with the system's C++ compiler the first time a process needs it).
//
// What they compute is gnnact.quant.reference's, bit for bit, with the rounding noise the
// CUDA kernels hash from the seed (gnnact.quant.rng.hash_words): for group g of the flat
// values x[start .. start + n) (start a multiple of the group size G),
//
//     Z = min h, R = max h - Z, s = R / B, inv = B / R rounded down (B = 2^bits - 1),
//     q_j = ceil((h_j - Z) * inv - k_j 2^-16),
//
// each operation one correctly rounded float32 operation (built with -ffp-contract=off: no
// fused multiply-add), k_j the element's 16-bit noise word. A group holding a NaN or an
// infinity, or whose range overflows, stores scale = zero = NaN and codes 0. Codes are each
// group's LSB-first bit stream, code j in bits [j b, (j + 1) b), padded to whole bytes.
//
// Why not the torch path: it makes about ten passes over memory a chunk (range, subtract,
// scale, noise, ceiling, pack, conversions) and draws its noise from a generator; here a
// group's values are read twice (the second time from the L1 cache) and written once as
// codes. The loops over a group's elements are written so that the compiler vectorises them
// (-O3 -march=native): 16 vector lanes for the range and for the noise (four octets a vector),
// plain element loops for the rounding and the dequantizer's scale; codes are packed and
// unpacked a word of 8 at a time (BMI2's pext and pdep, else SWAR), straight into and out of
// the packed tensor.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

// BMI2's bit gather and scatter (pext, pdep) fold or spread a block's 8 codes in one
// instruction: against the SWAR steps below, quantizing 4M values at 2-4 bits takes 6-24 %
// less time on one core, dequantizing 10-14 % (medians, the two builds interleaved). AMD's
// cores before Zen 3 run them in microcode, hundreds of cycles: there, and without BMI2, the
// SWAR steps.
#if defined(__BMI2__) && !defined(__znver1__) && !defined(__znver2__)
#define GNNACT_BIT_GATHER 1
#include <immintrin.h>
#endif

namespace {

using u8 = uint8_t;
using u16 = uint16_t;
using u32 = uint32_t;
using u64 = uint64_t;
using i64 = int64_t;

// The largest group handled at once (a group is cut into pieces of at most this many
// elements for its codes; its range is taken over the whole group first).
constexpr i64 PIECE = 2048;

constexpr u32 MUL1 = 0x21F0AAADu, MUL2 = 0x735A2D97u, PHI = 0x9E3779B9u;

// Sixteen u32 lanes (one AVX-512 register, two AVX2 ones): GCC's vector extension, so that
// the hash below is vectorised whatever -march=native finds.
typedef u32 U32x16 __attribute__((vector_size(64)));

// The hash's mix of one word (T = u32) or of sixteen (T = U32x16).
template <typename T>
inline T mix32(T x) {
    x ^= x >> 16;
    x *= MUL1;
    x ^= x >> 15;
    x *= MUL2;
    return x ^ (x >> 15);
}

// The noise words k = 2^16 r of elements first .. first + count - 1 (gnnact.quant.rng.
// hash_words), in `buffer` (NOISE_WORDS words): one hash g a pair of elements, k the
// complement of its 16-bit halves (2^16 - 1 - h = ~h), the low half the even element's, so
// that the halves of the complemented hashes, in order, are the elements' words. An octet
// (8 elements) t has 4 pairs sharing the inner mix, hash 4 t + k = ~mix32(inner_t ^ k PHI);
// hashed four octets to a vector (lane l: octet l / 4, pair l % 4; the inner mix computed in
// each of its four lanes costs less than moving it there: the compiler kept a scalar inner
// mix an octet, 30 % of a quantization, before); returns the first element's word.
constexpr i64 NOISE_WORDS = PIECE / 2 + 32;

const u16* noise_words(i64 first, i64 count, u32 s0, u32 s1, u32* buffer) {
    static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "halves read in memory order");
    const u64 octet0 = (u64)first >> 3, octets = (((u64)(first + count) + 7) >> 3) - octet0;
    const u32 low0 = (u32)octet0, high0 = (u32)(octet0 >> 32);
    if (((octet0 + octets - 1) >> 32) == high0) {  // one high word throughout: u32 lanes
        const U32x16 lane_octet = {0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3};
        const U32x16 lane_pair = {0, PHI, 2 * PHI, 3 * PHI, 0, PHI, 2 * PHI, 3 * PHI,
                                  0, PHI, 2 * PHI, 3 * PHI, 0, PHI, 2 * PHI, 3 * PHI};
        // (up to three octets past the last: words nobody reads, within NOISE_WORDS; unrolled:
        // a vector's two multiplies are a chain of latencies that the next ones overlap)
#pragma GCC unroll 4
        for (u32 t = 0; t < (u32)octets; t += 4) {
            const U32x16 inner = mix32((low0 + t + lane_octet) ^ s0) ^ (high0 ^ s1);
            const U32x16 words = ~mix32(inner ^ lane_pair);
            std::memcpy(buffer + 4 * t, &words, sizeof words);
        }
    } else {
        for (u64 t = 0; t < octets; ++t) {
            const u64 octet = octet0 + t;
            const u32 inner = mix32((u32)octet ^ s0) ^ (u32)(octet >> 32) ^ s1;
            for (u32 k = 0; k < 4; ++k) buffer[4 * t + k] = ~mix32(inner ^ (k * PHI));
        }
    }
    return reinterpret_cast<const u16*>(buffer) + (first & 7);
}

// B / R rounded down (gnnact.quant.reference.inverse_range): 0 where R is 0 or NaN.
float inverse_range(float range, int bits) {
    const double exact = (double)((1 << bits) - 1) / (double)range;
    float inv = (float)exact;
    if ((double)inv > exact) {
        u32 word;
        std::memcpy(&word, &inv, 4);
        word -= 1;
        std::memcpy(&inv, &word, 4);
    }
    return std::isnan(inv) || std::isinf(inv) ? 0.0f : inv;
}

// The ends of h[0 .. len), NaN both if it holds a NaN or an infinity (the group then stores
// NaN scale and zero whichever its ends are), 16 lanes at a time in vector registers:
// `v < lo ? v : lo` is the CPU's own min instruction, and v - v is NaN exactly where v is not
// finite.
void range_of(const float* h, i64 len, float* low, float* high) {
    typedef float Lanes __attribute__((vector_size(64)));
    Lanes lo, hi, bad = {};
    for (int l = 0; l < 16; ++l) lo[l] = hi[l] = h[0];
    i64 j = 0;
    for (; j + 16 <= len; j += 16) {
        Lanes v;
        std::memcpy(&v, h + j, sizeof v);
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
        bad += v - v;
    }
    float a = lo[0], b = hi[0], not_finite = bad[0];
    for (int l = 1; l < 16; ++l) {
        a = lo[l] < a ? lo[l] : a;
        b = hi[l] > b ? hi[l] : b;
        not_finite += bad[l];
    }
    for (; j < len; ++j) {
        const float v = h[j];
        a = v < a ? v : a;
        b = v > b ? v : b;
        not_finite += v - v;
    }
    *low = not_finite != 0.0f ? NAN : a;  // (NaN != 0)
    *high = not_finite != 0.0f ? NAN : b;
}

// Codes of BITS bits, c[0 .. 8 blocks), packed LSB first: block k's 8 codes fill bytes
// [k BITS, (k + 1) BITS) of out, writable 8 bytes from the last block's start. A block's
// 8 codes are read as one word, byte l holding code l, and folded in three steps (byte
// pairs, then 16-bit pairs, then the halves: SWAR, ten operations where code-by-code shifts
// took twenty-four); words are moved 8 bytes at a time (a BITS-byte move of a word on the
// stack would stall the load after it): a block's word is 0 above its 8 BITS bits, and the
// next block's store overwrites them.
template <int BITS>
constexpr u64 CODE_LANES = ((u64(1) << BITS) - 1) * 0x0101010101010101ull;  // a code a byte

template <int BITS>
inline u64 fold_codes(u64 w) {
    if (BITS == 8) return w;
#ifdef GNNACT_BIT_GATHER
    return _pext_u64(w, CODE_LANES<BITS>);
#else
    w = (w & 0x00FF00FF00FF00FFull) | ((w & 0xFF00FF00FF00FF00ull) >> (8 - BITS));
    w = (w & 0x0000FFFF0000FFFFull) | ((w & 0xFFFF0000FFFF0000ull) >> (16 - 2 * BITS));
    return (w & 0x00000000FFFFFFFFull) | ((w & 0xFFFFFFFF00000000ull) >> (32 - 4 * BITS));
#endif
}

// Inverse of fold_codes: the 8 BITS low bits of w spread to one code a byte.
template <int BITS>
inline u64 spread_codes(u64 w) {
    if (BITS == 8) return w;
#ifdef GNNACT_BIT_GATHER
    return _pdep_u64(w, CODE_LANES<BITS>);
#else
    constexpr u64 LOW4 = (u64(1) << (4 * BITS)) - 1, LOW2 = (u64(1) << (2 * BITS)) - 1,
                  LOW1 = (u64(1) << BITS) - 1;
    w &= (LOW4 << (4 * BITS)) | LOW4;
    w = (w & LOW4) | ((w >> (4 * BITS)) << 32);
    constexpr u64 PAIRS = LOW2 | (LOW2 << 32), ONES = LOW1 * 0x0001000100010001ull;
    w = (w & PAIRS) | (((w >> (2 * BITS)) & PAIRS) << 16);
    return (w & ONES) | (((w >> BITS) & ONES) << 8);
#endif
}

// How many blocks' 8-byte words lie inside `bytes` bytes (block k's at k BITS).
template <int BITS>
inline i64 blocks_within(i64 bytes) {
    return bytes < 8 ? 0 : (bytes - 8) / BITS + 1;
}

template <int BITS>
void pack(const u8* c, i64 blocks, u8* out) {
    for (i64 k = 0; k < blocks; ++k) {
        u64 word;
        std::memcpy(&word, c + 8 * k, 8);
        word = fold_codes<BITS>(word);
        std::memcpy(out + k * BITS, &word, 8);  // little-endian: the low BITS bytes first
    }
}

// Inverse of pack: `in` readable 8 bytes from the last block's start.
template <int BITS>
void unpack(const u8* in, i64 blocks, u8* c) {
    for (i64 k = 0; k < blocks; ++k) {
        u64 word;
        std::memcpy(&word, in + k * BITS, 8);
        word = spread_codes<BITS>(word);
        std::memcpy(c + 8 * k, &word, 8);
    }
}

// A piece's codes c[0 .. 8 blocks) packed into its `bytes` bytes at out: straight where a
// block's 8-byte word stays inside them, the last blocks through a buffer (the next bytes may
// be another chunk's codes, written by another thread).
template <int BITS>
void store_codes(const u8* c, i64 blocks, u8* out, i64 bytes) {
    u8 tail[PIECE / 8 * BITS + 8];
    const i64 direct = std::min(blocks, blocks_within<BITS>(bytes));
    pack<BITS>(c, direct, out);
    if (direct < blocks) {
        pack<BITS>(c + 8 * direct, blocks - direct, tail);
        std::memcpy(out + direct * BITS, tail, bytes - direct * BITS);
    }
}

// A group's codes piece by piece (PIECE elements, a multiple of 8: each piece's codes fill
// whole bytes): `round(p0, k, have, c)` rounds the `have` values of the piece at p0 into
// c, k their noise words; a short group's padding gets code 0; the codes are stored.
template <int BITS, typename Round>
void code_pieces(i64 first, i64 len, i64 group_size, u32 s0, u32 s1, u8* out,
                 i64 bytes_per_group, Round round) {
    u32 hashes[NOISE_WORDS];
    u8 c[PIECE];
    for (i64 p0 = 0; p0 < group_size; p0 += PIECE) {
        const i64 size = group_size - p0 < PIECE ? group_size - p0 : PIECE;
        const i64 have = len - p0 < 0 ? 0 : (len - p0 < size ? len - p0 : size);
        round(p0, noise_words(first + p0, have, s0, s1, hashes), have, c);
        const i64 blocks = (size + 7) >> 3;
        for (i64 j = have; j < 8 * blocks; ++j) c[j] = 0;
        const i64 at = p0 * BITS / 8;
        store_codes<BITS>(c, blocks, out + at, std::min(bytes_per_group - at, blocks * BITS));
    }
}

template <int BITS>
void quantize_group(const float* __restrict h, i64 first, i64 len, i64 group_size, u32 s0,
                    u32 s1, u8* __restrict out, i64 bytes_per_group, float* __restrict scale,
                    float* __restrict zero) {
    float lo, hi;
    range_of(h, len, &lo, &hi);
    const float range = hi - lo;
    const float nan_unless_finite = range - range;  // +0 where finite, NaN where not
    *scale = range / (float)((1 << BITS) - 1) - nan_unless_finite;
    *zero = lo - nan_unless_finite;
    if (nan_unless_finite != 0.0f) {  // (NaN: the group is not finite)
        std::memset(out, 0, bytes_per_group);
        return;
    }
    const float inv = inverse_range(range, BITS);
    code_pieces<BITS>(first, len, group_size, s0, s1, out, bytes_per_group,
                      [&](i64 p0, const u16* k, i64 have, u8* c) {
        for (i64 j = 0; j < have; ++j) {
            const float u = (h[p0 + j] - lo) * inv;
            // (u - 2^-16 k is exact: see gnnact.quant.reference._round_on_grid)
            c[j] = (u8)(int)std::ceil(u - (float)k[j] * 0x1p-16f);
        }
    });
}

template <int BITS>
void dequantize_group(const u8* __restrict in, i64 len, i64 bytes_per_group, float scale,
                      float zero, float* __restrict out) {
    u8 packed[PIECE / 8 * BITS + 8];
    u8 c[PIECE];
    for (i64 p0 = 0; p0 < len; p0 += PIECE) {
        const i64 size = len - p0 < PIECE ? len - p0 : PIECE;
        const i64 blocks = (size + 7) >> 3;
        const i64 at = p0 * BITS / 8;
        const i64 bytes = bytes_per_group - at < blocks * BITS ? bytes_per_group - at
                                                               : blocks * BITS;
        // Straight from the codes where a block's word lies inside the piece's bytes (a copy
        // first made 8-byte loads straddle the copy's stores: they waited for them, 60 % of a
        // dequantization), the last blocks from a padded copy.
        const i64 direct = std::min(blocks, blocks_within<BITS>(bytes));
        unpack<BITS>(in + at, direct, c);
        if (direct < blocks) {
            const i64 rest = bytes - direct * BITS;
            std::memcpy(packed, in + at + direct * BITS, rest);
            std::memset(packed + rest, 0, (blocks - direct) * BITS + 8 - rest);
            unpack<BITS>(packed, blocks - direct, c + 8 * direct);
        }
        // q s + Z, the multiply and the add each rounded (no FMA), as the reference.
        for (i64 j = 0; j < size; ++j) out[p0 + j] = (float)c[j] * scale + zero;
    }
}

// Mesa's rounding onto a given grid (gnnact.quant.reference.quantize_on_grid): the values of a
// group h[0 .. len) (elements first .. first + len - 1 for the noise) with the group's offset
// Z and inverse step inv (a running estimate: the values may lie outside it),
//
//     u = (h_j - Z) * inv, clipped when u < low or u > high (counted), then u clamped to
//     [0, B], q_j = trunc(u) + [k_j 2^-16 < u - trunc(u)],
//
// each operation one float32 operation as torch computes it (a NaN value gets code 0).
template <int BITS>
i64 round_group_on_grid(const float* __restrict h, i64 first, i64 len, i64 group_size,
                        u32 s0, u32 s1, float zero, float inv, float low, float high,
                        u8* __restrict out, i64 bytes_per_group) {
    constexpr float B = (float)((1 << BITS) - 1);
    i64 clipped = 0;
    code_pieces<BITS>(first, len, group_size, s0, s1, out, bytes_per_group,
                      [&](i64 p0, const u16* k, i64 have, u8* c) {
        i64 outside = 0;
        for (i64 j = 0; j < have; ++j) {
            float u = (h[p0 + j] - zero) * inv;
            outside += (u < low) | (u > high);
            u = u < 0.0f ? 0.0f : u;
            u = u > B ? B : u;
            const float whole = std::trunc(u);
            const float code = whole + (float)((float)k[j] * 0x1p-16f < u - whole);
            c[j] = code == code ? (u8)(int)code : 0;  // (NaN: 0)
        }
        clipped += outside;
    });
    return clipped;
}

template <int BITS>
void round_all_on_grid(const float* x, i64 start, i64 n, i64 group_size, u32 s0, u32 s1,
                       const float* zeros, const float* invs, float low, float high, u8* codes,
                       i64 bytes_per_group, i64* clipped) {
    const i64 groups = (n + group_size - 1) / group_size;
    for (i64 g = 0; g < groups; ++g) {
        const i64 lo = g * group_size;
        const i64 len = n - lo < group_size ? n - lo : group_size;
        clipped[g] = round_group_on_grid<BITS>(x + lo, start + lo, len, group_size, s0, s1,
                                               zeros[g], invs[g], low, high,
                                               codes + g * bytes_per_group, bytes_per_group);
    }
}

template <int BITS>
void quantize_all(const float* x, i64 start, i64 n, i64 group_size, u32 s0, u32 s1, u8* codes,
                  float* scales, float* zeros, i64 bytes_per_group) {
    const i64 groups = (n + group_size - 1) / group_size;
    for (i64 g = 0; g < groups; ++g) {
        const i64 lo = g * group_size;
        const i64 len = n - lo < group_size ? n - lo : group_size;
        quantize_group<BITS>(x + lo, start + lo, len, group_size, s0, s1,
                             codes + g * bytes_per_group, bytes_per_group, scales + g, zeros + g);
    }
}

template <int BITS>
void dequantize_all(const u8* codes, const float* scales, const float* zeros, i64 n,
                    i64 group_size, i64 bytes_per_group, float* out) {
    const i64 groups = (n + group_size - 1) / group_size;
    for (i64 g = 0; g < groups; ++g) {
        const i64 lo = g * group_size;
        const i64 len = n - lo < group_size ? n - lo : group_size;
        dequantize_group<BITS>(codes + g * bytes_per_group, len, bytes_per_group, scales[g],
                               zeros[g], out + lo);
    }
}

// The mask ops (gnnact.quant.reference's sign_mask, apply_packed_mask, combine_mask): how a
// value v meets its mask bit m, each as the PyTorch op it stands for computes it, bit for bit:
// MUL v * m, then * s unless s is 1 (ReLU's forward, dropout's forward and backward; v * 0 keeps
// NaN and the sign of zero), ZERO m ? v : +0 (ReLU's backward), SELECT m ? v : v * s
// (LeakyReLU's forward and backward).
constexpr int MASK_MUL = 0, MASK_ZERO = 1, MASK_SELECT = 2;

// (ZERO and SELECT pick between bit patterns with an and-mask: as `m ? v : w` the compiler
// vectorised them by halves, ReLU's backward at 2.7 times a MUL's time.)
inline float either(float v, float w, u32 m) {
    u32 a, b;
    std::memcpy(&a, &v, 4);
    std::memcpy(&b, &w, 4);
    const u32 keep = 0u - m;  // all ones where m is 1
    const u32 r = (a & keep) | (b & ~keep);
    float out;
    std::memcpy(&out, &r, 4);
    return out;
}

template <int MODE>
inline float combined(float v, u32 m, float s, bool scaled) {
    if (MODE == MASK_ZERO) return either(v, 0.0f, m);
    if (MODE == MASK_SELECT) return either(v, v * s, m);
    const float w = v * either(1.0f, 0.0f, m);  // (m as a float, by its bits as well)
    return scaled ? w * s : w;
}

// The loops below are called through `restrict` pointers, as two functions: out-of-place
// (x, data and out apart) and in place (out is x); NAME##_op<MODE>::run picks one. Without
// them the compiler checks at run time whether out overlaps x and, on a fresh output, took a
// slower path there: a 49 MB dropout mask applied into a new tensor in 49 ms against 26 with
// them (page faults and all).
#define GNNACT_MASK_OP(NAME)                                                                  \
    template <int MODE>                                                                     \
    void NAME(const float* __restrict x, float* __restrict out, u8* __restrict data, i64 n,   \
              float s) {                                                                    \
        NAME##_body<MODE>(x, out, data, n, s);                                              \
    }                                                                                       \
    template <int MODE>                                                                     \
    void NAME##_in_place(float* __restrict x, u8* __restrict data, i64 n, float s) {          \
        NAME##_body<MODE>(x, x, data, n, s);                                                \
    }                                                                                       \
    template <int MODE>                                                                     \
    struct NAME##_op {                                                                      \
        static void run(const float* x, float* out, u8* data, i64 n, float s) {             \
            if (out == x) {                                                                 \
                NAME##_in_place<MODE>(out, data, n, s);                                     \
            } else {                                                                        \
                NAME<MODE>(x, out, data, n, s);                                             \
            }                                                                               \
        }                                                                                   \
    };

// Op<mode>::run(args...) for a mode known at run time: 0, or -1 for one not in 0-2.
template <template <int> class Op, typename... Args>
int by_mode(int mode, Args... args) {
    switch (mode) {
        case MASK_MUL: Op<MASK_MUL>::run(args...); return 0;
        case MASK_ZERO: Op<MASK_ZERO>::run(args...); return 0;
        case MASK_SELECT: Op<MASK_SELECT>::run(args...); return 0;
    }
    return -1;
}

// Elements [0, n) of x with the bits of data (element j: bit j % 8 of byte j / 8) into out,
// a byte's eight at a time.
template <int MODE>
inline __attribute__((always_inline)) void apply_mask_body(const float* x, float* out,
                                                           const u8* data, i64 n, float s) {
    const bool scaled = s != 1.0f;
    const i64 whole = n >> 3;
    for (i64 k = 0; k < whole; ++k) {
        const u32 byte = data[k];
        for (int l = 0; l < 8; ++l) {
            out[8 * k + l] = combined<MODE>(x[8 * k + l], (byte >> l) & 1, s, scaled);
        }
    }
    for (i64 j = 8 * whole; j < n; ++j) {
        out[j] = combined<MODE>(x[j], (data[j >> 3] >> (j & 7)) & 1, s, scaled);
    }
}

// [x > 0] packed into data, and MODE's combination of x with it into out.
template <int MODE>
inline __attribute__((always_inline)) void sign_mask_body(const float* x, float* out, u8* data,
                                                          i64 n, float s) {
    const bool scaled = s != 1.0f;
    const i64 whole = n >> 3;
    for (i64 k = 0; k < whole; ++k) {
        u32 byte = 0;
        for (int l = 0; l < 8; ++l) {
            const u32 m = x[8 * k + l] > 0.0f;  // (each value's bit from its own compare)
            byte |= m << l;
            out[8 * k + l] = combined<MODE>(x[8 * k + l], m, s, scaled);
        }
        data[k] = (u8)byte;
    }
    if (8 * whole < n) {
        u32 byte = 0;
        for (i64 j = 8 * whole; j < n; ++j) byte |= (u32)(x[j] > 0.0f) << (j & 7);
        data[whole] = (u8)byte;
        for (i64 j = 8 * whole; j < n; ++j) {
            out[j] = combined<MODE>(x[j], (byte >> (j & 7)) & 1, s, scaled);
        }
    }
}

GNNACT_MASK_OP(apply_mask)
GNNACT_MASK_OP(sign_mask)

// PyTorch's CPU generator: MT19937 as ATen's mt19937 engine runs it (state words, `left`
// calls until the next twist, index `next` of the next word), and its Bernoulli draw for a
// float tensor, one element after the other: two 32-bit outputs a, b, the 53 low bits of
// (a << 32) | b as the uniform u 2^-53, kept when u < q. With T = ceil(q 2^53) that is
// (u 2^53) < T in integers, exactly (gnnact.kernels.cpu.bernoulli_bits computes T).
constexpr int MT_N = 624, MT_M = 397;

inline u32 mt_twist(u32 u, u32 v) {
    return (((u & 0x80000000u) | (v & 0x7fffffffu)) >> 1) ^ ((v & 1u) ? 0x9908b0dfu : 0u);
}

void mt_next_state(u32* s) {
    int i = 0;
    for (; i < MT_N - MT_M; ++i) s[i] = s[i + MT_M] ^ mt_twist(s[i], s[i + 1]);
    for (; i < MT_N - 1; ++i) s[i] = s[i + MT_M - MT_N] ^ mt_twist(s[i], s[i + 1]);
    s[MT_N - 1] = s[MT_M - 1] ^ mt_twist(s[MT_N - 1], s[0]);
}

// `count` outputs of the engine into out, as `count` calls of it would return them.
void mt_fill(u32* s, i64& left, i64& next, u32* out, i64 count) {
    for (i64 k = 0; k < count;) {
        if (left == 1) {  // the next call twists (and leaves left = MT_N after its draw)
            mt_next_state(s);
            left = MT_N + 1;
            next = 0;
        }
        const i64 take = std::min(left - 1, count - k);
        const u32* w = s + next;
        for (i64 t = 0; t < take; ++t) {  // (the tempering: vectorised)
            u32 y = w[t];
            y ^= y >> 11;
            y ^= (y << 7) & 0x9d2c5680u;
            y ^= (y << 15) & 0xefc60000u;
            out[k + t] = y ^ (y >> 18);
        }
        next += take;
        left -= take;
        k += take;
    }
}

}  // namespace

#define GNNACT_WIDTHS(F) F(1) F(2) F(3) F(4) F(5) F(6) F(7) F(8)

extern "C" {

// Groups of x[0 .. n) (float32, contiguous), x[0] being element `start` of the tensor (a
// multiple of group_size) for the noise; returns 0, or -1 for a width not in 1-8.
int gnnact_quantize(const float* x, i64 start, i64 n, i64 group_size, int bits, u32 s0, u32 s1,
                    u8* codes, float* scales, float* zeros, i64 bytes_per_group) {
    switch (bits) {
#define CASE(B)                                                                        \
    case B:                                                                            \
        quantize_all<B>(x, start, n, group_size, s0, s1, codes, scales, zeros,         \
                        bytes_per_group);                                              \
        return 0;
        GNNACT_WIDTHS(CASE)
#undef CASE
    }
    return -1;
}

// Groups of x[0 .. n) as gnnact_quantize takes them, rounded onto the grids of zeros[g] and
// invs[g] (round_group_on_grid; how many values of each were clipped into clipped[g]);
// returns 0, or -1 for a width not in 1-8.
int gnnact_round_on_grid(const float* x, i64 start, i64 n, i64 group_size, int bits, u32 s0,
                         u32 s1, const float* zeros, const float* invs, float low, float high,
                         u8* codes, i64 bytes_per_group, i64* clipped) {
    switch (bits) {
#define CASE(B)                                                                        \
    case B:                                                                            \
        round_all_on_grid<B>(x, start, n, group_size, s0, s1, zeros, invs, low, high,  \
                             codes, bytes_per_group, clipped);                         \
        return 0;
        GNNACT_WIDTHS(CASE)
#undef CASE
    }
    return -1;
}

// float32 out[0 .. n) from the groups' codes, scales and zeros; 0, or -1 for a bad width.
int gnnact_dequantize(const u8* codes, const float* scales, const float* zeros, i64 n,
                      i64 group_size, int bits, i64 bytes_per_group, float* out) {
    switch (bits) {
#define CASE(B)                                                                        \
    case B:                                                                            \
        dequantize_all<B>(codes, scales, zeros, n, group_size, bytes_per_group, out);  \
        return 0;
        GNNACT_WIDTHS(CASE)
#undef CASE
    }
    return -1;
}

// float32 x[0 .. n) with the packed mask `data` into out (may be x): 0, or -1 for a bad mode.
int gnnact_apply_mask(const float* x, const u8* data, float* out, i64 n, int mode, float s) {
    // (data read only: the two ops' shared signature)
    return by_mode<apply_mask_op>(mode, x, out, const_cast<u8*>(data), n, s);
}

// The keep bits of n Bernoulli(q) draws (threshold = ceil(q 2^53)) from the CPU generator
// state `state` (the bytes of torch.Generator.get_state(): ATen's THGeneratorState, whose
// int32 `left` is at byte 8, uint64 `next` at 16 and 624 uint64 words at 24), advanced in
// place as the draws advance it; element j in bit j % 8 of byte j / 8 of bits (ceil(n / 8)
// bytes, the last one's unused bits 0). Returns 0, or -1 for a state the engine could not be
// in (not that layout).
int gnnact_bernoulli_bits(u8* state, i64 n, u64 threshold, u8* bits) {
    int32_t left32;
    u64 next64, stored[MT_N];
    std::memcpy(&left32, state + 8, 4);
    std::memcpy(&next64, state + 16, 8);
    std::memcpy(stored, state + 24, sizeof stored);
    i64 left = left32, next = (i64)next64;
    if (left < 1 || left > MT_N || next < 0 || next + left - 1 > MT_N) return -1;
    u32 words32[MT_N];
    for (int i = 0; i < MT_N; ++i) {
        if (stored[i] >> 32) return -1;
        words32[i] = (u32)stored[i];
    }
    constexpr i64 CHUNK = 1024;  // elements a round (a multiple of 8)
    u32 drawn[2 * CHUNK];
    constexpr u64 LOW53 = (u64(1) << 53) - 1;
    for (i64 j0 = 0; j0 < n; j0 += CHUNK) {
        const i64 m = std::min(CHUNK, n - j0);
        mt_fill(words32, left, next, drawn, 2 * m);
        u8* out = bits + (j0 >> 3);
        for (i64 k = 0; k < (m + 7) / 8; ++k) {
            u32 byte = 0;
            for (int l = 0; l < 8 && 8 * k + l < m; ++l) {
                const i64 e = 8 * k + l;
                const u64 u = (((u64)drawn[2 * e] << 32) | drawn[2 * e + 1]) & LOW53;
                byte |= (u32)(u < threshold) << l;
            }
            out[k] = (u8)byte;
        }
    }
    for (int i = 0; i < MT_N; ++i) stored[i] = words32[i];
    left32 = (int32_t)left;
    next64 = (u64)next;
    std::memcpy(state + 8, &left32, 4);
    std::memcpy(state + 16, &next64, 8);
    std::memcpy(state + 24, stored, sizeof stored);
    return 0;
}

// [x > 0] of float32 x[0 .. n) into data (ceil(n / 8) bytes) and the mode's combination into
// out (may be x): 0, or -1 for a bad mode.
int gnnact_sign_mask(const float* x, float* out, u8* data, i64 n, int mode, float s) {
    return by_mode<sign_mask_op>(mode, x, out, data, n, s);
}
}
