"""The searched scales (`Calibration.Mse`) in the fused kernel: each block's candidates worked out, measured
and the least kept in registers, then its values quantized under it, so a searched tensor is read once as
a MinMax one is (docs/arithmetic.md §6; `qcli.codec.search` is the torch reference, `_search.c` the CPU's).

Every quotient is `div_rn`, IEEE for any scale (the candidates may be negative, or underflow to zero under
a global); integers come from the 1.5 * 2^23 trick on the bits (`rint_bits`), exact for the magnitudes
here; a candidate's error is an int64 sum of integer terms, exact in any order, so the kernel picks what
the CPU picks.
"""

import triton
import triton.language as tl

from qcli.kernels._arith import (
    RINT_BITS,
    minifloat_code,
    rescaling,
    rint_bits,
    store_scale,
    stored_scale,
)
from qcli.kernels._quantize import (
    CAL_MINMAX,
    block_range,
    global_scale,
    program,
    range_terms,
    reduce,
    store_fields,
)

WEIGH_NONE = tl.constexpr(0)
WEIGH_COLUMNS = tl.constexpr(1)  # one weight per column of the row
WEIGH_ROWS = tl.constexpr(2)     # one weight per row


@triton.jit
def rint(v):
    """RN(v) as f32, half to even, for |v| < 2^22."""
    return (rint_bits(v) - RINT_BITS).to(tl.float32)


@triton.jit
def _nearest(s, STEP: tl.constexpr, FLOOR: tl.constexpr, MAXR: tl.constexpr, EBITS: tl.constexpr,
             MBITS: tl.constexpr, BIAS: tl.constexpr):
    """`qcli.codec.scales.nearest`: a non-negative scale to its dtype's nearest grid value (ties to the even
    code, and between two powers of two to the larger), saturating at MAXR; it may round to zero.
    Constexprs as `round_up`'s."""
    if STEP == 0:
        return s
    else:
        bits = s.to(tl.int32, bitcast=True)
        if STEP == 23:  # no mantissa: ties up
            half = 1 << (STEP - 1)
        else:
            half = (1 << (STEP - 1)) - 1 + ((bits >> STEP) & 1)
        rounded = (bits + half) & ~((1 << STEP) - 1)
        if FLOOR > 0:
            low = tl.where(bits < FLOOR + (FLOOR >> 1), FLOOR, 2 * FLOOR)  # 2 * FLOOR: the bits of its double
            rounded = tl.where(bits < 2 * FLOOR, low, rounded)
        value = rounded.to(tl.float32, bitcast=True)
        if EBITS > 0:
            SUB_LIMIT: tl.constexpr = 2.0 ** (1 - BIAS)
            SUB_INV: tl.constexpr = 2.0 ** (BIAS - 1 + MBITS)
            value = tl.where(s < SUB_LIMIT, rint(s * SUB_INV) * (1.0 / SUB_INV), value)
        return tl.where(s >= MAXR, MAXR, tl.minimum(value, MAXR))


@triton.jit
def minifloat_value(v, EBITS: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr, MAXV: tl.constexpr):
    """The minifloat value nearest v (clamped to MAXV, ties to even mantissa), with v's sign: the code
    `minifloat_code` gives, decoded."""
    bits = v.to(tl.int32, bitcast=True)
    a = tl.minimum(tl.abs(v), MAXV)
    code = minifloat_code(a, 0, EBITS, MBITS, BIAS, MAXV)
    SPACING: tl.constexpr = 2.0 ** (1 - BIAS - MBITS)
    normal = (code + ((127 - BIAS) << MBITS)) << (23 - MBITS)
    magnitude = tl.where(code < (1 << MBITS), code.to(tl.float32) * SPACING, normal.to(tl.float32, bitcast=True))
    sign = (bits >> 31) & 1
    return (magnitude.to(tl.int32, bitcast=True) | (sign << 31)).to(tl.float32, bitcast=True)


