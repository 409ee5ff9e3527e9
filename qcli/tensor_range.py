"""What the scales of a per-tensor or two-level scheme depend on: a range over the whole tensor.

Such a scheme's scales, and so the bound of its decode, depend on every value of the tensor. A tensor held
in row chunks (the GPU pipeline's) has its range taken first, a chunk at a time, and each chunk is then
encoded (`qcli.kernels.launch.enqueue`) and measured (`qcli.measure.Measurement.add`) with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class TensorRange:
    """Over `count` values of a tensor, as device tensors of shape [1]: `peak`, the largest |x| (f32), and
    `total`, the float64 sum of |x|. Either is None where it was not taken: the kernels take only what the
    scheme's scales need (`qcli.kernels.launch.tensor_range`), the bound both (`qcli.measure.whole_range`)."""

    peak: torch.Tensor | None
    total: torch.Tensor | None
    count: int

    def add(self, other: TensorRange) -> TensorRange:
        """The range of both parts together (taken alike: what one has, the other has)."""
        peak = None if self.peak is None else self.peak.maximum(taken(other.peak))
        total = None if self.total is None else self.total + taken(other.total)
        return TensorRange(peak, total, self.count + other.count)

    def mean(self) -> torch.Tensor:
        """mean |x|, float64 (docs/arithmetic.md's AbsMean alpha before its f32 rounding)."""
        return taken(self.total) / self.count


def taken(part: torch.Tensor | None) -> torch.Tensor:
    """`peak` or `total` where the caller's scheme needs it, and so the range has it."""
    assert part is not None, "the range is taken with what its scheme's scales need"
    return part
