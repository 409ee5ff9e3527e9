"""The kernels: block ranges, scales, and quantize-and-pack.

A tensor is viewed as rows of `C` values (`R` rows). A program of a quantize kernel takes `G` groups of
`U` storage units of `N` values from one row, so a group is one `[U, N]` tile and a unit is one stored
word or byte. `quantize_fused_kernel` takes groups that are exactly one block of the last axis each, and
computes their scales itself; `quantize_blocks_kernel` reads each value's effective scale from an f32
array computed beforehand (`alpha_kernel` then `scales_kernel`), one per block; `quantize_tensor_kernel`
works the tensor's one scale out from its range. The three share the tile, the value fields and the
packing.

Constexpr arguments name a value type's traits (IS_FLOAT, BITS, LO, HI, EBITS, MBITS, BIAS) and a scale
dtype's (SCALE_*), both from `qcli.scheme` rows (`qcli.kernels.launch`).
"""

import triton
import triton.language as tl

from qcli.kernels._arith import (
    MIN_POSITIVE,
    rescaling,
    scale_bits,
    store_scale,
    stored_scale,
    value_field,
)

CAL_MINMAX = tl.constexpr(0)
CAL_ABSMEAN = tl.constexpr(1)


@triton.jit
def range_terms(x, CAL: tl.constexpr):
    """What a block range reduces: the bits of |x| to a max (as integers they order like |x|, and NaN and
    inf order above every finite value), or |x| in float64 to a sum (which NaN and inf reach on their own)."""
    if CAL == CAL_MINMAX:
        return x.to(tl.int32, bitcast=True) & 0x7FFFFFFF
    else:
        return tl.abs(x).to(tl.float64)


@triton.jit
def reduce(terms, axis: tl.constexpr, CAL: tl.constexpr):
    if CAL == CAL_MINMAX:
        return tl.max(terms, axis=axis)
    else:
        return tl.sum(terms, axis=axis)


@triton.jit
def block_range(reduced, block, C, BC: tl.constexpr, CAL: tl.constexpr, MEAN: tl.constexpr, bad_ptr):
    """From a block's reduced terms: max |x| (MinMax), the float64 sum of |x|, or with MEAN its f32 mean
    over the values the block holds. Raises the flag at bad_ptr for a block with NaN or inf."""
    if CAL == CAL_MINMAX:
        bad = reduced >= 0x7F800000  # the bits of inf; NaN's order above them
        a = reduced.to(tl.float32, bitcast=True)
    else:
        # x - x is 0 for every finite x, and NaN for inf and NaN: no isfinite needed
        bad = (reduced - reduced) != 0
        a = reduced
        if MEAN:
            count = tl.minimum(tl.maximum(C - block * BC, 0), BC).to(tl.float64)
            # f64 `/` is IEEE on every target (only f32 division is approximate on NVIDIA).
            a = (a / tl.maximum(count, 1.0)).to(tl.float32)
    # `block * 0` gives the one flag pointer the shape of `bad`, so the masked store takes one lane per block
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
def program(x_ptr, C, chunks_per_row, G: tl.constexpr, U: tl.constexpr, N: tl.constexpr, EVEN: tl.constexpr):
    """This program's tile: its row, its first group, its `[G, U]` storage units and `[G, U, N]` values as
    int32 offsets from its first unit and value (per-value index arithmetic stays 32-bit), the first value's
    offset in the row, which values lie inside the row, and the values in f32."""
    tl.static_assert((G & (G - 1)) == 0, "G, groups per program, must be a power of two")
    tl.static_assert((U & (U - 1)) == 0, "U, units per group, must be a power of two")
    pid = tl.program_id(0).to(tl.int64)
    row = pid // chunks_per_row
    group = (pid % chunks_per_row) * G
    unit = tl.arange(0, G)[:, None] * U + tl.arange(0, U)[None, :]
    local = unit[:, :, None] * N + tl.arange(0, N)[None, None, :]
    start = group * U * N
    inside = local < _left(C - start, G * U * N)
    x = _load(x_ptr + row * C + start + local, inside, 0.0, EVEN).to(tl.float32)
    return row, group, unit, local, start, inside, x


