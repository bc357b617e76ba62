"""Compile every kernel source in ``cuda/`` with NVRTC for each target architecture.

Run in CI, where there is no GPU: NVRTC itself needs none. It compiles with the options CuPy
uses for ``RawModule`` (``-ftz=true`` is always appended by CuPy) straight to SASS
(``-arch=sm_XX``), treats any compiler warning as a failure, and checks that every kernel the
Python launchers look up (``gnnact.kernels.quantize.KERNEL_NAMES``) is an entry point in the
generated PTX. The sources in :data:`EXACT` must equal PyTorch's kernels on subnormals too:
any flush-to-zero instruction (``.ftz``) in their PTX fails the check.

With ``--ptxas`` it also asks ``ptxas -v`` (through ``nvcc -cubin``, the same options) what each
kernel uses per thread: registers, stack, spill stores and loads. Any spill fails the check (a
spilled quantizer reads and writes local memory for every value), and ``--report FILE`` appends
one row per kernel and architecture (JSON lines). Without ``nvcc`` on the path this part says
so and is not run.

Usage::

    python tools/check_kernels.py [--arch 80 90] [--cuda-dir cuda] [--ptxas [--report F]]

The NVRTC library is found in the ``nvidia-cuda-nvrtc`` wheel (``nvidia/cu*/lib``), else the
system loader path. Exits non-zero on any failure.
"""

from __future__ import annotations

import argparse
import ctypes
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

from gnnact.env import git_commit  # noqa: E402
from gnnact.kernels._cupy import compile_options, kernel_source  # noqa: E402
from gnnact.kernels.quantize import COMPILE_OPTIONS, KERNEL_NAMES  # noqa: E402

#: Sources that compute what PyTorch's kernels compute bit for bit, subnormal values included,
#: although CuPy compiles them with ``-ftz=true`` (their float arithmetic is inline PTX).
EXACT = ("mask.cu",)
_FTZ = re.compile(r"^\s*(?:@!?%\w+\s+)?([\w.]*\.ftz[\w.]*)", re.MULTILINE)


def _load_nvrtc() -> ctypes.CDLL:
    candidates: list[str] = []
    try:
        import nvidia  # namespace package of the nvidia-* wheels

        for base in nvidia.__path__:
            candidates += sorted(glob.glob(os.path.join(base, "cu*", "lib", "libnvrtc.so*")))
            candidates += sorted(glob.glob(os.path.join(base, "cuda_nvrtc", "lib",
                                                        "libnvrtc.so*")))
    except ImportError:
        pass
    candidates = [c for c in candidates if "builtins" not in c and "alt" not in c]
    candidates += ["libnvrtc.so"]
    errors = []
    for path in candidates:
        try:
            return ctypes.CDLL(path)
        except OSError as exc:
            errors.append(f"{path}: {exc}")
    raise SystemExit("NVRTC not found (pip install nvidia-cuda-nvrtc):\n  " + "\n  ".join(errors))


class Nvrtc:
    def __init__(self) -> None:
        self.lib = _load_nvrtc()
        self.lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        major, minor = ctypes.c_int(), ctypes.c_int()
        self._check(self.lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "version")
        self.version = (major.value, minor.value)

    def _check(self, status: int, what: str) -> None:
        if status != 0:
            raise RuntimeError(f"{what}: {self.lib.nvrtcGetErrorString(status).decode()}")

    def compile(self, source: str, name: str, options: list[str]) -> tuple[bool, str, str]:
        """Returns (ok, log, ptx-or-empty)."""
        prog = ctypes.c_void_p()
        self._check(self.lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(),
                                                0, None, None), "create")
        try:
            opts = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
            status = self.lib.nvrtcCompileProgram(prog, len(options), opts)
            size = ctypes.c_size_t()
            self.lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            buf = ctypes.create_string_buffer(size.value)
            self.lib.nvrtcGetProgramLog(prog, buf)
            log = buf.value.decode(errors="replace").strip()
            if status != 0:
                return False, log, ""
            ptx = ""
            if any(o.startswith("-arch=compute_") for o in options):
                self.lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
                buf = ctypes.create_string_buffer(size.value)
                self._check(self.lib.nvrtcGetPTX(prog, buf), "ptx")
                ptx = buf.value.decode()
            else:
                self.lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
                if size.value == 0:
                    return False, log + "\n(no SASS produced)", ""
            return True, log, ptx
        finally:
            self.lib.nvrtcDestroyProgram(ctypes.byref(prog))


_PTXAS_ENTRY = re.compile(r"Compiling entry function '(\w+)' for '(sm_\d+)'")
_PTXAS_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, "
                          r"(\d+) bytes spill loads")
_PTXAS_REGS = re.compile(r"Used (\d+) registers")


