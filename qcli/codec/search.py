"""The scale search of `Calibration.Mse`: each block keeps, of a few candidate scales, the one whose decode
errs least in squared error. Burn decodes any stored scale as `q * s`, so a better scale costs nothing at
load time (docs/arithmetic.md §6).

The candidates, in order: the scale MinMax stores (`amax / h` rounded up onto the scale dtype); then
`c * amax / h` rounded to nearest for each c in CLIPS; then, for a range with unequal ends (Q8F, Q4F,
Q2F), `amax / b` and `amax / -a` rounded to nearest, which put the block's largest value exactly on an end.
Under a global scale (two levels) the global is MinMax's, and the stored scale relative to it is searched.

A candidate's error is integer arithmetic on f32 operations that round the same everywhere: with
`d = x - q * s` in f32 and `e` the exponent of the block's amax, each element adds `trunc(d * 2^(J - e))^2`
to an int64 sum. An integer sum does not depend on its order, so a GPU's reduction picks what the CPU
picks; of equal errors the first candidate wins.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from qcli.codec.blocks import BlockGrid
from qcli.codec.scales import Scales, nearest, scales_from_alpha
from qcli.codec.values import dequantize, to_fields
from qcli.scheme import QuantScheme

# Clip factors k/32: exact in f32, so `c * raw` rounds once, the same in every implementation.
CLIPS = tuple((32 - k) / 32 for k in range(1, 10))  # 31/32 down to 23/32 (0.72)
ERROR_BITS = 20  # J at most: the fixed-point bits of |d| / 2^e


def error_bits(block_elements: int) -> int:
    """J for blocks of `block_elements`: |d| stays below the block's amax < 2^(e + 1), so each term is
    below 2^(2J + 2) and a block's sum fits an int64."""
    return min(ERROR_BITS, (60 - max(block_elements, 1).bit_length()) // 2)


def candidates(alpha: torch.Tensor, scheme: QuantScheme) -> list[Scales]:
    """Each candidate's stored and effective scales for the blocks' amax `alpha` (grid-shaped f32)."""
    first = scales_from_alpha(alpha, scheme)
    value, dtype = scheme.value, scheme.scale_dtype()
    a, b = value.range()
    raw = alpha / value.half_range()
    tried = [raw * c for c in CLIPS]
    if -a != b:
        tried += [alpha / b, alpha / -a]
    found = [first]
    for s in tried:
        stored = nearest(s if first.global_scale is None else s / first.global_scale, dtype)
        stored = torch.where(stored > 0, stored, first.stored)  # rounded to zero: MinMax's scale instead
        effective = stored if first.global_scale is None else first.global_scale * stored
        found.append(Scales(stored, effective, first.global_scale))
    return found


def fixed_point_unit(alpha: torch.Tensor, bits: int) -> torch.Tensor:
    """2^(J - e) per block (grid-shaped f32), e = floor(log2 amax) read off the f32 exponent bits; the
    power is clamped to a normal f32 (an all-zero block errs by zero under any unit)."""
    exponent = (alpha.view(torch.int32) >> 23) - 127
    field = (127 + bits - exponent).clamp_(1, 254)
    return (field << 23).view(torch.float32)


def block_errors(x: torch.Tensor, effective: torch.Tensor, unit: torch.Tensor, grid: BlockGrid,
                 scheme: QuantScheme) -> torch.Tensor:
    """Σ trunc((x - q * s) * unit)^2 per block of `x` (f32, `grid.shape`) at scales `effective`, int64."""
    fields = to_fields(x, effective, grid, scheme.value)
    difference = grid.to_blocks(x - dequantize(fields, effective, grid, scheme.value))
    fixed = difference.mul_(grid.per_block(unit)).trunc_().to(torch.int64)
    return fixed.mul_(fixed).sum(dim=grid.block_axes)


def search_scales(pieces: Iterable[tuple[torch.Tensor, slice]], alpha: torch.Tensor, scheme: QuantScheme,
                  shape: tuple[int, ...]) -> Scales:
    """The searched scales of a tensor of `shape` whose blocks' amax is `alpha`, from its `pieces`: f32 rows
    in whole blocks with the grid rows they cover (for a per-tensor scheme, every piece feeds one sum)."""
    found = candidates(alpha, scheme)
    unit = fixed_point_unit(alpha, error_bits(math.prod(BlockGrid.of(scheme, shape).block)))
    per_tensor = scheme.block is None
    totals = torch.zeros((len(found), *alpha.shape), dtype=torch.int64) if per_tensor else None
    choice = torch.zeros(alpha.shape, dtype=torch.int64)
    for piece, grid_rows in pieces:
        grid = BlockGrid.of(scheme, piece.shape)
        rows = slice(None) if per_tensor else grid_rows
        errors = torch.stack([block_errors(piece, c.effective[rows], unit[rows], grid, scheme) for c in found])
        if per_tensor:
            totals += errors
        else:
            choice[rows] = errors.argmin(0)  # the first of equal minima
    if per_tensor:
        choice = totals.argmin(0)
    pick = choice.unsqueeze(0)
    stored = torch.stack([c.stored for c in found]).gather(0, pick).squeeze(0)
    effective = torch.stack([c.effective for c in found]).gather(0, pick).squeeze(0)
    return Scales(stored, effective, found[0].global_scale)
