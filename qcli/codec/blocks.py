"""The block grid of a tensor: which elements share a scale, and views that put each block on its own axes.

Blocks are right-aligned on the trailing axes (`BlockSize.to_dim_vec`); a partial block at the edge
takes a scale of its own. A per-tensor scheme is one block covering the whole tensor. A rank-0 tensor
is handled as shape `[1]`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from qcli.scheme import QuantScheme


@dataclass(frozen=True)
class BlockGrid:
    """`shape` split into blocks of `block`, `grid` blocks per axis (all three of the same rank >= 1)."""

    shape: tuple[int, ...]
    block: tuple[int, ...]
    grid: tuple[int, ...]

    @staticmethod
    def of(scheme: QuantScheme, shape: Sequence[int]) -> BlockGrid:
        shape = tuple(shape) or (1,)
        if scheme.block is None:
            return BlockGrid(shape, shape, (1,) * len(shape))
        block = tuple(scheme.block.size.to_dim_vec(len(shape)))
        return BlockGrid(shape, block, tuple(math.ceil(d / b) for d, b in zip(shape, block, strict=True)))

    @property
    def padded(self) -> tuple[int, ...]:
        """The shape rounded up to whole blocks."""
        return tuple(g * b for g, b in zip(self.grid, self.block, strict=True))

    @property
    def _splits(self) -> list[bool]:
        # Which axes split into (blocks, extent). An axis of extent 1 stays whole, so a [32] block on a
        # matrix is the view [rows, blocks, 32] and reductions run over one contiguous innermost axis;
        # the last axis always splits, so there is at least one axis to reduce over.
        last = len(self.shape) - 1
        return [b != 1 or i == last for i, b in enumerate(self.block)]

    def _view(self, inner: Sequence[int]) -> list[int]:
        parts = zip(self.grid, inner, self._splits, strict=True)
        return [n for g, b, split in parts for n in ((g, b) if split else (g,))]

    @property
    def block_axes(self) -> tuple[int, ...]:
        """The axes of `to_blocks`' result that run inside one block."""
        ends = itertools.accumulate(2 if split else 1 for split in self._splits)
        return tuple(end - 1 for end, split in zip(ends, self._splits, strict=True) if split)

    def to_blocks(self, x: torch.Tensor) -> torch.Tensor:
        """`x` (of `shape`) zero-padded to whole blocks and viewed with each block on its own axes."""
        x = x.reshape(self.shape)
        if self.padded != self.shape:
            padded = x.new_zeros(self.padded)
            padded[tuple(slice(0, d) for d in self.shape)] = x
            x = padded
        return x.reshape(self._view(self.block))

    def from_blocks(self, xb: torch.Tensor) -> torch.Tensor:
        """The inverse of `to_blocks`: back to `shape`, padding dropped."""
        x = xb.reshape(self.padded)
        if self.padded != self.shape:
            x = x[tuple(slice(0, d) for d in self.shape)]
        return x

    def per_block(self, scales: torch.Tensor) -> torch.Tensor:
        """A grid-shaped tensor viewed to broadcast over `to_blocks`' result."""
        return scales.reshape(self._view([1] * len(self.block)))

    def counts(self, device: torch.device | str | None = None) -> torch.Tensor:
        """Float64 grid of how many elements of the tensor each block holds (edge blocks hold fewer), on
        `device`."""
        counts = torch.ones((), dtype=torch.float64, device=device)
        for d, b, g in zip(self.shape, self.block, self.grid, strict=True):
            axis = torch.full((g,), float(b), dtype=torch.float64, device=device)
            if g:
                axis[-1] = d - (g - 1) * b
            counts = counts.unsqueeze(-1) * axis
        return counts
