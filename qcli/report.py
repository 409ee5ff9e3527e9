"""What a command found, as data: per-tensor rows, totals, timings, and the `--json` documents.

The CLI renders these as tables; `to_json()` gives the documents `docs/json-schema.json` describes.
Nothing here touches arrays except `value_stats`, which imports torch inside the function.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from qcli import __version__, layout
from qcli.error_stats import ErrorStats
from qcli.io.dtypes import DType, QFloat
from qcli.problem import Problem, Severity

if TYPE_CHECKING:
    import torch

    from qcli.plan.entries import PlanEntry, Totals
    from qcli.scheme import QuantScheme

JSON_SCHEMA_VERSION = 3


def _finite(x: float | None) -> float | None:
    """JSON has no infinity: an exact tensor's SQNR (inf) is written as null."""
    return None if x is None or not math.isfinite(x) else x


def error_json(error: ErrorStats | None) -> dict:
    """The three error fields of a row, null where nothing was measured."""
    if error is None:
        return {"rel_rms": None, "sqnr_db": None, "max_abs": None}
    return {"rel_rms": error.rel_rms, "sqnr_db": _finite(error.sqnr_db), "max_abs": error.max_abs}


@dataclass(frozen=True)
class TensorRow:
    """One tensor of a quantize plan: its decision, sizes and, once written, its error."""

    name: str
    shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    dtype: str
    scheme: QuantScheme | None  # None for keep
    reason: str
    transposed: bool
    bytes_in: int
    bytes_out: int
    bits_per_weight: float
    error: ErrorStats | None = None
    transcoded: bool = False  # an already-quantized tensor's codes written as they are (`qcli.formats`)
    output_error: float | None = None  # relative ||XW^T - XŴ^T|| on the calibration tokens, when calibrated

    @property
    def decision(self) -> str:
        return "keep" if self.scheme is None else "transcode" if self.transcoded else "quantize"

    @staticmethod
    def of(entry: PlanEntry, error: ErrorStats | None = None, output_error: float | None = None) -> TensorRow:
        info, decision = entry.info, entry.decision
        return TensorRow(
            name=entry.name,
            shape=entry.shape,
            out_shape=tuple(entry.out_shape),
            dtype=info.dtype,
            scheme=decision.scheme,
            reason=decision.reason,
            transposed=bool(decision.transpose),
            bytes_in=entry.in_nbytes,
            bytes_out=entry.out_nbytes,
            bits_per_weight=float(entry.bits_per_weight),
            error=error,
            transcoded=decision.transcode is not None,
            output_error=output_error,
        )

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "shape": list(self.shape),
            "out_shape": list(self.out_shape),
            "dtype": self.dtype,
            "decision": self.decision,
            "reason": self.reason,
            "scheme": None if self.scheme is None else self.scheme.to_serde(),
            "scheme_text": None if self.scheme is None else str(self.scheme),
            "transposed": self.transposed,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "bits_per_weight": self.bits_per_weight,
            **error_json(self.error),
            "output_error": self.output_error,
        }


def totals_json(t: Totals) -> dict:
    """A `qcli.plan.entries.Totals` as JSON."""
    return {
        "tensors": t.tensors,
        "quantized": t.quantized,
        "kept": t.kept,
        "transposed": t.transposed,
        "params": t.params,
        "bytes_in": t.bytes_in,
        "bytes_out": t.bytes_out,
        "ratio": t.ratio,
        "bits_per_weight": t.bits_per_weight,
        "peak_memory_bytes": t.peak_bytes,
    }


@dataclass
class Phase:
    """Time spent in one phase and the bytes it moved."""

    seconds: float = 0.0
    bytes: int = 0

    @property
    def gb_per_s(self) -> float | None:
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 and self.bytes else None

    def to_json(self) -> dict:
        return {"seconds": self.seconds, "bytes": self.bytes, "gb_per_s": self.gb_per_s}


@dataclass
class Timings:
    """read: loading source tensors; quantize: encoding (and transposing); stats: the one decode of each
    quantized tensor against its source (for the error columns and the bound check; nothing with
    --no-stats --no-verify); write: handing payloads to the container and committing it; verify: the
    bound checks and reading the output back, its bytes those read back (None with --no-verify)."""

    read: Phase = field(default_factory=Phase)
    quantize: Phase = field(default_factory=Phase)
    stats: Phase = field(default_factory=Phase)
    write: Phase = field(default_factory=Phase)
    verify: Phase | None = None
    calibrate: Phase | None = None  # the calibration run (`qcli.calibrate`), its bytes the weights it read
    total_seconds: float = 0.0

    def to_json(self) -> dict:
        return {
            "read": self.read.to_json(),
            "quantize": self.quantize.to_json(),
            "stats": self.stats.to_json(),
            "write": self.write.to_json(),
            "verify": None if self.verify is None else self.verify.to_json(),
            "calibrate": None if self.calibrate is None else self.calibrate.to_json(),
            "total_seconds": self.total_seconds,
        }


