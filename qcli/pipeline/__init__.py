"""The pipelines: the plan's tensors from their source to payload bytes, one tensor at a time, in plan order.

Two pipelines keep one contract (`Pipeline`) and yield the same bytes and measurements: `cpu` (torch and
`qcli.codec`) and `gpu` (the Triton kernels, with reads, copies and kernels overlapped). `device` chooses
one for a run and reads the environment's settings for it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, Protocol

from qcli.sizes import parse_size

if TYPE_CHECKING:
    import torch

    from qcli.io.source import Source
    from qcli.measure import Measurement
    from qcli.plan.entries import Plan, PlanEntry


class Payload(NamedTuple):
    """One plan entry as a pipeline yields it."""

    entry: PlanEntry
    data: torch.Tensor  # the payload, 1-D uint8, `entry.out_nbytes` long
    measurement: Measurement | None  # with `measure`, a quantized tensor's one decode against its source
    read_seconds: float  # the time spent loading its source, so that the caller can tell it from compute


class Pipeline(Protocol):
    def __call__(self, plan: Plan, source: Source, measure: bool = False, *,
                 importance: Mapping[str, torch.Tensor] | None = None) -> Iterator[Payload]:
        """Every plan entry once, in order; a payload is valid until the generator is resumed twice more.
        `importance` maps tensor names to their input channels' importance, which weighs the scale search
        of their Mse schemes (`qcli.pipeline.cpu.entry_importance`)."""
        ...


@dataclass(frozen=True)
class GpuSettings:
    """The memory the GPU pipeline may take (docs/benchmarks.md says how each bounds it)."""

    budget: int = 8 << 30  # QCLI_GPU_BUDGET: device bytes for the tensors in flight
    piece_bytes: int = 256 << 20  # QCLI_PIECE_BYTES: one pinned staging read (two are allocated)
    read_slice: int = 16 << 20  # bytes one reader thread reads at a time

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> GpuSettings:
        """The defaults, with each variable that is set and not blank in its place."""
        sizes = {field: parse_size(environ[name], name) for field, name in _VARIABLES.items()
                 if environ.get(name, "").strip()}
        return cls(**sizes)


_VARIABLES = {"budget": "QCLI_GPU_BUDGET", "piece_bytes": "QCLI_PIECE_BYTES"}