@triton.jit
def _candidate_error(x, w, s, unit, IS_FLOAT: tl.constexpr, LO: tl.constexpr, HI: tl.constexpr,
                     EBITS: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr, WEIGH: tl.constexpr):
    """Σ w · RN((x − q · s) · unit)² per block of the `[G, U, N]` tile x at the blocks' effective scales s
    and units `unit` ([G]), as int64 (`qcli.codec.search.block_errors`)."""
    sb = s[:, None, None]
    v = tl.math.div_rn(x, sb)
    v = tl.where(x == 0, x, v)  # an exact zero stays zero, also where s underflowed to zero
    v = tl.minimum(tl.maximum(v, LO), HI)
    if IS_FLOAT:
        d = x - sb * minifloat_value(v, EBITS, MBITS, BIAS, HI)
    else:
        d = x - rint(v) * sb
    t = (rint_bits(d * unit[:, None, None]) - RINT_BITS).to(tl.int64)
    term = t * t
    if WEIGH != WEIGH_NONE:
        term = term * w
    return tl.sum(tl.sum(term, axis=2), axis=1)


@triton.jit
def searched_scales(x, w, alpha, glob, clips_ptr, CLIP_COUNT: tl.constexpr, CANDIDATES: tl.constexpr,
                     J, TWO_LEVEL: tl.constexpr, HALF_RANGE: tl.constexpr,
                     SCALE_STEP: tl.constexpr, SCALE_FLOOR: tl.constexpr, SCALE_MAX: tl.constexpr,
                     SCALE_EBITS: tl.constexpr, SCALE_MBITS: tl.constexpr, SCALE_BIAS: tl.constexpr,
                     IS_FLOAT: tl.constexpr, LO: tl.constexpr, HI: tl.constexpr, EBITS: tl.constexpr,
                     MBITS: tl.constexpr, BIAS: tl.constexpr, WEIGH: tl.constexpr):
    """Each block's candidate of least error (the first of equal ones), stored and effective, for blocks of
    largest magnitude `alpha` ([G]) under the global `glob` (two levels): `qcli.codec.search.candidates`
    in its order (MinMax's scale; the clips of `alpha / h`; both ends of an unequal range; on a signed
    dtype the negative scales onto the longer end), the first CANDIDATES of them (`candidate_count`); J
    the fixed-point bits of the errors (a constexpr, or a value where it differs from block to block)."""
    exponent = (alpha.to(tl.int32, bitcast=True) >> 23) - 127
    unit = (tl.minimum(tl.maximum(127 + J - exponent, 1), 254) << 23).to(tl.float32, bitcast=True)
    first, first_effective = stored_scale(alpha, glob, TWO_LEVEL, HALF_RANGE, SCALE_STEP, SCALE_FLOOR, SCALE_MAX,
                                           SCALE_EBITS, SCALE_MBITS, SCALE_BIAS)
    best = _candidate_error(x, w, first_effective, unit, IS_FLOAT, LO, HI, EBITS, MBITS, BIAS, WEIGH)
    stored, effective = first, first_effective
    A: tl.constexpr = LO * 1.0
    B: tl.constexpr = HI * 1.0
    for k in range(1, CANDIDATES):
        if k <= CLIP_COUNT:
            part = tl.math.div_rn(alpha, HALF_RANGE) * tl.load(clips_ptr + k - 1)
        elif k == CLIP_COUNT + 1:
            part = tl.math.div_rn(alpha, B)
        elif k == CLIP_COUNT + 2:
            part = tl.math.div_rn(alpha, -A)
        elif k == CLIP_COUNT + 3:
            part = tl.math.div_rn(alpha, A)
        else:
            part = tl.math.div_rn(alpha, A) * tl.load(clips_ptr + k - CLIP_COUNT - 4)
        relative = part
        if TWO_LEVEL:
            relative = tl.math.div_rn(part, glob)
        rounded = _nearest(tl.abs(relative), SCALE_STEP, SCALE_FLOOR, SCALE_MAX, SCALE_EBITS, SCALE_MBITS,
                           SCALE_BIAS)
        sign = (relative.to(tl.int32, bitcast=True) >> 31) & 1
        signed = (rounded.to(tl.int32, bitcast=True) | (sign << 31)).to(tl.float32, bitcast=True)
        candidate = tl.where(rounded > 0, signed, first)
        candidate_effective = candidate
        if TWO_LEVEL:
            candidate_effective = glob * candidate
        error = _candidate_error(x, w, candidate_effective, unit, IS_FLOAT, LO, HI, EBITS, MBITS, BIAS, WEIGH)
        better = error < best
        best = tl.where(better, error, best)
        stored = tl.where(better, candidate, stored)
        effective = tl.where(better, candidate_effective, effective)
    return stored, effective