@dataclass(frozen=True)
class MemoryUse:
    """Resident memory of the run (`qcli.resident`): the runtime's before the first tensor was read,
    and the peak while the tensors were processed; `tensors_bytes` is the difference."""

    runtime_bytes: int
    peak_bytes: int

    @property
    def tensors_bytes(self) -> int:
        return max(self.peak_bytes - self.runtime_bytes, 0)

    def to_json(self) -> dict:
        return {"runtime_bytes": self.runtime_bytes, "peak_bytes": self.peak_bytes,
                "tensors_bytes": self.tensors_bytes}


@dataclass
class CalibrationRecord:
    """What a calibrated run measured its activations on: the text file (`file`, its `sha256`), the
    `samples` windows of `seq_len` tokens drawn with `seed` from the `tokens` it holds, or an importance
    matrix file (`imatrix`); the device memory the dry run estimates for one block, and the peak measured."""

    method: str
    file: str | None
    sha256: str | None
    samples: int | None = None
    seq_len: int | None = None
    seed: int | None = None
    tokens: int | None = None
    blocks: int | None = None
    memory_estimate_bytes: int | None = None
    peak_device_bytes: int | None = None

    def to_json(self) -> dict:
        return dict(vars(self))


@dataclass(frozen=True)
class SourceFile:
    name: str
    bytes: int

    def to_json(self) -> dict:
        return {"name": self.name, "bytes": self.bytes}


@dataclass
class QuantizeReport:
    """The result of `qcli.commands.quantize.quantize_file`: the plan, and for a real run the errors and timings."""

    input: str
    output: str
    device: str | None
    dry_run: bool
    preset: str
    burn_backend: str | None
    burn_version: str
    recipe: str | None
    recipe_sha256: str | None
    source_files: list[SourceFile]
    tensors: list[TensorRow]
    totals: Totals
    warnings: list[Problem] = field(default_factory=list)  # of severity warning
    timings: Timings | None = None
    memory: MemoryUse | None = None  # a real run's
    # the files written: `output`, or its shards (and a model folder's other files)
    outputs: list[str] = field(default_factory=list)
    calibration: CalibrationRecord | None = None

    def to_json(self) -> dict:
        return {
            "command": "quantize",
            "schema_version": JSON_SCHEMA_VERSION,
            "qcli_version": __version__,
            "burn_version": self.burn_version,
            "burn_backend": self.burn_backend,
            "input": self.input,
            "output": self.output,
            "outputs": self.outputs,
            "device": self.device,
            "dry_run": self.dry_run,
            "preset": self.preset,
            "recipe": self.recipe,
            "recipe_sha256": self.recipe_sha256,
            "source_files": [f.to_json() for f in self.source_files],
            "tensors": [t.to_json() for t in self.tensors],
            "warnings": [problem_json(p) for p in self.warnings],
            "totals": totals_json(self.totals),
            "timings": None if self.timings is None else self.timings.to_json(),
            "memory": None if self.memory is None else self.memory.to_json(),
            "calibration": None if self.calibration is None else self.calibration.to_json(),
        }


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


def value_stats(t: torch.Tensor) -> ValueStats:
    """min/max/mean/std (population)/rms of a torch tensor of any real dtype."""
    x = t.reshape(-1).double()
    if x.numel() == 0:
        return ValueStats(0.0, 0.0, 0.0, 0.0, 0.0)
    return ValueStats(
        min=float(x.min()),
        max=float(x.max()),
        mean=float(x.mean()),
        std=float(x.std(correction=0)),
        rms=float(x.square().mean().sqrt()),
    )


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
            "global_scale": self.global_scale,
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
            "block_error": _finite(self.block_error),
            "bound": _finite(self.bound),
            "mean_block_ratio": _finite(self.mean_block_ratio),
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


@dataclass
class ValidateReport:
    """The result of `qcli.commands.validate_scheme.validate_scheme`: every problem in the recipes (and
    plans, with a model)."""

    recipes: list[str]
    model: str | None
    problems: list[Problem]

    @property
    def errors(self) -> int:
        return sum(p.severity is Severity.error for p in self.problems)

    @property
    def warnings(self) -> int:
        return sum(p.severity is not Severity.error for p in self.problems)

    @property
    def ok(self) -> bool:
        return self.errors == 0

    def to_json(self) -> dict:
        return {
            "command": "validate-scheme",
            "schema_version": JSON_SCHEMA_VERSION,
            "qcli_version": __version__,
            "recipes": self.recipes,
            "model": self.model,
            "ok": self.ok,
            "errors": self.errors,
            "warnings": self.warnings,
            "problems": [problem_json(p) for p in self.problems],
        }
