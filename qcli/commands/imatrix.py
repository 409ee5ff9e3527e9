"""`imatrix_file`: run a checkpoint on calibration text and write its Linears' importance matrix.

The file has llama.cpp's GGUF layout and names, so `llama-quantize --imatrix` and `qcli quantize --imatrix`
both read it."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from qcli.calibrate.checkpoint import Checkpoint
from qcli.calibrate.inputs import CalibrationInput
from qcli.errors import UsageError
from qcli.io.readers import locate, open_source
from qcli.io.reads import Reads, refuse_special
from qcli.output.folder import read_beside
from qcli.pipeline.device import require_device
from qcli.text import printable

TARGET_HINT = "give -o another path for the importance matrix"


@dataclass(frozen=True)
class ImatrixReport:
    """What `imatrix_file` wrote: `output`, the tensors it holds (llama.cpp's names), the windows of the
    calibration text they were measured on, and the time it took."""

    input: str
    output: str
    tensors: list[str]
    samples: int
    seq_len: int
    tokens: int
    seconds: float
    device: str


def default_output(input: Path, model: str | None = None) -> Path:
    """`x.safetensors` or a folder `x` -> `x.imatrix.gguf` beside it; a model `ORG/NAME` in the Hugging Face
    cache -> `NAME.imatrix.gguf` here (never inside the cache)."""
    if model is not None:
        return Path(f"{model.split('/')[1]}.imatrix.gguf")
    base = input.resolve()
    return base.parent / f"{base.name if base.is_dir() else base.stem}.imatrix.gguf"


def imatrix_file(input: str | Path, output: str | Path | None = None, *, calibration_data: str | Path,
                 samples: int | None = None, seq_len: int | None = None, seed: int | None = None,
                 device: str = "auto", force: bool = False, progress=None) -> ImatrixReport:
    """Run the model of `input` block by block on `calibration_data` and write its importance matrix to `output`.

    For every Linear in the repeated blocks, the matrix holds each input channel's sum of squares over the tokens,
    and their count (`qcli.io.imatrix`). The model is built from the input folder's config.json and tokenizer.
    `output` defaults to `default_output(input)`. The file is renamed into place only once complete, and only if
    no file the run read changed meanwhile; a file the run reads, or a special file, is never `output`
    (`qcli.io.reads`). `input` may be a model `ORG/NAME` in the local Hugging Face cache (`qcli.io.readers.locate`)."""
    from qcli.calibrate.inputs import SAMPLES, SEED, SEQ_LEN

    data = Path(calibration_data)
    given = CalibrationInput(data, SAMPLES if samples is None else samples,
                             SEQ_LEN if seq_len is None else seq_len, SEED if seed is None else seed)
    given.check_windows()
    given.check_files()  # before the slow imports
    device = require_device(device)
    named = str(input)
    input, model = locate(input)
    target = Path(output) if output is not None else default_output(input, model)
    refuse_special(target, TARGET_HINT)
    if target.exists() and not force:
        raise UsageError(printable(f"{target} already exists"),
                         hint="pass --force to replace it, or -o to write somewhere else")
    started = time.perf_counter()
    with open_source(input) as source:
        checkpoint = Checkpoint.beside(input, source)
        reads = Reads()
        reads.add_source(source)
        reads.extend(read_beside(checkpoint.folder), "a file beside the input that the run reads")
        reads.add(data, "the calibration text")
        reads.refuse_target(target, TARGET_HINT)
        from qcli.calibrate.importance import measure_importance

        measured = measure_importance(checkpoint, given, device, progress)
    from qcli.io.imatrix import write_imatrix

    write_imatrix(measured.imatrix, target, before_commit=reads.unchanged)
    return ImatrixReport(named, str(target), sorted(measured.imatrix.entries), measured.samples,
                         measured.seq_len, measured.tokens, time.perf_counter() - started, measured.device)

