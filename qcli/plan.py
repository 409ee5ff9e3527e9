"""The plan: one decision per tensor (a scheme, or keep) with its reason, and every problem, from headers.

A tensor takes the first recipe rule that matches its name; tensors no rule matches follow the default
policy with the preset (docs/recipes.md): quantize floating tensors of rank >= 2 whose shape can take
the scheme (with a smaller block when the preset's does not divide the row; the token embedding and the
output head at 8 bits when the preset is narrower), keep everything else with the reason. Nothing here
reads a weight, so a plan is checked in full (and `--dry-run` printed) before the first tensor is loaded.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from qcli import BURN_VERSION, layout
from qcli.burn_backends import (
    COMMON_BACKENDS,
    BurnBackend,
    hold_problem,
    kept_problem,
    load_problem,
    loads_instead,
    qfloat,
)
from qcli.errors import PlanError
from qcli.formats import FORMAT_EMBEDDINGS, consumed, detect, scale_owners
from qcli.formats.found import Encoded, Found, Transcode
from qcli.io.burnpack import MAX_FILE_SIZE, MAX_TENSOR_COUNT, MAX_TENSOR_SIZE, align, gib
from qcli.io.dtypes import FLOAT_DTYPES, DType, Plain, burn_dtype, is_quantized
from qcli.io.source import TensorInfo
from qcli.presets import DEFAULT_PRESET, PRESETS, Preset
from qcli.problem import Kind, Problem, Severity
from qcli.recipe import OnIndivisible, Recipe, Rule
from qcli.scheme import (
    Calibration,
    PackedNative,
    PackedU32,
    QuantScheme,
    accept_problems,
)

FIRST_NAMES = 3
# What quantizing holds beside a tensor's source and payload (`PlanEntry.peak_bytes`): six f32 grids of
# a value per block at most, and a chunk's temporaries, about 24 bytes per value of a chunk of 2^18
# values per core (`qcli.codec.quantize.CHUNK_ELEMENTS`).
GRID_BYTES_PER_BLOCK = 24
CHUNK_WORKING_BYTES = 24 * (1 << 18) * (os.cpu_count() or 1)
# The token embedding and the output head, by the module names common checkpoints give them (Llama and
# most Hugging Face models, GPT-2, Meta's Llama, BERT, GPT-NeoX; a format's own, as llama.cpp's GGUF files,
# from `qcli.formats`): quantized at `WIDE_PRESET` by default when the preset is narrower than 8 bits.
EMBEDDING_MODULES = ("embed_tokens", "wte", "tok_embeddings", "word_embeddings", "embed_in", *FORMAT_EMBEDDINGS)
HEAD_MODULES = ("lm_head", "embed_out")
HEAD_NAMES = ("output.weight",)  # Meta's Llama: a top-level `output` module
WIDE_PRESET = "q8s-b32"


@dataclass(frozen=True)
class Decision:
    """What happens to one tensor: quantized with `scheme`, or kept (`scheme is None`), and why."""

    scheme: QuantScheme | None
    calibration: Calibration
    transpose: bool
    reason: str
    rule: Rule | None
    cast: str | None = None  # a kept floating tensor written in this dtype (F32, F16, BF16) instead of its own
    transcode: Transcode | None = None  # an already-quantized tensor written as `scheme`, its codes unchanged
    requantize: Encoded | None = None  # one no Burn scheme holds, dequantized by its format's decoder, then quantized

    @property
    def found(self) -> Transcode | Encoded | None:
        """The already-quantized weight it writes (transcoded or requantized), whose format gives its name,
        shape and companions; None for an ordinary tensor."""
        return self.transcode or self.requantize


@dataclass(frozen=True)
class PlanEntry:
    info: TensorInfo
    decision: Decision
    burn_version: str = BURN_VERSION

    @property
    def name(self) -> str:
        """The name it is written under: the source tensor's, or the one its format gives the weight its
        codes stand for (GPTQ's `m.qweight` is written as `m.weight`)."""
        found = self.decision.found
        return found.name if found is not None else self.info.name

    @functools.cached_property  # each property below is asked many times of every entry
    def shape(self) -> tuple[int, ...]:
        """The source tensor's shape as its format dequantizes it, not its codes' shape."""
        found = self.decision.found
        return found.shape if found is not None else tuple(self.info.shape)

    @functools.cached_property
    def out_shape(self) -> tuple[int, ...]:
        """The shape written: the source shape, reversed when the tensor is transposed."""
        shape = self.shape
        return shape[::-1] if self.decision.transpose and len(shape) == 2 else shape

    @functools.cached_property
    def out_dtype(self) -> DType | None:
        """Burn's DType written: the source dtype (or the cast's) for a kept tensor, None where Burn has
        none; else the scheme's QFloat."""
        if self.decision.scheme is None:
            return burn_dtype(self.decision.cast or self.info.dtype)
        return qfloat(self.decision.scheme, self.burn_version)

    @functools.cached_property
    def out_nbytes(self) -> int:
        if self.decision.scheme is None:
            if self.decision.cast is not None:
                return Plain(self.decision.cast).nbytes(self.info.shape)
            return self.info.nbytes
        return layout.quantized_data_len(self.decision.scheme, self.out_shape)

    @property
    def in_nbytes(self) -> int:
        """The source bytes it is written from: a transcoded or requantized tensor's companions', too."""
        return self.info.nbytes + sum(c.nbytes for c in self.consumed)

    @property
    def consumed(self) -> tuple[TensorInfo, ...]:
        """The source tensors written inside this entry's payload."""
        found = self.decision.found
        return found.companions if found is not None else ()

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def bits_per_weight(self) -> float:
        return layout.bits_per_weight(self.out_nbytes, self.numel)

    @property
    def peak_bytes(self) -> int:
        """Host memory while the CPU path processes this tensor, beside the runtime's: a kept tensor holds
        its source bytes, twice when transposed, and its cast beside them; a quantized one its source, its
        payload, a few f32 grids of one value per block (the codec's ranges and scales, the measure's
        errors and decoded scales) and one chunk's temporaries (`qcli.codec.quantize`)."""
        if self.decision.scheme is None:
            cast = self.out_nbytes if self.decision.cast is not None else 0
            return self.info.nbytes * (2 if self.decision.transpose else 1) + cast
        blocks = layout.num_scales(self.decision.scheme, self.out_shape)
        return self.info.nbytes + self.out_nbytes + GRID_BYTES_PER_BLOCK * blocks + CHUNK_WORKING_BYTES


@dataclass(frozen=True)
class Totals:
    """Sums over a plan; `peak_bytes` is the largest entry's `PlanEntry.peak_bytes`: tensors are processed
    one at a time, so that is the expected peak host memory of a run, whatever the model's size."""

    tensors: int
    quantized: int
    kept: int
    transposed: int
    params: int
    bytes_in: int
    bytes_out: int
    peak_bytes: int

    @property
    def ratio(self) -> float:
        """Input bytes per output byte: how many times smaller the output is."""
        return self.bytes_in / self.bytes_out if self.bytes_out else 0.0

    @property
    def bits_per_weight(self) -> float:
        return layout.bits_per_weight(self.bytes_out, self.params)


@dataclass
class Plan:
    entries: list[PlanEntry]
    problems: list[Problem]
    preset: Preset | None = None

    def totals(self) -> Totals:
        quantized = [e for e in self.entries if e.decision.scheme is not None]
        return Totals(
            tensors=len(self.entries),
            quantized=len(quantized),
            kept=len(self.entries) - len(quantized),
            transposed=sum(e.decision.transpose for e in self.entries),
            params=sum(e.numel for e in self.entries),
            bytes_in=sum(e.in_nbytes for e in self.entries),
            bytes_out=sum(e.out_nbytes for e in self.entries),
            peak_bytes=max((e.peak_bytes for e in self.entries), default=0),
        )

    def consumed(self) -> set[str]:
        """The source tensors written inside another's payload, not as entries: transcoded tensors' scales,
        requantized codebook tensors' companions."""
        return {c.name for e in self.entries for c in e.consumed}

    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity is Severity.error]

    def warnings(self) -> list[Problem]:
        return [p for p in self.problems if p.severity is Severity.warning]

    def raise_if_errors(self) -> None:
        """`PlanError` listing every error-severity problem, each with its hint (a single one's is the
        error's hint)."""
        errors = self.errors()
        if not errors:
            return
        noun = "problem" if len(errors) == 1 else "problems"
        raise PlanError(
            f"the plan has {len(errors)} {noun}; no weight was read and nothing was written",
            hint=errors[0].hint if len(errors) == 1 else "each problem above says what to do",
            problems=errors,
        )


