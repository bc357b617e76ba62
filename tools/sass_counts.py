"""The SASS instructions of one pass of ``cuda/quantize.cu``'s quantizer over whole groups of
the default size (``quantize_group<L, BITS, Whole = true>``: seeded, by vectors), counted by
the pipe that issues them.

A GPU is not needed: ``nvcc`` compiles the kernel source with a probe entry point that runs
that one pass, ``cuobjdump -sass`` lists it. With no loop left in it (each octet unrolled),
the static count is, up to its branches (a non-finite group, the division's slow path, lane
0's stores), the work a warp issues for the groups it takes at once (one a segment of LANES
lanes: two groups of 512, 1024 values, in the default shape; a row's ``values``): the number
the quantizer's speed follows when it is bound by instructions (4 or 2 bytes a value quantize
in the same time). Compare
builds (``--define``) and commits with it before a GPU times them (``tune_kernels.py``).

Classes: ``fma`` (FADD, FMUL, FFMA, IMAD: the FMA pipes), ``alu`` (LOP3, SHF, IADD3, PRMT,
compares, min/max: half the rate of an add), ``conv`` (I2F, F2I, FRND: an eighth), ``mem``,
``shfl`` and ``other`` (branches, barriers, moves of uniform registers).

Usage::

    python tools/sass_counts.py [--dtypes float32 bfloat16] [--bits 1 2 4 8]
        [--define NAME=VALUE ...] [--cuda-dir DIR] [--report FILE]

``--cuda-dir``: the sources of another checkout (a ``git worktree`` of an older commit, say);
its rows name that checkout's commit.

``nvcc`` on the PATH and ``cuobjdump`` (and the ``nvdisasm`` it calls) on the PATH or in the
``nvidia-cuda-cuobjdump``/``nvidia-cuda-nvdisasm`` wheels. ``--report`` appends one JSON row per
dtype and width.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from gnnact.env import git_commit  # noqa: E402
from gnnact.kernels._cupy import compile_options, kernel_source  # noqa: E402
from gnnact.kernels.quantize import _cached, _lanes  # noqa: E402

_TYPES = {"float32": "F32", "float64": "F64", "float16": "F16", "bfloat16": "BF16"}
#: The setting that bounds each dtype's quantizer's registers (its entry point's launch bounds).
_MIN_BLOCKS = {"float32": "QUANTIZE_MIN_BLOCKS", "float64": "QUANTIZE_F64_MIN_BLOCKS",
               "float16": "QUANTIZE_HALF_MIN_BLOCKS", "bfloat16": "QUANTIZE_HALF_MIN_BLOCKS"}

#: One seeded pass over whole group g of this warp's segment, as quantize_impl makes it (in the
#: quantizer's shape: the source ends in the dequantizer's).
PROBE = """
#undef OP_LANES
#undef OP_CACHED
#ifndef QUANTIZE_HALF_MIN_BLOCKS  // sources before float16 and bfloat16 had a bound of their own
#define QUANTIZE_HALF_MIN_BLOCKS QUANTIZE_MIN_BLOCKS
#endif
#define OP_LANES QUANTIZE_LANES
#define OP_CACHED QUANTIZE_CACHED
extern "C" __global__ void __launch_bounds__(256, {blocks})
probe_whole_group(QuantizeArgs<{L}> a) {{
    const int lane = threadIdx.x & 31;
    const int sub = lane % OP_LANES, segment = lane / OP_LANES;
    const i64 g = ((i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * SEGMENTS
                  + segment;
    typename Kept<{L}>::T kept[OP_CACHED];
    Range<{L}> range;
    quantize_group<{L}, {bits}, true, true>(a, g, {stride}sub, kept, range);
}}
"""

PIPES = {
    "fma": {"FADD", "FMUL", "FFMA", "IMAD", "IMUL", "HFMA2", "HADD2", "HMUL2"},
    "alu": {"LOP3", "SHF", "IADD3", "ISETP", "FSETP", "FSET", "FMNMX", "IMNMX", "VIMNMX", "SEL",
            "FSEL", "PRMT", "LEA", "VHMNMX", "HMNMX2", "PLOP3", "IABS", "FCHK", "P2R", "R2P",
            "VIADD"},
    "conv": {"I2F", "F2I", "FRND", "F2F", "I2FP", "F2IP"},
    "mem": {"LDG", "STG", "LDS", "STS", "LD", "ST", "LDC", "ULDC"},
    "shfl": {"SHFL", "VOTE"},
}
_INSTRUCTION = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)[.\s;]")


def pipe_of(opcode: str) -> str:
    """The class of a SASS opcode (without modifiers)."""
    return next((name for name, ops in PIPES.items() if opcode in ops), "other")


def count_sass(listing: str) -> dict[str, int]:
    """Instructions of a ``cuobjdump -sass`` listing by class, ``total`` among them (NOPs,
    the padding after the last instruction, are not counted)."""
    counts: collections.Counter = collections.Counter()
    for line in listing.splitlines():
        if (m := _INSTRUCTION.match(line)) is not None and m.group(1) != "NOP":
            counts[pipe_of(m.group(1))] += 1
    return {"total": sum(counts.values()), **{k: counts.get(k, 0) for k in (*PIPES, "other")}}


def find_tool(name: str) -> str | None:
    """``name`` on the PATH, else in an ``nvidia-cuda-*`` wheel's ``bin`` folder."""
    found = shutil.which(name)
    if found is not None:
        return found
    try:
        import nvidia  # namespace package of the nvidia-* wheels
    except ImportError:
        return None
    for base in nvidia.__path__:
        hits = sorted(glob.glob(os.path.join(base, "*", "bin", name)))
        if hits:
            return hits[0]
    return None


def probe_counts(dtype: str, bits: int, defines: tuple[str, ...], nvcc: str, cuobjdump: str,
                 arch: int = 90, folder: Path | None = None) -> dict[str, int]:
    """:func:`count_sass` of the probe for ``dtype`` and ``bits`` in the build ``defines``
    (sources in ``folder``, else this checkout's)."""
    source = kernel_source("quantize.cu", folder)
    # Sources with the PREFETCH variant (before 7b11822) take a stride of groups, 0 here.
    stride = "0, " if "quantize_group(const QuantizeArgs<L>& a, i64 g, i64 stride" in source else ""
    source += PROBE.format(L=_TYPES[dtype], bits=bits, blocks=_MIN_BLOCKS[dtype], stride=stride)
    env = dict(os.environ)
    env["PATH"] = f"{Path(cuobjdump).parent}{os.pathsep}{env.get('PATH', '')}"  # nvdisasm
    with tempfile.TemporaryDirectory() as tmp:
        cu, cubin = Path(tmp) / "probe.cu", Path(tmp) / "probe.cubin"
        cu.write_text(source)
        subprocess.run([nvcc, "-cubin", f"-arch=sm_{arch}", *compile_options(defines),
                        "-ftz=true", "-o", str(cubin), str(cu)],
                       check=True, capture_output=True, text=True)
        listing = subprocess.run([cuobjdump, "-sass", "-fun", "probe_whole_group", str(cubin)],
                                 check=True, capture_output=True, text=True, env=env).stdout
    return count_sass(listing)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"],
                        choices=sorted(_TYPES))
    parser.add_argument("--bits", nargs="+", type=int, default=list(range(1, 9)))
    parser.add_argument("--define", action="append", default=[],
                        help="a compile-time setting of the build, NAME=VALUE (repeatable)")
    parser.add_argument("--arch", type=int, default=90)
    parser.add_argument("--cuda-dir", type=Path, default=None,
                        help="kernel sources of another checkout (default: this one's)")
    parser.add_argument("--report", type=Path, default=None,
                        help="append a JSON row per dtype and width")
    args = parser.parse_args(argv)
    bad = [b for b in args.bits if not 1 <= b <= 8]
    if bad:
        parser.error(f"--bits must be in 1..8, got {bad}")
    nvcc, cuobjdump = find_tool("nvcc"), find_tool("cuobjdump")
    if nvcc is None or cuobjdump is None:
        print("sass_counts: needs nvcc and cuobjdump (pip install nvidia-cuda-cuobjdump "
              "nvidia-cuda-nvdisasm)", file=sys.stderr)
        return 2
    defines = tuple(args.define)
    # WHOLE_GROUP in the quantizer's shape (cuda/quantize.cu's QUANTIZE_LANES and
    # QUANTIZE_CACHED, or the build's), and the values of the groups a warp's pass takes (one
    # a segment of its lanes)
    lanes = _lanes("quantize", defines)
    whole = 8 * lanes * _cached("quantize", defines)
    values = whole * (32 // lanes)
    commit = git_commit() if args.cuda_dir is None else git_commit(root=args.cuda_dir.parent)
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    release = re.search(r"release (\d+\.\d+)", version)
    # What the benchmark tables head a run with: the "device" is the compiler and target.
    made_by = {"device_name": f"static SASS, sm_{args.arch}", "torch": torch.__version__,
               "nvcc": release.group(1) if release else None}
    rows = []
    for dtype in args.dtypes:
        for bits in args.bits:
            counts = probe_counts(dtype, bits, defines, nvcc, cuobjdump, args.arch, args.cuda_dir)
            rows.append({"bench": "sass_counts", **made_by, "commit": commit,
                         "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
                             timespec="seconds"),
                         "arch": f"sm_{args.arch}", "defines": list(defines), "dtype": dtype,
                         "bits": bits, "group_size": whole, "values": values, **counts})
            print(f"{dtype:9s} {bits} bits: " + " ".join(f"{k} {v}" for k, v in counts.items()))
    if args.report is not None:
        with args.report.open("a") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
