"""The plan's problem passes: what each rule, the preset, an encoded format, an entry, the Burn release and
backend, and the file's limits make of the decisions, every finding a `Problem` with its hint.

The planner (`qcli.plan.decisions`) records what it could not carry out in a `Findings` while it decides;
each pass then reads that record and the plan's options, and adds its problems to it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from qcli import BURN_VERSION
from qcli.burn_backends import (
    CAPABILITIES,
    OUTER_PACKING_VERSIONS,
    BurnBackend,
    backends,
    hold_problem,
    kept_problem,
    load_problem,
    loads_instead,
    short_version,
)
from qcli.formats.found import Encoded, Found
from qcli.io.burnpack import MAX_TENSOR_COUNT, MAX_TENSOR_SIZE, align, gib, max_file_size
from qcli.io.dtypes import FLOAT_DTYPES
from qcli.plan.entries import Plan, PlanEntry
from qcli.plan.options import PlanOptions
from qcli.plan.roles import linear_weight
from qcli.presets import DEFAULT_PRESET, PRESETS, REQUANTIZE_NARROW, REQUANTIZE_WIDE, Preset
from qcli.problem import Kind, Problem, Severity
from qcli.recipe import OnIndivisible, Recipe, Rule
from qcli.scheme import QuantScheme, accept_problems, packs_outer

FIRST_NAMES = 3


@dataclass
class Findings:
    """What the planner found while deciding, for the passes to report: the problems so far, and the tensors
    it could not do as asked, by rule (`id(rule)`) or by format."""

    problems: list[Problem] = field(default_factory=list)
    refused: dict[str, list[Encoded]] = field(default_factory=dict)  # format -> its weights, without --requantize
    not_2d: dict[int, list[str]] = field(default_factory=dict)  # tensors a rule asks to transpose, not 2-D
    not_float: dict[int, list[str]] = field(default_factory=dict)  # tensors a rule asks to cast, not floating
    unquantized: dict[int, list[str]] = field(default_factory=dict)  # a rule's tensors that cannot take it, why
    transcoded: dict[int, list[str]] = field(default_factory=dict)  # a rule's F8 tensors, transcoded instead
    unsure: list[str] = field(default_factory=list)  # --transpose: names that cannot tell [out, in] from [in, out]
    untransposed: list[str] = field(default_factory=list)  # --transpose: transcoded weights, kept as their codes

    def problem(self, kind: Kind, message: str, hint: str, tensors: Sequence[str] = (),
                severity: Severity = Severity.error, rule: Rule | None = None) -> None:
        self.problems.append(Problem(kind, message, hint, severity, rule.file if rule else None,
                                     rule.line if rule else None, tuple(tensors)))


def encoded_problems(findings: Findings, options: PlanOptions) -> None:
    """One error per format refused: why no Burn scheme holds it, and `--requantize` the way out, into the
    user's own `--scheme` where one other than the default was asked for, else the preset the format
    offers (one at least as wide as its codes)."""
    chosen = None if options.preset.name == DEFAULT_PRESET else options.preset.name
    for format, refused in findings.refused.items():
        names, first = [e.weight.name for e in refused], refused[0]
        are = "is" if len(names) == 1 else "are"
        findings.problem(first.kind, f"{count_and_first(names)} {are} {format}: {first.why}", first.hint(chosen), names)


def rule_problems(findings: Findings, recipe: Recipe | None, rule: Rule, names: list[str],
                  entries: Sequence[PlanEntry]) -> None:
    refused = rule_refusal(rule, names)
    if refused is not None:
        findings.problems.append(refused)
    not_2d = findings.not_2d.get(id(rule), [])
    if not_2d:
        findings.problem(
            Kind.transpose, f"rule (match {rule.match!r}) asks to transpose "
            f"{count_and_first(not_2d)} that are not 2-D; transpose = true needs a 2-D tensor",
            "narrow the match to 2-D weights (a rule before it can keep the others), or drop transpose",
            not_2d, rule=rule,
        )
    not_float = findings.not_float.get(id(rule), [])
    if not_float:
        dtypes = sorted({e.info.dtype for e in entries if e.info.name in set(not_float)})
        findings.problem(
            Kind.cast, f"rule (match {rule.match!r}) asks to cast {count_and_first(not_float)} to {rule.cast}, "
            f"which are not floating ({', '.join(dtypes)}); cast converts {', '.join(FLOAT_DTYPES[:-1])} and "
            f"{FLOAT_DTYPES[-1]} tensors only",
            "narrow the match to floating tensors (a keep rule before it can take the others), or drop cast",
            not_float, rule=rule,
        )
    transcoded = findings.transcoded.get(id(rule), [])
    if transcoded:
        reason = next(e.decision.reason for e in entries if e.info.name == transcoded[0])
        findings.problem(
            Kind.transcoded, f"rule (match {rule.match!r}) asks for {rule.describe()}, but "
            f"{count_and_first(transcoded)} are already quantized: they are transcoded instead "
            f"({reason.removeprefix(f'rule {rule.location}: ')})",
            "nothing to do: their codes are written as they are, without a second rounding; a keep rule "
            "before it would refuse them (Burn has no dtype for their codes)",
            transcoded, severity=Severity.warning, rule=rule,
        )
    unquantized = findings.unquantized.get(id(rule), [])
    # With on_indivisible = "error" each such tensor is an error already.
    strict = recipe is not None and recipe.on_indivisible is OnIndivisible.error
    if names and len(unquantized) == len(names) and not strict:
        findings.problem(
            Kind.unquantized_rule, f"rule (match {rule.match!r}) matches {count_and_first(names)} but "
            f"quantizes none of them with {rule.describe()}: {unquantized[0]}",
            "change the rule's block, store or value so the shapes take it, or say keep = true if keeping "
            "them is meant",
            names, severity=Severity.warning, rule=rule,
        )
    if not names:
        shadowed = [e for e in entries if rule.matches(e.info.name)]
        if shadowed:
            # each matched by an earlier rule, so decided by one
            earlier = list({id(r): r for e in shadowed if (r := e.decision.rule) is not None}.values())
            by = ", ".join(f"rule {r.number} ({r.location})" for r in earlier)
            findings.problem(
                Kind.unmatched_rule, f"rule (match {rule.match!r}) is shadowed by {by}: every tensor it "
                f"matches, {count_and_first([e.info.name for e in shadowed])}, is taken by "
                f"{'that rule' if len(earlier) == 1 else 'those rules'} first",
                "the first rule that matches a tensor decides it: move this rule before "
                f"{'it' if len(earlier) == 1 else 'them'}, narrow the earlier match, or remove this rule",
                severity=Severity.warning, rule=rule,
            )
            return
        findings.problem(
            Kind.unmatched_rule, f"rule (match {rule.match!r}) matches no tensor",
            "check the pattern against `qcli inspect` names (a glob matches the full name), or remove it",
            severity=Severity.warning, rule=rule,
        )


def nothing_quantized(findings: Findings, entries: Sequence[PlanEntry]) -> None:
    """A plan without errors that quantizes no tensor at all: a warning, with the first tensor's reason."""
    if not entries or any(e.decision.scheme is not None for e in entries) or any(
        p.severity is Severity.error for p in findings.problems
    ):
        return
    names = [e.info.name for e in entries]
    first = entries[0]
    findings.problem(
        Kind.nothing_quantized, f"nothing is quantized: all {count_and_first(names)} are kept; the first "
        f"because {first.decision.reason}",
        "the output would be about as large as the input: check --scheme and the recipe's rules against "
        "each tensor's reason in `qcli quantize --dry-run`",
        names, severity=Severity.warning,
    )


