"""Measuring a quantized tensor where its payload is: the one decode, its error statistics, its bound check.

`Measurement.add` decodes a payload against its source on their device (CPU or CUDA) and accumulates,
in device tensors, what `--stats` reports (`qcli.codec.ErrorSums`) and the first block whose error is
over its scheme's bound (`qcli.verify.block_errors`, `qcli.verify.error_bound`; NaN counts as over).
Nothing in it waits for the device: `stats` and `failure` read the results back afterwards.

Device memory stays bounded whatever the tensor: a tensor is measured in row slices of whole blocks
along its first axis, each of at most `SLICE_VALUES` values, its payload carved out of the tensor's
(`qcli.layout.row_regions`). The temporaries of one slice take at most `BYTES_PER_VALUE` bytes per
value. A per-tensor or two-level scheme's bound depends on the whole tensor (`Whole`), taken first in a
cheap pass over the slices, or handed in by a caller that holds the tensor in row chunks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from qcli.scheme import Calibration, QuantScheme

if TYPE_CHECKING:
    import torch

    from qcli.codec import ErrorStats
    from qcli.codec.stats import ErrorSums

SLICE_VALUES = 1 << 24
# The source widened to f32, the decode, the int64 codes the decode indexes with, and the bound's and
# the block errors' f32 block views: within 24 bytes per value of a slice at once.
BYTES_PER_VALUE = 24


@dataclass(frozen=True)
class BoundFailure:
    """The first block (flat index in the tensor's block grid) whose decode is over its bound."""

    block: int
    error: float
    bound: float


@dataclass(frozen=True)
class Whole:
    """What a per-tensor or two-level scheme's scales depend on, over the whole tensor: the largest |x|
    (f32, held as f64) and the float64 sum of |x| over `count` values, as device tensors of shape [1]."""

    peak: torch.Tensor
    total: torch.Tensor
    count: int

    @staticmethod
    def of(x: torch.Tensor) -> Whole:
        """The whole of `x`, a slice of rows at a time."""
        import torch

        peak = torch.zeros(1, dtype=torch.float64, device=x.device)
        total = torch.zeros(1, dtype=torch.float64, device=x.device)
        for start, stop in _slices(tuple(x.shape), 1):
            part = _rows(x, start, stop).to(torch.float32).abs()
            if part.numel():
                peak = torch.maximum(peak, part.amax().to(torch.float64))
                total += part.sum(dtype=torch.float64)
        return Whole(peak, total, x.numel())

    def add(self, other: Whole) -> Whole:
        import torch

        return Whole(torch.maximum(self.peak, other.peak), self.total + other.total, self.count + other.count)

    def mean(self) -> torch.Tensor:
        """mean |x|, float64 (docs/arithmetic.md's AbsMean alpha before its f32 rounding)."""
        return self.total / max(self.count, 1)


@dataclass
class Measurement:
    """The error sums of a quantized tensor and its first block over the bound (-1: none yet, with that
    block's error and bound), as device tensors, accumulated part by part in block order."""

    sums: ErrorSums
    block: torch.Tensor
    error: torch.Tensor
    bound: torch.Tensor

    @staticmethod
    def on(device: torch.device | str) -> Measurement:
        import torch

        from qcli.codec.stats import ErrorSums

        nothing = torch.full((1,), -1, dtype=torch.int64, device=device)
        zero = torch.zeros(1, dtype=torch.float64, device=device)
        return Measurement(ErrorSums.zeros(device), nothing, zero, zero.clone())

    def add(
        self, x: torch.Tensor, payload: torch.Tensor, scheme: QuantScheme, calibration: Calibration,
        whole: Whole | None = None, first_row: int = 0,
    ) -> None:
        """Decode `payload` (uint8, on `x`'s device) and measure it against its source `x` (any float
        dtype, the tensor's out shape) into this measurement, a row slice at a time.

        `x` may be rows `first_row ..` of a larger tensor (whole blocks along the first axis), measured
        after the rows before it; `whole` must then be that tensor's for a per-tensor or two-level scheme
        (without it, `x` is taken for the whole tensor).
        """
        from qcli.codec.blocks import BlockGrid

        shape = tuple(x.shape)
        if whole is None and (scheme.block is None or scheme.is_two_level()):
            whole = Whole.of(x)
        step = _step(scheme, shape)
        blocks_per_row = math.prod(BlockGrid.of(scheme, shape).grid[1:]) if len(shape) >= 2 else 0
        for start, stop in _slices(shape, step):
            first_block = 0 if scheme.block is None else (first_row + start) // step * blocks_per_row
            self._add_slice(_rows(x, start, stop), _carve(payload, scheme, shape, start, stop), scheme,
                            calibration, whole, first_block)

    def _add_slice(
        self, x: torch.Tensor, payload: torch.Tensor, scheme: QuantScheme, calibration: Calibration,
        whole: Whole | None, first_block: int,
    ) -> None:
        import torch

        import qcli.codec
        from qcli.verify import block_errors, error_bound

        decoded = qcli.codec.decode(payload, scheme, tuple(x.shape))
        self.sums.add(x, decoded)
        x = x.to(torch.float32)  # widened once for both measures, which then take it as it is
        errors = block_errors(x, decoded, scheme).reshape(-1)
        if not errors.numel():
            return
        bounds = error_bound(x, scheme, calibration, whole).reshape(-1)
        over = ~(errors <= bounds)  # NaN counts as over
        first = over.to(torch.uint8).argmax().reshape(1)  # the first over, or 0 when none is
        take = over.index_select(0, first) & (self.block < 0)
        self.block = torch.where(take, first + first_block, self.block)
        self.error = torch.where(take, errors.index_select(0, first), self.error)
        self.bound = torch.where(take, bounds.index_select(0, first), self.bound)

    def stats(self) -> ErrorStats:
        """The error statistics, read back to the host."""
        return self.sums.stats()

    def failure(self) -> BoundFailure | None:
        """The first block over its bound, read back to the host; None when every block is within."""
        import torch

        block, error, bound = torch.cat([self.block.to(torch.float64), self.error, self.bound]).tolist()
        return None if block < 0 else BoundFailure(int(block), error, bound)


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
    import torch

    from qcli import layout

    regions = layout.row_regions(scheme, shape, start, stop)
    if len(regions) == 1:
        return payload
    return torch.cat([payload[offset : offset + length] for offset, _, length in regions])
