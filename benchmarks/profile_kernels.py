"""One launch of each quantize and dequantize kernel asked for, for Nsight Compute to profile.

``ncu`` runs this script and records the kernels it launches (``gpu_all.sh profile``: the full
section set, and the stall samples of each SASS instruction); the counters say what bounds a
kernel (memory, issue, a pipe, latency) where timing its builds (``tune_kernels.py``) only says
how long it takes. Each kernel is launched once on ``--numel`` random normal values (seeded
quantization, the path training takes); the codes a dequantize kernel reads are made by the
torch path, so that the only kernels named ``quantize_*`` or ``dequantize_*`` are the profiled
ones.

Usage::

    ncu --clock-control none --set full -k regex:quantize_ -o report \\
        python benchmarks/profile_kernels.py [--kernels quantize:float32:2 dequantize:float32:1 ...]
    ncu --import report.ncu-rep --page raw --csv > raw.csv
    python benchmarks/profile_kernels.py --summarize raw.csv [--env-from rows.jsonl] [--out F]

Without ``ncu`` it runs the same launches and prints their times (a smoke check).
``--summarize`` turns ncu's raw page into one row a kernel (``bench: kernel_profile``,
appended to ``benchmarks/results/kernel_profile.jsonl`` or ``--out``): its time, DRAM and L2
throughput as shares of their peaks, the L2 sectors it read and wrote (against the
``ideal_*`` sectors its bytes fill: more means partly written or read sectors), issue
activity, occupancy, registers, warp instructions per group and the stall reasons' shares of
the sampled warps. The device, versions and commit are this machine's (run it where ncu
ran), or those of the last row of ``--env-from`` (rows written in the same device call).
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RESULTS, append_rows, environment

import gnnact
from gnnact.kernels.quantize import _DTYPE_NAMES
from gnnact.quant import DEFAULT_GROUP_SIZE
from gnnact.quant.packed import packed_code_bytes

#: The kernels profiled by default: the quantizer at 2 and 8 bits (float32 and bfloat16) and
#: the dequantizer at 1, 2 and 5 bits (float32: the widths furthest below a copy's bandwidth
#: on an H200 before its chunked stores) and 2 bits (bfloat16).
KERNELS = ("quantize:float32:2", "quantize:bfloat16:2", "quantize:float32:8",
           "dequantize:float32:1", "dequantize:float32:2", "dequantize:float32:5",
           "dequantize:bfloat16:2")

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
#: The dtypes by their names in the kernels' (``quantize_<name>_<bits>``).
_KERNEL_DTYPES = {name: dtype for dtype, name in _DTYPE_NAMES.items()}

#: ncu's raw metrics a row keeps, by the row's names for them; times in microseconds, bytes
#: in megabytes (the raw page's second row gives the units).
METRICS = {
    "duration_us": "gpu__time_duration.sum",
    "dram_pct": "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
    "l2_pct": "lts__throughput.avg.pct_of_peak_sustained_elapsed",
    "issue_pct": "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "occupancy_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "registers": "launch__registers_per_thread",
    "grid": "launch__grid_size",
    "warp_instructions": "smsp__inst_executed.sum",
    "dram_read_mb": "dram__bytes_read.sum",
    "dram_write_mb": "dram__bytes_write.sum",
    "l2_read_sectors": "lts__t_sectors_srcunit_tex_op_read.sum",
    "l2_write_sectors": "lts__t_sectors_srcunit_tex_op_write.sum",
}
_SCALE = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "byte": 1e-6, "Kbyte": 1e-3,
          "Mbyte": 1.0, "Gbyte": 1e3}
_STALL = re.compile(r"smsp__pcsamp_warps_issue_stalled_(\w+)")


def parse_kernel(text: str) -> tuple[str, torch.dtype, int]:
    """``"quantize:float32:2"`` -> ``("quantize", torch.float32, 2)``."""
    parts = text.split(":")
    if len(parts) != 3 or parts[0] not in ("quantize", "dequantize") or parts[1] not in _DTYPES:
        raise argparse.ArgumentTypeError(
            f"--kernels entries are op:dtype:bits with op quantize or dequantize and dtype one of "
            f"{sorted(_DTYPES)}, got {text!r}")
    try:
        bits = int(parts[2])
    except ValueError:
        bits = 0
    if not 1 <= bits <= 8:
        raise argparse.ArgumentTypeError(f"--kernels bits must be 1..8, got {text!r}")
    return parts[0], _DTYPES[parts[1]], bits


def launch(op: str, dtype: torch.dtype, bits: int, numel: int, group_size: int) -> float:
    """Launches the ``op`` kernel once on ``numel`` values and returns the call's time in
    milliseconds (CUDA events: a first call, NVRTC's build of the module included; ncu's
    ``gpu__time_duration`` is the kernel's own)."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(numel, device="cuda", generator=gen).to(dtype)
    packed = gnnact.quantize(x, bits, group_size, backend="torch") if op == "dequantize" else None
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    if op == "quantize":
        gnnact.quantize(x, bits, group_size, backend="cupy")
    else:
        gnnact.dequantize(packed, backend="cupy")
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end)


