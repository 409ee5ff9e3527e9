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


@dataclass
class ErrorSums:
    """Signal energy, error energy (float64) and max |x - x'| summed over parts of a tensor, as device
    tensors of shape [1]: adding a part never waits for the device; `stats` reads them back."""

    signal: torch.Tensor
    error: torch.Tensor
    max_abs: torch.Tensor

    @staticmethod
    def zeros(device: torch.device | str) -> ErrorSums:
        return ErrorSums(*(torch.zeros(1, dtype=torch.float64, device=device) for _ in range(3)))

    def add(self, source: torch.Tensor, decoded: torch.Tensor) -> None:
        """Add `decoded` against `source` (same shape and device), in float64, a chunk of elements at a time."""
        if source.shape != decoded.shape:
            raise ValueError(f"shapes differ: {tuple(source.shape)} vs {tuple(decoded.shape)}")
        flat_x, flat_y = source.detach().reshape(-1), decoded.detach().reshape(-1)
        for start in range(0, flat_x.numel(), CHUNK_ELEMENTS):
            x = flat_x[start : start + CHUNK_ELEMENTS].to(torch.float64)
            error = flat_y[start : start + CHUNK_ELEMENTS].to(torch.float64) - x
            self.signal += torch.dot(x, x)
            self.error += torch.dot(error, error)
            self.max_abs = torch.maximum(self.max_abs, error.abs().max())

    def stats(self) -> ErrorStats:
        """The statistics, read back to the host (waits for the device)."""
        signal_energy, error_energy, max_abs = torch.cat([self.signal, self.error, self.max_abs]).tolist()
        if error_energy == 0:
            return ErrorStats(0.0, math.inf, max_abs)
        if signal_energy == 0:
            return ErrorStats(math.inf, -math.inf, max_abs)
        return ErrorStats(math.sqrt(error_energy / signal_energy), 10 * math.log10(signal_energy / error_energy),
                          max_abs)


def error_stats(source: torch.Tensor, decoded: torch.Tensor) -> ErrorStats:
    """Error statistics of `decoded` against `source`, in float64."""
    sums = ErrorSums.zeros(source.device)
    sums.add(source, decoded)
    return sums.stats()