def shape_problem(scheme: QuantScheme, shape: Sequence[int]) -> str | None:
    """Why a tensor of `shape` cannot take `scheme` in any Burn backend, or None when it can."""
    return _shape_problem(scheme, tuple(shape))


@functools.lru_cache(maxsize=1 << 12)  # asked of every tensor, and a model's tensors share a few shapes
def _shape_problem(scheme: QuantScheme, shape: tuple[int, ...]) -> str | None:
    rank = len(shape)
    if rank == 0:
        return "a 0-D tensor (scalar) has no axis to quantize along"
    block = scheme.block.size if scheme.block is not None else None
    if block is not None:
        if block.len > rank:
            return f"block {block} has {block.len} axes but the tensor has {rank}"
        for axis, (dim, extent) in enumerate(zip(shape, block.to_dim_vec(rank), strict=True)):
            if dim % extent:
                where = f"last dim {dim}" if axis == rank - 1 else f"dim {axis} (size {dim})"
                return f"{where} is not a multiple of {extent} (block {block})"
    per_word = scheme.num_quants()
    if isinstance(scheme.store, PackedU32) and shape[-1] % per_word:
        return (f"last dim {shape[-1]} is not a multiple of {per_word} "
                f"(PackedU32 holds {per_word} {scheme.value.value} values per word)")
    if isinstance(scheme.store, PackedNative) and shape[-1] % scheme.value.native_packing():  # 2: e2m1x2
        return f"last dim {shape[-1]} is odd (PackedNative stores {scheme.value.value} values in pairs)"
    nbytes = layout.quantized_data_len(scheme, shape)
    if nbytes > MAX_TENSOR_SIZE:
        return (f"its payload of {nbytes / 1024**3:.1f} GiB exceeds Burn's {gib(MAX_TENSOR_SIZE)} per-tensor "
                "reader limit")
    return None


