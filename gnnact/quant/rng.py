r"""Counter-based uniform noise shared by the torch path and the CUDA kernels.

Stochastic rounding needs one uniform :math:`r_i \in [0, 1)` per element. Drawing them with
``torch.rand`` would make the GPU kernel read 4 extra bytes per element; instead the noise is a
hash of the element's flat index :math:`i` and a 64-bit seed :math:`s = (s_1 \ll 32) | s_0`.
One 32-bit hash serves a pair of elements, :math:`j = \lfloor i / 2 \rfloor`, each taking
16 bits of it; the hash mixes the pair's octet :math:`o = \lfloor j / 4 \rfloor` (8 elements,
:math:`o_{lo}` and :math:`o_{hi}` its low and high 32-bit words) and its place
:math:`k = j \bmod 4` in it:

.. math::
    g_j = \mathrm{mix}\big(\mathrm{mix}(o_{lo} \oplus s_0) \oplus o_{hi} \oplus s_1
          \oplus \varphi_k\big), \qquad \varphi_k = k \cdot \mathtt{0x9e3779b9} \bmod 2^{32},

    r_i = \big(2^{16} - 1 - (\lfloor g_j / 2^{16 (i \bmod 2)} \rfloor \bmod 2^{16})\big)
          \cdot 2^{-16},

where :math:`\mathrm{mix}` is the 32-bit integer finaliser ``x ^= x >> 16; x *= 0x21f0aaad;
x ^= x >> 15; x *= 0x735a2d97; x ^= x >> 15`` (a bijection on 32-bit words). Both
multipliers are below :math:`2^{31}`, so the torch path can evaluate it in ``int64`` with no
overflow. :math:`r_i` is exactly representable in float32, so ``cuda/quantize.cu`` reproduces
it bit for bit: on a CUDA device the torch and CuPy backends give identical codes for a seed.

Why this shape: the hash is most of the quantize kernel's arithmetic, and the kernel must keep
up with memory. The 8 elements an octet of the kernel holds share the inner :math:`\mathrm{mix}`
(5 of them for 8 values, not 8), and the kernel's integer rounding takes
:math:`2^{16} - 1 - 2^{16} r_i`, which is the 16 bits of :math:`g_j` themselves
(``round_hashed`` in ``cuda/quantize.cu``). Two values a hash, 16 bits each: rounding up
with probability :math:`P(r_i < f)` for a fractional part :math:`f` is
:math:`\lceil 2^{16} f \rceil / 2^{16}`, a bias below :math:`2^{-16}` of one quantization
step, far under the rounding noise itself.

On the CPU the compiled kernels (:mod:`gnnact.kernels.cpu`) hash the same noise (32-bit
lanes, a few nanoseconds a value). The torch path there, which runs where no compiler builds
them, draws it from a generator seeded with :math:`s` instead (:func:`seeded_uniform`: NumPy's
SFC64), 16 bits a value as the hash gives, four values from each of its 64-bit words:
:math:`r_i = k_i \cdot 2^{-16}` with :math:`k_i` the :math:`(i \bmod 4)`-th 16-bit word of
draw :math:`\lfloor i / 4 \rfloor`. The int64 hash in torch ops costs about 20× more (0.63 s
vs 0.03 s for 4M elements on 2 cores), ``torch.rand`` (a draw per value) about 5× more. On
the :math:`2^{-16}` grid, stochastic rounding needs one subtraction and one ceiling a value,
exactly (``gnnact.quant.reference.quantize_groups``).

**Where the seeds come from.** A direct :func:`gnnact.quantize` call draws its seed from a
generator (the default CPU one when none is given), as any random torch op does. The forward
passes of a converted model or a :class:`gnnact.compress_saved_tensors` block draw theirs from
a stream of the pass's own instead (:class:`PassSeeds`): rounding then draws nothing from the
process's generators (it reads the default ones' states, without advancing them), so a
compressed run draws the very dropout masks and shuffles that an uncompressed run draws under
the same ``torch.manual_seed``, and differs from it by the rounding alone.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

__all__ = ["PassSeeds", "draw_seed", "draw_seed_tensor", "hash_uniform", "hash_words",
           "seeded_uniform", "split_seed", "word_stream"]

_MASK32 = 0xFFFFFFFF
_MUL1 = 0x21F0AAAD
_MUL2 = 0x735A2D97
_PHI = 0x9E3779B9  # phi_k = k * _PHI mod 2^32: a pair's place k in its octet


def _mix32(x: Tensor) -> Tensor:
    # x holds values in [0, 2^32) as int64; products stay below 2^63 because both
    # multipliers are < 2^31.
    x = x ^ (x >> 16)
    x = (x * _MUL1) & _MASK32
    x = x ^ (x >> 15)
    x = (x * _MUL2) & _MASK32
    return x ^ (x >> 15)


def split_seed(seed: int) -> tuple[int, int]:
    """The low and high 32-bit words of a 64-bit seed."""
    seed &= (1 << 64) - 1
    return seed & _MASK32, seed >> 32


def draw_seed(generator: torch.Generator | None = None) -> int:
    """A 63-bit seed drawn from ``generator`` (the default CPU generator if ``None``).

    A CUDA generator works too, at the cost of one device-to-host sync to read the seed.
    """
    return int(draw_seed_tensor(generator).item())


def draw_seed_tensor(generator: torch.Generator | None = None) -> Tensor:
    """:func:`draw_seed`'s seed as an ``int64 [1]`` tensor on ``generator``'s device (the
    same draw): what the quantizer's custom operator takes, read on the host only when it
    runs, so a compiled graph draws it without a sync and without recompiling for each seed."""
    device = generator.device if generator is not None else torch.device("cpu")
    return torch.randint(0, 2**63 - 1, (1,), generator=generator, device=device)


def hash_words(seed: int, start: int, count: int, device: torch.device | str = "cpu") -> Tensor:
    r""":func:`hash_uniform`'s noise as the integers :math:`2^{16} r_i \in [0, 2^{16})`
    (``int64``)."""
    s0, s1 = split_seed(seed)
    i = torch.arange(start, start + count, dtype=torch.int64, device=device)
    pair = i >> 1
    octet = i >> 3
    h = _mix32((octet & _MASK32) ^ s0)
    h = _mix32(h ^ (octet >> 32) ^ s1 ^ (((pair & 3) * _PHI) & _MASK32))
    return 0xFFFF - ((h >> ((i & 1) << 4)) & 0xFFFF)


def hash_uniform(seed: int, start: int, count: int, device: torch.device | str = "cpu") -> Tensor:
    r"""Noise :math:`r_i` for flat indices ``start … start + count - 1`` as float32 in [0, 1):
    16 bits each, the two elements of a pair :math:`\lfloor i / 2 \rfloor` from one hash."""
    return _uniform(hash_words(seed, start, count, device))


def seeded_uniform(seed: int, count: int, device: torch.device | str = "cpu") -> Tensor:
    """The rounding noise the torch path uses for ``seed``: :func:`hash_uniform` on CUDA (what
    the kernels compute), 16-bit words of a generator seeded with ``seed`` on the CPU (see the
    module docstring). Float32 multiples of :math:`2^{-16}` in [0, 1) either way."""
    return _uniform(word_stream(seed, device)(0, count))


def _uniform(words: Tensor) -> Tensor:
    r""":math:`r = 2^{-16} k` of noise words ``k``, as float32 (exact)."""
    return words.to(torch.float32).mul_(2.0**-16)


def word_stream(seed: int, device: torch.device | str = "cpu") -> Callable[[int, int], Tensor]:
    r""":func:`seeded_uniform`'s noise piece by piece, as the integers :math:`2^{16} r_i`:
    ``draw(start, count)`` gives those of elements ``start … start + count - 1`` (``uint16``
    words of the generator on the CPU, :func:`hash_words` on CUDA), for consecutive pieces
    drawn in order (on the CPU the generator's stream continues; one draw of :math:`n` equals
    any split of it). The quantizer subtracts them scaled by :math:`2^{-16}`
    (``q.sub_(k, alpha=2**-16)``: exact, and no float32 copy of the noise is made)."""
    device = torch.device(device)
    if device.type == "cuda":
        return lambda start, count: hash_words(seed, start, count, device)
    if device.type != "cpu":  # (no NumPy there: the device's own generator)
        generator = torch.Generator(device=device).manual_seed(seed)

        def words(count: int) -> Tensor:
            fresh = torch.empty(count, dtype=torch.int64, device=device)
            return fresh.random_(-2**63, None, generator=generator)  # (every bit of each word)
    else:
        # NumPy's SFC64 fills 64-bit words about twice as fast as a torch.Generator's random_
        # (Mersenne Twister), which took a third of a CPU quantization.
        bits = np.random.SFC64(seed & (2**64 - 1))  # (as manual_seed takes any int)

        def words(count: int) -> Tensor:
            return torch.from_numpy(bits.random_raw(count).view(np.int64))
    drawn = 0
    left: Tensor | None = None  # words of the last draw not yet handed out

    def draw(start: int, count: int) -> Tensor:
        nonlocal drawn, left
        if start != drawn:
            raise ValueError(f"word_stream: pieces are drawn in order; expected start "
                             f"{drawn}, got {start}")
        drawn += count
        have = left
        need = count - (0 if have is None else have.numel())
        if need > 0:
            fresh = words(-(-need // 4)).view(torch.uint16)
            have = fresh if have is None or not have.numel() else torch.cat([have, fresh])
        left = have[count:]
        return have[:count]

    return draw


def _generator_states() -> bytes:
    """The states of the default CPU generator and of each initialised CUDA device's (seed
    and offset, read on the host: no sync)."""
    states = [torch.default_generator.get_state()]
    # (Inside a CUDA graph capture the CUDA states cannot be read: the CPU one and the count.)
    with contextlib.suppress(RuntimeError):
        if torch.cuda.is_initialized():
            states += [g.get_state() for g in torch.cuda.default_generators]
    return b"".join(state.numpy().tobytes() for state in states)


class PassSeeds:
    r"""The seeds of the rounding noise of an owner's successive forward passes (a converted
    model's, a :class:`gnnact.compress_saved_tensors`'), taken from no generator's stream.

    Pass :math:`t` gets

    .. math::
        s_t = H(\sigma_t, r_t),

    with :math:`\sigma_t` the state of the default generators when the pass starts (the CPU
    one's, and each initialised CUDA device's; read, not advanced), :math:`r_t` the number of
    this owner's passes right before :math:`t`, in a row, that started from that same state,
    and :math:`H` a 63-bit BLAKE2b digest. Each quantization of the pass then draws its seed
    from a generator seeded with :math:`s_t` (:meth:`generator`), in the pass's order.

    So a run is reproduced by ``torch.manual_seed``, as before, but rounding draws nothing from
    the generators a run shares with PyTorch: a compressed run's dropout masks (PyTorch's own,
    drawn from those generators) are an uncompressed run's. Passes differ: dropout, or any
    other draw, moves :math:`\sigma`; where nothing does (no random op in the model),
    :math:`r` counts the passes. That count cannot tell a ``torch.manual_seed`` back to the
    state of the previous pass from no draw at all: a model without any random op, seeded
    again before each of two passes, rounds them with different noise (a new model, or any
    draw in between, such as its initialisation, rounds as the first did). Thread-safe: the
    replicas of :class:`~torch.nn.DataParallel` share their model's.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: bytes | None = None
        self._repeats = 0

    # A copied or pickled model takes the count along, with a lock of its own.
    def __getstate__(self) -> dict:
        return {"_last": self._last, "_repeats": self._repeats}

    def __setstate__(self, state: dict) -> None:
        self.__init__()
        self.__dict__.update(state)

    def next_seed(self) -> int:
        """:math:`s_t` of the pass starting now."""
        key = hashlib.blake2b(_generator_states(), digest_size=16).digest()
        with self._lock:
            self._repeats = self._repeats + 1 if key == self._last else 0
            self._last = key
            repeats = self._repeats
        digest = hashlib.blake2b(key + repeats.to_bytes(8, "little"), digest_size=8).digest()
        return int.from_bytes(digest, "little") >> 1

    def generator(self) -> torch.Generator:
        """A CPU generator seeded with :meth:`next_seed`: the seeds of one pass's
        quantizations (read on the host, so a CUDA tensor's costs no sync)."""
        return torch.Generator().manual_seed(self.next_seed())