def default_problems(findings: Findings, options: PlanOptions, names: list[str]) -> None:
    """A preset Burn refuses is reported once, like a rule (the CLI only offers accepted presets)."""
    refusals = accept_problems(options.preset.scheme, options.calibration or options.preset.calibration)
    if refusals and names:
        findings.problem(
            refusals[0].kind,
            f"preset {options.preset.name} ({options.preset.scheme}) is refused by Burn: "
            f"{'; and '.join(r.message for r in refusals)}; it would have covered {count_and_first(names)}",
            refusals[0].hint, names,
        )


def output_problems(findings: Findings, found: Mapping[str, Found], entry: PlanEntry) -> None:
    """What Burn cannot load whatever the decision: an unrepresentable kept dtype, an oversized tensor."""
    info, decision = entry.info, entry.decision
    why_not = found.get(info.name)
    hint = ("dequantize the checkpoint to BF16 or F32 (with its scale tensors) first, then run qcli "
            "(the formats qcli transcodes are in docs/input-formats.md)")
    if decision.scheme is None and entry.out_dtype is None and not isinstance(why_not, Encoded):  # refused once
        nor = f"; nor transcoded: {why_not}" if isinstance(why_not, str) else ""
        findings.problem(
            Kind.dtype, f"{info.name} ({info.dtype}) cannot be kept: Burn has no {info.dtype} dtype{nor}",
            hint, [info.name], rule=decision.rule,
        )
    elif decision.scheme is None and isinstance(why_not, str) and not (decision.rule and decision.rule.keep):
        findings.problem(  # Burn holds the dtype, but not the values the codes stand for
            Kind.dtype, f"{info.name} ({info.dtype}) holds another tool's quantized codes, which kept as they are "
            f"would not decode in Burn, and is not transcoded: {why_not}", hint, [info.name], rule=decision.rule,
        )
    if entry.decision.scheme is None and info.nbytes > MAX_TENSOR_SIZE:
        limit = gib(MAX_TENSOR_SIZE)
        findings.problem(
            Kind.size, f"{info.name} is {info.nbytes / 1024**3:.1f} GiB, over Burn's {limit} tensor limit",
            f"quantize it (a rule with a scheme) so its payload fits under {limit}",
            [info.name], rule=entry.decision.rule,
        )


