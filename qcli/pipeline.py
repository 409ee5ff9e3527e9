"""The CPU pipeline: one tensor at a time, in plan order, from the source to payload bytes.

Peak memory is bounded by the largest tensor (its source and its payload; `encode` widens and gathers a
chunk at a time, and hands each chunk's decode to the measurement while the chunk is in cache), never
by the model. The GPU pipeline
(`qcli.gpu.pipeline.run`) has the same signature and yields the same bytes and measurements.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from qcli.io.safetensors import SafetensorsSource
    from qcli.measure import Measurement
    from qcli.plan import Plan, PlanEntry


def run(plan: Plan, source: SafetensorsSource, measure: bool = False
        ) -> Iterator[tuple[PlanEntry, torch.Tensor, Measurement | None]]:
    """Yield every plan entry once, in order, with its payload as a 1-D uint8 tensor and, with `measure`,
    a quantized tensor's `Measurement` (its one decode against its source; None for a kept tensor).

    A kept tensor's payload is its source bytes, unchanged, or its values cast (`cast_kept`) when the
    decision says so; a quantized one is `qcli.codec.encode`'s. Either is transposed first when the
    decision says so (the plan allows that for 2-D tensors only).
    """
    import torch

    from qcli.codec import encode
    from qcli.measure import Measurement

    for entry in plan.entries:
        x = source.load(entry.info.name)
        if entry.decision.transpose:
            x = x.t()
        scheme, calibration = entry.decision.scheme, entry.decision.calibration
        measured = None
        if scheme is None:
            if entry.decision.cast is not None:
                x = cast_kept(x, entry.decision.cast, entry.info.name)
            payload = x.contiguous().reshape(-1).view(torch.uint8)
        else:
            measured = Measurement.on(x.device) if measure else None
            chunks = measured.measuring(x, scheme, calibration) if measured else None
            payload = encode(x, scheme, calibration, name=entry.info.name, observer=chunks)
            if chunks is not None:
                chunks.finish()
        del x
        yield entry, payload, measured


def cast_kept(x: torch.Tensor, dtype: str, name: str) -> torch.Tensor:
    """A kept floating tensor's values in `dtype` (F32, F16, BF16), rounded as torch's `.to()` rounds (to
    nearest, ties to even); the CPU and GPU pipelines both cast with it, and `inspect --compare` compares with it.

    `InputError` when a finite value does not fit `dtype` (over 65504 for F16) and would become infinite.
    """
    import torch

    from qcli.errors import InputError
    from qcli.io.dtypes import TORCH_DTYPE_NAMES

    y = x.to(getattr(torch, TORCH_DTYPE_NAMES[dtype]))
    if y.dtype.itemsize <= x.dtype.itemsize and x.dtype != y.dtype:  # a narrowing cast can overflow
        overflow = torch.isinf(y) & torch.isfinite(x)
        if bool(overflow.any()):
            worst = float(x[overflow].abs().max())
            raise InputError(f"tensor '{name}' holds {worst:g}, which {dtype} cannot hold: cast = \"{dtype}\" "
                             "would write it as infinity",
                             hint="cast it to a wider dtype (F32, or BF16 for its range), or keep its own dtype")
    return y
