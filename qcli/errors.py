"""The errors a user can cause, each with a hint and the exit code the CLI answers with.

Every exit code but 0 belongs to a class here, which says what it means; `exit_codes()` collects them
into the table that `qcli --help`, the README and docs/cli.md show.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import TYPE_CHECKING

from qcli.problem import Problem
from qcli.text import printable, quoted

if TYPE_CHECKING:
    import torch

SUCCESS = 0


class QcliError(Exception):
    """An error with a one-line message, a hint that says what to do, and an exit code.

    A class that sets its `exit_code` also says what the code means (`meaning`, a row of the exit-code
    table); one that only narrows its parent's error (`NonFiniteTensor`) sets neither.
    """

    exit_code: int
    meaning: str

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class CheckFailed(QcliError):
    """A check ran and found problems; its report, already printed, says which (so nothing is added)."""

    exit_code = 1
    meaning = ("`validate-scheme` found an error, or `inspect --compare` found missing, extra or mismatched "
               "tensors")

    def __init__(self) -> None:
        super().__init__("")


class UsageError(QcliError):
    """Arguments that cannot be honoured as given."""

    exit_code = 2
    meaning = ("a usage error (an unknown option, a missing argument, a bad choice, an existing output without "
               "`--force`)")


def one_of(value: str, choices: Sequence[str], option: str) -> str:
    """The choice of `option` that `value` names (any case); else `bad_choice`'s error."""
    key = value.strip().lower()
    for choice in choices:
        if choice.lower() == key:
            return choice
    raise bad_choice(value, choices, option)


def bad_choice(value: str, choices: Sequence[str], option: str, more: str = "") -> UsageError:
    """The error of every enum-like option given a value it does not take: the choices, and the closest one
    (difflib) in the hint, followed by `more`."""
    close = difflib.get_close_matches(value.strip().lower(), [c.lower() for c in choices], n=1, cutoff=0.5)
    hint = " ".join(filter(None, [f"did you mean {option} {close[0]}?" if close else "", more]))
    return UsageError(printable(f"{option}: {quoted(value)} is not one of {', '.join(choices)}"),
                      hint=hint or f"give {option} one of them")


class SchemeError(QcliError):
    """A quantization scheme that Burn would refuse, or that qcli cannot build."""

    exit_code = 2
    meaning = "a scheme Burn refuses (the Lookup refusal included)"


class RecipeError(QcliError):
    """A recipe file that does not parse or names something unknown."""

    exit_code = 2
    meaning = "a recipe that does not parse or names something unknown"


class PlanError(QcliError):
    """A plan with tensors that cannot take their scheme; carries every problem found."""

    exit_code = 2
    meaning = "a plan with tensors that cannot take their scheme"

    def __init__(self, message: str, hint: str = "", problems: Sequence[Problem] = ()) -> None:
        super().__init__(message, hint)
        self.problems = list(problems)


class InputError(QcliError):
    """An input file that cannot be read, or whose contents are corrupt or unsupported."""

    exit_code = 3
    meaning = ("an input file that cannot be read, is corrupt or holds what qcli cannot take, or NaN or Inf in a "
               "tensor to quantize")


class NonFiniteTensor(InputError):
    """A tensor to quantize with a value that is not finite in float32: NaN or Inf (`beyond_float32`
    False), finite float64 values past float32's range (True), or either (None, where the tensor is no
    longer at hand to tell). One wording on every device."""

    def __init__(self, name: str, beyond_float32: bool | None) -> None:
        what = {False: "NaN or Inf values", True: "values beyond the float32 range (finite only in float64)",
                None: "NaN or Inf values, or values beyond the float32 range"}[beyond_float32]
        super().__init__(f"tensor {name!r} holds {what}, which cannot be quantized",
                         hint="fix or drop the non-finite values, or keep the tensor unquantized (keep = true)")


class NotFloatTensor(InputError):
    """A tensor to quantize whose dtype is not a float type. One wording on every device."""

    def __init__(self, name: str, dtype: torch.dtype) -> None:
        super().__init__(f"tensor {name!r} has dtype {dtype}, not a float type, so it cannot be quantized",
                         hint="keep it unquantized with a `keep = true` rule")


class NotKernelFloat(InputError):
    """A float tensor to quantize on the GPU in a dtype the Triton kernels do not take (they take float32,
    float16 and bfloat16): a torch dtype, or a safetensors one where the file is read."""

    def __init__(self, name: str, dtype: torch.dtype | str) -> None:
        super().__init__(f"tensor {name!r} is {dtype}, which the kernels cannot quantize",
                         hint="keep it unquantized (keep = true)")


class OutputError(QcliError):
    """The output could not be written; the target path was left as it was."""

    exit_code = 4
    meaning = "the output could not be written (disk full, permissions), and the target is left untouched"


class DeviceMemoryError(QcliError):
    """The device ran out of memory for a calibration run; the message gives the estimate, the hint the
    windows that would fit."""

    exit_code = 5
    meaning = "the device ran out of memory during calibration; the hint names --samples and --seq-len that fit"


class InternalError(QcliError):
    """Anything else that escaped a command: a bug in qcli."""

    exit_code = 70
    meaning = "an internal error (a bug in qcli): set `QCLI_DEBUG=1` for the traceback"


class Interrupted(QcliError):
    """SIGINT or SIGTERM arrived; nothing was left at the target path."""

    exit_code = 130
    meaning = "interrupted by Ctrl-C (SIGINT) or SIGTERM, leaving no partial output"


def exit_codes() -> list[tuple[int, str]]:
    """`(code, meaning)` for every exit code, in increasing order: the classes that share a code are
    listed together, in the order they are declared here."""
    by_code: dict[int, list[str]] = {SUCCESS: ["success"]}
    pending = QcliError.__subclasses__()
    while pending:
        cls = pending.pop(0)
        if "exit_code" in vars(cls):
            by_code.setdefault(cls.exit_code, []).append(vars(cls)["meaning"])
        pending += cls.__subclasses__()
    return [(code, _listed(by_code[code])) for code in sorted(by_code)]


def _listed(phrases: list[str]) -> str:
    return phrases[0] if len(phrases) == 1 else ", ".join(phrases[:-1]) + ", or " + phrases[-1]