def tensor_role(name: str) -> str | None:
    """"token embedding" or "output head" for the names checkpoints give them (`model.embed_tokens.weight`,
    `transformer.wte.weight`, `tok_embeddings.weight`, `lm_head.weight`, Meta's `output.weight`), else None."""
    if name in HEAD_NAMES:
        return "output head"
    parts = name.split(".")
    module = parts[-2] if len(parts) > 1 and parts[-1] == "weight" else parts[-1]
    if module in EMBEDDING_MODULES:
        return "token embedding"
    return "output head" if module in HEAD_MODULES else None


def smaller_block(scheme: QuantScheme, shape: Sequence[int], calibration: Calibration = Calibration.MinMax
                  ) -> QuantScheme | None:
    """`scheme` with its one-axis block halved until `shape` can take it, no smaller than the values one
    storage word holds (8 for 4-bit PackedU32), the value, store and scale dtype unchanged: the largest
    such block; None for a scheme without a one-axis block, or when no such block fits."""
    block = scheme.block
    if block is None or block.size.len != 1 or not shape:
        return None
    extent, floor = block.size.dims()[0] // 2, max(scheme.num_quants(), 1)
    while extent >= floor:
        if shape[-1] % extent == 0:
            candidate = scheme.per_block([extent], block.dtype)
            if shape_problem(candidate, shape) is None and not accept_problems(candidate, calibration):
                return candidate
        extent //= 2
    return None


def make_plan(
    infos: Iterable[TensorInfo], recipe: Recipe | None = None, preset: Preset | None = None,
    *, split: bool = False, backend: BurnBackend | None = None, burn_version: str = BURN_VERSION,
    calibration: Calibration | None = None, requantize: Preset | None = None,
    found: Mapping[str, Found] | None = None, calibrated: Collection[str] = (),
) -> Plan:
    """One decision per tensor and every problem found from the headers (see the module docstring).

    `split`: the output is cut into several files (--max-shard-size), so Burn's per-file limits are
    the split's to keep, not one file's. `backend`: every tensor that Burn backend cannot load is an
    error; without one, what a common backend cannot load is a warning. `burn_version`: the Burn release
    the file is for; a scheme it has no form for is an error. `calibration` (`--calibration`): the
    calibration of every quantized tensor whose rule names none, in place of its preset's. `requantize`
    (`--requantize`): the preset the tensors no Burn scheme holds (`qcli.formats.Encoded`: bitsandbytes NF4,
    FP4) are quantized into once dequantized; without it they are refused. `found`: the checkpoint's
    already-quantized weights (`qcli.formats.detect`), the encoded ones' states read for `requantize`.
    `calibrated`: the tensors a calibration run reaches (the Linear weights in the model's blocks): GPTQ
    applies to them only, every other tensor takes its preset's calibration instead, its reason says so.
    """
    return _Planner(list(infos), recipe, preset or PRESETS[DEFAULT_PRESET], split, backend, burn_version,
                    calibration, requantize, found, calibrated).plan()


