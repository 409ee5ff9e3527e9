"""Scales: the range a block must cover (calibration), the stored and the effective scales.

docs/arithmetic.md §1-2.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from qcli.codec.blocks import counts, to_blocks
from qcli.layout import BlockGrid
from qcli.scheme import F32_MIN_POSITIVE, Calibration, QuantScheme, ScaleDtype, f32_bits


def round_up(s: torch.Tensor, dtype: ScaleDtype) -> torch.Tensor:
    """Non-negative f32 scales rounded up (never to nearest) onto `dtype`'s grid (`ScaleTraits`),
    saturating at its max; NaN stays NaN.

    cubecl's `ScaleDtype::round_up`: the scale a quantizer divides by is then exactly the stored one.
    """
    traits = dtype.traits
    if traits.step_bits == 0:  # every f32 is on the grid
        return s
    step = 1 << traits.step_bits
    bits = s.view(torch.int32)
    rounded = torch.bitwise_and(bits + (step - 1), ~(step - 1))
    # Each fix-up below is for scales rare in weights (at the floor, below the format's normals, at the
    # maximum, NaN) and costs a compare and a select, slow passes on the CPU; the least and the largest
    # scale, two fast reductions, say whether it has anything to fix.
    least, largest = _least(s), _largest(s)
    if traits.floor is not None and not least > traits.floor:
        # cubecl `round_up_to_power_of_two`: nothing below the floor (subnormal in f32), compared on the bits
        # (a non-negative f32 orders like its bit pattern, so no subnormal constant is needed)
        floor_bits = f32_bits(traits.floor)
        rounded = torch.where(bits <= floor_bits, floor_bits, rounded)
    rounded = rounded.view(torch.float32)
    fmt = traits.minifloat
    if fmt is not None and not least >= 2.0 ** (1 - fmt.bias):
        # below the format's smallest normal, up onto its subnormal spacing
        inverse_spacing = 1.0 / fmt.subnormal_spacing
        subnormal = torch.ceil(s * inverse_spacing) * (1.0 / inverse_spacing)
        rounded = torch.where(s < 2.0 ** (1 - fmt.bias), subnormal, rounded)
    # Saturate, comparing s: a step as wide as the mantissa carries the largest values past the maximum
    # (into infinity or the sign bit), and any s below the maximum rounds up to at most the maximum.
    if not largest < traits.max:
        rounded = torch.where(s >= traits.max, traits.max, rounded)
    if largest != largest:  # NaN somewhere (amax propagates it)
        rounded = torch.where(torch.isnan(s), s, rounded)
    return rounded


def _least(s: torch.Tensor) -> float:
    """The least element of `s`; NaN when it holds a NaN, is empty, or is being traced by torch.compile
    (which cannot branch on data), so that every comparison with it is false and every fix-up runs."""
    return float("nan") if torch.compiler.is_compiling() or not s.numel() else float(s.amin())


def _largest(s: torch.Tensor) -> float:
    """The largest element of `s`, NaN as `_least`'s."""
    return float("nan") if torch.compiler.is_compiling() or not s.numel() else float(s.amax())


def nearest(s: torch.Tensor, dtype: ScaleDtype) -> torch.Tensor:
    """Non-negative f32 scales rounded to nearest onto `dtype`'s grid (`ScaleTraits`; ties to the even
    code, and between two powers of two of UE8M0 to the larger), saturating at its max; unlike `round_up`,
    a scale may round to zero."""
    traits = dtype.traits
    if traits.step_bits == 0:
        return s
    shift = traits.step_bits
    bits = s.view(torch.int32)
    half = (1 << (shift - 1)) - (0 if traits.mantissa_bits == 0 else 1 - ((bits >> shift) & 1))
    rounded = torch.bitwise_and(bits + half, ~((1 << shift) - 1))
    if traits.floor is not None:
        # a floor subnormal in f32 has its double as the next grid value: the bits hold no exponent to round
        # there, so the two split at their midpoint, and nothing is below the floor
        floor, double = bits.new_tensor(f32_bits(traits.floor)), bits.new_tensor(f32_bits(2 * traits.floor))
        low = torch.where(bits < floor + (floor >> 1), floor, double)
        rounded = torch.where(bits < double, low, rounded)
    rounded = rounded.view(torch.float32)
    fmt = traits.minifloat
    if fmt is not None:  # below the format's smallest normal, its subnormal spacing
        inverse_spacing = 1.0 / fmt.subnormal_spacing
        subnormal = torch.round(s * inverse_spacing) * (1.0 / inverse_spacing)
        rounded = torch.where(s < 2.0 ** (1 - fmt.bias), subnormal, rounded)
    return torch.where(s >= traits.max, traits.max, rounded).clamp_(max=traits.max)


