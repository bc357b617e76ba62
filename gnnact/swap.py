r"""Swap and prefetch: compressed context moved to pinned host memory during forward and brought
back, one step ahead, during backward (GACT's level L2).

:class:`Offloader` is used by :class:`gnnact.compress_saved_tensors` with
``Config(offload=True)``: every CUDA tensor the pipeline keeps for backward (its compressed
copies, and the already compressed context of :mod:`gnnact.nn` layers) is copied to a pinned
host buffer on a side *copy-out* stream while forward goes on, and its device memory is freed
once that copy is done. In backward, reading item :math:`k` issues, on a side *copy-in* stream,
the copies of the next ``prefetch_depth`` items backward will read (those saved just before
:math:`k`), so they arrive while item :math:`k`'s gradient is computed.

Ordering invariants (each enforced by a CUDA event or a stream wait, never by luck):

1. **A copy-out reads its source only after the compute stream wrote it**: the copy-out stream
   waits on the compute stream before each copy.
2. **A source is not freed before its copy-out completes**: the source is marked used by the
   copy-out stream (``record_stream``), so the caching allocator keeps its block until then.
3. **A copy-in reads a host buffer only after its copy-out completes**: the copy-in stream
   waits on the item's copy-out event.
4. **The compute stream never reads a restored tensor before its copy-in completes**: it waits
   on the copy-in event, and the restored tensor is marked used by the compute stream.
5. **A host buffer is never reused before its last copy completes**: a buffer goes back to the
   pool only when its item dies (autograd freed the graph), together with the event of the
   last copy that read or wrote it, and the next copy-out into it first waits on that event.

Host buffers are pooled by size and reused across steps, so pinned memory stops growing after
the first step. On the CPU nothing is offloaded: the pipeline keeps its tensors as they are.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

__all__ = ["Offloader", "PinnedPool", "Swapped"]


class PinnedPool:
    """Pinned host buffers (``uint8``) by exact byte size, each with the event its last copy
    recorded (``None``: free to use).

    :meth:`acquire` hands out a free buffer of the requested size, or allocates a new pinned
    one (which needs CUDA); :meth:`release` returns buffers to the pool with the event their
    last copy recorded, which the next user must wait on before writing (invariant 5 of the
    module docstring). Buffers are reused across steps, so :attr:`allocated_bytes` stops
    growing after the first step. Takes no arguments.

    Example:
        >>> from gnnact.swap import PinnedPool
        >>> pool = PinnedPool()
        >>> buf = torch.empty(1024, dtype=torch.uint8)  # on CUDA: buf, _ = pool.acquire(1024)
        >>> pool.release([buf], None)  # None: no copy to wait for
        >>> pool.free_bytes
        1024
        >>> again, ready = pool.acquire(1024)  # reused, not allocated
        >>> again is buf, ready, pool.allocated_bytes
        (True, None, 0)
    """

    def __init__(self) -> None:
        self._free: dict[int, list[tuple[Tensor, torch.cuda.Event | None]]] = {}
        self.allocated_bytes = 0  # pinned bytes ever allocated by this pool

    def acquire(self, nbytes: int) -> tuple[Tensor, torch.cuda.Event | None]:
        """A buffer of ``nbytes`` bytes and the event to wait on before writing it."""
        bucket = self._free.get(nbytes)
        if bucket:
            return bucket.pop()
        self.allocated_bytes += nbytes
        return _pinned_empty(nbytes), None

    def release(self, buffers: Sequence[Tensor], event: torch.cuda.Event | None) -> None:
        """Return ``buffers`` to the pool; ``event`` (``None``: none) is what the last copy
        that read or wrote them recorded."""
        for buf in buffers:
            self._free.setdefault(buf.numel(), []).append((buf, event))

    @property
    def free_bytes(self) -> int:
        """Bytes of the buffers in the pool, waiting to be reused."""
        return sum(size * len(b) for size, b in self._free.items())


class _State:
    """What outlives a :class:`Swapped` item: its host buffers and its last copy's event."""

    def __init__(self) -> None:
        self.buffers: list[Tensor] = []
        self.last_event: torch.cuda.Event | None = None


class Swapped:
    """Tensors held in pinned host memory for backward, and how to rebuild what was saved.

    Made by :meth:`Offloader.offload`, read by :meth:`Offloader.fetch`; its host buffers go
    back to the pool when the item is garbage collected (autograd freed the graph).

    Args:
        host (list[torch.Tensor]): pinned host copies of the offloaded tensors, with their
            shapes and dtypes.
        rebuild (callable): turns the tensors copied back to the device (a tuple) into what
            was saved: the tensor itself or its compressed form.
        device (torch.device): the CUDA device the tensors came from and go back to.
        state (object): the item's host buffers and the event of its last copy (internal,
            kept by the pool's finalizer beyond the item's life).
        shape (torch.Size): shape of the saved tensor (not of its compressed parts).

    Example:
        >>> from gnnact.swap import Offloader
        >>> offloader = Offloader(torch.device("cuda:0"))  # doctest: +SKIP
        >>> x = torch.randn(1024, 256, device="cuda:0")  # doctest: +SKIP
        >>> item = offloader.offload((x,), lambda parts: parts[0], x.shape)  # doctest: +SKIP
        >>> item.nbytes, item.shape, item.host[0].is_pinned()  # doctest: +SKIP
        (1048576, torch.Size([1024, 256]), True)
    """

    def __init__(self, host: list[Tensor], rebuild: Callable[[tuple[Tensor, ...]], Any],
                 device: torch.device, state: _State, shape: torch.Size) -> None:
        self.host = host
        self.shape = shape  # of the saved tensor
        self.rebuild = rebuild
        self.device = device
        self.state = state
        self.restored: tuple[Tensor, ...] | None = None  # prefetched, not yet read
        self.nbytes = sum(h.numel() * h.element_size() for h in host)


