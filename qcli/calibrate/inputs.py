"""What a calibration run measures activations on (`CalibrationInput`) and its defaults, which `--help` states;
importing nothing heavy, for the command line."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from qcli.errors import UsageError
from qcli.io.files import named_file
from qcli.scheme import Calibration
from qcli.text import shown

SAMPLES = 128  # windows of calibration tokens
SEQ_LEN = 512  # tokens a window
SEED = 0  # of the generator that places the windows
TEXT_HINT = 'pass a UTF-8 text file, or JSON lines each with a "text" field'

# Tokens a calibration holds at most (windows × their length, or either alone): its activations are cached
# for every window, hidden size × 8 bytes a token, so this many is past any device already.
MAX_WINDOW_TOKENS = 1 << 24


@dataclass(frozen=True)
class CalibrationInput:
    """What a calibrated run measures activations on: `data`, a text file (plain, or JSON lines with a
    `text` field) cut into `samples` windows of `seq_len` tokens placed by `seed`; or `imatrix`, a
    llama.cpp importance matrix file (which the mse search alone can use)."""

    data: Path | None = None
    samples: int = SAMPLES
    seq_len: int = SEQ_LEN
    seed: int = SEED
    imatrix: Path | None = None

    def check(self, calibration: Calibration | None) -> None:
        """UsageError for a combination that cannot work: GPTQ without text, or with only an importance
        matrix (it needs each layer's whole XᵀX); an importance matrix for a calibration that does not
        search; both files at once; a file that is not there (`check_files`). Text with a calibration that
        does not use it (MinMax, AbsMean) measures their output error."""
        if self.data is not None and self.imatrix is not None:
            raise UsageError("--calibration-data and --imatrix both give the importance of each input channel",
                             hint="pass one of them")
        if calibration is Calibration.Gptq and self.data is None:
            raise UsageError("--calibration gptq needs calibration text to run the model on",
                             hint="pass --calibration-data FILE (plain text, or JSON lines with a \"text\" field)"
                             + ("; an importance matrix holds only XᵀX's diagonal, which GPTQ cannot use"
                                if self.imatrix is not None else ""))
        if self.imatrix is not None and calibration is not Calibration.Mse:
            raise UsageError("--imatrix weighs the scale search of --calibration mse",
                             hint="add --calibration mse, or drop --imatrix")
        self.check_windows()
        self.check_files()

    def check_files(self) -> None:
        """UsageError for a file named that is not there, found as the options are parsed (`named_file`)."""
        if self.data is not None:
            named_file(self.data, "calibration text", TEXT_HINT)
        if self.imatrix is not None:
            named_file(self.imatrix, "importance matrix", "pass the file `qcli imatrix` or llama-imatrix wrote")

    def check_windows(self) -> None:
        """UsageError for windows that hold nothing or more than MAX_WINDOW_TOKENS, or a seed past 64 bits: the
        one place every command checks them, before anything is read (a dry run too)."""
        for name, value, default in (("--samples", self.samples, SAMPLES), ("--seq-len", self.seq_len, SEQ_LEN)):
            if not 1 <= value <= MAX_WINDOW_TOKENS:
                raise UsageError(f"{name} must be between 1 and {MAX_WINDOW_TOKENS:,}, not {shown(value)}",
                                 hint=f"the default is {name} {default}")
        if self.samples * self.seq_len > MAX_WINDOW_TOKENS:
            raise UsageError(f"--samples {self.samples} × --seq-len {self.seq_len} is {self.samples * self.seq_len:,} "
                             f"tokens, more than the {MAX_WINDOW_TOKENS:,} a calibration holds",
                             hint=f"the defaults take {SAMPLES * SEQ_LEN:,}; pass fewer --samples")
        if not 0 <= self.seed < 1 << 64:
            raise UsageError(f"--seed {shown(self.seed)} is not between 0 and 2^64 - 1",
                             hint=f"the default is --seed {SEED}")
