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
    """Summary of a tensor's finite values, computed in float64 (None where it has values but none finite),
    and how many are NaN, +Inf and -Inf."""

    min: float | None
    max: float | None
    mean: float | None
    std: float | None
    rms: float | None
    nan: int = 0
    inf: int = 0
    neg_inf: int = 0

    @property
    def non_finite(self) -> int:
        return self.nan + self.inf + self.neg_inf

    def to_json(self) -> dict:
        return {"min": self.min, "max": self.max, "mean": self.mean, "std": self.std, "rms": self.rms,
                "nan": self.nan, "inf": self.inf, "neg_inf": self.neg_inf}
