"""Something wrong, or worth a look: what kind, where (a recipe's file and line), which tensors, what to do.

One shape for every finding: a reason Burn refuses a scheme (`scheme.accept_problems`), a recipe fault
(`recipe.read_recipe`), a problem of a plan (`plan.make_plan`), and each problem a `PlanError` lists.
validate-scheme and `--json` report them as they are (docs/json-schema.json, `problem`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Severity(StrEnum):
    """An error stops the plan (and fails validate-scheme); a warning deserves a look."""

    error = "error"
    warning = "warning"


class Kind(StrEnum):
    """What a problem is about (docs/recipes.md, "Problem kinds", says what each means); its value is the
    `kind` of the JSON documents and of the GitHub annotations."""

    recipe = "recipe"
    lookup = "lookup"
    scheme = "scheme"
    shape = "shape"
    transpose = "transpose"
    dtype = "dtype"
    size = "size"
    cast = "cast"
    version = "version"
    backend = "backend"
    unmatched_rule = "unmatched-rule"
    unquantized_rule = "unquantized-rule"
    transcoded = "transcoded"
    nothing_quantized = "nothing-quantized"
    uncovered = "uncovered"
    leftover = "leftover"
    scale_range = "scale-range"
    calibration = "calibration"


@dataclass(frozen=True)
class Problem:
    """A finding with its one-line `message` and a `hint` that says what to do; `file` and `line` place it
    in a recipe, and `tensors` names the tensors it concerns."""

    kind: Kind
    message: str
    hint: str
    severity: Severity = Severity.error
    file: str | None = None
    line: int | None = None
    tensors: tuple[str, ...] = ()

    @property
    def location(self) -> str | None:
        if self.file is None:
            return None
        return f"{self.file}:{self.line}" if self.line is not None else self.file

    def __str__(self) -> str:
        return f"{self.location}: {self.message}" if self.location else self.message
