"""Element-wise arithmetic shared by the kernels: division, rounding, value fields, scale rounding and bits.

Everything here is plain arithmetic, bit operations and `tl.math.div_rn`, so the same code runs compiled
on a GPU and under TRITON_INTERPRET=1 (libdevice is not available to the interpreter).
"""

import os

import triton
import triton.language as tl

MIN_POSITIVE = tl.constexpr(1.1754943508222875e-38)  # f32::MIN_POSITIVE, the floor of every scale
# Scales within which the reciprocal and the residual of `quotient` neither overflow nor lose bits.
SAFE_LOW = tl.constexpr(2.0**-125)
SAFE_HIGH = tl.constexpr(2.0**125)
RESCALE_UP = tl.constexpr(2.0**64)
RESCALE_DOWN = tl.constexpr(2.0**-64)


@triton.jit
def rint_bits(v):
    """The bits of RN(v) + 1.5 * 2^23, for |v| < 2^22: adding 1.5 * 2^23 leaves no fraction bits (IEEE rounds
    half to even), and the sum's low 22 bits are RN(v) in two's complement, so a field needs no conversion."""
    return (v + 12582912.0).to(tl.int32, bitcast=True)


RINT_BITS = tl.constexpr(0x4B400000)  # the bits of 1.5 * 2^23: `rint_bits(v) - RINT_BITS` is RN(v)


@triton.jit
def minifloat_code(a, sign, EBITS: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr, MAXV: tl.constexpr):
    """The nearest code (ties to even mantissa) of the magnitude `a` clamped to MAXV, with `sign` (0 or 1,
    int32) as its top bit, so -0 keeps its sign."""
    a = tl.minimum(a, MAXV)
    mag = a.to(tl.int32, bitcast=True)
    SHIFT: tl.constexpr = 23 - MBITS
    # Normal range: round the f32 mantissa to MBITS bits on the bit pattern, then rebias the exponent.
    rounded = mag + ((1 << (SHIFT - 1)) - 1) + ((mag >> SHIFT) & 1)
    normal = (rounded >> SHIFT) - ((127 - BIAS) << MBITS)
    # Subnormal range: multiples of 2^(1 - BIAS - MBITS); scaling by a power of two is exact.
    MIN_NORMAL: tl.constexpr = 2.0 ** (1 - BIAS)
    SUB_INV: tl.constexpr = 2.0 ** (BIAS - 1 + MBITS)
    sub = rint_bits(a * SUB_INV) - RINT_BITS
    code = tl.where(a < MIN_NORMAL, sub, normal)
    return code | (sign << (EBITS + MBITS))


# Triton's interpreter evaluates tl.fma as a rounded product plus an addend (runtime/interpreter.py,
# `create_fma`), which breaks the exact residual `quotient` relies on; there it divides instead.
FUSED_FMA = tl.constexpr(os.environ.get("TRITON_INTERPRET") != "1")


@triton.jit
def quotient(x, s, r):
    """RN(x / s) from r = RN(1 / s), for s in [SAFE_LOW, SAFE_HIGH] (Markstein): the residual
    x - q * s is exact in a fused multiply-add, and one correction step rounds correctly. Quotients that
    underflow may come out off by an ulp or with the wrong sign of zero; every caller takes the sign from x
    and such magnitudes quantize to zero either way."""
    if FUSED_FMA:
        q = x * r
        return tl.fma(tl.fma(-q, s, x), r, q)
    else:
        return tl.math.div_rn(x, s)


@triton.jit
def rescaling(s):
    """A power of two p that brings the scale s (negative ones too: a searched scale may be) into
    [SAFE_LOW, SAFE_HIGH] in magnitude, where `quotient` is exact; x / s = (x * p) / (s * p). The product
    x * p is exact wherever it matters: below SAFE_LOW the block's values are tiny as well (at most its
    count times the half range times |s|), so x * 2^64 cannot overflow; above SAFE_HIGH, x * 2^-64 rounds
    only for |x| < 2^-62, whose quotient (under 2^-187) quantizes to zero either way."""
    a = tl.abs(s)
    return tl.where(a < SAFE_LOW, RESCALE_UP, tl.where(a > SAFE_HIGH, RESCALE_DOWN, 1.0))