class Offloader:
    """Moves tensors to pinned host memory and back; see the module docstring.

    :class:`gnnact.compress_saved_tensors` makes one per device when offloading
    (``Config(offload=True)`` or ``offload_paths``); use that rather than this class directly.
    Needs CUDA (it creates two side streams).

    Args:
        device (torch.device): the CUDA device.
        prefetch_depth (int, optional): items copied in ahead of the one backward reads.
            (default: :obj:`1`)

    Example:
        >>> from gnnact.swap import Offloader
        >>> offloader = Offloader(torch.device("cuda:0"), prefetch_depth=2)  # doctest: +SKIP
        >>> offloader.new_pass()  # doctest: +SKIP
        >>> x = torch.randn(1024, 256, device="cuda:0")  # doctest: +SKIP
        >>> item = offloader.offload((x,), lambda parts: parts[0], x.shape)  # doctest: +SKIP
        >>> del x  # device memory freed once the copy-out completes  # doctest: +SKIP
        >>> offloader.fetch(item).device  # copied back  # doctest: +SKIP
        device(type='cuda', index=0)
    """

    def __init__(self, device: torch.device, prefetch_depth: int = 1) -> None:
        self.device = device
        self.prefetch_depth = prefetch_depth
        self.copy_out = torch.cuda.Stream(device)
        self.copy_in = torch.cuda.Stream(device)
        self.pool = PinnedPool()
        self._order: list[weakref.ref] = []  # items of the current forward pass, in save order
        self._index: dict[int, int] = {}  # id(item) -> position in _order

    def new_pass(self) -> None:
        """Start a new forward pass (prefetching follows the order of the latest one)."""
        self._order, self._index = [], {}

    def offload(self, tensors: tuple[Tensor, ...], rebuild: Callable[[tuple[Tensor, ...]], Any],
                shape: torch.Size) -> Swapped:
        """Copy contiguous CUDA ``tensors`` to pinned buffers; ``rebuild`` turns the restored
        tensors back into what was saved, a tensor of shape ``shape`` or its compressed
        form."""
        compute = torch.cuda.current_stream(self.device)
        self.copy_out.wait_stream(compute)  # invariant 1
        state = _State()
        host = []
        with torch.cuda.stream(self.copy_out):
            for t in tensors:
                nbytes = t.numel() * t.element_size()
                buf, ready = self.pool.acquire(nbytes)
                if ready is not None:
                    self.copy_out.wait_event(ready)  # invariant 5
                state.buffers.append(buf)
                view = buf.view(t.dtype).view(t.shape) if nbytes else buf.view(t.dtype)
                view.copy_(t, non_blocking=True)
                t.record_stream(self.copy_out)  # invariant 2
                host.append(view)
        event = torch.cuda.Event()
        event.record(self.copy_out)
        state.last_event = event
        item = Swapped(host, rebuild, self.device, state, shape)
        # invariant 5: the buffers return to the pool when autograd drops the item
        weakref.finalize(item, _give_back, self.pool, state)
        self._index[id(item)] = len(self._order)
        self._order.append(weakref.ref(item))
        return item

    def _prefetch(self, item: Swapped) -> None:
        if item.restored is not None:
            return
        assert item.state.last_event is not None
        self.copy_in.wait_event(item.state.last_event)  # invariant 3
        with torch.cuda.stream(self.copy_in):
            restored = tuple(torch.empty(h.shape, dtype=h.dtype, device=self.device)
                             .copy_(h, non_blocking=True) for h in item.host)
        event = torch.cuda.Event()
        event.record(self.copy_in)
        item.state.last_event = event
        item.restored = restored

    def fetch(self, item: Swapped) -> Any:
        """What was saved, on the device, ready for the compute stream; prefetches the next
        items backward will read."""
        self._prefetch(item)
        assert item.restored is not None and item.state.last_event is not None
        compute = torch.cuda.current_stream(self.device)
        compute.wait_event(item.state.last_event)  # invariant 4
        for t in item.restored:
            t.record_stream(compute)
        restored, item.restored = item.restored, None  # a second reader copies in again
        position = self._index.get(id(item))
        if position is not None and self._order[position]() is item:
            for ref in self._order[max(0, position - self.prefetch_depth):position][::-1]:
                ahead = ref()
                if ahead is not None:
                    self._prefetch(ahead)
        return item.rebuild(restored)


def _pinned_empty(nbytes: int) -> Tensor:
    """A pinned host buffer of ``nbytes`` bytes (one place to allocate them: tests without a GPU
    substitute pageable memory here)."""
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)


def _give_back(pool: PinnedPool, state: _State) -> None:
    pool.release(state.buffers, state.last_event)
    state.buffers = []
