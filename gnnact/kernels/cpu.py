r"""The packed format's quantizer and dequantizer, the mask ops of ReLU, LeakyReLU and
dropout, and dropout's draws, compiled for the CPU (``quantize_cpu.cpp``), with the signatures
of the torch reference (``gnnact.quant.reference``; for the draws, PyTorch's ``bernoulli_``:
:func:`bernoulli_bits`).

The torch path makes about ten passes over memory for each chunk of a quantization; the
compiled one reads a group's values twice (the second time from the cache) and writes its
codes once: 3-4x faster, at 15-18 % of a copy's bandwidth where the torch path moves 3-6 %
(rows: ``benchmarks/results/quantize.jsonl``, backend ``"cpu"``). Its codes are the
reference's, bit for bit, for the noise the CUDA kernels hash from the seed
(:func:`gnnact.quant.rng.hash_uniform`): on the CPU and on a GPU a seed rounds a tensor alike.
The mask ops (:func:`sign_mask`, :func:`apply_packed_mask`, float32) take one pass where the
torch path multiplies by a boolean mask unpacked block by block (3-8x slower).

The source is built the first time a process needs it, by the system's C++ compiler (``$CXX``,
else ``g++``, ``clang++`` or ``c++`` on ``PATH``; nothing at install time), with
``-O3 -march=native -ffp-contract=off`` (no fused multiply-add: each operation rounds as the
reference's), and kept in ``$GNNACT_CACHE`` (default ``~/.cache/gnnact``) under a name that
hashes the source, the compiler and this CPU's flags, so that later processes load it at once.
Without a compiler, ``backend="auto"`` keeps the torch path and says so, once
(:func:`gnnact.quant.backends.select`). Long tensors are split by whole groups among
``torch.get_num_threads()`` threads (the call releases the GIL). Masks are packed to bits and
unpacked by the torch path's ``pack_mask_bits`` and ``unpack_mask_bits`` (one int64 product a
byte).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import math
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from torch import Tensor

from gnnact.quant import reference
from gnnact.quant.packed import packed_code_bytes
from gnnact.quant.reference import pack_mask_bits, unpack_mask_bits
from gnnact.quant.rng import split_seed

__all__ = ["FLAGS", "KERNEL_DTYPES", "apply_packed_mask", "available", "bernoulli_bits", "compiler",
           "compiler_version", "dequantize_groups", "library", "pack_mask_bits", "quantize_groups",
           "quantize_on_grid", "sign_mask", "unpack_mask_bits"]

_SOURCE = Path(__file__).with_name("quantize_cpu.cpp")

#: The build's flags (besides ``-shared -fPIC -o``).
FLAGS = ("-std=c++17", "-O3", "-march=native", "-ffp-contract=off", "-fno-math-errno",
         "-fno-trapping-math")

#: The dtypes of the mask ops' kernels (:func:`sign_mask`, :func:`apply_packed_mask`); the
#: quantizer takes every floating dtype (converting others to float32 a chunk at a time).
KERNEL_DTYPES = (torch.float32,)

#: Elements from which a call is split among threads (a piece each of at least this many).
PARALLEL_ELEMENTS = 1 << 20


def compiler() -> str | None:
    """The C++ compiler the build uses: ``$CXX`` (a path or a name on ``PATH``), else the
    first of ``g++``, ``clang++`` and ``c++`` on ``PATH``; ``None`` if there is none."""
    named = os.environ.get("CXX")
    if named:
        return shutil.which(named)
    return next((path for name in ("g++", "clang++", "c++") if (path := shutil.which(name))), None)


@functools.cache
def compiler_version() -> str:
    """What :func:`compiler` says of itself (``--version``; empty without a compiler)."""
    cxx = compiler()
    if cxx is None:
        return ""
    return subprocess.run([cxx, "--version"], capture_output=True, text=True, check=False).stdout


def _cpu_signature() -> str:
    """What ``-march=native`` builds for: the CPU's model and flags where the system says."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    wanted = ("model name", "flags", "Features", "CPU part")
    return "\n".join(sorted({line for line in lines if line.split(":")[0].strip() in wanted}))


def _cache_dir() -> Path:
    root = os.environ.get("GNNACT_CACHE")
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gnnact"


