"""`qcli validate-scheme`: check a recipe (and with --model, its plan) before anything heavy runs."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from qcli.cli import _output
from qcli.cli._burn import BurnBackendOption, BurnVersionOption
from qcli.cli._formats import requantize_option
from qcli.commands import validate_scheme as command
from qcli.errors import CheckFailed
from qcli.problem import Problem
from qcli.report.validate import ValidateReport

MAX_NAMES = 5


class Format(StrEnum):
    text = "text"
    json = "json"
    github = "github"


def validate_scheme(
    recipes: Annotated[
        list[Path],
        typer.Argument(help="The TOML recipes to check.", metavar="RECIPE", show_default=False),
    ],
    model: Annotated[
        Path | None,
        typer.Option(
            "--model", metavar="INPUT", help="Also plan this checkpoint (a path, or ORG/NAME in the local Hugging Face"
            " cache) from its headers (no weight is read)."
        ),
    ] = None,
    scheme: Annotated[
        str | None,
        typer.Option(
            "--scheme", metavar="NAME", help="With --model: the preset for tensors no rule covers, as in quantize."
        ),
    ] = None,
    values: Annotated[
        bool,
        typer.Option(
            "--values", help="With --model: also read and quantize (on the CPU, nothing written) every tensor the "
            "plan quantizes, and report each whose block scales its scale dtype cannot hold."
        ),
    ] = False,
    requantize: requantize_option() = None,  # type: ignore[valid-type]  # an Annotated built per command
    burn_backend: BurnBackendOption = None,
    burn_version: BurnVersionOption = None,
    json_output: Annotated[bool, typer.Option("--json", help="Same as --format json.")] = False,
    format: Annotated[
        Format | None,
        typer.Option(
            "--format",
            metavar="text|json|github",
            help="text (default), json, or github workflow annotations.",
        ),
    ] = None,
) -> None:
    """Check recipes against Burn's acceptance rules; exit 1 when any error is found.

    With --model: every tensor that cannot take its scheme, every rule that matches nothing, every
    tensor no rule covers, and every already-quantized weight Burn cannot hold (unless --requantize);
    with --values too, every tensor whose values need block scales outside its scale dtype's range.
    Without --model neither torch nor triton is imported.
    """
    if json_output and format not in (None, Format.json):
        raise typer.BadParameter("--json conflicts with --format " + format.value, param_hint="--json")
    chosen = Format.json if json_output else format or Format.text
    report = command.validate_scheme(recipes, model=model, scheme=scheme, requantize=requantize,
                                     burn_backend=None if burn_backend is None else burn_backend.value,
                                     burn_version=burn_version, values=values)
    {Format.text: _text, Format.json: _json, Format.github: _github}[chosen](report)
    if not report.ok:
        raise CheckFailed()


def _json(report: ValidateReport) -> None:
    _output.print_json(report.to_json())


def _names(tensors: tuple[str, ...] | list[str]) -> str:
    shown = ", ".join(tensors[:MAX_NAMES])
    return shown + (f" (+{len(tensors) - MAX_NAMES} more)" if len(tensors) > MAX_NAMES else "")


def _names_missing(p: Problem) -> bool:
    """Whether the message leaves out the tensors it concerns (the plan's messages name the first)."""
    return bool(p.tensors) and p.tensors[0] not in p.message


def _text(report: ValidateReport) -> None:
    lines = []
    for p in report.problems:
        where = p.location
        lines.append(f"{where + ': ' if where else ''}{p.severity}: {p.message}")
        if _names_missing(p):
            lines.append(f"  tensors: {_names(p.tensors)}")
        if p.hint:
            lines.append(f"  hint: {p.hint}")
    target = ", ".join(report.recipes) + (f" with {report.model}" if report.model else "")
    if report.problems:
        lines.append(f"{target}: {report.errors} error(s), {report.warnings} warning(s)")
    else:
        lines.append(f"{target}: no problems")
    _output.stdout().print("\n".join(lines), markup=False, soft_wrap=True)


def _escape_data(s: str) -> str:
    return s.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(s: str) -> str:
    return _escape_data(s).replace(":", "%3A").replace(",", "%2C")


def _github(report: ValidateReport) -> None:
    """GitHub workflow commands: `::error file=F,line=N,title=T::message`, one per problem."""
    lines = []
    for p in report.problems:
        props: list[tuple[str, str | int | None]] = [("file", p.file), ("line", p.line), ("title", f"qcli {p.kind}")]
        rendered = ",".join(f"{k}={_escape_property(str(v))}" for k, v in props if v)
        message = p.message + (f" (tensors: {_names(p.tensors)})" if _names_missing(p) else "")
        message += f". hint: {p.hint}" if p.hint else ""
        lines.append(f"::{p.severity} {rendered}::{_escape_data(message)}")
    checked = " ".join(report.recipes)
    lines.append(f"qcli validate-scheme {checked}: {report.errors} error(s), {report.warnings} warning(s)")
    print("\n".join(lines))
