"""`qcli quantize`: plan from the headers, then stream every tensor into a burnpack file."""

from __future__ import annotations

import re
from collections import Counter
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from qcli.calibrate.inputs import SAMPLES, SEED, SEQ_LEN
from qcli.cli import _output
from qcli.cli._burn import BurnBackendOption, BurnVersionOption
from qcli.cli._formats import CHECKPOINT_HELP, NamesOption, requantize_option
from qcli.commands import quantize as command
from qcli.commands.options import QuantizeOptions
from qcli.errors import QcliError, UsageError
from qcli.io.source import Names
from qcli.presets import DEFAULT_PRESET, PRESETS
from qcli.report.documents import JSON_SCHEMA_VERSION
from qcli.report.quantize import RUST, WRITTEN, BurnLoad, QuantizeReport, TensorRow
from qcli.text import printable

# The default output prints every tensor (in a narrow table) up to this many; above it, a summary: the
# WORST tensors by SQNR after a write, the count of each decision for a dry run. --verbose: every column.
FULL_TABLE_MAX = 32
WORST = 5


class Device(StrEnum):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


class CalibrationChoice(StrEnum):
    minmax = "minmax"
    absmean = "absmean"
    mse = "mse"
    gptq = "gptq"


def quantize(
    input: Annotated[
        Path,
        typer.Argument(
            help=f"The checkpoint: {CHECKPOINT_HELP} (never downloaded).",
            metavar="INPUT",
            show_default=False,
        ),
    ],
    output: Annotated[
        str | None,
        typer.Option(
            "--output",
            "-o",
            metavar="OUTPUT",
            help="The .bpk to write, or DIR/ (a trailing / or an existing folder): a model folder with"
            " model.bpk, the source's config and tokenizer files and qcli.json. Default: the input's name"
            " with .bpk, beside it; for ORG/NAME, the folder NAME/ here.",
            show_default=False,
        ),
    ] = None,
    revision: Annotated[
        str | None,
        typer.Option(
            "--revision",
            metavar="REV",
            help="For ORG/NAME: the branch, tag or commit in the Hugging Face cache. Default: main.",
        ),
    ] = None,
    scheme: Annotated[
        str | None,
        typer.Option(
            "--scheme",
            metavar="NAME",
            help=f"Preset replacing the default scheme ({DEFAULT_PRESET}, or with --burn-backend that"
            f" backend's best 4-bit form): {', '.join(PRESETS)}.",
        ),
    ] = None,
    target_bpw: Annotated[
        float | None,
        typer.Option(
            "--target-bpw",
            metavar="X",
            help="Instead of one preset, choose each tensor's among the presets of 2 to 8 bits that"
            " --burn-backend loads and computes with (without one: those the common backends load where the"
            " default preset does), losing least (the error each causes on its layer's inputs, weighed by"
            " --imatrix or --calibration-data where given) at X bits per quantized weight or under, scales"
            " included. Reads every weight, a --dry-run too; the token embedding and the output head stay at"
            " 8 bits, and tensors a recipe rule names are pinned.",
            show_default=False,
        ),
    ] = None,
    target_size: Annotated[
        str | None,
        typer.Option(
            "--target-size",
            metavar="SIZE",
            help="As --target-bpw, with the whole file's size as the budget (4GB, 500MiB), kept tensors"
            " included.",
            show_default=False,
        ),
    ] = None,
    write_recipe: Annotated[
        Path | None,
        typer.Option(
            "--write-recipe",
            metavar="FILE",
            help="Write the forms the target chose as a recipe (one rule per tensor) that --recipe FILE,"
            " with the run's other options, turns into the same bytes; --force replaces an existing FILE.",
            show_default=False,
        ),
    ] = None,
    # an Annotated built per command (its help); mypy takes no call for a type
    requantize: requantize_option(" --stats reports the error added to the dequantized weights.") = None,  # type: ignore[valid-type]
    names: NamesOption = Names.file,
    recipe: Annotated[
        Path | None, typer.Option("--recipe", metavar="FILE", help="TOML recipe: rules per tensor name.")
    ] = None,
    transpose: Annotated[
        bool,
        typer.Option(
            "--transpose",
            help="Write every Linear weight (a 2-D *.weight that is no embedding table) as [in, out], Burn's"
            " default LinearLayout::Row, as a recipe's transpose = true does; embeddings stay as they are."
            " A recipe rule that says transpose decides for its tensors.",
        ),
    ] = False,
    calibration: Annotated[
        CalibrationChoice | None,
        typer.Option(
            "--calibration",
            metavar="minmax|absmean|mse|gptq",
            case_sensitive=False,
            help="How each scale is chosen, for every quantized tensor whose recipe rule names none: minmax"
            " (the preset's: the largest value on the range's end), absmean, mse (a search for the scale"
            " whose decode errs least: better at 4 bits and below, slower; with --calibration-data or"
            " --imatrix, each input channel's error weighed by its activations), or gptq (each Linear's"
            " weights rounded in order on the activations of --calibration-data, the error carried onto"
            " those not yet rounded; docs/arithmetic.md).",
        ),
    ] = None,
    calibration_data: Annotated[
        Path | None,
        typer.Option(
            "--calibration-data",
            metavar="FILE",
            help="Text the model runs on for --calibration gptq or mse (with minmax or absmean: to measure"
            " their output error, `out err`): plain UTF-8, or JSON lines with a \"text\" field; tokenized with"
            " the checkpoint's own tokenizer, the model built from its config.json (needs qcli[calibrate]).",
        ),
    ] = None,
    samples: Annotated[
        int | None,
        typer.Option("--samples", metavar="N", help=f"Windows of calibration tokens. Default: {SAMPLES}."),
    ] = None,
    seq_len: Annotated[
        int | None,
        typer.Option("--seq-len", metavar="L", help=f"Tokens in each window. Default: {SEQ_LEN}."),
    ] = None,
    seed: Annotated[
        int | None,
        typer.Option("--seed", metavar="S", help=f"Seed placing the windows in the text. Default: {SEED}."),
    ] = None,
    imatrix: Annotated[
        Path | None,
        typer.Option(
            "--imatrix",
            metavar="FILE",
            help="A llama.cpp importance matrix (imatrix.gguf, or the older .dat) weighing --calibration"
            " mse's search, in place of --calibration-data; `qcli imatrix` writes one.",
        ),
    ] = None,
    device: Annotated[
        Device,
        typer.Option(
            "--device", metavar="auto|cpu|cuda", help="auto is cuda when torch sees a GPU, else cpu."
        ),
    ] = Device.auto,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Print the plan and its totals; read no weight, write nothing (with"
                     " --target-bpw or --target-size: the weights are read to choose, and --write-recipe"
                     " is written)."),
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
            help="Measure each quantized tensor's error against its source (from the same one measuring,"
            " on the pipeline's device, that --verify checks).",
        ),
    ] = True,
    quiet: Annotated[
        bool,
        typer.Option("--quiet", "-q", help="Print only the final `wrote ...` line (warnings, errors on stderr)."),
    ] = False,
    verbose: Annotated[
        bool,
        typer.Option(
            "--verbose",
            "-v",
            help=f"Print the full per-tensor table. Default: totals, and every tensor up to {FULL_TABLE_MAX}; above"
            f" that the {WORST} with the lowest SQNR, or the highest output error where calibration text measured"
            " it (a dry run: the count of each decision).",
        ),
    ] = False,
) -> None:
    """Quantize a checkpoint into a Burn burnpack (.bpk) file.

    Every tensor gets one decision, a QFloat scheme or keep, from the recipe's rules or the default policy:
    floating tensors of rank >= 2 whose shape takes the scheme are quantized; everything else is kept
    in its source dtype. The whole plan is checked before any weight is read.
    """
    try:
        if quiet and verbose:
            raise UsageError("--quiet and --verbose cannot be used together", hint="pass one of them")
        shown = _output.progress_enabled(quiet=quiet, json=json_output)
        report = _run(input, output, shown, scheme=scheme, recipe=recipe, calibration=calibration, device=device,
                      dry_run=dry_run, force=force, verify=verify, max_shard_size=max_shard_size,
                      burn_backend=burn_backend, burn_version=burn_version, stats=stats, requantize=requantize,
                      names=names, revision=revision, calibration_data=calibration_data, samples=samples,
                      seq_len=seq_len, seed=seed, imatrix=imatrix, transpose=transpose, target_bpw=target_bpw,
                      target_size=target_size, write_recipe=write_recipe)
    except QcliError as exc:
        if json_output:
            _output.print_json(error_json(exc))
        raise
    if json_output:
        _output.print_json(report.to_json())
        return
    for problem in report.warnings:
        _output.warn(f"{problem} (hint: {problem.hint})")
    render(report, "quiet" if quiet else "verbose" if verbose else "default")