@triton.jit
def value_field(x, s_eff, r_eff, IS_FLOAT: tl.constexpr, BITS: tl.constexpr, LO: tl.constexpr,
                 HI: tl.constexpr, EBITS: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr):
    """The stored field (low BITS bits, as int32) of RN(x / s_eff), from r_eff = RN(1 / s_eff), for s_eff in
    [SAFE_LOW, SAFE_HIGH] (`rescaling`)."""
    v = quotient(x, s_eff, r_eff)
    if IS_FLOAT:
        # the sign of x / s is the sign of x, also where the quotient underflows to zero
        sign = (x.to(tl.int32, bitcast=True) >> 31) & 1
        return minifloat_code(tl.abs(v), sign, EBITS, MBITS, BIAS, HI)
    else:
        return rint_bits(tl.minimum(tl.maximum(v, LO), HI)) & ((1 << BITS) - 1)


@triton.jit
def round_up(s, STEP: tl.constexpr, FLOOR: tl.constexpr, MAXR: tl.constexpr, EBITS: tl.constexpr,
              MBITS: tl.constexpr, BIAS: tl.constexpr):
    """Round a positive f32 scale up onto its dtype's grid, saturating at MAXR; NaN stays NaN. The grid is
    `qcli.scheme.ScaleTraits` as constexprs (`qcli.kernels.launch`): STEP its `step_bits`, FLOOR the f32 bits
    of its `floor` (0 for none), EBITS, MBITS and BIAS its minifloat's fields (EBITS 0 for none)."""
    if STEP == 0:  # every f32 is on the grid
        return s
    else:
        bits = s.to(tl.int32, bitcast=True)
        up = (bits + ((1 << STEP) - 1)) & ~((1 << STEP) - 1)
        if FLOOR > 0:
            # cubecl `round_up_to_power_of_two`: nothing below the floor, compared on the bits (a non-negative
            # f32 orders like them), so no subnormal constant or comparison is involved
            up = tl.where(bits <= FLOOR, FLOOR, up)
        up = up.to(tl.float32, bitcast=True)
        if EBITS > 0:
            # below the minifloat's smallest normal, ceil(s / spacing) * spacing; s / spacing < 2^MBITS is
            # exact and fits an int32
            SUB_LIMIT: tl.constexpr = 2.0 ** (1 - BIAS)
            SUB_INV: tl.constexpr = 2.0 ** (BIAS - 1 + MBITS)
            t = s * SUB_INV
            ti = t.to(tl.int32)
            ceil = tl.where(ti.to(tl.float32) < t, ti + 1, ti).to(tl.float32)
            up = tl.where(s < SUB_LIMIT, ceil * (1.0 / SUB_INV), up)
        # saturate comparing s: a step as wide as the mantissa carries the largest values past the maximum
        return tl.where(s != s, s, tl.where(s >= MAXR, MAXR, up))


@triton.jit
def scale_bits(stored, STEP: tl.constexpr, MAXR: tl.constexpr, EBITS: tl.constexpr, MBITS: tl.constexpr,
                BIAS: tl.constexpr):
    """The little-endian storage bits of a scale already on its dtype's grid (constexprs as `round_up`'s):
    its minifloat's code, or the f32's top bits (cubecl `f32_to_ue8m0` for UE8M0: the exponent field, 0 for
    the subnormal 2^-127; a NaN's exponent field is already 0xFF, its code)."""
    if EBITS > 0:
        return minifloat_code(stored, 0, EBITS, MBITS, BIAS, MAXR)
    else:
        return stored.to(tl.int32, bitcast=True) >> STEP


@triton.jit
def store_scale(ptr, index, bits, mask, SIZE: tl.constexpr):
    """Write SIZE little-endian bytes of `bits` at byte `index * SIZE` (scales need not be aligned)."""
    for b in tl.static_range(SIZE):
        tl.store(ptr + index * SIZE + b, ((bits >> (8 * b)) & 0xFF).to(tl.uint8), mask=mask)


@triton.jit
def stored_scale(alpha, glob, TWO_LEVEL: tl.constexpr, HALF_RANGE: tl.constexpr, STEP: tl.constexpr,
                  FLOOR: tl.constexpr, MAXR: tl.constexpr, EBITS: tl.constexpr, MBITS: tl.constexpr,
                  BIAS: tl.constexpr):
    """(stored scale, effective scale) of blocks with ranges `alpha` (docs/arithmetic.md §2): round_up(alpha /
    h), relative to the global `glob` for two levels, with MIN_POSITIVE for an all-zero block."""
    raw = tl.math.div_rn(alpha, HALF_RANGE)
    if TWO_LEVEL:
        raw = tl.math.div_rn(raw, glob)
    stored = round_up(tl.where(raw > 0, raw, MIN_POSITIVE), STEP, FLOOR, MAXR, EBITS, MBITS, BIAS)
    if TWO_LEVEL:
        return stored, glob * stored
    else:
        return stored, stored
