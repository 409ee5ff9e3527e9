"""`validate_scheme`: every problem of each recipe, and with a model of the plan each makes from headers."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from qcli import validate
from qcli.burn_backends import resolve_backend, resolve_version
from qcli.errors import UsageError
from qcli.io.safetensors import NOT_REGULAR_HINT, SafetensorsSource, not_regular_problem, printable
from qcli.presets import resolve_preset
from qcli.report import ValidateReport


def validate_scheme(
    recipes: str | Path | Sequence[str | Path], *, model: str | Path | None = None, scheme: str | None = None,
    burn_backend: str | None = None,
    burn_version: str | None = None,
) -> ValidateReport:
    """Every problem in each recipe, and with `model` every problem of the plan each makes from headers;
    with `burn_backend`, every scheme that Burn backend cannot load."""
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
    infos = None
    if model is not None:
        with SafetensorsSource.open(Path(model)) as source:
            infos = source.infos()
    preset = resolve_preset(scheme)
    backend = resolve_backend(burn_backend)
    version = resolve_version(burn_version)
    problems = [p for path in paths for p in validate.validate_scheme(path, infos, preset, backend, version)]
    return ValidateReport([str(p) for p in paths], None if model is None else str(model), problems)
