"""What every command's `--json` document shares: its schema version, numbers JSON can hold, a problem, a
tensor's error fields, a source file."""

from __future__ import annotations

import math
from dataclasses import dataclass

from qcli.error_stats import ErrorStats
from qcli.problem import Problem

JSON_SCHEMA_VERSION = 3


def finite(x: float | None) -> float | None:
    """JSON has no infinity: an exact tensor's SQNR (inf) is written as null."""
    return None if x is None or not math.isfinite(x) else x


def error_json(error: ErrorStats | None) -> dict:
    """The three error fields of a row, null where nothing was measured."""
    if error is None:
        return {"rel_rms": None, "sqnr_db": None, "max_abs": None}
    return {"rel_rms": error.rel_rms, "sqnr_db": finite(error.sqnr_db), "max_abs": error.max_abs}


def problem_json(p: Problem) -> dict:
    """A problem as JSON (file and line for annotations, the tensors it concerns)."""
    return {
        "severity": p.severity,
        "kind": p.kind,
        "message": p.message,
        "hint": p.hint,
        "file": p.file,
        "line": p.line,
        "tensors": list(p.tensors),
    }


@dataclass(frozen=True)
class SourceFile:
    name: str
    bytes: int

    def to_json(self) -> dict:
        return {"name": self.name, "bytes": self.bytes}
