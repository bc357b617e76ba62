"""Values for checking the mask ops bit for bit (tests/test_kernels.py on a GPU,
tests/test_kernels_on_host.py on the CPU): the special values they must keep as PyTorch
does, and an equality that tells -0.0 from +0.0 and NaN from NaN."""

from __future__ import annotations

import torch


def specials(n: int, dtype: torch.dtype, device: str = "cpu") -> torch.Tensor:
    """Normal values after NaN, signed zeros, infinities, -1.5 and a positive and a negative
    subnormal of ``dtype`` (which CuPy's -ftz=true would flush)."""
    x = torch.randn(n, generator=torch.Generator().manual_seed(n)).to(device, dtype)
    tiny = torch.finfo(dtype).smallest_normal / 4
    values = torch.tensor([float("nan"), 0.0, -0.0, float("inf"), -float("inf"), -1.5, tiny,
                           -tiny], dtype=torch.float64).to(dtype)
    assert values[6] != 0 and values[6] < torch.finfo(dtype).smallest_normal
    x[:min(n, 8)] = values[:min(n, 8)].to(device)
    return x


def assert_same_values(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
    keep = ~a.isnan()
    assert torch.equal(a[keep].signbit(), b[keep].signbit())  # -0.0 stays -0.0
