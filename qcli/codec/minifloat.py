"""Minifloat codes (E4M3, E5M2, E2M1) from f32 values and back, by integer arithmetic on f32 bits.

Encoding is round-to-nearest, ties to even mantissa, after the caller clamped to the format's max; the
sign is kept (a negative value that rounds to zero gives the -0 code). Normal values round their f32
mantissa to `m` bits with the integer RNE trick, which carries into the exponent on its own. Values
below the smallest normal are subnormals, spaced `2^(1 - bias - m)`: scaling by the inverse spacing (a
power of two, exact) and rounding half-even gives the code directly, up to `2^m` (the smallest normal).
Only integer ops and one exact multiply, so a Triton kernel can mirror it line for line.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from qcli.scheme import QuantValue


@dataclass(frozen=True)
class MinifloatFormat:
    """A sign bit, `exponent_bits`, `mantissa_bits`, exponent `bias`; `max` is the largest finite value.

    `top` says what the top binade holds: "ieee" (inf and NaN), "fn" (finite, but all ones is NaN), or
    "finite".
    """

    exponent_bits: int
    mantissa_bits: int
    bias: int
    max: float
    top: str

    @property
    def min_normal_f32_bits(self) -> int:
        """The f32 bit pattern of the smallest normal value, 2^(1 - bias): exponent field 127 + 1 - bias,
        no mantissa."""
        return (128 - self.bias) << 23

    @property
    def subnormal_spacing(self) -> float:
        return 2.0 ** (1 - self.bias - self.mantissa_bits)

    @property
    def sign_bit(self) -> int:
        return 1 << (self.exponent_bits + self.mantissa_bits)


E4M3 = MinifloatFormat(exponent_bits=4, mantissa_bits=3, bias=7, max=448.0, top="fn")  # OCP e4m3fn
E5M2 = MinifloatFormat(exponent_bits=5, mantissa_bits=2, bias=15, max=57344.0, top="ieee")
E2M1 = MinifloatFormat(exponent_bits=2, mantissa_bits=1, bias=1, max=6.0, top="finite")

FORMATS = {QuantValue.E4M3: E4M3, QuantValue.E5M2: E5M2, QuantValue.E2M1: E2M1}


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