def ptxas_usage(nvcc: str, source: Path, arch: int,
                options: tuple[str, ...] = COMPILE_OPTIONS) -> list[dict]:
    """Per kernel of ``source`` on ``sm_<arch>``: registers, stack and spill bytes, as
    ``ptxas -v`` reports them."""
    with tempfile.TemporaryDirectory() as tmp:
        result = subprocess.run(
            [nvcc, "-cubin", f"-arch=sm_{arch}", *options, "-ftz=true", "-Xptxas", "-v",
             "-o", str(Path(tmp) / "out.cubin"), str(source)],
            capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"nvcc failed on {source.name} for sm_{arch}:\n{result.stderr}")
    rows: list[dict] = []
    for line in result.stderr.splitlines():
        if (m := _PTXAS_ENTRY.search(line)) is not None:
            rows.append({"source": source.name, "kernel": m.group(1), "arch": m.group(2)})
        elif rows and (m := _PTXAS_FRAME.search(line)) is not None:
            rows[-1].update(stack_bytes=int(m.group(1)), spill_store_bytes=int(m.group(2)),
                            spill_load_bytes=int(m.group(3)))
        elif rows and (m := _PTXAS_REGS.search(line)) is not None:
            rows[-1]["registers"] = int(m.group(1))
    return rows


def check_ptxas(sources: list[Path], arches: list[int], report: Path | None,
                options: tuple[str, ...] = COMPILE_OPTIONS) -> int:
    """Print each source's register range and spills per architecture; the number of kernels
    that spill."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        print("ptxas report: nvcc not on PATH, not run")
        return 0
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    release = re.search(r"release ([\d.]+)", version)
    spills, rows = 0, []
    for src in sources:
        for arch in arches:
            usage = ptxas_usage(nvcc, src, arch, options)
            spilled = [u["kernel"] for u in usage
                       if u.get("spill_store_bytes") or u.get("spill_load_bytes")]
            regs = [u["registers"] for u in usage]
            print(f"{src.name:16s} sm_{arch}  {len(usage)} kernels, registers "
                  f"{min(regs)}-{max(regs)}, stack {max(u['stack_bytes'] for u in usage)} B, "
                  + (f"FAIL: spills in {spilled}" if spilled else "no spills"))
            spills += len(spilled)
            rows += usage
    if report is not None:
        common = {"bench": "ptxas", "nvcc": release.group(1) if release else None,
                  "commit": git_commit(),
                  "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
        with report.open("a") as f:
            for row in rows:
                f.write(json.dumps({**common, **row}) + "\n")
        print(f"{len(rows)} rows -> {report}")
    return spills


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", nargs="+", type=int, default=[80, 90])
    parser.add_argument("--cuda-dir", type=Path, default=ROOT / "cuda")
    parser.add_argument("--ptxas", action="store_true",
                        help="also report registers and spills per kernel (needs nvcc)")
    parser.add_argument("--report", type=Path, default=None,
                        help="with --ptxas: append a JSON row per kernel and architecture")
    parser.add_argument("--define", action="append", default=[], metavar="NAME=VALUE",
                        help="a compile-time setting of the sources (repeatable), as "
                             "benchmarks/tune_kernels.py builds them")
    args = parser.parse_args(argv)
    sources = sorted(args.cuda_dir.glob("*.cu"))
    if not sources:
        print(f"no .cu files under {args.cuda_dir}")
        return 1
    # Each source with its #include "x.cuh" in place, read once: checked for the defines, built.
    codes = {src: kernel_source(src.name, src.parent) for src in sources}
    try:
        options = compile_options(tuple(args.define), tuple(codes.values()))
    except ValueError as error:
        parser.error(f"--define: {error}")

    nvrtc = Nvrtc()
    print(f"NVRTC {nvrtc.version[0]}.{nvrtc.version[1]}")
    failures = 0
    for src, code in codes.items():
        expected = KERNEL_NAMES.get(src.name, ())
        for arch in args.arch:
            base = [*options, "-ftz=true"]
            for target in (f"-arch=sm_{arch}", f"-arch=compute_{arch}"):
                ok, log, ptx = nvrtc.compile(code, src.name, [*base, target])
                problem = "" if ok else "compile error"
                if ok and log:
                    problem = "warnings"
                missing = []
                if ok and ptx:
                    entries = set(re.findall(r"\.entry\s+(\w+)", ptx))
                    missing = [k for k in expected if k not in entries]
                    flushing = sorted(set(_FTZ.findall(ptx))) if src.name in EXACT else []
                    if missing:
                        problem = f"missing entry points {missing}"
                    elif flushing:
                        problem = f"flushes subnormals to zero: {', '.join(flushing)}"
                status = "ok" if not problem else f"FAIL ({problem})"
                print(f"{src.name:16s} {target:18s} {status}")
                if problem:
                    failures += 1
                    if log:
                        print("  " + log.replace("\n", "\n  "))
    print(f"{len(sources)} sources, {len(args.arch)} architectures: "
          f"{'all compiled' if not failures else f'{failures} failures'}")
    if args.ptxas:
        failures += check_ptxas(sources, args.arch, args.report, options)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
