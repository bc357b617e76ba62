r"""Graph structure for compressed message passing, built once per adjacency and cached.

A :class:`Graph` describes :math:`Y = A X` with :math:`A \in \mathbb{R}^{N_{dst} \times N_{src}}`
(PyG's ``adj_t``: row :math:`i` lists the sources :math:`j` of the edges :math:`j \to i`):

* :math:`A` in CSR (``ptr``, ``src``): edges sorted by target, the order in which edge values
  are given to the ops ("CSR order");
* :math:`A^\top` for backward (:math:`\nabla X = A^\top \nabla Y`): nothing at all when the
  adjacency is symmetric (same edge set, and the same values on :math:`(i, j)` and
  :math:`(j, i)`), detected once when the graph is built; otherwise its CSR (``t_ptr``,
  ``t_dst``) and, when values must be reordered, ``t_perm`` mapping its edges to CSR order;
* ``input_perm`` (CSR edge :math:`e` is input edge ``input_perm[e]``) only where per-call edge
  values come in the caller's order and that order is not already CSR order.

What a graph keeps depends on what its user needs (``per_edge``, ``keep_dst``): a fixed
adjacency aggregated with its own values (GCN, SAGE, GCNII) keeps :math:`A` and, only if it is
not symmetric, the transposed structure. Indices and permutations are int32 when :math:`N` and
:math:`E` fit, int64 otherwise. Building one from an edge list holds at most 24 bytes per edge
beside it (int64 sort keys, their sorted copy and the permutation; every other per-edge tensor
int32, made by blocks): the first step of a large graph needs little beyond what later steps
do. No node features, and nothing derived only for speed: the per-edge targets (when not kept)
and all-ones values are made in the call that needs them.
Where the caller's adjacency already is this CSR (a ``torch.sparse`` CSR or
``torch_sparse.SparseTensor`` ``adj_t``, or an ``EdgeIndex`` sorted by target, with sorted
columns), the graph refers to its tensors instead of copying them (``borrowed``): those bytes
are the caller's.

:func:`graph_from` accepts every adjacency PyG accepts: an ``edge_index`` tensor ``[2, E]``
(source row first, PyG's ``source_to_target`` flow), PyG's ``EdgeIndex``, a ``torch.sparse``
CSR or COO ``adj_t``, and ``torch_sparse.SparseTensor`` (``adj_t``) when installed.

**Who keeps graphs.** A :class:`GraphCache`: weakly keyed by the adjacency object and
invalidated by in-place changes, so a model that reuses one ``edge_index`` across layers and
epochs builds its graph once. Each gnnact conv layer owns one (:func:`graph_cache_for`); an
outer owner (a converted model's forward pass) makes all its layers share one through
:func:`use_graph_cache`, a context variable: two models in two threads never see each other's
graphs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
import weakref
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from gnnact.ops.blocks import element_blocks
from gnnact.ops.state import eager_op

__all__ = ["Graph", "GraphCache", "active_graph_cache", "build_graph", "cache_on",
           "check_edge_index", "check_sparse_flow", "csr_tensor", "edge_keys",
           "graph_cache_for", "graph_from", "is_sparse_adjacency", "is_sparse_tensor",
           "keys_with_self_loops", "sparse_compute_dtype", "use_graph_cache"]

_INT32_MAX = 2**31 - 1


def _index_dtype(*sizes: int) -> torch.dtype:
    return torch.int32 if max(sizes, default=0) <= _INT32_MAX else torch.int64


def csr_tensor(ptr: Tensor, col: Tensor, value: Tensor, size: tuple[int, int]) -> Tensor:
    """A ``torch.sparse_csr`` tensor, without invariant checks or the beta warning."""
    return torch.sparse_csr_tensor(ptr, col, value, size, check_invariants=False)


def _quiet_csr_warning() -> None:
    # PyTorch warns once per process that sparse CSR support is in beta (a TORCH_WARN_ONCE in
    # SparseCsrTensorImpl): raised and silenced here, at import, since we rely only on CSR @
    # dense. (A catch_warnings block around every construction cost ~5 us, a small graph's
    # sparse product's host time.)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        one = torch.ones(1, dtype=torch.int64)
        csr_tensor(torch.tensor([0, 1]), one.sub(1), one.float(), (1, 1))


_quiet_csr_warning()


#: Dtypes torch's CSR @ dense lacks on the CPU (``addmm_out_sparse_csr_impl_mkl``).
_CPU_UPCAST = (torch.float16, torch.bfloat16)


def sparse_compute_dtype(dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The dtype a sparse product of ``dtype`` operands is computed in on ``device``: float32
    for float16/bfloat16 on the CPU, which torch's CSR kernels do not support, else
    ``dtype``."""
    return torch.float32 if device.type == "cpu" and dtype in _CPU_UPCAST else dtype


def _storage_key(t: Tensor) -> tuple:
    return (t.device.type, t.device.index, t.untyped_storage().data_ptr())


