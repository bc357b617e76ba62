"""Short table of the GPU targets against the newest result rows: what a device call prints
last, so that its reply carries the verdict.

Targets: quantize and dequantize kernels at >= 70 % of copy bandwidth at every width; the
step's peak at 2 bits >= 10x below PyG fp32 for every model; the largest graph under the cap
>= 15x PyG's node count; swap's peak on a deep model (GCNII) against no swap.

Usage::

    python benchmarks/evidence.py [DIR] [--device cuda]

``DIR`` holds the ``*.jsonl`` rows (default ``benchmarks/results``; ``gpu_all.sh evidence``
passes ``$OUT``). Each line is the newest row of its kind on ``--device`` and names its
commit. Exits 0 whatever the verdict: a missing row is a line saying so.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RESULTS, read_rows

BANDWIDTH, PEAK, LARGEST = 0.70, 10.0, 15.0


def rows_of(path: Path, device: str, bench: str) -> list[dict]:
    """The rows of ``bench`` on ``device`` in ``path``, oldest first."""
    return sorted((r for r in read_rows(path) if r.get("device") == device
                   and r.get("bench") == bench),
                  key=lambda r: r.get("date", ""))


def newest_by(rows: list[dict], *keys: str) -> list[dict]:
    """The newest row for each value of ``keys``, in first-seen order."""
    chosen: dict[tuple, dict] = {}
    for row in rows:
        chosen[tuple(row.get(k) for k in keys)] = row
    return list(chosen.values())


def _verdict(value: float | None, target: float) -> str:
    return "missing" if value is None else ("ok" if value >= target else "BELOW")


def quantize_lines(folder: Path, device: str) -> list[str]:
    rows = newest_by([r for r in rows_of(folder / "quantize.jsonl", device,
                                         "quantize_throughput") if r.get("backend") != "torch"],
                     "op", "bits", "dtype")
    if not rows:
        return ["kernels: no kernel throughput rows"]
    lines = [f"kernels, fraction of copy bandwidth (the kernel alone; one call, host included), "
             f"target {BANDWIDTH:.0%}:"]
    for row in sorted(rows, key=lambda r: (r["dtype"], r["bits"], r["op"])):
        frac, call = row.get("kernel_frac_of_copy"), row.get("frac_of_copy")
        shown = "    -  " if frac is None else f"{frac:6.1%}"  # rows before kernel timing
        lines.append(f"  {row['op']:10s} {row['bits']} bits {row['dtype']:9s} {shown} "
                     f"({call:6.1%})  {_verdict(frac, BANDWIDTH):7s} {row['commit']}")
    masks = newest_by([r for r in rows_of(folder / "quantize.jsonl", device, "mask_throughput")
                       if r.get("backend") != "torch"], "op", "dtype")
    for row in masks:  # the fused mask ops, for comparison (no target of their own)
        frac, call = row.get("kernel_frac_of_copy"), row.get("frac_of_copy")
        shown = "    -  " if frac is None else f"{frac:6.1%}"
        lines.append(f"  {row['op']:17s} {row['dtype']:9s} {shown} ({call:6.1%})  "
                     f"{row['commit']}")
    return lines


def peak_lines(folder: Path, device: str) -> list[str]:
    rows = newest_by([{**r, "style": r.get("style") or "module"}  # rows before styles
                      for r in rows_of(folder / "peak.jsonl", device, "peak")
                      if r.get("bits") == 2 and r.get("graph") == "arxiv"],
                     "model", "style", "num_nodes")
    if not rows:
        return ["step peak: no 2-bit arxiv-shape rows"]
    lines = [f"step peak at 2 bits vs PyG fp32, target {PEAK:.0f}x:"]
    for row in rows:
        ratio = row.get("peak_ratio_vs_fp32")
        shown = "    -  " if ratio is None else f"{ratio:6.1f}x"
        lines.append(f"  {row['model']:6s} {row['style']:10s} "
                     f"{row['num_nodes']:>7,} nodes {row['peak_bytes'] / 2**20:7.0f} MiB "
                     f"{shown}  {_verdict(ratio, PEAK):7s} {row['commit']}")
    return lines


def largest_lines(folder: Path, device: str) -> list[str]:
    rows = {r["method"]: r for r in rows_of(folder / "largest.jsonl", device, "largest")}
    if "pyg" not in rows or "gnnact2" not in rows:
        return ["largest graph: no PyG and 2-bit rows"]
    pyg, ours = rows["pyg"]["largest_nodes"], rows["gnnact2"]["largest_nodes"]
    ratio = ours / pyg if pyg else None
    cap = rows["pyg"]["cap_bytes"] / 2**30
    lines = [f"largest graph under {cap:.0f} GiB, target {LARGEST:.0f}x: PyG {pyg:,} nodes, "
             f"2 bits {ours:,}" + (f" ({ratio:.1f}x)" if ratio else "")
             + f"  {_verdict(ratio, LARGEST)} {rows['gnnact2']['commit']}"]
    build, step = (rows["gnnact2"].get(k) for k in ("graph_build_peak_bytes",
                                                     "peak_bytes_at_largest"))
    if build and step:  # which of the two the cap meets first
        lines.append(f"  there: the graph's build alone {build / 2**20:,.0f} MiB, "
                     f"the whole step {step / 2**20:,.0f} MiB")
    return lines


def swap_lines(folder: Path, device: str) -> list[str]:
    rows = newest_by([r for r in rows_of(folder / "swap.jsonl", device, "swap")
                      if r.get("model") == "gcnii" and "peak_bytes" in r], "method")
    if not rows:
        return ["swap on GCNII: no rows"]
    return ["swap on GCNII, step peak:"] + [
        f"  {r['method']:22s} {r['peak_bytes'] / 2**20:8.0f} MiB  {r['commit']}" for r in rows]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, nargs="?", default=RESULTS)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args(argv)
    for part in (quantize_lines, peak_lines, largest_lines, swap_lines):
        print("\n".join(part(args.folder, args.device)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
