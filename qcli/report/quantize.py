"""`qcli quantize`'s report: the plan's rows, totals, timings, memory, calibration and how Burn loads the file,
and its `--json` document."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from qcli import __version__
from qcli.burn_backends import BurnBackend, backends
from qcli.error_stats import ErrorStats
from qcli.plan.checks import backend_problem
from qcli.plan.roles import linear_weight
from qcli.problem import Problem
from qcli.report.documents import JSON_SCHEMA_VERSION, SourceFile, error_json, problem_json

if TYPE_CHECKING:
    from qcli.plan.entries import Plan, PlanEntry, Totals
    from qcli.scheme import QuantScheme

# Where the Rust that loads a qcli file is: the README's section, and the example program it shows, which the
# tests compile and run.
RUST = ("README.md#load-it-in-burn", "tests/burn/examples/load_qcli.rs")
# Burn's `LinearLayout` that computes a Linear weight written as transposed (True) or as the source has it,
# and the orientation each reads.
LAYOUTS = {True: "Row", False: "Col"}
WRITTEN = {"Row": "[in, out]", "Col": "[out, in]"}


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
    """What a calibrated run measured its activations on (`method`: gptq or mse; minmax or absmean where the
    text only measured their output error): the text file (`file`, its `sha256`), the
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

    @property
    def measures_only(self) -> bool:
        """The scales are the codec's from the weights alone (MinMax, AbsMean): the text only measured
        their output error, to judge a calibrated run against."""
        return self.method in ("minmax", "absmean")

    def to_json(self) -> dict:
        return dict(vars(self))


@dataclass
class TargetRecord:
    """What `--target-bpw` or `--target-size` chose (`qcli.plan.target`): the budget asked (`bits_per_weight`
    or `size`, in bytes), the bits per quantized weight achieved (scales included), the bound on the file's
    bytes (`file_bytes_bound`, `qcli.io.burnpack.size_bound`), the forms it chose among, what weighed the
    losses (`sensitivity`: `weights`, `imatrix` or `calibration-data`), the presets each group took (a role,
    or `layer N`), each tensor's preset, and the recipe written (`--write-recipe`)."""

    bits_per_weight: float | None
    size: int | None
    achieved_bits_per_weight: float
    forms: list[str]
    sensitivity: str
    groups: list[tuple[str, dict[str, int]]]
    choices: dict[str, str]
    recipe: str | None = None
    file_bytes_bound: int | None = None

    def to_json(self) -> dict:
        return {"bits_per_weight": self.bits_per_weight, "size": self.size,
                "achieved_bits_per_weight": self.achieved_bits_per_weight, "file_bytes_bound": self.file_bytes_bound,
                "forms": self.forms, "sensitivity": self.sensitivity,
                "groups": [{"group": group, "presets": presets} for group, presets in self.groups],
                "choices": self.choices, "recipe": self.recipe}


@dataclass(frozen=True)
class BurnLoad:
    """How a Burn model loads the file as written: the `LinearLayout` each Linear weight needs (`layouts`:
    `Row` for those written `[in, out]`, `Col` for PyTorch's `[out, in]`; `unsure`: those whose name cannot
    tell a Linear's from GPT-2's Conv1D's, `qcli.plan.roles.linear_weight`), the tensors each Burn backend
    cannot use as written (`qcli.burn_backends`' facts; none: it computes the whole file), and where the Rust is."""

    burn_version: str
    layouts: dict[str, list[str]]
    unsure: list[str]
    cannot: dict[BurnBackend, list[str]]

    @property
    def computes_on(self) -> list[BurnBackend]:
        return [backend for backend, names in self.cannot.items() if not names]

    @staticmethod
    def of(plan: Plan, burn_version: str) -> BurnLoad:
        layouts: dict[str, list[str]] = {layout: [] for layout in LAYOUTS.values()}
        unsure = []
        for entry in plan.entries:
            linear = linear_weight(entry.name, entry.shape)
            if linear is None:
                unsure.append(entry.name)
            elif linear:
                layouts[LAYOUTS[entry.decision.transpose]].append(entry.name)
        cannot = {backend: [e.name for e in plan.entries if backend_problem(backend, e)]
                  for backend in backends(burn_version)}
        return BurnLoad(burn_version, layouts, unsure, cannot)

    def to_json(self) -> dict:
        return {
            "burn_version": self.burn_version,
            "linear_layouts": self.layouts,
            "unsure": self.unsure,
            "computes_on": [str(b) for b in self.computes_on],
            "cannot_compute": {str(b): names for b, names in self.cannot.items()},
            "rust": list(RUST),
        }


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
    load: BurnLoad
    warnings: list[Problem] = field(default_factory=list)  # of severity warning
    timings: Timings | None = None
    memory: MemoryUse | None = None  # a real run's
    # the files written: `output`, or its shards (and a model folder's other files)
    outputs: list[str] = field(default_factory=list)
    calibration: CalibrationRecord | None = None
    target: TargetRecord | None = None

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
            "load": self.load.to_json(),
            "target": None if self.target is None else self.target.to_json(),
        }
