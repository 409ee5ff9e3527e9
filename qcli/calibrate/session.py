"""A quantize run's calibration: the model run block by block on the calibration text (`runner`), GPTQ for
each Linear the plan gives `Calibration.Gptq` (`gptq`), and each input channel's importance for the Linears
whose scales the mse search chooses, from the same run or from a llama.cpp importance matrix (`imatrix`).

The tensors quantized here (GPTQ's, and the search's weighed by the run's activations) leave as payloads
(`Calibrated.payloads`) the pipeline writes as they are; an importance matrix's importance goes to the
pipeline's search (`Calibrated.importance`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

import qcli.codec
from qcli.calibrate.data import (
    CalibrationSet,
    CalibrationText,
    calibration_tokens,
    framed,
    read_calibration_text,
    special_frame,
)
from qcli.calibrate.gptq import gptq, output_error, workspace_bytes
from qcli.calibrate.model import CalibrationModel, check_positions, load_tokenizer, open_model
from qcli.calibrate.runner import (
    BlockDone,
    LinearStats,
    block_linears,
    estimate_memory,
    give_back_cached,
    run_blocks,
)
from qcli.errors import DeviceMemoryError, InputError, UsageError
from qcli.io.files import file_sha256
from qcli.io.source import checkpoint_folder
from qcli.plan.checks import count_and_first
from qcli.problem import Kind, Problem, Severity
from qcli.report.quantize import CalibrationRecord
from qcli.resident import peak_resident_bytes, resident_bytes
from qcli.scheme import Calibration
from qcli.text import printable, quoted

if TYPE_CHECKING:
    from qcli.calibrate.inputs import CalibrationInput
    from qcli.codec.quantize import QuantizedParts
    from qcli.io.imatrix import Imatrix
    from qcli.io.source import Source, TensorInfo
    from qcli.plan.entries import Plan, PlanEntry

BlockProgress = Callable[[BlockDone], None]


@dataclass
class Calibrated:
    """What calibration gives the write: the payloads of the tensors it quantized (GPTQ's, and the mse
    search's weighed by the run's activations), by entry name; their output errors; the importance of each
    input channel (float64 [in], by name, for the pipeline's search when it comes from an importance
    matrix); the run's record and warnings, and the time it took and the bytes of weights it read."""

    payloads: dict[str, torch.Tensor] = field(default_factory=dict)
    errors: dict[str, float] = field(default_factory=dict)
    importance: dict[str, torch.Tensor] = field(default_factory=dict)
    record: CalibrationRecord | None = None
    warnings: list[Problem] = field(default_factory=list)
    seconds: float = 0.0
    bytes: int = 0


def reachable(folder: Path, source: Source) -> frozenset[str]:
    """The checkpoint names of the Linear weights in the model's repeated blocks: what GPTQ calibrates
    (the model built on the meta device from `folder`'s config.json; no weight is read)."""
    return frozenset(block_linears(open_model(folder, source.infos(), source.load)))


def estimate(folder: Path, checkpoint: list[TensorInfo], calibrating: CalibrationInput, gptq_run: bool) -> int:
    """The device memory one block and the cached activations take (`runner.estimate_memory`), with GPTQ's
    work on the widest Linear for `gptq_run`; first the config checked against the `checkpoint`'s tensors
    and the windows against its positions, as the run checks them (a dry run refuses what the run would)."""
    from qcli.calibrate.model import check_positions, load_config

    config = load_config(folder, checkpoint)
    check_positions(config, calibrating.seq_len)
    return estimate_memory(config, calibrating.samples, calibrating.seq_len,
                           on_linear_bytes=_gptq_bytes if gptq_run else None)


def _gptq_bytes(linear: torch.nn.Linear) -> int:
    return workspace_bytes(linear.out_features, linear.in_features)


