"""Quantize / dequantize throughput per bit width, against a plain copy of the same bytes and
against the torch reference.

Throughput counts the bytes each operation must move: quantize reads the input
(:math:`n \\cdot` itemsize) and writes the packed tensor (``nbytes``); dequantize does the reverse;
a copy of the input reads and writes :math:`n \\cdot` itemsize each. ``frac_of_copy`` is the op's
GB/s over the copy's GB/s measured in the same run (DESIGN.md target on a GPU: >= 0.70).
Backends: ``cupy`` (CUDA kernels) and ``cpu`` (the compiled CPU kernels, where a compiler
builds them; target >= 0.10 of a copy) against ``torch`` (the reference) on the same tensor.

On a GPU each operation is timed two ways: ``time_ms`` is one call as a user makes it
(Python, allocation and launch included: on an idle GPU the events also catch the host's
time before the kernel starts); ``kernel_ms`` is the GPU's work alone, calls queued back to
back (``_common.kernel_seconds``), with the copy timed the same way for
``kernel_frac_of_copy``: the kernels' own fraction of the copy's bandwidth.

The mask ops (rows ``bench: mask_throughput``) are ReLU's forward (``sign_mask``: reads
:math:`X`, writes the output and the packed :math:`[X > 0]`) and applying a packed mask
(``apply_packed_mask``: dropout's forward and every mask op's backward: reads :math:`X` and
the mask, writes the output): the CUDA or CPU kernels (one pass) against the torch path (by
blocks). On the CPU, ``dropout_draw``: dropout's keep mask, PyTorch's ``bernoulli_`` against the
compiled kernel that draws the same numbers straight into bits.

Usage::

    python benchmarks/bench_quantize.py [--device cpu|cuda|all] [--numel N] [--smoke]

Rows are appended to ``benchmarks/results/quantize.jsonl`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RESULTS, environment, finish, kernel_seconds, median_time

import gnnact
from gnnact.kernels import cpu as cpu_kernels
from gnnact.kernels import cupy_available
from gnnact.quant import DEFAULT_GROUP_SIZE


def _ops(x: torch.Tensor, bits: int, group_size: int, backend: str):
    """``(quantize, dequantize of its result, packed bytes)`` for ``backend``."""
    p = gnnact.quantize(x, bits, group_size, backend=backend)
    return (lambda: gnnact.quantize(x, bits, group_size, backend=backend),
            lambda: gnnact.dequantize(p, backend=backend), p.nbytes)


def bench_device(device: torch.device, numel: int, bits_list: list[int], dtype: torch.dtype,
                 group_size: int, repeats: int) -> list[dict]:
    env = environment(device)
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(numel, device=device, generator=gen).to(dtype)
    in_bytes = x.numel() * x.element_size()
    dst = torch.empty_like(x)
    copy_s = median_time(lambda: dst.copy_(x), device, repeats=repeats)
    copy_gbps = 2 * in_bytes / copy_s / 1e9
    copy_kernel_gbps = None
    if device.type == "cuda":
        copy_kernel_gbps = 2 * in_bytes / kernel_seconds(lambda: dst.copy_(x), device,
                                                         repeats=repeats) / 1e9
    backends = ["torch"]
    if device.type == "cuda" and cupy_available():
        backends.insert(0, "cupy")
    if device.type == "cpu" and cpu_kernels.available():
        backends.insert(0, "cpu")
    rows = []
    for bits in bits_list:
        for backend in backends:
            quantize, dequantize, packed_bytes = _ops(x, bits, group_size, backend)
            moved = in_bytes + packed_bytes
            for op, fn in (("quantize", quantize), ("dequantize", dequantize)):
                row = {"bench": "quantize_throughput", **env, "op": op, "backend": backend,
                       "bits": bits, "numel": numel, "dtype": str(dtype).replace("torch.", ""),
                       "group_size": group_size, "packed_bytes": packed_bytes,
                       **_timings(fn, device, moved, copy_gbps, copy_kernel_gbps, repeats,
                                  kernel=backend == "cupy")}
                rows.append(row)
                print(f"{env['device_name'][:40]:40s} {op:10s} {backend:5s} {bits}b "
                      + _shown(row))
    return rows + mask_rows(x, env, copy_gbps, copy_kernel_gbps, backends, repeats)


def _timings(fn, device: torch.device, moved: int, copy_gbps: float,
             copy_kernel_gbps: float | None, repeats: int, kernel: bool) -> dict:
    """A row's times: one call (``time_ms``) and, for a kernel, the GPU's work alone
    (``kernel_ms``), each as GB/s moved and as a fraction of the copy's GB/s timed alike."""
    seconds = median_time(fn, device, repeats=repeats)
    gbps = moved / seconds / 1e9
    row = {"time_ms": round(seconds * 1e3, 4), "gbps": round(gbps, 3),
           "copy_gbps": round(copy_gbps, 3), "frac_of_copy": round(gbps / copy_gbps, 4)}
    if kernel and copy_kernel_gbps is not None:
        k_seconds = kernel_seconds(fn, device, repeats=repeats)
        k_gbps = moved / k_seconds / 1e9
        row.update(kernel_ms=round(k_seconds * 1e3, 4), kernel_gbps=round(k_gbps, 3),
                   copy_kernel_gbps=round(copy_kernel_gbps, 3),
                   kernel_frac_of_copy=round(k_gbps / copy_kernel_gbps, 4))
    return row


