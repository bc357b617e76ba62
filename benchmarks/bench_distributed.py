"""Full-batch training partitioned over k ranks (gloo on one machine, or NCCL with a GPU per
rank): exchanged bytes, saved context and step time by world size and halo-exchange width.

On a synthetic graph with ogbn-arxiv's shape (``synthetic_graph``: average degree 13.77, 128
features, 40 classes), scaled down to ``--nodes`` (default 20,000, so that the whole sweep runs
in a few minutes on a 2-core machine; ``--full`` for arxiv's 169,343 nodes), a GCN (or
``--model sage``, ``gat``, ``gcnii`` or ``gin``) of ``--layers`` x ``--hidden``, converted
with ``gnnact.Config(bits=--context-bits)``, is trained for a few steps with
:class:`gnnact.distributed.DistributedGNN` on k = ``--world-sizes`` processes (one torch
thread each), for each exchange width ``--bits`` (32: exact, 8 and 2: stochastic rounding,
features and gradients alike).

One row per (k, bits), with per-rank lists and their totals/maxima:

* ``exchanged_bytes``: halo payload bytes each rank sent in one step (forward features plus
  backward gradients, all layers); ``exchanged_bytes_total`` over the ranks;
* ``saved_bytes``: each rank's saved context after forward (``gnnact.memory.saved_bytes``,
  the shard's input features excluded);
* ``step_peak_bytes``: each rank's step peak, from one extra (untimed) step under
  :class:`gnnact.peak.PeakMeter`: the most tensor memory allocated at once during forward,
  exchange, backward, gradient all-reduce and Adam's update, above what the rank held before
  (its shard and the model), plus ``graph_cache_bytes``, gnnact's graph cache on that rank
  (built by the first step, alive through the metered one, so outside what the meter sees);
  ``peak_over_share``: each rank's step peak over its share of
  the single process's, :math:`P_1 (1/k + H_r/N)` with :math:`H_r` its halo nodes (the
  issue's target is ≤ 1.3; :obj:`None` without a k = 1 row of that width in the run);
* ``peak_rss_bytes``: each rank's peak resident memory during this width's steps (the peak is
  reset before them, after sharding: the whole graph each rank loads to shard it is not
  counted, the libraries' ~330 MiB are);
* ``step_seconds``: median wall time of a step per rank (barrier before each step; the slowest
  rank's is ``step_seconds_max``); with k processes on fewer cores than k they share the
  cores, so these times measure overhead, not scaling;
* ``loss_first``: the global training loss of the first step (same initial weights: the
  32-bit rows of every k agree to float round-off; 8 and 2 bits move it by the rounding of
  the exchanged features), ``loss_last`` of the last one (the 2-bit context's stochastic
  rounding makes each run's trajectory its own).

``--accuracy`` trains instead, on a real dataset (``--graph``, default Amazon-Computers from
``--root``), EXACT's setting: GCN 3 x 256 with BatchNorm (momentum 0.5, dropout 0.5), a 2-bit
saved context (``--context-bits``), ``--epochs`` (50) full-batch epochs of Adam at lr 0.01, the
test accuracy at the best validation epoch; the graph as ``edge_index`` in every run (the
partitioned model takes no sparse ``adj_t``). k = 1 is the single-process
:func:`gnnact.training.train_full_batch`; each k > 1 of ``--world-sizes`` runs
:func:`gnnact.distributed.train_partitioned` over ``--method`` parts at each exchange width of
``--bits``; once per ``--seeds`` (the split's, the weights' and dropout's seed). One row per
(k, bits, seed): ``world_size``, ``exchange_bits`` (:obj:`None` for k = 1), ``seed``,
``test_acc``, ``best_val_acc``, ``epoch_ms`` (slowest rank), ``exchanged_bytes_total``.

Usage::

    python benchmarks/bench_distributed.py [--nodes 20000 | --full] [--world-sizes 1 2 4]
        [--bits 32 8 2] [--model gcn] [--steps 5] [--method random] [--smoke]
        [--device cuda]  # NCCL, one GPU per rank (k up to the GPU count)
    python benchmarks/bench_distributed.py --accuracy [--graph computers] [--world-sizes 1 2]
        [--bits 2] [--seeds 0 1 2] [--epochs 50] [--method metis]
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RESULTS, data_root, environment, finish

import gnnact
from gnnact.data import SHAPES, load_dataset, synthetic_graph
from gnnact.distributed import DistributedGNN, run_local, shard_graph, train_partitioned
from gnnact.memory import breakdown
from gnnact.models import build
from gnnact.peak import PeakMeter
from gnnact.training import metric_of, train_full_batch

MODELS = ("gcn", "sage", "gat", "gcnii", "gin")


def _proc_status(field: str) -> int:
    """A ``/proc/self/status`` memory field (``VmRSS``, ``VmHWM``) in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def _reset_peak_rss() -> None:
    # Hand the freed heap (the whole graph, just sharded) back first, or glibc keeps it
    # resident; then writing 5 to clear_refs resets VmHWM to the current RSS (Linux >= 4.0).
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    Path("/proc/self/clear_refs").write_text("5")


