"""A checkpoint's scale grid as Burn block scales (docs/input-formats.md).

Each of a checkpoint's scales covers a box of its tensor (`covers` per axis; the boxes at the far edges
may be partial). Burn decodes `q * s` with one scale per block of at most 255 values along each axis,
so a box wider than that is held by Burn blocks that each lie inside one box and repeat its scale: along
each axis the block is the largest divisor of the box's extent up to 255, so Burn's block edges fall on
the box edges (and a partial box at the edge holds whole or partial Burn blocks of its own). No scale
changes, so the decode is the checkpoint's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from qcli.scheme import MAX_BLOCK_EXTENT, QuantScheme, ScaleDtype

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class ScaleGrid:
    """The scales of a tensor of `shape`, each covering a box of `covers` (an extent per axis)."""

    shape: tuple[int, ...]
    covers: tuple[int, ...]

    @property
    def grid(self) -> tuple[int, ...]:
        """How many of the checkpoint's scales lie along each axis (row-major, as it stores them)."""
        return tuple(math.ceil(d / c) for d, c in zip(self.shape, self.covers, strict=True))

    @property
    def block(self) -> tuple[int, ...]:
        """Burn's block: per axis the largest divisor of the box's extent (the axis where one box spans it)
        up to 255."""
        return tuple(max(e for e in range(1, min(c, MAX_BLOCK_EXTENT) + 1) if c % e == 0)
                     for c in (min(c, d) for d, c in zip(self.shape, self.covers, strict=True)))

    @property
    def one(self) -> bool:
        """Whether one scale covers the whole tensor."""
        return math.prod(self.grid) == 1

    def scheme(self, values: QuantScheme) -> QuantScheme:
        """`values` with f32 scales as Burn holds these: per tensor for one scale, else per `block`."""
        return values.per_tensor(ScaleDtype.F32) if self.one else values.per_block(list(self.block), ScaleDtype.F32)

    def burn_scales(self, scales: torch.Tensor) -> torch.Tensor:
        """The checkpoint's scales (in its order) as f32, as `scheme` stores them: one per Burn block,
        row-major over Burn's grid, or the tensor's one."""
        import torch

        out = scales.to(torch.float32).reshape(self.grid)
        if self.one:
            return out.reshape(1)
        for axis, (d, c, e) in enumerate(zip(self.shape, self.covers, self.block, strict=True)):
            out = out.repeat_interleave(min(c, d) // e, axis).narrow(axis, 0, math.ceil(d / e))
        return out

    def per_value(self, scales: torch.Tensor) -> torch.Tensor:
        """The scale each value of the tensor decodes with (in the scales' dtype), of `shape`: what any
        companion on the same grid (a zero point) is for each value, too."""
        out = scales.reshape(self.grid)
        for axis, (d, c) in enumerate(zip(self.shape, self.covers, strict=True)):
            out = out.repeat_interleave(min(c, d), axis).narrow(axis, 0, d)
        return out