@triton.jit
def _packed(x, s_eff, r_eff, inside, N: tl.constexpr, IS_FLOAT: tl.constexpr, BITS: tl.constexpr,
            LO: tl.constexpr, HI: tl.constexpr, EBITS: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr,
            EVEN: tl.constexpr):
    """The tile's values quantized (`value_field`) and packed along its last axis of N, N fields of BITS bits
    to a unit, the first in the least significant bits; values outside the tensor pack as zero fields."""
    tl.static_assert((N * BITS == 8) | (N * BITS == 32), "a storage unit is one byte or one u32 word")
    field = value_field(x, s_eff, r_eff, IS_FLOAT, BITS, LO, HI, EBITS, MBITS, BIAS)
    if not EVEN:
        field = tl.where(inside, field, 0)
    packed = tl.sum(field << (tl.arange(0, N) * BITS), axis=-1)
    if N * BITS != 32:
        packed = packed.to(tl.uint8)
    return packed


@triton.jit
def store_fields(x, s_eff, r_eff, inside, values_ptr, row, group, unit, units_per_row, G: tl.constexpr,
                  U: tl.constexpr, N: tl.constexpr, IS_FLOAT: tl.constexpr, BITS: tl.constexpr, LO: tl.constexpr,
                  HI: tl.constexpr, EBITS: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr,
                  EVEN: tl.constexpr):
    """Store the `[G, U, N]` tile of one row packed (`_packed`) into its `[G, U]` units."""
    packed = _packed(x, s_eff, r_eff, inside, N, IS_FLOAT, BITS, LO, HI, EBITS, MBITS, BIAS, EVEN)
    units = values_ptr + row * units_per_row + group * U + unit
    if EVEN:
        tl.store(units, packed)
    else:
        tl.store(units, packed, mask=unit < _left(units_per_row - group * U, G * U))


@triton.jit
def _store_gathered(x, s_eff, r_eff, inside, values_ptr, row, group, unit, units_per_row, G: tl.constexpr,
                    U: tl.constexpr, N: tl.constexpr, IS_FLOAT: tl.constexpr, BITS: tl.constexpr, LO: tl.constexpr,
                    HI: tl.constexpr, EBITS: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr,
                    EVEN: tl.constexpr, SAFE: tl.constexpr):
    """`store_fields` under effective scales computed beforehand (`scales_kernel`), whose reciprocals
    r_eff are already those of the rescaled scales: without SAFE, only s_eff and x are rescaled here."""
    if not SAFE:
        p = rescaling(s_eff)
        s_eff = s_eff * p
        x = x * p
    store_fields(x, s_eff, r_eff, inside, values_ptr, row, group, unit, units_per_row, G, U, N, IS_FLOAT, BITS,
                  LO, HI, EBITS, MBITS, BIAS, EVEN)


@triton.jit
def global_scale(alpha_max_ptr, HALF_RANGE: tl.constexpr, MAXR: tl.constexpr):
    """max(max over blocks of raw / MAXR, MIN_POSITIVE), from the largest block range: both divisions are
    monotonic, so dividing the maximum equals the maximum of the quotients."""
    peak = tl.math.div_rn(tl.math.div_rn(tl.load(alpha_max_ptr), HALF_RANGE), MAXR)
    return tl.maximum(peak, MIN_POSITIVE)