def _make_model(args: argparse.Namespace, features: int, classes: int) -> torch.nn.Module:
    """PyG's own model classes (GCNII: gnnact's, PyG has none), converted. GIN has no twin:
    the generic pipeline keeps its context, and it runs on (source, target) pairs."""
    from torch_geometric.nn.models import GAT, GCN, GIN, GraphSAGE

    torch.manual_seed(0)
    if args.model == "gcnii":
        model = build("gcnii", features, classes, hidden=args.hidden, layers=args.layers)
    else:
        cls = {"gcn": GCN, "sage": GraphSAGE, "gat": GAT, "gin": GIN}[args.model]
        model = cls(features, args.hidden, args.layers, classes)
    return gnnact.convert(model, gnnact.Config(bits=args.context_bits))


def _rank(rank: int, world_size: int, args: argparse.Namespace) -> list[dict]:
    """Every width on this rank: what one row needs from it."""
    num_nodes, degree, features, classes = args.shape
    cuda = args.device == "cuda"  # NCCL: this rank's GPU is its current device
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    data = synthetic_graph(num_nodes, degree, features, classes, seed=0)
    shard = shard_graph(data, method=args.method).to(device)
    del data
    gc.collect()
    out = []
    for bits in args.bits:
        _reset_peak_rss()
        model = DistributedGNN(_make_model(args, features, classes).to(device), shard,
                               exchange_bits=bits)
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        mask = shard.train_mask
        count = model.global_count(mask)
        times, saved, sent, losses = [], None, None, []
        meter = PeakMeter(device)
        # The timed steps, then one more under the meter (it counts per op: not timed).
        for step in range(args.warmup + args.steps + 1):
            metered = step == args.warmup + args.steps
            dist.barrier()
            t0 = time.perf_counter()
            model.exchange.reset_stats()
            opt.zero_grad(set_to_none=True)
            with meter if metered else contextlib.nullcontext():
                out_rows = model(shard.x, shard.edge_index)
                loss = F.cross_entropy(out_rows[mask], shard.y[mask], reduction="sum") / count
                if step == 0:  # the graph walk is not part of a timed step
                    saved = breakdown(loss, exclude=[shard.x])
                loss.backward()
                model.all_reduce_gradients()
                opt.step()
            if metered:
                break
            if cuda:
                torch.cuda.synchronize(device)
            if step >= args.warmup:
                times.append(time.perf_counter() - t0)
            sent = model.exchange.stats
            losses.append(loss.detach().clone())
        out.append({"bits": bits, "seconds": statistics.median(times),
                    "sent": sent, "saved": saved.total, "peak_rss": _proc_status("VmHWM"),
                    "graph_cache": saved.graph_cache,
                    "step_peak": meter.peak_bytes + saved.graph_cache,
                    "loss_first": float(model.all_reduce(losses[0])),
                    "loss_last": float(model.all_reduce(losses[-1])),
                    "owned": shard.num_owned, "halo": shard.num_halo,
                    "edges": shard.edge_index.size(1)})
        model.remove()
    return out


def _accuracy_model(args: argparse.Namespace, data, seed: int) -> torch.nn.Module:
    """EXACT's GCN for the accuracy runs: 3 x 256, BatchNorm momentum 0.5, converted."""
    torch.manual_seed(seed)
    classes = int(data.y.max()) + 1
    model = build("gcn", data.num_features, classes, hidden=256, layers=3)
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm1d):
            module.momentum = 0.5
    return gnnact.convert(model, gnnact.Config(bits=args.context_bits))


def _accuracy_rank(rank: int, world_size: int, args: argparse.Namespace, data,
                   seed: int) -> list:
    """This rank's result of every exchange width, for one seed."""
    metric = metric_of(data)
    shard = shard_graph(data, method=args.method, seed=seed)
    out = []
    for bits in args.bits:
        model = _accuracy_model(args, data, seed)
        if rank:  # rank 0 goes on with the single-process stream; the others draw their own
            torch.manual_seed(seed + 1_000_003 * rank)
        dmodel = DistributedGNN(model, shard, exchange_bits=bits)
        out.append(train_partitioned(dmodel, epochs=args.epochs, lr=0.01, metric=metric))
        dmodel.remove()
    return out


