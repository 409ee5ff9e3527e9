"""Minifloat codes from f32 values and back, by integer arithmetic on f32 bits: the value types E4M3, E5M2
and E2M1, and the scale dtypes with a format of their own (F16, UE4M3).

Encoding is round-to-nearest, ties to even mantissa, after the caller clamped to the format's max; the
sign is kept (a negative value that rounds to zero gives the -0 code). Normal values round their f32
mantissa to `m` bits with the integer RNE trick, which carries into the exponent on its own. Values
below the smallest normal are subnormals, spaced `2^(1 - bias - m)`: scaling by the inverse spacing (a
power of two, exact) and rounding half-even gives the code directly, up to `2^m` (the smallest normal).
Only integer ops and one exact multiply, so a Triton kernel can mirror it line for line.
"""

from __future__ import annotations

import functools

import torch

from qcli.scheme import MinifloatFormat, QuantValue

# The minifloat value types' formats (`qcli.scheme.VALUE_TRAITS`); the scale dtypes' are in `SCALE_TRAITS`.
FORMATS = {value: fmt for value in QuantValue if (fmt := value.traits.minifloat) is not None}  # `is_minifloat`


def encode(v: torch.Tensor, fmt: MinifloatFormat) -> torch.Tensor:
    """int32 codes of contiguous f32 `v`, which must already lie in `[-fmt.max, fmt.max]`."""
    bits = v.view(torch.int32)
    mag = bits & 0x7FFFFFFF
    shift = 23 - fmt.mantissa_bits
    # Normal: RNE onto m mantissa bits (add half an ulp minus one plus the kept lsb, drop the low bits),
    # then rebias the exponent.
    code = (mag >> shift) & 1
    code += mag
    code += (1 << (shift - 1)) - 1
    code >>= shift
    code -= (127 - fmt.bias) << fmt.mantissa_bits
    # Subnormal: an exact scaling onto the subnormal spacing, rounded half to even.
    subnormal = torch.round(mag.view(torch.float32) * (1.0 / fmt.subnormal_spacing)).to(torch.int32)
    # Pick with a mask of all ones where subnormal (torch.where is slow on integer tensors).
    subnormal_mask = (mag < fmt.min_normal_f32_bits).to(torch.int32).neg_()
    code &= ~subnormal_mask
    code |= subnormal & subnormal_mask
    code |= (bits >> 31) & fmt.sign_bit  # arithmetic shift: all ones for negatives
    return code


@functools.cache
def table(fmt: MinifloatFormat) -> torch.Tensor:
    """f32 value of every code `0 .. 2^(1+e+m) - 1`, from the format's definition (NaN/inf codes included).

    Cached: callers must not modify it."""
    codes = torch.arange(2 * fmt.sign_bit, dtype=torch.int64)
    exponent = (codes >> fmt.mantissa_bits) & ((1 << fmt.exponent_bits) - 1)
    mantissa = (codes & ((1 << fmt.mantissa_bits) - 1)).to(torch.float64)
    scale = 2.0**fmt.mantissa_bits
    magnitude = torch.where(
        exponent == 0,
        mantissa * fmt.subnormal_spacing,
        (1.0 + mantissa / scale) * torch.exp2((exponent - fmt.bias).to(torch.float64)),
    )
    top = exponent == (1 << fmt.exponent_bits) - 1
    if fmt.top == "fn":
        magnitude = torch.where(top & (mantissa == scale - 1), torch.nan, magnitude)
    elif fmt.top == "ieee":
        magnitude = torch.where(top, torch.where(mantissa == 0, torch.inf, torch.nan), magnitude)
    values = torch.where((codes & fmt.sign_bit) != 0, -magnitude, magnitude)
    return values.to(torch.float32)


def decode(codes: torch.Tensor, fmt: MinifloatFormat) -> torch.Tensor:
    """f32 values of integer `codes`, on their device."""
    return _table_on(fmt, codes.device)[codes.long()]


@functools.cache
def _table_on(fmt: MinifloatFormat, device: torch.device) -> torch.Tensor:
    # Cached per device: copying the table to a GPU on every decode would wait for the device each time.
    return table(fmt).to(device)
