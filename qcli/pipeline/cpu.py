"""The CPU pipeline: one tensor at a time, in plan order, from the source to payload bytes.

Peak memory is bounded by the largest tensor (its source and its payload; `encode` widens and gathers a
chunk at a time, and hands each chunk's decode to the measurement while the chunk is in cache), never
by the model.
"""

from __future__ import annotations

import ctypes
import functools
import sys
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

import torch

from qcli import codec
from qcli.errors import InputError
from qcli.io.dtypes import torch_dtype
from qcli.measure import Measurement
from qcli.pipeline import Payload
from qcli.scheme import Calibration
from qcli.text import printable, quoted

if TYPE_CHECKING:
    from qcli.io.source import Source
    from qcli.plan.entries import Plan, PlanEntry


def run(plan: Plan, source: Source, measure: bool = False, *,
        importance: Mapping[str, torch.Tensor] | None = None) -> Iterator[Payload]:
    """Every plan entry once, in order, as a `Payload` (`qcli.pipeline`); its measurement is None for a
    kept tensor. `importance` maps a tensor's name to its input channels' importance, which weighs its
    scale search under Mse (`entry_importance`).

    A kept tensor's payload is its source bytes, unchanged, or its values cast (`cast_kept`) when the
    decision says so; a quantized one is `qcli.codec.encode`'s. Either is transposed first when the
    decision says so (the plan allows that for 2-D tensors only). A transcoded tensor's is `transcoded`;
    a requantized one is quantized from its dequantized values (`source_tensor`).
    """
    keep_freed_memory()
    for entry in plan.entries:
        started = time.perf_counter()
        x = source_tensor(entry, source)
        read_seconds = time.perf_counter() - started
        if entry.encoding.transpose:
            x = x.t()
        scheme, calibration = entry.encoding.scheme, entry.decision.calibration
        measured, transcode = None, entry.decision.transcode
        if transcode is not None:
            payload = transcoded(entry, x, source)
        elif scheme is None:
            if entry.decision.cast is not None:
                x = cast_kept(x, entry.decision.cast, entry.info.name)
            payload = x.contiguous().reshape(-1).view(torch.uint8)
        else:
            measured = Measurement.on(x.device) if measure else None
            chunks = measured.measuring(x, scheme, calibration) if measured else None
            payload = codec.encode(x, scheme, calibration, name=entry.info.name, observer=chunks,
                                   importance=entry_importance(entry, importance))
            if chunks is not None:
                chunks.finish()
        del x
        yield Payload(entry, payload, measured, read_seconds)


# glibc's mallopt parameters, and the size below which freed memory stays in the heap for reuse
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_REUSED_BELOW = 1 << 30


@functools.cache
def keep_freed_memory() -> None:
    """Have glibc keep freed blocks under 1 GiB in the heap for the next tensor, once per process.

    By default it maps every block over 32 MiB (a source tensor, a payload) afresh and unmaps it when
    freed, and returns the heap's free top: the next tensor's memory then takes a page fault per 4 KiB
    page on first touch, measured at 4-7 us a page on the 2-core VM of docs/benchmarks.md, about ten times
    the cost of filling the page. Freed memory stays resident for the next tensor instead. Elsewhere than
    Linux, or in a C library without mallopt, nothing changes.
    """
    if not sys.platform.startswith("linux"):
        return
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is not None:
        mallopt(_M_MMAP_THRESHOLD, _REUSED_BELOW)
        mallopt(_M_TRIM_THRESHOLD, _REUSED_BELOW)


def source_tensor(entry: PlanEntry, source: Source) -> torch.Tensor:
    """The tensor an entry is written from: its own, or a requantized tensor's dequantized values (its
    companions loaded here), which both pipelines quantize."""
    requantize = entry.decision.requantize
    return source.load(entry.info.name) if requantize is None else requantize.dequantize(source.load)


def entry_importance(entry: PlanEntry, importance: Mapping[str, torch.Tensor] | None) -> torch.Tensor | None:
    """The importance an entry's scale search takes, from the mapping's vector under the name it is written
    under (`PlanEntry.name`: GPTQ's `m.qweight` is `m.weight`): float, one value per element of its
    source's last axis (a Linear's input channels), as it is, or as a column where the tensor is written
    transposed, its input channels then along the first axis. None where the mapping has none for it, or
    its decision searches no scale (only Mse does); both pipelines take it from here. `InputError` for a
    vector of another length."""
    decision = entry.decision
    searched = decision.scheme is not None and decision.transcode is None and decision.calibration is Calibration.Mse
    vector = importance.get(entry.name) if importance is not None and searched else None
    if vector is None:
        return None
    channels = entry.shape[-1] if entry.shape else 1
    if tuple(vector.shape) != (channels,):
        raise InputError(f"the importance of tensor {entry.name!r} has shape {list(vector.shape)}, not "
                         f"[{channels}]: one value per input channel (the last axis of its shape "
                         f"{list(entry.shape)})", hint="compute the importance on this model's tensors")
    return vector.reshape(-1, 1) if entry.encoding.transpose else vector


def transcoded(entry: PlanEntry, codes: torch.Tensor, source: Source) -> torch.Tensor:
    """A transcoded entry's payload from its codes as stored, its companions loaded here: both pipelines
    write it so. `InputError` where a block's scale (or a two-level scheme's global) is NaN or infinite, as
    in a damaged checkpoint: its decode would be NaN or Inf, a model no one can use."""
    from qcli.codec.decode import unfinite_blocks

    transcode, scheme = entry.decision.transcode, entry.encoding.scheme
    assert transcode is not None and scheme is not None, "a transcoded entry has both"
    payload = transcode.payload(codes, source.load)
    bad, blocks = unfinite_blocks(payload, scheme, entry.encoding.shape)
    if bad:
        raise InputError(printable(f"{entry.info.file}: tensor {quoted(entry.info.name)} ({transcode.format}) has "
                                   f"scales that are NaN or infinite in {bad} of its {blocks} blocks, so it would "
                                   "decode to NaN or Inf"),
                         hint="the checkpoint is damaged; convert or download it again (nothing was written)")
    return payload


def cast_kept(x: torch.Tensor, dtype: str, name: str) -> torch.Tensor:
    """A kept floating tensor's values in `dtype` (F32, F16, BF16), rounded as torch's `.to()` rounds (to
    nearest, ties to even); the CPU and GPU pipelines both cast with it, and `inspect --compare` compares with it.

    `InputError` when a finite value does not fit `dtype` (over 65504 for F16) and would become infinite.
    """
    y = x.to(torch_dtype(dtype))
    if y.dtype.itemsize <= x.dtype.itemsize and x.dtype != y.dtype:  # a narrowing cast can overflow
        overflow = torch.isinf(y) & torch.isfinite(x)
        if bool(overflow.any()):
            worst = float(x[overflow].abs().max())
            raise InputError(f"tensor '{name}' holds {worst:g}, which {dtype} cannot hold: cast = \"{dtype}\" "
                             "would write it as infinity",
                             hint="cast it to a wider dtype (F32, or BF16 for its range), or keep its own dtype")
    return y
