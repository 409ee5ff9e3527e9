"""Each Linear's input importance (the mean square of each input channel), measured or read.

Measured: the model's blocks run float on the calibration text, every Linear's input summed (`input_importance`
for a quantize run's search, `measure_importance` for `qcli imatrix`, named as llama.cpp names them). Read: a
llama.cpp importance matrix's entries mapped to the checkpoint's names (`file_importance`). `opened` is where
every calibrated run starts: the checkpoint's model, the calibration text and its windows."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from qcli.calibrate.checkpoint import Checkpoint, check_positions
from qcli.calibrate.data import CalibrationSet, CalibrationText, read_calibration_text, windows
from qcli.calibrate.model import CalibrationModel, open_model, token_embedding
from qcli.calibrate.runner import BlockProgress, LinearStats, block_linears, run_blocks, shapes_of
from qcli.errors import InputError, UsageError
from qcli.plan.checks import count_and_first
from qcli.text import printable, quoted

if TYPE_CHECKING:
    from qcli.calibrate.inputs import CalibrationInput
    from qcli.io.imatrix import Imatrix
    from qcli.io.source import TensorInfo


@dataclass(frozen=True)
class MeasuredImportance:
    """`qcli imatrix`'s result: the importance matrix in llama.cpp's names, and the windows it was measured on."""

    imatrix: Imatrix
    samples: int
    seq_len: int
    tokens: int
    device: str


def measure_importance(checkpoint: Checkpoint, calibrating: CalibrationInput, device: str,
                       progress: BlockProgress | None = None) -> MeasuredImportance:
    """Every Linear in the model's blocks run float on the calibration text (`device`: auto, cpu or cuda),
    each one's sum of squares per input channel and token count, named as llama.cpp names them."""
    from qcli.io.imatrix import Imatrix, ImatrixEntry, expert_stem, hf_to_gguf_names

    model, text, tokens, run, chosen = _block_run(checkpoint, calibrating, device, progress)
    stems = {name: expert_stem(name) for name in run.stats}
    names = hf_to_gguf_names({stem for stem, _ in stems.values()}, model.module.config.model_type)
    unnamed = sorted(name for name, (stem, _) in stems.items() if stem not in names)
    if unnamed:
        raise UsageError(printable(f"the gguf package's name table of model_type {model.module.config.model_type!r} "
                                   f"has no llama.cpp name for {count_and_first(unnamed)} of the model's Linears"),
                         hint="upgrade the gguf package (pip install -U gguf); llama.cpp's converter may not "
                              "convert this model")
    entries: dict[str, ImatrixEntry] = {}
    experts: dict[str, dict[int, LinearStats]] = {}
    for name, stats in run.stats.items():
        stem, expert = stems[name]
        if expert is None:
            entries[names[stem]] = ImatrixEntry(stats.importance * stats.tokens, np.array([stats.tokens]))
        else:  # llama.cpp's one entry of every expert: row e expert e's, each its own count
            experts.setdefault(names[stem], {})[expert] = stats
    for name, by_expert in experts.items():
        rows = range(max(by_expert) + 1)
        squares = [by_expert[e].importance * by_expert[e].tokens if e in by_expert else None for e in rows]
        width = next(s for s in squares if s is not None).shape[0]
        entries[name] = ImatrixEntry(torch.stack([torch.zeros(width, dtype=torch.float64) if s is None else s
                                                  for s in squares]).numpy(),
                                     np.array([by_expert[e].tokens if e in by_expert else 0 for e in rows]))
    imatrix = Imatrix(entries, (Path(text.name).name,), int(tokens.tokens.shape[0]), int(tokens.tokens.shape[1]))
    return MeasuredImportance(imatrix, imatrix.chunk_count, imatrix.chunk_size, tokens.available, chosen)


def input_importance(checkpoint: Checkpoint, calibrating: CalibrationInput, device: str,
                     progress: BlockProgress | None = None) -> dict[str, torch.Tensor]:
    """The mean square of each input channel (float64 [in], by the checkpoint's name) of every Linear in
    the model's blocks, run float on the calibration text, as `qcli imatrix` measures it."""
    return {name: stats.importance for name, stats in _block_run(checkpoint, calibrating, device,
                                                                 progress)[3].stats.items()}


def _block_run(checkpoint: Checkpoint, calibrating: CalibrationInput, device: str,
               progress: BlockProgress | None):
    """The model's blocks run float on the calibration text (`device`: auto, cpu or cuda), every Linear's
    input measured: the model, the text, its windows, the run and the device chosen."""
    model, text, tokens = opened(checkpoint, calibrating)
    chosen = "cuda" if device == "cuda" or (device == "auto" and torch.cuda.is_available()) else "cpu"
    run = run_blocks(model, tokens, block_linears(model, shapes_of(checkpoint.tensors)), lambda *_: None, chosen,
                     progress=progress, hessians=False)
    return model, text, tokens, run, chosen


def opened(checkpoint: Checkpoint, calibrating: CalibrationInput
           ) -> tuple[CalibrationModel, CalibrationText, CalibrationSet]:
    """The checkpoint's model, the calibration text, and its windows."""
    assert calibrating.data is not None, "calibration without an imatrix reads its text"
    text = read_calibration_text(calibrating.data)
    model = open_model(checkpoint)
    check_positions(model.module.config, calibrating.seq_len)
    tokens = windows(text, checkpoint.tokenizer, calibrating)
    rows = token_embedding(model.module).num_embeddings
    if int(tokens.tokens.max()) >= rows:
        raise InputError(printable(f"the tokenizer of {checkpoint.folder} gives token id {int(tokens.tokens.max())} "
                                   f"on the calibration text, past the {rows} rows of the model's token embedding"),
                         hint="the tokenizer's files and the weights are of different models; calibrate with the "
                              "tokenizer saved with these weights")
    return model, text, tokens


def file_importance(path: Path, checkpoint: Checkpoint, infos: list[TensorInfo]) -> dict[str, torch.Tensor]:
    """The importance of each of `infos`' input channels (float64 [in], by the checkpoint's name) that a
    llama.cpp importance matrix holds, its names mapped from the model's (config.json's `model_type`);
    those it lacks are left out. `InputError` for a vector of another length than the tensor's last axis."""
    from qcli.io.imatrix import expert_stem, hf_to_gguf_names, read_imatrix

    imatrix = read_imatrix(path)
    stems = {info.name: expert_stem(info.name) for info in infos}
    names = hf_to_gguf_names({stem for stem, _ in stems.values()}, checkpoint.config.model_type)
    importance = {}
    for info in infos:
        stem, expert = stems[info.name]
        found = imatrix.entries.get(names.get(stem, ""))
        if found is None:
            continue
        columns = info.shape[-1]
        values = found.importance
        if expert is not None:  # an expert's row of every expert's [n_expert, n_in] (flat in a legacy file)
            values = values.reshape(-1, columns) if values.size % columns == 0 else values
            if values.ndim != 2 or expert >= values.shape[0]:
                continue
            values = values[expert]
        elif values.ndim != 1:
            continue
        if values.shape[0] != columns:
            raise InputError(f"{path}: the importance of {quoted(info.name)} has {values.shape[0]} "
                             f"input channels; the tensor has {columns}",
                             hint="use the importance matrix computed for this model")
        importance[info.name] = torch.from_numpy(values.astype("float64"))
    return importance
