"""Row blocks of the by-block loops in backward (and in the fused forward): blocks of about
``gnnact.quant.reference.block_elements`` values (a sixteenth of the tensor, within 64Ki and
1Mi values), so that a loop over a full-size tensor holds one block's temporaries at a time,
a small share of the tensor."""

from __future__ import annotations

from gnnact.quant.reference import block_elements

__all__ = ["row_starts"]


def row_starts(rows: int, width: int) -> list[int]:
    """Boundaries ``[0, r_1, ..., rows]`` of row blocks of a ``[rows, width]`` tensor, each
    of about ``gnnact.quant.reference.block_elements`` values (at least one row)."""
    step = max(1, block_elements(rows * width) // max(1, width))
    return [*range(0, rows, step), rows]
