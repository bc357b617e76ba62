"""The index arithmetic of ``cuda/quantize.cu``, emulated on the CPU: which lane writes which
byte and reads which code, for every width, group size and a short last group.

A GPU checks the kernels against the reference (``tests/test_kernels.py``, ``-m cuda``); these
tests check, everywhere, that the loops the kernels are built from cover every byte and every
element exactly once and lay codes out as the reference packs them. The emulation transcribes
the kernel's loops line for line; the source lines it follows are asserted to be in the kernel,
so that an edit there fails here until the emulation follows.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gnnact.kernels import kernel_source_dir
from gnnact.kernels.quantize import _THREADS, _WARPS_PER_BLOCK, _group_grid
from gnnact.quant import reference
from gnnact.quant.packed import packed_code_bytes

WARP = 32
# The loop heads and index expressions emulated below, as they read in cuda/quantize.cu.
KERNEL_LINES = (
    "for (i64 g = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); g < num_groups;",
    "g += warps) {",
    "const i64 warps = (i64)gridDim.x * (blockDim.x >> 5);",
    "const i64 len = min(group_size, n - start);",
    "constexpr int UNIT = (8 % BITS == 0) ? 8 / BITS : 8;",
    "for (i64 base = 0; base < len; base += 32) {",
    "const i64 j = base + lane;",
    "j < len ? round_code<L>(x, noise, start + j, zero, inv, levels, s0, s1) : 0u;",
    "u64 word = (u64)code << ((lane % UNIT) * BITS);",
    "for (int d = 1; d < UNIT; d <<= 1) {",
    "const u32 lo = __shfl_xor_sync(0xffffffffu, (u32)word, d);",
    "const u32 hi = __shfl_xor_sync(0xffffffffu, (u32)(word >> 32), d);",
    "word |= ((u64)hi << 32) | (u64)lo;",
    "if (lane % UNIT == 0 && j < len) {",
    "const i64 unit = j / UNIT;",
    "out[unit] = (u8)word;",
    "const i64 b = unit * BITS + k;",
    "if (b < bytes_per_group) out[b] = (u8)(word >> (8 * k));",
    "const i64 used = (8 % BITS == 0) ? (len + UNIT - 1) / UNIT : ((len + 7) / 8) * BITS;",
    "for (i64 b = used + lane; b < bytes_per_group; b += 32) out[b] = 0;",
    "for (i64 j = lane; j < len; j += 32) {",
    "const i64 bit = j * BITS;",
    "const int shift = (int)(bit & 7);",
    "u32 v = (u32)in[bit >> 3] >> shift;",
    "if (shift + BITS > 8) v |= (u32)in[(bit >> 3) + 1] << (8 - shift);",
    "const float q = (float)(v & mask);",
)


def test_the_emulated_lines_are_the_kernels():
    source = (kernel_source_dir() / "quantize.cu").read_text()
    missing = [line for line in KERNEL_LINES if line not in source]
    assert not missing, f"cuda/quantize.cu changed; update this emulation: {missing}"


def _groups_by_warp(num_groups: int) -> list[int]:
    """The groups each warp of the launch takes, in launch order (grid-stride loop)."""
    blocks = _group_grid(num_groups)
    warps_per_block = _THREADS // WARP
    assert warps_per_block == _WARPS_PER_BLOCK
    warps = blocks * warps_per_block
    taken = []
    for block in range(blocks):
        for warp in range(warps_per_block):
            g = block * warps_per_block + warp
            while g < num_groups:
                taken.append(g)
                g += warps
    return taken


def emulate_pack(q: np.ndarray, bits: int, group_size: int) -> tuple[np.ndarray, np.ndarray]:
    """quantize_impl's packing of the codes ``q`` (one per element): ``(codes, writes)``, the
    bytes as the kernel leaves them (0xAB where nothing was written, like torch.empty's
    garbage) and how many times each byte was written."""
    n = q.size
    num_groups = -(-n // group_size)
    bytes_per_group = packed_code_bytes(group_size, bits)
    codes = np.full((num_groups, bytes_per_group), 0xAB, dtype=np.int64)
    writes = np.zeros_like(codes)
    unit_codes = 8 // bits if 8 % bits == 0 else 8
    mask64 = (1 << 64) - 1
    for g in _groups_by_warp(num_groups):
        start = g * group_size
        length = min(group_size, n - start)
        out, count = codes[g], writes[g]
        for base in range(0, length, WARP):  # one pass: the 32 lanes at once
            words = []
            for lane in range(WARP):
                j = base + lane
                code = int(q[start + j]) if j < length else 0
                words.append((code << ((lane % unit_codes) * bits)) & mask64)
            d = 1
            while d < unit_codes:  # __shfl_xor_sync: every lane reads its partner's old word
                words = [w | words[lane ^ d] for lane, w in enumerate(words)]
                d <<= 1
            for lane in range(WARP):
                j = base + lane
                if lane % unit_codes == 0 and j < length:
                    unit = j // unit_codes
                    if 8 % bits == 0:
                        out[unit], count[unit] = words[lane] & 0xFF, count[unit] + 1
                    else:
                        for k in range(bits):
                            b = unit * bits + k
                            if b < bytes_per_group:
                                out[b] = (words[lane] >> (8 * k)) & 0xFF
                                count[b] += 1
        used = (-(-length // unit_codes) if 8 % bits == 0
                else ((length + 7) // 8) * bits)
        for lane in range(WARP):
            for b in range(used + lane, bytes_per_group, WARP):
                out[b], count[b] = 0, count[b] + 1
    return codes, writes


def emulate_unpack(codes: np.ndarray, bits: int, group_size: int,
                   n: int) -> tuple[np.ndarray, np.ndarray]:
    """dequantize_impl's reading of the codes: ``(q, writes)`` per element."""
    num_groups, _ = codes.shape
    q = np.full(n, -1, dtype=np.int64)
    writes = np.zeros(n, dtype=np.int64)
    mask = (1 << bits) - 1
    for g in _groups_by_warp(num_groups):
        start = g * group_size
        length = min(group_size, n - start)
        row = codes[g]
        for lane in range(WARP):
            for j in range(lane, length, WARP):
                bit = j * bits
                shift = bit & 7
                v = int(row[bit >> 3]) >> shift
                if shift + bits > 8:
                    v |= int(row[(bit >> 3) + 1]) << (8 - shift)
                q[start + j] = v & mask
                writes[start + j] += 1
    return q, writes


