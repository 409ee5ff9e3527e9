"""How far a decoded tensor is from its source."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from qcli.error_stats import ErrorStats, ValueStats

CHUNK_ELEMENTS = 1 << 20
# An f32 sum of squares in this range lost nothing that matters to underflow and did not overflow.
_F32_ENERGY_FLOOR, _F32_ENERGY_CEILING = 2.0**-90, 2.0**120


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

    def add_difference(self, source: torch.Tensor, difference: torch.Tensor, *, quick: bool = False) -> None:
        """Add the energies of a part: its f32 source and its f32 decode minus source (the caller takes
        the largest |difference| into `max_abs`), in float64.

        `quick`, where reading a result back costs nothing (the CPU): each energy is summed over the part
        in f32 (a cache-sized part: within 1e-6 of float64, at a fraction of its cost), and again in
        float64 when the f32 sum may have overflowed or lost values to underflow.
        """
        x, error = source.reshape(-1), difference.reshape(-1)
        if quick:
            energies = torch.stack([torch.dot(x, x), torch.dot(error, error)])
            if bool(((energies >= _F32_ENERGY_FLOOR) & (energies <= _F32_ENERGY_CEILING)).all()):
                self.signal += energies[0].to(torch.float64)
                self.error += energies[1].to(torch.float64)
                return
        x, error = x.to(torch.float64), error.to(torch.float64)
        self.signal += torch.dot(x, x)
        self.error += torch.dot(error, error)

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


def value_stats(t: torch.Tensor) -> ValueStats:
    """min/max/mean/std (population)/rms of the finite values of a torch tensor of any real dtype, and how
    many of its values are NaN, +Inf and -Inf (JSON holds none of them: a damaged file is described, not
    summarised as NaN)."""
    x = t.reshape(-1).double()
    counts = int(x.isnan().sum()), int((x == math.inf).sum()), int((x == -math.inf).sum())
    if any(counts):
        x = x[x.isfinite()]
    if x.numel() == 0:
        none = None if any(counts) else 0.0
        return ValueStats(none, none, none, none, none, *counts)
    return ValueStats(float(x.min()), float(x.max()), float(x.mean()), float(x.std(correction=0)),
                      float(x.square().mean().sqrt()), *counts)
