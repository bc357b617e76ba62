"""Facts about the running environment that every result row carries: device, versions, commit,
date. Shared by the command line and the benchmark scripts."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import subprocess
from pathlib import Path

import torch

__all__ = ["cuda_index", "device_name", "environment", "git_commit"]

_ROOT = Path(__file__).resolve().parent.parent


#: Paths whose changes do not make a checkout ``-dirty``: what the benchmarks write (result
#: rows), not what computes them. A benchmark that appends its rows would otherwise mark every
#: later run of the session dirty.
OUTPUTS = ("benchmarks/results",)


def git_commit(short: bool = True, root: Path = _ROOT) -> str | None:
    """HEAD of the checkout at ``root`` (this package's), with ``-dirty`` if tracked files
    other than the :data:`OUTPUTS` changed, or ``None`` outside a git checkout;
    ``$GNNACT_COMMIT`` when set, for a copy of the tree whose ``.git`` is not its own (a GPU
    machine's copy of a checkout can carry an older one)."""
    if os.environ.get("GNNACT_COMMIT"):
        return os.environ["GNNACT_COMMIT"]
    try:
        args = ["git", "rev-parse", *(["--short"] if short else []), "HEAD"]
        head = subprocess.run(args, cwd=root, check=True, capture_output=True, text=True,
                              timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--",
                                ".", *(f":(exclude){path}" for path in OUTPUTS)],
                               cwd=root, capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("-dirty" if dirty.strip() else "") if head else None


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cuda_index(device: torch.device) -> int:
    """The index of CUDA ``device``; the current device's for plain ``"cuda"`` (APIs such as
    ``set_per_process_memory_fraction`` and the allocator's traces want the number)."""
    return device.index if device.index is not None else torch.cuda.current_device()


def device_name(device: torch.device | str) -> str:
    """The GPU's name, or the CPU model with the number of torch threads."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{_cpu_name()} ({torch.get_num_threads()} threads)"


def cpu_kernels_compiler() -> str | None:
    """The compiler of the compiled CPU kernels (:mod:`gnnact.kernels.cpu`: the first line of
    its ``--version``) where they build, ``None`` where the CPU quantizes on the torch path."""
    from gnnact.kernels import cpu

    if not cpu.available():
        return None
    return cpu.compiler_version().splitlines()[0] or cpu.compiler()


def environment(device: torch.device | str = "cpu") -> dict:
    """Device, versions, commit and date, as a flat dict for a JSON result row."""
    import torch_geometric

    try:
        import cupy

        cupy_version = cupy.__version__
    except Exception:  # not installed, or no usable CUDA
        cupy_version = None
    device = torch.device(device)
    return {
        "device": device.type,
        "device_name": device_name(device),
        "torch": torch.__version__,
        "torch_geometric": torch_geometric.__version__,
        "cupy": cupy_version,
        "cpu_kernels": cpu_kernels_compiler(),
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "commit": git_commit(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