def _ones(num_edges: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """All-ones edge values, made per call (never cached). On the CPU a stride-0 view of one
    element, which torch's CSR @ dense reads like a full vector (same products, same speed:
    ``benchmarks/bench_graph_cache.py``). Elsewhere a real vector: PyTorch's cuSPARSE CSR
    descriptor takes the values through ``values.expect_contiguous()`` inside its constructor
    (``aten/src/ATen/cuda/CUDASparseDescriptors.cpp``), so a strided view's contiguous copy
    would not outlive the descriptor that points at it."""
    if device.type == "cpu":
        return torch.ones(1, dtype=dtype).expand(num_edges)
    return torch.ones(num_edges, dtype=dtype, device=device)


@dataclass(eq=False)
class Graph:
    r"""An adjacency :math:`A` (``[num_dst, num_src]``) in CSR, with what its transpose needs.

    Build one with :meth:`from_coo`, :meth:`from_csr`, :func:`build_graph` or
    :func:`graph_from`. Every tensor it holds is a field (:meth:`nbytes` counts them).

    Args:
        num_src (int): :math:`N_{src}`, rows of the input features.
        num_dst (int): :math:`N_{dst}`, rows of the output.
        ptr (torch.Tensor): CSR row pointers of :math:`A`, ``[num_dst + 1]``.
        src (torch.Tensor): source node of each edge in CSR order, ``[E]``.
        value (torch.Tensor, optional): the adjacency's own constant edge values (CSR order);
            :obj:`None` for all ones.
        t_ptr (torch.Tensor, optional): CSR row pointers of :math:`A^\top`, ``[num_src + 1]``;
            :obj:`None` when :math:`A` is symmetric (:math:`A^\top` has :math:`A`'s CSR).
        t_dst (torch.Tensor, optional): target node of each edge in transposed order, ``[E]``;
            :obj:`None` when symmetric, or when ``t_perm`` is kept (then it is ``dst[t_perm]``,
            made per call).
        t_perm (torch.Tensor, optional): transposed edge :math:`k` is CSR edge ``t_perm[k]``,
            ``[E]``; :obj:`None` when values need no reordering (all ones, or symmetric own
            values, and ``per_edge`` not set).
        input_perm (torch.Tensor, optional): CSR edge :math:`e` is input edge
            ``input_perm[e]``; :obj:`None` when the input order is CSR order (or when
            ``per_edge`` is not set).
        targets (torch.Tensor, optional): target node of each edge in CSR order, kept for the
            layers that read it per edge; else :attr:`dst` derives it from ``ptr`` per call.
        per_edge (bool): whether per-call edge values (in input order) are supported:
            ``input_perm`` and ``t_perm`` are then complete. (default: :obj:`True`)
        borrowed (tuple[str, ...]): the fields that refer to the caller's adjacency tensors
            rather than copies (not counted by :meth:`nbytes`). (default: ``()``)

    ``value`` must be the values the graph was built with: whether :math:`A` is symmetric was
    decided with them.
    """

    num_src: int
    num_dst: int
    ptr: Tensor
    src: Tensor
    value: Tensor | None = None
    t_ptr: Tensor | None = None
    t_dst: Tensor | None = None
    t_perm: Tensor | None = None
    input_perm: Tensor | None = None
    targets: Tensor | None = None
    per_edge: bool = True
    borrowed: tuple[str, ...] = ()

    @property
    def num_edges(self) -> int:
        return self.src.numel()

    @property
    def device(self) -> torch.device:
        return self.src.device

    @property
    def symmetric(self) -> bool:
        """Whether backward uses :math:`A` itself as :math:`A^\\top` (no transposed copy)."""
        return self.t_ptr is None

    @property
    def dst(self) -> Tensor:
        """Target node of each edge in CSR order, ``[E]``: ``targets`` if kept, else derived
        from ``ptr`` (one sequential pass, in the call that needs it)."""
        if self.targets is not None:
            return self.targets
        return _rows_of_edges(self.ptr, self.num_edges, self.src.dtype)

    def dst_of(self, edges: slice) -> Tensor:
        """The targets of the CSR edges ``edges`` (a slice of ``range(E)``, step 1):
        ``targets[edges]`` if kept, else each edge's row found in ``ptr`` by binary search,
        for a block of edges without the ``[E]`` tensor of :attr:`dst`."""
        if self.targets is not None:
            return self.targets[edges]
        ids = torch.arange(edges.start, edges.stop, dtype=self.ptr.dtype, device=self.device)
        rows = torch.searchsorted(self.ptr, ids, right=True,
                                  out_int32=self.src.dtype == torch.int32)
        return rows.sub_(1)

    def in_degree(self, dtype: torch.dtype) -> Tensor:
        """Edges into each target, ``[num_dst]``."""
        return (self.ptr[1:] - self.ptr[:-1]).to(dtype)

    def _values(self, value: Tensor | None, dtype: torch.dtype) -> Tensor:
        if value is not None:
            return value.to(dtype)
        return _ones(self.num_edges, dtype, self.device)

    def _check_per_edge(self, value: Tensor | None) -> None:
        if value is not None and value is not self.value and not self.per_edge:
            raise ValueError("this graph was built for its own edge values only "
                             "(per_edge=False); build it with per_edge=True to multiply by "
                             "per-call edge values")

    def matrix(self, value: Tensor | None, dtype: torch.dtype) -> Tensor:
        r""":math:`A` as a ``torch.sparse_csr`` tensor with ``value`` (CSR order; ones if
        ``None``)."""
        return csr_tensor(self.ptr, self.src, self._values(value, dtype),
                          (self.num_dst, self.num_src))

    def transpose_index(self) -> tuple[Tensor, Tensor, Tensor | None]:
        r"""``(t_ptr, t_dst, t_perm)`` of :math:`A^\top`, with the parts the graph does not
        keep made here (``t_dst = dst[t_perm]``): call once per backward, not per head."""
        if self.t_ptr is None:
            return self.ptr, self.src, self.t_perm
        t_dst = self.t_dst
        if t_dst is None:
            assert self.t_perm is not None
            t_dst = self.dst.index_select(0, self.t_perm).to(self.t_ptr.dtype)
        return self.t_ptr, t_dst, self.t_perm

    def matrix_t(self, value: Tensor | None, dtype: torch.dtype,
                 index: tuple[Tensor, Tensor, Tensor | None] | None = None) -> Tensor:
        r""":math:`A^\top` as a ``torch.sparse_csr`` tensor, ``value`` in CSR order (ones if
        ``None``); ``index`` from :meth:`transpose_index` when several products share it."""
        self._check_per_edge(value)
        t_ptr, t_dst, t_perm = self.transpose_index() if index is None else index
        v = self._values(value, dtype)
        if value is not None and t_perm is not None:
            v = v.index_select(0, t_perm)
        return csr_tensor(t_ptr, t_dst, v, (self.num_src, self.num_dst))

    def mm(self, x: Tensor, value: Tensor | None = None, *, transpose: bool = False,
           index: tuple[Tensor, Tensor, Tensor | None] | None = None,
           scale: Tensor | None = None, col_scale: Tensor | None = None) -> Tensor:
        r""":math:`A X` (or :math:`A^\top X` with ``transpose``) for a 2-D ``x``, ``value`` in
        CSR order (ones if ``None``); with ``scale`` (``[rows]``), row :math:`i` of the product
        times ``scale[i]`` (the mean's :math:`D^{-1}`), applied before rounding. With
        ``col_scale`` (``[num_dst]``; ``transpose`` and no ``value`` only), :math:`A^\top D X`
        for :math:`D = \mathrm{diag}(\text{col\_scale})`, as the matrix's entries: the mean's
        backward without a scaled copy of :math:`X` (E values instead of a full-size tensor).

        The result has the dtype PyG's messages :math:`a_{ij} x_j` get: ``x``'s promoted with
        ``value``'s, whatever :func:`torch.autocast` is active (PyG's scatter is not autocast
        either: float32 values on bfloat16 features give float32). torch's CSR @ dense has no
        float16/bfloat16 kernel on the CPU: there the product is computed in float32 and
        rounded once to the result dtype (through a transient float32 copy of ``x``, never
        kept), at least as accurate as PyG's scatter, which rounds after every addition.
        """
        if transpose:
            self._check_per_edge(value)
        rows = self.num_src if transpose else self.num_dst
        return self.mm_rows(x, (0, rows), (0, self.num_edges), value, transpose=transpose,
                            scale=scale, col_scale=col_scale, index=index)

    def edge_offsets(self, rows: list[int], *, transpose: bool = False,
                     index: tuple[Tensor, Tensor, Tensor | None] | None = None) -> list[int]:
        r"""Where the edges of each row in ``rows`` start in the CSR of :math:`A` (or of
        :math:`A^\top`): one read to the host for all the blocks of :meth:`mm_rows`, none for
        a single block (a GPU's usual case: :data:`~gnnact.ops.blocks.GPU_BLOCK_ELEMENTS`)."""
        if rows == [0, self.num_src if transpose else self.num_dst]:
            return [0, self.num_edges]
        ptr = (self.transpose_index() if index is None else index)[0] if transpose else self.ptr
        return ptr[torch.tensor(rows, device=ptr.device)].tolist()

    def mm_rows(self, x: Tensor, rows: tuple[int, int], edges: tuple[int, int],
                value: Tensor | None = None, *, transpose: bool = False,
                scale: Tensor | None = None, col_scale: Tensor | None = None,
                index: tuple[Tensor, Tensor, Tensor | None] | None = None) -> Tensor:
        r"""Rows ``rows = (r0, r1)`` of :meth:`mm`'s product (same arguments, same dtypes), from
        the edges ``edges = (e0, e1)`` of those rows (:meth:`edge_offsets`): a block of the
        output without the rest of it. ``scale`` and ``col_scale`` are whole (``[rows]`` of
        the full product, ``[num_dst]``)."""
        r0, r1 = rows
        e0, e1 = edges
        dtype = x.dtype if value is None else torch.promote_types(x.dtype, value.dtype)
        compute = sparse_compute_dtype(dtype, x.device)
        if col_scale is not None and (value is not None or not transpose):
            raise ValueError("Graph.mm: col_scale needs transpose=True and no value")
        if transpose:
            ptr, col, perm = self.transpose_index() if index is None else index
            size = (r1 - r0, self.num_dst)
        else:
            ptr, col, perm = self.ptr, self.src, None
            size = (r1 - r0, self.num_src)
        cols = col[e0:e1]
        if col_scale is not None:
            v = col_scale.to(compute).index_select(0, cols)
        elif value is None:
            v = _ones(e1 - e0, compute, x.device)
        elif transpose and perm is not None:
            v = value.index_select(0, perm[e0:e1]).to(compute)
        else:
            v = value[e0:e1].to(compute)
        crow = ptr[r0:r1 + 1]
        a = csr_tensor(crow - e0 if e0 else crow, cols, v, size)
        # Autocast would cast the CSR operand to a dtype without a CPU kernel (matmul is on
        # its lower-precision list); the dtypes are chosen above instead. (Its context only
        # where autocast is on: entering it costs a small product's arithmetic.)
        if torch.is_autocast_enabled(x.device.type):
            with torch.autocast(x.device.type, enabled=False):
                y = a @ x.to(compute)
        else:
            y = a @ x.to(compute)
        if scale is not None:
            y.mul_(scale[r0:r1].to(compute)[:, None])
        return y.to(dtype)

    def to_csr_order(self, edge_tensor: Tensor) -> Tensor:
        """Reorder a per-edge tensor (first dimension) from input order to CSR order."""
        self._check_per_edge(edge_tensor)
        perm = self.input_perm
        return edge_tensor if perm is None else edge_tensor.index_select(0, perm)

    def to_input_order(self, edge_tensor: Tensor) -> Tensor:
        """Reorder a per-edge tensor from CSR order to input order (inverse of
        :meth:`to_csr_order`)."""
        self._check_per_edge(edge_tensor)
        perm = self.input_perm
        if perm is None:
            return edge_tensor
        out = torch.empty_like(edge_tensor)
        out[perm] = edge_tensor
        return out

    def tensors(self, *, borrowed: bool = False) -> Iterator[tuple[str, Tensor]]:
        """``(field name, tensor)`` for every tensor the graph holds (the caller's borrowed
        ones only with ``borrowed=True``)."""
        for f in dataclasses.fields(self):
            t = getattr(self, f.name)
            if isinstance(t, Tensor) and (borrowed or f.name not in self.borrowed):
                yield f.name, t

    def nbytes(self, *, borrowed: bool = False) -> int:
        r"""Bytes of the distinct storages the graph holds: every tensor field, each storage
        once; the caller's tensors it refers to (``borrowed``) only with ``borrowed=True``.

        Per edge, int32 indices: :math:`4(N_{dst}+1) + 4E` for :math:`A`, :math:`+4E` per
        kept per-edge tensor (``value`` in float32, ``t_dst``, ``t_perm``, ``input_perm``,
        ``targets``), :math:`+4(N_{src}+1)` for ``t_ptr``.
        """
        return _storage_bytes(t for _, t in self.tensors(borrowed=borrowed))

    @classmethod
    def from_coo(cls, src: Tensor, dst: Tensor, num_src: int, num_dst: int,
                 value: Tensor | None = None, *, per_edge: bool = True,
                 keep_dst: bool = True) -> Graph:
        """Build from edge lists ``src -> dst`` in any order (``value`` in that order).

        Args:
            per_edge (bool, optional): support per-call edge values in this input order
                (keeps ``input_perm`` and ``t_perm``). (default: :obj:`True`)
            keep_dst (bool, optional): keep the per-edge targets. (default: :obj:`True`)
        """
        return cls.from_keys(lambda: edge_keys(src, dst, num_src), num_src, num_dst, value,
                             per_edge=per_edge, keep_dst=keep_dst)

    @classmethod
    def from_keys(cls, make_keys: Callable[[], Tensor], num_src: int, num_dst: int,
                  value: Tensor | None = None, *,
                  values_of: Callable[[Tensor, Tensor, Tensor], Tensor] | None = None,
                  per_edge: bool = True, keep_dst: bool = True) -> Graph:
        """Build from the edges' keys ``dst * num_src + src`` (:func:`edge_keys`), in any order.

        The CSR order is the keys' order: one stable sort of them, and both endpoints read
        back from the sorted keys by blocks (no gather), so the build holds 24 bytes per edge
        at most (the keys, their sorted copy and the permutation; every other per-edge tensor
        int32 where it fits).

        Args:
            make_keys (Callable): makes the int64 keys ``[E]`` when called, so that the build
                is their only holder and lets them go once sorted.
            value (torch.Tensor, optional): edge values in the keys' order.
            values_of (Callable, optional): instead of ``value``, makes the values in CSR
                order from the int64 row pointers and the CSR-ordered sources and targets
                (values that follow from the structure, such as GCN's normalisation).
            per_edge, keep_dst: as in :meth:`from_coo`.
        """
        if value is not None and values_of is not None:
            raise ValueError("from_keys takes value or values_of, not both")
        key = make_keys()
        num_edges = key.numel()
        idx = _index_dtype(num_src + 1, num_dst + 1, num_edges)
        perm = None
        if num_edges >= 2 and not bool((key[1:] >= key[:-1]).all()):
            key, perm = torch.sort(key, stable=True)
        if value is not None:  # (the caller's: copied in CSR order)
            value = value.clone() if perm is None else value[perm]
        input_perm = perm.to(idx) if per_edge and perm is not None else None
        del perm
        src_s, dst_s = _split_keys(key, num_src, idx)
        del key
        ptr = _compress(dst_s, num_dst)
        if values_of is not None:
            value = values_of(ptr, src_s, dst_s)
        return cls._finish(num_src, num_dst, ptr.to(idx), src_s, dst_s, value, input_perm,
                           per_edge=per_edge, keep_dst=keep_dst)

    @classmethod
    def from_csr(cls, ptr: Tensor, col: Tensor, num_src: int, num_dst: int,
                 value: Tensor | None = None, *, per_edge: bool = True, keep_dst: bool = True,
                 borrow: bool = False) -> Graph:
        """Build from a CSR ``adj_t`` (rows are targets), ``value`` in CSR order.

        Args:
            borrow (bool, optional): refer to ``ptr``, ``col`` and ``value`` instead of
                copying them, when their order serves (columns sorted within each row): for
                the caller's own adjacency, which lives anyway. (default: :obj:`False`)
        """
        idx = _index_dtype(num_src + 1, num_dst + 1, col.numel())
        dst = _rows_of_edges(ptr, col.numel(), idx)
        if not _sorted_within_rows(ptr, col):
            # A CSR may list a row's columns in any order: re-sorting through from_coo gives
            # one canonical order (which symmetry detection compares), and input_perm maps it
            # back to the caller's.
            return cls.from_coo(col, dst, num_src, num_dst, value, per_edge=per_edge,
                                keep_dst=keep_dst)
        borrowed: tuple[str, ...] = ()
        if borrow and ptr.dtype == col.dtype and ptr.is_contiguous() and col.is_contiguous():
            borrowed = ("ptr", "src", "value")
        else:
            ptr, col = ptr.to(idx, copy=True), col.to(idx, copy=True)
            value = None if value is None else value.clone()
        return cls._finish(num_src, num_dst, ptr, col, dst, value, None, per_edge=per_edge,
                           keep_dst=keep_dst, borrowed=borrowed)

    @classmethod
    def _finish(cls, num_src: int, num_dst: int, ptr: Tensor, src: Tensor, dst: Tensor,
                value: Tensor | None, input_perm: Tensor | None, *, per_edge: bool,
                keep_dst: bool, borrowed: tuple[str, ...] = ()) -> Graph:
        """The transposed structure, unless :math:`A` is symmetric; ``src``/``dst``/``value``
        in CSR order (sorted by target, then source)."""
        idx = _index_dtype(num_src + 1, num_dst + 1, src.numel())
        if value is not None and value.numel() and bool((value == 1).all()):
            value = None  # all ones: made per call, exactly the same products
        # Stable: within a source, edges stay sorted by target, so t_dst is sorted per row and
        # equals src exactly when the structure is symmetric (both in canonical order).
        t_src, t_perm = torch.sort(src, stable=True)
        t_ptr = _compress(t_src, num_src)
        del t_src
        t_dst = dst.index_select(0, t_perm)
        symmetric = (num_src == num_dst and _equal(t_ptr, ptr)
                     and _equal(t_dst, src))
        if symmetric and value is not None:
            symmetric = torch.equal(value.index_select(0, t_perm), value)
        keep_perm = per_edge or (value is not None and not symmetric)
        if symmetric or keep_perm:  # (with t_perm, t_dst = dst[t_perm] is made per call)
            del t_dst
        t_perm = t_perm.to(idx) if keep_perm else None
        graph = cls(num_src, num_dst, ptr, src, value=value, t_perm=t_perm,
                    input_perm=input_perm, targets=dst.to(idx) if keep_dst else None,
                    per_edge=per_edge,
                    borrowed=tuple(b for b in borrowed if not (b == "value" and value is None)))
        if not symmetric:
            graph.t_ptr = t_ptr.to(idx)
            if not keep_perm:
                graph.t_dst = t_dst.to(idx)
        return graph


def _compress(sorted_index: Tensor, size: int) -> Tensor:
    """Row pointers (int64) of an index sorted ascending: entry :math:`i` counts the values
    below :math:`i` (a binary search per row: no temporary as long as the index)."""
    bounds = torch.arange(size + 1, dtype=sorted_index.dtype, device=sorted_index.device)
    return torch.searchsorted(sorted_index, bounds)


def _rows_of_edges(ptr: Tensor, num_edges: int, dtype: torch.dtype) -> Tensor:
    """The row of each edge of a CSR with row pointers ``ptr``, ``[num_edges]`` in ``dtype``:
    a one where each row after the first starts, then a running sum, in place. No int64 index
    of every edge (``repeat_interleave`` makes one) and no host sync."""
    starts = torch.zeros(num_edges + 1, dtype=dtype, device=ptr.device)
    starts.index_add_(0, ptr[1:], torch.ones(ptr.numel() - 1, dtype=dtype, device=ptr.device))
    return starts.cumsum_(0)[:num_edges]


def edge_keys(src: Tensor, dst: Tensor, num_src: int) -> Tensor:
    """The int64 keys ``dst * num_src + src`` of edges (their order is the CSR order of
    :class:`Graph`), by blocks: no full-size int64 copy of an int32 input beside them."""
    key = torch.empty(src.numel(), dtype=torch.int64, device=src.device)
    for a, b in element_blocks(src.numel(), src.device):
        key[a:b].copy_(dst[a:b]).mul_(num_src).add_(src[a:b])
    return key


def keys_with_self_loops(src: Tensor, dst: Tensor, num_src: int, loops: int) -> Tensor:
    """The keys (:func:`edge_keys`) of the edges left when PyG replaces the self-loops of an
    ``edge_index`` without edge features (``remove_self_loops`` then ``add_self_loops``, as
    GAT does; ``add_remaining_self_loops`` without weights, as GCN does): every edge that is
    not a loop, in order, then the loops of nodes ``0 … loops - 1``. Made by blocks, without
    the copies of the edge list PyG's functions make."""
    blocks = element_blocks(src.numel(), src.device)
    # How many edges of each block stay (read to the host at once: one sync, not one per
    # block), then the kept keys packed.
    counts = [(src[a:b] != dst[a:b]).sum() for a, b in blocks]
    kept: list[int] = torch.stack(counts).tolist() if counts else []
    key = torch.empty(sum(kept) + loops, dtype=torch.int64, device=src.device)
    at = 0
    for (a, b), k in zip(blocks, kept, strict=True):
        not_loop = src[a:b] != dst[a:b]
        key[at:at + k] = edge_keys(src[a:b], dst[a:b], num_src)[not_loop]
        at += k
    torch.arange(loops, device=src.device, out=key[at:]).mul_(num_src + 1)
    return key


def _split_keys(key: Tensor, num_src: int, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """Inverse of :func:`edge_keys`: ``(src, dst)`` in ``dtype``, by blocks."""
    src = torch.empty(key.numel(), dtype=dtype, device=key.device)
    dst = torch.empty_like(src)
    for a, b in element_blocks(key.numel(), key.device):
        q = torch.div(key[a:b], num_src, rounding_mode="floor")
        dst[a:b] = q
        src[a:b] = key[a:b] - q.mul_(num_src)
    return src, dst


def _equal(a: Tensor, b: Tensor) -> bool:
    """``torch.equal`` of two index tensors that may differ in dtype (int32 and int64)."""
    return torch.equal(a, b if a.dtype == b.dtype else b.to(a.dtype))


def _sorted_within_rows(ptr: Tensor, col: Tensor) -> bool:
    """Whether each CSR row lists its columns in ascending order."""
    num_edges = col.numel()
    if num_edges < 2:
        return True
    descending = col[1:] < col[:-1]
    row_start = torch.zeros(num_edges + 1, dtype=torch.bool, device=col.device)
    row_start[ptr.long()] = True
    return not bool((descending & ~row_start[1:num_edges]).any())


def _storage_bytes(tensors: Any) -> int:
    seen: set[tuple] = set()
    total = 0
    for t in tensors:
        if t.numel() == 0:
            continue
        key = _storage_key(t)
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total


def _check_size(name: str, got: int, expected: int | None) -> None:
    if expected is not None and got != expected:
        raise ValueError(f"{name}: the adjacency has {got} nodes on this side but the features "
                         f"have {expected} rows")


# ---------------------------------------------------------------------------------- caching

def _version(obj: Any) -> int:
    return getattr(obj, "_version", 0)


def _graph_tensors(value: Any) -> Iterator[Tensor]:
    """gnnact's own tensors in a cached value (a Graph, a tensor, or a tuple/list of them)."""
    if isinstance(value, Graph):
        yield from (t for _, t in value.tensors())
    elif isinstance(value, Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from _graph_tensors(v)


class GraphCache:
    """Graphs built from adjacency objects, kept while those objects live unchanged.

    An entry is keyed by the adjacency object (its *anchor*, weakly referenced) and a key
    tuple. It is dropped when the anchor is garbage-collected, and rebuilt when the anchor or
    one of the ``also`` objects it depends on (edge weights) has changed in place (a new
    ``_version``). Objects that cannot be weakly referenced are not cached. A copy, a deep copy
    or an unpickled cache is empty: weak references do not travel.

    Example:
        >>> cache = GraphCache()
        >>> ei = torch.tensor([[0, 1], [1, 0]])
        >>> g = cache.get(ei, ("graph",), lambda: build_graph(ei, 2))
        >>> cache.get(ei, ("graph",), lambda: build_graph(ei, 2)) is g
        True
        >>> cache.nbytes() == g.nbytes()
        True
    """

    def __init__(self) -> None:
        # (id(anchor), key) -> (weakref to anchor, its version, [(weakref, version)] of also,
        # value)
        self._entries: dict[tuple[int, tuple], tuple] = {}

    def get(self, anchor: Any, key: tuple, build: Callable[[], Any], also: tuple = ()) -> Any:
        """``build()``, cached for as long as ``anchor`` (and every object in ``also``) lives
        unchanged."""
        cache_key = (id(anchor), key)
        entry = self._entries.get(cache_key)
        if entry is not None:
            ref, version, others, value = entry
            if ref() is anchor and version == _version(anchor) and len(others) == len(also) and (
                    all(r() is o and v == _version(o)
                        for (r, v), o in zip(others, also, strict=True))):
                return value
        value = build()
        try:
            ref = weakref.ref(anchor, self._forget_callback(cache_key))
            others = [(weakref.ref(o), _version(o)) for o in also]
        except TypeError:  # not weakly referenceable: not cached
            return value
        self._entries[cache_key] = (ref, _version(anchor), others, value)
        return value

    def _forget_callback(self, cache_key: tuple) -> Callable[[weakref.ref], None]:
        # Holds the cache weakly: an adjacency that outlives its cache must not keep it alive.
        cache = weakref.ref(self)

        def forget(ref: weakref.ref) -> None:
            alive = cache()
            if alive is not None:
                entry = alive._entries.get(cache_key)
                if entry is not None and entry[0] is ref:  # not a newer entry with this key
                    del alive._entries[cache_key]

        return forget

    def find(self, key: tuple, match: Callable[[Any, Any], bool]) -> Any:
        """A value cached under ``key`` (with any anchor, alive and unchanged) for which
        ``match(anchor, value)`` holds, or ``None``."""
        for (_, entry_key), (ref, version, _, value) in list(self._entries.items()):
            anchor = ref()
            if (entry_key == key and anchor is not None and version == _version(anchor)
                    and match(anchor, value)):
                return value
        return None

    def values(self) -> list[Any]:
        """The cached values whose anchor is alive."""
        return [entry[3] for entry in list(self._entries.values()) if entry[0]() is not None]

    def nbytes(self) -> int:
        """Bytes of the live cached graphs, each storage once (graphs built for different
        layers share their structure); the caller's tensors a graph refers to are not
        counted."""
        return _storage_bytes(t for v in self.values() for t in _graph_tensors(v))

    def clear(self) -> None:
        """Drop every entry."""
        self._entries.clear()

    def __len__(self) -> int:
        return len(self.values())

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({len(self)} entries, {self.nbytes()} bytes)"

    def __getstate__(self) -> dict:
        return {}

    def __setstate__(self, state: dict) -> None:
        self._entries = {}

    def __deepcopy__(self, memo: dict) -> GraphCache:
        return self.__class__()


_ACTIVE: ContextVar[GraphCache | None] = ContextVar("gnnact_graph_cache", default=None)

#: The attribute of a conv module holding its own :class:`GraphCache`.
OWNER_ATTRIBUTE = "_gnnact_graphs"


@contextlib.contextmanager
def use_graph_cache(cache: GraphCache | None) -> Iterator[GraphCache | None]:
    """Inside, every gnnact layer (and :func:`cache_on` without ``cache``) uses ``cache``
    instead of its own; ``None`` restores the layers' own caches. Per thread (and asyncio
    task): a context variable."""
    if cache is not None and not isinstance(cache, GraphCache):
        raise TypeError(f"cache must be a GraphCache or None, got {type(cache).__name__}")
    token = _ACTIVE.set(cache)
    try:
        yield cache
    finally:
        _ACTIVE.reset(token)


def active_graph_cache() -> GraphCache | None:
    """The cache :func:`use_graph_cache` made active in this context, or ``None``."""
    return _ACTIVE.get()


@eager_op
def graph_cache_for(owner: Any) -> GraphCache:
    """The cache a layer uses: the active one (see :func:`use_graph_cache`), else the layer's
    own, created on first use as its ``_gnnact_graphs`` attribute (not a buffer: no
    ``state_dict`` entry; copies and pickles of the layer get an empty one)."""
    active = _ACTIVE.get()
    if active is not None:
        return active
    cache = owner.__dict__.get(OWNER_ATTRIBUTE)
    if cache is None:
        cache = GraphCache()
        object.__setattr__(owner, OWNER_ATTRIBUTE, cache)
    return cache


@eager_op
def cache_on(anchor: Any, key: tuple, build: Callable[[], Any], also: tuple = (),
             cache: GraphCache | None = None) -> Any:
    """``build()``, cached in ``cache`` (else the active one, see :func:`use_graph_cache`)
    for as long as ``anchor`` (and every object in ``also``) lives unchanged; with neither,
    built afresh (see :meth:`GraphCache.get`)."""
    if cache is None:
        cache = _ACTIVE.get()
    if cache is None:
        return build()
    return cache.get(anchor, key, build, also)


# --------------------------------------------------------------------------------- building

@eager_op
def graph_from(adj: Any, num_src: int | None = None, num_dst: int | None = None,
               *, flow: str = "source_to_target", cache: GraphCache | None = None,
               own_values: bool = True, per_edge: bool = True, keep_dst: bool = True) -> Graph:
    r"""The :class:`Graph` of a PyG adjacency, cached on the adjacency object in ``cache``
    (else the active cache; with neither, built afresh).

    Args:
        adj: ``edge_index`` (integer tensor ``[2, E]``, row 0 the sources),
            ``torch_geometric.EdgeIndex``, ``torch.sparse`` CSR/COO ``adj_t``
            ``[N_dst, N_src]``, or ``torch_sparse.SparseTensor`` ``adj_t``.
        num_src (int, optional): rows of the source features (checked against a sparse
            adjacency; required for ``edge_index``).
        num_dst (int, optional): rows of the output; defaults to ``num_src``.
        flow (str, optional): ``"source_to_target"`` (PyG's default) or ``"target_to_source"``
            (row 0 of ``edge_index`` holds the targets). (default: :obj:`"source_to_target"`)
        cache (GraphCache, optional): where to keep it. (default: the active cache)
        own_values (bool, optional): keep a sparse adjacency's values as the graph's.
            (default: :obj:`True`)
        per_edge (bool, optional): support per-call edge values. (default: :obj:`True`)
        keep_dst (bool, optional): keep the per-edge targets. (default: :obj:`True`)

    Raises:
        ValueError: the adjacency's size does not match the features, or an index is out of
            range.
        TypeError: the adjacency has an unsupported type.
    """
    if num_dst is None:
        num_dst = num_src
    cache = _ACTIVE.get() if cache is None else cache

    def build() -> Graph:
        mirror = None if cache is None else _mirror(cache, adj, (
            "graph", num_dst, num_src, flow, own_values, per_edge, keep_dst))
        return mirror if mirror is not None else build_graph(
            adj, num_src, num_dst, flow=flow, own_values=own_values, per_edge=per_edge,
            keep_dst=keep_dst, borrow=True)

    return cache_on(adj, ("graph", num_src, num_dst, flow, own_values, per_edge, keep_dst),
                    build, cache=cache)


def _transposed(graph: Graph) -> Graph | None:
    r"""The graph of :math:`A^\top` made of ``graph``'s own tensors (its CSR is ``graph``'s
    transposed structure and the other way round), where ``graph`` keeps that whole structure
    and nothing per edge that would need reordering; else ``None``."""
    if (graph.t_ptr is None or graph.t_dst is None or graph.value is not None or graph.per_edge
            or graph.input_perm is not None or graph.targets is not None or graph.borrowed):
        return None
    return Graph(graph.num_dst, graph.num_src, graph.t_ptr, graph.t_dst, t_ptr=graph.ptr,
                 t_dst=graph.src, per_edge=False)


def _mirror(cache: GraphCache, adj: Any, key: tuple) -> Graph | None:
    """The transpose of a graph ``cache`` holds under ``key`` for an ``edge_index`` whose rows
    are ``adj``'s swapped (a heterogeneous graph's reverse edge type, ``ToUndirected``'s
    ``rev_*``, is its forward type flipped): the two then share one structure. ``None`` when
    there is none, or ``adj`` is not a plain ``edge_index``."""
    if type(adj) is not Tensor or adj.layout != torch.strided or adj.dim() != 2 or (
            adj.size(0) != 2):
        return None

    def flipped(anchor: Any, graph: Any) -> bool:
        return (type(anchor) is Tensor and anchor.shape == adj.shape
                and anchor.dtype == adj.dtype and anchor.device == adj.device
                and isinstance(graph, Graph) and _transposed(graph) is not None
                and torch.equal(anchor[0], adj[1]) and torch.equal(anchor[1], adj[0]))

    found = cache.find(key, flipped)
    return None if found is None else _transposed(found)


@eager_op
def build_graph(adj: Any, num_src: int | None = None, num_dst: int | None = None,
                *, flow: str = "source_to_target", edge_weight: Tensor | None = None,
                own_values: bool = True, per_edge: bool = True, keep_dst: bool = True,
                borrow: bool = False) -> Graph:
    """:func:`graph_from` without the cache (for adjacencies made afresh in every call).

    Args:
        edge_weight (torch.Tensor, optional): constant values of an ``edge_index``'s edges
            (input order), kept as the graph's own.
        borrow (bool, optional): refer to the adjacency's tensors instead of copying them where
            their order serves (see :meth:`Graph.from_csr`): for the caller's own adjacency,
            not for one made in the call. (default: :obj:`False`)
    """
    if num_dst is None:
        num_dst = num_src
    if flow not in ("source_to_target", "target_to_source"):
        raise ValueError(f"flow must be 'source_to_target' or 'target_to_source', got {flow!r}")
    check_sparse_flow(adj, flow)
    options = {"per_edge": per_edge, "keep_dst": keep_dst}
    sparse = is_sparse_adjacency(adj)
    if sparse and edge_weight is not None:
        raise ValueError("edge_weight is for an edge_index; a sparse adjacency carries its own "
                         "values")
    if is_sparse_tensor(adj):
        n_dst, n_src = adj.sparse_sizes()
        _check_size("num_src", n_src, num_src)
        _check_size("num_dst", n_dst, num_dst)
        rowptr, col, value = adj.csr()
        return Graph.from_csr(rowptr, col, n_src, n_dst, value if own_values else None,
                              borrow=borrow, **options)
    if not isinstance(adj, Tensor):
        raise TypeError(f"adjacency must be an edge_index Tensor, EdgeIndex, torch.sparse "
                        f"tensor or torch_sparse.SparseTensor, got {type(adj).__name__}")
    if adj.layout in (torch.sparse_csr, torch.sparse_coo):
        if adj.dim() != 2:
            raise ValueError(f"a sparse adjacency must be 2-D, got shape {tuple(adj.shape)}")
        n_dst, n_src = adj.shape
        _check_size("num_src", n_src, num_src)
        _check_size("num_dst", n_dst, num_dst)
        if adj.layout == torch.sparse_csr:
            return Graph.from_csr(adj.crow_indices(), adj.col_indices(), n_src, n_dst,
                                  adj.values() if own_values else None, borrow=borrow,
                                  **options)
        a = adj.coalesce()
        rows, cols = a.indices()
        return Graph.from_coo(cols, rows, n_src, n_dst, a.values() if own_values else None,
                              **options)
    if adj.layout != torch.strided:
        raise TypeError(f"unsupported adjacency layout {adj.layout}")
    edge_index = check_edge_index(adj, num_src, num_dst, flow=flow)
    src, dst = edge_index if flow == "source_to_target" else edge_index.flip(0)
    if edge_weight is not None and edge_weight.numel() != src.numel():
        raise ValueError(f"edge_weight has {edge_weight.numel()} entries but edge_index has "
                         f"{src.numel()} edges")
    assert num_src is not None and num_dst is not None  # (check_edge_index)
    if borrow and edge_weight is None:
        ptr = _target_indptr(adj, flow, num_dst)
        if ptr is not None:  # an EdgeIndex sorted by target: already CSR
            return Graph.from_csr(ptr, src, num_src, num_dst, borrow=True, **options)
    return Graph.from_coo(src, dst, num_src, num_dst, edge_weight, **options)


def _target_indptr(adj: Tensor, flow: str, num_dst: int) -> Tensor | None:
    """The row pointers over the targets of an ``EdgeIndex`` sorted by target (its own, cached
    in it), else ``None``."""
    try:
        from torch_geometric import EdgeIndex
    except ImportError:  # pragma: no cover
        return None
    target_order = "col" if flow == "source_to_target" else "row"
    if not isinstance(adj, EdgeIndex) or adj.sort_order != target_order:
        return None
    ptr = adj.get_indptr()
    return ptr if ptr.numel() == num_dst + 1 else None


def is_sparse_adjacency(adj: Any) -> bool:
    """A ``torch_sparse.SparseTensor`` or a non-strided ``torch`` tensor (an ``adj_t``)."""
    return is_sparse_tensor(adj) or (isinstance(adj, Tensor) and adj.layout != torch.strided)


def check_sparse_flow(adj: Any, flow: str) -> None:
    """As PyG's ``propagate``: a sparse ``adj_t`` is already oriented target x source, so it
    only takes ``flow='source_to_target'``."""
    if flow != "source_to_target" and is_sparse_adjacency(adj):
        raise ValueError(f'Flow direction "{flow}" is invalid for message propagation via '
                         f"`torch_sparse.SparseTensor` or `torch.sparse.Tensor`")


def check_edge_index(adj: Tensor, num_src: int | None, num_dst: int | None,
                     *, flow: str = "source_to_target") -> Tensor:
    """Validate an ``edge_index`` against the feature sizes; returns it as a plain tensor.

    Costs one device-to-host sync (callers cache what they build from it): an index past the
    feature rows would otherwise read out of bounds inside the sparse kernels. It runs only
    where a graph is built (:func:`build_graph`, under :func:`graph_from`, :func:`cache_on` and
    :func:`~gnnact.nn.conv.gcn_cache.gcn_graph`): once per adjacency while the graph cache
    keeps its graph, and under :func:`torch.compile` inside those eager calls
    (:func:`~gnnact.ops.state.eager_op`), never as a graph break of its own.
    """
    if adj.dim() != 2 or adj.size(0) != 2 or adj.is_floating_point() or adj.is_complex():
        raise ValueError(f"edge_index must be an integer tensor of shape [2, E], got "
                         f"{adj.dtype} of shape {tuple(adj.shape)}")
    if num_src is None:
        raise ValueError("num_src is required for an edge_index adjacency")
    num_dst = num_src if num_dst is None else num_dst
    edge_index = adj.as_tensor() if hasattr(adj, "as_tensor") else adj
    if edge_index.numel():
        src, dst = edge_index if flow == "source_to_target" else edge_index.flip(0)
        lo, src_max, dst_max = int(edge_index.min()), int(src.max()), int(dst.max())
        if lo < 0 or src_max >= num_src or dst_max >= num_dst:
            raise ValueError(f"edge_index holds node indices in [{lo}, "
                             f"{max(src_max, dst_max)}] but the graph has {num_src} source "
                             f"and {num_dst} target nodes")
    return edge_index


def is_sparse_tensor(adj: Any) -> bool:
    """Whether ``adj`` is a ``torch_sparse.SparseTensor`` (false when torch-sparse is absent)."""
    try:
        from torch_geometric.typing import SparseTensor
    except ImportError:  # pragma: no cover
        return False
    return isinstance(adj, SparseTensor) and not isinstance(adj, Tensor)
