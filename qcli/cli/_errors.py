"""Errors become one `error:` line and one `hint:` line on stderr, and an exit code (docs/cli.md).

A `QcliError` exits with its class's `exit_code`; a Click usage error exits 2 as a `UsageError` would,
with Click's message as `error:` and the command's `--help` (and a did-you-mean) as `hint:`;
KeyboardInterrupt and SIGTERM exit as `Interrupted`; anything else is an `InternalError`, which
QCLI_DEBUG=1 re-raises with its traceback instead.
"""

from __future__ import annotations

import os
import signal
import sys
import traceback
import typing
from collections.abc import Iterator
from contextlib import contextmanager
from enum import Enum
from types import FrameType

from qcli.errors import InternalError, Interrupted, PlanError, QcliError, UsageError, bad_choice
from qcli.text import printable


def debug() -> bool:
    return os.environ.get("QCLI_DEBUG", "") not in ("", "0")


def is_usage_error(exc: Exception) -> bool:
    """A Click usage error (exit 2, its own message). Typer vendors its own copy of Click, so these are
    matched by what they do rather than by class."""
    return callable(getattr(exc, "show", None)) and isinstance(getattr(exc, "exit_code", None), int)


def usage(exc: Exception) -> int:
    """A Click parse error (unknown option, missing argument, bad choice) as `error:` and `hint:` lines; a bad
    choice of an enum option in qcli's words (`bad_choice`), as qcli's own enum-like options give it."""
    ctx = getattr(exc, "ctx", None)
    path = getattr(ctx, "command_path", None) or "qcli"
    hint = f"run '{path} --help' for the usage"
    choice = _bad_choice(exc, hint)
    if choice is not None:
        return emit(choice)
    format_message = getattr(exc, "format_message", None)  # click's errors have it
    message = format_message() if callable(format_message) else str(exc)
    first, _, rest = printable(message).partition("\n")
    possibilities = sorted(getattr(exc, "possibilities", None) or [])
    if possibilities:
        first = first.split(" Did you mean")[0].split(" (Possible options")[0].rstrip()
        hint = f"did you mean {' or '.join(possibilities)}? " + hint
    sys.stderr.write(f"error: {first.rstrip().rstrip('.')}{' ' + rest.strip() if rest.strip() else ''}\n"
                     f"hint: {hint}\n")
    code = getattr(exc, "exit_code", UsageError.exit_code)
    return code if isinstance(code, int) else UsageError.exit_code


def _bad_choice(exc: Exception, hint: str) -> UsageError | None:
    """The error for a value an enum-typed option does not take, or None for any other parse error. Typer
    validates enums with pydantic, whose error (the `__cause__`) holds the value given."""
    param = getattr(exc, "param", None)
    annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
    kind = next((t for t in (annotation, *typing.get_args(annotation)) if isinstance(t, type) and issubclass(t, Enum)),
                None)  # `Choice` or `Choice | None`
    errors = getattr(exc.__cause__, "errors", None)
    if kind is None or not callable(errors):
        return None
    given = next((e.get("input") for e in errors() if isinstance(e.get("input"), str)), None)
    option = max(getattr(param, "opts", None) or [""], key=len)
    if given is None or not option:
        return None
    return bad_choice(given, [str(member.value) for member in kind], option, hint)


def emit(error: QcliError) -> int:
    """Print `error:`, a plan's problems one per line, and `hint:`; return the exit code."""
    if debug():
        traceback.print_exception(error, file=sys.stderr)
    lines = [f"error: {printable(error.message)}"]
    if isinstance(error, PlanError):  # each problem with its hint, unless that is the error's own
        lines += [f"  {printable(str(p) if p.hint == error.hint else f'{p} (hint: {p.hint})')}"
                  for p in error.problems]
    if error.hint:
        lines.append(f"hint: {printable(error.hint)}")
    sys.stderr.write("\n".join(lines) + "\n")
    return error.exit_code


def interrupted() -> int:
    return emit(
        Interrupted("interrupted", hint="nothing was written: the output path is as it was; run again")
    )


def internal(exc: BaseException) -> int:
    first = (str(exc).splitlines() or [""])[0]
    return emit(InternalError(f"internal error: {type(exc).__name__}{': ' + first if first else ''}",
                              hint="set QCLI_DEBUG=1 for the traceback, and report it with the command you ran"))


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


@contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl-C, so open containers remove their temporary files on the way out."""
    try:
        previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
