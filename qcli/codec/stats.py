"""How far a decoded tensor is from its source."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

CHUNK_ELEMENTS = 1 << 20


@dataclass(frozen=True)
class ErrorStats:
    """`rel_rms` = ||x - x'|| / ||x|| (0 when both are zero, inf when only x is), `sqnr_db` = 10 log10 of
    signal over error energy (inf when exact), `max_abs` = max |x - x'|."""

    rel_rms: float
    sqnr_db: float
    max_abs: float


def error_stats(source: torch.Tensor, decoded: torch.Tensor) -> ErrorStats:
    """Error statistics of `decoded` against `source`, in float64, a chunk of elements at a time."""
    if source.shape != decoded.shape:
        raise ValueError(f"shapes differ: {tuple(source.shape)} vs {tuple(decoded.shape)}")
    flat_x, flat_y = source.detach().reshape(-1), decoded.detach().reshape(-1)
    signal_energy = error_energy = max_abs = 0.0
    for start in range(0, flat_x.numel(), CHUNK_ELEMENTS):
        x = flat_x[start : start + CHUNK_ELEMENTS].to(torch.float64)
        error = flat_y[start : start + CHUNK_ELEMENTS].to(torch.float64) - x
        signal_energy += float(torch.dot(x, x))
        error_energy += float(torch.dot(error, error))
        max_abs = max(max_abs, float(error.abs().max()))
    if error_energy == 0:
        return ErrorStats(0.0, math.inf, max_abs)
    if signal_energy == 0:
        return ErrorStats(math.inf, -math.inf, max_abs)
    return ErrorStats(math.sqrt(error_energy / signal_energy), 10 * math.log10(signal_energy / error_energy), max_abs)