@triton.jit
def _store_block_scales(alpha, index, mask, scales_ptr, global_ptr, alpha_max_ptr, TWO_LEVEL: tl.constexpr,
                        HALF_RANGE: tl.constexpr, SCALE_STEP: tl.constexpr, SCALE_FLOOR: tl.constexpr,
                        SCALE_MAX: tl.constexpr, SCALE_EBITS: tl.constexpr, SCALE_MBITS: tl.constexpr,
                        SCALE_BIAS: tl.constexpr, SCALE_SIZE: tl.constexpr):
    """Store the scales of blocks with ranges `alpha` at scale `index` where `mask` holds, and for two
    levels the global (program 0 writes it, from the largest block range at alpha_max_ptr); return the
    effective scales."""
    glob = 1.0
    if TWO_LEVEL:
        glob = global_scale(alpha_max_ptr, HALF_RANGE, SCALE_MAX)
        store_scale(global_ptr, 0, glob.to(tl.int32, bitcast=True), tl.program_id(0) == 0, 4)
    stored, effective = stored_scale(alpha, glob, TWO_LEVEL, HALF_RANGE, SCALE_STEP, SCALE_FLOOR, SCALE_MAX,
                                      SCALE_EBITS, SCALE_MBITS, SCALE_BIAS)
    bits = scale_bits(stored, SCALE_STEP, SCALE_MAX, SCALE_EBITS, SCALE_MBITS, SCALE_BIAS)
    store_scale(scales_ptr, index, bits, mask, SCALE_SIZE)
    return effective


@triton.jit
def _scaled(alpha, index, mask, scales_ptr, global_ptr, alpha_max_ptr, TWO_LEVEL: tl.constexpr,
            HALF_RANGE: tl.constexpr, SCALE_STEP: tl.constexpr, SCALE_FLOOR: tl.constexpr, SCALE_MAX: tl.constexpr,
            SCALE_EBITS: tl.constexpr, SCALE_MBITS: tl.constexpr, SCALE_BIAS: tl.constexpr,
            SCALE_SIZE: tl.constexpr, SAFE: tl.constexpr):
    """Store the scales of blocks with ranges `alpha` (`_store_block_scales`); return their effective scales
    brought into range, the reciprocals, and the power of two `p` by which the blocks' values are to be
    multiplied too (`rescaling`; 1 under SAFE, where none is)."""
    s = _store_block_scales(alpha, index, mask, scales_ptr, global_ptr, alpha_max_ptr, TWO_LEVEL, HALF_RANGE,
                            SCALE_STEP, SCALE_FLOOR, SCALE_MAX, SCALE_EBITS, SCALE_MBITS, SCALE_BIAS, SCALE_SIZE)
    p = 1.0
    if not SAFE:
        p = rescaling(s)
        s = s * p
    return s, tl.math.div_rn(1.0, s), p


@triton.jit
def quantize_fused_kernel(
    x_ptr, values_ptr, scales_ptr, global_ptr, alpha_max_ptr, bad_ptr, C, units_per_row, chunks_per_row,
    blocks_per_row,
    BC: tl.constexpr, G: tl.constexpr, U: tl.constexpr, N: tl.constexpr, CAL: tl.constexpr,
    TWO_LEVEL: tl.constexpr, HALF_RANGE: tl.constexpr,
    SCALE_STEP: tl.constexpr, SCALE_FLOOR: tl.constexpr, SCALE_MAX: tl.constexpr, SCALE_EBITS: tl.constexpr,
    SCALE_MBITS: tl.constexpr, SCALE_BIAS: tl.constexpr, SCALE_SIZE: tl.constexpr,
    IS_FLOAT: tl.constexpr, BITS: tl.constexpr, LO: tl.constexpr, HI: tl.constexpr,
    EBITS: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr, EVEN: tl.constexpr, SAFE: tl.constexpr,
):
    """Each group one block of BC values along the last axis: its range, its scale (into `scales_ptr`, and
    for two levels the global, from the largest block range at `alpha_max_ptr`, into `global_ptr`), then
    its values. `global_ptr` and `alpha_max_ptr` are None for one level.

    EVEN: every program's tile lies wholly inside its row, so nothing is masked. SAFE: every scale the
    scheme can produce lies where `quotient` is exact, so none is rescaled (`rescaling`)."""
    tl.static_assert(BC == U * N, "a group is one block: BC values, U whole units of N")
    row, group, unit, local, start, inside, x = program(x_ptr, C, chunks_per_row, G, U, N, EVEN)
    block = group + tl.arange(0, G)
    terms = reduce(reduce(range_terms(x, CAL), 2, CAL), 1, CAL)
    alpha = block_range(terms, block, C, BC, CAL, True, bad_ptr)
    s, r, p = _scaled(alpha, row * blocks_per_row + block, block < blocks_per_row, scales_ptr, global_ptr,
                      alpha_max_ptr, TWO_LEVEL, HALF_RANGE, SCALE_STEP, SCALE_FLOOR, SCALE_MAX, SCALE_EBITS,
                      SCALE_MBITS, SCALE_BIAS, SCALE_SIZE, SAFE)
    if not SAFE:
        x = x * p[:, None, None]
    store_fields(x, s[:, None, None], r[:, None, None], inside, values_ptr, row, group, unit, units_per_row,
                  G, U, N, IS_FLOAT, BITS, LO, HI, EBITS, MBITS, BIAS, EVEN)


