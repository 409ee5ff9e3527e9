"""The `qcli` command line: quantize, inspect, validate-scheme, imatrix, eval.

Each command parses its arguments, calls one `qcli.commands` function and renders the report; `main()` maps
errors to exit codes (`_errors`). Importing this package loads neither torch nor triton, so `qcli --help`
and `qcli validate-scheme RECIPE` start fast.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

import typer

from qcli import __version__
from qcli.cli import _errors
from qcli.cli._formats import FORMATS_READ
from qcli.cli.evaluate import evaluate
from qcli.cli.imatrix import imatrix
from qcli.cli.inspect import inspect
from qcli.cli.quantize import quantize
from qcli.cli.validate_scheme import validate_scheme
from qcli.errors import CheckFailed, Interrupted, QcliError, exit_codes

EXIT_CODES = "Exit codes: " + "; ".join(f"{code} {meaning}" for code, meaning in exit_codes()).replace("`", "") + "."

app = typer.Typer(
    name="qcli",
    help=f"Quantize {FORMATS_READ} checkpoints into Burn's burnpack (.bpk) QFloat layout.",
    epilog=EXIT_CODES,
    no_args_is_help=True,
    add_completion=True,  # --install-completion and --show-completion, answered by Typer itself
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"qcli {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version."
    ),
) -> None:
    """The options before any command (`--version`); the help is the app's."""


app.command("quantize")(quantize)
app.command("inspect")(inspect)
app.command("validate-scheme")(validate_scheme)
app.command("imatrix")(imatrix)
app.command("eval")(evaluate)


def _paths_shown_as_paths(group) -> None:
    """Typer shows a list argument's Python type in --help (`RECIPE... <list[Path]>`): a list of paths
    reads `<path>` as a single path does, the `...` saying there may be several."""
    for command in group.commands.values():
        for param in command.params:
            if getattr(param, "type_descriptor", None) is not None and param.type_descriptor.is_list \
                    and param.bare_type() == "list[Path]":
                param.display_type = lambda ctx: "<path>"


def run(argv: Sequence[str] | None = None) -> int:
    """Run the command line on `argv` and return its exit code (errors rendered on stderr)."""
    command = typer.main.get_command(app)
    _paths_shown_as_paths(command)
    with _errors.sigterm_interrupts():
        try:
            args = list(argv) if argv is not None else None
            result = command.main(args=args, prog_name="qcli", standalone_mode=False)
        except (typer.Abort, KeyboardInterrupt):
            return _errors.interrupted()
        except CheckFailed as exc:  # the report printed says what failed
            return exc.exit_code
        except QcliError as exc:
            return _errors.emit(exc)
        except Exception as exc:
            if _errors.is_usage_error(exc):
                return _errors.usage(exc)
            if _errors.debug():
                raise
            return _errors.internal(exc)
    # Typer answers Ctrl-C (and SIGTERM, which raises KeyboardInterrupt) with a silent exit 130.
    if result == Interrupted.exit_code:
        return _errors.interrupted()
    return result if isinstance(result, int) else 0


def main() -> None:
    """The `qcli` console script."""
    # torch's OpenMP threads spin at every barrier by default: on a machine shared with other work a
    # spinning thread starves its busy peer, and the CPU path ran 10-60x slower (docs/benchmarks.md).
    # Set before torch is first imported, which is when OpenMP reads it; a user's own setting wins.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    _exit(run())


def _exit(code: int) -> None:
    """Exit with `code`. Where torch was loaded, once the output is flushed, without Python's finalization:
    tearing torch's modules down took 0.2-0.8 s of a small run's wall time (docs/benchmarks.md), when every
    file is committed or removed and nothing is left to do."""
    if "torch" not in sys.modules:
        sys.exit(code)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (BrokenPipeError, ValueError):  # a reader that went away, or a stream already closed
            pass
    os._exit(code)
