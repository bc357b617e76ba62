r"""Compress what autograd saves for backward, for any model, through saved-tensor hooks.

This is the generic activation-compression pipeline: inside the context manager every tensor
an operation saves for its backward pass goes through a *pack* hook that stores it quantized
(:func:`gnnact.quantize`), and comes back through an *unpack* hook (:func:`gnnact.dequantize`)
when backward needs it. The forward pass itself stays exact.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from gnnact.config import Config
from gnnact.memory import storage_keys, tensor_storages
from gnnact.quant import PackedTensor, dequantize, quantize
from gnnact.quant.core import FLOAT_DTYPES

__all__ = ["quantized_saved_tensors"]

# (storage key, storage offset, shape, stride, version, dtype): two saves of the same data.
_CacheKey = tuple[Any, int, tuple[int, ...], tuple[int, ...], int, torch.dtype]


class quantized_saved_tensors(torch.autograd.graph.saved_tensors_hooks):
    r"""Context manager that stores every floating-point tensor saved for backward as a
    :class:`~gnnact.quant.packed.PackedTensor` of :obj:`bits` bits per value.

    A saved tensor :math:`\mathbf{h}` with :math:`n` elements is flattened and cut into
    :math:`n_g = \lceil n / G \rceil` groups of :math:`G` values (one group per row of the last
    dimension with :obj:`per_row=True`). Each group keeps its minimum :math:`Z` and scale
    :math:`s = (\max - Z) / (2^b - 1)` as ``float32``, and every value becomes a :math:`b`-bit
    code by unbiased stochastic rounding,

    .. math::
        q_j = \left\lfloor \frac{h_j - Z}{s} + u_j \right\rfloor, \quad
        u_j \sim \mathcal{U}[0, 1), \qquad
        \hat{h}_j = q_j\, s + Z, \qquad \mathbb{E}[\hat{h}_j] = h_j,

    so backward sees :math:`\hat{\mathbf{h}}`, an unbiased estimate with per-value variance at
    most :math:`s^2 / 4`, and the gradient stays unbiased for the operations whose backward is
    linear in what they saved. What is held per saved tensor is

    .. math::
        \text{nbytes} = n_g \left( \left\lceil \frac{G b}{8} \right\rceil + 8 \right)
        \approx n \left( \frac{b}{8} + \frac{8}{G} \right)

    bytes instead of :math:`4n` for ``float32`` (:math:`b + 0.125` bits per value for
    :math:`G = 512`). With :obj:`bits=32` nothing is stored in addition: the tensor itself is
    saved, as without hooks; :obj:`bits=16` keeps a 16-bit copy.

    These pass through uncompressed (the hook returns the tensor itself):

    * tensors that are not floating point (indices, masks) or whose dtype the quantizer does
      not take (``float8``), sparse tensors and tensor subclasses;
    * tensors of fewer than :obj:`min_numel` elements: per-channel statistics such as the
      mean and :math:`1/\sigma` that BatchNorm saves. Their error reaches every gradient of
      the layer (on a 3-layer GCN with BatchNorm, compressing them too at 2 bits raises the
      relative gradient error from 0.4 to 1.3–1.6) while compressing them saves under
      :math:`4 \cdot` :obj:`min_numel` bytes each;
    * leaf tensors that require grad (parameters): they live anyway, and a compressed copy
      would only add memory;
    * tensors whose storage belongs to :obj:`skip`, *e.g.* the model (this also catches views
      of parameters such as the ``weight.t()`` that :func:`~torch.nn.functional.linear`
      saves, and buffers like BatchNorm's running statistics) and the input features, which
      are resident in memory whatever autograd does.

    A tensor saved by several operations (a ReLU output that the next layer also saves) is
    compressed once: the pack hook keys a cache on (storage, offset, shape, stride,
    :obj:`t._version`, dtype) and, because the caching allocator can hand a freed address to
    a new tensor, accepts a hit only if a weak reference to the tensor that was packed still
    points to this very tensor. The cache holds the tensor and the packed copy weakly, so it
    never keeps memory alive by itself.

    The tallies count what the saved context costs, over distinct objects, since the hooks
    were created or :meth:`reset_stats` was last called: :attr:`packed_bytes` (sum of
    :attr:`~gnnact.quant.packed.PackedTensor.nbytes` of the packed copies created),
    :attr:`passthrough_bytes` (distinct storages passed through, without those of
    :obj:`skip` and of leaves that require grad: the same set of storages that
    :func:`gnnact.memory.saved_bytes` counts with :obj:`exclude=skip`) and
    :attr:`num_packed`. With :obj:`bits=32`, :attr:`passthrough_bytes` after one forward
    pass equals :func:`~gnnact.memory.saved_bytes` of its output with :obj:`exclude=skip`.

    Only the innermost :class:`~torch.autograd.graph.saved_tensors_hooks` is active, so these
    hooks do not compose with non-reentrant checkpointing inside the context.

    Args:
        bits (int): bits per value, one of 1, 2, 4, 8, 16, 32 (32: no compression).
        group_size (int, optional): values per quantization group :math:`G`.
            (default: :obj:`512`)
        per_row (bool, optional): one group per row of the last dimension instead of groups of
            :obj:`group_size` consecutive values. (default: :obj:`False`)
        backend (str, optional): quantizer backend, ``"auto"``, ``"torch"`` or ``"cupy"``.
            (default: :obj:`"auto"`)
        skip (Iterable[torch.Tensor or torch.nn.Module], optional): tensors, and modules (all
            their parameters and buffers), whose storages pass through uncompressed and
            untallied. They must stay alive while the hooks are in use: they are recognized
            by storage address. (default: :obj:`()`)
        min_numel (int, optional): tensors with fewer elements pass through.
            (default: :obj:`4096`)
        generator (torch.Generator, optional): source of the rounding-noise seeds; by default
            the global CPU generator, which then advances once per packed tensor (and so
            shifts, *e.g.*, later dropout masks). (default: :obj:`None`)

    Example:
        >>> with quantized_saved_tensors(2, skip=[model, data.x]) as hooks:
        ...     loss = F.cross_entropy(model(data.x, data.edge_index), data.y)
        >>> loss.backward()
        >>> hooks.packed_bytes + hooks.passthrough_bytes  # saved context, in bytes
    """

    def __init__(
        self,
        bits: int,
        group_size: int = 512,
        *,
        per_row: bool = False,
        backend: str = "auto",
        skip: Iterable[Tensor | torch.nn.Module] = (),
        min_numel: int = 4096,
        generator: torch.Generator | None = None,
    ) -> None:
        # Config validates bits, group_size and backend (same rules, same messages).
        Config(bits=bits, group_size=group_size, per_row=per_row, backend=backend)
        if isinstance(min_numel, bool) or not isinstance(min_numel, int) or min_numel < 0:
            raise ValueError(f"min_numel must be a non-negative int, got {min_numel!r}")
        self.bits = bits
        self.group_size = group_size
        self.per_row = per_row
        self.backend = backend
        self.min_numel = min_numel
        self.generator = generator
        self._skip = storage_keys(skip)
        self._cache: dict[_CacheKey, tuple[weakref.ref, weakref.ref]] = {}
        self.reset_stats()
        super().__init__(self._pack, self._unpack)

    def reset_stats(self) -> None:
        """Zero the tallies and forget what was seen, *e.g.* before measuring one forward."""
        self.packed_bytes = 0
        self.passthrough_bytes = 0
        self.num_packed = 0
        self._passed: set[Any] = set()
        # Forgetting the cache too makes a tensor still alive from an earlier step count again
        # when a new graph saves it, as saved_bytes would count it in that graph.
        self._cache.clear()

    @property
    def saved_bytes(self) -> int:
        """:attr:`packed_bytes` + :attr:`passthrough_bytes`."""
        return self.packed_bytes + self.passthrough_bytes

    def __enter__(self) -> quantized_saved_tensors:
        super().__enter__()
        return self

    def __exit__(self, *args: object) -> None:
        super().__exit__(*args)
        # The graphs hold their packed copies; the cache is of no use outside the context.
        self._cache.clear()

    def _pack(self, t: Tensor) -> Tensor | PackedTensor:
        if not self._compressible(t):
            self._pass(t)
            return t

        key: _CacheKey = (_storage_key(t), t.storage_offset(), tuple(t.shape), t.stride(),
                          t._version, t.dtype)
        hit = self._cache.get(key)
        if hit is not None:
            tensor_ref, packed_ref = hit
            packed = packed_ref()
            # The address may have been freed and reused by a new tensor: only the very same
            # (still alive) tensor object with the same version is the same data.
            if packed is not None and tensor_ref() is t:
                return packed

        with torch.no_grad():
            packed = quantize(t.detach(), self.bits, self.group_size, per_row=self.per_row,
                              generator=self.generator, backend=self.backend)
        self.packed_bytes += packed.nbytes
        self.num_packed += 1

        cache = self._cache

        def forget(ref: weakref.ref, key: _CacheKey = key) -> None:
            # Drop the entry when the tensor dies, unless a newer entry replaced it.
            entry = cache.get(key)
            if entry is not None and entry[0] is ref:
                del cache[key]

        self._cache[key] = (weakref.ref(t, forget), weakref.ref(packed))
        return packed

    def _unpack(self, saved: Tensor | PackedTensor) -> Tensor:
        if isinstance(saved, PackedTensor):
            with torch.no_grad():
                return dequantize(saved, backend=self.backend)
        return saved

    def _compressible(self, t: Tensor) -> bool:
        if self.bits == 32:  # bit-identical to no hooks: keep the tensor itself
            return False
        if t.dtype not in FLOAT_DTYPES or t.layout != torch.strided:
            return False
        if is_traceable_wrapper_subclass(t):  # its memory is in inner tensors
            return False
        if t.numel() < self.min_numel or (t.is_leaf and t.requires_grad):
            return False
        return _storage_key(t) not in self._skip

    def _pass(self, t: Tensor) -> None:
        """Tally the storages of a tensor that is saved as is."""
        if t.is_leaf and t.requires_grad:  # a graph leaf: saved_bytes leaves it out too
            return
        for _, _, nbytes, key in tensor_storages(t, "saved"):
            if key not in self._skip and key not in self._passed:
                self._passed.add(key)
                self.passthrough_bytes += nbytes


def _storage_key(t: Tensor) -> tuple[str, int | None, int]:
    # The same key as gnnact.memory uses, so `skip` and `exclude` mean the same storages.
    storage = t.untyped_storage()
    return (storage.device.type, storage.device.index, storage.data_ptr())