def calibrate(plan: Plan, source: Source, folder: Path, calibrating: CalibrationInput, device: str,
              progress: BlockProgress | None = None) -> Calibrated | None:
    """Run the calibration the plan needs (None when it needs none) on `device` (`cpu` or `cuda`)."""
    quantized = {e.info.name: e for e in plan.calibrated_by(Calibration.Gptq)}
    weighed = plan.calibrated_by(Calibration.Mse)
    weighed_by_name = {e.info.name: e for e in weighed}
    measured = {e.info.name: e for e in plan.codec_calibrated()} if calibrating.data is not None else {}
    if not quantized and not (weighed and (calibrating.data or calibrating.imatrix)) and not measured:
        return None
    started = time.perf_counter()
    if calibrating.imatrix is not None:
        done = _from_imatrix(calibrating.imatrix, folder, weighed, reachable(folder, source))
        done.seconds = time.perf_counter() - started
        return done
    model, text, tokens = _opened(source, folder, calibrating)
    done = Calibrated()
    if tokens.shortfall is not None:
        done.warnings.append(Problem(Kind.calibration, tokens.shortfall, "give more text with --calibration-data, "
                                     "or fewer --samples or a shorter --seq-len", Severity.warning))

    def on_linear(name: str, weight: torch.Tensor, stats: LinearStats) -> torch.Tensor | None:
        done.importance[name] = stats.importance
        done.bytes += weight.numel() * weight.element_size()
        entry = quantized.get(name) or weighed_by_name.get(name)
        if entry is None:
            if name in measured:  # the codec's scales, only measured: the pipeline writes the same bytes
                done.errors[measured[name].name] = _codec_output_error(measured[name], weight, stats.hessian)
            return None
        decision, shape = entry.decision, tuple(entry.out_shape)
        if decision.calibration is Calibration.Gptq:
            # each block's scale searched over its columns' current weights (§6), each column weighed by its
            # input's mean square: on all-MiniLM-L6-v2 at q4f-b32 MinMax's scales left GPTQ below the
            # data-free search, and on SmolLM2 the weighing took the KL from 0.162 to 0.116 (docs/benchmarks.md)
            result = gptq(weight, stats.hessian, decision.scheme, transpose=decision.transpose, search=True,
                          importance=stats.importance, name=name)
            payload = qcli.codec.pack(_on_cpu(result.parts), decision.scheme, shape)
            dequantized, error = result.dequantized, result.error
        else:  # the mse search, each input channel weighed by its mean square: the pipeline's bytes
            importance = stats.importance[:, None] if decision.transpose else stats.importance
            payload, dequantized = _encoded(entry, weight, importance)
            error = output_error(weight, dequantized, stats.hessian)
        done.payloads[entry.name], done.errors[entry.name] = payload, error
        # GPTQ's blocks after this one see what the quantized weights give; the mse search leaves them float
        return dequantized.to(weight.device, weight.dtype) if decision.calibration is Calibration.Gptq else None

    target = torch.device(device if torch.cuda.is_available() else "cpu")  # the Triton interpreter: no CUDA
    estimate_bytes = estimate_memory(model.module.config, calibrating.samples, calibrating.seq_len,
                                     on_linear_bytes=_gptq_bytes if quantized else None)
    if target.type == "cuda":
        torch.cuda.reset_peak_memory_stats(target)
    before = resident_bytes()
    try:
        run = run_blocks(model, tokens, set(quantized) | {e.info.name for e in weighed} | set(measured), on_linear,
                         target, progress=progress)
    except torch.OutOfMemoryError as exc:
        raise _out_of_memory(target, estimate_bytes, calibrating) from exc
    give_back_cached(target)  # the pipeline that writes the file allocates its own buffers next
    # on CUDA, the most device memory torch's allocator held (allocated or cached: what the device has given the
    # run, CUDA's own context aside); on the CPU, what the process grew by: its peak resident bytes over those
    # before the run
    peak = torch.cuda.max_memory_reserved(target) if target.type == "cuda" else peak_resident_bytes() - before
    left = [name for name in (*run.outside, *run.not_linear) if name in quantized or name in weighed_by_name]
    if left:  # those only measured go without an output error, which their rows show
        done.warnings.append(Problem(
            Kind.calibration, f"{len(left)} tensors are not Linears in the model's repeated blocks and are not "
            f"calibrated: {', '.join(left[:3])}{', ...' if len(left) > 3 else ''}",
            "their scales are the data-free ones; a recipe rule can keep them", Severity.warning, tensors=tuple(left)))
    done.record = CalibrationRecord(
        "gptq" if quantized else "mse" if weighed else codec_method(list(measured.values())),
        text.name, text.sha256, samples=int(tokens.tokens.shape[0]),
        seq_len=int(tokens.tokens.shape[1]), seed=calibrating.seed, tokens=tokens.available,
        blocks=run.blocks, memory_estimate_bytes=estimate_bytes, peak_device_bytes=int(peak))
    done.seconds = time.perf_counter() - started
    return done


def codec_method(entries: list[PlanEntry]) -> str:
    """The record's method of a run that only measures: the codec's calibration (`minmax`, `absmean`)."""
    return entries[0].decision.calibration.name.lower() if entries else "minmax"


