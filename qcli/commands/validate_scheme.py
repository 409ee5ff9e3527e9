"""`validate_scheme`: every problem of each recipe, and with a model, of the plan it makes from the headers.

Unlike `load_recipe`, it raises nothing for a faulty recipe. Parse errors, schemes Burn refuses and Lookup or
zero-point requests come back together as `Problem`s, each with its file and line, so that CI can annotate
the recipe.

With the model's `TensorInfo`s the plan is made too. Its problems are tensors that cannot take their scheme,
rules that decide nothing (errors here, warnings in `make_plan`), tensors no rule covers and a plan that
quantizes nothing (warnings), and already-quantized weights no Burn scheme holds (errors, unless `requantize`
names a preset for them). Headers cannot say whether a tensor's values fit its scale dtype's range: with
`values`, every quantized tensor is read and quantized on the CPU, and one whose blocks need scales outside
that range is an error (quantize's `scale-range` warning)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from qcli.burn_backends import BurnBackend, load_problem
from qcli.errors import UsageError
from qcli.formats import detect
from qcli.formats.found import Found
from qcli.io.files import NOT_REGULAR_HINT, not_regular_problem
from qcli.io.readers import locate, open_source
from qcli.io.source import Source, TensorInfo
from qcli.plan.checks import backend_way_out, count_and_first, rule_refusal
from qcli.plan.decisions import make_plan
from qcli.plan.entries import Plan
from qcli.plan.options import PlanOptions
from qcli.problem import Kind, Problem, Severity
from qcli.recipe import Rule, read_recipe
from qcli.report.validate import ValidateReport
from qcli.text import printable

# Warnings of `make_plan` that are errors here: a rule that decides nothing is a mistake in the recipe.
RULE_KINDS = (Kind.unmatched_rule, Kind.unquantized_rule)


def validate_scheme(
    recipes: str | Path | Sequence[str | Path], *, model: str | Path | None = None, scheme: str | None = None,
    requantize: str | None = None, burn_backend: str | None = None,
    burn_version: str | None = None, values: bool = False,
) -> ValidateReport:
    """Every problem in each recipe, and with `model` every problem of the plan each makes from headers
    (with `requantize`, the preset its weights no Burn scheme holds are requantized into, as quantize
    does; with `values`, the tensors whose scales leave their scale dtype's range, from their values);
    with `burn_backend`, every scheme that Burn backend cannot load."""
    if values and model is None:
        raise UsageError("--values needs --model", hint="name the checkpoint whose values to check: --model INPUT")
    paths = [Path(recipes)] if isinstance(recipes, (str, Path)) else [Path(r) for r in recipes]
    for path in paths:
        kind = not_regular_problem(path)
        if kind is not None:
            raise UsageError(
                printable(f"cannot read recipe {path}: not a regular file ({kind})"),
                hint=NOT_REGULAR_HINT,
            )
        if not path.is_file():
            raise UsageError(
                printable(f"cannot read recipe {path}: no such file"),
                hint="pass the path of a TOML recipe (docs/recipes.md)",
            )
    options = PlanOptions.parse(scheme=scheme, requantize=requantize, burn_backend=burn_backend,
                                burn_version=burn_version)
    if model is None:
        problems = [p for path in paths for p in recipe_problems(path, None, options)]
    else:
        with open_source(locate(model)[0]) as source:
            infos = source.infos()
            found = detect(infos, None if options.requantize is None else source.load)
            problems = [p for path in paths for p in recipe_problems(
                path, infos, options, found, source if values else None)]
    return ValidateReport([str(p) for p in paths], None if model is None else str(model), problems)


def recipe_problems(
    recipe_path: str | Path, infos: Iterable[TensorInfo] | None = None, options: PlanOptions = PlanOptions(),
    found: Mapping[str, Found] | None = None, values: Source | None = None,
) -> list[Problem]:
    """Every problem of the recipe at `recipe_path`, and of its plan for `infos` when given.

    `options` and `found` are as `qcli.plan.decisions.make_plan` takes them. With `options.backend`, every scheme
    that Burn backend cannot load is a problem too (per tensor when `infos` is given). With `values` (the source
    of `infos`), so are the tensors whose scales leave their scale dtype's range, when the plan has no error
    to stop it first.

    An unreadable recipe file raises `RecipeError`; everything wrong inside it is returned."""
    recipe, problems = read_recipe(recipe_path)
    if infos is None:
        problems += [p for rule in recipe.rules if (p := rule_refusal(rule)) is not None]
        backend = options.backend
        return problems + ([] if backend is None else _backend_refusals(recipe.rules, backend, options.burn_version))
    plan = make_plan(infos, recipe, options, found=found)
    for problem in plan.problems:
        problems.append(replace(problem, severity=Severity.error) if problem.kind in RULE_KINDS else problem)
    uncovered = [e.info.name for e in plan.entries if e.decision.rule is None]
    if uncovered:
        problems.append(Problem(
            Kind.uncovered, f"no rule covers {count_and_first(uncovered)}; they follow the default policy "
            f"({plan.preset.name if plan.preset else 'default'} where the shape takes it, else keep)",
            "add a rule for them (match = \"*\" as the last rule catches everything), or accept the default",
            severity=Severity.warning, file=str(recipe_path), tensors=tuple(uncovered),
        ))
    if values is not None and not any(p.severity is Severity.error for p in problems):
        problems += range_problems(plan, values)
    return problems


def range_problems(plan: Plan, source: Source) -> list[Problem]:
    """quantize's `scale-range` warnings, as errors: every tensor the plan quantizes, read and quantized by
    the CPU pipeline and measured as a run measures it (`qcli.measure.Measurement.range_loss`)."""
    from qcli.pipeline import cpu

    problems = []
    for payload in cpu.run(plan, source, measure=True):
        measured = payload.measurement
        loss = None if measured is None else measured.range_loss()
        if measured is not None and loss is not None:
            problem = loss.problem(payload.entry.info.name, measured.stats().sqnr_db)
            problems.append(replace(problem, severity=Severity.error))
    return problems


def _backend_refusals(rules: Iterable[Rule], backend: BurnBackend, version: str) -> list[Problem]:
    """Each rule whose scheme `backend` of Burn `version` cannot load whatever the tensor's shape (no model:
    shapes unknown)."""
    problems = []
    for rule in rules:
        if rule.scheme is None or rule.refusals:
            continue
        why = load_problem(backend, rule.scheme, (), version)
        if why is not None:
            hint = backend_way_out(backend, rule.scheme, (), version, rule)
            problems.append(Problem(Kind.backend, f"rule (match {rule.match!r}) asks for {rule.describe()}, "
                                    f"which Burn {version}'s {backend} backend cannot load: {why}", hint,
                                    file=rule.file, line=rule.line))
    return problems
