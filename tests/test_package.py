"""Packaging: the wheel carries the kernel sources, and gnnact imports without optional deps."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_wheel_contains_kernel_sources(tmp_path):
    pytest.importorskip("hatchling")
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps",
                    "--no-build-isolation", "-q", "-w", str(tmp_path)], check=True)
    (wheel,) = tmp_path.glob("gnnact-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for source in sorted((ROOT / "cuda").glob("*.cu")):
        assert f"gnnact/cuda/{source.name}" in names
    assert "gnnact/kernels/quantize_cpu.cpp" in names  # (built at run time: gnnact.kernels.cpu)
    assert "gnnact/quant/core.py" in names and "gnnact/memory.py" in names
    assert not any(n.startswith(("tests/", "benchmarks/")) for n in names)


def test_import_without_cupy_or_torch_sparse():
    # A None entry in sys.modules makes the import fail as if the package were not installed.
    code = ("import sys; sys.modules['cupy'] = None; sys.modules['torch_sparse'] = None; "
            "sys.modules['torch_scatter'] = None; import torch, gnnact; "
            "from gnnact.kernels import cupy_available; assert not cupy_available(); "
            "p = gnnact.quantize(torch.randn(64), bits=4); assert p.nbytes == 40; "
            "assert gnnact.dequantize(p).shape == (64,)")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_result_rows_do_not_make_the_commit_dirty(tmp_path, monkeypatch):
    # A benchmark appends its rows to a tracked file: the next run of the same code must still
    # record the clean commit; a change to code must not.
    from gnnact.env import git_commit

    monkeypatch.delenv("GNNACT_COMMIT", raising=False)

    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
                       cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    rows, code = tmp_path / "benchmarks/results/x.jsonl", tmp_path / "gnnact/ops.py"
    for path in (rows, code):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("first\n")
    git("add", ".")
    git("commit", "-q", "-m", "c")
    head = git_commit(root=tmp_path)
    assert head and not head.endswith("-dirty")
    rows.write_text("first\nsecond\n")
    assert git_commit(root=tmp_path) == head
    code.write_text("changed\n")
    assert git_commit(root=tmp_path) == f"{head}-dirty"
    monkeypatch.setenv("GNNACT_COMMIT", "abc1234")
    assert git_commit(root=tmp_path) == "abc1234"
