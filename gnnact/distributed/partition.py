r"""Split a graph's nodes into :math:`k` parts, once, before training.

Three methods (:data:`METHODS`):

* ``"metis"``: METIS's multilevel k-way partitioning of the undirected graph (self-loops
  dropped), which minimises the edges cut and so the halo each part has to receive. Through
  ``torch.ops.torch_sparse.partition`` when torch-sparse was built with METIS, else through
  ``pymetis`` when it is importable; a :class:`ValueError` says so when neither is there.
* ``"contiguous"``: node :math:`i` of :math:`N` goes to part :math:`\lfloor i k / N \rfloor`.
  Free, and as good as METIS when the node ids already follow the graph's locality (ogbn
  datasets are ordered by time or crawl); on a randomly numbered graph it cuts a fraction
  :math:`\approx (k-1)/k` of the edges, like ``"random"``.
* ``"random"``: a seeded random permutation cut into :math:`k` contiguous blocks: balanced,
  oblivious to structure (the worst case for the halo, a useful bound in benchmarks).

Every method gives parts of :math:`\lfloor N/k \rfloor` or :math:`\lceil N/k \rceil` nodes,
except METIS, which balances within its own tolerance.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["METHODS", "metis_available", "partition_nodes"]

#: The partitioning methods of :func:`partition_nodes`.
METHODS = ("metis", "contiguous", "random")


def _check_edge_index(edge_index: object, num_nodes: int) -> Tensor:
    if not isinstance(edge_index, Tensor) or edge_index.dim() != 2 or edge_index.size(0) != 2:
        shape = tuple(edge_index.shape) if isinstance(edge_index, Tensor) else None
        raise ValueError(f"edge_index must be a [2, E] tensor, got "
                         f"{type(edge_index).__name__} of shape {shape}")
    if edge_index.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"edge_index must be an integer tensor, got dtype {edge_index.dtype}")
    if edge_index.numel() and (int(edge_index.min()) < 0 or int(edge_index.max()) >= num_nodes):
        raise ValueError(f"edge_index holds node ids outside [0, num_nodes={num_nodes}): "
                         f"[{int(edge_index.min())}, {int(edge_index.max())}]")
    return edge_index.long()


def _undirected_csr(edge_index: Tensor, num_nodes: int) -> tuple[Tensor, Tensor]:
    """Row pointers and columns of the symmetric, loop-free, de-duplicated adjacency (what
    METIS expects)."""
    row, col = torch.cat([edge_index, edge_index.flip(0)], dim=1)
    keep = row != col
    key = torch.unique(row[keep] * num_nodes + col[keep])  # sorted: CSR order
    row, col = key // num_nodes, key % num_nodes
    rowptr = torch.zeros(num_nodes + 1, dtype=torch.long)
    rowptr[1:] = torch.bincount(row, minlength=num_nodes).cumsum(0)
    return rowptr, col


def _torch_sparse_metis(rowptr: Tensor, col: Tensor, num_parts: int) -> Tensor | None:
    try:
        import torch_sparse  # noqa: F401  (registers torch.ops.torch_sparse)

        return torch.ops.torch_sparse.partition(rowptr, col, None, num_parts, False).long()
    except (ImportError, AttributeError, RuntimeError):  # not installed, or no METIS inside
        return None


def _pymetis(rowptr: Tensor, col: Tensor, num_parts: int) -> Tensor | None:
    try:
        import pymetis
    except ImportError:
        return None
    xadj, adjncy = rowptr.tolist(), col.tolist()
    if hasattr(pymetis, "CSRAdjacency"):  # pymetis >= 2025; xadj/adjncy are deprecated there
        graph = {"adjacency": pymetis.CSRAdjacency(xadj, adjncy)}
    else:
        graph = {"xadj": xadj, "adjncy": adjncy}
    _, membership = pymetis.part_graph(num_parts, **graph)
    return torch.tensor(membership, dtype=torch.long)


def metis_available() -> bool:
    """Whether ``method="metis"`` can run here: torch-sparse built with METIS, or ``pymetis``.

    Example:
        >>> method = "metis" if gnnact.distributed.metis_available() else "contiguous"
        >>> method in ("metis", "contiguous")
        True
    """
    rowptr, col = torch.tensor([0, 1, 2]), torch.tensor([1, 0])
    return (_torch_sparse_metis(rowptr, col, 2) is not None
            or _pymetis(rowptr, col, 2) is not None)


def partition_nodes(edge_index: Tensor, num_nodes: int, num_parts: int,
                    method: str = "metis", *, seed: int = 0) -> Tensor:
    r"""The part :math:`p(i) \in \{0, \dots, k-1\}` of every node (see the module docstring
    for the methods).

    Deterministic for a given input (METIS included: both backends run with a fixed seed), but
    :func:`~gnnact.distributed.shard_graph` still computes it on one rank and broadcasts it, so
    that every rank agrees whatever the library.

    Args:
        edge_index (torch.Tensor): ``[2, E]`` edges (either direction; METIS symmetrises).
        num_nodes (int): :math:`N`.
        num_parts (int): :math:`k`, from 1 to :math:`N`.
        method (str, optional): ``"metis"``, ``"contiguous"`` or ``"random"``.
            (default: :obj:`"metis"`)
        seed (int, optional): seed of ``"random"``. (default: :obj:`0`)

    Returns:
        torch.Tensor: ``int64`` part ids of shape ``[N]``, every part non-empty.

    Example:
        >>> edge_index = torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4]])
        >>> gnnact.distributed.partition_nodes(edge_index, 5, 2, "contiguous")
        tensor([0, 0, 0, 1, 1])
    """
    for name, value in (("num_nodes", num_nodes), ("num_parts", num_parts)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {value!r}")
    if num_nodes < 1:
        raise ValueError(f"num_nodes must be positive, got {num_nodes}")
    if not 1 <= num_parts <= num_nodes:
        raise ValueError(f"num_parts must be in [1, num_nodes={num_nodes}], got {num_parts}")
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    edge_index = _check_edge_index(edge_index, num_nodes)
    # Balanced blocks of a node order: position j of the order goes to part floor(j k / N).
    blocks = torch.arange(num_nodes) * num_parts // num_nodes
    if method == "contiguous" or num_parts == 1:
        return blocks
    if method == "random":
        order = torch.randperm(num_nodes, generator=torch.Generator().manual_seed(seed))
        return torch.empty_like(blocks).scatter_(0, order, blocks)
    rowptr, col = _undirected_csr(edge_index, num_nodes)
    parts = _torch_sparse_metis(rowptr, col, num_parts)
    if parts is None:
        parts = _pymetis(rowptr, col, num_parts)
    if parts is None:
        raise ValueError("method='metis' needs METIS: this torch-sparse was built without it "
                         "and pymetis is not importable (pip install pymetis); use "
                         "method='contiguous' or method='random' instead")
    counts = torch.bincount(parts, minlength=num_parts)
    if bool((counts == 0).any()):  # METIS may leave a part empty on tiny or very sparse graphs
        raise ValueError(f"METIS left parts {torch.nonzero(counts == 0).flatten().tolist()} "
                         f"empty (num_nodes={num_nodes}, num_parts={num_parts}); use fewer "
                         f"parts or method='contiguous'")
    return parts
