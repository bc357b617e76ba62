"""gnnact.quant.philox, the torch path of PyTorch's fused CUDA dropout draws: Philox4x32-10 on
Random123's known-answer vectors, aten's launch arithmetic, the element-to-draw mapping
against a transcription in plain Python integers, and cuda/mask.cu's dropout_keep_bits run
on the host against it. (On a GPU, tests/test_rounding_seeds.py compares with
native_dropout itself.)"""

from __future__ import annotations

import host_kernels
import numpy as np
import pytest
import torch

from gnnact.quant import philox
from gnnact.quant.reference import unpack_mask_bits

# Random123's kat_vectors for philox4x32_10: counter, key, output.
KNOWN_ANSWERS = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


@pytest.mark.parametrize(("counter", "key", "want"), KNOWN_ANSWERS)
def test_philox_gives_random123s_known_answers(counter, key, want):
    got = philox.philox4x32(tuple(torch.tensor([c]) for c in counter), key)
    assert tuple(int(w) for w in got) == want


def test_the_launch_is_atens():
    # Below the grid cap one pass; the arxiv shape on an H100 (132 SMs of 2048 threads):
    # 1056 blocks, 41 passes.
    assert philox.dropout_launch(1024, 132, 2048) == (1024, 4)
    assert philox.dropout_launch(169343 * 256, 132, 2048) == (1056 * 256, 41 * 4)
    with pytest.raises(ValueError, match="numel must be positive, got 0"):
        philox.dropout_launch(0, 132, 2048)


def _uniform(r: int) -> float:
    """curand's uniform of a 32-bit word, fma(float(r), 2^-32, 2^-33) in float32."""
    word = np.float32(r)
    return float(np.float32(np.float64(word) * 2.0**-32 + 2.0**-33))


def _transcribed(numel: int, p: float, seed: int, offset: int, threads: int) -> torch.Tensor:
    """The mask value by value, as aten's kernel loops: each thread in passes of 4 values."""
    keep = np.float32(1.0 - p)
    mask = torch.zeros(numel, dtype=torch.bool)
    stride = 4 * threads
    for thread in range(threads):
        for step, first in enumerate(range(thread * 4, numel, stride)):
            counter = offset // 4 + step
            words = philox.philox4x32(
                tuple(torch.tensor([w]) for w in (counter & 0xFFFFFFFF, counter >> 32,
                                                  thread, 0)),
                (seed & 0xFFFFFFFF, seed >> 32))
            for lane in range(4):
                mask[first + lane] = bool(np.float32(_uniform(int(words[lane]))) < keep)
    return mask


@pytest.mark.parametrize(("numel", "threads", "offset", "seed"),
                         [(64, 4, 0, 0), (100, 8, 12, 2**40 + 7), (36, 64, 2**36, 123)])
def test_the_mapping_is_the_kernels_loop(numel, threads, offset, seed):
    bits = philox.dropout_keep_bits(numel, 0.3, seed, offset, threads)
    assert torch.equal(unpack_mask_bits(bits, numel), _transcribed(numel, 0.3, seed, offset,
                                                                   threads))


def test_bad_draws_are_refused():
    with pytest.raises(ValueError, match="numel must be a positive multiple of 4, got 6"):
        philox.dropout_keep_bits(6, 0.5, 0, 0, 256)
    with pytest.raises(ValueError, match="offset must be a non-negative multiple of 4, got 2"):
        philox.dropout_keep_bits(8, 0.5, 0, 2, 256)


@pytest.mark.skipif(host_kernels.compiler() is None, reason="no C++ compiler for the host")
@pytest.mark.parametrize(("numel", "threads", "offset", "seed", "p"),
                         [(4, 256, 0, 0, 0.5), (1028, 64, 40, 2**33 + 5, 0.3),
                          (2 * 2048 + 12, 256, 2**36 + 8, 77, 0.9), (2048, 2048, 4, 1, 0.1)])
def test_host_kernel_equals_the_reference(monkeypatch, numel, threads, offset, seed, p):
    """cuda/mask.cu's dropout_keep_bits through its Python launcher, run on the host: the
    reference's bytes, at one pass and several, offsets and seeds past 32 bits, a last byte
    half used."""
    from gnnact.kernels import quantize as kernels

    monkeypatch.setattr(kernels, "launch", host_kernels.launch)
    got = kernels.dropout_keep_bits(numel, p, seed, offset, threads, "cpu")
    assert torch.equal(got, philox.dropout_keep_bits(numel, p, seed, offset, threads))