@triton.jit
def _stored_bits(stored, STEP: tl.constexpr, MAXR: tl.constexpr, EBITS: tl.constexpr, MBITS: tl.constexpr,
                 BIAS: tl.constexpr):
    """`_arith.scale_bits` for a scale that may be negative: a minifloat dtype's code with the sign bit,
    or a cut-short f32's top bits (which hold the sign already)."""
    if EBITS > 0:
        sign = (stored.to(tl.int32, bitcast=True) >> 31) & 1
        return minifloat_code(tl.abs(stored), sign, EBITS, MBITS, BIAS, MAXR)
    else:
        return stored.to(tl.int32, bitcast=True) >> STEP


@triton.jit
def quantize_searched_kernel(
    x_ptr, values_ptr, scales_ptr, global_ptr, alpha_max_ptr, bad_ptr, weights_ptr, clips_ptr, C, units_per_row,
    chunks_per_row, blocks_per_row,
    BC: tl.constexpr, G: tl.constexpr, U: tl.constexpr, N: tl.constexpr, TWO_LEVEL: tl.constexpr,
    HALF_RANGE: tl.constexpr, CLIP_COUNT: tl.constexpr, CANDIDATES: tl.constexpr, J: tl.constexpr,
    WEIGH: tl.constexpr,
    SCALE_STEP: tl.constexpr, SCALE_FLOOR: tl.constexpr, SCALE_MAX: tl.constexpr, SCALE_EBITS: tl.constexpr,
    SCALE_MBITS: tl.constexpr, SCALE_BIAS: tl.constexpr, SCALE_SIZE: tl.constexpr,
    IS_FLOAT: tl.constexpr, BITS: tl.constexpr, LO: tl.constexpr, HI: tl.constexpr,
    EBITS: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr, EVEN: tl.constexpr, SAFE: tl.constexpr,
):
    """`quantize_fused_kernel` under `Calibration.Mse`: each group one block of BC values along the last
    axis, its range, its searched scale (`searched_scales`; into `scales_ptr`, and for two levels
    MinMax's global into `global_ptr` from the largest block range at `alpha_max_ptr`), then its values.
    WEIGH: each element's error weighed by the int32 weight of its column or row at `weights_ptr`."""
    tl.static_assert(BC == U * N, "a group is one block: BC values, U whole units of N")
    row, group, unit, local, start, inside, x = program(x_ptr, C, chunks_per_row, G, U, N, EVEN)
    block = group + tl.arange(0, G)
    terms = reduce(reduce(range_terms(x, CAL_MINMAX), 2, CAL_MINMAX), 1, CAL_MINMAX)
    alpha = block_range(terms, block, C, BC, CAL_MINMAX, False, bad_ptr)
    w = 0
    if WEIGH == WEIGH_COLUMNS:
        w = tl.load(weights_ptr + start + local, mask=inside, other=0).to(tl.int64)
    elif WEIGH == WEIGH_ROWS:
        w = tl.load(weights_ptr + row).to(tl.int64)
    glob = 1.0
    if TWO_LEVEL:
        glob = global_scale(alpha_max_ptr, HALF_RANGE, SCALE_MAX)
        store_scale(global_ptr, 0, glob.to(tl.int32, bitcast=True), tl.program_id(0) == 0, 4)
    stored, s = searched_scales(x, w, alpha, glob, clips_ptr, CLIP_COUNT, CANDIDATES, J, TWO_LEVEL,
                                 HALF_RANGE, SCALE_STEP, SCALE_FLOOR, SCALE_MAX, SCALE_EBITS, SCALE_MBITS,
                                 SCALE_BIAS, IS_FLOAT, LO, HI, EBITS, MBITS, BIAS, WEIGH)
    bits = _stored_bits(stored, SCALE_STEP, SCALE_MAX, SCALE_EBITS, SCALE_MBITS, SCALE_BIAS)
    store_scale(scales_ptr, row * blocks_per_row + block, bits, block < blocks_per_row, SCALE_SIZE)
    if not SAFE:
        p = rescaling(s)
        s = s * p
        x = x * p[:, None, None]
    r = tl.math.div_rn(1.0, s)
    store_fields(x, s[:, None, None], r[:, None, None], inside, values_ptr, row, group, unit, units_per_row,
                  G, U, N, IS_FLOAT, BITS, LO, HI, EBITS, MBITS, BIAS, EVEN)

