"""Torch views of a tensor's block grid (`qcli.layout.BlockGrid`): each block on its own axes, and back."""

from __future__ import annotations

import math

import torch

from qcli.layout import BlockGrid


def to_blocks(x: torch.Tensor, grid: BlockGrid) -> torch.Tensor:
    """`x` (of `grid.shape`) zero-padded to whole blocks and viewed with each block on its own axes."""
    x = x.reshape(grid.shape)
    if grid.padded != grid.shape:
        padded = x.new_zeros(grid.padded)
        padded[tuple(slice(0, d) for d in grid.shape)] = x
        x = padded
    return x.reshape(grid.blocked_shape)


def from_blocks(xb: torch.Tensor, grid: BlockGrid) -> torch.Tensor:
    """The inverse of `to_blocks`: back to `grid.shape`, padding dropped."""
    x = xb.reshape(grid.padded)
    if grid.padded != grid.shape:
        x = x[tuple(slice(0, d) for d in grid.shape)]
    return x


def broadcast_to_blocks(w: torch.Tensor, grid: BlockGrid) -> torch.Tensor:
    """`w`, of `grid.shape`'s rank and broadcastable to it, viewed to broadcast over `to_blocks`' result:
    zero-padded to whole blocks along its axes that are not 1, which stay 1 (never expanded to the tensor)."""
    padded = [p if e != 1 else 1 for p, e in zip(grid.padded, w.shape, strict=True)]
    if list(w.shape) != padded:
        grown = w.new_zeros(padded)
        grown[tuple(slice(0, e) for e in w.shape)] = w
        w = grown
    return w.reshape(grid.blocked_shape_of(w.shape))


def block_rows(xb: torch.Tensor, grid: BlockGrid) -> torch.Tensor:
    """`to_blocks`' result (or a tensor broadcast to its shape) with one block a row, in the grid's
    row-major order: [blocks, elements of a block], contiguous (a copy unless the blocks lie along the
    last axis alone)."""
    inner = grid.block_axes
    outer = [axis for axis in range(xb.dim()) if axis not in inner]
    return xb.permute(*outer, *inner).reshape(-1, math.prod(grid.block)).contiguous()


def per_block(scales: torch.Tensor, grid: BlockGrid) -> torch.Tensor:
    """A grid-shaped tensor viewed to broadcast over `to_blocks`' result."""
    return scales.reshape(grid.scales_shape)


def counts(grid: BlockGrid, device: torch.device | str | None = None) -> torch.Tensor:
    """Float64 grid of how many elements of the tensor each block holds (edge blocks hold fewer), on
    `device`."""
    counts = torch.ones((), dtype=torch.float64, device=device)
    for d, b, g in zip(grid.shape, grid.block, grid.grid, strict=True):
        axis = torch.full((g,), float(b), dtype=torch.float64, device=device)
        if g:
            axis[-1] = d - (g - 1) * b
        counts = counts.unsqueeze(-1) * axis
    return counts
