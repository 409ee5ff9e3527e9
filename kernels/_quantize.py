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
    _one_level_scale,
    _rescaling,
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
    """What a block range reduces: the bits of |x| to a max (as integers they order like |x|, and NaN and
    inf order above every finite value), or |x| in float64 to a sum (which NaN and inf reach on their own)."""
    if CAL == CAL_MINMAX:
        return x.to(tl.int32, bitcast=True) & 0x7FFFFFFF
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
    if CAL == CAL_MINMAX:
        bad = reduced >= 0x7F800000
        a = reduced.to(tl.float32, bitcast=True)
    else:
        bad = (reduced - reduced) != 0
        a = reduced
        if MEAN:
            count = tl.minimum(tl.maximum(C - block * BC, 0), BC).to(tl.float64)
            # f64 `/` is IEEE on every target (only f32 division is approximate on NVIDIA).
            a = (a / tl.maximum(count, 1.0)).to(tl.float32)
    tl.store(bad_ptr + block * 0, 1, mask=bad)
    return a


@triton.jit
def _load(pointers, inside, other, EVEN: tl.constexpr):
    """tl.load, masked by `inside` unless the launch says every tile is whole (EVEN)."""
    if EVEN:
        return tl.load(pointers)
    else:
        return tl.load(pointers, mask=inside, other=other)


@triton.jit
def _left(remaining, TILE: tl.constexpr):
    """How many of a tile's TILE elements lie inside, as int32 (`remaining` may be int64)."""
    return tl.minimum(remaining, TILE).to(tl.int32)


@triton.jit
def _tile(first_unit, U: tl.constexpr, N: tl.constexpr, G: tl.constexpr):
    """A program's `[G, U]` storage units and `[G, U, N]` values as int32 offsets from its first unit
    (`first_unit`, int64), and the first value's offset: per-value index arithmetic stays 32-bit."""
    unit = tl.arange(0, G)[:, None] * U + tl.arange(0, U)[None, :]
    return unit, unit[:, :, None] * N + tl.arange(0, N)[None, None, :], first_unit * N


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
    x_ptr, values_ptr, scales_ptr, global_ptr, s_eff_ptr, r_eff_ptr, alpha_max_ptr, row_base_ptr,
    bad_ptr, C, units_per_row, chunks_per_row, blocks_per_row,
    BC: tl.constexpr, G: tl.constexpr, U: tl.constexpr, N: tl.constexpr, MODE: tl.constexpr,
    CAL: tl.constexpr, TWO_LEVEL: tl.constexpr, HALF_RANGE: tl.constexpr, KIND: tl.constexpr,
    SCALE_SIZE: tl.constexpr, DTYPE_MAX: tl.constexpr,
    IS_FLOAT: tl.constexpr, BITS: tl.constexpr, LO: tl.constexpr, HI: tl.constexpr,
    EBITS: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr, EVEN: tl.constexpr, SAFE: tl.constexpr,
):
    """EVEN: every program's tile lies wholly inside its row, so nothing is masked. SAFE: every scale the
    scheme can produce lies where `_quotient` is exact, so none is rescaled (`_rescaling`)."""
    pid = tl.program_id(0).to(tl.int64)
    row = pid // chunks_per_row
    group = (pid % chunks_per_row) * G
    unit, local, start = _tile(group * U, U, N, G)
    inside = local < _left(C - start, G * U * N)
    x = _load(x_ptr + row * C + start + local, inside, 0.0, EVEN).to(tl.float32)

    if MODE == MODE_FUSED:
        block = group + tl.arange(0, G)
        terms = _reduce(_reduce(_range_terms(x, CAL), 2, CAL), 1, CAL)
        alpha = _block_range(terms, block, C, BC, CAL, True, bad_ptr)
        glob = 1.0
        if TWO_LEVEL:
            glob = _global_scale(alpha_max_ptr, HALF_RANGE, DTYPE_MAX)
            _store_scale(global_ptr, 0, glob.to(tl.int32, bitcast=True), pid == 0, 4)
        stored, s = _stored_scale(alpha, glob, TWO_LEVEL, HALF_RANGE, KIND)
        real = block < blocks_per_row
        _store_scale(scales_ptr, row * blocks_per_row + block, _scale_bits(stored, KIND), real, SCALE_SIZE)
        if not SAFE:
            p = _rescaling(s)
            s = s * p
            x = x * p[:, None, None]
        s_eff = s[:, None, None]
        r_eff = tl.math.div_rn(1.0, s)[:, None, None]
    elif MODE == MODE_BLOCKS:
        # the scale of column start + local, without 64-bit arithmetic per value
        first = tl.load(row_base_ptr + row) + start // BC
        index = ((start % BC).to(tl.int32) + local) // BC
        s_eff = _load(s_eff_ptr + first + index, inside, 1.0, EVEN)
        r_eff = _load(r_eff_ptr + first + index, inside, 1.0, EVEN)
    else:
        s_eff = tl.load(s_eff_ptr)
        r_eff = tl.load(r_eff_ptr)
    if MODE != MODE_FUSED and not SAFE:  # r_eff is already the reciprocal of the rescaled scale
        p = _rescaling(s_eff)
        s_eff = s_eff * p
        x = x * p

    field = _value_field(x, s_eff, r_eff, IS_FLOAT, BITS, LO, HI, EBITS, MBITS, BIAS)
    if not EVEN:
        field = tl.where(inside, field, 0)
    packed = tl.sum(field << (tl.arange(0, N)[None, None, :] * BITS), axis=2)
    if N * BITS != 32:
        packed = packed.to(tl.uint8)
    units = values_ptr + row * units_per_row + group * U + unit
    if EVEN:
        tl.store(units, packed)
    else:
        tl.store(units, packed, mask=unit < _left(units_per_row - group * U, G * U))


@triton.jit
def _alpha_kernel(x_ptr, out_ptr, bad_ptr, C, blocks_per_row, chunks_per_row,
                  BC: tl.constexpr, G: tl.constexpr, BP: tl.constexpr, CAL: tl.constexpr,
                  PER_PROGRAM: tl.constexpr):
    """Ranges of blocks of BC values along each row: per block (max |x| in f32, or the f64 sum of |x|),
    or with PER_PROGRAM the largest f32 block range (the mean for AbsMean) of the program's G blocks."""
    pid = tl.program_id(0).to(tl.int64)
    row = pid // chunks_per_row
    group = (pid % chunks_per_row) * G
    block = group + tl.arange(0, G)
    k = tl.arange(0, BP)[None, :]
    col = tl.arange(0, G)[:, None] * BC + k  # int32, from the program's first value
    start = group * BC
    inside = (k < BC) & (col < _left(C - start, G * BC))
    x = tl.load(x_ptr + row * C + start + col, mask=inside, other=0.0).to(tl.float32)
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
    """Stored scales (bytes into the payload), effective f32 scales, and the reciprocals of the effective
    scales brought into range (`_rescaling`), from f32 per-block ranges."""
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
    tl.store(r_eff_ptr + i, tl.math.div_rn(1.0, s_eff * _rescaling(s_eff)), mask=inside)
