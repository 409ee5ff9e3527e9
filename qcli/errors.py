"""The errors a user can cause, each with a hint and the exit code the CLI answers with.

Exit codes (documented in docs/cli.md):

| code | meaning |
|---|---|
| 0 | success |
| 1 | a check found problems (validate-scheme, inspect --compare) |
| 2 | usage, recipe, scheme or plan errors, the Lookup refusal included |
| 3 | unreadable or corrupt input |
| 4 | the output could not be written; the target is left untouched |
| 130 | interrupted |
"""

from __future__ import annotations


class QcliError(Exception):
    """An error with a one-line message, a hint that says what to do, and an exit code."""

    exit_code = 2

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class UsageError(QcliError):
    """Arguments that cannot be honoured as given."""

    exit_code = 2


class SchemeError(QcliError):
    """A quantization scheme that Burn would refuse, or that qcli cannot build."""

    exit_code = 2


class RecipeError(QcliError):
    """A recipe file that does not parse or names something unknown."""

    exit_code = 2


class PlanError(QcliError):
    """A plan with tensors that cannot take their scheme; carries every problem found."""

    exit_code = 2

    def __init__(self, message: str, hint: str = "", problems: list[str] | None = None) -> None:
        super().__init__(message, hint)
        self.problems = problems or []


class InputError(QcliError):
    """An input file that cannot be read, or whose contents are corrupt or unsupported."""

    exit_code = 3


NON_FINITE_HINT = "fix or drop the non-finite values, or keep the tensor unquantized (keep = true)"


def non_finite(name: str, beyond_float32: bool | None) -> InputError:
    """The one wording for a tensor with a value that is not finite in float32: NaN or Inf
    (`beyond_float32` False), finite float64 values past float32's range (True), or either (None, where
    the tensor is no longer at hand to tell)."""
    what = {False: "NaN or Inf values", True: "values beyond the float32 range (finite only in float64)",
            None: "NaN or Inf values, or values beyond the float32 range"}[beyond_float32]
    return InputError(f"tensor {name!r} holds {what}, which cannot be quantized", hint=NON_FINITE_HINT)


class OutputError(QcliError):
    """The output could not be written; the target path was left as it was."""

    exit_code = 4


class Interrupted(QcliError):
    """SIGINT or SIGTERM arrived; nothing was left at the target path."""

    exit_code = 130
