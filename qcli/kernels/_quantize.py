"""The kernels: block ranges, scales, and quantize-and-pack.

A tensor is viewed as rows of `C` values (`R` rows). A program of `_quantize_kernel` takes `G` groups of
`U` storage units of `N` values from one row, so a group is one `[U, N]` tile and a unit is one stored
word or byte. In the fused mode a group is exactly one block of the last axis, whose scale the program
computes itself; otherwise each value reads its effective scale from an f32 array computed beforehand
(`_alpha_kernel` then `_scales_kernel`).
"""

import triton
import triton.language as tl

from qcli.kernels._codes import (
    MIN_POSITIVE,
    SAFE_HIGH,
    SAFE_LOW,
    _one_level_scale,
    _round_up,
    _scale_bits,
    _store_scale,
    _value_field,
)

MODE_FUSED = tl.constexpr(0)    # scale per group (a block of the last axis), computed in the program
MODE_BLOCKS = tl.constexpr(1)   # scale index = row_base[row] + col // BC, computed beforehand
MODE_TENSOR = tl.constexpr(2)   # one scale for the whole tensor, computed beforehand

CAL_MINMAX = tl.constexpr(0)
CAL_ABSMEAN = tl.constexpr(1)


@triton.jit
def _range_terms(x, CAL: tl.constexpr):
    """What a block range reduces: |x| to a max (inf where x is NaN or inf, x - x is NaN exactly there),
    or |x| in float64 to a sum (which NaN and inf reach on their own)."""
    if CAL == CAL_MINMAX:
        return tl.where((x - x) == 0, tl.abs(x), float("inf"))
    else:
        return tl.abs(x).to(tl.float64)


@triton.jit
def _reduce(terms, axis: tl.constexpr, CAL: tl.constexpr):
    if CAL == CAL_MINMAX:
        return tl.max(terms, axis=axis)
    else:
        return tl.sum(terms, axis=axis)


@triton.jit
def _block_range(reduced, block, C, BC: tl.constexpr, CAL: tl.constexpr, MEAN: tl.constexpr, bad_ptr):
    """From a block's reduced terms: max |x| (MinMax), the float64 sum of |x|, or with MEAN its f32 mean
    over the values the block holds. Raises the flag at bad_ptr for a block with NaN or inf."""
    a = reduced
    bad = (a - a) != 0
    if CAL == CAL_ABSMEAN:
        if MEAN:
            count = tl.minimum(tl.maximum(C - block * BC, 0), BC).to(tl.float64)
            # f64 `/` is IEEE on every target (only f32 division is approximate on NVIDIA).
            a = (a / tl.maximum(count, 1.0)).to(tl.float32)
    tl.store(bad_ptr + block * 0, 1, mask=bad)
    return a


@triton.jit
def _global_scale(alpha_max_ptr, HALF_RANGE: tl.constexpr, DTYPE_MAX: tl.constexpr):
    """max(max over blocks of raw / D.max, MIN_POSITIVE), from the largest block range: both divisions are
    monotonic, so dividing the maximum equals the maximum of the quotients."""
    peak = tl.math.div_rn(tl.math.div_rn(tl.load(alpha_max_ptr), HALF_RANGE), DTYPE_MAX)
    return tl.maximum(peak, MIN_POSITIVE)


@triton.jit
def _stored_scale(alpha, glob, TWO_LEVEL: tl.constexpr, HALF_RANGE: tl.constexpr, KIND: tl.constexpr):
    """(stored scale, effective scale) of blocks with ranges `alpha` (docs/arithmetic.md §2)."""
    if TWO_LEVEL:
        rel = tl.math.div_rn(tl.math.div_rn(alpha, HALF_RANGE), glob)
        stored = _round_up(tl.where(rel > 0, rel, MIN_POSITIVE), KIND)
        return stored, glob * stored
    else:
        stored = _one_level_scale(alpha, HALF_RANGE, KIND)
        return stored, stored


