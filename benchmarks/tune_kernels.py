"""Builds of ``cuda/quantize.cu`` with other compile-time settings, timed side by side: which
one to make the default.

Each variant is a set of ``NAME=VALUE`` defines (``CACHED``: octets a lane keeps in registers;
``MIN_BLOCKS``: blocks per SM the register budget is cut for; ``LANES``: lanes that share a
group, a warp taking ``32 / LANES`` groups at once (``QUANTIZE_LANES``, ``QUANTIZE_CACHED``,
``QUANTIZE_MIN_BLOCKS`` and their ``DEQUANTIZE_`` twins: one op's shape;
``QUANTIZE_HALF_MIN_BLOCKS``: float16 and bfloat16's); ``WORD_STORES`` and
``HALF_WORD_STORES``: the widths whose whole groups store words gathered across lanes;
``WAVES``: the grid capped at that many waves of resident blocks, each warp taking groups in
turn). The variants that lost their timings (``ALU_CONVERSIONS``, ``FLOOR_ROUNDING``,
``MUL_SHIFTS``, ``NOISE_FIRST``, ``PREFETCH``, ``WIDE_CODE_LOADS``, ``CHUNK_STORES=0``,
``SHARED_CODES=0``, last in 6570339; ``CODES_FIRST``, last in bd304d0) are no longer in
``cuda/quantize.cu``; git history keeps them, and their rows stay in ``tune_kernels.jsonl``.
Every build must give the default build's codes, scales, zeros and restored values bit for bit
(``agrees``); a row, one for each op the build changes (:data:`ONE_OP`), gives the kernel's own
time (calls queued back to back, :func:`_common.kernel_seconds`) and its share of a copy's
bandwidth timed the same way, as ``bench_quantize.py`` counts bytes.

Usage::

    python benchmarks/tune_kernels.py [--variants CACHED=1,MIN_BLOCKS=6 LANES=16 ...]
        [--bits 1 2 3 4 5 6 7 8] [--dtypes float32 bfloat16] [--numel N]

Rows are appended to ``benchmarks/results/tune_kernels.jsonl`` (or ``--out``) width by width,
so a run cut short keeps what it measured. Needs a CUDA device and CuPy.
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RESULTS, append_rows, environment, kernel_seconds

from gnnact.quant import DEFAULT_GROUP_SIZE

#: The builds timed by default beside the default one. On an H200 (tune_kernels.jsonl, 7116a3f)
#: the quantizer's LANES=16, CACHED=4, MIN_BLOCKS=3 (fastest at every width but 7 bits) and the
#: dequantizer's CHUNK_STORES=1 with SHARED_CODES=1 (at every width) became the defaults;
#: NOISE_FIRST, PREFETCH, CODES_FIRST and WAVES=1 lost at nearly every width (ALU_CONVERSIONS,
#: WIDE_CODE_LOADS, CACHED=1 and CACHED=4 alone in earlier runs), FLOOR_ROUNDING by 3-7
#: points; at 0d248a9 a warp of 4 groups (LANES=8, CACHED=8) and shifts by multiplies
#: (MUL_SHIFTS=1) lost too. At 8254d6c (bfloat16): 4 blocks an SM for float16 and bfloat16
#: (64 registers) 5-8 points faster than 3 at every width, the next group's loads in flight
#: (PREFETCH) 22-36 slower; words gathered across lanes faster at 7 bits (75.6 % against
#: 37.2 %), slower at 3, 5 and 6 (3.5-5.6 points), so bfloat16 takes them at 7 bits alone
#: (HALF_WORD_STORES=128) and float32 at 3, 5, 6 and 7 (WORD_STORES=232); 5 blocks for
#: float16 and bfloat16 spill. Here the other choices: float32 without word stores and
#: bfloat16 with them at every width. The settings that lost were removed from the source
#: since (git history keeps them), CODES_FIRST too (2 points faster for bfloat16 at 4 bits,
#: slower at every other width and for float32: one dequantizer path for every case).
VARIANTS = ("WORD_STORES=0,HALF_WORD_STORES=232",)


#: Settings that change one kernel only: a variant made of them is timed on that op alone
#: (the other op's kernel is the default build's); so do those named QUANTIZE_... and
#: DEQUANTIZE_... (one op's shape). LANES, CACHED, MIN_BLOCKS and WAVES change both.
ONE_OP = {"WORD_STORES": "quantize", "HALF_WORD_STORES": "quantize"}


def _op_of(setting: str) -> str | None:
    """The op whose kernels ``setting`` alone changes (None: both)."""
    for op in ("quantize", "dequantize"):
        if setting.startswith(f"{op.upper()}_"):
            return op
    return ONE_OP.get(setting)


def timed_ops(defines: tuple[str, ...]) -> tuple[str, ...]:
    """The ops whose kernels ``defines`` change (both for the default build, ``()``)."""
    ops = {_op_of(d.partition("=")[0]) for d in defines}
    if len(ops) == 1 and None not in ops:
        return (ops.pop(),)
    return ("quantize", "dequantize")


def parse_variant(text: str) -> tuple[str, ...]:
    """``"A=1,B=2"`` -> ``("A=1", "B=2")`` (``""``: the default build)."""
    from gnnact.kernels._cupy import compile_options, kernel_source

    defines = tuple(d.strip() for d in text.split(",") if d.strip())
    # raises on a malformed define, or a name quantize.cu does not read
    compile_options(defines, (kernel_source("quantize.cu"),))
    return defines


def _same(a: tuple[torch.Tensor, ...], b: tuple[torch.Tensor, ...]) -> bool:
    return all(torch.equal(u.nan_to_num(), v.nan_to_num()) for u, v in zip(a, b, strict=True))


def tune(device: torch.device, variants: list[tuple[str, ...]], bits_list: list[int],
         dtype: torch.dtype, numel: int, repeats: int, out: Path) -> int:
    """Times every build at every width in ``bits_list``, appending each width's rows to
    ``out`` as soon as they are measured; returns the number of rows."""
    from gnnact.kernels import quantize as kernels

    env = environment(device)
    x = torch.randn(numel, device=device, generator=torch.Generator(device).manual_seed(0))
    x = x.to(dtype)
    in_bytes = x.numel() * x.element_size()
    dst = torch.empty_like(x)
    copy_gbps = 2 * in_bytes / kernel_seconds(lambda: dst.copy_(x), device,
                                              repeats=repeats) / 1e9
    count = 0
    for bits in bits_list:
        rows = []
        base = kernels.quantize_groups(x, bits, DEFAULT_GROUP_SIZE, seed=7)
        base_back = kernels.dequantize_groups(*base, bits, DEFAULT_GROUP_SIZE, numel, dtype)
        moved = in_bytes + sum(t.numel() * t.element_size() for t in base)
        for defines in [(), *variants]:
            quantize = functools.partial(kernels.quantize_groups, x, bits, DEFAULT_GROUP_SIZE,
                                         seed=7, defines=defines)
            dequantize = functools.partial(kernels.dequantize_groups, *base, bits,
                                           DEFAULT_GROUP_SIZE, numel, dtype, defines=defines)
            agrees = _same(quantize(), base) and _same((dequantize(),), (base_back,))
            name = ",".join(defines) or "default"
            for op, fn in (("quantize", quantize), ("dequantize", dequantize)):
                if op not in timed_ops(defines):
                    continue
                seconds = kernel_seconds(fn, device, repeats=repeats)
                frac = moved / seconds / 1e9 / copy_gbps
                rows.append({"bench": "kernel_variant", **env, "defines": ",".join(defines),
                             "op": op, "bits": bits, "dtype": str(dtype).replace("torch.", ""),
                             "numel": numel, "group_size": DEFAULT_GROUP_SIZE,
                             "agrees": agrees, "kernel_ms": round(seconds * 1e3, 4),
                             "copy_kernel_gbps": round(copy_gbps, 3),
                             "kernel_frac_of_copy": round(frac, 4)})
                print(f"{op:10s} {bits}b {rows[-1]['dtype']:9s} {name:32s} "
                      f"{seconds * 1e3:8.4f} ms {frac:6.1%}" + ("" if agrees else "  DIFFERS"),
                      flush=True)
        append_rows(out, rows)
        count += len(rows)
    return count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", type=torch.device, default=torch.device("cuda"))
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS),
                        help="each NAME=VALUE[,NAME=VALUE...]; the default build always runs")
    parser.add_argument("--bits", type=int, nargs="+", default=[1, 2, 3, 4, 5, 6, 7, 8])
    parser.add_argument("--dtypes", nargs="+", choices=["float32", "bfloat16", "float16"],
                        default=["float32", "bfloat16"])
    parser.add_argument("--numel", type=int, default=1 << 26)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", type=Path, default=RESULTS / "tune_kernels.jsonl")
    args = parser.parse_args(argv)
    try:
        variants = [parse_variant(v) for v in args.variants]
    except ValueError as error:
        parser.error(f"--variants: {error}")
    if args.device.type != "cuda" or not torch.cuda.is_available():
        parser.error(f"--device {args.device}: the kernels need a CUDA device")
    from gnnact.kernels import cupy_available

    if not cupy_available():
        parser.error("the kernels need CuPy (pip install 'gnnact[cuda13]')")
    count = sum(tune(args.device, variants, args.bits, getattr(torch, dtype), args.numel,
                     args.repeats, args.out) for dtype in args.dtypes)
    print(f"{count} rows -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