class _Planner:
    def __init__(self, infos: list[TensorInfo], recipe: Recipe | None, preset: Preset, split: bool = False,
                 backend: BurnBackend | None = None, burn_version: str = BURN_VERSION,
                 calibration: Calibration | None = None, requantize: Preset | None = None,
                 found: Mapping[str, Found] | None = None, calibrated: Collection[str] = ()) -> None:
        self.calibrated = frozenset(calibrated)
        self.found = dict(found) if found is not None else detect(infos)
        self.requantize = requantize
        self.refused: dict[str, list[Encoded]] = {}  # format -> its weights, refused without --requantize
        companions = consumed(self.found, requantize is not None)  # no entries of their own
        self.infos = [i for i in infos if i.name not in companions]
        self.calibration = calibration
        self.refused_calibration: set[int] = set()  # id(rule): rules `calibration` is refused for, reported
        self.split = split
        self.backend = backend
        self.burn_version = burn_version
        self.recipe = recipe
        self.preset = preset
        self.problems: list[Problem] = []
        self.scale_owners = scale_owners(infos)
        self.not_2d: dict[int, list[str]] = {}  # id(rule) -> tensors it asks to transpose that are not 2-D
        self.not_float: dict[int, list[str]] = {}  # id(rule) -> tensors it asks to cast that are not floating
        self.unquantized: dict[int, list[str]] = {}  # id(rule) -> its tensors that cannot take its scheme, why
        self.transcoded: dict[int, list[str]] = {}  # id(rule) -> its F8 tensors, transcoded instead
        self.cast_kept = recipe.cast_kept if recipe is not None else None

    def plan(self) -> Plan:
        rules = self.recipe.rules if self.recipe else []
        covered: dict[int, list[str]] = {id(r): [] for r in rules}
        entries = []
        for info in self.infos:
            rule = next((r for r in rules if r.matches(info.name)), None)
            if rule is not None:
                covered[id(rule)].append(info.name)
            encoded = self.found.get(info.name)
            decision = (self.by_encoded(info, encoded) if isinstance(encoded, Encoded)
                        else self.by_rule(info, rule) if rule else self.by_default(info))
            entries.append(PlanEntry(info, decision, self.burn_version))
        for rule in rules:
            self.rule_problems(rule, covered[id(rule)], entries)
        self.default_problems([e.info.name for e in entries if e.decision.rule is None])
        self.encoded_problems()
        for entry in entries:
            self.output_problems(entry)
        self.version_problems(entries)
        for backend in [self.backend] if self.backend else COMMON_BACKENDS:
            self.backend_problems(backend, entries)
        plan = Plan(entries, self.problems, self.preset)
        if not self.split:
            self.file_problems(plan)
        self.nothing_quantized(entries)
        return plan

    def problem(self, kind: Kind, message: str, hint: str, tensors: Sequence[str] = (),
                severity: Severity = Severity.error, rule: Rule | None = None) -> None:
        self.problems.append(Problem(kind, message, hint, severity, rule.file if rule else None,
                                     rule.line if rule else None, tuple(tensors)))

    def cast_of(self, info: TensorInfo, cast: str | None) -> str | None:
        """The dtype a kept `info` is written in when `cast` is asked: None for its own dtype, or for a tensor
        that is not floating (`[defaults] cast_kept` passes those by; a rule's cast is checked in `by_rule`)."""
        return cast if cast is not None and info.dtype in FLOAT_DTYPES and cast != info.dtype else None

    def kept(self, info: TensorInfo, reason: str, rule: Rule | None, transpose: bool = False,
             calibration: Calibration = Calibration.MinMax, cast: str | None = None) -> Decision:
        """A keep decision, written as `cast` (else `[defaults] cast_kept`) where that applies."""
        cast = self.cast_of(info, cast or self.cast_kept)
        if cast is not None:
            reason += f", cast {info.dtype} to {cast}"
        return Decision(None, calibration, transpose, reason, rule, cast)

    def by_default(self, info: TensorInfo) -> Decision:
        def keep(reason: str) -> Decision:
            return self.kept(info, f"default: keep, {reason}", None)

        rank = len(info.shape)
        transcode = self.found.get(info.name)
        if isinstance(transcode, Transcode):
            return Decision(transcode.scheme, Calibration.MinMax, False, f"default: {transcode.reason}", None,
                            transcode=transcode)
        if is_quantized(info.dtype):
            return keep(f"already quantized ({info.dtype})")
        companion = self.scale_owners.of(info.name)
        if companion is not None:
            return keep(f"scale of the already-quantized tensor {companion}")
        if info.dtype not in FLOAT_DTYPES:
            kind = {"B": "bool", "I": "integer", "U": "integer"}.get(info.dtype[:1], "non-floating")
            return keep(f"{kind} tensor ({info.dtype})")
        if rank < 2:
            return keep("0-D tensor (scalar)" if rank == 0 else "1-D tensor (norm/bias)")
        role = tensor_role(info.name)
        if role is not None and self.preset.scheme.value.size_bits() < 8:
            wide = self.default_scheme(info, PRESETS[WIDE_PRESET], f"default: {role}, 8 bits")
            if wide is not None:
                return wide
        decision = self.default_scheme(info, self.preset)
        if decision is not None:
            return decision
        return keep(f"cannot take {self.preset.name}: {shape_problem(self.preset.scheme, info.shape)}")

    def by_encoded(self, info: TensorInfo, encoded: Encoded) -> Decision:
        """A tensor no Burn scheme holds: refused (reported by format in `encoded_problems`) or, with
        `--requantize`, dequantized and quantized into its preset, as the default policy would a tensor of
        its shape."""
        if self.requantize is None or not encoded.requantizable:
            self.refused.setdefault(encoded.format, []).append(encoded)
            return Decision(None, Calibration.MinMax, False, f"refused: {encoded.format} is {encoded.encoding}", None)
        decoded = replace(info, dtype=encoded.dtype, shape=encoded.shape)
        decision = self.default_scheme(decoded, self.requantize, f"requantize {encoded.format}")
        if decision is None:
            why = shape_problem(self.requantize.scheme, encoded.shape)
            self.problem(Kind.shape, f"{info.name} {list(encoded.shape)} ({encoded.format}) cannot take "
                         f"--requantize {self.requantize.name}: {why}", "requantize into a preset of a smaller block",
                         [info.name])
            return Decision(None, Calibration.MinMax, False, f"requantize {encoded.format}: {why}", None)
        return replace(decision, requantize=encoded)

    def encoded_problems(self) -> None:
        """One error per format refused: why no Burn scheme holds it, and `--requantize` the way out."""
        for format, refused in self.refused.items():
            names, first = [e.weight.name for e in refused], refused[0]
            are = "is" if len(names) == 1 else "are"
            self.problem(first.kind, f"{count_and_first(names)} {are} {format}: {first.why}", first.hint, names)

    def default_scheme(self, info: TensorInfo, preset: Preset, why: str | None = None) -> Decision | None:
        """`preset` for a floating tensor of rank >= 2, with a smaller block (`smaller_block`) when its own does
        not divide the row; None when the shape takes neither. `why` replaces the reason's start (kept short:
        the reason is a column of quantize's table)."""
        reason = f"{why or f'default: {info.dtype} tensor of rank {len(info.shape)}'} -> {preset.name}"
        scheme = preset.scheme
        calibration, unreached = self.reached(info, self.calibration or preset.calibration, preset.calibration)
        reason += unreached
        if shape_problem(scheme, info.shape) is not None:
            smaller = smaller_block(scheme, info.shape, calibration)
            if smaller is None:
                return None
            reason += (f" → block {smaller.block.size}: {info.shape[-1]} is not a multiple of "
                       f"{scheme.block.size.dims()[0]}")
            scheme = smaller
        return Decision(scheme, calibration, False, reason, None)

    def by_rule(self, info: TensorInfo, rule: Rule) -> Decision:
        where = f"rule {rule.location}"
        calibration = rule.calibration or self.calibration or Calibration.MinMax
        if rule.refusals:
            reason = f"refused: {where} asks for {rule.describe()}"
            return Decision(None, calibration, False, reason, rule)
        transpose = rule.transpose and len(info.shape) == 2
        if rule.transpose and not transpose:
            self.not_2d.setdefault(id(rule), []).append(info.name)
        if rule.keep:
            if rule.cast is not None and info.dtype not in FLOAT_DTYPES:
                self.not_float.setdefault(id(rule), []).append(info.name)
                return Decision(None, calibration, transpose, f"{where}: keep", rule)
            return self.kept(info, f"{where}: keep", rule, transpose, calibration, rule.cast)
        assert rule.scheme is not None
        transcode = self.found.get(info.name)
        if isinstance(transcode, Transcode):  # qcli does not requantize: the codes are written as they are
            self.transcoded.setdefault(id(rule), []).append(info.name)
            return Decision(transcode.scheme, calibration, False, f"{where}: {transcode.reason}", rule,
                            transcode=transcode)
        shape = info.shape[::-1] if transpose else info.shape
        why_not = self.cannot_take(info, rule.scheme, shape)
        if why_not is None and rule.calibration is None and self.calibration is not None:
            refused = self.calibration_refused(info, rule)
            if refused is not None:
                return self.kept(info, f"{where}: keep, {refused}", rule, transpose)
        if why_not is None:
            asked = rule.preset or str(rule.scheme)
            calibration, unreached = self.reached(info, calibration, Calibration.MinMax)
            return Decision(rule.scheme, calibration, transpose, f"{where} -> {asked}{unreached}", rule)
        if self.recipe is not None and self.recipe.on_indivisible is OnIndivisible.error:
            self.problem(
                Kind.shape, f"{info.name} {list(info.shape)}{' transposed' if transpose else ''} cannot take "
                f"{rule.describe()}: {why_not}",
                "change the rule's block or store, add a keep rule for it, or set on_indivisible = \"keep\"",
                [info.name], rule=rule,
            )
        self.unquantized.setdefault(id(rule), []).append(
            f"{info.name} {list(info.shape)}{' transposed' if transpose else ''}: {why_not}")
        reason = f"{where}: keep, cannot take the scheme: {why_not}"
        return self.kept(info, reason, rule, transpose, calibration)

    def reached(self, info: TensorInfo, calibration: Calibration, fallback: Calibration) -> tuple[Calibration, str]:
        """`calibration`, or for a tensor GPTQ cannot reach (not in `calibrated`), `fallback` and what the
        reason adds to say so."""
        if calibration is not Calibration.Gptq or info.name in self.calibrated:
            return calibration, ""
        return fallback, f" ({fallback.name}: not a Linear in the model's blocks, which GPTQ calibrates)"

    def calibration_refused(self, info: TensorInfo, rule: Rule) -> str | None:
        """Why `--calibration` cannot apply to the scheme of `rule` (reported once per rule, as an error),
        or None."""
        refusals = accept_problems(rule.scheme, self.calibration)
        if not refusals:
            return None
        if id(rule) not in self.refused_calibration:
            self.refused_calibration.add(id(rule))
            self.problem(refusals[0].kind, f"--calibration {self.calibration.value} cannot apply to "
                         f"{rule.describe()}: {refusals[0].message}", refusals[0].hint, [info.name], rule=rule)
        return f"--calibration {self.calibration.value} does not apply"

    def cannot_take(self, info: TensorInfo, scheme: QuantScheme, shape: Sequence[int]) -> str | None:
        if is_quantized(info.dtype):
            return f"{info.dtype} is already quantized; qcli does not requantize"
        if info.dtype not in FLOAT_DTYPES:
            return f"{info.dtype} is not a floating dtype"
        return shape_problem(scheme, shape)

    def rule_problems(self, rule: Rule, names: list[str], entries: Sequence[PlanEntry]) -> None:
        refused = rule_refusal(rule, names)
        if refused is not None:
            self.problems.append(refused)
        not_2d = self.not_2d.get(id(rule), [])
        if not_2d:
            self.problem(
                Kind.transpose, f"rule (match {rule.match!r}) asks to transpose "
                f"{count_and_first(not_2d)} that are not 2-D; transpose = true needs a 2-D tensor",
                "narrow the match to 2-D weights (a rule before it can keep the others), or drop transpose",
                not_2d, rule=rule,
            )
        not_float = self.not_float.get(id(rule), [])
        if not_float:
            dtypes = sorted({e.info.dtype for e in entries if e.info.name in set(not_float)})
            self.problem(
                Kind.cast, f"rule (match {rule.match!r}) asks to cast {count_and_first(not_float)} to {rule.cast}, "
                f"which are not floating ({', '.join(dtypes)}); cast converts F64, F32, F16 and BF16 tensors only",
                "narrow the match to floating tensors (a keep rule before it can take the others), or drop cast",
                not_float, rule=rule,
            )
        transcoded = self.transcoded.get(id(rule), [])
        if transcoded:
            reason = next(e.decision.reason for e in entries if e.info.name == transcoded[0])
            self.problem(
                Kind.transcoded, f"rule (match {rule.match!r}) asks for {rule.describe()}, but "
                f"{count_and_first(transcoded)} are already quantized: they are transcoded instead "
                f"({reason.removeprefix(f'rule {rule.location}: ')})",
                "nothing to do: their codes are written as they are, without a second rounding; a keep rule "
                "before it would refuse them (Burn has no dtype for their codes)",
                transcoded, severity=Severity.warning, rule=rule,
            )
        unquantized = self.unquantized.get(id(rule), [])
        # With on_indivisible = "error" each such tensor is an error already.
        strict = self.recipe is not None and self.recipe.on_indivisible is OnIndivisible.error
        if names and len(unquantized) == len(names) and not strict:
            self.problem(
                Kind.unquantized_rule, f"rule (match {rule.match!r}) matches {count_and_first(names)} but "
                f"quantizes none of them with {rule.describe()}: {unquantized[0]}",
                "change the rule's block, store or value so the shapes take it, or say keep = true if keeping "
                "them is meant",
                names, severity=Severity.warning, rule=rule,
            )
        if not names:
            shadowed = [e for e in entries if rule.matches(e.info.name)]
            if shadowed:
                earlier = list({id(e.decision.rule): e.decision.rule for e in shadowed}.values())
                by = ", ".join(f"rule {r.number} ({r.location})" for r in earlier)
                self.problem(
                    Kind.unmatched_rule, f"rule (match {rule.match!r}) is shadowed by {by}: every tensor it "
                    f"matches, {count_and_first([e.info.name for e in shadowed])}, is taken by "
                    f"{'that rule' if len(earlier) == 1 else 'those rules'} first",
                    "the first rule that matches a tensor decides it: move this rule before "
                    f"{'it' if len(earlier) == 1 else 'them'}, narrow the earlier match, or remove this rule",
                    severity=Severity.warning, rule=rule,
                )
                return
            self.problem(
                Kind.unmatched_rule, f"rule (match {rule.match!r}) matches no tensor",
                "check the pattern against `qcli inspect` names (a glob matches the full name), or remove it",
                severity=Severity.warning, rule=rule,
            )

    def nothing_quantized(self, entries: Sequence[PlanEntry]) -> None:
        """A plan without errors that quantizes no tensor at all: a warning, with the first tensor's reason."""
        if not entries or any(e.decision.scheme is not None for e in entries) or any(
            p.severity is Severity.error for p in self.problems
        ):
            return
        names = [e.info.name for e in entries]
        first = entries[0]
        self.problem(
            Kind.nothing_quantized, f"nothing is quantized: all {count_and_first(names)} are kept; the first "
            f"because {first.decision.reason}",
            "the output would be about as large as the input: check --scheme and the recipe's rules against "
            "each tensor's reason in `qcli quantize --dry-run`",
            names, severity=Severity.warning,
        )

    def default_problems(self, names: list[str]) -> None:
        """A preset Burn refuses is reported once, like a rule (the CLI only offers accepted presets)."""
        refusals = accept_problems(self.preset.scheme, self.calibration or self.preset.calibration)
        if refusals and names:
            self.problem(
                refusals[0].kind,
                f"preset {self.preset.name} ({self.preset.scheme}) is refused by Burn: "
                f"{'; and '.join(r.message for r in refusals)}; it would have covered {count_and_first(names)}",
                refusals[0].hint, names,
            )

    def output_problems(self, entry: PlanEntry) -> None:
        """What Burn cannot load whatever the decision: an unrepresentable kept dtype, an oversized tensor."""
        info, decision = entry.info, entry.decision
        why_not = self.found.get(info.name)
        hint = ("dequantize the checkpoint to BF16 or F32 (with its scale tensors) first, then run qcli "
                "(the formats qcli transcodes are in docs/input-formats.md)")
        if decision.scheme is None and entry.out_dtype is None and not isinstance(why_not, Encoded):  # refused once
            nor = f"; nor transcoded: {why_not}" if isinstance(why_not, str) else ""
            self.problem(
                Kind.dtype, f"{info.name} ({info.dtype}) cannot be kept: Burn has no {info.dtype} dtype{nor}",
                hint, [info.name], rule=decision.rule,
            )
        elif decision.scheme is None and isinstance(why_not, str) and not (decision.rule and decision.rule.keep):
            self.problem(  # Burn holds the dtype, but not the values the codes stand for
                Kind.dtype, f"{info.name} ({info.dtype}) holds another tool's quantized codes, which kept as they are "
                f"would not decode in Burn, and is not transcoded: {why_not}", hint, [info.name], rule=decision.rule,
            )
        if entry.decision.scheme is None and info.nbytes > MAX_TENSOR_SIZE:
            limit = gib(MAX_TENSOR_SIZE)
            self.problem(
                Kind.size, f"{info.name} is {info.nbytes / 1024**3:.1f} GiB, over Burn's {limit} tensor limit",
                f"quantize it (a rule with a scheme) so its payload fits under {limit}",
                [info.name], rule=entry.decision.rule,
            )

    def version_problems(self, entries: Sequence[PlanEntry]) -> None:
        """Schemes the target Burn release has no form for, whatever the backend: one error per rule."""
        unheld: dict[tuple[int, str], list[PlanEntry]] = {}
        for entry in entries:
            why = entry.decision.scheme and hold_problem(entry.decision.scheme, self.burn_version)
            if why:
                unheld.setdefault((id(entry.decision.rule), why), []).append(entry)
        for (_, why), group in unheld.items():
            names = [e.info.name for e in group]
            # a transcode's scheme is the checkpoint's: there is no other scheme to offer
            instead = ("write it for --burn-version" if group[0].decision.transcode else
                       "use a one-level scheme (drop tensor_scale), or --burn-version")
            self.problem(Kind.version, f"{count_and_first(names)} cannot be written as {group[0].decision.scheme}: "
                         f"{why}", f"{instead} {BURN_VERSION}", names, rule=group[0].decision.rule)

    def backend_problems(self, backend: BurnBackend, entries: Sequence[PlanEntry]) -> None:
        """What `backend` cannot load, one problem per rule (or the preset) and reason: an error for the
        backend asked for, a warning for a common one."""
        failing: dict[tuple[int, object, str], list[PlanEntry]] = {}
        version = self.burn_version
        for entry in entries:
            scheme = entry.decision.scheme
            if scheme is not None and hold_problem(scheme, version) is not None:
                continue  # `version_problems` reports it once, for every backend
            dtype = entry.out_dtype
            if dtype is None:
                continue  # `output_problems` reports it: Burn has no such dtype
            why = (kept_problem(backend, dtype, version) if scheme is None
                   else load_problem(backend, scheme, entry.out_shape, version))
            if why is not None:
                failing.setdefault((id(entry.decision.rule), scheme or dtype, why), []).append(entry)
        for (_, written, why), group in failing.items():  # `written`: a scheme or a dtype, shown as text
            first = group[0]
            names = [e.info.name for e in group]
            if first.decision.scheme is None:
                hint = ("load the file on flex (Burn's CPU backend), which builds every dtype, or write them as F32: "
                        "cast = \"F32\" on their keep rule, or cast_kept = \"F32\" in [defaults]")
            elif first.decision.transcode is not None:  # the checkpoint's own codes: no other scheme holds them
                hint = ("they are the checkpoint's own codes, written exactly: load the file on a backend that "
                        "reads them (docs/input-formats.md)")
            else:
                instead = loads_instead(backend, first.decision.scheme, first.out_shape, version)
                hint = (f"use {preset_or_scheme(instead)}, which {backend} loads" if instead is not None
                        else "keep them (keep = true), or load the file on another backend")
            if self.backend is None:
                hint += "; name the backend you load with by --burn-backend to check for it alone"
            self.problem(
                Kind.backend, f"Burn {version}'s {backend} backend cannot load {count_and_first(names)} as {written}: "
                f"{why}", hint, names, severity=Severity.error if self.backend else Severity.warning,
                rule=first.decision.rule,
            )

    def file_problems(self, plan: Plan) -> None:
        """Burn's per-file reader limits: the tensor count and the file size (data alone, aligned)."""
        count = len(plan.entries)
        if count > MAX_TENSOR_COUNT:
            self.problem(Kind.size, f"the output would hold {count} tensors; Burn's reader refuses more than "
                         f"{MAX_TENSOR_COUNT}", "split the output into several files with --max-shard-size")
        data = sum(align(e.out_nbytes) for e in plan.entries)
        if data > MAX_FILE_SIZE:
            self.problem(Kind.size, f"the output would take at least {data / 1024**3:.1f} GiB; Burn's reader "
                         f"refuses a file over {gib(MAX_FILE_SIZE)}",
                         "split the output with --max-shard-size 50GB, quantize more tensors, or use a smaller "
                         "scheme")


