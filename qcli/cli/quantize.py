"""`qcli quantize`: plan from the headers, then stream every tensor into a burnpack file."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from qcli import api
from qcli.cli import _output
from qcli.cli._burn import BurnBackendOption, BurnVersionOption
from qcli.io.safetensors import printable
from qcli.presets import DEFAULT_PRESET, PRESETS
from qcli.report import QuantizeReport


class Device(StrEnum):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


def quantize(
    input: Annotated[
        Path,
        typer.Argument(
            help="A .safetensors file, a directory (model.safetensors or an index with shards), or an index.",
            metavar="INPUT",
            show_default=False,
        ),
    ],
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            metavar="OUTPUT",
            help="The .bpk to write. Default: the input's name with .bpk, beside it.",
        ),
    ] = None,
    scheme: Annotated[
        str | None,
        typer.Option(
            "--scheme",
            metavar="NAME",
            help=f"Preset replacing the default scheme ({DEFAULT_PRESET}): {', '.join(PRESETS)}.",
        ),
    ] = None,
    recipe: Annotated[
        Path | None, typer.Option("--recipe", metavar="FILE", help="TOML recipe: rules per tensor name.")
    ] = None,
    device: Annotated[
        Device,
        typer.Option(
            "--device", metavar="auto|cpu|cuda", help="auto is cuda when torch sees a GPU, else cpu."
        ),
    ] = Device.auto,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the plan and its totals; read no weight, write nothing.")
    ] = False,
    json_output: Annotated[
        bool,
        typer.Option("--json", help="Print one JSON document (docs/json-schema.json) instead of tables."),
    ] = False,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing output file.")] = False,
    verify: Annotated[
        bool,
        typer.Option(
            "--verify/--no-verify",
            help="Check each quantized tensor's decode against its scheme's error bound, and read the output"
            " back against the plan and the bytes written (on by default; its time is reported).",
        ),
    ] = True,
    max_shard_size: Annotated[
        str | None,
        typer.Option(
            "--max-shard-size",
            metavar="SIZE",
            help="Split the output into NAME-00001-of-0000N.bpk files of at most SIZE each (50GB, 500MiB);"
            " every tensor stays whole in one file.",
        ),
    ] = None,
    burn_backend: BurnBackendOption = None,
    burn_version: BurnVersionOption = None,
    stats: Annotated[
        bool,
        typer.Option(
            "--stats/--no-stats",
            help="Measure each quantized tensor's error against its source (from the same one decode,"
            " on the pipeline's device, that --verify checks).",
        ),
    ] = True,
) -> None:
    """Quantize a safetensors checkpoint into a Burn burnpack (.bpk) file.

    Every tensor gets one decision, a QFloat scheme or keep, from the recipe's rules or the default policy:
    floating tensors of rank >= 2 whose shape takes the scheme are quantized; everything else is kept
    in its source dtype. The whole plan is checked before any weight is read.
    """
    with _output.progress_bar(_output.progress_enabled(json_output)) as hook:
        report = api.quantize_file(
            input,
            output,
            scheme=scheme,
            recipe=recipe,
            device=device.value,
            dry_run=dry_run,
            force=force,
            stats=stats,
            progress=hook,
            verify=verify,
            max_shard_size=None if max_shard_size is None else api.parse_size(max_shard_size),
            burn_backend=None if burn_backend is None else burn_backend.value,
            burn_version=burn_version,
        )
    if json_output:
        _output.print_json(report.to_json())
        return
    for problem in report.warnings:
        _output.warn(f"{problem} (hint: {problem.hint})")
    render(report)


def render(report: QuantizeReport) -> None:
    """The plan (or the written tensors with their error) as a table, then totals and timings."""
    written = not report.dry_run
    table = Table(
        title="plan (dry run: nothing read or written)" if not written else None, title_justify="left"
    )
    for column, justify in (
        ("tensor", "left"),
        ("shape", "left"),
        ("dtype", "left"),
        ("decision", "left"),
        ("reason", "left"),
        ("in", "right"),
        ("out", "right"),
        ("bits/w", "right"),
    ):
        table.add_column(column, justify=justify, overflow="fold")
    if written:
        table.add_column("rel rms", justify="right")
        table.add_column("SQNR dB", justify="right")
    for t in report.tensors:
        shape = _output.shape_text(t.shape)
        if t.transposed:
            shape += f" → {_output.shape_text(t.out_shape)} (T)"
        cells = [
            printable(t.name),
            shape,
            t.dtype,
            "keep" if t.scheme is None else str(t.scheme),
            printable(t.reason),
            _output.human_bytes(t.bytes_in),
            _output.human_bytes(t.bytes_out),
            f"{t.bits_per_weight:.2f}",
        ]
        if written:
            err = t.error
            cells += [_output.number(err and err.rel_rms, ".2e"), _output.number(err and err.sqnr_db, ".1f")]
        table.add_row(*cells)
    out = _output.stdout()
    out.print(table)
    totals = report.totals
    out.print(
        f"{totals.tensors} tensors: {totals.quantized} quantized, {totals.kept} kept,"
        f" {totals.transposed} transposed" + (" (T: written as [in, out])" if totals.transposed else "")
    )
    out.print(
        f"{_output.human_bytes(totals.bytes_in)} → {_output.human_bytes(totals.bytes_out)}"
        f" ({totals.ratio:.2f}× smaller, {totals.bits_per_weight:.2f} bits/weight);"
        f" expected peak memory {_output.human_bytes(totals.peak_bytes)}"
    )
    if report.timings is None:
        out.print(f"would write {printable(', '.join(report.outputs))}")
        return
    timings = report.timings
    phases = []
    for name in ("read", "quantize", "stats", "write", "verify"):
        phase = getattr(timings, name)
        if phase is not None:
            rate = f", {phase.gb_per_s:.3g} GB/s" if phase.gb_per_s is not None else ""
            phases.append(f"{name} {phase.seconds:.2f} s{rate}")
    out.print("; ".join(phases) + f"; total {timings.total_seconds:.2f} s on {report.device}")
    out.print(f"wrote {printable(', '.join(report.outputs))}")
