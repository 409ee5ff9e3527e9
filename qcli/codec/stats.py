"""How far a decoded tensor is from its source."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ErrorStats:
    """`rel_rms` = ||x - x'|| / ||x|| (0 when both are zero, inf when only x is), `sqnr_db` = 10 log10 of
    signal over error energy (inf when exact), `max_abs` = max |x - x'|."""

    rel_rms: float
    sqnr_db: float
    max_abs: float


def error_stats(source: torch.Tensor, decoded: torch.Tensor) -> ErrorStats:
    """Error statistics of `decoded` against `source`, accumulated in float64."""
    if source.shape != decoded.shape:
        raise ValueError(f"shapes differ: {tuple(source.shape)} vs {tuple(decoded.shape)}")
    x = source.detach().to(torch.float64)
    error = decoded.detach().to(torch.float64) - x
    signal_energy = float(x.square().sum())
    error_energy = float(error.square().sum())
    max_abs = float(error.abs().max()) if error.numel() else 0.0
    if error_energy == 0:
        return ErrorStats(0.0, math.inf, max_abs)
    if signal_energy == 0:
        return ErrorStats(math.inf, -math.inf, max_abs)
    return ErrorStats(
        math.sqrt(error_energy / signal_energy), 10 * math.log10(signal_energy / error_energy), max_abs
    )
