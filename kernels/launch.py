"""Launching the kernels for one scheme: check the arguments, allocate, configure and run them.

`encode` returns the same bytes as `qcli.codec.encode` (docs/arithmetic.md). `enqueue` is its
asynchronous core for the pipeline: it writes the payload into a given buffer on the current stream and
raises a flag instead of an error, so no launch waits for the device. Tensors too large for the device
are encoded in row chunks: `tensor_range` takes, chunk by chunk, what the scales of a per-tensor or
two-level scheme depend on (`qcli.tensor_range.TensorRange`), and `enqueue(..., whole=...)` then encodes
each chunk with it.

The kernels take a scheme's facts as constexprs, from its value type's and scale dtype's rows in
`qcli.scheme` (`value_constants`, `scale_constants`), and their tile shapes from `launch_config`.

Each shape's launch is worked out once and memoized (`qcli.kernels.launcher.Launch`), so a repeated
launch skips Triton's JIT.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Literal

import torch
import triton

from qcli import layout
from qcli.codec.blocks import counts
from qcli.codec.pack import pack_global, pack_scales
from qcli.codec.scales import Scales
from qcli.codec.search import (
    CLIPS,
    Search,
    candidate_count,
    check_importance,
    error_bits,
    importance_bits,
    importance_weights,
)
from qcli.errors import NonFiniteTensor, NotFloatTensor, NotKernelFloat, UsageError
from qcli.io.dtypes import KERNEL_DTYPES, torch_dtype
from qcli.kernels import _quantize as K
from qcli.kernels import _search as KS
from qcli.kernels._arith import RESCALE_DOWN, RESCALE_UP, SAFE_HIGH, SAFE_LOW
from qcli.kernels.constants import COMPILE_OPTIONS, clips, scale_constants, value_constants
from qcli.kernels.launcher import Launch, View, interpreted
from qcli.scheme import Calibration, QuantScheme, check_accepted
from qcli.tensor_range import TensorRange, taken

_FLOAT_DTYPES = tuple(torch_dtype(d) for d in KERNEL_DTYPES)  # the rows' (`qcli.io.dtypes`)
# The tuning constants, public for bench/tune.py (which sets them, then calls `clear_launch_caches`).
TILE = 4096          # values per program (bench/tune.py: the fastest on an H200 for most schemes)
WARPS = 2            # warps per program (bench/tune.py, an H200) ...
WIDE_WARPS = 4       # ... but 4 where a program gathers a scale per value or sums |x| in float64
# Values per group (whole units) of the kernels that do not reduce their blocks: the blocks kernel, and
# the tensor kernel (bench/tune.py, an H200: 92.5 % of copy for Q8S at 16384² with 32, 62 % with 64).
BLOCKS_GROUP = 64
TENSOR_GROUP = 32
_SCALES_BLOCK = 1024  # scales per program of the scale kernel
_TENSOR_CHUNK = 4096  # values per partial range of a per-tensor scheme
_SEARCH_PIECE = 1 << 24  # values per piece the torch search takes (its scratch and candidates follow it)


@dataclass(frozen=True)
class LaunchConfig:
    """How a kernel covers rows of groups (a group: `group_values` values, of which a block or whole units):
    `groups` per program (G), `chunks` programs per row, `num_warps` per program."""

    groups: int
    chunks: int
    num_warps: int

    def even(self, cols: int, group_values: int) -> bool:
        """Whether every program's tile lies wholly inside its row of `cols` values, so nothing is masked."""
        return cols % (self.groups * group_values) == 0


