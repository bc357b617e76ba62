// gnnact: 1-bit masks (ReLU / LeakyReLU sign, dropout keep mask).
//
// Layout (gnnact/quant/reference.py, pack_mask_bits): element i of the flat mask is bit i % 8
// of byte i / 8; unused bits of the last byte are 0. torch.bool stores one byte per element,
// so packing keeps 8x less. Compiled by CuPy (NVRTC) from gnnact/kernels/quantize.py.

typedef unsigned char u8;
typedef long long i64;

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
