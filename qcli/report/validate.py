"""`qcli validate-scheme`'s report and its `--json` document."""

from __future__ import annotations

from dataclasses import dataclass

from qcli import __version__
from qcli.problem import Problem, Severity
from qcli.report.documents import JSON_SCHEMA_VERSION, problem_json


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
