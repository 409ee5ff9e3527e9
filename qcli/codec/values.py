"""Values: divide by the effective scale, then round onto the value type's grid (docs/arithmetic.md §3)."""

from __future__ import annotations

import torch

from qcli.codec import minifloat
from qcli.codec.blocks import BlockGrid
from qcli.scheme import QuantValue


def fields(x: torch.Tensor, effective: torch.Tensor, grid: BlockGrid, value: QuantValue) -> torch.Tensor:
    """int32 fields shaped like `grid.shape`: the integer q, or the minifloat code.

    `x` is f32; `effective` holds one scale per block, grid-shaped.
    """
    blocks = grid.to_blocks(x)
    v = blocks / grid.per_block(effective)  # IEEE division, as the GPU's div_rn
    v = torch.where(blocks == 0, blocks, v)  # an exact zero stays zero, even over an underflowed scale
    v = grid.from_blocks(v)
    a, b = value.range()
    if value.is_minifloat():
        return minifloat.encode(v.clamp(a, b).contiguous(), minifloat.FORMATS[value])
    return torch.round(v.clamp(a, b)).to(torch.int32)  # round half to even; clamping first is the same


def values_of(fields: torch.Tensor, value: QuantValue) -> torch.Tensor:
    """f32 values of int32 fields: integers as they are, minifloat codes through the format's table."""
    if value.is_minifloat():
        return minifloat.decode(fields, minifloat.FORMATS[value])
    return fields.to(torch.float32)
