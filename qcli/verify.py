"""Verified output: each quantized tensor's one decode within its scheme's error bound, and the written
files read back.

While the output is written, each quantized payload is decoded once, by the pipeline on the device
that holds it (`qcli.measure`; the same decode gives the error statistics), and must lie, block by
block, within its scheme's error bound of its source (`block_errors`, `error_bound`; `out_of_bound` is
the error when it does not); the writer records a digest of every payload it writes (`qcli.io.digest`),
a kept tensor's being its source bytes as written. Before the rename, the complete files are opened
again with the bounded reader (`read_back`): every input tensor must be there exactly once, with the
dtype, shape and length the plan gave it, and its bytes must hash to what was checked. Nothing is
decoded or read from the source twice. Any failure is an `OutputError`; the caller then leaves the
target untouched.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qcli.errors import InputError, OutputError
from qcli.scheme import F32_MIN_POSITIVE, Calibration, QuantScheme, QuantValue, ScaleDtype

if TYPE_CHECKING:
    import torch

    from qcli.measure import BoundFailure, Whole

# Half the widest gap between neighbouring values of the grid, in units of the scale: integers round
# to the nearest whole step; a minifloat's widest gap is its top binade (416..448, 49152..57344, 4..6).
_HALF_STEP = {
    QuantValue.Q8F: 0.5, QuantValue.Q8S: 0.5, QuantValue.Q4F: 0.5, QuantValue.Q4S: 0.5,
    QuantValue.Q2F: 0.5, QuantValue.Q2S: 0.5,
    QuantValue.E4M3: 16.0, QuantValue.E5M2: 4096.0, QuantValue.E2M1: 1.0,
}
# How far above the exact scale `round_up` may land: one unit of the dtype's last mantissa bit ...
_ROUND_UP_SLACK = {ScaleDtype.F32: 2.0**-23, ScaleDtype.F16: 2.0**-10, ScaleDtype.BF16: 2.0**-7,
                   ScaleDtype.UE4M3: 2.0**-3, ScaleDtype.UE8M0: 1.0}
# ... or, below the dtype's normal range, its subnormal spacing: round_up(f32::MIN_POSITIVE).
_ROUND_UP_FLOOR = {ScaleDtype.F32: F32_MIN_POSITIVE, ScaleDtype.F16: 2.0**-24,
                   ScaleDtype.BF16: F32_MIN_POSITIVE, ScaleDtype.UE4M3: 2.0**-9, ScaleDtype.UE8M0: 2.0**-126}
_F32_ROUNDING = 2.0**-20  # generous cover for the f32 divisions and products on the way


@dataclass(frozen=True)
class Verified:
    """How many tensors were read back, their bytes, and the time taken."""

    tensors: int
    bytes: int
    seconds: float


def error_bound(
    x: torch.Tensor, scheme: QuantScheme, calibration: Calibration, whole: Whole | None = None
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
    import torch

    from qcli.codec.blocks import BlockGrid

    if whole is None and (scheme.block is None or scheme.is_two_level()):
        from qcli.measure import Whole

        whole = Whole.of(x)
    grid = BlockGrid.of(scheme, x.shape)
    if scheme.block is None:
        return bound_of(whole.peak.reshape(grid.grid), None, scheme, calibration, whole)
    blocks = grid.to_blocks(x.to(torch.float32)).abs()  # in f32, as the codec measures it
    peak = blocks.amax(dim=grid.block_axes)
    mean = None
    if calibration is Calibration.AbsMean:
        mean = blocks.sum(dim=grid.block_axes, dtype=torch.float64) / grid.counts(x.device)
    return bound_of(peak, mean, scheme, calibration, whole)


def bound_of(
    peak: torch.Tensor, mean: torch.Tensor | None, scheme: QuantScheme, calibration: Calibration,
    whole: Whole | None,
) -> torch.Tensor:
    """`error_bound` from each block's largest |x| (`peak`, grid-shaped) and, for AbsMean, its mean |x|
    (`mean`, float64); for a per-tensor or two-level scheme, `whole` is the tensor's."""
    import torch

    value, dtype = scheme.value, scheme.scale_dtype()
    peak = peak.to(torch.float64)
    if scheme.block is None:
        alpha = whole.mean().reshape(peak.shape) if calibration is Calibration.AbsMean else peak
    else:
        alpha = mean if calibration is Calibration.AbsMean else peak
    h = value.half_range()
    if scheme.is_two_level():
        global_scale = torch.clamp(whole.peak / h / dtype.max_representable(), min=F32_MIN_POSITIVE)
        cap, floor = float("inf"), global_scale * (1 + _F32_ROUNDING) * _ROUND_UP_FLOOR[dtype]
    else:
        cap, floor = dtype.max_representable(), _ROUND_UP_FLOOR[dtype]
    s_high = torch.clamp(peak / h * (1 + _ROUND_UP_SLACK[dtype]), max=cap) * (1 + _F32_ROUNDING) + floor
    s_low = torch.clamp(alpha / h, max=cap) * (1 - _F32_ROUNDING)
    return _bound(peak, s_high, s_low, scheme)


