"""GPTQ's column loop over one lazy block in one kernel (`qcli.calibrate.gptq`, docs/arithmetic.md §7).

A program holds R rows of the lazy block's columns of W in registers and walks the columns in order: where a
group of C columns begins it fixes each row's block scale from the group's current weights (MinMax, or the
search of `_search.searched_scales`, each column weighed by its importance), then quantizes column j as the
codec does (`div_rn`, the clamp and rounding of `_arith`), spreads the column's error over the columns after
it, and writes the fields, the decoded values and the errors. The torch loop makes a dozen launches a column;
this makes one a lazy block. Rows are independent in GPTQ, so the programs never meet.
"""

import triton
import triton.language as tl

from qcli.kernels._arith import minifloat_code, stored_scale
from qcli.kernels._search import WEIGH_COLUMNS, WEIGH_NONE, minifloat_value, rint, searched_scales


@triton.jit
def _column(tile, cols, j):
    """Column j of the `[R, BW]` tile, bit for bit (a zero keeps its sign): one lane of each row picked by an
    integer sum of its bits and zeros."""
    bits = tile.to(tl.int32, bitcast=True)
    return tl.sum(tl.where(cols[None, :] == j, bits, 0), axis=1).to(tl.float32, bitcast=True)


@triton.jit
def _field_and_value(x, s, IS_FLOAT: tl.constexpr, LO: tl.constexpr, HI: tl.constexpr, EBITS: tl.constexpr,
                     MBITS: tl.constexpr, BIAS: tl.constexpr):
    """The codec's field of x at the effective scale s (`to_fields`: the integer q, or the minifloat code)
    and what it decodes to, s times its value (`dequantize`)."""
    v = tl.math.div_rn(x, s)
    v = tl.where(x == 0, x, v)  # an exact zero stays zero, also where s underflowed to zero
    v = tl.minimum(tl.maximum(v, LO), HI)
    if IS_FLOAT:
        sign = (v.to(tl.int32, bitcast=True) >> 31) & 1
        field = minifloat_code(tl.abs(v), sign, EBITS, MBITS, BIAS, HI)
        return field, s * minifloat_value(v, EBITS, MBITS, BIAS, HI)
    else:
        q = rint(v)
        return q.to(tl.int32), q * s