@functools.cache
def library() -> ctypes.CDLL:
    """The built library (built once per source, compiler and CPU; loaded once per process;
    where the cache cannot be written, built into a temporary folder of the process's).
    Raises ``RuntimeError`` with the compiler's message when there is no compiler or the build
    fails."""
    cxx = compiler()
    if cxx is None:
        named = os.environ.get("CXX")
        raise RuntimeError(f"no C++ compiler: CXX={named!r} is not an executable" if named else
                           "no C++ compiler: set CXX or put g++, clang++ or c++ on PATH")
    source = _SOURCE.read_bytes()
    key = hashlib.sha256(b"\0".join([source, cxx.encode(), compiler_version().encode(),
                                     " ".join(FLAGS).encode(), _cpu_signature().encode()]))
    name = f"quantize_cpu-{key.hexdigest()[:20]}.so"
    target = _cache_dir() / name
    if not target.exists():
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            # Built beside its place and renamed into it: two processes building at once each
            # rename a whole library.
            fd, partial = tempfile.mkstemp(suffix=".so", dir=target.parent)
        except OSError:  # a cache that cannot be written: this process's own folder
            target = Path(tempfile.mkdtemp(prefix="gnnact-cpu-")) / name
            fd, partial = tempfile.mkstemp(suffix=".so", dir=target.parent)
        os.close(fd)
        result = subprocess.run([cxx, *FLAGS, "-shared", "-fPIC", "-o", partial, str(_SOURCE)],
                                capture_output=True, text=True, check=False)
        if result.returncode != 0:
            os.unlink(partial)
            raise RuntimeError(f"building {_SOURCE.name} with {cxx} failed:\n"
                               f"{result.stderr[-4000:]}")
        os.replace(partial, target)
    lib = ctypes.CDLL(str(target))
    i64, ptr, u32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_uint32
    lib.gnnact_quantize.argtypes = [ptr, i64, i64, i64, ctypes.c_int, u32, u32, ptr, ptr, ptr,
                                    i64]
    lib.gnnact_dequantize.argtypes = [ptr, ptr, ptr, i64, i64, ctypes.c_int, i64, ptr]
    lib.gnnact_apply_mask.argtypes = [ptr, ptr, ptr, i64, ctypes.c_int, ctypes.c_float]
    lib.gnnact_sign_mask.argtypes = [ptr, ptr, ptr, i64, ctypes.c_int, ctypes.c_float]
    lib.gnnact_bernoulli_bits.argtypes = [ptr, i64, ctypes.c_uint64, ptr]
    lib.gnnact_round_on_grid.argtypes = [ptr, i64, i64, i64, ctypes.c_int, u32, u32, ptr, ptr,
                                         ctypes.c_float, ctypes.c_float, ptr, i64, ptr]
    for fn in (lib.gnnact_quantize, lib.gnnact_dequantize, lib.gnnact_apply_mask,
               lib.gnnact_sign_mask, lib.gnnact_bernoulli_bits, lib.gnnact_round_on_grid):
        fn.restype = ctypes.c_int
    return lib


@functools.cache
def available() -> bool:
    """Whether the library builds and loads here (tried once per process)."""
    try:
        library()
    except (RuntimeError, OSError):
        return False
    return True


@functools.cache
def _pool(workers: int, pid: int) -> ThreadPoolExecutor:
    """A pool of ``workers`` threads for process ``pid`` (a forked child, a DataLoader worker
    say, inherits its parent's pool without its threads: it makes its own)."""
    return ThreadPoolExecutor(workers, thread_name_prefix="gnnact-cpu")


