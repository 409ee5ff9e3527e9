"""`qcli eval`: a quantized model's next-token predictions against its source's, on a text."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from qcli.calibrate.inputs import SAMPLES, SEQ_LEN
from qcli.cli import _output
from qcli.cli._formats import CHECKPOINT_HELP
from qcli.commands import evaluate as command
from qcli.errors import UsageError
from qcli.io.source import Names
from qcli.report.evaluate import EvalReport
from qcli.text import printable


def evaluate(
    quantized: Annotated[
        Path,
        typer.Argument(help="The .bpk file (or the index of its shards) qcli quantize wrote, or the model folder"
                       " it wrote (-o DIR/: model.bpk, config.json, tokenizer files).",
                       metavar="QUANTIZED", show_default=False),
    ],
    against: Annotated[
        Path,
        typer.Option("--against", metavar="SOURCE", show_default=False,
                     help=f"The checkpoint QUANTIZED was written from: {CHECKPOINT_HELP}."),
    ],
    text: Annotated[
        Path,
        typer.Option("--text", metavar="FILE", show_default=False,
                     help="Text both models predict: plain UTF-8, or JSON lines with a \"text\" field; tokenized"
                     " with the model's own tokenizer into windows laid end to end from its start."),
    ],
    samples: Annotated[
        int | None, typer.Option("--samples", metavar="N", help=f"Windows of tokens at most. Default: {SAMPLES}.")
    ] = None,
    seq_len: Annotated[
        int | None, typer.Option("--seq-len", metavar="L", help=f"Tokens in each window. Default: {SEQ_LEN}.")
    ] = None,
    names: Annotated[
        Names | None,
        typer.Option("--names", metavar="file|hf", case_sensitive=False, show_default=False,
                     help="A GGUF source's tensor names: as in the file (llama.cpp's), or hf: Hugging Face's, as"
                     " quantize --names hf wrote them. Default: what a model folder's qcli.json records, else"
                     " file."),
    ] = None,
    per_tensor: Annotated[
        int | None,
        typer.Option("--per-tensor", metavar="N", show_default=False,
                     help="Also score each tensor whose decoded values differ from SOURCE's with it alone quantized"
                     " (exact: one more forward pass a window each) and list the N of largest KL; --json lists"
                     " all."),
    ] = None,
    device: Annotated[
        str, typer.Option("--device", metavar="auto|cpu|cuda", help="auto is cuda when torch sees a GPU, else cpu.")
    ] = "auto",
    json_output: Annotated[
        bool, typer.Option("--json", help="Print one JSON document (docs/json-schema.json) instead of lines.")
    ] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print only the scores' line.")] = False,
) -> None:
    """Score a quantized model against its source: next-token KL, top-1 agreement and perplexity on a text.

    Both run in the architecture transformers builds from config.json (QUANTIZED's folder's, else SOURCE's,
    else made from a GGUF SOURCE's metadata), in f32, window by window: once with SOURCE's weights, once with
    QUANTIZED's (QFloat tensors decoded, the others as stored, those written [in, out] turned back). Every
    tensor is paired with SOURCE's of its name first: one either side lacks, or a shape that disagrees, is
    refused. Needs qcli[calibrate].
    """
    if per_tensor is not None and per_tensor < 1:
        raise UsageError(f"--per-tensor {per_tensor} lists no tensor", hint="pass --per-tensor 10 for the ten worst")
    with _output.run_progress(_output.progress_enabled(quiet=quiet, json=json_output)) as progress:
        report = command.evaluate_file(quantized, against=against, text=text, samples=samples, seq_len=seq_len,
                                       names=None if names is None else names.value, device=device,
                                       per_tensor=per_tensor is not None,
                                       progress=progress and progress.windows)
    if report.shortfall is not None and not json_output:
        _output.warn(report.shortfall)
    if json_output:
        _output.print_json(report.to_json())
    else:
        render(report, quiet, per_tensor)


def scores_line(report: EvalReport) -> str:
    scores = report.scores
    return (f"KL {scores.kl:.5f} nats a token (max {scores.kl_max:.4f}), top-1 {100 * scores.same_top1:.2f} %, "
            f"perplexity {scores.source_perplexity:.4g} → {scores.perplexity:.4g}")


def render(report: EvalReport, quiet: bool, per_tensor: int | None) -> None:
    out = _output.stdout()
    if not quiet:
        out.print(f"{printable(report.quantized_path)} against {printable(report.source_path)}: "
                  f"{report.quantized} tensors decoded, {report.kept} kept, {report.transposed} turned back from "
                  f"[in, out]; model of {printable(report.config)}", soft_wrap=True)
        out.print(f"on {report.scores.windows} windows × {report.seq_len} tokens of {printable(report.text)} "
                  f"({report.scores.tokens:,} predictions), {report.device}, {report.seconds:.1f} s", soft_wrap=True)
    out.print(scores_line(report), soft_wrap=True)
    if per_tensor is not None and not quiet:
        render_worst(out, report, per_tensor)


def render_worst(out, report: EvalReport, count: int) -> None:
    """The `count` tensors of largest KL quantized alone, and how their sum compares with the whole's."""
    worst = report.worst
    shown = worst[:count]
    total = sum(own.kl for _, own in worst)
    out.print(f"each tensor quantized alone, every other at the source's values (exact, {len(worst)} tensors): "
              f"the {len(shown)} of largest KL", soft_wrap=True)
    if not shown:
        return
    columns = [("tensor", "left"), ("KL", "right"), ("share", "right"), ("top-1", "right"),
               ("perplexity", "right")]
    rows = [[printable(name), f"{own.kl:.5f}", f"{100 * own.kl / total:.1f} %" if total > 0 else "-",
             f"{100 * own.same_top1:.2f} %", f"{own.perplexity:.4g}"] for name, own in shown]
    out.print(_output.tensor_table(columns, rows, out.width))
    out.print(f"sum over the {len(worst)} tensors {total:.5f}, the whole model {report.scores.kl:.5f}: errors of "
              "several tensors compound or cancel, so the parts need not add up to the whole", soft_wrap=True)