def error_json(exc: QcliError) -> dict:
    """The --json document of a failed run (docs/json-schema.json, `quantize_error`)."""
    return {
        "command": "quantize",
        "schema_version": JSON_SCHEMA_VERSION,
        "error": {"message": printable(exc.message), "hint": printable(exc.hint) if exc.hint else None,
                  "exit_code": exc.exit_code},
    }


def _run(input, output, shown: bool, **given) -> QuantizeReport:
    options = QuantizeOptions.parse(**given)  # every value checked before anything is read
    with _output.run_progress(shown) as progress:
        report = command.quantize(input, output, options, progress.tensors if progress is not None else None,
                                  progress.blocks if progress is not None else None)
    dry_run = options.dry_run
    target = Path(report.output)
    if target.name.lower().endswith(".safetensors"):  # after the plan: refusals come first
        _output.warn(f"{target} ends in .safetensors, but {'this writes' if not dry_run else 'the run would write'}"
                     " a burnpack (.bpk) under that name, which safetensors readers cannot open"
                     " (hint: give -o a name ending in .bpk)")
    return report


def natural_key(name: str) -> list:
    """`layers.2` before `layers.10`: digit runs compare as numbers."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", name) if part]


def short_decision(text: str) -> str:
    """`Q4S PackedU32(0) block [32] F16` as `Q4S [32] F16` for the narrow table (--verbose: in full)."""
    return re.sub(r"\s+", " ", re.sub(r"PackedU32\(0\)|\bblock\b", "", text)).strip()


def worst(rows: list[TensorRow]) -> tuple[list[TensorRow], str]:
    """The WORST tensors in natural order and the title that says which: by the output error on the
    calibration tokens where the run measured it (GPTQ lowers SQNR on purpose, to lower that error), else
    by SQNR."""
    ordered = sorted(rows, key=lambda t: natural_key(t.name))
    calibrated = [(t, t.output_error) for t in ordered if t.output_error is not None]
    if calibrated:
        chosen = [t for t, _ in sorted(calibrated, key=lambda pair: -pair[1])[:WORST]]
        what = f"the highest output error (out err) of the {len(calibrated)} measured"
    else:
        measured = [(t, t.error.sqnr_db) for t in ordered if t.error is not None and t.error.sqnr_db is not None]
        chosen, what = [t for t, _ in sorted(measured, key=lambda pair: pair[1])[:WORST]], "the lowest SQNR"
    return (sorted(chosen, key=lambda t: natural_key(t.name)),
            f"the {len(chosen)} tensors with {what} (--verbose: all {len(rows)})")


def render(report: QuantizeReport, mode: str = "default") -> None:
    """The plan (or the written tensors with their error) as a table, then totals and timings.

    `quiet`: only the last line. `verbose`: every tensor, every column. `default`: narrow enough for 80
    columns; every tensor up to FULL_TABLE_MAX, else the WORST by SQNR (a dry run: counts per decision).
    """
    written = not report.dry_run
    out = _output.stdout()
    if mode == "quiet":
        out.print(f"{'wrote' if written else 'would write'} {printable(', '.join(report.outputs))}", soft_wrap=True)
        return
    rows = report.tensors
    title = "plan (dry run: nothing read or written)" if not written else None
    wide = mode == "verbose"
    if wide or len(rows) <= FULL_TABLE_MAX:
        rows = sorted(rows, key=lambda t: natural_key(t.name))
    else:
        if written:
            rows, title = worst(rows)
        else:
            rows, title = [], None
            out.print("plan (dry run: nothing read or written); --verbose prints every tensor")
            counts: Counter[str] = Counter()
            for scheme, n in Counter(t.scheme for t in report.tensors).items():  # each scheme's text made once
                counts["keep" if scheme is None else str(scheme)] += n
            for decision, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
                out.print(f"  {n:>6} × {decision}", soft_wrap=True)
    if rows or title:
        _table(out, rows, title, written, wide)
    totals = report.totals
    size = _output.human_bytes

    def say(text: str) -> None:  # wrapped at its spaces to the width, never inside a glued figure
        out.print(_output.fill(text, out.width), soft_wrap=True)

    say(f"{totals.tensors} tensors: {totals.quantized} quantized, {totals.kept} kept,"
        f" {totals.transposed} transposed" + (" (T: written as [in, out])" if totals.transposed else ""))
    say(f"{_output.glued(size(totals.bytes_in))} → {_output.glued(size(totals.bytes_out))}"
        f" ({size_change(totals.bytes_in, totals.bytes_out)},"
        f" {_output.glued(f'{totals.bits_per_weight:.2f} bits/weight')} over all tensors)")
    say(f"the tensors need {_output.glued(size(totals.peak_bytes))} of memory at most")
    if report.calibration is not None:
        say(calibration_line(report))
    if report.target is not None:
        for line in target_lines(report):
            say(line)
    if report.timings is None:
        say(f"would write {printable(', '.join(report.outputs))}")
        out.print("\n".join(load_lines(report.load, out.width)))
        return
    timings = report.timings
    phases = []
    for name in ("calibrate", "read", "quantize", "stats", "write", "verify"):
        phase = getattr(timings, name)
        if phase is not None:
            rate = f", {phase.gb_per_s:.3g} GB/s" if phase.gb_per_s is not None else ""
            phases.append(_output.glued(f"{name} {phase.seconds:.2f} s{rate}"))
    say("; ".join(phases) + f"; {_output.glued(f'total {timings.total_seconds:.2f} s')} on {report.device}")
    memory = report.memory
    assert memory is not None, "a run that wrote measured its memory"
    say(f"peak memory {_output.glued(size(memory.peak_bytes))}: the tensors"
        f" {_output.glued(size(memory.tensors_bytes))} beside the runtime's"
        f" {_output.glued(size(memory.runtime_bytes))}")
    say(f"wrote {printable(', '.join(report.outputs))}")
    out.print("\n".join(load_lines(report.load, out.width)))


WEIGHED = {"weights": "plain squared weight error", "imatrix": "weighed by the importance matrix",
           "calibration-data": "weighed by the calibration text's activations"}


def target_lines(report: QuantizeReport) -> list[str]:
    """What --target-bpw or --target-size chose: the bits achieved, each group's presets, the recipe."""
    target = report.target
    assert target is not None, "asked of a run with a target"
    if target.bits_per_weight is not None:
        asked = f"--target-bpw {target.bits_per_weight:g}"
    else:
        assert target.size is not None, "a target asks for bits per weight or a size"
        asked = f"--target-size {_output.human_bytes(target.size)}"
    lines = [f"{asked}: {target.achieved_bits_per_weight:.3f} bits per quantized weight"
             + (f", the file at most {_output.human_bytes(target.file_bytes_bound)}"
                if target.file_bytes_bound is not None else "")
             + f"; chosen among {', '.join(target.forms)} ({WEIGHED.get(target.sensitivity, target.sensitivity)})"]
    for group, presets in target.groups:
        lines.append(f"  {group}: " + ", ".join(f"{n} × {preset}" for preset, n in presets.items()))
    if target.recipe is not None:
        lines.append(f"{'wrote' if not report.dry_run else 'the dry run wrote'} the recipe {printable(target.recipe)}")
    return lines


