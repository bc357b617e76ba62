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
    recorded (``None``: free to use)."""

    def __init__(self) -> None:
        self._free: dict[int, list[tuple[Tensor, torch.cuda.Event | None]]] = {}
        self.allocated_bytes = 0  # pinned bytes ever allocated by this pool

    def acquire(self, nbytes: int) -> tuple[Tensor, torch.cuda.Event | None]:
        """A buffer of ``nbytes`` bytes and the event to wait on before writing it."""
        bucket = self._free.get(nbytes)
        if bucket:
            return bucket.pop()
        self.allocated_bytes += nbytes
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True), None

    def release(self, buffers: Sequence[Tensor], event: torch.cuda.Event | None) -> None:
        for buf in buffers:
            self._free.setdefault(buf.numel(), []).append((buf, event))

    @property
    def free_bytes(self) -> int:
        return sum(size * len(b) for size, b in self._free.items())


class _State:
    """What outlives a :class:`Swapped` item: its host buffers and its last copy's event."""

    def __init__(self) -> None:
        self.buffers: list[Tensor] = []
        self.last_event: torch.cuda.Event | None = None


class Swapped:
    """Tensors held in pinned host memory for backward, and how to rebuild what was saved."""

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

    Args:
        device (torch.device): the CUDA device.
        prefetch_depth (int, optional): items copied in ahead of the one backward reads.
            (default: :obj:`1`)
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


def _give_back(pool: PinnedPool, state: _State) -> None:
    pool.release(state.buffers, state.last_event)
    state.buffers = []
