"""The torch quantizer of another checkout against this one's, in one process, calls taking
turns: relative speed that the machine's swings (up to 2× from minute to minute on shared
cores) do not blur.

Loads ``gnnact/quant/reference.py`` and ``rng.py`` of ``--base`` (a checkout, e.g. a
``git worktree`` of an older commit) as modules of their own, checks that both give the same
codes, scales and zeros for the same seed, then times ``quantize_groups`` and
``dequantize_groups`` of both alternately: one row per size and width with both medians and
their ratio.

Usage::

    python benchmarks/ab_quantize.py --base ../old-checkout [--sizes 4096 1048576] [--smoke]

Rows are appended to ``benchmarks/results/quantize_ab.jsonl`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RESULTS, environment, finish

from gnnact.quant import reference


def _module(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_base(root: Path) -> ModuleType:
    """``root``'s ``reference`` module, importing ``root``'s ``rng`` (the two change together;
    ``packed`` is shared)."""
    rng = _module("base_rng", root / "gnnact/quant/rng.py")
    saved = sys.modules["gnnact.quant.rng"]
    sys.modules["gnnact.quant.rng"] = rng
    try:
        return _module("base_reference", root / "gnnact/quant/reference.py")
    finally:
        sys.modules["gnnact.quant.rng"] = saved


def compare(base: ModuleType, numel: int, bits: int, repeats: int) -> dict:
    x = torch.randn(numel, generator=torch.Generator().manual_seed(0))
    group = min(512, numel)
    impls = {"base": base, "head": reference}
    packed = {k: m.quantize_groups(x, bits, group, seed=1) for k, m in impls.items()}
    for a, b in zip(packed["base"], packed["head"], strict=True):
        if not torch.equal(a, b):
            raise AssertionError(f"the two quantizers differ at {numel} values, {bits} bits")
    quantize = {k: [] for k in impls}
    dequantize = {k: [] for k in impls}
    for r in range(repeats):
        for k, m in impls.items():
            t0 = time.perf_counter()
            m.quantize_groups(x, bits, group, seed=r)
            t1 = time.perf_counter()
            m.dequantize_groups(*packed[k], bits, group, numel, torch.float32)
            quantize[k].append(t1 - t0)
            dequantize[k].append(time.perf_counter() - t1)
    q = {k: statistics.median(v) * 1e6 for k, v in quantize.items()}
    d = {k: statistics.median(v) * 1e6 for k, v in dequantize.items()}
    return {"numel": numel, "bits": bits, "repeats": repeats,
            "quantize_base_us": round(q["base"], 1), "quantize_head_us": round(q["head"], 1),
            "quantize_ratio": round(q["head"] / q["base"], 3),
            "dequantize_base_us": round(d["base"], 1), "dequantize_head_us": round(d["head"], 1),
            "dequantize_ratio": round(d["head"] / d["base"], 3)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=Path, required=True, help="the other checkout's root")
    parser.add_argument("--sizes", type=int, nargs="+",
                        default=[512, 4096, 41376, 1 << 20, 4 << 20])
    parser.add_argument("--bits", type=int, nargs="+", default=[1, 2, 3, 4, 8])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--smoke", action="store_true", help="one size, no result file")
    parser.add_argument("--out", type=Path, default=RESULTS / "quantize_ab.jsonl")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    base = load_base(args.base)
    base_commit = subprocess.run(["git", "-C", str(args.base), "rev-parse", "--short", "HEAD"],
                                 capture_output=True, text=True).stdout.strip() or None
    env = environment(torch.device("cpu"))
    rows = []
    for numel in [4096] if args.smoke else args.sizes:
        for bits in args.bits:
            row = {"bench": "quantize_ab", **env, "base_commit": base_commit,
                   **compare(base, numel, bits, 5 if args.smoke else 400 if numel < 1e5 else 21)}
            rows.append(row)
            print(f"{numel:9d} {bits}b quantize {row['quantize_base_us']:9.0f} -> "
                  f"{row['quantize_head_us']:9.0f} us ({row['quantize_ratio']})  dequantize "
                  f"{row['dequantize_base_us']:8.0f} -> {row['dequantize_head_us']:8.0f} us "
                  f"({row['dequantize_ratio']})", flush=True)
    return finish(args.out, rows, smoke=args.smoke)


if __name__ == "__main__":
    sys.exit(main())
