"""What compressing one tensor costs, by its size: the measurement behind
``gnnact.config.MIN_BYTES``, the floor under which a tensor is kept as it is.

A linear map ``[n / 64, 64] @ [64, 64]``, forward and backward, runs as PyTorch's op (its
input kept as is) and as gnnact's (``Config(bits=b, min_bytes=0)``: its input quantized,
restored in backward), the two taking turns. The difference is what the compression adds:
quantizing, packing, restoring and the op layer's bookkeeping. Fitted as
:math:`c_0 + \\kappa n` (least relative squares over the sizes), its fixed part
:math:`c_0` outweighs its per-value part below :math:`n^* = c_0 / \\kappa` values: there a
tensor costs more time for being a tensor than for its values, and its bytes are few.

One row per size and width (``native_us``, ``compressed_us``, ``overhead_us``) and one
``fit`` row per width (``fixed_us``, ``ns_per_value``, ``break_even_values``,
``break_even_bytes`` beside the shipped ``min_bytes``).

Usage::

    python benchmarks/bench_floor.py [--device cpu] [--bits 2 4] [--threads 1] [--smoke]

Rows are appended to ``benchmarks/results/floor.jsonl`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RESULTS, environment, finish

import gnnact
import gnnact.config
from gnnact import ops

WIDTH = 64  # features of the linear map's input and output


def _step(x0: torch.Tensor, weight: torch.Tensor, config: gnnact.Config | None) -> float:
    """Seconds of one forward and backward of the linear map (``None``: PyTorch's)."""
    x = x0.clone().requires_grad_()
    if x.is_cuda:
        torch.cuda.synchronize(x.device)
    t0 = time.perf_counter()
    y = F.linear(x, weight) if config is None else ops.linear(x, weight, None, config)
    y.sum().backward()
    if x.is_cuda:
        torch.cuda.synchronize(x.device)
    return time.perf_counter() - t0


def measure(numel: int, bits: list[int], device: torch.device, repeats: int) -> dict[str, float]:
    """Median microseconds of the native step and of the compressed one at each width, the
    variants taking turns."""
    g = torch.Generator().manual_seed(numel)
    x0 = torch.randn(numel // WIDTH, WIDTH, generator=g).to(device)
    weight = torch.randn(WIDTH, WIDTH, generator=g).to(device).requires_grad_()
    variants = {"native": None, **{f"b{b}": gnnact.Config(bits=b, self_check=False, min_bytes=0)
                                   for b in bits}}
    times: dict[str, list[float]] = {k: [] for k in variants}
    for r in range(repeats + 2):
        for k, config in variants.items():
            t = _step(x0, weight, config)
            if r >= 2:  # (two warm-up turns)
                times[k].append(t)
    return {k: statistics.median(v) * 1e6 for k, v in times.items()}


def fit(sizes: list[int], overheads: list[float]) -> tuple[float, float]:
    """``(c0, kappa)`` of ``overhead = c0 + kappa * n`` by least *relative* squares (weights
    ``1 / overhead^2``): the sizes span three orders of magnitude, and plain least squares
    would fit the largest and leave the fixed part to their noise."""
    w = [1 / o**2 for o in overheads]
    s = sum(w)
    sn = sum(wi * n for wi, n in zip(w, sizes, strict=True))
    snn = sum(wi * n * n for wi, n in zip(w, sizes, strict=True))
    so = sum(wi * o for wi, o in zip(w, overheads, strict=True))
    sno = sum(wi * n * o for wi, n, o in zip(w, sizes, overheads, strict=True))
    kappa = (s * sno - sn * so) / (s * snn - sn * sn)
    return (so - kappa * sn) / s, kappa


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--sizes", type=int, nargs="+",
                        default=[4096, 16384, 65536, 262144, 1 << 20])
    parser.add_argument("--bits", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--smoke", action="store_true", help="two sizes, no result file")
    parser.add_argument("--out", type=Path, default=RESULTS / "floor.jsonl")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    sizes = [4096, 16384] if args.smoke else args.sizes
    env = environment(device)
    rows, overheads = [], {b: [] for b in args.bits}
    for numel in sizes:
        repeats = 3 if args.smoke else max(10, min(300, (4 << 20) // numel))
        med = measure(numel, args.bits, device, repeats)
        for b in args.bits:
            overhead = med[f"b{b}"] - med["native"]
            overheads[b].append(overhead)
            rows.append({"bench": "floor", **env, "threads": args.threads, "numel": numel,
                         "bits": b, "repeats": repeats, "native_us": round(med["native"], 1),
                         "compressed_us": round(med[f"b{b}"], 1),
                         "overhead_us": round(overhead, 1)})
            print(f"{numel:9d} values {b}b: native {med['native']:9.1f} us, compressed "
                  f"{med[f'b{b}']:9.1f} us, overhead {overhead:9.1f} us", flush=True)
    for b in args.bits:
        c0, kappa = fit(sizes, overheads[b])
        values = round(c0 / kappa) if kappa > 0 else None  # (None: no per-value cost seen)
        rows.append({"bench": "floor", **env, "threads": args.threads, "bits": b, "fit": True,
                     "fixed_us": round(c0, 1), "ns_per_value": round(kappa * 1e3, 3),
                     "break_even_values": values,
                     "break_even_bytes": None if values is None else 4 * values,
                     "min_bytes": gnnact.config.MIN_BYTES})
        print(f"{b}b: fixed {c0:.0f} us + {kappa * 1e3:.2f} ns a value: the fixed part is the "
              f"larger below {values} values (MIN_BYTES {gnnact.config.MIN_BYTES >> 10} KiB)")
    return finish(args.out, rows, smoke=args.smoke)


if __name__ == "__main__":
    sys.exit(main())