def size_change(before: int, after: int) -> str:
    """The output's size against the input's, in percent: `69 % smaller`, `12 % larger`."""
    if before == 0 or after == before:
        return "the same size"
    change = round(abs(after - before) / before * 100)
    return f"{change or '<1'} % {'smaller' if after < before else 'larger'}"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def load_lines(load: BurnLoad, width: int) -> list[str]:
    """How to load the file in Burn, in lines of at most `width` columns (80 at most): the LinearLayout
    each group of Linear weights needs (a group's first name where there are several), the backends that
    compute it as written and how many tensors each other one cannot use, and where the Rust is."""
    width = min(width, _output.DEFAULT_WIDTH)
    lines = [f"load it in Burn {load.burn_version} (BurnpackStore, Module::load_from):"]
    groups = [(f"LinearLayout::{layout}", f"{_count(len(names), 'Linear weight')} {WRITTEN[layout]}",
               names) for layout, names in load.layouts.items() if names]
    if load.unsure:
        groups.append(("Row if GPT-2's Conv1D, else Col", _count(len(load.unsure), "weight"), load.unsure))
    for layout, what, names in groups:
        line = f"  {layout}: {what}"
        if len(groups) > 1:  # which weights each group is
            more = ", …" if len(names) > 1 else ""
            room = max(width - len(line) - len(" ()") - len(more), _output.MIN_NAME)
            line += f" ({_output.fit_names([printable(names[0])], room)[0]}{more})"
        lines.append(line)
    lines.append(f"  computes as written on {', '.join(load.computes_on) or 'no backend'}")
    cannot = [f"{backend} ({_count(len(names), 'tensor')})" for backend, names in load.cannot.items() if names]
    if cannot:  # why: the plan's warnings, or --burn-backend's errors
        lines.append(f"  not on {', '.join(cannot)}")
    lines.append(f"  the Rust: {', '.join(RUST)}")
    return lines