def _by_groups(num_groups: int, group_size: int, call: Callable[[int, int], int],
               what: str = "bits must be in 1-8") -> None:
    """``call(g0, g1)`` for consecutive ranges of whole groups covering ``num_groups``: one
    range, or one a thread (``torch.get_num_threads()``, at most one a group) when there are
    enough elements; none for none (an empty tensor)."""
    n = num_groups * group_size
    workers = (1 if n < 2 * PARALLEL_ELEMENTS  # (threads read for large calls only: most are small)
               else min(torch.get_num_threads(), n // PARALLEL_ELEMENTS, num_groups))
    if workers == 1:
        statuses = [call(0, num_groups)] if num_groups else []
    else:  # (ceil(num_groups / workers) a range: at least two ranges)
        step = -(-num_groups // workers)
        ranges = [(g0, min(num_groups, g0 + step)) for g0 in range(0, num_groups, step)]
        statuses = list(_pool(len(ranges), os.getpid()).map(lambda r: call(*r), ranges))
    if any(statuses):
        raise ValueError(f"gnnact CPU kernel: {what}")


def _by_chunks(num_groups: int, group_size: int, numel: int, dtype: torch.dtype,
               call: Callable[[int, int], int]) -> None:
    """:func:`_by_groups` over all groups for float32; for another dtype, chunk after chunk of
    whole groups (``reference.block_elements(numel)``: a few MiB), which ``call`` converts to or
    from float32: the float32 copy never exists whole."""
    if dtype == torch.float32:
        _by_groups(num_groups, group_size, call)
        return
    step = max(1, reference.block_elements(numel) // group_size)
    for g0 in range(0, num_groups, step):
        _by_groups(min(num_groups, g0 + step) - g0, group_size,
                   lambda a, b, g0=g0: call(g0 + a, g0 + b))


def quantize_groups(x: Tensor, bits: int, group_size: int, *, seed: int | None = None,
                    noise: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """``gnnact.quant.reference.quantize_groups`` for a CPU tensor, its noise the seeded
    hash (given ``noise``, the torch path rounds with it). Float32 values are read in place;
    others are converted to float32 a chunk at a time (the reference's rounding)."""
    if noise is not None or seed is None:
        return reference.quantize_groups(x, bits, group_size, seed=seed, noise=noise)
    lib = library()
    flat = x.reshape(-1)
    if flat.dtype == torch.float32:
        flat = flat.contiguous()
    n = flat.numel()
    num_groups = -(-n // group_size)
    bytes_per_group = packed_code_bytes(group_size, bits)
    codes = torch.empty(num_groups, bytes_per_group, dtype=torch.uint8)
    scales = torch.empty(num_groups, dtype=torch.float32)
    zeros = torch.empty_like(scales)
    s0, s1 = split_seed(seed)
    # Addresses by arithmetic, not by slicing: a slice is a tensor made in Python, and a
    # small tensor's call would spend more on four of them than on its values.
    x_ptr, c_ptr, s_ptr, z_ptr = (flat.data_ptr(), codes.data_ptr(), scales.data_ptr(),
                                  zeros.data_ptr())

    def call(g0: int, g1: int) -> int:
        lo, hi = g0 * group_size, min(n, g1 * group_size)
        h = flat[lo:hi].to(torch.float32) if flat.dtype != torch.float32 else None
        return lib.gnnact_quantize(x_ptr + 4 * lo if h is None else h.data_ptr(), lo, hi - lo,
                                   group_size, bits, s0, s1, c_ptr + g0 * bytes_per_group,
                                   s_ptr + 4 * g0, z_ptr + 4 * g0, bytes_per_group)

    _by_chunks(num_groups, group_size, n, flat.dtype, call)
    return codes, scales, zeros


def dequantize_groups(codes: Tensor, scales: Tensor, zeros: Tensor, bits: int, group_size: int,
                      numel: int, dtype: torch.dtype) -> Tensor:
    """``gnnact.quant.reference.dequantize_groups`` for CPU tensors: float32 written in
    place, other dtypes converted a chunk at a time."""
    lib = library()
    codes, scales, zeros = codes.contiguous(), scales.contiguous(), zeros.contiguous()
    bytes_per_group = codes.shape[1]
    num_groups = codes.shape[0]
    out = torch.empty(numel, dtype=dtype)
    c_ptr, s_ptr, z_ptr, o_ptr = (codes.data_ptr(), scales.data_ptr(), zeros.data_ptr(),
                                  out.data_ptr())  # (addresses by arithmetic, as above)

    def call(g0: int, g1: int) -> int:
        lo, hi = g0 * group_size, min(numel, g1 * group_size)
        target = None if dtype == torch.float32 else torch.empty(hi - lo)
        status = lib.gnnact_dequantize(c_ptr + g0 * bytes_per_group, s_ptr + 4 * g0,
                                       z_ptr + 4 * g0, hi - lo, group_size, bits,
                                       bytes_per_group,
                                       o_ptr + 4 * lo if target is None else target.data_ptr())
        if target is not None:
            out[lo:hi] = target
        return status

    _by_chunks(num_groups, group_size, numel, dtype, call)
    return out


def quantize_on_grid(h: Tensor, zeros: Tensor, invs: Tensor, bits: int, low: float,
                     high: float, *, seed: int | None = None,
                     noise: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """``gnnact.quant.reference.quantize_on_grid`` for a float32 CPU tensor, its noise the
    seeded hash (given ``noise``, the torch path rounds with it): one pass a row, read from
    the cache the second time (with ``low`` and ``high`` as float32, as torch compares)."""
    if noise is not None or seed is None:
        return reference.quantize_on_grid(h, zeros, invs, bits, low, high, seed=seed,
                                          noise=noise)
    if h.dtype != torch.float32 or h.dim() != 2:
        raise ValueError(f"h must be a float32 [groups, group_size] tensor, got {h.dtype} of "
                         f"shape {tuple(h.shape)}")
    lib = library()
    h = h.contiguous()
    zeros, invs = (t.to(torch.float32).contiguous() for t in (zeros, invs))
    groups, group_size = h.shape
    bytes_per_group = packed_code_bytes(group_size, bits)
    codes = torch.empty(groups, bytes_per_group, dtype=torch.uint8)
    clipped = torch.empty(groups, dtype=torch.int64)
    s0, s1 = split_seed(seed)
    h_ptr, z_ptr, i_ptr, c_ptr, k_ptr = (h.data_ptr(), zeros.data_ptr(), invs.data_ptr(),
                                         codes.data_ptr(), clipped.data_ptr())

    def call(g0: int, g1: int) -> int:
        lo = g0 * group_size
        return lib.gnnact_round_on_grid(h_ptr + 4 * lo, lo, (g1 - g0) * group_size, group_size,
                                        bits, s0, s1, z_ptr + 4 * g0, i_ptr + 4 * g0, low, high,
                                        c_ptr + g0 * bytes_per_group, bytes_per_group,
                                        k_ptr + 8 * g0)

    _by_groups(groups, group_size, call)
    return codes, clipped


def sign_mask(x: Tensor, out: Tensor, mode: int, s: float) -> Tensor:
    """Kernel twin of ``gnnact.quant.reference.sign_mask`` (float32, ``x`` and ``out`` flat
    and contiguous, ``out`` possibly ``x``): one pass, a byte of the mask for each 8 values."""
    lib = library()
    n = x.numel()
    data = torch.empty((n + 7) // 8, dtype=torch.uint8)
    x_ptr, o_ptr, d_ptr = x.data_ptr(), out.data_ptr(), data.data_ptr()

    def call(k0: int, k1: int) -> int:  # (octets k0 .. k1 - 1)
        lo, hi = 8 * k0, min(n, 8 * k1)
        return lib.gnnact_sign_mask(x_ptr + 4 * lo, o_ptr + 4 * lo, d_ptr + k0, hi - lo, mode, s)

    _by_groups(data.numel(), 8, call, f"mode must be 0, 1 or 2, got {mode}")
    return data


def apply_packed_mask(x: Tensor, data: Tensor, out: Tensor, mode: int, s: float) -> Tensor:
    """Kernel twin of ``gnnact.quant.reference.apply_packed_mask`` (float32, flat and
    contiguous, ``out`` possibly ``x``): one pass; returns ``out``."""
    lib = library()
    n = x.numel()
    data = data.contiguous()
    x_ptr, d_ptr, o_ptr = x.data_ptr(), data.data_ptr(), out.data_ptr()

    def call(k0: int, k1: int) -> int:
        lo, hi = 8 * k0, min(n, 8 * k1)
        return lib.gnnact_apply_mask(x_ptr + 4 * lo, d_ptr + k0, o_ptr + 4 * lo, hi - lo, mode, s)

    _by_groups((n + 7) // 8, 8, call, f"mode must be 0, 1 or 2, got {mode}")
    return out


def bernoulli_bits(state: Tensor, numel: int, q: float) -> Tensor:
    r"""The keep bits (packed as :func:`pack_mask_bits` packs, ``ceil(numel / 8)`` bytes) of
    ``numel`` draws of PyTorch's CPU ``bernoulli_(q)`` from the generator state ``state`` (what
    :meth:`torch.Generator.get_state` returns for a CPU generator), advanced in place as the
    draws advance it: element :math:`j` is kept when the 53 low bits of
    :math:`(a_j \ll 32) \mid b_j` (the MT19937 engine's outputs :math:`2j` and :math:`2j + 1`),
    times :math:`2^{-53}`, are below ``q`` (see :func:`gnnact.ops.draws.keep_bits`)."""
    if state.dtype != torch.uint8 or state.dim() != 1 or state.numel() < _STATE_BYTES:
        raise ValueError(f"state must be a CPU generator's state (get_state()), got "
                         f"{state.dtype} {tuple(state.shape)}")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be in [0, 1], got {q}")
    bits = torch.empty((numel + 7) // 8, dtype=torch.uint8)
    # u 2^-53 < q  <=>  u < q 2^53 (exact: a power of two)  <=>  u < ceil(q 2^53), u an integer
    threshold = math.ceil(q * 2.0 ** 53)
    if library().gnnact_bernoulli_bits(state.data_ptr(), numel, threshold, bits.data_ptr()):
        raise ValueError("gnnact CPU kernel: state is not an MT19937 state as get_state() "
                         "lays it out")
    return bits


#: Bytes of a CPU generator's state the kernel reads: ``left``, ``next`` and the 624 words.
_STATE_BYTES = 24 + 624 * 8
