"""The CPU pipeline: one tensor at a time, in plan order, from the source to payload bytes.

Peak memory is bounded by the largest tensor (its source and its payload; `encode` widens and gathers a
chunk at a time), never by the model. The GPU pipeline (`qcli.gpu.pipeline.run`) has the same signature
and yields the same bytes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from qcli.io.safetensors import SafetensorsSource
    from qcli.plan import Plan, PlanEntry


def run(plan: Plan, source: SafetensorsSource) -> Iterator[tuple[PlanEntry, torch.Tensor]]:
    """Yield every plan entry once, in order, with its payload as a 1-D uint8 tensor.

    A kept tensor's payload is its source bytes, unchanged; a quantized one is `qcli.codec.encode`'s.
    Either is transposed first when the decision says so (the plan allows that for 2-D tensors only).
    """
    import torch

    from qcli.codec import encode

    for entry in plan.entries:
        x = source.load(entry.info.name)
        if entry.decision.transpose:
            x = x.t()
        scheme = entry.decision.scheme
        if scheme is None:
            payload = x.contiguous().reshape(-1).view(torch.uint8)
        else:
            payload = encode(x, scheme, entry.decision.calibration, name=entry.info.name)
        del x
        yield entry, payload
