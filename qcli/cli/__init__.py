"""The `qcli` command line: quantize, inspect, validate-scheme.

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
from qcli.cli.inspect import inspect
from qcli.cli.quantize import quantize
from qcli.cli.validate_scheme import validate_scheme
from qcli.errors import CheckFailed, Interrupted, QcliError, UsageError, exit_codes

EXIT_CODES = "Exit codes: " + "; ".join(f"{code} {meaning}" for code, meaning in exit_codes()).replace("`", "") + "."

app = typer.Typer(
    name="qcli",
    help="Quantize safetensors checkpoints and GGUF files into Burn's burnpack (.bpk) QFloat layout.",
    epilog=EXIT_CODES,
    no_args_is_help=True,
    add_completion=False,
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
    """Quantize safetensors checkpoints and GGUF files into Burn's burnpack (.bpk) QFloat layout."""


SHELLS = ("bash", "zsh", "fish", "powershell", "pwsh")


def completion(
    shell: str = typer.Argument(..., metavar="SHELL", help=f"One of: {', '.join(SHELLS)}.", show_default=False),
) -> None:
    """Print the shell completion script for SHELL.

    Load it for this shell with `eval "$(qcli completion bash)"` (zsh likewise; fish: `qcli completion fish
    | source`), or save it where your shell reads completions.
    """
    from typer._completion_shared import get_completion_script

    if shell not in SHELLS:
        raise UsageError(f"no completion for shell {shell!r}", hint=f"give one of: {', '.join(SHELLS)}")
    typer.echo(get_completion_script(prog_name="qcli", complete_var="_QCLI_COMPLETE", shell=shell), nl=False)


app.command("quantize")(quantize)
app.command("inspect")(inspect)
app.command("validate-scheme")(validate_scheme)
app.command("completion")(completion)


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
    if "_QCLI_COMPLETE" in os.environ:  # a shell asking for completions (`qcli completion SHELL`)
        from typer._completion_classes import completion_init

        completion_init()
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
    sys.exit(run())
