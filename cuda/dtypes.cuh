// gnnact: the integer and element types every kernel source shares. Not compiled on its own:
// gnnact.kernels._cupy.kernel_source (and tools/check_kernels.py) put it in place of the
// `#include "dtypes.cuh"` line of a source, so NVRTC gets one self-contained program.

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;

// ---- element types ----
// load/store: as float, from float (round to nearest even), what quantization computes in.
// Op, op_load, op_store: the type PyTorch computes an elementwise op in ("opmath": float for
// float, half and bfloat16, double for double) and the exact conversions to and from it.
// paired: two values of a 32-bit word (the first in the low half) are taken by one packed
// instruction (sm_80+) where an exact result allows it: pair_min is the fminf of each half (NaN
// loses, as there), pair_max_nan the maximum of each half that is NaN where either is (as
// max_nan below); pair_inf and pair_minus_inf hold +inf and -inf twice.
struct F32 {
    static constexpr bool paired = false;
    typedef float T;
    typedef float Op;
    static __device__ __forceinline__ float load(T v) { return v; }
    static __device__ __forceinline__ T store(float v) { return v; }
    static __device__ __forceinline__ Op op_load(T v) { return v; }
    static __device__ __forceinline__ T op_store(Op v) { return v; }
};
struct F64 {
    static constexpr bool paired = false;
    typedef double T;
    typedef double Op;
    static __device__ __forceinline__ float load(T v) { return __double2float_rn(v); }
    static __device__ __forceinline__ T store(float v) { return (double)v; }
    static __device__ __forceinline__ Op op_load(T v) { return v; }
    static __device__ __forceinline__ T op_store(Op v) { return v; }
};
// The packed-pair operations of float16 (BF = false) and bfloat16 (BF = true), as `paired`
// above describes them.
template <bool BF>
struct PairOps {
    static constexpr bool paired = true;
    static __device__ __forceinline__ u32 pair_min(u32 a, u32 b) {
        u32 d;
        if (BF) asm("min.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
        else asm("min.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
        return d;
    }
    static __device__ __forceinline__ u32 pair_max_nan(u32 a, u32 b) {
        u32 d;
        if (BF) asm("max.NaN.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
        else asm("max.NaN.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
        return d;
    }
};

// The larger of a and b, NaN where either is (PTX max.NaN, sm_80+; fmaxf drops a NaN).
__device__ __forceinline__ float max_nan(float a, float b) {
    float d;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
    return d;
}

struct F16 : PairOps<false> {
    static constexpr u32 pair_inf = 0x7c007c00u, pair_minus_inf = 0xfc00fc00u;
    typedef u16 T;
    typedef float Op;
    static __device__ __forceinline__ float load(T v) {
        float f;
        asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v));
        return f;
    }
    static __device__ __forceinline__ T store(float v) {
        u16 h;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
        return h;
    }
    static __device__ __forceinline__ Op op_load(T v) { return load(v); }
    static __device__ __forceinline__ T op_store(Op v) { return store(v); }
};
struct BF16 : PairOps<true> {
    static constexpr u32 pair_inf = 0x7f807f80u, pair_minus_inf = 0xff80ff80u;
    typedef u16 T;
    typedef float Op;
    static __device__ __forceinline__ float load(T v) { return __uint_as_float(((u32)v) << 16); }
    static __device__ __forceinline__ T store(float v) {
        u16 h;
        asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(v));
        return h;
    }
    static __device__ __forceinline__ Op op_load(T v) { return load(v); }
    static __device__ __forceinline__ T op_store(Op v) { return store(v); }
};

// ---- octets: 8 consecutive elements, moved as 16-byte words ----
struct alignas(16) Word16 {
    u32 a, b, c, d;
};

// 8 elements of T as sizeof(T) / 2 16-byte words, for vector loads and stores.
template <typename T>
union Octet {
    Word16 w[sizeof(T) / 2];
    T v[8];
};

// The 8 elements at p, which must be 16-byte aligned, by 16-byte loads.
template <typename T>
__device__ __forceinline__ void load8(const T* p, T (&v)[8]) {
    Octet<T> o;
    const Word16* w = reinterpret_cast<const Word16*>(p);
#pragma unroll
    for (int k = 0; k < (int)(sizeof(T) / 2); ++k) o.w[k] = w[k];
#pragma unroll
    for (int k = 0; k < 8; ++k) v[k] = o.v[k];
}

// v to the 8 elements at p, which must be 16-byte aligned, by 16-byte stores.
template <typename T>
__device__ __forceinline__ void store8(T* p, const T (&v)[8]) {
    Octet<T> o;
#pragma unroll
    for (int k = 0; k < 8; ++k) o.v[k] = v[k];
    Word16* w = reinterpret_cast<Word16*>(p);
#pragma unroll
    for (int k = 0; k < (int)(sizeof(T) / 2); ++k) w[k] = o.w[k];
}