def rule_refusal(rule: Rule, covered: Sequence[str] | None = None) -> Problem | None:
    """The Problem for a rule asking for what Burn refuses (Lookup, a zero point, a refused scheme), naming
    the tensors it would have `covered` when a model is known; None for a rule the plan can carry out."""
    if not rule.refusals:
        return None
    message = (f"rule (match {rule.match!r}) asks for {rule.describe()}, which Burn "
               f"refuses: {'; and '.join(r.message for r in rule.refusals)}")
    if covered is not None:
        message += f"; it would have covered {count_and_first(covered)}"
    first = rule.refusals[0]  # a Lookup rule's first refusal is its mode's
    return Problem(first.kind, message, first.hint, file=rule.file, line=rule.line, tensors=tuple(covered or ()))


def preset_or_scheme(scheme: QuantScheme) -> str:
    """The preset whose scheme `scheme` is (`preset q8s-b32`), else the scheme itself."""
    preset = next((p.name for p in PRESETS.values() if p.scheme == scheme), None)
    return f"preset {preset}" if preset is not None else str(scheme)


def count_and_first(names: Sequence[str]) -> str:
    """`3 tensors (a, b, c)`, naming at most the first FIRST_NAMES."""
    if not names:
        return "no tensor"
    first = ", ".join(names[:FIRST_NAMES]) + (", ..." if len(names) > FIRST_NAMES else "")
    return f"{len(names)} tensor{'s' if len(names) > 1 else ''} ({first})"
