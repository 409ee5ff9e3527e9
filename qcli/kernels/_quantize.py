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
    _round_up,
    _scale_bits,
    _store_scale,
    _value_field,
)

MODE_FUSED = tl.constexpr(0)    # scale per group, computed in the program
MODE_BLOCKS = tl.constexpr(1)   # scale index = row_base[row] + col // BC
MODE_TENSOR = tl.constexpr(2)   # one scale for the whole tensor

CAL_MINMAX = tl.constexpr(0)
CAL_ABSMEAN = tl.constexpr(1)


@triton.jit
def _quantize_kernel(
    x_ptr, values_ptr, scales_ptr, s_eff_ptr, row_base_ptr, bad_ptr,
    C, units_per_row, chunks_per_row, BC, blocks_per_row,
    G: tl.constexpr, U: tl.constexpr, N: tl.constexpr, MODE: tl.constexpr, CAL: tl.constexpr,
    HALF_RANGE: tl.constexpr, KIND: tl.constexpr, SCALE_SIZE: tl.constexpr,
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
    # x - x is 0 for finite x and NaN for NaN and +-inf: one flag for the launch wrapper to report.
    tl.store(bad_ptr, 1, mask=tl.sum(tl.where((x - x) == 0, 0, 1)) > 0)

    if MODE == MODE_FUSED:
        if CAL == CAL_MINMAX:
            alpha = tl.max(tl.max(tl.abs(x), axis=2), axis=1)
        else:
            total = tl.sum(tl.sum(tl.abs(x).to(tl.float64), axis=2), axis=1)
            count = tl.minimum(tl.maximum(C - block * BC, 0), BC).to(tl.float64)
            # f64 `/` is IEEE on every target (only f32 division is approximate on NVIDIA).
            alpha = (total / tl.maximum(count, 1.0)).to(tl.float32)
        stored = _one_level_scale(alpha, HALF_RANGE, KIND)
        _store_scale(scales_ptr, row * blocks_per_row + block, _scale_bits(stored, KIND),
                     block < blocks_per_row, SCALE_SIZE)
        s_eff = stored[:, None, None]
    elif MODE == MODE_BLOCKS:
        base = tl.load(row_base_ptr + row)
        s_eff = tl.load(s_eff_ptr + base + col // BC, mask=inside, other=1.0)
    else:
        s_eff = tl.load(s_eff_ptr)

    field = _value_field(x, s_eff, IS_FLOAT, BITS, LO, HI, EBITS, MBITS, BIAS)
    field = tl.where(inside, field, 0)
    packed = tl.sum(field << (k * BITS), axis=2)
    if N * BITS == 32:
        tl.store(values_ptr + row * units_per_row + unit, packed, mask=unit < units_per_row)
    else:
        tl.store(values_ptr + row * units_per_row + unit, packed.to(tl.uint8), mask=unit < units_per_row)


@triton.jit
def _alpha_kernel(x_ptr, out_ptr, C, BC, blocks_per_row, chunks_per_row,
                  G: tl.constexpr, BP: tl.constexpr, CAL: tl.constexpr):
    """Per (row, block of BC values along the row): max |x| (f32), or sum |x| in f64 for AbsMean."""
    pid = tl.program_id(0).to(tl.int64)
    row = pid // chunks_per_row
    block = (pid % chunks_per_row) * G + tl.arange(0, G)
    k = tl.arange(0, BP)[None, :]
    col = block[:, None] * BC + k
    inside = (k < BC) & (col < C)
    x = tl.abs(tl.load(x_ptr + row * C + col, mask=inside, other=0.0).to(tl.float32))
    if CAL == CAL_MINMAX:
        alpha = tl.max(x, axis=1)
    else:
        alpha = tl.sum(x.to(tl.float64), axis=1)
    tl.store(out_ptr + row * blocks_per_row + block, alpha, mask=block < blocks_per_row)


@triton.jit
def _scales_kernel(alpha_ptr, alpha_max_ptr, scales_ptr, global_ptr, s_eff_ptr, n,
                   BLOCK: tl.constexpr, TWO_LEVEL: tl.constexpr, HALF_RANGE: tl.constexpr,
                   KIND: tl.constexpr, SCALE_SIZE: tl.constexpr, DTYPE_MAX: tl.constexpr):
    """Stored scales (bytes into the payload) and effective f32 scales from f32 per-block ranges."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = i < n
    alpha = tl.load(alpha_ptr + i, mask=inside, other=0.0)
    if TWO_LEVEL:
        # max over blocks of raw / D.max equals (max alpha / h) / D.max: both divisions are monotonic.
        peak = tl.math.div_rn(tl.math.div_rn(tl.load(alpha_max_ptr), HALF_RANGE), DTYPE_MAX)
        glob = tl.maximum(peak, MIN_POSITIVE)
        rel = tl.math.div_rn(tl.math.div_rn(alpha, HALF_RANGE), glob)
        stored = _round_up(tl.where(rel > 0, rel, MIN_POSITIVE), KIND)
        s_eff = glob * stored
        _store_scale(global_ptr, 0, glob.to(tl.int32, bitcast=True), tl.program_id(0) == 0, 4)
    else:
        stored = _one_level_scale(alpha, HALF_RANGE, KIND)
        s_eff = stored
    _store_scale(scales_ptr, i, _scale_bits(stored, KIND), inside, SCALE_SIZE)
    tl.store(s_eff_ptr + i, s_eff, mask=inside)
