r"""Full-batch training partitioned over ranks on :mod:`torch.distributed`, with the halo
exchange optionally compressed by gnnact's quantizer.

The pieces, in the order a training script uses them:

* :func:`partition_nodes` (METIS, contiguous or random) and :func:`shard_graph` /
  :func:`build_shard`: each rank's :class:`GraphShard` (owned nodes, halo, local edges, send
  and receive plans);
* :class:`HaloExchange`: owned rows to ``[owned; halo]`` rows as an autograd op, values and
  gradients sent at 1–8 bits (stochastic rounding, unbiased), 16 or 32 (exact), bytes counted
  in :class:`ExchangeStats`;
* :class:`DistributedGNN`: a user's PyG model with an exchange before each conv and the global
  GCN normalisation and :func:`sync_batch_norm`; :func:`sum_gradients_hook` for
  ``DistributedDataParallel``;
* :func:`train_partitioned`: the full-batch training loop (loss over the global count,
  gradients summed, the whole graph's metric), as ``gnnact train --nprocs`` runs it;
* :func:`run_local`: :math:`k` gloo processes on one machine.
"""

from gnnact.distributed.batchnorm import sync_batch_norm
from gnnact.distributed.exchange import ExchangeStats, HaloExchange
from gnnact.distributed.launch import run_local
from gnnact.distributed.model import DistributedGNN, sum_gradients_hook
from gnnact.distributed.norm import GlobalGCNNorm
from gnnact.distributed.partition import METHODS, metis_available, partition_nodes
from gnnact.distributed.shard import GraphShard, build_shard, shard_graph
from gnnact.distributed.training import PartitionedRunResult, train_partitioned

__all__ = ["METHODS", "DistributedGNN", "ExchangeStats", "GlobalGCNNorm", "GraphShard",
           "HaloExchange", "PartitionedRunResult", "build_shard", "metis_available",
           "partition_nodes", "run_local", "shard_graph", "sum_gradients_hook",
           "sync_batch_norm", "train_partitioned"]