def version_problems(findings: Findings, options: PlanOptions, entries: Sequence[PlanEntry]) -> None:
    """Schemes the target Burn release has no form for, whatever the backend: one error per rule."""
    unheld: dict[tuple[int, str], list[PlanEntry]] = {}
    for entry in entries:
        why = entry.decision.scheme and hold_problem(entry.decision.scheme, options.burn_version)
        if why:
            unheld.setdefault((id(entry.decision.rule), why), []).append(entry)
    for (_, why), group in unheld.items():
        names = [e.info.name for e in group]
        scheme = group[0].decision.scheme
        assert scheme is not None, "an entry is unheld for its scheme"
        if group[0].decision.transcode:  # a transcode's scheme is the checkpoint's: there is no other to offer
            instead = f"write it for --burn-version {BURN_VERSION}"
        elif packs_outer(scheme):
            newest = short_version(max(OUTER_PACKING_VERSIONS))
            instead = f'pack along the last axis (store = "PackedU32(0)"), or --burn-version {newest}'
        else:
            instead = f"use a one-level scheme (drop tensor_scale), or --burn-version {BURN_VERSION}"
        findings.problem(Kind.version, f"{count_and_first(names)} cannot be written as {scheme}: {why}", instead,
                         names, rule=group[0].decision.rule)


def backend_problems(findings: Findings, options: PlanOptions, backend: BurnBackend,
                     entries: Sequence[PlanEntry]) -> None:
    """What `backend` cannot load, one problem per rule (or the preset) and reason: an error for the
    backend asked for, a warning for a common one."""
    failing: dict[tuple[int, object, str], list[PlanEntry]] = {}
    version = options.burn_version
    for entry in entries:
        why = backend_problem(backend, entry)
        if why is not None:
            failing.setdefault((id(entry.decision.rule), entry.decision.scheme or entry.out_dtype, why),
                               []).append(entry)
    for (_, written, why), group in failing.items():  # `written`: a scheme or a dtype, shown as text
        first = group[0]
        names = [e.info.name for e in group]
        if why == CAPABILITIES[version][backend].col_linear:
            hint = ("write them as Burn's Row layout, [in, out], and load them with LinearLayout::Row: --transpose, "
                    "or transpose = true on their rule")
        elif first.decision.scheme is None:
            hint = ("load the file on flex (Burn's CPU backend), which builds every dtype, or write them as F32: "
                    "cast = \"F32\" on their keep rule, or cast_kept = \"F32\" in [defaults]")
        elif first.decision.transcode is not None:  # the checkpoint's own codes: no other scheme holds them
            hint = (f"they are the checkpoint's own codes, written exactly: {requantize_into(options, backend, first)}"
                    "load the file on a backend that reads them (docs/input-formats.md)")
        else:
            hint = backend_way_out(backend, first.decision.scheme, first.out_shape, version, first.decision.rule)
        if options.backend is None:
            hint += f"; --burn-backend {'|'.join(backends(version))} checks only the one you load with"
        findings.problem(
            Kind.backend, f"Burn {version}'s {backend} backend cannot load {count_and_first(names)} as {written}: "
            f"{why}", hint, names, severity=Severity.error if options.backend else Severity.warning,
            rule=first.decision.rule,
        )


def requantize_into(options: PlanOptions, backend: BurnBackend, entry: PlanEntry) -> str:
    """The `--requantize` that writes a transcoded `entry` in a preset `backend` loads, as a hint's
    first choice ("requantize them ..., or "); empty where no offered preset loads there."""
    offered = next((p for p in (REQUANTIZE_NARROW, REQUANTIZE_WIDE)
                    if load_problem(backend, PRESETS[p].scheme, entry.out_shape, options.burn_version) is None), None)
    if offered is None:
        return ""
    named = "" if options.backend else f" --burn-backend {backend}"
    return f"requantize them into a preset {backend} loads (--requantize {offered}{named}), or "


