"""Each free tensor's loss under each form a target may give it (`qcli.plan.target.Choice`), data-free.

The loss estimates the output error on the layer's inputs. For a weight W [out, in] decoded as Q, it is the sum
over input channels j of importance[j] × the sum over rows of (W - Q)[:, j]². A channel's importance is the mean
square of its activations (from an importance matrix, or measured on calibration text), else 1, which gives
the plain squared error. Each tensor is quantized on the CPU by the codec as the pipeline writes it (transposed
where the plan says so), one tensor in memory at a time."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from qcli.errors import InputError
from qcli.scheme import Calibration
from qcli.text import quoted

if TYPE_CHECKING:
    import torch

    from qcli.io.source import Source
    from qcli.plan.entries import PlanEntry
    from qcli.plan.target import Choice


def measure_losses(choices: Sequence[Choice], source: Source,
                   importance: Mapping[str, torch.Tensor] | None = None) -> None:
    """Fill each choice's `losses`, one per form. A tensor `importance` has no vector for (the token
    embedding, a Linear outside the model's blocks) weighs its channels by the mean importance of all the
    others, so that losses stay comparable across tensors."""
    import torch

    from qcli import codec
    from qcli.pipeline.cpu import source_tensor

    fallback = _mean_importance(importance)
    for choice in choices:
        entry = choice.entry
        x = source_tensor(entry, source).float()
        if entry.decision.transpose:
            x = x.t()
        weights = _weights(entry, importance, fallback)
        calibration = entry.decision.calibration
        if calibration is Calibration.Gptq:
            calibration = Calibration.MinMax  # GPTQ improves on its rounding; the forms are compared by it
        searched = weights if calibration is Calibration.Mse and weights is not None else None
        losses = []
        for preset in choice.forms:
            payload = codec.encode(x, preset.scheme, calibration, name=entry.name, importance=searched)
            error = (codec.decode(payload, preset.scheme, x.shape) - x).square_()
            if weights is not None:
                error.mul_(weights)
            losses.append(float(error.sum(dtype=torch.float64)))
            del payload, error
        choice.losses = losses
        del x


def _mean_importance(importance: Mapping[str, torch.Tensor] | None) -> float | None:
    if not importance:
        return None
    total = sum(float(v.double().sum()) for v in importance.values())
    count = sum(v.numel() for v in importance.values())
    return total / count if count else None


def _weights(entry: PlanEntry, importance: Mapping[str, torch.Tensor] | None, fallback: float | None
             ) -> torch.Tensor | None:
    """Each element's weight as written (broadcastable): its input channel's importance, a row [in] or, for
    a tensor written transposed, a column [in, 1]; the fallback as a scalar; None for plain squared error."""
    import torch

    vector = None if importance is None else importance.get(entry.name)
    if vector is None:
        return None if fallback is None else torch.tensor(fallback, dtype=torch.float32)
    channels = entry.shape[-1] if entry.shape else 1
    if tuple(vector.shape) != (channels,):
        raise InputError(f"the importance of tensor {quoted(entry.name)} has shape {list(vector.shape)}, not "
                         f"[{channels}]: one value per input channel", hint="compute it on this model's tensors")
    vector = vector.float()
    return vector.reshape(-1, 1) if entry.decision.transpose else vector