@triton.jit
def quantize_fused_rows_kernel(
    x_ptr, values_ptr, scales_ptr, global_ptr, alpha_max_ptr, bad_ptr, R, C, units_per_row, chunks_per_row,
    bands_per_plane, blocks_per_row,
    BR: tl.constexpr, BC: tl.constexpr, G: tl.constexpr, U: tl.constexpr, N: tl.constexpr,
    TWO_LEVEL: tl.constexpr, HALF_RANGE: tl.constexpr,
    SCALE_STEP: tl.constexpr, SCALE_FLOOR: tl.constexpr, SCALE_MAX: tl.constexpr, SCALE_EBITS: tl.constexpr,
    SCALE_MBITS: tl.constexpr, SCALE_BIAS: tl.constexpr, SCALE_SIZE: tl.constexpr,
    IS_FLOAT: tl.constexpr, BITS: tl.constexpr, LO: tl.constexpr, HI: tl.constexpr,
    EBITS: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr, EVEN: tl.constexpr, SAFE: tl.constexpr,
):
    """`quantize_fused_kernel` for MinMax blocks of BR rows by BC values (the tensor seen as planes of R rows
    of C values): a program takes a band of BR rows and G blocks along it as one `[BR, G, U, N]` tile, so
    each block lies wholly inside it, and reduces, scales and stores them in one pass. EVEN: no band or
    tile is partial."""
    tl.static_assert(BC == U * N, "a group is one block's row: BC values, U whole units of N")
    tl.static_assert((BR & (BR - 1)) == 0, "BR, rows per block, must be a power of two")
    tl.static_assert((G & (G - 1)) == 0, "G, blocks per program, must be a power of two")
    pid = tl.program_id(0).to(tl.int64)
    band = pid // chunks_per_row  # plane * bands_per_plane + the band within the plane
    group = (pid % chunks_per_row) * G
    first = (band // bands_per_plane) * R + (band % bands_per_plane) * BR  # the band's first row
    rows_left = _left(R - (band % bands_per_plane) * BR, BR)
    lane = tl.arange(0, BR)
    unit = (tl.arange(0, G)[:, None] * U + tl.arange(0, U)[None, :])[None, :, :]
    local = unit[:, :, :, None] * N + tl.arange(0, N)
    start = group * BC
    inside = (lane[:, None, None, None] < rows_left) & (local < _left(C - start, G * BC))
    row = first + lane[:, None, None, None]
    x = _load(x_ptr + row * C + start + local, inside, 0.0, EVEN).to(tl.float32)
    block = group + tl.arange(0, G)
    terms = tl.max(tl.max(tl.max(range_terms(x, CAL_MINMAX), axis=3), axis=2), axis=0)
    alpha = block_range(terms, block, C, BC, CAL_MINMAX, False, bad_ptr)
    s, r, p = _scaled(alpha, band * blocks_per_row + block, block < blocks_per_row, scales_ptr, global_ptr,
                      alpha_max_ptr, TWO_LEVEL, HALF_RANGE, SCALE_STEP, SCALE_FLOOR, SCALE_MAX, SCALE_EBITS,
                      SCALE_MBITS, SCALE_BIAS, SCALE_SIZE, SAFE)
    if not SAFE:
        x = x * p[None, :, None, None]
    packed = _packed(x, s[None, :, None, None], r[None, :, None, None], inside, N, IS_FLOAT, BITS, LO, HI, EBITS,
                     MBITS, BIAS, EVEN)
    units = values_ptr + (first + lane[:, None, None]) * units_per_row + group * U + unit
    if EVEN:
        tl.store(units, packed)
    else:
        tl.store(units, packed, mask=(lane[:, None, None] < rows_left)
                 & (unit < _left(units_per_row - group * U, G * U)))


@triton.jit
def quantize_blocks_kernel(
    x_ptr, values_ptr, s_eff_ptr, r_eff_ptr, row_base_ptr, C, units_per_row, chunks_per_row,
    BC: tl.constexpr, G: tl.constexpr, U: tl.constexpr, N: tl.constexpr,
    IS_FLOAT: tl.constexpr, BITS: tl.constexpr, LO: tl.constexpr, HI: tl.constexpr,
    EBITS: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr, EVEN: tl.constexpr, SAFE: tl.constexpr,
):
    """Values whose effective scales and their reciprocals were computed beforehand, one per block: the
    scale of column c of a row is at row_base[row] + c // BC (EVEN and SAFE as for the fused kernel)."""
    row, group, unit, local, start, inside, x = program(x_ptr, C, chunks_per_row, G, U, N, EVEN)
    # the scale of column start + local, without 64-bit arithmetic per value
    first = tl.load(row_base_ptr + row) + start // BC
    index = ((start % BC).to(tl.int32) + local) // BC
    s_eff = _load(s_eff_ptr + first + index, inside, 1.0, EVEN)
    r_eff = _load(r_eff_ptr + first + index, inside, 1.0, EVEN)
    _store_gathered(x, s_eff, r_eff, inside, values_ptr, row, group, unit, units_per_row, G, U, N, IS_FLOAT, BITS,
                    LO, HI, EBITS, MBITS, BIAS, EVEN, SAFE)


@triton.jit
def quantize_tensor_kernel(
    x_ptr, values_ptr, alpha_ptr, scales_ptr, s_eff_ptr, r_eff_ptr, C, units_per_row, chunks_per_row,
    G: tl.constexpr, U: tl.constexpr, N: tl.constexpr, FROM_RANGE: tl.constexpr, HALF_RANGE: tl.constexpr,
    SCALE_STEP: tl.constexpr, SCALE_FLOOR: tl.constexpr, SCALE_MAX: tl.constexpr, SCALE_EBITS: tl.constexpr,
    SCALE_MBITS: tl.constexpr, SCALE_BIAS: tl.constexpr, SCALE_SIZE: tl.constexpr,
    IS_FLOAT: tl.constexpr, BITS: tl.constexpr, LO: tl.constexpr, HI: tl.constexpr,
    EBITS: tl.constexpr, MBITS: tl.constexpr, BIAS: tl.constexpr, EVEN: tl.constexpr, SAFE: tl.constexpr,
):
    """Values under the tensor's one scale. FROM_RANGE: every program works the scale out from the tensor's
    range at `alpha_ptr` and program 0 stores it at `scales_ptr`, so no scale kernel runs first
    (`s_eff_ptr`, `r_eff_ptr` None); else its effective value and reciprocal were computed beforehand
    (`alpha_ptr`, `scales_ptr` None). EVEN and SAFE as for the fused kernel."""
    row, group, unit, local, start, inside, x = program(x_ptr, C, chunks_per_row, G, U, N, EVEN)
    if FROM_RANGE:
        s = _store_block_scales(tl.load(alpha_ptr), 0, tl.program_id(0) == 0, scales_ptr, None, None, False,
                                HALF_RANGE, SCALE_STEP, SCALE_FLOOR, SCALE_MAX, SCALE_EBITS, SCALE_MBITS,
                                SCALE_BIAS, SCALE_SIZE)
        r = tl.math.div_rn(1.0, s * rescaling(s))
    else:
        s = tl.load(s_eff_ptr)
        r = tl.load(r_eff_ptr)
    if not SAFE:
        p = rescaling(s)
        if p != 1.0:  # one scale for the whole tensor: its values are rescaled only where it needs it
            s = s * p
            x = x * p
    store_fields(x, s, r, inside, values_ptr, row, group, unit, units_per_row, G, U, N, IS_FLOAT, BITS, LO, HI,
                  EBITS, MBITS, BIAS, EVEN)


@triton.jit
def alpha_kernel(x_ptr, out_ptr, bad_ptr, C, blocks_per_row, chunks_per_row,
                  BC: tl.constexpr, G: tl.constexpr, BP: tl.constexpr, CAL: tl.constexpr,
                  PER_PROGRAM: tl.constexpr):
    """Ranges of blocks of BC values along each row: per block (max |x| in f32, or the f64 sum of |x|),
    or with PER_PROGRAM the largest f32 block range (the mean for AbsMean) of the program's G blocks.
    A block is read as BP lanes, the power of two at or above BC."""
    tl.static_assert((G & (G - 1)) == 0, "G, blocks per program, must be a power of two")
    tl.static_assert(((BP & (BP - 1)) == 0) & (BP >= BC), "BP must be a power of two of at least BC")
    pid = tl.program_id(0).to(tl.int64)
    row = pid // chunks_per_row
    group = (pid % chunks_per_row) * G
    block = group + tl.arange(0, G)
    k = tl.arange(0, BP)[None, :]
    col = tl.arange(0, G)[:, None] * BC + k  # int32, from the program's first value
    start = group * BC
    inside = (k < BC) & (col < _left(C - start, G * BC))
    x = tl.load(x_ptr + row * C + start + col, mask=inside, other=0.0).to(tl.float32)
    alpha = block_range(reduce(range_terms(x, CAL), 1, CAL), block, C, BC, CAL, PER_PROGRAM, bad_ptr)
    real = block < blocks_per_row
    if PER_PROGRAM:
        tl.store(out_ptr + pid, tl.max(tl.where(real, alpha, 0.0)))
    else:
        tl.store(out_ptr + row * blocks_per_row + block, alpha, mask=real)


@triton.jit
def scales_kernel(alpha_ptr, alpha_max_ptr, scales_ptr, global_ptr, s_eff_ptr, r_eff_ptr, n,
                   BLOCK: tl.constexpr, TWO_LEVEL: tl.constexpr, HALF_RANGE: tl.constexpr,
                   SCALE_STEP: tl.constexpr, SCALE_FLOOR: tl.constexpr, SCALE_MAX: tl.constexpr,
                   SCALE_EBITS: tl.constexpr, SCALE_MBITS: tl.constexpr, SCALE_BIAS: tl.constexpr,
                   SCALE_SIZE: tl.constexpr):
    """Stored scales (bytes into the payload), effective f32 scales, and the reciprocals of the effective
    scales brought into range (`rescaling`), from f32 per-block ranges; for two levels also the global
    (`alpha_max_ptr` and `global_ptr` are None for one level)."""
    tl.static_assert((BLOCK & (BLOCK - 1)) == 0, "BLOCK must be a power of two")
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = i < n
    alpha = tl.load(alpha_ptr + i, mask=inside, other=0.0)
    s_eff = _store_block_scales(alpha, i, inside, scales_ptr, global_ptr, alpha_max_ptr, TWO_LEVEL, HALF_RANGE,
                                SCALE_STEP, SCALE_FLOOR, SCALE_MAX, SCALE_EBITS, SCALE_MBITS, SCALE_BIAS, SCALE_SIZE)
    tl.store(s_eff_ptr + i, s_eff, mask=inside)
    tl.store(r_eff_ptr + i, tl.math.div_rn(1.0, s_eff * rescaling(s_eff)), mask=inside)