def _shown(row: dict) -> str:
    text = (f"{row['time_ms']:9.3f} ms {row['gbps']:8.2f} GB/s  copy {row['copy_gbps']:8.2f} "
            f"GB/s -> {row['frac_of_copy']:6.1%}")
    if "kernel_ms" in row:
        text += (f" | kernel {row['kernel_ms']:7.3f} ms {row['kernel_gbps']:8.2f} GB/s -> "
                 f"{row['kernel_frac_of_copy']:6.1%}")
    return text


def mask_rows(x: torch.Tensor, env: dict, copy_gbps: float, copy_kernel_gbps: float | None,
              backends: list[str], repeats: int) -> list[dict]:
    """Throughput of ``sign_mask`` and ``apply_packed_mask`` per backend and mode (``mul``:
    ReLU's forward and dropout; ``zero``: ReLU's backward; ``select``: LeakyReLU's)
    (``cupy``: the CUDA kernels; ``cpu``: the compiled CPU kernels; ``torch``:
    :mod:`gnnact.quant.reference`)."""
    from gnnact.quant import reference

    # mode -> its name in the rows and the scale s it is timed with
    modes = {reference.MASK_MUL: ("mul", 1.0), reference.MASK_ZERO: ("zero", 1.0),
             reference.MASK_SELECT: ("select", 0.01)}
    impls = {"torch": reference}
    if "cupy" in backends:
        from gnnact.kernels import quantize as kernels

        impls = {"cupy": kernels, **impls}
    if "cpu" in backends:
        impls = {"cpu": cpu_kernels, **impls}
    flat, out = x.view(-1), torch.empty_like(x).view(-1)
    data = reference.sign_mask(flat, out, reference.MASK_MUL, 1.0)
    moved = 2 * flat.numel() * flat.element_size() + data.numel()
    rows = []
    for backend, impl in impls.items():
        for mode, (name, s) in modes.items():
            for op, fn in (("sign_mask", lambda impl=impl, mode=mode, s=s: impl.sign_mask(
                               flat, out, mode, s)),
                           ("apply_packed_mask", lambda impl=impl, mode=mode, s=s:
                               impl.apply_packed_mask(flat, data, out, mode, s))):
                row = {"bench": "mask_throughput", **env, "op": op, "backend": backend,
                       "mode": name, "numel": flat.numel(),
                       "dtype": str(x.dtype).replace("torch.", ""),
                       **_timings(fn, x.device, moved, copy_gbps, copy_kernel_gbps, repeats,
                                  kernel=backend == "cupy")}
                rows.append(row)
                print(f"{env['device_name'][:40]:40s} {op:17s} {name:6s} {backend:5s} "
                      + _shown(row))
    if x.device.type == "cpu":
        rows += _draw_rows(flat, env, copy_gbps, backends, repeats)
    return rows


def _draw_rows(flat: torch.Tensor, env: dict, copy_gbps: float, backends: list[str],
               repeats: int) -> list[dict]:
    """Dropout's keep mask on the CPU (``dropout_draw``, p = 0.5): PyTorch's ``bernoulli_``
    (``torch``: what ``F.dropout`` draws) against the compiled kernel's same draws straight
    into bits (``cpu``: :func:`gnnact.ops.draws.keep_bits`). Moved: the float mask
    ``F.dropout`` writes, 4 bytes a value, for both (a rate of values, in the bytes' unit)."""
    from gnnact.ops import draws

    mask = torch.empty(flat.numel())
    impls = {"torch": lambda: mask.bernoulli_(0.5)}
    if "cpu" in backends and draws.cpu_draws_agree():
        impls = {"cpu": lambda: draws.keep_bits(flat, 0.5), **impls}
    rows = []
    for backend, fn in impls.items():
        row = {"bench": "mask_throughput", **env, "op": "dropout_draw", "backend": backend,
               "numel": flat.numel(), "dtype": str(flat.dtype).replace("torch.", ""),
               **_timings(fn, flat.device, 4 * flat.numel(), copy_gbps, None, repeats,
                          kernel=False)}
        rows.append(row)
        print(f"{env['device_name'][:40]:40s} {'dropout_draw':17s} {backend:5s} " + _shown(row))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "cuda", "all"], default="all")
    parser.add_argument("--numel", type=int, default=None,
                        help="elements (default 2^26 on a GPU, 2^22 on the CPU)")
    parser.add_argument("--bits", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], default="float32")
    parser.add_argument("--group-size", type=int, default=DEFAULT_GROUP_SIZE)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, no result file")
    parser.add_argument("--out", type=Path, default=RESULTS / "quantize.jsonl")
    args = parser.parse_args(argv)

    devices = []
    if args.device in ("cpu", "all"):
        devices.append(torch.device("cpu"))
    if args.device in ("cuda", "all"):
        if torch.cuda.is_available():
            devices.append(torch.device("cuda"))
        elif args.device == "cuda":
            parser.error("--device cuda: no CUDA device available")
    rows = []
    for device in devices:
        numel = args.numel or (1 << 26 if device.type == "cuda" else 1 << 22)
        repeats = args.repeats or (20 if device.type == "cuda" else 7)
        if args.smoke:
            numel, repeats = 1 << 14, 2
        rows += bench_device(device, numel, args.bits, getattr(torch, args.dtype),
                             args.group_size, repeats)
    return finish(args.out, rows, smoke=args.smoke)


if __name__ == "__main__":
    raise SystemExit(main())
