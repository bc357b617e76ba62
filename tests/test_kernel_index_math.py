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
from gnnact.kernels.quantize import _THREADS, _WARPS_PER_BLOCK, _group_grid, vector_ok
from gnnact.quant import reference
from gnnact.quant.packed import packed_code_bytes

WARP = 32
# Each op's shape (cuda/quantize.cu's defines): lanes sharing a group, octets kept per lane.
QUANTIZE_LANES, QUANTIZE_CACHED = 16, 4
DEQUANTIZE_LANES, DEQUANTIZE_CACHED = 32, 2
# The widths (bit b for b bits) whose whole groups store words gathered across lanes, by the
# element size: WORD_STORES (3, 5, 6 and 7 bits) and HALF_WORD_STORES (7 bits).
WORD_WIDTHS = {8: 232, 4: 232, 2: 128}
# The loop heads and index expressions emulated below, as they read in cuda/quantize.cu.
KERNEL_LINES = (
    f"#define QUANTIZE_LANES {QUANTIZE_LANES}",
    f"#define QUANTIZE_CACHED {QUANTIZE_CACHED}",
    f"#define DEQUANTIZE_LANES {DEQUANTIZE_LANES}",
    f"#define DEQUANTIZE_CACHED {DEQUANTIZE_CACHED}",
    "#define SEGMENTS (32 / OP_LANES)",
    "const int sub = lane % OP_LANES, segment = lane / OP_LANES;",
    "i64 base = ((i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * SEGMENTS;",
    "for (; base < num_groups; base += stride) {",
    "const i64 stride = (i64)gridDim.x * (blockDim.x >> 5) * SEGMENTS;",
    "const i64 g = base + segment;",
    "return g < num_groups ? min(group_size, n - g * group_size) : 0;",
    "if (g >= num_groups) continue;  // no shuffles below: a segment may skip its pass",
    "const i64 len = min(group_size, n - start);",
    "const i64 len = Whole ? WHOLE_GROUP : group_length(g, a.num_groups, group_size, a.n);",
    "#define WHOLE_GROUP (8 * OP_LANES * OP_CACHED)",
    "const i64 octets = (len + 7) >> 3;",
    "for (int c = 0; c < OP_CACHED; ++c) {",
    "const i64 o = sub + OP_LANES * c;",
    "if (Whole || o < octets) {",
    "const bool whole_groups = a.vec && a.group_size == WHOLE_GROUP;",
    "const bool whole = whole_groups && (base + SEGMENTS) * WHOLE_GROUP <= a.n;",
    "for (i64 o = sub + OP_LANES * OP_CACHED; o < octets; o += OP_LANES) {",
    "const int count = (int)min((i64)8, len - 8 * o);",
    "store_codes<BITS>(out, o * BITS, bytes_per_group, vec,",
    "word = pack_octet<BITS, Hashed>(v, noise, start + 8 * o, count, vec, zero, inv,",
    "if (!usable) word = 0;",
    # a whole group's words at the widths each dtype's setting names
    f"#define WORD_STORES {WORD_WIDTHS[4]}",
    f"#define HALF_WORD_STORES {WORD_WIDTHS[2]}",
    "constexpr int Widths = sizeof(typename L::T) == 2 ? HALF_WORD_STORES : WORD_STORES;",
    "constexpr bool Words = Whole && (BITS & (BITS - 1)) != 0 && ((Widths >> BITS) & 1);",
    "store_slot_words<BITS>(reinterpret_cast<u32*>(out + OP_LANES * c * BITS), sub,",
    "constexpr int Words = OP_LANES * BITS / 4;",
    "for (int w0 = 0; w0 < Words; w0 += OP_LANES) {",
    "const int w = w0 + sub;",
    "const int a = 4 * w / BITS;",
    "const int s = 32 * w - 8 * BITS * a;",
    "const W first = __shfl_sync(0xffffffffu, word, a, OP_LANES);",
    "const u32 next = __shfl_sync(0xffffffffu, (u32)word, a + 1, OP_LANES);",
    "const u32 v = (u32)((first >> s) | ((W)next << (8 * BITS - s)));",
    "if (Words % OP_LANES == 0 || w < Words) out[w] = v;",
    # the noise keys of a whole group's cached octets
    "constexpr bool Keyed = Whole && ((WHOLE_GROUP / 8) & (WHOLE_GROUP / 8 - 1)) == 0;",
    "const u64 first_octet = (u64)start >> 3;",
    "const u32 key_lo = ((u32)first_octet | (u32)sub) ^ s0;",
    "const u32 key_hi = (u32)(first_octet >> 32) ^ s1;",
    "if (Hashed) keyed_hashes(key_lo ^ (u32)(OP_LANES * c), key_hi, h);",
    "keyed_hashes((u32)o ^ s0, (u32)(o >> 32) ^ s1, h);",
    "for (int k = 0; k < 8; ++k) q[k] = round_code(v[k], r[k], zero, inv);",
    "return count < 8 ? word & (((W)1 << (count * BITS)) - 1) : word;",
    "n[k] = hashed_noise(hash_pair((u64)(at + k) >> 1, s0, s1), (k + 1) & 1);",
    "if (vec && count == 8) {",
    "load8(x + at, raw);",
    "for (int k = 0; k < 8; ++k) raw[k] = k < count ? x[at + k] : first;",
    "if (vec && BITS == 2) return *reinterpret_cast<const u16*>(in + b);",
    "if (b + k < limit) word |= (W)in[b + k] << (8 * k);",
    "*reinterpret_cast<u64*>(out + b) = (u64)word;",
    "*reinterpret_cast<u16*>(out + b + 2 * k) = (u16)(word >> (16 * k));",
    "if (b + k < limit) out[b + k] = (u8)(word >> (8 * k));",
    "for (i64 b = octets * BITS + sub; b < bytes_per_group; b += OP_LANES) out[b] = 0;",
    # dequantize: by 16-byte chunks
    "constexpr int E = ChunkOf<typename L::T>::E;  // values a chunk",
    "static constexpr int E = 16 / sizeof(T) < 8 ? 16 / sizeof(T) : 8;",
    "constexpr int PER = 8 / E;",
    "const i64 chunks = (len + E - 1) / E;",
    "const int shift = (sub % PER) * E * BITS;",
    "for (int c = 0; c < OP_CACHED * PER; ++c) {",
    "const i64 q = sub + OP_LANES * c;",
    "if (q < chunks) words[c] = octet_codes<BITS>(in, q / PER, bytes_per_group, vec);",
    "restore_chunk<L, BITS, E>(words[c] >> shift, scale, zero, out, start + E * q,",
    "(int)min((i64)E, len - E * q), vec);",
    "for (i64 q = sub + OP_LANES * OP_CACHED * PER; q < chunks; q += OP_LANES) {",
    "return load_codes<BITS>(in, o * BITS, bytes_per_group, vec);",
    "const float q = (float)((word >> (k * BITS)) & mask);",
    "if (vec && count == E) {",
    "if (k < count) out[at + k] = chunk.t[k];",
)
WIDE = (1, 2, 4, 8)  # widths whose octet is one aligned access with `vec`
WHOLE_GROUP = 8 * QUANTIZE_LANES * QUANTIZE_CACHED
SEGMENTS = WARP // QUANTIZE_LANES