CASES = [(4096, 512), (5000, 512), (1000, 100), (999, 13), (17, 7), (9, 1), (3, 8),
         (2 * 2048 + 5, 2048)]


@pytest.mark.parametrize("bits", range(1, 9))
@pytest.mark.parametrize(("n", "group_size"), CASES)
def test_packing_writes_every_byte_once_as_the_reference_packs(bits, n, group_size):
    generator = torch.Generator().manual_seed(bits * 7919 + n)
    q = torch.randint(0, 1 << bits, (n,), generator=generator)
    codes, writes = emulate_pack(q.numpy(), bits, group_size)
    assert (writes == 1).all(), "a byte written never or twice (two lanes racing)"
    # The reference's layout: codes past the end of a short last group are 0.
    groups = -(-n // group_size)
    padded = torch.zeros(groups * group_size)
    padded[:n] = q.to(torch.float32)
    want = reference.pack_codes(padded.view(groups, group_size), bits)
    assert np.array_equal(codes, want.numpy().astype(np.int64))


@pytest.mark.parametrize("bits", range(1, 9))
@pytest.mark.parametrize(("n", "group_size"), CASES)
def test_unpacking_reads_every_element_once_as_the_reference_unpacks(bits, n, group_size):
    generator = torch.Generator().manual_seed(bits * 104729 + n)
    x = torch.randn(n, generator=generator)
    codes, scales, zeros = reference.quantize_groups(x, bits, group_size, seed=1)
    q, writes = emulate_unpack(codes.numpy().astype(np.int64), bits, group_size, n)
    assert (writes == 1).all(), "an element written never or twice"
    # q s + Z as the reference computes it: the reference's codes, element by element.
    groups = torch.arange(n) // group_size
    restored = (torch.from_numpy(q).to(torch.float32) * scales[groups]) + zeros[groups]
    want = reference.dequantize_groups(codes, scales, zeros, bits, group_size, n, torch.float32)
    assert torch.equal(restored, want)


@pytest.mark.parametrize("num_groups", [1, 7, 8, 9, 1000, 65_537])
def test_the_grid_takes_every_group_once(num_groups):
    taken = _groups_by_warp(num_groups)
    assert sorted(taken) == list(range(num_groups))


# ----------------------------------------------------------------------------- cuda/mask.cu

# sign_mask_impl's loop and stores, as they read in cuda/mask.cu.
MASK_LINES = (
    "const int lane = threadIdx.x & 31;",
    "const i64 warp = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;",
    "const i64 warps = ((i64)gridDim.x * blockDim.x) >> 5;",
    "const i64 nbytes = (n + 7) >> 3;",
    "for (i64 base = warp << 5; base < n; base += warps << 5) {",
    "const i64 i = base + lane;",
    "const u32 word = __ballot_sync(0xffffffffu, m);",
    "const i64 b = (base >> 3) + lane;",
    "if (lane < 4 && b < nbytes) packed[b] = (u8)(word >> (8 * lane));",
    "const bool m = (packed[i >> 3] >> (i & 7)) & 1;",
)


def test_the_emulated_mask_lines_are_the_kernels():
    source = (kernel_source_dir() / "mask.cu").read_text()
    missing = [line for line in MASK_LINES if line not in source]
    assert not missing, f"cuda/mask.cu changed; update this emulation: {missing}"


def emulate_sign_mask(mask: np.ndarray, blocks: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """sign_mask_impl's stores for the tests ``mask`` (one per element) on ``blocks`` blocks
    of _THREADS threads: ``(packed, byte_writes, element_writes)``."""
    n = mask.size
    nbytes = (n + 7) >> 3
    packed = np.full(nbytes, 0xAB, dtype=np.int64)
    byte_writes = np.zeros(nbytes, dtype=np.int64)
    element_writes = np.zeros(n, dtype=np.int64)
    warps = (blocks * _THREADS) >> 5
    for warp in range(warps):
        base = warp << 5
        while base < n:
            word = 0
            for lane in range(WARP):  # __ballot_sync: bit `lane` of every lane's test
                i = base + lane
                m = bool(mask[i]) if i < n else False
                if i < n:
                    element_writes[i] += 1
                word |= int(m) << lane
            for lane in range(WARP):
                b = (base >> 3) + lane
                if lane < 4 and b < nbytes:
                    packed[b] = (word >> (8 * lane)) & 0xFF
                    byte_writes[b] += 1
            base += warps << 5
    return packed, byte_writes, element_writes


@pytest.mark.parametrize("n", [1, 7, 8, 31, 32, 33, 1000, 70_001])
@pytest.mark.parametrize("blocks", [1, 3, None])
def test_ballot_packing_writes_each_byte_once_in_pack_mask_layout(n, blocks):
    """The launcher's grid (None) and smaller ones (the loop strides): every element is
    written by one lane, every byte of the packed mask by one lane, in pack_mask's layout."""
    from gnnact.kernels.quantize import _elementwise_grid

    mask = torch.rand(n, generator=torch.Generator().manual_seed(n)) > 0.4
    packed, byte_writes, element_writes = emulate_sign_mask(
        mask.numpy(), _elementwise_grid(n) if blocks is None else blocks)
    assert (element_writes == 1).all() and (byte_writes == 1).all()
    assert np.array_equal(packed, reference.pack_mask_bits(mask).numpy().astype(np.int64))