def block_reduce(
    x: torch.Tensor,
    grid: BlockGrid,
    calibration: Calibration,
    out: torch.Tensor | None = None,
    scratch: torch.Tensor | None = None,
) -> torch.Tensor:
    """Grid-shaped partial range of each block: f32 max|x| (MinMax) or f64 sum|x| (AbsMean), written into
    `out` when given; `scratch` (flat f32, at least as long as the blocks) holds |x| when given.

    Both reductions propagate NaN and inf, and combine across pieces of a block by max or sum.
    """
    if out is None:
        out = torch.empty(grid.grid, dtype=REDUCE_DTYPE[calibration], device=x.device)
    if x.numel() == 0:
        return out.zero_()
    blocks = to_blocks(x, grid)
    into = None if scratch is None else scratch[: blocks.numel()].view(blocks.shape)
    magnitudes = torch.abs(blocks, out=into)  # one read of the chunk, then reductions over cached data
    if calibration is not Calibration.AbsMean:
        return torch.amax(magnitudes, dim=grid.block_axes, out=out)
    return torch.sum(magnitudes, dim=grid.block_axes, dtype=torch.float64, out=out)


def block_alpha(reduced: torch.Tensor, grid: BlockGrid, calibration: Calibration) -> torch.Tensor:
    """f32 range per block from `block_reduce` over the whole tensor; AbsMean divides in f64, rounds once."""
    if calibration is not Calibration.AbsMean:
        return reduced
    return (reduced / counts(grid)).to(torch.float32)


REDUCE_DTYPE = {Calibration.MinMax: torch.float32, Calibration.AbsMean: torch.float64,
                Calibration.Mse: torch.float32, Calibration.Gptq: torch.float32}


@dataclass(frozen=True)
class Scales:
    """`stored`: the scales as written (relative ones under a global), grid-shaped f32.
    `effective`: what values are divided by, `global * stored` for two levels. `global_scale`: f32 or None."""

    stored: torch.Tensor
    effective: torch.Tensor
    global_scale: float | None


def scales_from_alpha(alpha: torch.Tensor, scheme: QuantScheme, peak: torch.Tensor | None = None) -> Scales:
    """The stored and effective scales for per-block ranges `alpha` (one-level or two-level recipe); `peak`
    is the largest block range of the whole tensor when `alpha` covers only rows of it."""
    raw = divided(alpha, scheme.value.half_range())
    dtype = scheme.scale_dtype()
    if not scheme.is_two_level():
        stored = round_up(_positive(raw), dtype)
        return Scales(stored, stored, None)
    if peak is None:
        peak = alpha.amax() if alpha.numel() else alpha.new_zeros(())
    global_scale = global_of(peak, scheme)
    stored = round_up(_positive(raw / global_scale), dtype)
    return Scales(stored, global_scale * stored, float(global_scale))


def global_of(peak: torch.Tensor, scheme: QuantScheme) -> torch.Tensor:
    """A two-level scheme's global scale (0-d f32) for the largest block range `peak`: the divisions are
    monotonic, so the quotient of the peak is the peak of the blocks' quotients."""
    ratio = divided(divided(peak, scheme.value.half_range()), scheme.scale_dtype().max_representable())
    return torch.clamp_min(ratio, F32_MIN_POSITIVE)


# Blocks per piece of `scales_in_pieces`: 256 KiB of f32 ranges, so a piece's temporaries stay in a core's
# L2 while the dozen passes of the scale arithmetic run over it, few enough calls that torch's per-op cost
# stays small.
SCALE_PIECE = 1 << 16


def scales_in_pieces(alpha: torch.Tensor, scheme: QuantScheme) -> Scales:
    """`scales_from_alpha` over the whole grid `alpha`, computed `SCALE_PIECE` blocks at a time: every step
    is element-wise given the peak, so the pieces give the same scales."""
    if alpha.numel() <= SCALE_PIECE:
        return scales_from_alpha(alpha, scheme)
    peak = alpha.amax() if scheme.is_two_level() else None
    flat = alpha.reshape(-1)
    stored = torch.empty_like(flat)
    effective = torch.empty_like(flat) if scheme.is_two_level() else stored
    global_scale = None
    for start in range(0, flat.numel(), SCALE_PIECE):
        part = slice(start, start + SCALE_PIECE)
        scales = scales_from_alpha(flat[part], scheme, peak)
        stored[part] = scales.stored
        if scheme.is_two_level():
            effective[part] = scales.effective
        global_scale = scales.global_scale
    return Scales(stored.view(alpha.shape), effective.view(alpha.shape), global_scale)


def divided(x: torch.Tensor, divisor: float) -> torch.Tensor:
    """`x / divisor` rounded once, as IEEE divides, on every device: given a Python number, torch's CUDA
    division multiplies by its rounded reciprocal instead, so the divisor goes in as a tensor."""
    return x / torch.tensor(divisor, dtype=x.dtype, device=x.device)


def _positive(s: torch.Tensor) -> torch.Tensor:
    """An all-zero block (or an underflowed scale) gets f32::MIN_POSITIVE, so every decoder yields zeros."""
    if _least(s) > 0:  # none to replace: skip the compare and select
        return s
    return torch.where(s > 0, s, torch.tensor(F32_MIN_POSITIVE, dtype=torch.float32))