def _bound(peak: torch.Tensor, s_high: torch.Tensor, s_low: torch.Tensor, scheme: QuantScheme) -> torch.Tensor:
    """Half a grid step at the largest scale a block may have, plus what clamping cuts off above `reach`
    steps at the smallest, plus the f32 rounding on the way (all grid-shaped f64)."""
    import torch

    value = scheme.value
    a, b = value.range()
    reach = b if value.is_minifloat() else min(-a, b)
    clamped = torch.clamp(peak - reach * s_low, min=0)
    return _HALF_STEP[value] * s_high + clamped + peak * _F32_ROUNDING


def stored_bound(x: torch.Tensor, payload: Any, scheme: QuantScheme) -> torch.Tensor:
    """The largest error each block of `x` may show when its payload holds `x` quantized with the scales
    the payload stores (`qcli.codec.decode.block_scales`), grid-shaped f64: `error_bound`'s terms at that
    one scale.

    Unlike `error_bound` it trusts the payload's scales; `inspect --compare` takes the smaller of the two
    per block, so that neither a payload of other data nor one with inflated scales passes.
    """
    import torch

    from qcli.codec.blocks import BlockGrid
    from qcli.codec.decode import block_scales

    grid = BlockGrid.of(scheme, x.shape)
    peak = grid.to_blocks(x.to(torch.float32)).abs().amax(dim=grid.block_axes).to(torch.float64)
    s = block_scales(payload, scheme, x.shape).to(torch.float64).abs()
    return _bound(peak, s * (1 + _F32_ROUNDING), s * (1 - _F32_ROUNDING), scheme)


def block_errors(x: torch.Tensor, decoded: torch.Tensor, scheme: QuantScheme) -> torch.Tensor:
    """max |x - decoded| per block, grid-shaped f64 (the difference taken in f32: within the bound's slack)."""
    import torch

    from qcli.codec.blocks import BlockGrid

    grid = BlockGrid.of(scheme, x.shape)
    difference = (x.to(torch.float32) - decoded.to(torch.float32)).abs_()
    return grid.to_blocks(difference).amax(dim=grid.block_axes).to(torch.float64)


def out_of_bound(failure: BoundFailure, scheme: QuantScheme, name: str, target: Path) -> OutputError:
    """The `OutputError` for tensor `name` whose decode lies outside its scheme's bound in `failure`'s block."""
    return _failed(target, f"tensor '{name}' decodes {failure.error:.6g} away from its source in "
                   f"block {failure.block}, over its scheme's bound {failure.bound:.6g} ({scheme})")


def read_back(
    paths: Sequence[Path], plan: Any, inputs: Iterable[str], digests: Mapping[str, bytes],
    targets: Sequence[Path] | None = None,
) -> Verified:
    """Read the written files back and check them against `plan`; raises `OutputError` naming what is wrong.

    Every name of `inputs` must be there exactly once, with the dtype, shape and length the plan gave
    it, and its bytes must hash to the digest the writer recorded for them (`digests`, `qcli.io.digest`),
    read from the file a piece at a time.
    `targets` are the names the files will have, used in messages (the files themselves may still be
    temporary ones).
    """
    from qcli.io.burnpack import BurnpackReader
    from qcli.io.dtypes import parse_dtype

    started = time.perf_counter()
    targets = targets or paths
    found: dict[str, tuple[Any, Any, Path]] = {}
    for path, target in zip(paths, targets, strict=True):
        try:
            reader = BurnpackReader.open(path)
        except InputError as exc:
            raise _failed(target, f"it does not read back: {exc.message}") from None
        for written in reader.entries():
            if written.name in found:
                raise _failed(target, f"tensor '{written.name}' is written twice")
            found[written.name] = (reader, written, target)
    inputs = set(inputs)
    for name in sorted(inputs | {entry.info.name for entry in plan.entries}):
        if name not in found:
            raise _failed(targets[0], f"input tensor '{name}' is missing from the output")
    for name in sorted(set(found) - inputs):
        raise _failed(found[name][2], f"tensor '{name}' is not in the input")
    read = 0
    for entry in plan.entries:
        name = entry.info.name
        reader, written, target = found[name]
        expected = (parse_dtype(entry.out_dtype), tuple(entry.out_shape), entry.out_nbytes)
        if (written.dtype, written.shape, written.nbytes) != expected:
            raise _failed(target, f"tensor '{name}' is written as {written.dtype} {list(written.shape)} "
                          f"in {written.nbytes} bytes; the plan says {expected[0]} {list(expected[1])} in "
                          f"{expected[2]} bytes")
    by_file: dict[Any, list[str]] = {}
    for name, (reader, _, _) in found.items():
        by_file.setdefault(reader, []).append(name)
    for reader, names in by_file.items():
        for name, got in _written_digests(reader, names).items():
            if got != digests[name]:
                raise _failed(found[name][2], f"tensor '{name}' reads back other bytes than were written")
            read += found[name][1].nbytes
    return Verified(len(plan.entries), read, time.perf_counter() - started)


def _written_digests(reader: Any, names: list[str]) -> dict[str, bytes]:
    """The digest of each named tensor's bytes in the file `reader` opened."""
    from qcli.io.digest import digest_file

    fd = os.open(reader.path, os.O_RDONLY)
    try:
        result = {}
        for name in names:
            start, end = reader.data_offsets(name)
            result[name] = digest_file(fd, reader.data_start + start, end - start)
        return result
    finally:
        os.close(fd)


def _failed(path: Path, problem: str) -> OutputError:
    return OutputError(
        f"verification of {path} failed: {problem}",
        hint="nothing was written at the target; run again, and if it fails again report it with the "
        "command line (--no-verify skips the check)",
    )
