r"""What one rank holds of a partitioned graph: its owned nodes, their halo, the local edges and
the plan of which rows go to and come from which peer.

With parts :math:`p(i)` (:func:`~gnnact.distributed.partition_nodes`) and edges
:math:`j \to i` (``edge_index[0]`` the source, PyG's ``source_to_target`` flow), rank
:math:`r` holds

* the owned nodes :math:`O_r = \{i : p(i) = r\}` in increasing global id, local ids
  :math:`0 \dots |O_r|-1`, with their features, labels and masks (every node attribute of the
  ``Data``, sliced);
* the halo :math:`H_r = \{j : p(j) \ne r, \exists\, j \to i,\ i \in O_r\}`, the remote sources
  of edges into owned nodes, ordered by owner rank then global id, local ids
  :math:`|O_r| \dots |O_r| + |H_r| - 1`: every message an owned node aggregates comes from
  :math:`O_r \cup H_r`;
* the local edges :math:`\{j \to i : i \in O_r\}` (every edge into an owned node, in their
  original order) over local ids, with the edge attributes of the ``Data`` (``edge_weight``,
  ``edge_attr``, …) sliced to them in the same order;
* the receive plan: :math:`H_r` is the concatenation, peer by peer, of
  :math:`H_{r \leftarrow q} = H_r \cap O_q` (``recv_counts[q]`` rows);
* the send plan: ``send_index[q]`` is the local ids of :math:`H_{q \leftarrow r}`, in the
  order peer :math:`q` stores them, so the rows it receives land at their place without any
  index being sent.

Every rank builds its shard from the whole graph; the edges it keeps are
:math:`\sum_{i \in O_r} \deg^-(i)`, so the shards' edges add up to :math:`E` exactly.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor
from torch_geometric.data import Data

from gnnact.distributed.partition import partition_nodes

__all__ = ["GraphShard", "build_shard", "shard_graph"]


@dataclass(eq=False)
class GraphShard:
    r"""Rank :attr:`rank`'s share of a graph partitioned into :attr:`world_size` parts (see the
    module docstring for what each field holds).

    Node attributes of the original ``Data`` (``x``, ``y``, ``train_mask``, …) are read as
    attributes: ``shard.x`` is ``node_attrs["x"]``, the owned rows only; so are its edge
    attributes: ``shard.edge_weight`` is ``edge_attrs["edge_weight"]``, the values of the local
    edges in :attr:`edge_index`'s order.

    Args:
        rank (int): the part this shard holds.
        world_size (int): the number of parts.
        num_global_nodes (int): :math:`N` of the whole graph.
        owned (torch.Tensor): global ids of the owned nodes, increasing.
        halo (torch.Tensor): global ids of the halo nodes, by owner then id.
        edge_index (torch.Tensor): ``[2, E_r]`` local edges over ``[owned; halo]``.
        recv_counts (dict[int, int]): halo rows per peer (peers with none left out).
        send_index (dict[int, torch.Tensor]): local owned ids to send each peer.
        node_attrs (dict[str, torch.Tensor]): the node attributes, owned rows.
        edge_attrs (dict[str, torch.Tensor]): the edge attributes, local edges.

    Example:
        >>> from torch_geometric.data import Data
        >>> data = Data(x=torch.randn(4, 3), edge_index=torch.tensor([[0, 1, 2, 3],
        ...                                                            [1, 2, 3, 0]]))
        >>> parts = torch.tensor([0, 0, 1, 1])
        >>> shard = gnnact.distributed.build_shard(data, parts, rank=1)
        >>> shard.owned, shard.halo, shard.edge_index
        (tensor([2, 3]), tensor([1]), tensor([[2, 0], [0, 1]]))
        >>> shard.recv_counts, shard.send_index
        ({0: 1}, {0: tensor([1])})
    """

    rank: int
    world_size: int
    num_global_nodes: int
    owned: Tensor
    halo: Tensor
    edge_index: Tensor
    recv_counts: dict[int, int]
    send_index: dict[int, Tensor]
    node_attrs: dict[str, Tensor] = field(default_factory=dict)
    edge_attrs: dict[str, Tensor] = field(default_factory=dict)

    @property
    def num_owned(self) -> int:
        return self.owned.numel()

    @property
    def num_halo(self) -> int:
        return self.halo.numel()

    @property
    def num_local(self) -> int:
        """Rows of ``[owned; halo]``: the nodes a conv on this rank sees."""
        return self.num_owned + self.num_halo

    def to(self, device: torch.device | str) -> GraphShard:
        """The shard with every tensor on ``device`` (a GPU per rank, with NCCL); the
        original is left as it is.

        Args:
            device (torch.device or str): where the tensors go.

        Example:
            >>> shard.to("cuda:0")  # doctest: +SKIP
        """
        return dataclasses.replace(
            self, owned=self.owned.to(device), halo=self.halo.to(device),
            edge_index=self.edge_index.to(device),
            send_index={q: i.to(device) for q, i in self.send_index.items()},
            node_attrs={k: v.to(device) for k, v in self.node_attrs.items()},
            edge_attrs={k: v.to(device) for k, v in self.edge_attrs.items()})

    def __getattr__(self, name: str) -> Tensor:
        # Only called when normal lookup fails: node and edge attributes read like Data's.
        nodes = self.__dict__.get("node_attrs", {})
        edges = self.__dict__.get("edge_attrs", {})
        if name in nodes:
            return nodes[name]
        if name in edges:
            return edges[name]
        raise AttributeError(f"GraphShard has no attribute or node attribute {name!r} "
                             f"(node attributes: {sorted(nodes)}; edge attributes: "
                             f"{sorted(edges)})")

    def __repr__(self) -> str:
        return (f"GraphShard(rank={self.rank}/{self.world_size}, owned={self.num_owned}, "
                f"halo={self.num_halo}, edges={self.edge_index.size(1)}, "
                f"peers={sorted(set(self.recv_counts) | set(self.send_index))})")


def build_shard(data: Data, parts: Tensor, rank: int) -> GraphShard:
    r"""Rank ``rank``'s :class:`GraphShard` of ``data`` under the node partition ``parts``.

    Args:
        data (torch_geometric.data.Data): the whole graph, with ``edge_index`` (source row
            first) and any node attributes.
        parts (torch.Tensor): ``[N]`` part of each node, :math:`0 \dots k-1`
            (:func:`~gnnact.distributed.partition_nodes`); :math:`k` is ``parts.max() + 1``.
        rank (int): the part to take, :math:`0 \le r < k`.

    Returns:
        GraphShard

    Example:
        >>> from torch_geometric.data import Data
        >>> data = Data(x=torch.randn(6, 3), edge_index=torch.randint(0, 6, (2, 12)))
        >>> parts = gnnact.distributed.partition_nodes(data.edge_index, 6, 2, "contiguous")
        >>> shard = gnnact.distributed.build_shard(data, parts, rank=0)
        >>> shard.x.shape
        torch.Size([3, 3])
    """
    num_nodes = data.num_nodes
    if not isinstance(parts, Tensor) or parts.shape != (num_nodes,):
        shape = tuple(parts.shape) if isinstance(parts, Tensor) else type(parts).__name__
        raise ValueError(f"parts must be a tensor of shape [num_nodes={num_nodes}], got {shape}")
    parts = parts.long()
    world_size = int(parts.max()) + 1
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"rank must be an int in [0, {world_size}), got {rank!r}")
    n = num_nodes
    src, dst = data.edge_index.long()
    owner_src, owner_dst = parts[src], parts[dst]

    owned = torch.nonzero(parts == rank).flatten()
    into = owner_dst == rank
    e_src, e_dst = src[into], dst[into]
    remote = owner_src[into] != rank
    # One sort orders the halo by owner, then by global id: key = owner * N + id.
    key = torch.unique(owner_src[into][remote] * n + e_src[remote])
    halo, halo_owner = key % n, key // n
    local = torch.full((n,), -1, dtype=torch.long)
    local[owned] = torch.arange(owned.numel())
    local[halo] = owned.numel() + torch.arange(halo.numel())
    edge_index = torch.stack([local[e_src], local[e_dst]])

    counts = torch.bincount(halo_owner, minlength=world_size).tolist()
    recv_counts = {q: c for q, c in enumerate(counts) if c}
    # What peer q stores as H_{q <- r}: the sources owned here of edges into q's nodes, by id.
    out = (owner_src == rank) & (owner_dst != rank)
    key = torch.unique(owner_dst[out] * n + src[out])
    peer, node = key // n, key % n
    send_index = {q: local[node[peer == q]] for q in torch.unique(peer).tolist()}

    # By name: PyG lists a Data's attributes from a set, whose order depends on the process's
    # string hashing, and the ranks must agree on it (DistributedGNN exchanges degrees per
    # edge weight, in this order).
    node_attrs = {name: data[name][owned] for name in sorted(data.node_attrs())
                  if isinstance(data[name], Tensor) and name != "edge_index"}
    edge_attrs = {name: data[name][into] for name in sorted(data.edge_attrs())
                  if isinstance(data[name], Tensor) and name != "edge_index"}
    return GraphShard(rank, world_size, n, owned, halo, edge_index, recv_counts, send_index,
                      node_attrs, edge_attrs)


def shard_graph(data: Data, group: dist.ProcessGroup | None = None, method: str = "metis",
                *, seed: int = 0) -> GraphShard:
    r"""Partition ``data`` into one part per rank of ``group`` and return this rank's shard.

    The partition is computed on the group's rank 0 and broadcast (``N`` int64 values), so all
    ranks agree; each rank then builds its own :class:`GraphShard` from ``data``, which every
    rank must hold whole during the call (the shard keeps copies of its rows only, so ``data``
    can be freed afterwards). Collective: every rank of ``group`` calls it. The shard is on the
    CPU; with NCCL move it to the rank's GPU (:meth:`GraphShard.to`).

    Args:
        data (torch_geometric.data.Data): the whole graph, the same on every rank.
        group (torch.distributed.ProcessGroup, optional): the ranks sharing the graph.
            (default: the default group)
        method (str, optional): of :func:`~gnnact.distributed.partition_nodes`.
            (default: :obj:`"metis"`)
        seed (int, optional): of :func:`~gnnact.distributed.partition_nodes`.
            (default: :obj:`0`)

    Returns:
        GraphShard

    Example:
        >>> # in each of k processes, after torch.distributed.init_process_group("gloo", ...)
        >>> shard = gnnact.distributed.shard_graph(data, method="contiguous")  # doctest: +SKIP
    """
    world_size, rank = dist.get_world_size(group), dist.get_rank(group)
    if rank == 0:
        parts = partition_nodes(data.edge_index, data.num_nodes, world_size, method, seed=seed)
    else:
        parts = torch.empty(data.num_nodes, dtype=torch.long)
    # NCCL moves CUDA tensors only: the parts travel through this rank's GPU there.
    nccl = dist.get_backend(group) == "nccl"
    wire = parts.to(torch.device("cuda", torch.cuda.current_device())) if nccl else parts
    dist.broadcast(wire, src=dist.get_global_rank(group or dist.group.WORLD, 0), group=group)
    return build_shard(data, wire.cpu() if nccl else parts, rank)