@triton.jit
def gptq_columns_kernel(
    w_ptr, u_ptr, fields_ptr, dequantized_ptr, errors_ptr, stored_ptr, weights_ptr, weighed_ptr, clips_ptr,
    rows, width, w_stride, u_stride, out_stride, errors_stride, stored_stride, glob,
    R: tl.constexpr, BW: tl.constexpr, C: tl.constexpr, SEARCH: tl.constexpr, WEIGH: tl.constexpr,
    J_PLAIN: tl.constexpr, J_WEIGHED: tl.constexpr, CLIP_COUNT: tl.constexpr, CANDIDATES: tl.constexpr,
    TWO_LEVEL: tl.constexpr, HALF_RANGE: tl.constexpr,
    SCALE_STEP: tl.constexpr, SCALE_FLOOR: tl.constexpr, SCALE_MAX: tl.constexpr, SCALE_EBITS: tl.constexpr,
    SCALE_MBITS: tl.constexpr, SCALE_BIAS: tl.constexpr,
    IS_FLOAT: tl.constexpr, LO: tl.constexpr, HI: tl.constexpr, EBITS: tl.constexpr, MBITS: tl.constexpr,
    BIAS: tl.constexpr,
):
    """Columns [0, width) of the lazy block at `w_ptr` (f32, `rows` rows `w_stride` apart), with U's block at
    `u_ptr` (f32 [width, width], rows `u_stride` apart): the int32 fields and f32 decoded values into
    `fields_ptr` and `dequantized_ptr` (rows `out_stride` apart), each column's error e_j = (w_j - q_j) / U_jj
    into `errors_ptr` (rows `errors_stride` apart), and each group's stored scale into `stored_ptr` (rows
    `stored_stride` apart). Groups are C columns, blocks [1, C] of W; `glob` the global of two levels. With
    WEIGH, the search weighs column c by the int32 `weights_ptr[c]` in the groups whose `weighed_ptr` flag
    is set (their weights differ: `qcli.codec.search.importance_weights`), with J_WEIGHED fixed-point bits,
    and the other groups are not weighed (J_PLAIN)."""
    tl.static_assert((BW & (BW - 1)) == 0, "BW, the lazy block's columns, must be a power of two")
    tl.static_assert(BW % C == 0, "a group must not straddle lazy blocks")
    r = tl.program_id(0) * R + tl.arange(0, R)
    cols = tl.arange(0, BW)
    row_live = r < rows
    r64 = r.to(tl.int64)
    tile = tl.load(w_ptr + r64[:, None] * w_stride + cols[None, :], mask=row_live[:, None] & (cols < width)[None, :],
                   other=0.0)
    column_weights = 1
    if WEIGH != WEIGH_NONE:
        column_weights = tl.load(weights_ptr + cols, mask=cols < width, other=1).to(tl.int64)
    s = tl.zeros((R,), tl.float32)
    for j in range(0, width):
        if j % C == 0:
            group = (cols >= j) & (cols < j + C)
            current = tl.where(group[None, :], tile, 0.0)
            alpha = tl.max(current.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=1).to(tl.float32, bitcast=True)
            if SEARCH and WEIGH != WEIGH_NONE:
                weighed = tl.load(weighed_ptr + j // C) != 0
                w = tl.where(weighed, column_weights, 1)  # weights 1: the search unweighed, its bits J_PLAIN
                stored, s = searched_scales(current[:, None, :], w[None, None, :], alpha, glob, clips_ptr, CLIP_COUNT,
                                             CANDIDATES, tl.where(weighed, J_WEIGHED, J_PLAIN), TWO_LEVEL,
                                             HALF_RANGE, SCALE_STEP, SCALE_FLOOR, SCALE_MAX, SCALE_EBITS, SCALE_MBITS,
                                             SCALE_BIAS, IS_FLOAT, LO, HI, EBITS, MBITS, BIAS, WEIGH_COLUMNS)
            elif SEARCH:
                stored, s = searched_scales(current[:, None, :], 0, alpha, glob, clips_ptr, CLIP_COUNT, CANDIDATES,
                                             J_PLAIN, TWO_LEVEL, HALF_RANGE, SCALE_STEP, SCALE_FLOOR, SCALE_MAX,
                                             SCALE_EBITS, SCALE_MBITS, SCALE_BIAS, IS_FLOAT, LO, HI, EBITS, MBITS, BIAS,
                                             WEIGH_NONE)
            else:
                stored, s = stored_scale(alpha, glob, TWO_LEVEL, HALF_RANGE, SCALE_STEP, SCALE_FLOOR, SCALE_MAX,
                                          SCALE_EBITS, SCALE_MBITS, SCALE_BIAS)
            tl.store(stored_ptr + r64 * stored_stride + j // C, stored, mask=row_live)
        x = _column(tile, cols, j)
        field, q = _field_and_value(x, s, IS_FLOAT, LO, HI, EBITS, MBITS, BIAS)
        e = tl.math.div_rn(x - q, tl.load(u_ptr + j * u_stride + j))
        tl.store(fields_ptr + r64 * out_stride + j, field, mask=row_live)
        tl.store(dequantized_ptr + r64 * out_stride + j, q, mask=row_live)
        tl.store(errors_ptr + r64 * errors_stride + j, e, mask=row_live)
        u_row = tl.load(u_ptr + j * u_stride + cols, mask=(cols > j) & (cols < width), other=0.0)
        tile = tl.where((cols > j)[None, :], tile - e[:, None] * u_row[None, :], tile)