def launch_config(group_values: int, groups_per_row: int, wide: bool = False) -> LaunchConfig:
    """Programs of about `TILE` values, in whole groups of `group_values` (a power of two); `wide` for the
    programs that gather a scale per value or sum |x| in float64."""
    groups = max(1, TILE // group_values)
    return LaunchConfig(groups, triton.cdiv(groups_per_row, groups), WIDE_WARPS if wide else WARPS)


def _safe_scales(scheme: QuantScheme) -> bool:
    """Whether every scale the scheme can produce lies in [SAFE_LOW, SAFE_HIGH], where the kernels'
    reciprocal division is exact, so none need rescaling: one level, on a grid between those ends."""
    traits = scheme.scale_dtype().traits
    return not scheme.is_two_level() and traits.smallest >= SAFE_LOW.value and traits.max <= SAFE_HIGH.value


def _check_tensor(x: torch.Tensor, name: str) -> None:
    if not x.dtype.is_floating_point:
        raise NotFloatTensor(name, x.dtype)
    if x.dtype not in _FLOAT_DTYPES:
        raise NotKernelFloat(name, x.dtype)
    if not x.is_contiguous():
        raise UsageError(f"tensor {name!r} is not contiguous", hint="pass x.contiguous()")
    if x.device.type != "cuda" and not (interpreted() and x.device.type == "cpu"):
        raise UsageError(f"tensor {name!r} is on {x.device}, the Triton kernels need a CUDA tensor",
                         hint="move it with .cuda(), or set TRITON_INTERPRET=1 to run the kernels on the CPU")


def _rows(grid: layout.BlockGrid) -> tuple[int, int]:
    """(rows, values per row) of the tensor viewed as rows of its last axis."""
    return math.prod(grid.shape[:-1]), grid.shape[-1]


def _fused(scheme: QuantScheme, grid: layout.BlockGrid) -> bool:
    """Whether each program can compute its blocks' scales itself: blocks along the last axis only, of a
    power-of-two width holding whole storage units (a two-level scheme needs its global first)."""
    width = grid.block[-1]
    return (scheme.block is not None and all(b == 1 for b in grid.block[:-1]) and width & (width - 1) == 0
            and width % scheme.num_quants() == 0)


def _fused_rows(scheme: QuantScheme, grid: layout.BlockGrid, calibration: Calibration) -> bool:
    """Whether `quantize_fused_rows_kernel` takes the scheme's blocks: MinMax over blocks of the last two
    axes only, a power of two of rows by a power-of-two width holding whole storage units (an AbsMean's
    float64 sum over rows is taken in the order of the gathered path's)."""
    if scheme.block is None or calibration is not Calibration.MinMax or len(grid.block) < 2:
        return False
    rows, width = grid.block[-2:]
    return (rows > 1 and rows & (rows - 1) == 0 and all(b == 1 for b in grid.block[:-2])
            and width & (width - 1) == 0 and width % scheme.num_quants() == 0)


def _flat(grid: layout.BlockGrid, width: int, per_unit: int) -> tuple[int, int, int]:
    """(rows, values per row, units per row) of the view the kernels take: with no partial block of `width`
    and no row padding, the tensor is one long row."""
    rows, cols = _rows(grid)
    if cols % width == 0 and width % per_unit == 0:
        n = rows * cols
        return 1, n, n // per_unit
    return rows, cols, math.ceil(cols / per_unit)


def _tensor_alpha(whole: TensorRange, scheme: QuantScheme, calibration: Calibration) -> torch.Tensor:
    """The f32 range the scale kernel takes from a tensor's range: its mean |x| for a per-tensor AbsMean
    scheme (float64 division, IEEE on every device, then rounded once), else its largest |x|."""
    if calibration is Calibration.AbsMean and scheme.block is None:
        return whole.mean().to(torch.float32)
    return taken(whole.peak)


def tensor_range(x: torch.Tensor, scheme: QuantScheme, calibration: Calibration, bad: torch.Tensor
                 ) -> TensorRange:
    """What the scales of a per-tensor or two-level scheme need of `x` (a tensor or a row chunk of it): the
    largest |x| (the largest block range, for two levels), or for a per-tensor AbsMean the float64 sum of
    |x|; sets `bad[0]` on NaN or inf."""
    grid = layout.BlockGrid.of(scheme, tuple(x.shape))
    if scheme.is_two_level():
        if _fused(scheme, grid):
            rows, cols, _ = _flat(grid, grid.block[-1], scheme.num_quants())
            peak = _row_alpha(x, rows, cols, grid.block[-1], calibration, bad, per_program=True)
        else:
            peak = _block_alpha(x, grid, calibration, bad)
        return TensorRange(peak.amax().reshape(1), None, x.numel())
    partial = _row_alpha(x, 1, x.numel(), _TENSOR_CHUNK, calibration, bad)
    if calibration is Calibration.AbsMean:
        return TensorRange(None, partial.sum().reshape(1), x.numel())
    return TensorRange(partial.amax().reshape(1), None, x.numel())


def enqueue(x: torch.Tensor, scheme: QuantScheme, calibration: Calibration, out: torch.Tensor,
            bad: torch.Tensor, whole: TensorRange | None = None, searched: Scales | None = None, *,
            importance: torch.Tensor | None = None, name: str = "tensor") -> None:
    """Write the payload of `x` into `out` (uint8, 1-D) on the current stream; set `bad[0]` on NaN or inf.

    `whole` is the range of the whole tensor when `x` is one row chunk of it (per-tensor and two-level
    schemes); other schemes need only the chunk, whose blocks must not straddle chunks. `searched`: under
    `Calibration.Mse`, a per-tensor scheme's scale searched over every chunk (`qcli.codec.search.Search`).
    `importance` (broadcastable to `x`, best on the host) weighs the search of Mse, as `qcli.codec.encode`'s
    does; an error about it names the tensor `name`.
    """
    check_importance(importance, calibration)
    shape = tuple(x.shape)
    if calibration is Calibration.Mse and searched is None and searches_in_kernel(scheme, shape):
        weights = _column_or_row_weights(importance, scheme, shape, name)
        if weights is not False:
            _enqueue_searched(x, scheme, out, bad, whole, weights)
            return
    if calibration is not Calibration.Mse:
        fused = fused_launch(scheme, shape, x.dtype, calibration)
        if fused is not None:
            launch, value_bytes, scale_bytes = fused
            value_view = View(out, 0, value_bytes, torch.int32 if scheme.size_bits_stored() == 32 else torch.uint8)
            scale_view = View(out, value_bytes, scale_bytes)
            if scheme.is_two_level():
                peak = (whole or tensor_range(x, scheme, calibration, bad)).peak
                launch(x, value_view, scale_view, View(out, value_bytes + scale_bytes, 4), peak, bad)
            else:
                launch(x, value_view, scale_view, None, None, bad)
            return
    grid = layout.BlockGrid.of(scheme, shape)
    value_bytes = layout.value_bytes(scheme, shape)
    values = out[:value_bytes]
    values = values.view(torch.int32) if scheme.size_bits_stored() == 32 else values
    scales = out[value_bytes:]
    if scheme.block is None:
        if calibration is Calibration.Mse:
            s_eff, r_eff = _searched(x, scheme, grid, scales, bad, whole, searched, importance, name)
            tensor_launch(scheme, shape, from_range=False)(x, values, None, None, s_eff, r_eff)
        else:
            alpha = _tensor_alpha(whole or tensor_range(x, scheme, calibration, bad), scheme, calibration)
            tensor_launch(scheme, shape, from_range=True)(x, values, alpha, scales, None, None)
        return
    if calibration is Calibration.Mse:
        s_eff, r_eff = _searched(x, scheme, grid, scales, bad, whole, searched, importance, name)
    else:
        s_eff, r_eff = _scales(x, scheme, calibration, grid, scales, bad, whole)
    blocks_launch(scheme, shape)(x, values, s_eff, r_eff, _row_base(grid, x.device))


def searches_in_kernel(scheme: QuantScheme, shape: tuple[int, ...]) -> bool:
    """Whether `enqueue` searches the scheme's scales (`Calibration.Mse`) inside the fused kernel, reading
    the tensor once, rather than with the torch search: blocks along the last axis that the fused kernel
    takes (`_fused`)."""
    return _fused(scheme, layout.BlockGrid.of(scheme, tuple(shape)))


def _column_or_row_weights(importance: torch.Tensor | None, scheme: QuantScheme, shape: tuple[int, ...], name: str
                           ) -> tuple[torch.Tensor, int] | None | Literal[False]:
    """The search's integer weights (`importance_weights`) as the searched kernel reads them: (int32 weights
    on x's device, WEIGH_COLUMNS or WEIGH_ROWS), None where nothing weighs, or False for an importance
    that is neither per column nor per row (the torch search takes it)."""
    if importance is None:
        return None
    bits = importance_bits(math.prod(layout.BlockGrid.of(scheme, shape).block))
    weights = importance_weights(importance, shape, bits, name)
    if weights is None:
        return None
    if len(shape) == 2 and weights.shape == (1, shape[1]):
        return weights.reshape(-1).to(torch.int32), KS.WEIGH_COLUMNS.value
    if len(shape) == 2 and weights.shape == (shape[0], 1):
        return weights.reshape(-1).to(torch.int32), KS.WEIGH_ROWS.value
    return False


def _enqueue_searched(x: torch.Tensor, scheme: QuantScheme, out: torch.Tensor, bad: torch.Tensor,
                      whole: TensorRange | None, weights: tuple[torch.Tensor, int] | None) -> None:
    """The searched kernel's launch for a `_fused` scheme: scales searched and values written in one pass."""
    shape = tuple(x.shape)
    weigh = KS.WEIGH_NONE.value if weights is None else weights[1]
    launch, value_bytes, scale_bytes = searched_launch(scheme, shape, weigh)
    values = View(out, 0, value_bytes, torch.int32 if scheme.size_bits_stored() == 32 else torch.uint8)
    scales = View(out, value_bytes, scale_bytes)
    w = None if weights is None else weights[0].to(x.device, non_blocking=True)
    factors = clips(x.device)
    if scheme.is_two_level():
        peak = (whole or tensor_range(x, scheme, Calibration.Mse, bad)).peak
        launch(x, values, scales, View(out, value_bytes + scale_bytes, 4), peak, bad, w, factors)
    else:
        launch(x, values, scales, None, None, bad, w, factors)


@functools.lru_cache(maxsize=4096)
def searched_launch(scheme: QuantScheme, shape: tuple[int, ...], weigh: int) -> tuple[Launch, int, int]:
    """`quantize_searched_kernel`'s launch for a `_fused` scheme (pointers: x, values, scales, the global
    and the largest block range (two levels), the flag, the weights (or None), the clips). Weighed, the
    tensor keeps its rows, whose columns and rows the weights follow; unweighed, it is one long row where
    its rows hold whole blocks, as the fused kernel takes it."""
    grid = layout.BlockGrid.of(scheme, shape)
    per_unit = scheme.num_quants()
    width = grid.block[-1]
    if weigh == KS.WEIGH_NONE.value:
        rows, cols, units_per_row = _flat(grid, width, per_unit)
    else:
        rows, cols = _rows(grid)
        units_per_row = math.ceil(cols / per_unit)
    blocks_per_row = math.ceil(cols / width)
    config = launch_config(width, blocks_per_row, wide=True)
    elements = math.prod(grid.block)
    launch = Launch(KS.quantize_searched_kernel, rows * config.chunks,
                     (cols, units_per_row, config.chunks, blocks_per_row),
                     dict(BC=width, G=config.groups, U=width // per_unit, N=per_unit, TWO_LEVEL=scheme.is_two_level(),
                          HALF_RANGE=scheme.value.half_range(), CLIP_COUNT=len(CLIPS),
                          CANDIDATES=candidate_count(scheme),
                          J=error_bits(elements, 0 if weigh == KS.WEIGH_NONE.value else importance_bits(elements)),
                          WEIGH=weigh, EVEN=config.even(cols, width),
                          SAFE=_safe_scales(scheme), num_warps=config.num_warps,
                          **scale_constants(scheme.scale_dtype()), **value_constants(scheme.value), **COMPILE_OPTIONS))
    return launch, layout.value_bytes(scheme, shape), layout.scale_bytes(scheme, shape)


def clear_launch_caches() -> None:
    """Forget every shape's memoized launch, so the next is worked out again: after the tuning constants
    (`TILE`, `WARPS`, `WIDE_WARPS`, `BLOCKS_GROUP`, `TENSOR_GROUP`) change, as bench/tune.py changes them."""
    for memoized in (searched_launch, tensor_launch, blocks_launch, fused_launch, scales_launch, alpha_launch):
        memoized.cache_clear()


def _gathered_fields(scheme: QuantScheme, group_values: int) -> tuple[int, dict]:
    """Units per group of about `group_values` values, and the constexprs of a kernel that quantizes under
    scales it does not reduce."""
    per_unit = scheme.num_quants()
    return max(1, group_values // per_unit), dict(N=per_unit, SAFE=_safe_scales(scheme),
                                                  **value_constants(scheme.value), **COMPILE_OPTIONS)


@functools.lru_cache(maxsize=4096)
def tensor_launch(scheme: QuantScheme, shape: tuple[int, ...], from_range: bool) -> Launch:
    """`quantize_tensor_kernel`'s launch (pointers: x, values, the range and the stored scale with
    `from_range`, else the effective scale and its reciprocal)."""
    u, fields = _gathered_fields(scheme, TENSOR_GROUP)
    rows, cols, units_per_row = _flat(layout.BlockGrid.of(scheme, shape), 1, fields["N"])
    config = launch_config(u * fields["N"], math.ceil(units_per_row / u))
    return Launch(K.quantize_tensor_kernel, rows * config.chunks, (cols, units_per_row, config.chunks),
                   dict(G=config.groups, U=u, EVEN=config.even(cols, u * fields["N"]), FROM_RANGE=from_range,
                        HALF_RANGE=scheme.value.half_range(), num_warps=config.num_warps,
                        **scale_constants(scheme.scale_dtype()), **fields))


@functools.lru_cache(maxsize=4096)
def blocks_launch(scheme: QuantScheme, shape: tuple[int, ...]) -> Launch:
    """`quantize_blocks_kernel`'s launch (pointers: x, values, s_eff, r_eff, each row's first scale)."""
    grid = layout.BlockGrid.of(scheme, shape)
    u, fields = _gathered_fields(scheme, BLOCKS_GROUP)
    rows, cols = _rows(grid)
    units_per_row = math.ceil(cols / fields["N"])
    config = launch_config(u * fields["N"], math.ceil(units_per_row / u), wide=True)
    return Launch(K.quantize_blocks_kernel, rows * config.chunks, (cols, units_per_row, config.chunks),
                   dict(BC=grid.block[-1], G=config.groups, U=u, EVEN=config.even(cols, u * fields["N"]),
                        num_warps=config.num_warps, **fields))


@functools.lru_cache(maxsize=4096)
def fused_launch(scheme: QuantScheme, shape: tuple[int, ...], dtype: torch.dtype, calibration: Calibration
                  ) -> tuple[Launch, int, int] | None:
    """The launch of the fused kernel for `shape`, or of its kind for blocks over rows (with the value and
    scale bytes of its payload), or None where the scheme's blocks are neither (`_fused`, `_fused_rows`).
    Its pointers: x, values, scales, the global (two levels), the largest block range (two levels), the
    flag."""
    grid = layout.BlockGrid.of(scheme, shape)
    per_unit = scheme.num_quants()
    width = grid.block[-1]
    constexprs = dict(BC=width, U=width // per_unit, N=per_unit, TWO_LEVEL=scheme.is_two_level(),
                      HALF_RANGE=scheme.value.half_range(), SAFE=_safe_scales(scheme),
                      **scale_constants(scheme.scale_dtype()), **value_constants(scheme.value), **COMPILE_OPTIONS)
    if _fused(scheme, grid):
        rows, cols, units_per_row = _flat(grid, width, per_unit)
        blocks_per_row = math.ceil(cols / width)
        config = launch_config(width, blocks_per_row, wide=calibration is Calibration.AbsMean)
        launch = Launch(K.quantize_fused_kernel, rows * config.chunks,
                         (cols, units_per_row, config.chunks, blocks_per_row),
                         dict(G=config.groups, CAL=_cal(calibration), EVEN=config.even(cols, width),
                              num_warps=config.num_warps, **constexprs))
    elif _fused_rows(scheme, grid, calibration):
        band = grid.block[-2]
        planes, (r, cols) = math.prod(shape[:-2]), shape[-2:]
        blocks_per_row = grid.grid[-1]
        config = launch_config(band * width, blocks_per_row)
        launch = Launch(K.quantize_fused_rows_kernel, planes * grid.grid[-2] * config.chunks,
                         (r, cols, math.ceil(cols / per_unit), config.chunks, grid.grid[-2], blocks_per_row),
                         dict(BR=band, G=config.groups, EVEN=config.even(cols, width) and r % band == 0,
                              num_warps=config.num_warps, **constexprs))
    else:
        return None
    return launch, layout.value_bytes(scheme, shape), layout.scale_bytes(scheme, shape)


def _scales(x, scheme: QuantScheme, calibration: Calibration, grid: layout.BlockGrid, scales, bad,
            whole: TensorRange | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the range and scale kernels of a block scheme: stored scales (and the global) into `scales`, the
    payload from its scale region on; return the effective scales and their reciprocals."""
    two_level = scheme.is_two_level()
    alpha = _block_alpha(x, grid, calibration, bad)
    if two_level and whole is None:
        whole = TensorRange(alpha.amax().reshape(1), None, x.numel())
    n = alpha.numel()
    s_eff = torch.empty(n, dtype=torch.float32, device=x.device)
    r_eff = torch.empty_like(s_eff)
    scale_bytes = layout.scale_bytes(scheme, tuple(x.shape))
    scales_launch(scheme, n)(alpha, whole.peak if two_level and whole is not None else None, scales,
                              scales[scale_bytes:] if two_level else None, s_eff, r_eff)
    return s_eff, r_eff


@functools.lru_cache(maxsize=4096)
def scales_launch(scheme: QuantScheme, n: int) -> Launch:
    """`scales_kernel`'s launch for `n` block ranges (pointers: the ranges, the largest (two levels), the
    stored scales, the global (two levels), s_eff, r_eff)."""
    return Launch(K.scales_kernel, triton.cdiv(n, _SCALES_BLOCK), (n,),
                   dict(BLOCK=_SCALES_BLOCK, TWO_LEVEL=scheme.is_two_level(), HALF_RANGE=scheme.value.half_range(),
                        **scale_constants(scheme.scale_dtype()), **COMPILE_OPTIONS))


def _searched(x, scheme: QuantScheme, grid: layout.BlockGrid, scales, bad, whole: TensorRange | None,
              searched: Scales | None, importance: torch.Tensor | None, name: str
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """`Calibration.Mse` where the searched kernel does not take the scheme: the codec's search
    (`qcli.codec.search`), in torch on x's device, whose every operation rounds as on the CPU, so it picks
    the same scales (weighed by `importance` as there: its integer weights are made on the host), fed x in
    pieces of whole block rows (`_SEARCH_PIECE`) so that its memory follows a piece; the stored scales (and
    the global) into `scales`, and the effective scales with their reciprocals as `scales_kernel` gives
    them. The ranges are MinMax's, from the range kernel."""
    if searched is None:
        if scheme.block is None:
            alpha = taken((whole or tensor_range(x, scheme, Calibration.MinMax, bad)).peak)
        else:
            alpha = _block_alpha(x, grid, Calibration.MinMax, bad)
        peak = taken(whole.peak).reshape(()) if whole is not None and scheme.is_two_level() else None
        search = Search(alpha.reshape(grid.grid), scheme, grid.shape, peak, importance=importance, name=name)
        band = grid.block[0] if scheme.block is not None else 1
        step = max(1, _SEARCH_PIECE // max(1, math.prod(grid.shape[1:]) * band)) * band
        for start in range(0, grid.shape[0], step):
            stop = min(start + step, grid.shape[0])
            search.add(x[start:stop].to(torch.float32), slice(start // band, math.ceil(stop / band)), start)
        searched = search.scales()
    stored_bytes = layout.scale_bytes(scheme, grid.shape)
    scales[:stored_bytes].copy_(pack_scales(searched.stored, scheme.scale_dtype()))
    if searched.global_scale is not None:
        scales[stored_bytes : stored_bytes + 4].copy_(pack_global(searched.global_scale))
    s_eff = searched.effective.reshape(-1).contiguous()
    magnitude = s_eff.abs()
    rescaling = torch.where(magnitude < SAFE_LOW.value, RESCALE_UP.value,
                            torch.where(magnitude > SAFE_HIGH.value, RESCALE_DOWN.value, 1.0))
    return s_eff, torch.ones_like(s_eff) / (s_eff * rescaling)  # tensor by tensor: IEEE, as the kernel's div_rn


def _row_alpha(x, rows: int, cols: int, width: int, calibration: Calibration, bad, per_program: bool = False
               ) -> torch.Tensor:
    """Per row and block of `width` values along it: max |x| (f32) or the f64 sum of |x|; with
    per_program, the largest f32 block range (mean for AbsMean) of each program's blocks."""
    launch, size = alpha_launch(rows, cols, width, calibration, per_program)
    dtype = torch.float64 if calibration is Calibration.AbsMean and not per_program else torch.float32
    out = torch.empty(size, dtype=dtype, device=x.device)
    launch(x, out, bad)
    return out


@functools.lru_cache(maxsize=4096)
def alpha_launch(rows: int, cols: int, width: int, calibration: Calibration, per_program: bool
                  ) -> tuple[Launch, int]:
    """`alpha_kernel`'s launch for `_row_alpha` (pointers: x, out, the flag), and the values it writes."""
    blocks_per_row = math.ceil(cols / width)
    bp = triton.next_power_of_2(width)
    config = launch_config(bp, blocks_per_row)
    # Triton's default warps, as before: the order of its float64 sums may depend on them
    launch = Launch(K.alpha_kernel, rows * config.chunks, (cols, blocks_per_row, config.chunks),
                     dict(BC=width, G=config.groups, BP=bp, CAL=_cal(calibration), PER_PROGRAM=per_program,
                          **COMPILE_OPTIONS))
    return launch, rows * (config.chunks if per_program else blocks_per_row)


def _block_alpha(x, grid: layout.BlockGrid, calibration: Calibration, bad) -> torch.Tensor:
    """f32 range per block of the grid, row-major: max |x|, or f32(f64 sum |x| / count) for AbsMean.
    A kernel reduces along the last axis, torch over the leading axes."""
    rows, cols = _rows(grid)
    alpha = _row_alpha(x, rows, cols, grid.block[-1], calibration, bad)
    alpha = alpha.reshape(*grid.shape[:-1], grid.grid[-1])
    for axis, b in enumerate(grid.block[:-1]):
        if b == 1:
            continue
        pad = grid.grid[axis] * b - grid.shape[axis]
        if pad:  # zeros change neither a max of |x| nor a sum
            zeros = alpha.new_zeros(*alpha.shape[:axis], pad, *alpha.shape[axis + 1 :])
            alpha = torch.cat([alpha, zeros], axis)
        alpha = alpha.unflatten(axis, (grid.grid[axis], b))
        alpha = alpha.sum(axis + 1) if calibration is Calibration.AbsMean else alpha.amax(axis + 1)
    alpha = alpha.reshape(-1)
    if calibration is Calibration.AbsMean:  # float64 division, IEEE on every device
        alpha = (alpha / counts(grid, x.device).reshape(-1)).to(torch.float32)
    return alpha.contiguous()


@functools.lru_cache(maxsize=256)
def _row_base(grid: layout.BlockGrid, device) -> torch.Tensor:
    """For each row of the last axis, the index of its first block's scale in the row-major grid (made
    once per grid and device: it is only read)."""
    base = torch.zeros(1, dtype=torch.int64, device=device)
    for d, b, g in zip(grid.shape[:-1], grid.block[:-1], grid.grid[:-1], strict=True):
        base = (base[:, None] * g + torch.arange(d, device=device) // b).reshape(-1)
    base = base * grid.grid[-1]
    if base.is_cuda:  # complete before any stream reads it
        torch.cuda.current_stream().synchronize()
    return base


def encode(x: torch.Tensor, scheme: QuantScheme, calibration: Calibration = Calibration.MinMax,
           *, name: str = "tensor", importance: torch.Tensor | None = None) -> torch.Tensor:
    """The payload of `x` (uint8, 1-D, `quantized_data_len` bytes) on x's device, as `qcli.codec.encode`
    (`importance` as there)."""
    check_accepted(scheme, calibration)
    _check_tensor(x, name)
    out = torch.empty(layout.quantized_data_len(scheme, tuple(x.shape)), dtype=torch.uint8, device=x.device)
    bad = torch.zeros(1, dtype=torch.int32, device=x.device)
    enqueue(x, scheme, calibration, out, bad, importance=importance, name=name)
    if bad.item():
        raise NonFiniteTensor(name, beyond_float32=False)  # float32, float16 or bfloat16 (`_check_tensor`)
    return out


def _cal(calibration: Calibration) -> int:
    return (K.CAL_ABSMEAN if calibration is Calibration.AbsMean else K.CAL_MINMAX).value