def calibration_line(report: QuantizeReport) -> str:
    """What the calibration ran on (a dry run: what it will run on, and its memory estimate)."""
    record, glued = report.calibration, _output.glued
    assert record is not None, "asked of a calibrated run"
    if record.samples is None:
        return f"calibration: {record.method}, weighed by the importance matrix {printable(record.file)}"
    windows = f"{glued(f'{record.samples} × {record.seq_len} tokens')} of {printable(record.file)}"
    estimate = glued(_output.human_bytes(record.memory_estimate_bytes or 0))
    if report.dry_run:
        what = f"{record.method}'s output error measured" if record.measures_only else record.method
        return (f"calibration: {what} on {windows} ({glued(f'seed {record.seed}')}); one block and the"
                f" activations take about {estimate} on the device")
    head = f"measured: {record.method}'s output error" if record.measures_only else f"calibrated: {record.method}"
    return (f"{head} on {windows} ({record.tokens:,} in the text),"
            f" {glued(f'{record.blocks} blocks')}; peak {glued(_output.human_bytes(record.peak_device_bytes or 0))}"
            f" (estimated {estimate})")


def _table(out, rows, title: str | None, written: bool, wide: bool) -> None:
    """The tensors' table under its title; by default each reason is a number, the reasons listed beneath
    (a few texts shared by many rows), so that every row stays on one line of 80 columns."""
    if title:
        out.print(title, soft_wrap=True)
    columns = [("tensor", "left"), ("shape", "left")]
    columns += [("dtype", "left")] if wide else []
    reason = wide or not written  # after a write the default shows the error instead
    columns += [("decision", "left")] + ([("reason" if wide else "why", "left" if wide else "right")] if reason else [])
    columns += [("in", "right"), ("out", "right")] if wide else []
    columns += [("bits/w", "right")]
    calibrated = written and any(t.output_error is not None for t in rows)
    if written:
        columns += [("rel rms", "right")] if wide else []
        columns += [("SQNR dB", "right")]
        columns += [("out err", "right")] if calibrated else []
    reasons = _output.Footnotes("why")
    cells = []
    for t in rows:
        shape = _output.shape_text(t.shape)
        if t.transposed:  # the source's shape; --verbose shows the one written too
            shape += f" → {_output.shape_text(t.out_shape)} (T)" if wide else " (T)"
        row = [printable(t.name), shape]
        row += [t.dtype] if wide else []
        decision = "keep" if t.scheme is None else str(t.scheme)
        row += [decision if wide else short_decision(decision)]
        row += [printable(t.reason) if wide else reasons.key(printable(t.reason))] if reason else []
        row += [_output.human_bytes(t.bytes_in), _output.human_bytes(t.bytes_out)] if wide else []
        row += [f"{t.bits_per_weight:.2f}"]
        if written:
            err = t.error
            row += [_output.number(err and err.rel_rms, ".2e")] if wide else []
            row += [_output.number(err and err.sqnr_db, ".1f")]
            row += [_output.number(t.output_error, ".2e")] if calibrated else []
        cells.append(row)
    # at a narrow width the shape goes first, then what the scheme says again (bits/w), then the scheme
    droppable = ["shape", "bits/w"] + (["decision"] if written else [])
    table = _output.tensor_table(columns, cells, None if wide else out.width, droppable)
    (_output.wide(columns, cells) if wide else out).print(table)
    if table.note("--verbose"):
        out.print(table.note("--verbose"), soft_wrap=True)
    if reasons.texts:
        out.print(reasons.table("reason"))
