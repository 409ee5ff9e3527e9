"""Scales: the range a block must cover (calibration), the stored and the effective scales.

docs/arithmetic.md §1-2.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from qcli.codec.blocks import BlockGrid
from qcli.scheme import F32_MIN_POSITIVE, Calibration, QuantScheme, ScaleDtype

# round_up's bit-grid step per dtype: 1 << (24 - mantissa digits); UE8M0 has one digit (no mantissa).
_STEP_BITS = {ScaleDtype.F16: 13, ScaleDtype.BF16: 16, ScaleDtype.UE4M3: 20, ScaleDtype.UE8M0: 23}
# UE8M0's range, 2^-127 (subnormal in f32) to 2^127, as f32 bit patterns (cubecl `ScaleDtype::UE8M0_MIN/MAX`).
UE8M0_MIN_BITS = 0x00400000
UE8M0_MAX_BITS = 0x7F000000
# Below the smallest normal, F16 and UE4M3 round up onto their subnormal spacing instead.
_SUBNORMAL = {ScaleDtype.F16: (2.0**-14, 2.0**24), ScaleDtype.UE4M3: (2.0**-6, 2.0**9)}


def round_up(s: torch.Tensor, dtype: ScaleDtype) -> torch.Tensor:
    """Non-negative f32 scales rounded up (never to nearest) onto `dtype`'s grid, saturating at its max.

    cubecl's `ScaleDtype::round_up`: the scale a quantizer divides by is then exactly the stored one.
    """
    if dtype is ScaleDtype.F32:
        return s
    if dtype is ScaleDtype.UE8M0:
        return _round_up_to_power_of_two(s)
    step = 1 << _STEP_BITS[dtype]
    bits = s.view(torch.int32) + (step - 1)
    rounded = bits.bitwise_and_(~(step - 1)).view(torch.float32)
    if dtype in _SUBNORMAL:
        smallest_normal, inverse_spacing = _SUBNORMAL[dtype]
        small = s < smallest_normal
        # rare in weights: skip the passes when no scale is that small (a data-dependent branch, which
        # torch.compile cannot trace, so it takes them)
        if torch.compiler.is_compiling() or bool(small.any()):
            subnormal = torch.ceil(s * inverse_spacing) * (1.0 / inverse_spacing)
            rounded = torch.where(small, subnormal, rounded)
    # Saturate: an s below the maximum rounds up to at most the maximum, which lies on the grid.
    return rounded.clamp_(max=dtype.max_representable())


def _round_up_to_power_of_two(s: torch.Tensor) -> torch.Tensor:
    """cubecl's `round_up_to_power_of_two`: NaN stays NaN; s <= 2^-127 gives 2^-127 and s >= 2^127 gives
    2^127 (clamped first: ue8m0 has nothing below its minimum, and the step would carry past 2^127 into
    infinity); otherwise the f32 bits rounded up onto the powers of two, clearing every mantissa bit."""
    step = 1 << _STEP_BITS[ScaleDtype.UE8M0]
    bits = s.view(torch.int32)
    rounded = torch.bitwise_and((bits + (step - 1)), ~(step - 1))
    # the ends compared on the bits: a non-negative f32 orders like its bit pattern (a negative one, never
    # a scale, has negative bits and clamps to the minimum as in cubecl), and no subnormal constant is needed
    rounded = torch.where(bits <= UE8M0_MIN_BITS, UE8M0_MIN_BITS, rounded)
    rounded = torch.where(bits >= UE8M0_MAX_BITS, UE8M0_MAX_BITS, rounded).view(torch.float32)
    return torch.where(torch.isnan(s), s, rounded)


def block_reduce(
    x: torch.Tensor, grid: BlockGrid, calibration: Calibration, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Grid-shaped partial range of each block: f32 max|x| (MinMax) or f64 sum|x| (AbsMean), written into
    `out` when given.

    Both reductions propagate NaN and inf, and combine across pieces of a block by max or sum.
    """
    if out is None:
        out = torch.empty(grid.grid, dtype=REDUCE_DTYPE[calibration], device=x.device)
    if x.numel() == 0:
        return out.zero_()
    magnitudes = grid.to_blocks(x).abs()  # one read of the chunk, then reductions over cached data
    if calibration is Calibration.MinMax:
        return torch.amax(magnitudes, dim=grid.block_axes, out=out)
    return torch.sum(magnitudes, dim=grid.block_axes, dtype=torch.float64, out=out)


def block_alpha(reduced: torch.Tensor, grid: BlockGrid, calibration: Calibration) -> torch.Tensor:
    """f32 range per block from `block_reduce` over the whole tensor; AbsMean divides in f64, rounds once."""
    if calibration is Calibration.MinMax:
        return reduced
    return (reduced / grid.counts()).to(torch.float32)


REDUCE_DTYPE = {Calibration.MinMax: torch.float32, Calibration.AbsMean: torch.float64}


@dataclass(frozen=True)
class Scales:
    """`stored`: the scales as written (relative ones under a global), grid-shaped f32.
    `effective`: what values are divided by, `global * stored` for two levels. `global_scale`: f32 or None."""

    stored: torch.Tensor
    effective: torch.Tensor
    global_scale: float | None


def scales_from_alpha(alpha: torch.Tensor, scheme: QuantScheme) -> Scales:
    """The stored and effective scales for per-block ranges `alpha` (one-level or two-level recipe)."""
    raw = alpha / scheme.value.half_range()
    dtype = scheme.scale_dtype()
    if not scheme.is_two_level():
        stored = round_up(_positive(raw), dtype)
        return Scales(stored, stored, None)
    ratio = raw / dtype.max_representable()
    peak = ratio.amax() if ratio.numel() else ratio.new_zeros(())
    global_scale = torch.clamp_min(peak, F32_MIN_POSITIVE)
    stored = round_up(_positive(raw / global_scale), dtype)
    return Scales(stored, global_scale * stored, float(global_scale))


def _positive(s: torch.Tensor) -> torch.Tensor:
    """An all-zero block (or an underflowed scale) gets f32::MIN_POSITIVE, so every decoder yields zeros."""
    return torch.where(s > 0, s, torch.tensor(F32_MIN_POSITIVE, dtype=torch.float32))
