"""What a calibration run measures activations on (`CalibrationInput`) and its defaults, which `--help` states;
importing nothing heavy, for the command line."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from qcli.errors import UsageError
from qcli.scheme import Calibration

SAMPLES = 128  # windows of calibration tokens
SEQ_LEN = 512  # tokens a window
SEED = 0  # of the generator that places the windows


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
        search; both files at once. Text with a calibration that does not use it (MinMax, AbsMean) measures
        their output error."""
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

    def check_windows(self) -> None:
        """UsageError for windows that hold nothing."""
        for name, value in (("--samples", self.samples), ("--seq-len", self.seq_len)):
            if value < 1:
                raise UsageError(f"{name} must be at least 1, not {value}", hint=f"the default is {name} "
                                 f"{SAMPLES if name == '--samples' else SEQ_LEN}")