def transpose_problems(findings: Findings) -> None:
    """What --transpose cannot do: a weight whose name does not tell its orientation (an error), and
    transcoded Linear weights, which keep their codes' (a warning)."""
    if findings.unsure:
        findings.problem(
            Kind.transpose, f"--transpose cannot tell whether {count_and_first(findings.unsure)} hold a Linear "
            "weight [out, in] or GPT-2's Conv1D weight [in, out] (Burn's Row already): both modules take "
            "these names", "say it in a recipe rule for them: transpose = false for GPT-2's Conv1D, "
            "transpose = true for a Linear (Qwen's first release)", findings.unsure)
    if findings.untransposed:
        findings.problem(
            Kind.transcoded, f"--transpose leaves {count_and_first(findings.untransposed)} [out, in]: they are "
            "transcoded, their codes written as they are", "build their Linear layers with "
            "LinearLayout::Col: the run's last lines name the layout each group of weights needs",
            findings.untransposed, severity=Severity.warning)


def file_problems(findings: Findings, plan: Plan) -> None:
    """Burn's per-file reader limits: the tensor count and the file size (data alone, aligned)."""
    count = len(plan.entries)
    if count > MAX_TENSOR_COUNT:
        findings.problem(Kind.size, f"the output would hold {count} tensors; Burn's reader refuses more than "
                         f"{MAX_TENSOR_COUNT}", "split the output into several files with --max-shard-size")
    data = sum(align(e.out_nbytes) for e in plan.entries)
    most = max_file_size(plan.entries[0].burn_version if plan.entries else None)
    if data > most:
        findings.problem(Kind.size, f"the output would take at least {data / 1024**3:.1f} GiB; Burn's reader "
                         f"refuses a file over {gib(most)}",
                         "split the output with --max-shard-size 50GB, quantize more tensors, or use a smaller "
                         "scheme")


def backend_problem(backend: BurnBackend, entry: PlanEntry) -> str | None:
    """Why a model on `backend` cannot use `entry` as written (Burn does not build, decode or compute with
    it), or None; None too where the entry fails on every backend, which other checks report once: a
    scheme its Burn release has no form for, a dtype Burn lacks."""
    scheme, version = entry.decision.scheme, entry.burn_version
    if scheme is not None and hold_problem(scheme, version) is not None:
        return None  # `version_problems`
    dtype = entry.out_dtype
    if dtype is None:
        return None  # `output_problems`
    if scheme is None:
        return kept_problem(backend, dtype, version)
    return load_problem(backend, scheme, entry.out_shape, version) or col_problem(backend, entry)


def col_problem(backend: BurnBackend, entry: PlanEntry) -> str | None:
    """Why `backend` computes a quantized Linear weight written `[out, in]` wrong (Burn loads it as
    `LinearLayout::Col`), or None; a name that cannot tell a Linear's weight (GPT-2's Conv1D) counts as one."""
    why = CAPABILITIES[entry.burn_version][backend].col_linear
    return why if why and not entry.decision.transpose and linear_weight(entry.name, entry.shape) is not False else None


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


def backend_way_out(backend: BurnBackend, scheme: QuantScheme, shape: Sequence[int], version: str,
                    rule: Rule | None) -> str:
    """What to write instead of `scheme`, which `backend` cannot load or compute with for `shape`, in names
    `--scheme` and a recipe accept: the nearest preset it does load (`--scheme NAME`, or for a `rule`'s
    tensors `preset = "NAME"` there), and where the nearest scheme it loads keeps the width under a tensor
    scale (wgpu dequantizes such a weight before its matmul), that way too."""
    preset = nearest_preset(backend, scheme, shape, version)
    if preset is None:
        return "keep them (keep = true), or load the file on another backend"
    hint = f"use {f'--scheme {preset.name}' if rule is None else f'preset = {preset.name!r} in that rule'}, which " \
           f"{backend} loads"
    instead = loads_instead(backend, scheme, shape, version)
    if instead is not None and instead.value is scheme.value and instead.is_two_level() and not scheme.is_two_level():
        hint += f", or keep {scheme.value.size_bits()} bits with tensor_scale = \"F32\" in a recipe rule"
    return hint


def nearest_preset(backend: BurnBackend, scheme: QuantScheme, shape: Sequence[int], version: str) -> Preset | None:
    """The preset `backend` loads and computes with for `shape` that is nearest to `scheme`: of its width, else
    the narrowest wider one, else the widest narrower one; then of its value, then of its block."""
    width = scheme.value.size_bits()

    def distance(preset: Preset) -> tuple:
        bits = preset.scheme.value.size_bits()
        value, block = preset.scheme.value is not scheme.value, preset.scheme.block != scheme.block
        return bits < width, abs(bits - width), value, block

    return next((p for p in sorted(PRESETS.values(), key=distance)
                 if load_problem(backend, p.scheme, shape, version) is None), None)


def count_and_first(names: Sequence[str]) -> str:
    """`3 tensors (a, b, c)`, naming at most the first FIRST_NAMES."""
    if not names:
        return "no tensor"
    first = ", ".join(names[:FIRST_NAMES]) + (", ..." if len(names) > FIRST_NAMES else "")
    return f"{len(names)} tensor{'s' if len(names) > 1 else ''} ({first})"