def _number(text: str, unit: str) -> float:
    return float(text.replace(",", "")) * _SCALE.get(unit, 1.0)


def summarize(raw_csv: Path, env: dict, numel: int, group_size: int) -> list[dict]:
    """One row a kernel of ncu's raw page ``raw_csv`` (``--page raw --csv``) of this script's
    launches (``numel`` values, groups of ``group_size``)."""
    with raw_csv.open(newline="") as f:
        table = [row for row in csv.reader(f) if row]
    start = next((i for i, row in enumerate(table) if "Kernel Name" in row), None)
    if start is None:
        raise ValueError(f"{raw_csv}: no 'Kernel Name' column: not ncu's raw page as CSV")
    header, units = table[start], table[start + 1]
    unit_of = dict(zip(header, units, strict=False))
    groups = -(-numel // group_size)
    rows = []
    for values in table[start + 2:]:
        record = dict(zip(header, values, strict=False))
        name = record["Kernel Name"]
        match = re.fullmatch(r"(quantize|dequantize)_([a-z0-9]+)_(\d)", name)
        if match is None or match.group(2) not in _KERNEL_DTYPES:
            continue
        op, dtype, bits = match.group(1), _KERNEL_DTYPES[match.group(2)], int(match.group(3))
        row = {"bench": "kernel_profile", **env, "kernel": name, "op": op,
               "dtype": str(dtype).removeprefix("torch."), "bits": bits, "numel": numel,
               "group_size": group_size}
        for key, metric in METRICS.items():
            if record.get(metric, "") not in ("", "n/a"):
                row[key] = round(_number(record[metric], unit_of.get(metric, "")), 3)
        if "warp_instructions" in row:
            row["warp_instructions_per_group"] = round(row["warp_instructions"] / groups, 1)
        # The sectors (32 bytes) the kernel's own input and output fill, read and written once.
        values_bytes = numel * dtype.itemsize
        codes_bytes = groups * (packed_code_bytes(group_size, bits) + 8)  # codes, scale, zero
        read, written = ((values_bytes, codes_bytes) if op == "quantize"
                         else (codes_bytes, values_bytes))
        row["ideal_read_sectors"], row["ideal_write_sectors"] = -(-read // 32), -(-written // 32)
        samples = _number(record.get("smsp__pcsamp_sample_count", "0") or "0", "")
        stalls = {}
        for metric, text in record.items():
            found = _STALL.fullmatch(metric)
            if found and not metric.endswith("_not_issued") and text not in ("", "n/a"):
                stalls[found.group(1)] = _number(text, "")
        if samples:
            top = sorted(stalls.items(), key=lambda kv: -kv[1])[:6]
            row["stall_share"] = {reason: round(count / samples, 3) for reason, count in top}
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", nargs="+", type=parse_kernel,
                        default=[parse_kernel(k) for k in KERNELS],
                        help="op:dtype:bits, e.g. quantize:float32:2")
    parser.add_argument("--numel", type=int, default=1 << 26)
    parser.add_argument("--group-size", type=int, default=DEFAULT_GROUP_SIZE)
    parser.add_argument("--summarize", type=Path, default=None, metavar="RAW_CSV",
                        help="ncu's raw page (--page raw --csv) of this script's launches")
    parser.add_argument("--env-from", type=Path, default=None,
                        help="take device, versions and commit from this JSONL's last row")
    parser.add_argument("--out", type=Path, default=RESULTS / "kernel_profile.jsonl")
    args = parser.parse_args(argv)
    if args.summarize is not None:
        if args.env_from is not None:
            lines = args.env_from.read_text().splitlines()
            if not lines:
                parser.error(f"--env-from {args.env_from}: no rows")
            last = json.loads(lines[-1])
            env = {k: last.get(k) for k in environment("cpu")}
        else:
            env = environment("cuda" if torch.cuda.is_available() else "cpu")
        rows = summarize(args.summarize, env, args.numel, args.group_size)
        append_rows(args.out, rows)
        for row in rows:
            print(f"{row['kernel']:18s} {row.get('duration_us', float('nan')):8.2f} us  "
                  f"DRAM {row.get('dram_pct', 0):5.1f}%  L2 {row.get('l2_pct', 0):5.1f}%  "
                  f"issue {row.get('issue_pct', 0):5.1f}%  occupancy "
                  f"{row.get('occupancy_pct', 0):5.1f}%  stalls {row.get('stall_share')}")
        print(f"{len(rows)} rows -> {args.out}")
        return 0
    if not torch.cuda.is_available():
        print("profile_kernels: needs a CUDA device", file=sys.stderr)
        return 2
    for op, dtype, bits in args.kernels:
        ms = launch(op, dtype, bits, args.numel, args.group_size)
        print(f"{op:10s} {str(dtype).replace('torch.', ''):9s} {bits} bits: {ms:.3f} ms "
              "(one first call)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