def accuracy(args: argparse.Namespace, env: dict) -> list[dict]:
    """Single process against k ranks, per seed: the rows of ``--accuracy``."""
    rows = []
    torch.set_num_threads(1)  # as each rank: the same cores per process
    for seed in args.seeds:
        with tempfile.TemporaryDirectory(prefix="bench-dist-") as workdir:
            data = load_dataset(args.graph, args.root, seed=seed, download=False,
                                workdir=workdir)
        common = {"bench": "distributed_accuracy", **env, "graph": args.graph,
                  "num_nodes": data.num_nodes, "num_edges": data.num_edges, "model": "gcn",
                  "layers": 3, "hidden": 256, "bn_momentum": 0.5, "dropout": 0.5,
                  "context_bits": args.context_bits, "adj": "edge_index",
                  "epochs": args.epochs, "lr": 0.01, "threads_per_rank": 1, "seed": seed}
        for k in args.world_sizes:
            if k == 1:
                r = train_full_batch(_accuracy_model(args, data, seed), data,
                                     epochs=args.epochs, lr=0.01, measure_saved=False)
                results = [(None, r, r.epoch_ms, None)]
            else:
                # Forked: the ranks share the parent's imports and the loaded graph.
                ranks = run_local(_accuracy_rank, k, args, data, seed, start_method="fork")
                results = []
                for i, bits in enumerate(args.bits):
                    per = [r[i] for r in ranks]
                    # The whole graph's metrics, the same on every rank.
                    assert len({(p.test_acc, p.best_val_acc) for p in per}) == 1
                    results.append((bits, per[0], max(p.epoch_ms for p in per),
                                    sum(p.exchanged_bytes for p in per)))
            for bits, r, epoch_ms, sent in results:
                row = {**common, "world_size": k,
                       "method": None if k == 1 else args.method, "exchange_bits": bits,
                       "test_acc": r.test_acc, "best_val_acc": r.best_val_acc,
                       "epoch_ms": round(epoch_ms, 1), "exchanged_bytes_total": sent}
                rows.append(row)
                print(f"seed {seed} k={k} exchange bits {bits}: test acc "
                      f"{100 * r.test_acc:.2f} (best val {100 * r.best_val_acc:.2f}), "
                      f"epoch {epoch_ms:.0f} ms", flush=True)
    for k in args.world_sizes if 1 in args.world_sizes else []:
        for bits in args.bits if k > 1 else []:
            diffs = [b["test_acc"] - a["test_acc"] for a in rows if a["world_size"] == 1
                     for b in rows if (b["world_size"], b["exchange_bits"], b["seed"])
                     == (k, bits, a["seed"])]
            print(f"k={k} exchange bits {bits} minus single process: "
                  f"{100 * statistics.mean(diffs):+.2f} points (mean of {len(diffs)} seeds)")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cpu: gloo processes; cuda: NCCL, one GPU per rank")
    parser.add_argument("--nodes", type=int, default=20_000)
    parser.add_argument("--full", action="store_true", help="ogbn-arxiv's 169,343 nodes")
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--bits", type=int, nargs="+", default=[32, 8, 2])
    parser.add_argument("--model", choices=MODELS, default="gcn")
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--context-bits", type=int, default=2)
    parser.add_argument("--method", choices=("metis", "contiguous", "random"), default="random")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--smoke", action="store_true", help="a 1,000-node graph, no results")
    parser.add_argument("--out", type=Path, default=RESULTS / "distributed.jsonl")
    accuracy_mode = parser.add_argument_group("--accuracy: training on a real dataset")
    accuracy_mode.add_argument("--accuracy", action="store_true",
                               help="single process against k ranks: test accuracy")
    accuracy_mode.add_argument("--graph", default="computers",
                               help="a name known to gnnact.data.load_dataset")
    accuracy_mode.add_argument("--root", type=Path, default=data_root(),
                               help="datasets root, read-only: a copy is loaded (default: "
                                    "$GNNACT_DATA or ../shared/datasets)")
    accuracy_mode.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    accuracy_mode.add_argument("--epochs", type=int, default=50)
    args = parser.parse_args(argv)
    for name in ("world_sizes", "seeds"):
        if len(set(getattr(args, name))) != len(getattr(args, name)):
            parser.error(f"--{name.replace('_', '-')} has repeats: {getattr(args, name)}")
    if args.epochs < 1:
        parser.error(f"--epochs must be positive, got {args.epochs}")
    _, degree, features, classes = SHAPES["arxiv"]
    nodes = SHAPES["arxiv"][0] if args.full else 1_000 if args.smoke else args.nodes
    args.shape = (nodes, degree, features, classes)

    cuda = args.device == "cuda"
    if cuda and args.accuracy:
        parser.error("--accuracy runs on the CPU (gloo); leave --device out")
    if cuda and not torch.cuda.is_available():
        parser.error("--device cuda: torch.cuda.is_available() is False")
    if cuda and max(args.world_sizes) > torch.cuda.device_count():
        parser.error(f"--device cuda takes one GPU per rank (NCCL): --world-sizes "
                     f"{max(args.world_sizes)} > {torch.cuda.device_count()} GPUs")
    env = environment("cuda" if cuda else "cpu")
    env["device_name"] = env["device_name"].rsplit(" (", 1)[0]  # threads: per rank, below
    if args.accuracy:
        return finish(args.out, accuracy(args, env), smoke=args.smoke)
    rows = []
    single: dict[int, int] = {}  # exchange bits -> the k = 1 step peak
    for k in args.world_sizes:
        # Forked on the CPU: the ranks share the parent's imports instead of repeating them
        # (CUDA does not survive a fork: spawned there).
        ranks = run_local(_rank, k, args, threads=1, start_method="spawn" if cuda else "fork",
                          backend="nccl" if cuda else "gloo")
        for i, bits in enumerate(args.bits):
            per = [r[i] for r in ranks]
            sent = [p["sent"] for p in per]
            peaks = [p["step_peak"] for p in per]
            if k == 1:
                single[bits] = peaks[0]
            # The target's bound per rank: the single-process peak split k ways, plus the
            # halo's share at the same bytes per node.
            bounds = ([single[bits] * (1 / k + p["halo"] / nodes) for p in per]
                      if bits in single else None)
            row = {
                "bench": "distributed", **env, "graph": "arxiv-synthetic", "num_nodes": nodes,
                "num_edges": sum(p["edges"] for p in per), "features": features,
                "classes": classes, "model": args.model, "layers": args.layers,
                "hidden": args.hidden, "context_bits": args.context_bits,
                "method": args.method, "threads_per_rank": 1,
                "backend": "nccl" if cuda else "gloo", "world_size": k,
                "exchange_bits": bits, "halo_nodes": [p["halo"] for p in per],
                "exchanged_bytes": [s.total_bytes for s in sent],
                "exchanged_bytes_total": sum(s.total_bytes for s in sent),
                "forward_bytes_total": sum(s.forward_bytes for s in sent),
                "backward_bytes_total": sum(s.backward_bytes for s in sent),
                "messages_per_rank": [s.forward_messages + s.backward_messages for s in sent],
                "saved_bytes": [p["saved"] for p in per],
                "saved_bytes_max": max(p["saved"] for p in per),
                "graph_cache_bytes": [p["graph_cache"] for p in per],
                "step_peak_bytes": peaks, "step_peak_bytes_max": max(peaks),
                "peak_over_share": (None if bounds is None else [
                    round(pk / b, 3) for pk, b in zip(peaks, bounds, strict=True)]),
                "peak_rss_bytes": [p["peak_rss"] for p in per],
                "step_seconds": [round(p["seconds"], 4) for p in per],
                "step_seconds_max": round(max(p["seconds"] for p in per), 4),
                "steps": args.steps, "warmup": args.warmup,
                "loss_first": round(per[0]["loss_first"], 6),
                "loss_last": round(per[0]["loss_last"], 6)}
            rows.append(row)
            print(f"k={k} bits={bits:2d}  halo {sum(row['halo_nodes']):7d}  exchanged "
                  f"{row['exchanged_bytes_total'] / 2**20:8.2f} MiB/step  saved/rank "
                  f"{row['saved_bytes_max'] / 2**20:7.2f} MiB  step peak/rank "
                  f"{row['step_peak_bytes_max'] / 2**20:7.1f} MiB (/share "
                  f"{max(row['peak_over_share'] or [float('nan')]):.2f})  step "
                  f"{row['step_seconds_max']:.3f} s  loss {row['loss_first']:.5f}", flush=True)
    return finish(args.out, rows, smoke=args.smoke)


if __name__ == "__main__":
    sys.exit(main())
