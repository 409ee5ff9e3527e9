"""How far a decoded tensor is from its source, as plain numbers (`qcli.codec.stats` computes them)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ErrorStats:
    """`rel_rms` = ||x - x'|| / ||x|| (0 when both are zero, inf when only x is), `sqnr_db` = 10 log10 of
    signal over error energy (inf when exact), `max_abs` = max |x - x'|."""

    rel_rms: float
    sqnr_db: float
    max_abs: float
