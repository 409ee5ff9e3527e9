"""The plan: one decision per tensor (a scheme, or keep) with its reason, and every problem, from headers.

A tensor takes the first recipe rule that matches its name; tensors no rule matches follow the default
policy with the preset (docs/recipes.md): quantize floating tensors of rank >= 2 whose shape can take
the scheme (with a smaller block when the preset's does not divide the row; the token embedding and the
output head at 8 bits when the preset is narrower), keep everything else with the reason. Nothing here
reads a weight, so a plan is checked in full (and `--dry-run` printed) before the first tensor is loaded.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import replace

from qcli import layout
from qcli.burn_backends import COMMON_BACKENDS, hold_problem, load_problem
from qcli.formats import consumed, detect, scale_owners
from qcli.formats.found import Encoded, Found, Transcode, Unloadable
from qcli.io.burnpack import MAX_TENSOR_SIZE, gib
from qcli.io.dtypes import FLOAT_DTYPES, is_quantized
from qcli.io.source import TensorInfo
from qcli.plan.checks import (
    Findings,
    backend_problems,
    default_problems,
    encoded_problems,
    file_problems,
    nothing_quantized,
    output_problems,
    rule_problems,
    transpose_problems,
    version_problems,
)
from qcli.plan.entries import Decision, Plan, PlanEntry
from qcli.plan.options import PlanOptions
from qcli.plan.roles import linear_weight, tensor_role
from qcli.presets import PRESETS, Preset
from qcli.problem import Kind
from qcli.recipe import OnIndivisible, Recipe, Rule
from qcli.scheme import (
    Calibration,
    PackedNative,
    PackedU32,
    QuantScheme,
    accept_problems,
    packs_outer,
)

# The token embedding and the output head (`qcli.plan.roles`) are quantized at WIDE_PRESET by default when
# the preset is narrower than 8 bits.
WIDE_PRESET = "q8s-b32"


def shape_problem(scheme: QuantScheme, shape: Sequence[int]) -> str | None:
    """Why a tensor of `shape` cannot take `scheme` in any Burn backend, or None when it can."""
    return _shape_problem(scheme, tuple(shape))


@functools.lru_cache(maxsize=1 << 12)  # asked of every tensor, and a model's tensors share a few shapes
def _shape_problem(scheme: QuantScheme, shape: tuple[int, ...]) -> str | None:
    rank = len(shape)
    if rank == 0:
        return "a 0-D tensor (scalar) has no axis to quantize along"
    if packs_outer(scheme):
        if rank != 2:
            return f"{scheme.store} packs a 2-D tensor along its first axis; the tensor has {rank} axes"
        return _shape_problem(*layout.stored_as(scheme, shape))
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
    infos: Iterable[TensorInfo], recipe: Recipe | None = None, options: PlanOptions = PlanOptions(), *,
    found: Mapping[str, Found] | None = None, calibrated: Collection[str] = (),
) -> Plan:
    """One decision per tensor and every problem found from the headers (see the module docstring), as
    `options` ask (`PlanOptions`).

    `found` is the checkpoint's already-quantized weights (`qcli.formats.detect`, run here when not given); the
    encoded ones' states are read for `options.requantize`. `calibrated` is the tensors a calibration run
    reaches (the Linear weights in the model's blocks). GPTQ applies to those only; every other tensor takes
    its preset's calibration, and its reason says so.

    With `options.transpose`, every Linear weight (`linear_weight`) whose recipe rule says nothing of transpose
    is written `[in, out]`, as a rule's `transpose = true` writes it. A transcoded weight keeps its codes'
    orientation (a warning names it), and a name that cannot tell a Linear's weight from GPT-2's Conv1D's is an
    error."""
    return _Planner(list(infos), recipe, options, found, calibrated).plan()


def plan_by_name(infos: Iterable[TensorInfo], recipe: Recipe | None = None, options: PlanOptions = PlanOptions(), *,
                 found: Mapping[str, Found] | None = None, calibrated: Collection[str] = ()) -> Plan:
    """`make_plan` over `infos` in name order, the order quantize writes and shards them in, so one file
    and shards give the same output; its errors are left to the caller."""
    return make_plan(sorted(infos, key=lambda i: i.name), recipe, options, found=found, calibrated=calibrated)


def make_checked_plan(infos: Iterable[TensorInfo], recipe: Recipe | None, options: PlanOptions, *,
                      found: Mapping[str, Found] | None = None, calibrated: Collection[str] = ()) -> Plan:
    """`plan_by_name`, every error raised together as one PlanError."""
    plan = plan_by_name(infos, recipe, options, found=found, calibrated=calibrated)
    plan.raise_if_errors()
    return plan


class _Planner:
    """Decides each tensor, recording in `findings` what it could not do as asked; `plan` then runs the
    passes of `qcli.plan.checks` over the decisions."""

    def __init__(self, infos: list[TensorInfo], recipe: Recipe | None, options: PlanOptions,
                 found: Mapping[str, Found] | None, calibrated: Collection[str]) -> None:
        self.options = options
        self.recipe = recipe
        self.calibrated = frozenset(calibrated)
        self.findings = Findings()
        self.found = dict(found) if found is not None else detect(infos)
        if options.requantize is not None:
            self.found = {n: self.requantizing(f) if isinstance(f, Transcode) else f for n, f in self.found.items()}
        companions = consumed(self.found, options.requantize is not None)  # no entries of their own
        self.infos = [i for i in infos if i.name not in companions]
        self.refused_calibration: set[int] = set()  # id(rule): rules `calibration` is refused for, reported
        self.scale_owners = scale_owners(infos)
        self.cast_kept = recipe.cast_kept if recipe is not None else None

    def requantizing(self, transcode: Transcode) -> Found:
        """A transcode under `--requantize`: requantized (`Unloadable`) where the Burn release, or the backend
        the file is for, cannot load or compute with its scheme; else as its format allows that option."""
        scheme, version = transcode.scheme, self.options.burn_version
        why = hold_problem(scheme, version) or (
            self.options.backend is not None and load_problem(self.options.backend, scheme, transcode.shape, version))
        if not why:
            return transcode.requantizing()
        return Unloadable(transcode.weight, transcode.format, transcode.companions, transcode, why)

    def plan(self) -> Plan:
        options, findings = self.options, self.findings
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
            entries.append(PlanEntry(info, decision, options.burn_version))
        for rule in rules:
            rule_problems(findings, self.recipe, rule, covered[id(rule)], entries)
        default_problems(findings, options, [e.info.name for e in entries if e.decision.rule is None])
        transpose_problems(findings)
        encoded_problems(findings, options)
        for entry in entries:
            output_problems(findings, self.found, entry)
        version_problems(findings, options, entries)
        for backend in [options.backend] if options.backend else COMMON_BACKENDS:
            backend_problems(findings, options, backend, entries)
        plan = Plan(entries, findings.problems, options.preset)
        if not options.split:
            file_problems(findings, plan)
        nothing_quantized(findings, entries)
        return plan

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
            self.not_transposed(transcode, None)
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
        transpose = self.transposed(info.name, info.shape, None)
        role, preset = tensor_role(info.name), self.options.preset
        if role is not None and preset.scheme.value.size_bits() < 8:
            wide = self.default_scheme(info, PRESETS[WIDE_PRESET], f"default: {role}, 8 bits", transpose)
            if wide is not None:
                return wide
        decision = self.default_scheme(info, preset, transpose=transpose)
        if decision is not None:
            return decision
        shape = info.shape[::-1] if transpose else info.shape
        reason = f"default: keep, cannot take {preset.name}: {shape_problem(preset.scheme, shape)}"
        return self.kept(info, reason, None, transpose)

    def by_encoded(self, info: TensorInfo, encoded: Encoded) -> Decision:
        """A tensor no Burn scheme holds: refused (reported by format in `encoded_problems`) or, with
        `--requantize`, dequantized and quantized into its preset, as the default policy would a tensor of
        its shape."""
        requantize = self.options.requantize
        if requantize is None or not encoded.requantizable:
            self.findings.refused.setdefault(encoded.format, []).append(encoded)
            return Decision(None, Calibration.MinMax, False, f"refused: {encoded.format} is {encoded.encoding}", None)
        decoded = replace(info, dtype=encoded.dtype, shape=encoded.shape)
        transpose = self.transposed(encoded.name, encoded.shape, None)
        decision = self.default_scheme(decoded, requantize, f"requantize {encoded.format}", transpose)
        if decision is None:
            why = shape_problem(requantize.scheme, encoded.shape[::-1] if transpose else encoded.shape)
            self.findings.problem(Kind.shape, f"{info.name} {list(encoded.shape)} ({encoded.format}) cannot take "
                                  f"--requantize {requantize.name}: {why}",
                                  "requantize into a preset of a smaller block", [info.name])
            return Decision(None, Calibration.MinMax, False, f"requantize {encoded.format}: {why}", None)
        return replace(decision, requantize=encoded)

    def default_scheme(self, info: TensorInfo, preset: Preset, why: str | None = None, transpose: bool = False
                       ) -> Decision | None:
        """`preset` for a floating tensor of rank >= 2 (as written: transposed with `transpose`), with a
        smaller block (`smaller_block`) when its own does not divide the row; None when the shape takes
        neither. `why` replaces the reason's start (kept short: the reason is a column of quantize's table)."""
        reason = f"{why or f'default: {info.dtype} tensor of rank {len(info.shape)}'} -> {preset.name}"
        scheme = preset.scheme
        shape = info.shape[::-1] if transpose else info.shape
        calibration, unreached = self.reached(info, self.options.calibration or preset.calibration, preset.calibration)
        reason += unreached
        if shape_problem(scheme, shape) is not None:
            smaller = smaller_block(scheme, shape, calibration)
            if smaller is None:
                return None
            assert scheme.block is not None and smaller.block is not None, "only a block can be too large"
            reason += (f" → block {smaller.block.size}: {shape[-1]} is not a multiple of "
                       f"{scheme.block.size.dims()[0]}")
            scheme = smaller
        return Decision(scheme, calibration, transpose, reason, None)

    def transposed(self, name: str, shape: Sequence[int], rule: Rule | None, floating: bool = True) -> bool:
        """Whether tensor `name` is written transposed: as its rule says where it says (a tensor that is not
        2-D never is: the rule's problem), else with --transpose where it is a `floating` Linear weight; a
        name that cannot tell (`linear_weight` None) is recorded for `transpose_problems`, written as it is."""
        if rule is not None and rule.transpose is not None:
            return rule.transpose and len(shape) == 2
        if not self.options.transpose or not floating:
            return False
        linear = linear_weight(name, shape)
        if linear is None:
            self.findings.unsure.append(name)
        return bool(linear)

    def not_transposed(self, transcode: Transcode, rule: Rule | None) -> None:
        """A transcoded weight keeps its codes' orientation: recorded where it would have been transposed."""
        if self.transposed(transcode.name, transcode.shape, rule):
            self.findings.untransposed.append(transcode.name)

    def by_rule(self, info: TensorInfo, rule: Rule) -> Decision:
        where = f"rule {rule.location}"
        calibration = rule.calibration or self.options.calibration or Calibration.MinMax
        if rule.refusals:
            reason = f"refused: {where} asks for {rule.describe()}"
            return Decision(None, calibration, False, reason, rule)
        transpose = self.transposed(info.name, info.shape, rule, info.dtype in FLOAT_DTYPES)
        if rule.transpose and not transpose:
            self.findings.not_2d.setdefault(id(rule), []).append(info.name)
        if rule.keep:
            if rule.cast is not None and info.dtype not in FLOAT_DTYPES:
                self.findings.not_float.setdefault(id(rule), []).append(info.name)
                return Decision(None, calibration, transpose, f"{where}: keep", rule)
            return self.kept(info, f"{where}: keep", rule, transpose, calibration, rule.cast)
        assert rule.scheme is not None
        transcode = self.found.get(info.name)
        if isinstance(transcode, Transcode):  # qcli does not requantize: the codes are written as they are
            self.findings.transcoded.setdefault(id(rule), []).append(info.name)
            self.not_transposed(transcode, rule)
            return Decision(transcode.scheme, calibration, False, f"{where}: {transcode.reason}", rule,
                            transcode=transcode)
        shape = info.shape[::-1] if transpose else info.shape
        why_not = self.cannot_take(info, rule.scheme, shape)
        if why_not is None and rule.calibration is None and self.options.calibration is not None:
            refused = self.calibration_refused(info, rule, rule.scheme, self.options.calibration)
            if refused is not None:
                return self.kept(info, f"{where}: keep, {refused}", rule, transpose)
        if why_not is None:
            asked = rule.preset or str(rule.scheme)
            calibration, unreached = self.reached(info, calibration, Calibration.MinMax)
            return Decision(rule.scheme, calibration, transpose, f"{where} -> {asked}{unreached}", rule)
        if self.recipe is not None and self.recipe.on_indivisible is OnIndivisible.error:
            self.findings.problem(
                Kind.shape, f"{info.name} {list(info.shape)}{' transposed' if transpose else ''} cannot take "
                f"{rule.describe()}: {why_not}",
                "change the rule's block or store, add a keep rule for it, or set on_indivisible = \"keep\"",
                [info.name], rule=rule,
            )
        self.findings.unquantized.setdefault(id(rule), []).append(
            f"{info.name} {list(info.shape)}{' transposed' if transpose else ''}: {why_not}")
        reason = f"{where}: keep, cannot take the scheme: {why_not}"
        return self.kept(info, reason, rule, transpose, calibration)

    def reached(self, info: TensorInfo, calibration: Calibration, fallback: Calibration) -> tuple[Calibration, str]:
        """`calibration`, or for a tensor GPTQ cannot reach (not in `calibrated`), `fallback` and what the
        reason adds to say so."""
        if calibration is not Calibration.Gptq or info.name in self.calibrated:
            return calibration, ""
        return fallback, (f" ({fallback.name}: not a Linear (nor an expert's) in the model's blocks, which GPTQ "
                          "calibrates)")

    def calibration_refused(self, info: TensorInfo, rule: Rule, scheme: QuantScheme,
                            calibration: Calibration) -> str | None:
        """Why `--calibration` cannot apply to the scheme of `rule` (reported once per rule, as an error),
        or None."""
        refusals = accept_problems(scheme, calibration)
        if not refusals:
            return None
        if id(rule) not in self.refused_calibration:
            self.refused_calibration.add(id(rule))
            self.findings.problem(refusals[0].kind, f"--calibration {calibration.value} cannot apply to "
                                  f"{rule.describe()}: {refusals[0].message}", refusals[0].hint, [info.name], rule=rule)
        return f"--calibration {calibration.value} does not apply"

    def cannot_take(self, info: TensorInfo, scheme: QuantScheme, shape: Sequence[int]) -> str | None:
        if is_quantized(info.dtype):
            return f"{info.dtype} is already quantized; qcli does not requantize"
        if info.dtype not in FLOAT_DTYPES:
            return f"{info.dtype} is not a floating dtype"
        return shape_problem(scheme, shape)
