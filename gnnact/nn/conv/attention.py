r"""What the attention convs (``GATConv``, ``GATv2Conv``) share around their fused ops: PyG's
self-loops, the cached graph of the (looped) adjacency, the edge features a sparse adjacency
carries, and the output PyG returns."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor
from torch_geometric import EdgeIndex
from torch_geometric.typing import Adj, OptTensor, Size, SparseTensor, torch_sparse
from torch_geometric.utils import (
    add_self_loops,
    is_torch_sparse_tensor,
    remove_self_loops,
    to_edge_index,
)
from torch_geometric.utils.sparse import set_sparse_value

from gnnact.nn.conv.base import propagate_sizes
from gnnact.ops.context import transient
from gnnact.ops.graph import (
    Graph,
    build_graph,
    cache_on,
    check_edge_index,
    graph_cache_for,
    keys_with_self_loops,
)

__all__ = ["attention_graph", "attention_output", "looped_graph", "sparse_edge_features"]


#: The attention ops' graphs: per-call edge values (the attention weights, in input order:
#: input_perm, t_perm), and the per-edge targets derived from the row pointers when read.
_OPTIONS = {"per_edge": True, "keep_dst": False}


def _build(adj: Any, num_src: int, num_dst: int, flow: str, borrow: bool) -> Graph:
    """The graph of ``adj`` with its edges in the order PyG's message passing sees them (the
    edge features, a sparse adjacency's values included, are read by the op, not kept)."""
    if is_torch_sparse_tensor(adj):
        # to_edge_index is what PyG's propagate uses: same edge order (for COO too, which
        # it takes as given rather than coalescing), so attention weights line up.
        (row, col), _ = to_edge_index(adj)
        return Graph.from_coo(col, row, num_src, num_dst, **_OPTIONS)
    return build_graph(adj, num_src, num_dst, flow=flow, own_values=False, borrow=borrow,
                       **_OPTIONS)


def _with_self_loops(edge_index: Tensor, edge_attr: Tensor | None, fill_value: Any,
                     num_nodes: int) -> tuple[Tensor, Tensor | None]:
    """``edge_index`` (and ``edge_attr``) with its self-loops replaced, as PyG's GAT does."""
    edge_index, edge_attr = remove_self_loops(edge_index, edge_attr)
    return add_self_loops(edge_index, edge_attr, fill_value=fill_value, num_nodes=num_nodes)


def looped_graph(edge_index: Tensor, loops: int, num_src: int, num_dst: int, flow: str,
                 build: Callable[[Tensor], Graph], **options: bool) -> Graph:
    """The graph of ``edge_index`` (no edge features) with its self-loops replaced as
    :func:`_with_self_loops` replaces them (loops of nodes ``0 … loops - 1``): built from the
    edges' keys (:meth:`Graph.from_keys` with ``options``), the same graph without PyG's two
    copies of the edge list; for ``target_to_source``, ``build`` of the looped edge_index."""
    if flow != "source_to_target":
        looped, _ = _with_self_loops(edge_index, None, None, loops)
        return build(looped)
    src, dst = check_edge_index(edge_index, num_src, num_dst, flow=flow)
    return Graph.from_keys(lambda: keys_with_self_loops(src, dst, num_src, loops), num_src,
                           num_dst, **options)


def attention_graph(conv: Any, edge_index: Adj, edge_attr: OptTensor, size: Size,
                    num_src_rows: int, num_dst_rows: int | None,
                    want_alpha: bool) -> tuple[Graph, Adj, OptTensor]:
    """The cached graph of an attention conv's adjacency, with self-loops exactly as PyG adds
    them, and the adjacency and edge features PyG's propagate would see:
    ``(graph, edge_index, edge_attr)``.

    The graph is cached on the caller's adjacency. An ``edge_index`` that nothing but that
    graph reads (no edge features, no returned weights) has its loops replaced only when the
    graph is built (:func:`looped_graph`, on the edges' keys), not in every forward: removing
    loops syncs with the host and breaks a compiled graph. A sparse adjacency's values and an
    ``EdgeIndex``'s sizes change with the loops: those are looped here. Looped edge features
    are a temporary of the call (packed at ``bits``, not kept by reference).

    Args:
        conv: the layer (``add_self_loops``, ``fill_value``, ``edge_dim``, ``flow``).
        num_src_rows (int): rows of the source features.
        num_dst_rows (int, optional): rows of the target features (:obj:`None`: none given).
    """
    adj = edge_index
    loops_key: tuple = ("no_loops",)
    looped_later = False
    if conv.add_self_loops:
        if isinstance(edge_index, Tensor):
            num_nodes = (num_src_rows if num_dst_rows is None
                         else min(num_src_rows, num_dst_rows))
            num_nodes = min(size) if size is not None else num_nodes
            loops_key = ("loops", num_nodes)
            looped_later = (edge_attr is None and not want_alpha
                            and not is_torch_sparse_tensor(edge_index)
                            and not isinstance(edge_index, EdgeIndex))
            if not looped_later:
                edge_index, edge_attr = _with_self_loops(edge_index, edge_attr,
                                                         conv.fill_value, num_nodes)
                if edge_attr is not None:
                    edge_attr = transient(edge_attr)
        elif isinstance(edge_index, SparseTensor):
            if conv.edge_dim is not None:
                raise NotImplementedError(
                    "The usage of 'edge_attr' and 'add_self_loops' simultaneously is "
                    "currently not yet supported for 'edge_index' in a 'SparseTensor' form")
            edge_index = torch_sparse.set_diag(edge_index)
            loops_key = ("set_diag",)

    n_src, n_dst = propagate_sizes(conv, edge_index, size, num_src_rows, num_dst_rows)
    looped = edge_index

    def build() -> Graph:
        if looped_later:
            return looped_graph(looped, loops_key[1], n_src, n_dst, conv.flow,
                                lambda ei: _build(ei, n_src, n_dst, conv.flow, False),
                                **_OPTIONS)
        return _build(looped, n_src, n_dst, conv.flow, looped is adj)

    graph = cache_on(adj, (type(conv).__name__, loops_key, n_src, n_dst, conv.flow), build,
                     cache=graph_cache_for(conv))
    return graph, edge_index, edge_attr


def sparse_edge_features(edge_index: Adj) -> OptTensor:
    """The edge features PyG's propagate reads from a sparse adjacency's values (``None`` for
    an ``edge_index`` or a sparse adjacency of scalar weights)."""
    if is_torch_sparse_tensor(edge_index):
        values = to_edge_index(edge_index)[1]
        return values if values.dim() > 1 else None
    if isinstance(edge_index, SparseTensor):
        return edge_index.storage.value()
    return None


def attention_output(conv: Any, result: Any, want_alpha: bool, res: Tensor | None,
                     edge_index: Adj) -> Any:
    """What an attention conv (``GATConv``, ``GATv2Conv``) returns, as PyG's: the heads
    concatenated or averaged, plus the residual and the bias, and with
    ``return_attention_weights`` the coefficients beside the (self-looped) adjacency."""
    out, alpha = result if want_alpha else (result, None)
    out = out.view(-1, conv.heads * conv.out_channels) if conv.concat else out.mean(dim=1)
    if res is not None:
        out = out + res
    if conv.bias is not None:
        out = out + conv.bias
    if not want_alpha:
        return out
    assert alpha is not None
    if isinstance(edge_index, Tensor):
        if is_torch_sparse_tensor(edge_index):
            return out, (set_sparse_value(edge_index, alpha), alpha)
        return out, (edge_index, alpha)
    return out, edge_index.set_value(alpha, layout="coo")