def _encoded(entry: PlanEntry, weight: torch.Tensor, importance: torch.Tensor | None = None
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """The codec's payload of a Linear's `weight` ([out, in]) under its entry's scheme and calibration (the
    pipeline's bytes), and its decode on W's axes."""
    decision = entry.decision
    written = weight.t() if decision.transpose else weight
    payload = qcli.codec.encode(written.cpu(), decision.scheme, decision.calibration, name=entry.name,
                                importance=importance)
    dequantized = qcli.codec.decode(payload, decision.scheme, tuple(entry.out_shape))
    return payload, dequantized.t() if decision.transpose else dequantized


def _codec_output_error(entry: PlanEntry, weight: torch.Tensor, hessian: torch.Tensor) -> float:
    """`output_error` of the codec's own quantization of `weight` (`_encoded`)."""
    return output_error(weight, _encoded(entry, weight)[1], hessian)


@dataclass(frozen=True)
class MeasuredImportance:
    """`qcli imatrix`'s result: the importance matrix in llama.cpp's names, and the windows it was measured on."""

    imatrix: Imatrix
    samples: int
    seq_len: int
    tokens: int
    device: str


def measure_importance(source: Source, input: Path, calibrating: CalibrationInput, device: str,
                       progress: BlockProgress | None = None) -> MeasuredImportance:
    """Every Linear in the model's blocks run float on the calibration text (`device`: auto, cpu or cuda),
    each one's sum of squares per input channel and token count, named as llama.cpp names them."""
    from qcli.io.imatrix import Imatrix, ImatrixEntry, hf_to_gguf_names

    model, text, tokens, run, chosen = _block_run(source, input, calibrating, device, progress)
    names = hf_to_gguf_names(run.stats, model.module.config.model_type)
    unnamed = sorted(set(run.stats) - set(names))
    if unnamed:
        raise UsageError(printable(f"the gguf package's name table of model_type {model.module.config.model_type!r} "
                                   f"has no llama.cpp name for {count_and_first(unnamed)} of the model's Linears"),
                         hint="upgrade the gguf package (pip install -U gguf); llama.cpp's converter may not "
                              "convert this model")
    entries = {names[name]: ImatrixEntry(stats.importance * stats.tokens, [stats.tokens])
               for name, stats in run.stats.items()}
    imatrix = Imatrix(entries, (Path(text.name).name,), int(tokens.tokens.shape[0]), int(tokens.tokens.shape[1]))
    return MeasuredImportance(imatrix, imatrix.chunk_count, imatrix.chunk_size, tokens.available, chosen)


def input_importance(source: Source, input: Path, calibrating: CalibrationInput, device: str,
                     progress: BlockProgress | None = None) -> dict[str, torch.Tensor]:
    """The mean square of each input channel (float64 [in], by the checkpoint's name) of every Linear in
    the model's blocks, run float on the calibration text, as `qcli imatrix` measures it."""
    return {name: stats.importance for name, stats in _block_run(source, input, calibrating, device,
                                                                 progress)[3].stats.items()}


def _block_run(source: Source, input: Path, calibrating: CalibrationInput, device: str,
               progress: BlockProgress | None):
    """The model's blocks run float on the calibration text (`device`: auto, cpu or cuda), every Linear's
    input measured: the model, the text, its windows, the run and the device chosen."""
    model, text, tokens = _opened(source, checkpoint_folder(input), calibrating)
    chosen = "cuda" if device == "cuda" or (device == "auto" and torch.cuda.is_available()) else "cpu"
    run = run_blocks(model, tokens, block_linears(model), lambda *_: None, chosen, progress=progress, hessians=False)
    return model, text, tokens, run, chosen


def _opened(source: Source, folder: Path, calibrating: CalibrationInput
            ) -> tuple[CalibrationModel, CalibrationText, CalibrationSet]:
    """The model `folder` describes over `source`'s tensors, the calibration text, and its windows."""
    text = read_calibration_text(calibrating.data)
    model = open_model(folder, source.infos(), source.load)
    check_positions(model.module.config, calibrating.seq_len)
    tokens = windows(text, load_tokenizer(folder), calibrating)
    rows = model.module.get_input_embeddings().num_embeddings
    if int(tokens.tokens.max()) >= rows:
        raise InputError(printable(f"the tokenizer of {folder} gives token id {int(tokens.tokens.max())} on the "
                                   f"calibration text, past the {rows} rows of the model's token embedding"),
                         hint="the tokenizer's files and the weights are of different models; calibrate with the "
                              "tokenizer saved with these weights")
    return model, text, tokens


def windows(text: CalibrationText, tokenizer, calibrating: CalibrationInput) -> CalibrationSet:
    """The windows the model runs on: `seq_len` tokens each, the tokenizer's special tokens around the text
    it cuts (`data.framed`), as the model sees every input."""
    before, after = special_frame(tokenizer)
    body = calibrating.seq_len - len(before) - len(after)
    if body < 1:
        raise UsageError(f"--seq-len {calibrating.seq_len} leaves no room for text beside the tokenizer's "
                         f"{len(before) + len(after)} special tokens", hint="pass a longer --seq-len")
    return framed(calibration_tokens(text, tokenizer, calibrating.samples, body, calibrating.seed), tokenizer)


def _from_imatrix(path: Path, folder: Path, weighed: list[PlanEntry], blocks: frozenset[str]) -> Calibrated:
    """The importance of each searched tensor's input channels from a llama.cpp importance matrix, its names
    mapped from the model's (config.json's `model_type`); a tensor it lacks is searched unweighted, said in
    a warning: one for those outside the model's blocks (`blocks`: the Linears in them), which `qcli imatrix`
    never measures (the token embedding, the output head), another for block Linears the matrix should
    have held."""

    done = Calibrated(record=CalibrationRecord("mse", str(path), file_sha256(path)))
    done.importance = file_importance(path, folder, [e.info for e in weighed])
    missing = [entry.info.name for entry in weighed if entry.info.name not in done.importance]
    outside = [name for name in missing if name not in blocks]
    if outside:
        done.warnings.append(Problem(
            Kind.calibration, f"{path} measures the Linears in the model's blocks: {count_and_first(outside)} "
            f"outside them {'is' if len(outside) == 1 else 'are'} not weighed",
            "nothing to do: their scales are searched unweighted",
            Severity.warning, tensors=tuple(outside)))
    lacking = [name for name in missing if name in blocks]
    if lacking:
        done.warnings.append(Problem(
            Kind.calibration, f"{path} holds no importance for {count_and_first(lacking)} of the model's blocks "
            "that the mse search weighs", "they are searched unweighted; compute the matrix on this model "
            "(qcli imatrix)", Severity.warning, tensors=tuple(lacking)))
    return done


def file_importance(path: Path, folder: Path, infos: list[TensorInfo]) -> dict[str, torch.Tensor]:
    """The importance of each of `infos`' input channels (float64 [in], by the checkpoint's name) that a
    llama.cpp importance matrix holds, its names mapped from the model's (config.json's `model_type`);
    those it lacks are left out. `InputError` for a vector of another length than the tensor's last axis."""
    from qcli.calibrate.model import load_config
    from qcli.io.imatrix import hf_to_gguf_names, read_imatrix

    imatrix = read_imatrix(path)
    names = hf_to_gguf_names([i.name for i in infos], load_config(folder).model_type)
    importance = {}
    for info in infos:
        found = imatrix.entries.get(names.get(info.name, ""))
        if found is None or found.importance.ndim != 1:
            continue
        columns = info.shape[-1]
        if found.importance.shape[0] != columns:
            raise InputError(f"{path}: the importance of {quoted(info.name)} has {found.importance.shape[0]} "
                             f"input channels; the tensor has {columns}",
                             hint="use the importance matrix computed for this model")
        importance[info.name] = torch.from_numpy(found.importance.astype("float64"))
    return importance


def _on_cpu(parts: QuantizedParts) -> QuantizedParts:
    from qcli.codec.quantize import QuantizedParts

    return QuantizedParts(parts.fields.cpu(), parts.scales.cpu(), parts.global_scale)


def _out_of_memory(device: torch.device, estimate_bytes: int, calibrating: CalibrationInput) -> DeviceMemoryError:
    """The error for a device that ran out: the estimate beside what the device has, and the windows that
    fit (activations grow with samples × seq_len)."""
    total = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else 0
    share = total / estimate_bytes if total and estimate_bytes else 0.5
    samples = max(1, math.floor(calibrating.samples * min(share, 1.0) * 0.8))
    return DeviceMemoryError(
        f"{device} ran out of memory calibrating {calibrating.samples} windows of {calibrating.seq_len} tokens "
        f"(estimated {estimate_bytes / 2**30:.1f} GiB for one block and the activations"
        + (f", beside the device's {total / 2**30:.1f} GiB)" if total else ")"),
        hint=f"pass --samples {samples} (or a shorter --seq-len), or --device cpu")
