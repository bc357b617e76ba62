r"""Run a function on :math:`k` local processes joined in a gloo group (or NCCL, one GPU per
rank): for trying a partitioned model on one machine, in tests and in benchmarks.

Each process initialises :mod:`torch.distributed` with a file store in a fresh temporary
folder (no port to find free, nothing left behind), calls ``fn(rank, world_size, *args)``,
saves what it returns and leaves the group; the caller gets the results in rank order, or the
first process's exception.
"""

from __future__ import annotations

import datetime
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

__all__ = ["run_local"]


def _entry(rank: int, fn: Callable[..., Any], world_size: int, folder: str, args: tuple,
           timeout_s: float, threads: int | None, backend: str) -> None:
    if threads is not None:  # k processes share the machine's cores
        torch.set_num_threads(threads)
    if backend == "nccl":  # one GPU per rank, round robin
        torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group(backend, init_method=f"file://{folder}/store", rank=rank,
                            world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout_s))
    try:
        result = fn(rank, world_size, *args)
        torch.save(result, Path(folder) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def run_local(fn: Callable[..., Any], world_size: int, *args: Any, start_method: str = "spawn",
              timeout_s: float = 300.0, threads: int | None = 1,
              backend: str = "gloo") -> list[Any]:
    r"""``[fn(r, world_size, *args) for r in range(world_size)]``, each in its own process of
    one group (the default group of that process).

    Args:
        fn (Callable): a module-level function (``"spawn"`` pickles it by name) taking the
            rank, the world size and ``args``; what it returns must be picklable.
        world_size (int): :math:`k \ge 1` processes.
        *args (Any): passed on to ``fn``.
        start_method (str, optional): ``"spawn"`` (a fresh interpreter per process, safe
            everywhere) or ``"fork"`` (no re-import: much faster to start, for tests).
            (default: :obj:`"spawn"`)
        timeout_s (float, optional): the group's timeout: a rank waiting longer on a peer
            fails instead of hanging. (default: :obj:`300`)
        threads (int, optional): torch threads per process (:obj:`None`: torch's default).
            (default: :obj:`1`)
        backend (str, optional): ``"gloo"`` (CPU tensors) or ``"nccl"`` (CUDA tensors; rank
            :math:`r` on GPU :math:`r \bmod` the GPU count, set as its current device; NCCL
            wants a GPU per rank, so one GPU takes a single rank). (default: :obj:`"gloo"`)

    Returns:
        list: what ``fn`` returned on each rank, in rank order.

    Example:
        >>> def size(rank, world_size):  # in a module, for "spawn"
        ...     return torch.distributed.get_world_size()
        >>> gnnact.distributed.run_local(size, 2, start_method="fork")  # doctest: +SKIP
        [2, 2]
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    if start_method not in ("spawn", "fork"):
        raise ValueError(f"start_method must be 'spawn' or 'fork', got {start_method!r}")
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
    if backend == "nccl" and not torch.cuda.is_available():
        raise ValueError("backend='nccl' needs CUDA, and torch.cuda.is_available() is False")
    with tempfile.TemporaryDirectory(prefix="gnnact-dist-") as folder:
        mp.start_processes(_entry, args=(fn, world_size, folder, args, timeout_s, threads,
                                         backend),
                           nprocs=world_size, join=True, start_method=start_method)
        return [torch.load(Path(folder) / f"rank{r}.pt", weights_only=False)
                for r in range(world_size)]
