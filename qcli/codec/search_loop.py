"""The CPU codec's compiled loops on the CPU's cores: the `_search` extension (`_search.c`), which the
build compiles where it finds a C compiler.

The scale search (`choose`, `errors`) works out each block's candidates, measures them and keeps the
least, as `qcli.codec.search` does with torch (docs/arithmetic.md §6): the same candidates in the same
order, the same integer errors, so the same bytes, each block read once while it is in registers where
torch makes a dozen passes over every candidate's copy of the piece. `measured` measures a chunk's encode
from its codes, as `qcli.measure` does from a decode, in one read of the chunk; `integer_codes` and
`minifloat_codes` make the codes as `qcli.codec.values.to_fields` and `qcli.codec.minifloat.encode` do, in
one pass where torch takes several.
Without the extension (`BUILT` false) the search and the codes take torch's passes and the measuring
decodes, more slowly.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch

from qcli.codec import minifloat
from qcli.codec.blocks import block_rows, broadcast_to_blocks, to_blocks
from qcli.layout import BlockGrid
from qcli.scheme import MinifloatFormat, QuantScheme, QuantValue

try:
    from qcli.codec import _search  # type: ignore[attr-defined]  # the C extension, where built: no stub
except ImportError:  # built without a C compiler
    _search = None

BUILT = _search is not None
# Element-candidates (elements times candidates) below which the calling thread measures alone: handing
# work to the pool costs about what measuring that much does.
ALONE = 1 << 16
# One block of more elements than this (a per-tensor scheme's) is measured as rows of this many, which
# the threads share under the same candidates; integer sums add up the same in any grouping.
ROW = 1 << 14


def choose(piece: torch.Tensor, grid: BlockGrid, alpha: torch.Tensor, unit: torch.Tensor, scheme: QuantScheme,
           clips: tuple[float, ...], global_scale: float | None, weights: torch.Tensor | None = None
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Each block's searched scale, stored and effective (grid-shaped f32), for the f32 CPU `piece` (of
    `grid.shape`) whose blocks' largest magnitudes are `alpha` and fixed-point units `unit` (grid-shaped):
    `qcli.codec.search.candidates` (the clip factors `clips`, under `global_scale` for two levels),
    measured (each element weighed by `weights`, integers as float64 broadcastable to the piece, where
    given) and the least kept, the first of equal ones."""
    blocks = to_blocks(piece, grid)
    x, w = block_rows(blocks, grid), _weight_rows(weights, blocks, grid)
    alphas, units = _flat_f32(alpha), _flat_f32(unit)
    stored, effective = torch.empty_like(alphas), torch.empty_like(alphas)
    factors = torch.tensor(clips, dtype=torch.float32)
    traits = scheme.scale_dtype().traits
    fmt = traits.minifloat
    grid_constants = (traits.step_bits, traits.mantissa_bits, traits.floor or 0.0,
                      2.0 ** (1 - fmt.bias) if fmt else 0.0, fmt.subnormal_spacing if fmt else 0.0, traits.max,
                      traits.signed)
    rows, elements = x.shape

    def run(start: int, stop: int) -> None:
        _search.search(x.data_ptr() + 4 * start * elements, _address(w, 4 * start * elements),
                       alphas.data_ptr() + 4 * start, units.data_ptr() + 4 * start, stored.data_ptr() + 4 * start,
                       effective.data_ptr() + 4 * start, stop - start, elements, factors.data_ptr(),
                       factors.numel(), global_scale or 0.0, scheme.value.half_range(),
                       *_value_constants(scheme.value), *grid_constants)

    _shared(run, rows, elements * (2 * len(clips) + 4))
    return stored.view(alpha.shape), effective.view(alpha.shape)


def errors(piece: torch.Tensor, grid: BlockGrid, effective: torch.Tensor, unit: torch.Tensor, value: QuantValue,
           weights: torch.Tensor | None = None) -> torch.Tensor:
    """Every candidate's error on every block of the f32 CPU `piece` (float64 [candidates, *grid.grid]), as
    `qcli.codec.search.stacked_errors` gives it: `effective` [candidates, *grid.grid], `unit` grid-shaped,
    `weights` as `choose`'s. A per-tensor scheme's search measures its one block's candidates here."""
    count = effective.shape[0]
    blocks = to_blocks(piece, grid)
    x, w = block_rows(blocks, grid), _weight_rows(weights, blocks, grid)
    scales = effective.reshape(count, -1).to(torch.float32).contiguous()
    units = _flat_f32(unit)
    if x.shape[0] == 1 and x.shape[1] > ROW:  # one large block, shared out as rows
        whole = x.shape[1] // ROW * ROW
        parts = [(x[0, :whole].view(-1, ROW), None if w is None else w[0, :whole].view(-1, ROW))]
        if whole < x.shape[1]:
            parts.append((x[:, whole:], None if w is None else w[:, whole:]))
        total = torch.zeros(count, 1, dtype=torch.float64)
        for rows, weighed in parts:
            out = torch.empty(count, rows.shape[0], dtype=torch.float64)
            _errors(rows, weighed, scales, units, out, 0, value)
            total += out.sum(dim=1, keepdim=True)
        return total.reshape(count, *grid.grid)
    out = torch.empty(count, x.shape[0], dtype=torch.float64)
    _errors(x, w, scales, units, out, 1, value)
    return out.reshape(count, *grid.grid)


