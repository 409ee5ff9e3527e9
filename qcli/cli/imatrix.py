"""`qcli imatrix`: run a checkpoint on calibration text; write llama.cpp's importance matrix of its Linears."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from qcli.calibrate.inputs import SAMPLES, SEED, SEQ_LEN
from qcli.cli import _output
from qcli.commands import imatrix as command
from qcli.text import printable


def imatrix(
    input: Annotated[
        Path,
        typer.Argument(help="A safetensors checkpoint (file, folder or index) beside its config.json and tokenizer,"
                       " or ORG/NAME: a model in the local Hugging Face cache.",
                       metavar="INPUT", show_default=False),
    ],
    calibration_data: Annotated[
        Path,
        typer.Option("--calibration-data", metavar="FILE", show_default=False,
                     help="Text the model runs on: plain UTF-8, or JSON lines with a \"text\" field."),
    ],
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", metavar="OUTPUT", show_default=False,
                     help="The imatrix.gguf to write. Default: the input's name with .imatrix.gguf, beside it;"
                     " for ORG/NAME, NAME.imatrix.gguf here."),
    ] = None,
    samples: Annotated[
        int | None, typer.Option("--samples", metavar="N", help=f"Windows of tokens. Default: {SAMPLES}.")
    ] = None,
    seq_len: Annotated[
        int | None, typer.Option("--seq-len", metavar="L", help=f"Tokens in each window. Default: {SEQ_LEN}.")
    ] = None,
    seed: Annotated[
        int | None, typer.Option("--seed", metavar="S", help=f"Seed placing the windows. Default: {SEED}.")
    ] = None,
    device: Annotated[
        str, typer.Option("--device", metavar="auto|cpu|cuda", help="auto is cuda when torch sees a GPU, else cpu.")
    ] = "auto",
    force: Annotated[bool, typer.Option("--force", help="Replace an existing output file.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress; print only the file written.")] = False,
) -> None:
    """Write the importance matrix of a checkpoint's Linears, in llama.cpp's GGUF layout and names.

    Each Linear in the model's repeated blocks gets the sum of squares of each input channel over the
    calibration tokens and their count (llama.cpp's in_sum2 and counts); `llama-quantize --imatrix` and
    `qcli quantize --calibration mse --imatrix` read it. Needs qcli[calibrate].
    """
    with _output.run_progress(_output.progress_enabled(quiet=quiet)) as progress:
        report = command.imatrix_file(input, output, calibration_data=calibration_data, samples=samples,
                                      seq_len=seq_len, seed=seed, device=device, force=force,
                                      progress=progress and progress.blocks)
    if not quiet:
        _output.stdout().print(f"{len(report.tensors)} tensors measured on {report.samples} × {report.seq_len} "
                               f"tokens on {report.device} in {report.seconds:.1f} s", soft_wrap=True)
    _output.stdout().print(f"wrote {printable(report.output)}", soft_wrap=True)
