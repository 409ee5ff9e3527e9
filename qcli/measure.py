"""Measuring a quantized tensor where its payload is: the one decode, its error statistics, its bound check.

`Measurement.add` decodes a payload against its source on their device (a GPU's, in the GPU pipeline)
and accumulates, in device tensors, what `--stats` reports (`qcli.codec.ErrorSums`) and the first block
whose error is over its scheme's bound (`error_bound`; NaN counts as over). Nothing in it
waits for the device: `stats` and `failure` read the results back afterwards. The CPU pipeline measures
a tensor while the codec encodes it instead (`Measurement.measuring`, `ChunkedTensor`), a chunk at a time
while the chunk is in cache: from its codes in the compiled loop (`qcli.codec.search_loop.measured`), the
bytes just packed unpacked for the chunk's first rows and held to them, or from the decode of all of them
without the loop. The bound itself is here, beside the decode it
judges: `error_bound` from the source alone, `stored_bound` from the scales a payload stores (which
`inspect --compare` also takes).

Device memory stays bounded whatever the tensor: a tensor is measured in row slices of whole blocks
along its first axis, each of at most `SLICE_VALUES` values, its payload carved out of the tensor's
(`qcli.layout.row_regions`). The temporaries of one slice take at most `BYTES_PER_VALUE` bytes per
value. A per-tensor or two-level scheme's bound depends on the whole tensor (`qcli.tensor_range`), taken
first in a cheap pass over the slices (`whole_range`), or handed in by a caller that holds the tensor in row
chunks.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch

import qcli.codec
from qcli import layout
from qcli.codec import search_loop
from qcli.codec.blocks import counts, to_blocks
from qcli.codec.decode import block_scales
from qcli.codec.search import CLIPS
from qcli.codec.stats import ErrorSums
from qcli.problem import Kind, Problem, Severity
from qcli.scheme import F32_MIN_POSITIVE, Calibration, QuantScheme, ScaleDtype, accept_problems
from qcli.tensor_range import TensorRange, taken
from qcli.text import quoted

if TYPE_CHECKING:
    from qcli.error_stats import ErrorStats

SLICE_VALUES = 1 << 24
# The source widened to f32, the decode, the int64 codes the decode indexes with, and the bound's and
# the block errors' f32 block views: within 24 bytes per value of a slice at once.
BYTES_PER_VALUE = 24
BOUND_BLOCKS = 1 << 16  # blocks whose bound `ChunkedTensor.finish` computes at once
# The share of each encoded chunk's rows (one in this many) whose packed bytes the CPU pipeline unpacks
# and holds to their fields where the compiled loop measures the chunk from them: every chunk's first
# rows, so that each tensor's packing is checked without unpacking it whole.
UNPACKED_SHARE = 16


@dataclass(frozen=True)
class BoundFailure:
    """The first block (flat index in the tensor's block grid) whose decode is over its bound."""

    block: int
    error: float
    bound: float


def whole_range(x: torch.Tensor) -> TensorRange:
    """What the bound of a per-tensor or two-level scheme needs of `x`: its largest |x| and its sum of |x|,
    a slice of rows at a time."""
    peak = torch.zeros(1, dtype=torch.float32, device=x.device)
    total = torch.zeros(1, dtype=torch.float64, device=x.device)
    for start, stop in _slices(tuple(x.shape), 1):
        part = _rows(x, start, stop).to(torch.float32).abs()
        if part.numel():
            peak = torch.maximum(peak, part.amax())
            total += part.sum(dtype=torch.float64)
    return TensorRange(peak, total, x.numel())


# -- The error bound of a scheme, from the source: what every block's decode must lie within -------

_F32_ROUNDING = 2.0**-20  # generous cover for the f32 divisions and products on the way


def error_bound(
    x: torch.Tensor, scheme: QuantScheme, calibration: Calibration, whole: TensorRange | None = None
) -> torch.Tensor:
    """The largest error each block of `x` may show after quantizing with `scheme`, grid-shaped f64.

    Derived from the source alone, never from the payload's own scales: with `m` the block's max |x|
    and `s` the scale the arithmetic (docs/arithmetic.md) picks, an element is off by at most half a
    grid step times `s`, plus what clamping cuts off above `reach * s` (AbsMean, Q8F's 127 of 127.5,
    a scale saturated at its dtype's maximum). `s` is bounded above by `m / h` rounded up onto the
    scale dtype, and below by `alpha / h`. The scales of a per-tensor or two-level scheme depend on the
    whole tensor: when `x` is rows of it, `whole` says what they depend on (else it is taken from `x`).
    Works on `x`'s device without waiting for it.
    """
    if whole is None and (scheme.block is None or scheme.is_two_level()):
        whole = whole_range(x)
    return bound_of(*block_ranges(x, scheme, calibration, whole), scheme, calibration, whole)


def block_ranges(
    x: torch.Tensor, scheme: QuantScheme, calibration: Calibration, whole: TensorRange | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Each block's largest |x| (grid-shaped) and, for AbsMean, its mean |x| (float64), in f32 as the codec
    measures them; a per-tensor scheme's one block is `whole`'s."""
    grid = layout.BlockGrid.of(scheme, x.shape)
    if scheme.block is None:
        assert whole is not None, "a per-tensor scheme's one block is the whole tensor"
        return taken(whole.peak).reshape(grid.grid), None
    blocks = to_blocks(x.to(torch.float32), grid).abs()
    peak = blocks.amax(dim=grid.block_axes)
    mean = None
    if calibration is Calibration.AbsMean:
        mean = blocks.sum(dim=grid.block_axes, dtype=torch.float64) / counts(grid, x.device)
    return peak, mean


def needed_scales(
    peak: torch.Tensor, mean: torch.Tensor | None, scheme: QuantScheme, calibration: Calibration,
    whole: TensorRange | None,
) -> torch.Tensor:
    """The scale each block needs before `round_up` puts it on the scale dtype's grid, float64: its range
    over the value type's half range, relative to the f32 global of a two-level scheme."""
    alpha = _alpha(peak.to(torch.float64), mean, scheme, calibration, whole)
    h = scheme.value.half_range()
    if scheme.is_two_level():
        return alpha / h / _global_scale(whole, scheme)
    return alpha / h


def _alpha(peak: torch.Tensor, mean: torch.Tensor | None, scheme: QuantScheme, calibration: Calibration,
           whole: TensorRange | None) -> torch.Tensor:
    """The range each block's scale covers (docs/arithmetic.md §1), from `block_ranges`."""
    if scheme.block is None:
        assert whole is not None, "a per-tensor scheme's one block is the whole tensor"
        return whole.mean().reshape(peak.shape) if calibration is Calibration.AbsMean else peak
    return taken(mean) if calibration is Calibration.AbsMean else peak


def _global_scale(whole: TensorRange | None, scheme: QuantScheme) -> torch.Tensor:
    """A two-level scheme's f32 global, in float64: the tensor's peak scale over the scale dtype's max."""
    assert whole is not None, "a two-level scheme's global is the whole tensor's"
    h, traits = scheme.value.half_range(), scheme.scale_dtype().traits
    return torch.clamp(taken(whole.peak).to(torch.float64) / h / traits.max, min=F32_MIN_POSITIVE)


def bound_of(
    peak: torch.Tensor, mean: torch.Tensor | None, scheme: QuantScheme, calibration: Calibration,
    whole: TensorRange | None,
) -> torch.Tensor:
    """`error_bound` from each block's largest |x| (`peak`, grid-shaped) and, for AbsMean, its mean |x|
    (`mean`, float64); for a per-tensor or two-level scheme, `whole` is the tensor's. GPTQ moves each
    weight by the error it carries from the columns before, so no bound holds but finiteness (infinity)."""
    if calibration is Calibration.Gptq:
        return torch.full_like(peak, math.inf, dtype=torch.float64)
    value, dtype = scheme.value, scheme.scale_dtype()
    peak = peak.to(torch.float64)
    alpha = _alpha(peak, mean, scheme, calibration, whole)
    h = value.half_range()
    # How far above the exact scale `round_up` may land: one unit of the dtype's last mantissa bit, or,
    # below the dtype's normal range, what it makes of the smallest scale, round_up(f32::MIN_POSITIVE).
    traits = dtype.traits
    floor: float | torch.Tensor
    slack, floor = 2.0**-traits.mantissa_bits, max(traits.smallest, F32_MIN_POSITIVE)
    if scheme.is_two_level():
        cap, floor = float("inf"), _global_scale(whole, scheme) * (1 + _F32_ROUNDING) * floor
    else:
        cap = traits.max
    widest, narrowest = _searched(scheme) if calibration is Calibration.Mse else (1.0, 1.0)
    s_high = torch.clamp(peak / h * widest * (1 + slack), max=cap) * (1 + _F32_ROUNDING) + floor
    s_low = torch.clamp(alpha / h * narrowest, max=cap) * (1 - _F32_ROUNDING)
    if calibration is Calibration.Mse:  # rounded to nearest: down by up to half a step, or to MinMax's floor
        s_low = torch.clamp(s_low * (1 - slack) - floor, min=0)
    return _bound(peak, s_high, s_low, scheme)


def _searched(scheme: QuantScheme) -> tuple[float, float]:
    """How far `Calibration.Mse`'s candidates reach beyond `amax / h`: up to `amax / min(-a, b)` (the scale
    that puts an amax on the nearer end) and down to the smallest clip."""
    a, b = scheme.value.range()
    return scheme.value.half_range() / min(-a, b), min(CLIPS)


def _bound(peak: torch.Tensor, s_high: torch.Tensor, s_low: torch.Tensor, scheme: QuantScheme) -> torch.Tensor:
    """Half a grid step at the largest scale a block may have, plus what clamping cuts off above `reach`
    steps at the smallest, plus the f32 rounding on the way (all grid-shaped f64)."""
    value = scheme.value
    a, b = value.range()
    reach = b if value.is_minifloat() else min(-a, b)
    clamped = torch.clamp(peak - reach * s_low, min=0)
    return value.half_step() * s_high + clamped + peak * _F32_ROUNDING


def stored_bound(x: torch.Tensor, payload: Any, scheme: QuantScheme) -> torch.Tensor:
    """The largest error each block of `x` may show when its payload holds `x` quantized with the scales
    the payload stores (`qcli.codec.decode.block_scales`), grid-shaped f64: `error_bound`'s terms at that
    one scale.

    Unlike `error_bound` it trusts the payload's scales; `inspect --compare` takes the smaller of the two
    per block, so that neither a payload of other data nor one with inflated scales passes.
    """
    grid = layout.BlockGrid.of(scheme, x.shape)
    peak = to_blocks(x.to(torch.float32), grid).abs().amax(dim=grid.block_axes).to(torch.float64)
    s = block_scales(payload, scheme, x.shape).to(torch.float64).abs()
    return _bound(peak, s * (1 + _F32_ROUNDING), s * (1 - _F32_ROUNDING), scheme)


def block_errors(x: torch.Tensor, decoded: torch.Tensor, scheme: QuantScheme) -> torch.Tensor:
    """max |x - decoded| per block, grid-shaped f64 (the difference taken in f32: within the bound's slack)."""
    grid = layout.BlockGrid.of(scheme, x.shape)
    difference = (x.to(torch.float32) - decoded.to(torch.float32)).abs_()
    return to_blocks(difference, grid).amax(dim=grid.block_axes).to(torch.float64)


# -- Measuring: the one decode against its source -------------------------------------------------------

@dataclass(frozen=True)
class RangeLoss:
    """A tensor's blocks whose scale lies outside its scale dtype's range (`Measurement.range_loss`):
    `underflowed` needed a positive scale below the dtype's smallest, so `round_up` gave them that one
    and their values a coarser grid (zeros, below half of it); `saturated` needed one above its largest,
    where their values are clipped. `least` and `largest`: the smallest positive and the largest scale
    the tensor's blocks need (relative to a two-level scheme's global)."""

    scheme: QuantScheme
    blocks: int
    underflowed: int
    saturated: int
    least: float
    largest: float

    @property
    def scale_dtype(self) -> ScaleDtype:
        return self.scheme.scale_dtype()

    def problem(self, tensor: str, sqnr_db: float) -> Problem:
        """The warning a run gives for this tensor, its SQNR and the scale dtypes that hold its scales."""
        traits, lost = self.scale_dtype.traits, []
        if self.underflowed:
            lost.append(f"{self.underflowed} of {self.blocks} blocks need a scale below {self.scale_dtype}'s "
                        f"smallest, {traits.smallest:.3g} (down to {self.least:.3g}): their values are "
                        "quantized coarser, the small ones to zero")
        if self.saturated:
            lost.append(f"{self.saturated} of {self.blocks} blocks need a scale above {self.scale_dtype}'s "
                        f"largest, {traits.max:.6g} (up to {self.largest:.3g}): their values are clipped")
        holders = " or ".join(self.holders())
        if holders:
            key = "tensor_scale" if self.scheme.block is None else "block_scale"
            hint = f"quantize it with {holders} scales, which hold them (a recipe rule's {key}), or keep it"
        elif self.scheme.is_two_level():
            hint = "keep it, or quantize it with a one-level scheme (a preset such as q8s-b32)"
        else:
            hint = "keep it (a recipe rule with keep = true)"
        return Problem(Kind.scale_range, f"tensor {quoted(tensor)}: {'; '.join(lost)}; SQNR {sqnr_db:.1f} dB",
                       hint, Severity.warning, tensors=(tensor,))

    def holders(self) -> list[ScaleDtype]:
        """The other scale dtypes (F16, BF16, F32) whose range holds every needed scale and that Burn
        accepts in this scheme's place of its own (a two-level scheme's block scales: no wider than F16)."""
        held = []
        for dtype in (ScaleDtype.F16, ScaleDtype.BF16, ScaleDtype.F32):
            if dtype is self.scale_dtype or not (dtype.traits.smallest <= self.least
                                                 and self.largest <= dtype.traits.max):
                continue
            block = self.scheme.block
            other = (self.scheme.per_tensor(dtype) if block is None
                     else replace(self.scheme, block=replace(block, dtype=dtype)))
            if not accept_problems(other, Calibration.MinMax):
                held.append(dtype)
        return held


@dataclass
class Measurement:
    """The error sums of a quantized tensor and its first block over the bound (-1: none yet, with that
    block's error and bound), and the blocks whose needed scale is outside the scale dtype's range
    (`range_loss`), as device tensors, accumulated part by part in block order."""

    sums: ErrorSums
    block: torch.Tensor
    error: torch.Tensor
    bound: torch.Tensor
    outside: torch.Tensor  # int64 [underflowed, saturated] blocks
    needed: torch.Tensor  # float64 [least positive, largest] needed scale
    blocks: int = 0
    scheme: QuantScheme | None = None  # of the parts measured
    seconds: float = 0.0  # host time spent measuring: all of it on the CPU, the launches on a GPU

    @staticmethod
    def on(device: torch.device | str) -> Measurement:
        nothing = torch.full((1,), -1, dtype=torch.int64, device=device)
        zero = torch.zeros(1, dtype=torch.float64, device=device)
        outside = torch.zeros(2, dtype=torch.int64, device=device)
        needed = torch.tensor([math.inf, 0.0], dtype=torch.float64, device=device)
        return Measurement(ErrorSums.zeros(device), nothing, zero, zero.clone(), outside, needed)

    def add(
        self, x: torch.Tensor, payload: torch.Tensor, scheme: QuantScheme, calibration: Calibration,
        whole: TensorRange | None = None, first_row: int = 0,
    ) -> None:
        """Decode `payload` (uint8, on `x`'s device) and measure it against its source `x` (any float
        dtype, the tensor's out shape) into this measurement, a row slice at a time.

        `x` may be rows `first_row ..` of a larger tensor (whole blocks along the first axis), measured
        after the rows before it; `whole` must then be that tensor's for a per-tensor or two-level scheme
        (without it, `x` is taken for the whole tensor).
        """
        shape = tuple(x.shape)
        if whole is None and (scheme.block is None or scheme.is_two_level()):
            whole = whole_range(x)
        step = _step(scheme, shape)
        blocks_per_row = math.prod(layout.BlockGrid.of(scheme, shape).grid[1:]) if len(shape) >= 2 else 0
        for start, stop in _slices(shape, step):
            first_block = 0 if scheme.block is None else (first_row + start) // step * blocks_per_row
            self._add_slice(_rows(x, start, stop), _carve(payload, scheme, shape, start, stop), scheme,
                            calibration, whole, first_block)

    def measuring(self, x: torch.Tensor, scheme: QuantScheme, calibration: Calibration) -> ChunkedTensor:
        """What `qcli.codec.encode` hands each decoded chunk of `x` to (its `on_decoded`), measuring the
        tensor into this measurement once `finish` is called after the encode."""
        return ChunkedTensor(self, x, scheme, calibration)

    def _add_slice(
        self, x: torch.Tensor, payload: torch.Tensor, scheme: QuantScheme, calibration: Calibration,
        whole: TensorRange | None, first_block: int,
    ) -> None:
        self.add_decoded(x, qcli.codec.decode(payload, scheme, tuple(x.shape)), scheme, calibration, whole,
                         first_block)

    def add_decoded(
        self, x: torch.Tensor, decoded: torch.Tensor, scheme: QuantScheme, calibration: Calibration,
        whole: TensorRange | None = None, first_block: int = 0,
    ) -> None:
        """Measure `decoded` (f32, of `x`'s shape; overwritten) against its source `x`, whole blocks
        starting at block `first_block` of the tensor's grid (`whole` as for `add`); `seconds` counts
        the host time spent here."""
        started = time.perf_counter()
        if whole is None and (scheme.block is None or scheme.is_two_level()):
            whole = whole_range(x)
        x = x.to(torch.float32)  # widened once for both measures, which then take it as it is
        difference = decoded.sub_(x)
        grid = layout.BlockGrid.of(scheme, tuple(x.shape))
        errors = to_blocks(difference, grid).abs().amax(dim=grid.block_axes).reshape(-1)
        if errors.numel():
            self.sums.add_difference(x, difference)
            self.sums.max_abs = torch.maximum(self.sums.max_abs, errors.amax().to(torch.float64))
            peak, mean = block_ranges(x, scheme, calibration, whole)
            self.take_first_over(errors, bound_of(peak, mean, scheme, calibration, whole).reshape(-1), first_block)
            self.take_range(needed_scales(peak, mean, scheme, calibration, whole), scheme)
        self.seconds += time.perf_counter() - started

    def take_range(self, needed: torch.Tensor, scheme: QuantScheme) -> None:
        """Count the blocks whose needed scale (`needed_scales`) is outside the scheme's scale dtype's range,
        and keep the least positive and the largest; a per-tensor scheme's one block is counted once."""
        traits = scheme.scale_dtype().traits
        needed = needed.reshape(-1)
        if scheme.block is None:
            if self.blocks:
                return
            needed = needed[:1]
        positive = needed > 0
        self.outside += torch.stack([(positive & (needed < traits.smallest)).sum(), (needed > traits.max).sum()])
        least = torch.where(positive, needed, math.inf).amin().reshape(1)
        self.needed = torch.cat([torch.minimum(self.needed[:1], least),
                                 torch.maximum(self.needed[1:], needed.amax().reshape(1))])
        self.blocks += needed.numel()
        self.scheme = scheme

    def take_first_over(self, errors: torch.Tensor, bounds: torch.Tensor, first_block: int) -> None:
        """Record the first of these blocks (flat, from `first_block`) whose error is over its bound
        (NaN counts as over), unless an earlier one is recorded already."""
        over = ~(errors <= bounds)
        first = over.to(torch.uint8).argmax().reshape(1)  # the first over, or 0 when none is
        take = over.index_select(0, first) & (self.block < 0)
        self.block = torch.where(take, first + first_block, self.block)
        self.error = torch.where(take, errors.index_select(0, first).to(torch.float64), self.error)
        self.bound = torch.where(take, bounds.index_select(0, first), self.bound)

    def stats(self) -> ErrorStats:
        """The error statistics, read back to the host."""
        return self.sums.stats()

    def failure(self) -> BoundFailure | None:
        """The first block over its bound, read back to the host; None when every block is within."""
        block, error, bound = torch.cat([self.block.to(torch.float64), self.error, self.bound]).tolist()
        return None if block < 0 else BoundFailure(int(block), error, bound)

    def range_loss(self) -> RangeLoss | None:
        """The blocks whose scale left the scale dtype's range, read back to the host; None when none did."""
        underflowed, saturated = self.outside.tolist()
        if not (underflowed or saturated):
            return None
        least, largest = self.needed.tolist()
        assert self.scheme is not None, "a part was measured"
        return RangeLoss(self.scheme, self.blocks, underflowed, saturated, least, largest)


class ChunkedTensor:
    """A tensor measured while the CPU codec encodes it (a `qcli.codec.quantize.EncodeObserver`), each
    chunk while it is in cache: its error energies go into the measurement's sums, each block's largest
    error into a grid of the tensor's blocks, checked against the bound (`bound_of`) once,
    in `finish`. The bound's inputs are the codec's own block ranges: max|x| under MinMax; under AbsMean
    sum|x|, with max|x| taken here chunk by chunk."""

    def __init__(self, measurement: Measurement, x: torch.Tensor, scheme: QuantScheme, calibration: Calibration
                 ) -> None:
        self.measurement, self.scheme, self.calibration = measurement, scheme, calibration
        self.grid = layout.BlockGrid.of(scheme, tuple(x.shape))
        self.errors = torch.zeros(math.prod(self.grid.grid), dtype=torch.float32)
        self.peaks = self.errors.clone() if calibration is Calibration.AbsMean else None
        self.abs_sums: torch.Tensor | None = None  # the codec's sum|x| per block, under AbsMean
        self.scales: torch.Tensor | None = None

    def begin(self, reduced: torch.Tensor, payload: torch.Tensor) -> None:
        scales = block_scales(payload, self.scheme, self.grid.shape)
        self.scales = scales.reshape(-1).to(torch.float32).contiguous()  # as stored, flat for the loop
        if self.calibration is not Calibration.AbsMean:
            self.peaks = reduced.reshape(-1)
        else:
            self.abs_sums = reduced

    def chunk(self, rows: torch.Tensor, fields: torch.Tensor, values: torch.Tensor, first_block: int) -> None:
        """Measure a chunk just encoded: from its fields and the payload's scales in the compiled loop where
        it is built (`search_loop.measured`: the decode's values, formed as it forms them), its packed bytes
        unpacked for its first rows (`sampled_rows`) and held to those fields, measured as a decode where
        they differ (so a packing fault there is over the bound); else from the decode of all its bytes."""
        from qcli.codec.pack import unpack_fields

        started = time.perf_counter()
        if not search_loop.BUILT:
            self._decoded(rows, values, first_block, energies=True)
        else:
            assert self.scales is not None and self.peaks is not None, "`begin` comes first"
            grid = layout.BlockGrid.of(self.scheme, tuple(rows.shape))
            part = slice(first_block, first_block + math.prod(grid.grid))
            peaks = self.peaks[part] if self.calibration is Calibration.AbsMean else None
            signal, error = search_loop.measured(rows, fields, self.scales[part], grid, self.scheme.value,
                                                 self.errors[part], peaks)
            self.measurement.sums.signal += signal
            self.measurement.sums.error += error
            sample = sampled_rows(self.scheme, tuple(rows.shape))
            if rows.dim() >= 2:
                rows, fields = rows[:sample], fields[:sample]
            values = values[: layout.value_bytes(self.scheme, tuple(rows.shape))]
            if not torch.equal(unpack_fields(values, self.scheme, tuple(rows.shape)), fields):
                self._decoded(rows, values, first_block, energies=False)
        self.measurement.seconds += time.perf_counter() - started

    def _decoded(self, rows: torch.Tensor, values: torch.Tensor, first_block: int, energies: bool) -> None:
        """Decode `rows`' packed bytes `values` with the payload's scales and measure them: each block's
        largest error, and with `energies` the sums."""
        from qcli.codec.decode import decode_values

        assert self.scales is not None and self.peaks is not None, "`begin` comes first"
        grid = layout.BlockGrid.of(self.scheme, tuple(rows.shape))
        part = slice(first_block, first_block + math.prod(grid.grid))
        difference = decode_values(values, self.scales[part], self.scheme, rows.shape).sub_(rows)
        if energies:
            self.measurement.sums.add_difference(rows, difference, quick=True)
        _max_into(self.errors[part], to_blocks(difference.abs_(), grid).amax(dim=grid.block_axes))
        if self.calibration is Calibration.AbsMean:
            _max_into(self.peaks[part], to_blocks(rows, grid).abs().amax(dim=grid.block_axes))

    def finish(self) -> None:
        """Check every block against its bound, and take the largest error into the sums."""
        started = time.perf_counter()
        m = self.measurement
        if self.errors.numel():
            assert self.peaks is not None, "`begin` comes first"
            m.sums.max_abs = torch.maximum(m.sums.max_abs, self.errors.amax().to(torch.float64))
            peak = self.peaks.amax().reshape(1)
            total = torch.zeros(1, dtype=torch.float64) if self.abs_sums is None else self.abs_sums.sum().reshape(1)
            whole = TensorRange(peak, total, math.prod(self.grid.shape))
            means = None
            if self.abs_sums is not None and self.scheme.block is not None:
                means = (self.abs_sums / counts(self.grid)).reshape(-1)
            for start in range(0, self.errors.numel(), BOUND_BLOCKS):  # the bound's f64 temporaries stay small
                part = slice(start, start + BOUND_BLOCKS)
                ranges = self.peaks[part], None if means is None else means[part]
                m.take_first_over(self.errors[part], bound_of(*ranges, self.scheme, self.calibration, whole), start)
                m.take_range(needed_scales(*ranges, self.scheme, self.calibration, whole), self.scheme)
        m.seconds += time.perf_counter() - started


def sampled_rows(scheme: QuantScheme, shape: tuple[int, ...]) -> int:
    """How many first rows of an encoded chunk of `shape` the CPU pipeline unpacks from its packed bytes
    where the compiled loop measures it from its fields: a `UNPACKED_SHARE` of them, in whole blocks (a
    chunk of rank < 2 whole)."""
    if len(shape) < 2:
        return shape[0] if shape else 1
    step = _step(scheme, shape)
    return min(shape[0], max(1, math.ceil(shape[0] / UNPACKED_SHARE / step)) * step)


def _max_into(into: torch.Tensor, part: torch.Tensor) -> None:
    """`into` (a flat slice of a grid) becomes the larger of itself and `part` (NaN wins): a block is
    written once, the one block of a per-tensor scheme once per chunk."""
    torch.maximum(into, part.reshape(-1), out=into)


def _step(scheme: QuantScheme, shape: tuple[int, ...]) -> int:
    """Rows of the first axis one block spans (1 for a per-tensor scheme, whose slices share one scale)."""
    if scheme.block is None or len(shape) < 2:
        return 1
    return scheme.block.size.to_dim_vec(len(shape))[0]


def _slices(shape: tuple[int, ...], step: int) -> list[tuple[int, int]]:
    """Row ranges of at most SLICE_VALUES values (at least `step` rows), in multiples of `step` rows; a
    tensor of rank < 2 is one slice."""
    if len(shape) < 2:
        return [(0, 1)]
    per_row = math.prod(shape[1:])
    rows = max(step, SLICE_VALUES // max(per_row, 1) // step * step)
    return [(start, min(start + rows, shape[0])) for start in range(0, shape[0], rows)] or [(0, 0)]


def _rows(x: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    return x[start:stop] if x.dim() >= 2 else x


def _carve(payload: torch.Tensor, scheme: QuantScheme, shape: tuple[int, ...], start: int, stop: int
           ) -> torch.Tensor:
    """The payload rows [start, stop) would have on their own, from the payload of `shape`."""
    regions = layout.row_regions(scheme, shape, start, stop)
    if len(regions) == 1:
        return payload
    return torch.cat([payload[offset : offset + length] for offset, _, length in regions])
