"""Shared pieces of the benchmark scripts: environment facts for every result row, JSONL output
and timing that is honest on both CPU and GPU."""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch_geometric.nn import models as pyg_models

from gnnact.env import environment

__all__ = ["ADAPT_INTERVAL", "FIRST_INTERVAL", "PYG_MODELS", "RESULTS", "ROOT", "append_rows",
           "data_root", "environment", "finish", "kernel_seconds", "median_time",
           "optional_int", "pyg_model", "read_rows", "step_peak_bytes"]

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"

# The suite's adaptive controller: estimates at step 0, then gaps of FIRST_INTERVAL steps
# doubling up to ADAPT_INTERVAL (gnnact.Controller's schedule).
ADAPT_INTERVAL, FIRST_INTERVAL = 50, 10


#: PyG's own model classes, at the sizes of gnnact.models (``pyg`` style).
PYG_MODELS = ("gcn", "sage", "gat", "gatv2", "gin")


def pyg_model(name: str, f_in: int, classes: int) -> torch.nn.Module:
    """PyG's ``torch_geometric.nn.models`` class for ``name``: 3 layers, hidden 256 (GAT: 3
    heads x 128, concatenated), BatchNorm, ReLU and dropout 0.5, as gnnact.models builds them."""
    kwargs = {"num_layers": 3, "out_channels": classes, "dropout": 0.5, "norm": "batch_norm"}
    if name == "gcn":
        return pyg_models.GCN(f_in, 256, **kwargs)
    if name == "sage":
        return pyg_models.GraphSAGE(f_in, 256, **kwargs)
    if name in ("gat", "gatv2"):
        return pyg_models.GAT(f_in, 384, heads=3, v2=name == "gatv2", **kwargs)
    if name == "gin":
        return pyg_models.GIN(f_in, 256, **kwargs)
    raise ValueError(f"no PyG model class for {name!r}; choose from {PYG_MODELS}")


def step_peak_bytes(row: dict) -> int:
    """A row's step peak with gnnact's graph cache counted: the cache is built in the warmup
    steps, before the measured step, so the measured peak (``peak_bytes``) leaves it out; it
    lives through the step all the same (PyG's rows build their graph structures inside the
    step, and record no cache)."""
    return row["peak_bytes"] + (row.get("graph_cache_bytes") or 0)


def optional_int(value: str) -> int | None:
    """An argparse type: an int, or ``"none"`` for :obj:`None`."""
    return None if value == "none" else int(value)


def data_root() -> Path:
    """Where benchmarks read real datasets: ``$GNNACT_DATA``, else the offline collection
    ``../shared/datasets`` beside the checkout."""
    return Path(os.environ.get("GNNACT_DATA", ROOT.parent / "shared" / "datasets"))


def out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` says memory ran out: the caching allocator's ``OutOfMemoryError``, a
    CUDA runtime error from a pinned host allocation (``cudaHostAlloc``, as in
    ``save_on_cpu``), which PyTorch raises as a plain runtime error, or the CPU allocator's
    "can't allocate memory" (a process limit reached)."""
    return isinstance(error, torch.OutOfMemoryError) or (
        isinstance(error, RuntimeError)
        and any(s in str(error) for s in ("out of memory", "can't allocate memory")))


def append_rows(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def read_rows(path: Path) -> list[dict]:
    """The rows of the JSONL file ``path`` (none if it does not exist)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def finish(path: Path, rows: list[dict], *, smoke: bool = False) -> int:
    """Append ``rows`` to ``path`` (not in a smoke run) and return the exit status."""
    if not smoke:
        append_rows(path, rows)
        print(f"{len(rows)} rows -> {path}")
    return 0


def kernel_seconds(fn: Callable[[], object], device: torch.device, *, repeats: int,
                   warmup: int = 3) -> float:
    """Seconds per call of the GPU work that ``fn()`` queues, without the host's share.

    :func:`median_time` times one call between two events: on an idle GPU that includes the
    Python and launch overhead before the kernel starts. Here ``repeats`` calls are queued
    behind a kernel that holds the stream (``torch.cuda._sleep``), so that they run back to
    back, and the events around them time the device alone. If the hold ended before the
    last call was queued (the queue could have run dry), it is doubled and the run repeated.
    """
    if device.type != "cuda":
        raise ValueError(f"kernel_seconds times CUDA work, got device {device}")
    for _ in range(warmup):
        fn()
    cycles = 20_000_000  # about 10 ms at 2 GHz
    for _ in range(8):
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(cycles)
        start.record()
        for _ in range(repeats):
            fn()
        end.record()
        ran_dry = start.query()  # the GPU reached start before every call was queued
        end.synchronize()
        if not ran_dry:
            return start.elapsed_time(end) / 1e3 / repeats
        cycles *= 2
    raise RuntimeError("kernel_seconds: queuing the calls outlasted every hold tried")


def median_time(fn: Callable[[], object], device: torch.device, *, repeats: int,
                warmup: int = 3) -> float:
    """Median seconds of ``fn()`` over ``repeats`` runs after ``warmup``; CUDA events on a GPU."""
    for _ in range(warmup):
        fn()
    times = []
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
    else:
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)
