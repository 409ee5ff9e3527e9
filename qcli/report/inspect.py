"""`qcli inspect`'s report: a listing, one tensor's statistics, a comparison, a plan of a checkpoint, and its
`--json` document."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from qcli import __version__, layout
from qcli.error_stats import ErrorStats, ValueStats
from qcli.io.dtypes import DType, QFloat
from qcli.problem import Problem
from qcli.report.documents import JSON_SCHEMA_VERSION, SourceFile, error_json, finite, problem_json

if TYPE_CHECKING:
    from qcli.scheme import QuantScheme


@dataclass(frozen=True)
class ListedTensor:
    """One tensor as a file holds it: `dtype` is readable (a QFloat as its scheme's short form), `stored`
    is the Burn DType of a .bpk tensor or the safetensors dtype of a safetensors one."""

    name: str
    dtype: str
    stored: DType | str
    shape: tuple[int, ...]
    nbytes: int

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "dtype": self.dtype,
            "dtype_serde": self.stored if isinstance(self.stored, str) else self.stored.to_serde(),
            "shape": list(self.shape),
            "bytes": self.nbytes,
        }


@dataclass(frozen=True)
class TensorStats:
    """`inspect --tensor`: statistics of the decoded values and, for a QFloat tensor, of its stored scales."""

    name: str
    values: ValueStats
    scales: ValueStats | None
    global_scale: float | None

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "values": self.values.to_json(),
            "scales": None if self.scales is None else self.scales.to_json(),
            "global_scale": self.global_scale if self.global_scale is None or math.isfinite(self.global_scale)
            else str(self.global_scale),  # JSON has no NaN or infinity: "nan", "inf", "-inf"
        }


@dataclass(frozen=True)
class CompareRow:
    """One tensor of `inspect --compare`: the written tensor against its (transposed, if recorded) source."""

    name: str
    dtype: str
    transposed: bool
    exact: bool
    error: ErrorStats | None
    problem: str | None = None
    # A quantized tensor's worst block (the largest error over bound; the first over it, if any is) with
    # its max |error| and its bound (`qcli.measure.stored_bound`); None for a kept one or none measured.
    block: int | None = None
    block_error: float | None = None
    bound: float | None = None
    # The mean over its blocks of max |error| over bound: how much of the bounds it uses (the worst is ~1).
    mean_block_ratio: float | None = None

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "dtype": self.dtype,
            "transposed": self.transposed,
            "exact": self.exact,
            "problem": self.problem,
            **error_json(self.error),
            "block": self.block,
            "block_error": finite(self.block_error),
            "bound": finite(self.bound),
            "mean_block_ratio": finite(self.mean_block_ratio),
        }


@dataclass(frozen=True)
class CompareReport:
    source: str
    rows: list[CompareRow]
    missing: list[str]  # in the source, not in the .bpk
    extra: list[str]  # in the .bpk, not in the source

    @property
    def mismatched(self) -> list[str]:
        return [r.name for r in self.rows if r.problem is not None]

    @property
    def ok(self) -> bool:
        return not (self.missing or self.extra or self.mismatched)

    def to_json(self) -> dict:
        return {
            "source": self.source,
            "ok": self.ok,
            "tensors": [r.to_json() for r in self.rows],
            "missing": self.missing,
            "extra": self.extra,
            "mismatched": self.mismatched,
        }


# A planned tensor's outcome, as the formats' summary words it.
OUTCOMES = {"transcode": "transcoded exactly", "quantize": "quantized", "keep": "kept",
            "refused": "refused (quantize stops on it)"}


@dataclass(frozen=True)
class PlannedTensor:
    """A safetensors tensor in the default plan (what `qcli quantize --dry-run` decides): `decision` is
    quantize, transcode, keep, or consumed (a transcoded weight's companion, written inside it); `format`
    is the source's (its dtype, or the already-quantized format of the weight and its companions); `refused` when an
    error of the plan names it."""

    format: str
    decision: str
    reason: str
    scheme: QuantScheme | None
    refused: bool = False

    def to_json(self) -> dict:
        return {
            "format": self.format,
            "decision": self.decision,
            "reason": self.reason,
            "scheme": None if self.scheme is None else self.scheme.to_serde(),
            "scheme_text": None if self.scheme is None else str(self.scheme),
            "refused": self.refused,
        }


@dataclass(frozen=True)
class FormatSummary:
    """The tensors of one source format: how many take each outcome (`OUTCOMES`), and the companions consumed."""

    format: str
    outcomes: dict[str, int]
    consumed: int

    @property
    def tensors(self) -> int:
        return sum(self.outcomes.values())

    @property
    def text(self) -> str:
        """`F8_E4M3 with per-tensor scales: 12 tensors, transcoded exactly; 12 companion tensors consumed`."""
        n = self.tensors
        counted = [f"{count} {OUTCOMES[o]}" for o, count in self.outcomes.items()]
        done = OUTCOMES[next(iter(self.outcomes))] if len(counted) == 1 else ", ".join(counted)
        consumed = (f"; {self.consumed} companion tensor{'s' if self.consumed != 1 else ''} consumed"
                    if self.consumed else "")
        return f"{self.format}: {n} tensor{'s' if n != 1 else ''}{',' if len(counted) == 1 else ':'} {done}{consumed}"

    def to_json(self) -> dict:
        return {"format": self.format, "tensors": self.tensors,
                **{o: self.outcomes.get(o, 0) for o in OUTCOMES}, "consumed": self.consumed, "text": self.text}


@dataclass(frozen=True)
class SourcePlan:
    """`inspect` of a safetensors source: each tensor's decision in the default plan (`preset`), and the
    plan's problems."""

    preset: str
    tensors: dict[str, PlannedTensor]
    problems: list[Problem]
    declaration: str  # what the checkpoint's declaration decides (`qcli.formats.declaration.verdict`)

    def formats(self) -> list[FormatSummary]:
        """One summary per source format, in order of first appearance."""
        outcomes: dict[str, dict[str, int]] = {}
        consumed: dict[str, int] = {}
        for t in self.tensors.values():
            if t.decision == "consumed":
                consumed[t.format] = consumed.get(t.format, 0) + 1
                continue
            counts = outcomes.setdefault(t.format, {})
            outcome = "refused" if t.refused else t.decision
            counts[outcome] = counts.get(outcome, 0) + 1
        return [FormatSummary(f, dict(sorted(c.items(), key=lambda kv: -kv[1])), consumed.get(f, 0))
                for f, c in outcomes.items()]

    def to_json(self) -> dict:
        return {"preset": self.preset, "declaration": self.declaration,
                "formats": [f.to_json() for f in self.formats()], "problems": [problem_json(p) for p in self.problems]}


@dataclass
class InspectReport:
    """The result of `qcli.commands.inspect.inspect_file`."""

    path: str
    format: str  # a source's reader (`qcli.io.readers.READERS`: "safetensors", "gguf"), or "burnpack"
    files: list[SourceFile]
    tensors: list[ListedTensor]
    version: int | None = None
    metadata: dict[str, str] | None = None
    tensor_stats: TensorStats | None = None
    compare: CompareReport | None = None
    plan: SourcePlan | None = None  # a safetensors source's

    @staticmethod
    def bits_per_weight(t: ListedTensor) -> float | None:
        """A QFloat tensor's payload bits (values, scales, any global) over its element count; None otherwise."""
        if not isinstance(t.stored, QFloat):
            return None
        count = math.prod(t.shape)
        return layout.bits_per_weight(t.nbytes, count) if count else None

    def planned(self, t: ListedTensor) -> dict | None:
        """A safetensors tensor's decision in the default plan, as JSON; None for a burnpack's."""
        return None if self.plan is None else self.plan.tensors[t.name].to_json()

    def totals(self) -> dict:
        """How many tensors are listed, their bytes and their values; the quantized tensors' bits per weight
        (all their payload bits over all their values; None without one)."""
        quantized = [t for t in self.tensors if self.bits_per_weight(t) is not None]
        values = sum(math.prod(t.shape) for t in quantized)
        return {
            "tensors": len(self.tensors),
            "bytes": sum(t.nbytes for t in self.tensors),
            "params": sum(math.prod(t.shape) for t in self.tensors),
            "bits_per_weight": layout.bits_per_weight(sum(t.nbytes for t in quantized), values) if values else None,
        }

    def to_json(self) -> dict:
        return {
            "command": "inspect",
            "schema_version": JSON_SCHEMA_VERSION,
            "qcli_version": __version__,
            "path": self.path,
            "format": self.format,
            "files": [f.to_json() for f in self.files],
            "version": self.version,
            "metadata": self.metadata,
            "tensors": [{**t.to_json(), "bits_per_weight": self.bits_per_weight(t), "plan": self.planned(t)}
                        for t in self.tensors],
            "totals": self.totals(),
            "plan": None if self.plan is None else self.plan.to_json(),
            "tensor_stats": None if self.tensor_stats is None else self.tensor_stats.to_json(),
            "compare": None if self.compare is None else self.compare.to_json(),
        }
