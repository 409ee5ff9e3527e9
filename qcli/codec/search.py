"""The scale search of `Calibration.Mse`: each block keeps, of a few candidate scales, the one whose decode
errs least in squared error. Burn decodes any stored scale as `q * s`, so a better scale costs nothing at
load time (docs/arithmetic.md §6).

The candidates, in order: the scale MinMax stores (`amax / h` rounded up onto the scale dtype); then
`c * amax / h` rounded to nearest for each c in CLIPS; then, for a range `[a, b]` with unequal ends (Q8F,
Q4F, Q2F), `amax / b` and `amax / -a`, which put the block's largest value exactly on an end, and (for
scale dtypes with a sign) the negative scales `c * amax / a` for c in 1 and CLIPS, which put a positive
largest value on the longer end `a` as llama.cpp's Q4_0 does (Burn decodes `q * s` whatever the sign:
tests/io/test_burn.py).
Under a global scale (two levels) the global is MinMax's, and the stored scale relative to it is searched.

A candidate's error is integer arithmetic on f32 operations that round the same everywhere: with
`d = x - q * s` in f32 and `e` the exponent of the block's amax, each element adds `RN(d * 2^(J - e))^2`
to a sum that stays an integer below 2^53. An exact sum does not depend on its order, so a GPU's
reduction picks what the CPU picks; of equal errors the first candidate wins.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from qcli.codec.blocks import from_blocks, per_block, to_blocks
from qcli.codec.scales import Scales, divided, nearest, scales_from_alpha
from qcli.codec.values import dequantize, to_fields
from qcli.layout import BlockGrid
from qcli.scheme import QuantScheme, QuantValue

# Clip factors k/32: exact in f32, so `c * raw` rounds once, the same in every implementation.
CLIPS = tuple((32 - k) / 32 for k in range(1, 10))  # 31/32 down to 23/32 (0.72)
ERROR_BITS = 20  # J at most: the fixed-point bits of |d| / 2^e


def error_bits(block_elements: int) -> int:
    """J for blocks of `block_elements`: |d| stays below the block's amax < 2^(e + 1), so each term is
    below 2^(2J + 2) and a block's sum below 2^53, exact in an int64 and in a float64 alike."""
    return min(ERROR_BITS, (51 - max(block_elements, 1).bit_length()) // 2)


def candidates(alpha: torch.Tensor, scheme: QuantScheme, peak: torch.Tensor | None = None) -> list[Scales]:
    """Each candidate's stored and effective scales for the blocks' amax `alpha` (grid-shaped f32); `peak`
    is the whole tensor's largest amax when `alpha` covers rows of it (`scales_from_alpha`)."""
    first = scales_from_alpha(alpha, scheme, peak)
    value, dtype = scheme.value, scheme.scale_dtype()
    a, b = value.range()
    raw = divided(alpha, value.half_range())
    tried = [raw * c for c in CLIPS]
    if -a != b:  # both ends exactly, and (where the dtype has a sign) a positive amax on the longer end a
        tried += [divided(alpha, b), divided(alpha, -a)]
        if dtype.traits.signed:
            tried += [divided(alpha, a) * c for c in (1.0, *CLIPS)]
    found = [first]
    for s in tried:
        relative = s if first.global_scale is None else divided(s, first.global_scale)
        stored = nearest(relative.abs(), dtype)
        stored = torch.where(stored > 0, stored.copysign(relative), first.stored)  # zero: MinMax's scale
        effective = stored if first.global_scale is None else first.global_scale * stored
        found.append(Scales(stored, effective, first.global_scale))
    return found


def fixed_point_unit(alpha: torch.Tensor, bits: int) -> torch.Tensor:
    """2^(J - e) per block (grid-shaped f32), e = floor(log2 amax) read off the f32 exponent bits; the
    power is clamped to a normal f32 (an all-zero block errs by zero under any unit)."""
    exponent = (alpha.view(torch.int32) >> 23) - 127
    field = (127 + bits - exponent).clamp_(1, 254)
    return (field << 23).view(torch.float32)


def block_errors(blocks: torch.Tensor, effective: torch.Tensor, unit: torch.Tensor, grid: BlockGrid,
                 value: QuantValue, work: torch.Tensor, wide: torch.Tensor) -> torch.Tensor:
    """Σ RN((x - q * s) * unit)^2 per block, for `blocks` (`to_blocks` of f32 x) at the grid-shaped
    scales `effective`, as float64 integers: each term and partial sum is an integer below 2^53
    (`error_bits`), so the sum is exact. `work` (f32) and `wide` (f64), shaped like `blocks`, are scratch."""
    scales = per_block(effective, grid)
    if value.is_minifloat():
        x = from_blocks(blocks, grid)
        work.copy_(to_blocks(dequantize(to_fields(x, effective, grid, value), effective, grid, value), grid))
    else:  # to_fields' arithmetic on the block view, without its int8 round trip
        torch.div(blocks, scales, out=work)
        if not bool(effective.all()):
            torch.where(blocks == 0, blocks, work, out=work)
        work.clamp_(*value.range()).round_().mul_(scales)
    torch.sub(blocks, work, out=work).mul_(per_block(unit, grid)).round_()
    wide.copy_(work)
    return wide.mul_(wide).sum(dim=grid.block_axes)


class Search:
    """The search over one tensor of `shape` whose blocks' amax is `alpha`, fed its rows in whole blocks
    (`add`, any order; a per-tensor scheme's one block sums over all of them) until `scales` picks."""

    def __init__(self, alpha: torch.Tensor, scheme: QuantScheme, shape: tuple[int, ...],
                 peak: torch.Tensor | None = None) -> None:
        self.scheme, self.found = scheme, candidates(alpha, scheme, peak)
        self.unit = fixed_point_unit(alpha, error_bits(math.prod(BlockGrid.of(scheme, shape).block)))
        self.per_tensor = scheme.block is None
        self.least = torch.full(alpha.shape, math.inf, dtype=torch.float64, device=alpha.device)
        self.totals = torch.zeros(len(self.found), dtype=torch.float64, device=alpha.device)
        self.choice = torch.zeros(alpha.shape, dtype=torch.int64, device=alpha.device)

    def add(self, piece: torch.Tensor, grid_rows: slice) -> None:
        """f32 rows of the tensor in whole blocks, covering `grid_rows` of its block grid."""
        grid = BlockGrid.of(self.scheme, piece.shape)
        rows = slice(None) if self.per_tensor else grid_rows
        blocks = to_blocks(piece, grid)
        work, wide = torch.empty_like(blocks), torch.empty(blocks.shape, dtype=torch.float64, device=blocks.device)
        least, choice = self.least[rows], self.choice[rows]
        for k, candidate in enumerate(self.found):
            errors = block_errors(blocks, candidate.effective[rows], self.unit[rows], grid, self.scheme.value,
                                  work, wide)
            if self.per_tensor:
                self.totals[k] += errors.sum()
                continue
            better = errors < least  # strictly: of equal errors the first candidate stays
            least.copy_(torch.where(better, errors, least))
            choice.copy_(torch.where(better, k, choice))

    def scales(self) -> Scales:
        """Each block's candidate of least error."""
        if self.per_tensor:
            self.choice.fill_(int(self.totals.argmin()))  # the first of equal minima
        first = self.found[0]
        stored, effective = first.stored.clone(), first.effective.clone()
        for k, candidate in enumerate(self.found[1:], start=1):
            taken = self.choice == k
            stored = torch.where(taken, candidate.stored, stored)
            effective = torch.where(taken, candidate.effective, effective)
        return Scales(stored, effective, first.global_scale)


def search_scales(pieces: Iterable[tuple[torch.Tensor, slice]], alpha: torch.Tensor, scheme: QuantScheme,
                  shape: tuple[int, ...]) -> Scales:
    """The searched scales of a whole tensor, from its `pieces` (`Search.add`'s arguments)."""
    search = Search(alpha, scheme, shape)
    for piece, grid_rows in pieces:
        search.add(piece, grid_rows)
    return search.scales()
