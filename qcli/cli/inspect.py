"""`qcli inspect`: what a checkpoint (safetensors or GGUF) or a burnpack file holds."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from qcli.cli import _output
from qcli.cli._formats import CHECKPOINT_HELP, FORMATS_READ, NamesOption
from qcli.cli.quantize import short_decision
from qcli.commands import inspect as command
from qcli.errors import CheckFailed
from qcli.io.source import Names
from qcli.problem import Severity
from qcli.report.inspect import InspectReport, SourcePlan
from qcli.text import printable


def inspect(
    file: Annotated[
        Path,
        typer.Argument(
            help=f"A .bpk, or a checkpoint: {CHECKPOINT_HELP}.", metavar="FILE", show_default=False
        ),
    ],
    json_output: Annotated[
        bool, typer.Option("--json", help="Print one JSON document instead of tables.")
    ] = False,
    tensor: Annotated[
        str | None,
        typer.Option(
            "--tensor", metavar="NAME", help="Add statistics of this tensor's decoded values and scales."
        ),
    ] = None,
    compare: Annotated[
        Path | None,
        typer.Option(
            "--compare",
            metavar="SOURCE",
            help=f"Check a .bpk against its source (a {FORMATS_READ} checkpoint, or ORG/NAME): kept tensors byte for"
            " byte, quantized ones block by block against their scheme's error bound; exit 1 on any mismatch.",
        ),
    ] = None,
    names: NamesOption = Names.file,
) -> None:
    """List tensors (name, dtype, shape, bytes) and totals; for a .bpk also its version and metadata.

    For a checkpoint also what quantize does with each tensor and why (the default plan, as
    --dry-run makes it from the headers: FP8 weights transcoded, their scales consumed), a line per format
    found, and the plan's problems.
    """
    report = command.inspect_file(file, tensor=tensor, compare=compare, names=names)
    if json_output:
        _output.print_json(report.to_json())
    else:
        render(report)
    if report.compare is not None and not report.compare.ok:
        raise CheckFailed()


def render(report: InspectReport) -> None:
    out = _output.stdout()
    files = ", ".join(f"{printable(f.name)} ({_output.human_bytes(f.bytes)})" for f in report.files)
    version = f", burnpack version {report.version}" if report.version is not None else ""
    out.print(f"{printable(report.path)}: {report.format}{version}; files: {files}")
    if report.metadata:
        meta = Table("metadata key", "value", title="metadata", title_justify="left")
        for key, value in report.metadata.items():
            meta.add_row(printable(key), printable(value))
        out.print(meta)
    plan = report.plan
    out.print("tensors" if plan is None else f"tensors, and what `qcli quantize` does with them (preset {plan.preset})",
              soft_wrap=True)
    # A burnpack's QFloat tensors' own bits per weight: a checkpoint's tensors have none (dtype says it).
    qfloat = any(report.bits_per_weight(t) is not None for t in report.tensors)
    columns = [("tensor", "left"), ("dtype", "left"), ("shape", "left"), ("bytes", "right")]
    columns += [("bits/w", "right")] if qfloat else []
    columns += [("decision", "left"), ("why", "right")] if plan is not None else []
    reasons, rows = _output.Footnotes("why"), []
    for t in report.tensors:
        dtype = re.sub(r"^QFloat\((.*)\)$", r"\1", short_decision(t.dtype))  # the scheme names itself
        row = [printable(t.name), dtype, _output.shape_text(t.shape), _output.human_bytes(t.nbytes)]
        row += [_output.number(report.bits_per_weight(t), ".2f")] if qfloat else []
        if plan is not None:
            planned = plan.tensors[t.name]
            decision = ("refused" if planned.refused else planned.decision if planned.scheme is None
                        else short_decision(str(planned.scheme)))
            row += [decision, reasons.key(printable(planned.reason))]
        rows.append(row)
    out.print(_output.tensor_table(columns, rows, out.width))
    if reasons.texts:
        out.print(reasons.table("reason"))
    totals = report.totals()
    bits = totals["bits_per_weight"]
    quantized = "" if bits is None else f"; quantized tensors at {bits:.2f} bits/weight"
    out.print(f"{totals['tensors']} tensors, {totals['params']:,} values, {_output.human_bytes(totals['bytes'])}"
              f"{quantized}")
    if plan is not None:
        _render_plan(plan, out)
    if report.tensor_stats is not None:
        s = report.tensor_stats
        stats = Table(
            "of", "min", "max", "mean", "std", "rms", title=f"statistics of {printable(s.name)}", title_justify="left"
        )
        for label, v in (("values", s.values), ("scales", s.scales)):
            if v is not None:
                stats.add_row(label, *(_output.number(x, ".6g") for x in (v.min, v.max, v.mean, v.std, v.rms)))
        out.print(stats)
        for label, v in (("values", s.values), ("scales", s.scales)):
            if v is not None and v.non_finite:
                out.print(f"{label} not finite (left out of the statistics): {v.nan} NaN, {v.inf} +Inf, "
                          f"{v.neg_inf} -Inf")
        if s.global_scale is not None:
            out.print(f"global scale: {s.global_scale:.9g}")
    if report.compare is not None:
        _render_compare(report, out)


def _render_plan(plan: SourcePlan, out: Console) -> None:
    """The formats found, and the problems that would stop (or deserve a look before) `qcli quantize`: its
    words, whose hints name its options, under a line that says so."""
    out.print(f"declaration: {printable(plan.declaration)}", soft_wrap=True)
    for summary in plan.formats():
        out.print(printable(summary.text), soft_wrap=True)
    if plan.problems:
        out.print("`qcli quantize` says of this plan (its options in the hints):", soft_wrap=True)
    for p in plan.problems:
        out.print(f"  {p.severity}: {printable(str(p))} (hint: {printable(p.hint)})")  # prose: wrapped at spaces
    errors = sum(p.severity is Severity.error for p in plan.problems)
    if errors:
        out.print(f"quantize stops on {errors} problem{'s' if errors > 1 else ''} before reading a weight",
                  soft_wrap=True)


def _render_compare(report: InspectReport, out: Console) -> None:
    """Each tensor against its source: SQNR and max |error| over the tensor, and each block's max |error| over
    its bound (e/b), the mean over the blocks and the worst: ≤ 1 passes, and rounding to nearest reaches 1
    wherever a value lies half a step off the grid, so the mean is what tells tensors apart."""
    c = report.compare
    assert c is not None
    out.print(f"compared with {printable(c.source)}", soft_wrap=True)
    columns = [("tensor", "left"), ("SQNR dB", "right"), ("max abs", "right"), ("e/b mean", "right"),
               ("e/b max", "right"), ("status", "left")]
    problems, rows = _output.Footnotes("problem"), []
    for r in c.rows:
        err = r.error
        status = ("exact" if r.exact else "ok") + (" (T)" if r.transposed else "")
        ratio = None if not r.bound or r.block_error is None else r.block_error / r.bound
        rows.append([printable(r.name), _output.number(None if err is None else err.sqnr_db, ".1f"),
                     _output.number(None if err is None else err.max_abs, ".3g"),
                     _output.number(r.mean_block_ratio, ".2f"), _output.number(ratio, ".3f"),
                     f"problem {problems.key(printable(f'{r.name}: {r.problem}'))}" if r.problem else status])
    out.print(_output.tensor_table(columns, rows, out.width))
    if problems.texts:
        out.print(problems.table("what"))
    for label, names in (("missing from the .bpk", c.missing), ("not in the source", c.extra)):
        if names:
            out.print(f"{len(names)} tensor(s) {label}: {printable(', '.join(names))}")
    out.print("all tensors match" if c.ok else "the .bpk does not match its source")