@triton.jit
def _quantize_kernel(
    x_ptr, values_ptr, scales_ptr, global_ptr, s_eff_ptr, r_eff_ptr, safe_ptr, alpha_max_ptr, row_base_ptr,
    bad_ptr, C, units_per_row, chunks_per_row, blocks_per_row,
    BC: tl.constexpr, G: tl.constexpr, U: tl.constexpr, N: tl.constexpr, MODE: tl.constexpr,
    CAL: tl.constexpr, TWO_LEVEL: tl.constexpr, HALF_RANGE: tl.constexpr, KIND: tl.constexpr,
    SCALE_SIZE: tl.constexpr, DTYPE_MAX: tl.constexpr,
    IS_FLOAT: tl.constexpr, BITS: tl.constexpr, LO: tl.constexpr, HI: tl.constexpr,
    EBITS: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    row = pid // chunks_per_row
    block = (pid % chunks_per_row) * G + tl.arange(0, G)
    unit = block[:, None] * U + tl.arange(0, U)[None, :]
    k = tl.arange(0, N)[None, None, :]
    col = unit[:, :, None] * N + k
    inside = col < C
    x = tl.load(x_ptr + row * C + col, mask=inside, other=0.0).to(tl.float32)

    if MODE == MODE_FUSED:
        terms = _reduce(_reduce(_range_terms(x, CAL), 2, CAL), 1, CAL)
        alpha = _block_range(terms, block, C, BC, CAL, True, bad_ptr)
        glob = 1.0
        if TWO_LEVEL:
            glob = _global_scale(alpha_max_ptr, HALF_RANGE, DTYPE_MAX)
            _store_scale(global_ptr, 0, glob.to(tl.int32, bitcast=True), pid == 0, 4)
        stored, s = _stored_scale(alpha, glob, TWO_LEVEL, HALF_RANGE, KIND)
        real = block < blocks_per_row
        _store_scale(scales_ptr, row * blocks_per_row + block, _scale_bits(stored, KIND), real, SCALE_SIZE)
        checked = tl.where(real, s, 1.0)
        fast = (tl.min(checked) >= SAFE_LOW) & (tl.max(checked) <= SAFE_HIGH)
        s_eff = s[:, None, None]
        r_eff = tl.math.div_rn(1.0, s)[:, None, None]
    elif MODE == MODE_BLOCKS:
        index = tl.load(row_base_ptr + row) + col // BC
        s_eff = tl.load(s_eff_ptr + index, mask=inside, other=1.0)
        r_eff = tl.load(r_eff_ptr + index, mask=inside, other=1.0)
        fast = tl.load(safe_ptr) != 0
    else:
        s_eff = tl.load(s_eff_ptr)
        r_eff = tl.load(r_eff_ptr)
        fast = tl.load(safe_ptr) != 0

    field = _value_field(x, s_eff, r_eff, fast, IS_FLOAT, BITS, LO, HI, EBITS, MBITS, BIAS)
    field = tl.where(inside, field, 0)
    packed = tl.sum(field << (k * BITS), axis=2)
    if N * BITS == 32:
        tl.store(values_ptr + row * units_per_row + unit, packed, mask=unit < units_per_row)
    else:
        tl.store(values_ptr + row * units_per_row + unit, packed.to(tl.uint8), mask=unit < units_per_row)


@triton.jit
def _alpha_kernel(x_ptr, out_ptr, bad_ptr, C, blocks_per_row, chunks_per_row,
                  BC: tl.constexpr, G: tl.constexpr, BP: tl.constexpr, CAL: tl.constexpr,
                  PER_PROGRAM: tl.constexpr):
    """Ranges of blocks of BC values along each row: per block (max |x| in f32, or the f64 sum of |x|),
    or with PER_PROGRAM the largest f32 block range (the mean for AbsMean) of the program's G blocks."""
    pid = tl.program_id(0).to(tl.int64)
    row = pid // chunks_per_row
    block = (pid % chunks_per_row) * G + tl.arange(0, G)
    k = tl.arange(0, BP)[None, :]
    col = block[:, None] * BC + k
    inside = (k < BC) & (col < C)
    x = tl.load(x_ptr + row * C + col, mask=inside, other=0.0).to(tl.float32)
    alpha = _block_range(_reduce(_range_terms(x, CAL), 1, CAL), block, C, BC, CAL, PER_PROGRAM, bad_ptr)
    real = block < blocks_per_row
    if PER_PROGRAM:
        tl.store(out_ptr + pid, tl.max(tl.where(real, alpha, 0.0)))
    else:
        tl.store(out_ptr + row * blocks_per_row + block, alpha, mask=real)


@triton.jit
def _scales_kernel(alpha_ptr, alpha_max_ptr, scales_ptr, global_ptr, s_eff_ptr, r_eff_ptr, n,
                   BLOCK: tl.constexpr, TWO_LEVEL: tl.constexpr, HALF_RANGE: tl.constexpr,
                   KIND: tl.constexpr, SCALE_SIZE: tl.constexpr, DTYPE_MAX: tl.constexpr):
    """Stored scales (bytes into the payload), effective f32 scales and their reciprocals, from f32
    per-block ranges."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = i < n
    alpha = tl.load(alpha_ptr + i, mask=inside, other=0.0)
    glob = 1.0
    if TWO_LEVEL:
        glob = _global_scale(alpha_max_ptr, HALF_RANGE, DTYPE_MAX)
        _store_scale(global_ptr, 0, glob.to(tl.int32, bitcast=True), tl.program_id(0) == 0, 4)
    stored, s_eff = _stored_scale(alpha, glob, TWO_LEVEL, HALF_RANGE, KIND)
    _store_scale(scales_ptr, i, _scale_bits(stored, KIND), inside, SCALE_SIZE)
    tl.store(s_eff_ptr + i, s_eff, mask=inside)
    tl.store(r_eff_ptr + i, tl.math.div_rn(1.0, s_eff), mask=inside)
