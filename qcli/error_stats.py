"""A tensor's statistics as plain numbers, which `qcli.codec.stats` computes: how far a decode is from its
source (`ErrorStats`), and a summary of its values (`ValueStats`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ErrorStats:
    """`rel_rms` = ||x - x'|| / ||x|| (0 when both are zero, inf when only x is), `sqnr_db` = 10 log10 of
    signal over error energy (inf when exact), `max_abs` = max |x - x'|."""

    rel_rms: float
    sqnr_db: float
    max_abs: float


@dataclass(frozen=True)
class ValueStats:
    """Summary of a tensor's values, computed in float64."""

    min: float
    max: float
    mean: float
    std: float
    rms: float

    def to_json(self) -> dict:
        return {"min": self.min, "max": self.max, "mean": self.mean, "std": self.std, "rms": self.rms}
