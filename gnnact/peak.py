r"""The peak memory of a block of code: on CUDA from the allocator, on the CPU by counting.

:func:`gnnact.memory.saved_bytes` counts what a graph keeps for backward; a step's *peak* is
that plus whatever the step holds at its worst moment (one layer's backward temporaries, the
gradients, the optimizer's state). :class:`PeakMeter` measures it on any device:

* **CUDA**: ``torch.cuda.max_memory_allocated`` over the block, minus what was allocated at
  entry (the caching allocator's own count).
* **CPU**: the CPU allocator keeps no statistics, so the meter counts. It is a
  :class:`~torch.utils._python_dispatch.TorchDispatchMode` (active in the entering thread and in
  the autograd engine's work for it): every op's output storage that is none of its inputs'
  storages is a new allocation; its bytes are added to the live total, and subtracted when the
  storage is freed (a weak reference to the storage fires then). With :math:`A(t)` the storages
  allocated inside the block and alive at time :math:`t`,

  .. math::
      \text{peak\_bytes} = \max_t \sum_{s \in A(t)} \text{nbytes}(s).

  Storages alive before the block (model, data, a graph built earlier) are not counted, as on
  CUDA. A sparse output counts its index and value tensors; PyG's ``EdgeIndex`` its inner
  tensors. What bypasses the dispatcher is not seen: memory from NumPy
  (:func:`torch.from_numpy`) or a library's own allocator. Counting runs Python code per op,
  so time a block without the meter.

With ``sites=True`` each allocation also keeps where it came from (the innermost frame in
gnnact, PyG or the caller's file, else the op's name), and :attr:`PeakMeter.at_peak` says what
was alive at the peak, by site: what to bound to lower the peak. CPU only.
"""

from __future__ import annotations

import sys
import weakref
from collections import Counter
from types import TracebackType
from typing import Any

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from gnnact.memory import tensor_storages

__all__ = ["PeakMeter"]

# Frames under these folders name an allocation's site (innermost first).
_ROOTS = ("gnnact/", "torch_geometric/", "benchmarks/", "tests/", "examples/")

# Frames that pass every op on (torch function and dispatch modes) name no site.
_PLUMBING = frozenset({"__torch_function__", "__torch_dispatch__"})


def _site(op: str) -> str:
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename.replace("\\", "/")
        if frame.f_code.co_name in _PLUMBING:
            frame = frame.f_back
            continue
        for root in _ROOTS:
            if root in name and not name.endswith("gnnact/peak.py"):
                return f"{root}{name.split(root, 1)[1]}:{frame.f_lineno} ({op})"
        frame = frame.f_back
    return op


def _storages(value: Any) -> dict[tuple, Tensor]:
    out: dict[tuple, Tensor] = {}
    for leaf in tree_leaves(value):
        if isinstance(leaf, Tensor):
            for _, part, _, key in tensor_storages(leaf, "t"):
                out.setdefault(key, part)
    return out


class _CountAllocations(TorchDispatchMode):
    """Adds each new output storage to ``meter``'s live total until the storage is freed."""

    # Random ops draw as they would without it: dropout's masks may be computed from the
    # default generator's state under it (gnnact.ops.draws).
    transparent_to_randomness = True

    def __init__(self, meter: PeakMeter) -> None:
        super().__init__()
        self.meter = meter

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        inputs = _storages((args, kwargs))
        for key, part in _storages(out).items():
            if key not in inputs:
                self.meter._allocated(part.untyped_storage(), str(func.overloadpacket))
        return out


class PeakMeter:
    r"""Measures the most memory allocated at once inside a ``with`` block, above what was
    allocated at entry (see the module docstring for how, per device).

    Args:
        device (torch.device or str, optional): the device to measure; CPU tensors are
            counted for ``"cpu"``, the allocator is read for a CUDA device.
            (default: :obj:`"cpu"`)
        sites (bool, optional): remember where each allocation was made and what was alive
            at the peak (:attr:`at_peak`); CPU only. (default: :obj:`False`)

    Attributes:
        peak_bytes (int): the peak, in bytes (set when the block ends).
        end_bytes (int): bytes allocated inside the block still alive at its end.
        at_peak (dict[str, int]): with ``sites=True``, bytes alive at the peak by site, largest
            first.

    Example:
        >>> from gnnact.peak import PeakMeter
        >>> x = torch.randn(1000, 100)  # 400 kB, allocated before: not counted
        >>> with PeakMeter() as meter:
        ...     y = (x * 2).relu()   # x * 2 is freed once relu has run
        >>> meter.peak_bytes, meter.end_bytes
        (800000, 400000)
    """

    def __init__(self, device: torch.device | str = "cpu", *, sites: bool = False) -> None:
        self.device = torch.device(device)
        if self.device.type not in ("cpu", "cuda"):
            raise ValueError(f"PeakMeter: device must be 'cpu' or a CUDA device, got "
                             f"'{self.device}'")
        if sites and self.device.type != "cpu":
            raise ValueError(f"PeakMeter: sites=True needs device 'cpu' (the CUDA allocator "
                             f"has its own history, torch.cuda.memory._record_memory_history), "
                             f"got '{self.device}'")
        self.sites = sites
        self.peak_bytes = 0
        self.end_bytes = 0
        self.at_peak: dict[str, int] = {}
        self._live = 0
        self._alive: dict[int, tuple[int, str, weakref.ref]] = {}
        self._mode: _CountAllocations | None = None
        self._base = 0

    # -------------------------------------------------------------------------- CPU counting

    def _allocated(self, storage: torch.UntypedStorage, op: str) -> None:
        if storage.device.type != "cpu":
            return
        nbytes = storage.nbytes()
        if nbytes == 0:
            return
        site = _site(op) if self.sites else op
        ref = weakref.ref(storage, self._freed)
        self._alive[id(ref)] = (nbytes, site, ref)
        self._live += nbytes
        if self._live > self.peak_bytes:
            self.peak_bytes = self._live
            if self.sites:
                counts: Counter[str] = Counter()
                for n, s, _ in self._alive.values():
                    counts[s] += n
                self.at_peak = dict(counts.most_common())

    def _freed(self, ref: weakref.ref) -> None:
        entry = self._alive.pop(id(ref), None)
        if entry is not None:
            self._live -= entry[0]

    # ------------------------------------------------------------------------------- block

    def __enter__(self) -> PeakMeter:
        self.peak_bytes, self.end_bytes, self.at_peak = 0, 0, {}
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
        else:
            self._live, self._alive = 0, {}
            self._mode = _CountAllocations(self)
            self._mode.__enter__()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak_bytes = torch.cuda.max_memory_allocated(self.device) - self._base
            self.end_bytes = torch.cuda.memory_allocated(self.device) - self._base
            return
        assert self._mode is not None
        self._mode.__exit__(exc_type, exc, tb)
        self._mode = None
        self.end_bytes = self._live
        # Stop counting: storages freed later must not call back into a finished meter.
        self._alive = {}