def _errors(x: torch.Tensor, w: torch.Tensor | None, scales: torch.Tensor, units: torch.Tensor, out: torch.Tensor,
            block_stride: int, value: QuantValue) -> None:
    """`_search.errors` over the rows of `x`: each its own block (`block_stride` 1: `scales` [candidates,
    rows], `units` [rows]), or with `block_stride` 0 parts of one block whose candidates and unit they all
    share (`scales` [candidates, 1])."""
    rows, elements = x.shape
    count = scales.shape[0]
    candidate_stride = scales.shape[1] if block_stride else 1

    def run(start: int, stop: int) -> None:
        _search.errors(x.data_ptr() + 4 * start * elements, _address(w, 4 * start * elements),
                       scales.data_ptr() + 4 * start * block_stride, units.data_ptr() + 4 * start * block_stride,
                       out.data_ptr() + 8 * start, stop - start, elements, count, candidate_stride, block_stride,
                       block_stride, rows, *_value_constants(value))

    _shared(run, rows, elements * count)


def measured(rows: torch.Tensor, fields: torch.Tensor, scales: torch.Tensor, grid: BlockGrid, value: QuantValue,
             errors: torch.Tensor, peaks: torch.Tensor | None = None) -> tuple[float, float]:
    """The energies (sum x^2, sum (x' - x)^2, float64) of the f32 CPU chunk `rows` (of `grid.shape`) against
    its decode x' from `fields` (the codec's, one byte each, of the same shape) and `scales` (each block's
    decode scale, flat f32 in grid order), each product and difference the f32 one `qcli.codec.decode`
    and `qcli.measure` form; each block's largest |x' - x| raises `errors` (flat f32, one per block; NaN
    stays), its largest |x| `peaks` where given. On the calling thread: a chunk is measured at about 1 G
    values a second on one core, and sharing it out among threads made it no faster (docs/benchmarks.md)."""
    x = block_rows(to_blocks(rows, grid), grid)
    codes = block_rows(to_blocks(fields, grid), grid)
    table = _value_table(value) if value.is_minifloat() else None
    blocks, elements = x.shape
    return _search.measured(x.data_ptr(), codes.data_ptr(), _address(table, 0), scales.data_ptr(),
                            errors.data_ptr(), _address(peaks, 0), blocks, elements)


def integer_codes(x: torch.Tensor, effective: torch.Tensor, grid: BlockGrid, value: QuantValue,
                  out: torch.Tensor | None = None) -> torch.Tensor | None:
    """`qcli.codec.values.to_fields` of an integer value type (int8 of `grid.shape`, into `out` where given) for
    the contiguous f32 CPU `x` and its blocks' effective scales (grid-shaped), in one pass on the calling
    thread; None where the blocks do not lie in `x`'s own order (blocks across rows, or padded), which
    torch's passes then take."""
    if not (math.prod(grid.grid) == 1 or (grid.padded == grid.shape and all(b == 1 for b in grid.block[:-1]))):
        return None
    out = torch.empty(grid.shape, dtype=torch.int8) if out is None else out
    scales = effective.reshape(-1).to(torch.float32).contiguous()
    lo, hi = value.range()
    blocks = scales.numel()
    _search.integer_codes(x.data_ptr(), scales.data_ptr(), out.data_ptr(), blocks, x.numel() // max(blocks, 1),
                          float(lo), float(hi))
    return out


def minifloat_codes(v: torch.Tensor, fmt: MinifloatFormat, out: torch.Tensor | None = None) -> torch.Tensor:
    """`qcli.codec.minifloat.encode` of the contiguous f32 CPU `v` (within the format's range) in one pass on
    the calling thread, as uint8 codes of `v`'s shape (into `out`, of as many bytes, where given)."""
    out = torch.empty(v.shape, dtype=torch.uint8) if out is None else out
    _search.minifloat_codes(v.data_ptr(), out.data_ptr(), v.numel(), fmt.mantissa_bits, fmt.bias, fmt.sign_bit,
                            fmt.min_normal_f32_bits, 1.0 / fmt.subnormal_spacing)
    return out


@functools.cache
def _value_table(value: QuantValue) -> torch.Tensor:
    """f32 value of each of the 256 bytes as a minifloat code of `value` (NaN past its codes)."""
    codes = minifloat.table(minifloat.FORMATS[value])
    return torch.cat([codes, torch.full((256 - codes.numel(),), torch.nan)]).contiguous()


def _shared(run: Callable[[int, int], None], rows: int, work_per_row: int) -> None:
    """`run(start, stop)` over rows [0, rows), cut into contiguous runs among torch's intra-op threads
    (the extension releases the interpreter while it computes), or on this thread where that is little."""
    threads = min(torch.get_num_threads(), rows)
    if threads <= 1 or rows * work_per_row < ALONE:
        run(0, rows)
        return
    bounds = [rows * i // threads for i in range(threads + 1)]
    list(_pool(threads).map(run, bounds[:-1], bounds[1:]))


@functools.cache
def _pool(threads: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(threads, thread_name_prefix="qcli-search")


def _value_constants(value: QuantValue) -> tuple:
    """The value type as the loop takes it: minifloat or not, its range's ends, a minifloat's mantissa
    bits and bias."""
    fmt = value.traits.minifloat
    lo, hi = value.range()
    return fmt is not None, float(lo), float(hi), fmt.mantissa_bits if fmt else 0, fmt.bias if fmt else 0


def _weight_rows(weights: torch.Tensor | None, blocks: torch.Tensor, grid: BlockGrid) -> torch.Tensor | None:
    """Integer weights (float64, broadcastable to the piece) as int32 in `block_rows`' layout, or None."""
    if weights is None:
        return None
    return block_rows(broadcast_to_blocks(weights, grid).expand(blocks.shape), grid).to(torch.int32)


def _flat_f32(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).to(torch.float32).contiguous()


def _address(t: torch.Tensor | None, offset: int) -> int:
    """The address `offset` bytes into `t`, or 0 for none."""
    return 0 if t is None else t.data_ptr() + offset