def test_the_emulated_lines_are_the_kernels():
    source = (kernel_source_dir() / "quantize.cu").read_text()
    missing = [line for line in KERNEL_LINES if line not in source]
    assert not missing, f"cuda/quantize.cu changed; update this emulation: {missing}"


def _groups_by_segment(num_groups: int, lanes: int) -> list[int]:
    """The groups each segment of ``lanes`` lanes of the launch takes, in launch order (the
    grid-stride loop over a warp's ``32 / lanes`` groups at once, on the launcher's grid)."""
    segments = WARP // lanes
    blocks = _group_grid(-(-num_groups // segments))
    warps_per_block = _THREADS // WARP
    assert warps_per_block == _WARPS_PER_BLOCK
    stride = blocks * warps_per_block * segments
    taken = []
    for block in range(blocks):
        for warp in range(warps_per_block):
            base = (block * warps_per_block + warp) * segments
            while base < num_groups:
                taken += [g for g in range(base, base + segments) if g < num_groups]
                base += stride
    return taken


def _octets_by_lane(length: int) -> list[tuple[int, int]]:
    """``(lane, o)`` in the order quantize_group's two loops take a group's octets: the
    QUANTIZE_CACHED kept in registers, then the rest (each lane's grid-stride loop)."""
    octets = (length + 7) >> 3
    lanes, cached = QUANTIZE_LANES, QUANTIZE_CACHED
    taken = [(sub, sub + lanes * c) for c in range(cached) for sub in range(lanes)
             if sub + lanes * c < octets]
    taken += [(sub, o) for sub in range(lanes) for o in range(sub + lanes * cached, octets, lanes)]
    return taken


@pytest.mark.parametrize("first", [0, 5, 2**26 - 3, 2**26 + 7, 3 * 2**26 - 1, 2**40 + 1])
def test_whole_groups_key_each_octet_by_its_noise_index(first):
    """A whole group's cached octets are keyed from the lane's halves with OP_LANES c xored
    in: the same halves as the 64-bit noise index g 2^m + o gives (groups around 2^32 octets
    and past them included)."""
    whole = 8 * QUANTIZE_LANES * QUANTIZE_CACHED
    per_group = whole // 8
    assert per_group & (per_group - 1) == 0  # Keyed: a power of two of octets a group
    s0, s1 = 0x9E3779B9, 0x7F4A7C15
    mask = 0xFFFFFFFF
    for g in range(first, first + 3):
        first_octet = (g * whole) >> 3
        for sub in range(QUANTIZE_LANES):
            key_lo = ((first_octet & mask) | sub) ^ s0
            key_hi = ((first_octet >> 32) & mask) ^ s1
            for c in range(QUANTIZE_CACHED):
                o = first_octet + sub + QUANTIZE_LANES * c
                assert (key_lo ^ (QUANTIZE_LANES * c), key_hi) == ((o & mask) ^ s0,
                                                                   ((o >> 32) & mask) ^ s1)


def _vector_access(address: int, size: int) -> None:
    assert address % size == 0, f"a {size}-byte access at a misaligned byte {address}"


def emulate_pack(q: np.ndarray, bits: int, group_size: int, vec: bool,
                 itemsize: int = 4) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """quantize_group's stores of the codes ``q`` (one per element): ``(codes, writes, reads)``,
    the bytes as the kernel leaves them (0xAB where nothing was written, like torch.empty's
    garbage), how many times each byte was written and how many times each element was read
    in the rounding pass. Vector accesses assert their alignment (buffers start aligned)."""
    n = q.size
    num_groups = -(-n // group_size)
    bytes_per_group = packed_code_bytes(group_size, bits)
    codes = np.full(num_groups * bytes_per_group, 0xAB, dtype=np.int64)
    writes = np.zeros_like(codes)
    reads = np.zeros(n, dtype=np.int64)
    for g in _groups_by_segment(num_groups, QUANTIZE_LANES):
        start = g * group_size
        length = min(group_size, n - start)
        octets = (length + 7) >> 3
        base = g * bytes_per_group
        # The pass of this group's warp (base, a multiple of SEGMENTS) lies whole in the input.
        whole = (vec and group_size == WHOLE_GROUP
                 and (g - g % SEGMENTS + SEGMENTS) * WHOLE_GROUP <= n)
        if whole and bits not in WIDE and (WORD_WIDTHS[itemsize] >> bits) & 1:
            _store_slot_words(q, bits, start, base, codes, writes, reads)
            continue
        for _lane, o in _octets_by_lane(length):
            count = min(8, length - 8 * o)
            at = start + 8 * o
            if vec and count == 8:
                _vector_access(at * itemsize, 16)
            word = 0
            for k in range(8):
                if k < count:
                    word |= int(q[at + k]) << (k * bits)
                    reads[at + k] += 1
            b = o * bits
            if vec and bits in WIDE:
                _vector_access(base + b, bits)
                assert b + bits <= bytes_per_group
                stored = range(b, b + bits)
            elif vec and bits == 6:  # three 2-byte stores
                for k in range(3):
                    _vector_access(base + b + 2 * k, 2)
                assert b + bits <= bytes_per_group
                stored = range(b, b + bits)
            else:
                stored = range(b, min(b + bits, bytes_per_group))
            for byte in stored:
                codes[base + byte] = (word >> (8 * (byte - b))) & 0xFF
                writes[base + byte] += 1
        for sub in range(QUANTIZE_LANES):
            for b in range(octets * bits + sub, bytes_per_group, QUANTIZE_LANES):
                codes[base + b], writes[base + b] = 0, writes[base + b] + 1
    return codes.reshape(num_groups, bytes_per_group), writes, reads


def _store_slot_words(q: np.ndarray, bits: int, start: int, base: int, codes: np.ndarray,
                      writes: np.ndarray, reads: np.ndarray) -> None:
    """store_slot_words for each slot c of a whole group at a width of WORD_WIDTHS: the code
    words of octets LANES c .. LANES c + LANES - 1 (lane sub's is octet sub + LANES c),
    gathered into aligned 4-byte words by shuffles within the segment (a source lane taken
    modulo LANES, as a shuffle of width LANES takes it)."""
    lanes = QUANTIZE_LANES
    words_per_slot = lanes * bits // 4
    for c in range(QUANTIZE_CACHED):
        word = []
        for sub in range(lanes):
            at = start + 8 * (sub + lanes * c)
            word.append(sum(int(q[at + k]) << (k * bits) for k in range(8)))
            reads[at:at + 8] += 1
        slot = base + lanes * c * bits
        for sub in range(lanes):
            for w0 in range(0, words_per_slot, lanes):
                w = w0 + sub
                a = 4 * w // bits
                s = 32 * w - 8 * bits * a
                first, following = word[a % lanes], word[(a + 1) % lanes] & 0xFFFFFFFF
                v = ((first >> s) | (following << (8 * bits - s))) & 0xFFFFFFFF
                if w < words_per_slot:
                    _vector_access(slot + 4 * w, 4)
                    for k in range(4):
                        codes[slot + 4 * w + k] = (v >> (8 * k)) & 0xFF
                        writes[slot + 4 * w + k] += 1


def emulate_unpack(codes: np.ndarray, bits: int, group_size: int, n: int,
                   vec: bool, itemsize: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """dequantize_impl's reading of the codes by chunks of E values (16 bytes): ``(q, writes)``
    per element. Chunk q of a group is part q % PER of octet q / PER; its lane loads the
    octet's code word (from global memory, or the copy a whole group at 3 and 5-7 bits stages
    in shared memory: the same bytes) and shifts it by its part."""
    num_groups, bytes_per_group = codes.shape
    q = np.full(n, -1, dtype=np.int64)
    writes = np.zeros(n, dtype=np.int64)
    mask = (1 << bits) - 1
    e = min(16 // itemsize, 8)
    per = 8 // e
    lanes, cached = DEQUANTIZE_LANES, DEQUANTIZE_CACHED
    for g in _groups_by_segment(num_groups, lanes):
        start = g * group_size
        length = min(group_size, n - start)
        chunks = (length + e - 1) // e
        row = codes[g]
        for sub in range(lanes):
            shift = (sub % per) * e * bits
            cached_chunks = [sub + lanes * c for c in range(cached * per)]
            rest = range(sub + lanes * cached * per, chunks, lanes)
            for chunk in [c for c in cached_chunks if c < chunks] + list(rest):
                b = (chunk // per) * bits
                if vec and bits in WIDE:
                    _vector_access(g * bytes_per_group + b, bits)
                    word = sum(int(row[b + k]) << (8 * k) for k in range(bits))
                else:
                    word = sum(int(row[b + k]) << (8 * k) for k in range(bits)
                               if b + k < bytes_per_group)
                word >>= shift
                count = min(e, length - e * chunk)
                if vec and count == e:
                    _vector_access((start + e * chunk) * itemsize, 16)
                for k in range(count):
                    q[start + e * chunk + k] = (word >> (k * bits)) & mask
                    writes[start + e * chunk + k] += 1
    return q, writes


CASES = [(4096, 512), (5000, 512), (1536, 512), (1000, 100), (999, 13), (17, 7), (9, 1), (3, 8),
         (2 * 2048 + 5, 2048), (1000, 40), (3000, 768)]


@pytest.mark.parametrize("itemsize", [4, 2], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "misaligned"])
@pytest.mark.parametrize("bits", range(1, 9))
@pytest.mark.parametrize(("n", "group_size"), CASES)
def test_packing_writes_every_byte_once_as_the_reference_packs(bits, n, group_size, aligned,
                                                               itemsize):
    """Both ways the launcher runs a kernel: by vectors (whole octets, group_size % 8 == 0,
    aligned buffers) and element by element; whole groups of 4-byte and 2-byte elements store
    words at different widths."""
    generator = torch.Generator().manual_seed(bits * 7919 + n)
    q = torch.randint(0, 1 << bits, (n,), generator=generator)
    vec = aligned and vector_ok(group_size, q)
    codes, writes, reads = emulate_pack(q.numpy(), bits, group_size, vec, itemsize)
    assert (writes == 1).all(), "a byte written never or twice (two lanes racing)"
    assert (reads == 1).all(), "an element rounded never or twice"
    # The reference's layout: codes past the end of a short last group are 0.
    groups = -(-n // group_size)
    padded = torch.zeros(groups * group_size)
    padded[:n] = q.to(torch.float32)
    want = reference.pack_codes(padded.view(groups, group_size), bits)
    assert np.array_equal(codes, want.numpy().astype(np.int64))


@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "misaligned"])
@pytest.mark.parametrize("bits", range(1, 9))
@pytest.mark.parametrize(("n", "group_size"), CASES)
def test_unpacking_reads_every_element_once_as_the_reference_unpacks(bits, n, group_size,
                                                                     aligned):
    generator = torch.Generator().manual_seed(bits * 104729 + n)
    x = torch.randn(n, generator=generator)
    codes, scales, zeros = reference.quantize_groups(x, bits, group_size, seed=1)
    q, writes = emulate_unpack(codes.numpy().astype(np.int64), bits, group_size, n,
                               aligned and vector_ok(group_size, x, codes))
    assert (writes == 1).all(), "an element written never or twice"
    # q s + Z as the reference computes it: the reference's codes, element by element.
    groups = torch.arange(n) // group_size
    restored = (torch.from_numpy(q).to(torch.float32) * scales[groups]) + zeros[groups]
    want = reference.dequantize_groups(codes, scales, zeros, bits, group_size, n, torch.float32)
    assert torch.equal(restored, want)


def test_vectors_only_for_octet_groups_in_aligned_buffers():
    x = torch.randn(1024)
    assert vector_ok(512, x) and vector_ok(40, x, None)
    assert not vector_ok(13, x)  # groups start mid-octet
    assert not vector_ok(512, x[1:])  # a view 4 bytes into an allocation
    assert vector_ok(512, x[4:])  # 16 bytes in


@pytest.mark.parametrize("lanes", [QUANTIZE_LANES, DEQUANTIZE_LANES])
@pytest.mark.parametrize("num_groups", [1, 7, 8, 9, 1000, 65_537])
def test_the_grid_takes_every_group_once(num_groups, lanes):
    taken = _groups_by_segment(num_groups, lanes)
    assert sorted(taken) == list(range(num_groups))


# ----------------------------------------------------------------------------- cuda/mask.cu

# sign_mask_impl's loop and stores, as they read in cuda/mask.cu.
MASK_LINES = (
    "const i64 octets = (n + 7) >> 3;",
    "const i64 stride = (i64)gridDim.x * blockDim.x;",
    "for (i64 o = (i64)blockIdx.x * blockDim.x + threadIdx.x; o < octets; o += stride) {",
    "const i64 at = o << 3;",
    "const int count = (int)min((i64)8, n - at);",
    "byte |= (u32)m << k;",
    "store_elements(y, at, count, vec, v);",
    "packed[o] = (u8)byte;",
    "if (k < count) v[k] = combine<D>(v[k], (byte >> k) & 1u, mode, so);",
)


def test_the_emulated_mask_lines_are_the_kernels():
    source = (kernel_source_dir() / "mask.cu").read_text()
    missing = [line for line in MASK_LINES if line not in source]
    assert not missing, f"cuda/mask.cu changed; update this emulation: {missing}"


def emulate_sign_mask(mask: np.ndarray, blocks: int, vec: bool,
                      itemsize: int = 4) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """sign_mask_impl's stores for the tests ``mask`` (one per element) on ``blocks`` blocks
    of _THREADS threads: ``(packed, byte_writes, element_writes)``; vector accesses assert
    their alignment (the buffers start aligned)."""
    n = mask.size
    octets = (n + 7) >> 3
    packed = np.full(octets, 0xAB, dtype=np.int64)
    byte_writes = np.zeros(octets, dtype=np.int64)
    element_writes = np.zeros(n, dtype=np.int64)
    stride = blocks * _THREADS
    for thread in range(stride):
        for o in range(thread, octets, stride):
            at = o << 3
            count = min(8, n - at)
            if vec and count == 8:
                _vector_access(at * itemsize, 16)
            byte = 0
            for k in range(8):
                if k < count:
                    byte |= int(mask[at + k]) << k
                    element_writes[at + k] += 1
            packed[o] = byte
            byte_writes[o] += 1
    return packed, byte_writes, element_writes


@pytest.mark.parametrize("n", [1, 7, 8, 31, 32, 33, 1000, 70_001])
@pytest.mark.parametrize("blocks", [1, 3, None])
@pytest.mark.parametrize("vec", [True, False], ids=["vectors", "elements"])
def test_mask_bytes_written_once_in_pack_mask_layout(n, blocks, vec):
    """The launcher's grid (None) and smaller ones (the loop strides): every element is
    written by one thread, every byte of the packed mask by one thread, in pack_mask's
    layout."""
    from gnnact.kernels.quantize import octet_grid

    mask = torch.rand(n, generator=torch.Generator().manual_seed(n)) > 0.4
    packed, byte_writes, element_writes = emulate_sign_mask(
        mask.numpy(), octet_grid(n) if blocks is None else blocks, vec)
    assert (element_writes == 1).all() and (byte_writes == 1).all()
    assert np.array_equal(packed, reference.pack_mask_bits(mask).numpy().astype(np.int64))
