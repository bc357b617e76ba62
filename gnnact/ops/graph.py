r"""Graph structure for compressed message passing, built once per adjacency and cached.

A :class:`Graph` describes :math:`Y = A X` with :math:`A \in \mathbb{R}^{N_{dst} \times N_{src}}`
(PyG's ``adj_t``: row :math:`i` lists the sources :math:`j` of the edges :math:`j \to i`):

* :math:`A` in CSR (``ptr``, ``src``): edges sorted by target, the order in which edge values
  are given to the ops ("CSR order");
* :math:`A^\top` in CSR (``t_ptr``, ``t_dst``) plus ``t_perm`` mapping its edges to CSR order,
  so backward computes :math:`\nabla X = A^\top \nabla Y` without transposing anything;
* ``input_perm``: CSR edge :math:`e` is input edge ``input_perm[e]`` (for ``edge_index``
  inputs), so per-edge weights given in input order can be reordered once.

Indices are int32 when :math:`N` and :math:`E` fit, int64 otherwise. The structure is what a
fixed-adjacency SpMM keeps for backward; no node features.

:func:`graph_from` accepts every adjacency PyG accepts: an ``edge_index`` tensor ``[2, E]``
(source row first, PyG's ``source_to_target`` flow), PyG's ``EdgeIndex``, a ``torch.sparse``
CSR or COO ``adj_t``, and ``torch_sparse.SparseTensor`` (``adj_t``) when installed. Results are
cached on the adjacency object (weakly, and invalidated by in-place changes), so a model that
reuses one ``edge_index`` across layers and epochs builds its graph once.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

__all__ = ["Graph", "build_graph", "cache_on", "check_edge_index", "check_sparse_flow",
           "csr_tensor", "graph_from", "is_sparse_adjacency", "is_sparse_tensor"]

_INT32_MAX = 2**31 - 1


def _index_dtype(*sizes: int) -> torch.dtype:
    return torch.int32 if max(sizes, default=0) <= _INT32_MAX else torch.int64


def csr_tensor(ptr: Tensor, col: Tensor, value: Tensor, size: tuple[int, int]) -> Tensor:
    """A ``torch.sparse_csr`` tensor, without invariant checks or the beta warning."""
    with warnings.catch_warnings():
        # "Sparse CSR tensor support is in beta": we rely only on CSR @ dense.
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(ptr, col, value, size, check_invariants=False)


@dataclass(eq=False)
class Graph:
    r"""An adjacency :math:`A` (``[num_dst, num_src]``) in CSR with its transpose.

    Args:
        num_src (int): :math:`N_{src}`, rows of the input features.
        num_dst (int): :math:`N_{dst}`, rows of the output.
        ptr (torch.Tensor): CSR row pointers of :math:`A`, ``[num_dst + 1]``.
        src (torch.Tensor): source node of each edge in CSR order, ``[E]``.
        t_ptr (torch.Tensor): CSR row pointers of :math:`A^\top`, ``[num_src + 1]``.
        t_dst (torch.Tensor): target node of each edge in transposed order, ``[E]``.
        t_perm (torch.Tensor): transposed edge :math:`k` is CSR edge ``t_perm[k]``, ``[E]``.
        value (torch.Tensor, optional): edge values carried by the adjacency itself (CSR order).
        input_perm (torch.Tensor, optional): CSR edge :math:`e` is input edge ``input_perm[e]``.
    """

    num_src: int
    num_dst: int
    ptr: Tensor
    src: Tensor
    t_ptr: Tensor
    t_dst: Tensor
    t_perm: Tensor
    value: Tensor | None = None
    input_perm: Tensor | None = None
    _ones: dict = field(default_factory=dict, repr=False)
    _dst: Tensor | None = field(default=None, repr=False)

    @property
    def num_edges(self) -> int:
        return self.src.numel()

    @property
    def device(self) -> torch.device:
        return self.src.device

    @property
    def dst(self) -> Tensor:
        """Target node of each edge in CSR order, ``[E]`` (computed once)."""
        if self._dst is None:
            counts = self.ptr[1:] - self.ptr[:-1]
            nodes = torch.arange(self.num_dst, dtype=self.src.dtype, device=self.device)
            self._dst = nodes.repeat_interleave(counts.long(), output_size=self.num_edges)
        return self._dst

    def in_degree(self, dtype: torch.dtype) -> Tensor:
        """Edges into each target, ``[num_dst]``."""
        return (self.ptr[1:] - self.ptr[:-1]).to(dtype)

    def _values(self, value: Tensor | None, dtype: torch.dtype) -> Tensor:
        if value is not None:
            return value.to(dtype)
        ones = self._ones.get(dtype)
        if ones is None:
            ones = self._ones[dtype] = torch.ones(self.num_edges, dtype=dtype, device=self.device)
        return ones

    def matrix(self, value: Tensor | None, dtype: torch.dtype) -> Tensor:
        r""":math:`A` as a ``torch.sparse_csr`` tensor with ``value`` (CSR order; ones if
        ``None``)."""
        return csr_tensor(self.ptr, self.src, self._values(value, dtype),
                          (self.num_dst, self.num_src))

    def matrix_t(self, value: Tensor | None, dtype: torch.dtype) -> Tensor:
        r""":math:`A^\top` as a ``torch.sparse_csr`` tensor."""
        v = self._values(value, dtype)
        if value is not None:
            v = v[self.t_perm]
        return csr_tensor(self.t_ptr, self.t_dst, v, (self.num_src, self.num_dst))

    def nbytes(self) -> int:
        """Bytes of the index structure (what a fixed-adjacency SpMM keeps)."""
        tensors = [self.ptr, self.src, self.t_ptr, self.t_dst, self.t_perm]
        return sum(t.numel() * t.element_size() for t in tensors)

    @classmethod
    def from_coo(cls, src: Tensor, dst: Tensor, num_src: int, num_dst: int,
                 value: Tensor | None = None) -> Graph:
        """Build from edge lists ``src -> dst`` in any order (``value`` in that order)."""
        num_edges = src.numel()
        idx = _index_dtype(num_src + 1, num_dst + 1, num_edges)
        src, dst = src.long(), dst.long()
        perm = torch.argsort(dst * num_src + src, stable=True)
        src_sorted, dst_sorted = src[perm], dst[perm]
        ptr = torch.zeros(num_dst + 1, dtype=torch.int64, device=src.device)
        torch.cumsum(torch.bincount(dst_sorted, minlength=num_dst), 0, out=ptr[1:])
        t_perm = torch.argsort(src_sorted * num_dst + dst_sorted, stable=True)
        t_ptr = torch.zeros(num_src + 1, dtype=torch.int64, device=src.device)
        torch.cumsum(torch.bincount(src_sorted, minlength=num_src), 0, out=t_ptr[1:])
        return cls(num_src, num_dst, ptr.to(idx), src_sorted.to(idx), t_ptr.to(idx),
                   dst_sorted[t_perm].to(idx), t_perm,
                   None if value is None else value[perm], perm)

    @classmethod
    def from_csr(cls, ptr: Tensor, col: Tensor, num_src: int, num_dst: int,
                 value: Tensor | None = None) -> Graph:
        """Build from a CSR ``adj_t`` (rows are targets), ``value`` in CSR order."""
        counts = (ptr[1:] - ptr[:-1]).long()
        dst = torch.arange(num_dst, device=ptr.device).repeat_interleave(
            counts, output_size=col.numel())
        # A CSR may list a row's columns in any order: re-sorting through from_coo gives one
        # canonical order, and input_perm maps it back to the caller's.
        return cls.from_coo(col, dst, num_src, num_dst, value)


def _check_size(name: str, got: int, expected: int | None) -> None:
    if expected is not None and got != expected:
        raise ValueError(f"{name}: the adjacency has {got} nodes on this side but the features "
                         f"have {expected} rows")


# (id(anchor), key) -> (weakref to anchor, its version, [(weakref, version) of `also`], value)
_CACHE: dict[tuple[int, tuple], tuple] = {}


def _version(obj: Any) -> int:
    return getattr(obj, "_version", 0)


def cache_on(anchor: Any, key: tuple, build: Callable[[], Any], also: tuple = ()) -> Any:
    """``build()``, cached for as long as ``anchor`` (and every object in ``also``) lives unchanged.

    The cache holds weak references only; an in-place change of any of them (a new
    ``_version``) or its garbage collection invalidates the entry. Objects that cannot be
    weakly referenced are not cached.
    """
    cache_key = (id(anchor), key)
    entry = _CACHE.get(cache_key)
    if entry is not None:
        ref, version, others, value = entry
        if ref() is anchor and version == _version(anchor) and len(others) == len(also) and all(
                r() is o and v == _version(o) for (r, v), o in zip(others, also, strict=True)):
            return value
    value = build()
    try:
        ref = weakref.ref(anchor, lambda r, k=cache_key: _CACHE.pop(k, None))
        others = [(weakref.ref(o), _version(o)) for o in also]
    except TypeError:
        return value
    _CACHE[cache_key] = (ref, _version(anchor), others, value)
    return value


def graph_from(adj: Any, num_src: int | None = None, num_dst: int | None = None,
               *, flow: str = "source_to_target") -> Graph:
    r"""The :class:`Graph` of a PyG adjacency, cached on the adjacency object.

    Args:
        adj: ``edge_index`` (integer tensor ``[2, E]``, row 0 the sources),
            ``torch_geometric.EdgeIndex``, ``torch.sparse`` CSR/COO ``adj_t``
            ``[N_dst, N_src]``, or ``torch_sparse.SparseTensor`` ``adj_t``.
        num_src (int, optional): rows of the source features (checked against a sparse
            adjacency; required for ``edge_index``).
        num_dst (int, optional): rows of the output; defaults to ``num_src``.
        flow (str, optional): ``"source_to_target"`` (PyG's default) or ``"target_to_source"``
            (row 0 of ``edge_index`` holds the targets). (default: :obj:`"source_to_target"`)

    Raises:
        ValueError: the adjacency's size does not match the features, or an index is out of
            range.
        TypeError: the adjacency has an unsupported type.
    """
    if num_dst is None:
        num_dst = num_src
    return cache_on(adj, ("graph", num_src, num_dst, flow),
                    lambda: build_graph(adj, num_src, num_dst, flow=flow))


def build_graph(adj: Any, num_src: int | None = None, num_dst: int | None = None,
                *, flow: str = "source_to_target") -> Graph:
    """:func:`graph_from` without the cache (for adjacencies made afresh in every call)."""
    if num_dst is None:
        num_dst = num_src
    if flow not in ("source_to_target", "target_to_source"):
        raise ValueError(f"flow must be 'source_to_target' or 'target_to_source', got {flow!r}")
    check_sparse_flow(adj, flow)
    if is_sparse_tensor(adj):
        n_dst, n_src = adj.sparse_sizes()
        _check_size("num_src", n_src, num_src)
        _check_size("num_dst", n_dst, num_dst)
        rowptr, col, value = adj.csr()
        return Graph.from_csr(rowptr, col, n_src, n_dst, value)
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
                                  adj.values())
        a = adj.coalesce()
        rows, cols = a.indices()
        return Graph.from_coo(cols, rows, n_src, n_dst, a.values())
    if adj.layout != torch.strided:
        raise TypeError(f"unsupported adjacency layout {adj.layout}")
    edge_index = check_edge_index(adj, num_src, num_dst, flow=flow)
    src, dst = edge_index if flow == "source_to_target" else edge_index.flip(0)
    return Graph.from_coo(src, dst, num_src, num_dst)


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
    feature rows would otherwise read out of bounds inside the sparse kernels.
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
