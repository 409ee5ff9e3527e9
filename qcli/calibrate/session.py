"""A quantize run's calibration over its `Checkpoint`.

The model runs block by block on the calibration text (`runner`). GPTQ quantizes each Linear the plan gives
`Calibration.Gptq` (`gptq`). For the Linears whose scales the mse search chooses, each input channel's
importance comes from the same run or from a llama.cpp importance matrix.

The tensors quantized here leave as payloads the pipeline writes as they are (`Calibrated.payloads`). An
importance matrix's importance goes to the pipeline's own search (`Calibrated.importance`). What each Linear
gets as the run reaches it is `PerLinear`'s."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

import qcli.codec
from qcli.calibrate.checkpoint import Checkpoint, check_positions
from qcli.calibrate.gptq import gptq, output_error, workspace_bytes
from qcli.calibrate.importance import file_importance, opened
from qcli.calibrate.model import open_model
from qcli.calibrate.runner import (
    BlockProgress,
    LinearStats,
    block_linears,
    estimate_memory,
    give_back_cached,
    run_blocks,
    shapes_of,
)
from qcli.errors import DeviceMemoryError
from qcli.io.files import file_sha256
from qcli.plan.checks import count_and_first
from qcli.problem import Kind, Problem, Severity
from qcli.report.quantize import CalibrationRecord
from qcli.resident import peak_resident_bytes, resident_bytes
from qcli.scheme import Calibration

if TYPE_CHECKING:
    from qcli.calibrate.inputs import CalibrationInput
    from qcli.codec.quantize import QuantizedParts
    from qcli.plan.entries import Plan, PlanEntry


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


def reachable(checkpoint: Checkpoint) -> frozenset[str]:
    """The checkpoint names of the Linear weights in the model's repeated blocks (their fused experts' too):
    what GPTQ calibrates (the model built on the meta device; no weight is read)."""
    return frozenset(block_linears(open_model(checkpoint), shapes_of(checkpoint.tensors)))


def estimate(checkpoint: Checkpoint, calibrating: CalibrationInput, gptq_run: bool) -> int:
    """The device memory one block and the cached activations take (`runner.estimate_memory`), with GPTQ's
    work on the widest Linear for `gptq_run`. The windows are checked against the model's positions first,
    as the run checks them: a dry run refuses what the run would."""
    config = checkpoint.config
    check_positions(config, calibrating.seq_len)
    return estimate_memory(config, calibrating.samples, calibrating.seq_len,
                           on_linear_bytes=_gptq_bytes if gptq_run else None)


def _gptq_bytes(linear: torch.nn.Linear) -> int:
    return workspace_bytes(linear.out_features, linear.in_features)


def calibrate(plan: Plan, checkpoint: Checkpoint, calibrating: CalibrationInput, device: str,
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
        done = _from_imatrix(calibrating.imatrix, checkpoint, weighed, reachable(checkpoint))
        done.seconds = time.perf_counter() - started
        return done
    model, text, tokens = opened(checkpoint, calibrating)
    done = Calibrated()
    if tokens.shortfall is not None:
        done.warnings.append(Problem(Kind.calibration, tokens.shortfall, "give more text with --calibration-data, "
                                     "or fewer --samples or a shorter --seq-len", Severity.warning))

    on_linear = PerLinear(done, quantized, weighed_by_name, measured)
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
    if unreached := on_linear.unreached:
        done.warnings.append(Problem(
            Kind.calibration, f"{count_and_first(unreached)} of experts the router sent no calibration token to "
            "took none", "their scales are the unweighted Mse search's; more calibration text "
            "reaches more experts", Severity.warning, tensors=tuple(unreached)))
    done.record = CalibrationRecord(
        "gptq" if quantized else "mse" if weighed else codec_method(list(measured.values())),
        text.name, text.sha256, samples=int(tokens.tokens.shape[0]),
        seq_len=int(tokens.tokens.shape[1]), seed=calibrating.seed, tokens=tokens.available,
        blocks=run.blocks, memory_estimate_bytes=estimate_bytes, peak_device_bytes=int(peak))
    done.seconds = time.perf_counter() - started
    return done


@dataclass
class PerLinear:
    """The run's `on_linear` (`runner.OnLinear`): what each Linear gets as the run reaches it. GPTQ's
    (`quantized`) and the weighed search's (`weighed`) leave payloads and output errors in `done`; those
    only `measured` leave their codec output error; every one leaves its input importance. GPTQ's weight
    goes back quantized, so the blocks after it see what the file will give; the search's stays float."""

    done: Calibrated
    quantized: dict[str, PlanEntry]
    weighed: dict[str, PlanEntry]
    measured: dict[str, PlanEntry]
    unreached: list[str] = field(default_factory=list)  # experts the router sent no token

    def __call__(self, name: str, weight: torch.Tensor, stats: LinearStats) -> torch.Tensor | None:
        done = self.done
        done.importance[name] = stats.importance
        done.bytes += weight.numel() * weight.element_size()
        hessian = stats.hessian
        assert hessian is not None, "held while its Linear is calibrated"
        entry = self.quantized.get(name) or self.weighed.get(name)
        if entry is None:
            if name in self.measured:  # the codec's scales, only measured: the pipeline writes the same bytes
                done.errors[self.measured[name].name] = _codec_output_error(self.measured[name], weight, hessian)
            return None
        decision, encoding = entry.decision, entry.encoding
        if stats.tokens == 0:  # nothing to weigh by: the unweighted search
            self.unreached.append(entry.name)
            done.payloads[entry.name] = _encoded(entry, weight, calibration=Calibration.Mse)[0]
            return None
        scheme = encoding.scheme
        assert scheme is not None, "a calibrated tensor is quantized"
        if decision.calibration is Calibration.Gptq:
            # each block's scale searched over its columns' current weights (§6), each column weighed by its
            # input's mean square: on all-MiniLM-L6-v2 at q4f-b32 MinMax's scales left GPTQ below the
            # data-free search, and on SmolLM2 the weighing took the KL from 0.162 to 0.116 (docs/benchmarks.md)
            result = gptq(weight, hessian, scheme, transpose=encoding.transpose, search=True,
                          importance=stats.importance, name=name)
            done.payloads[entry.name] = qcli.codec.pack(_on_cpu(result.parts), scheme, encoding.shape)
            done.errors[entry.name] = result.error
            return result.dequantized.to(weight.device, weight.dtype)
        # the mse search, each input channel weighed by its mean square: the pipeline's bytes
        importance = stats.importance[:, None] if encoding.transpose else stats.importance
        done.payloads[entry.name], dequantized = _encoded(entry, weight, importance)
        done.errors[entry.name] = output_error(weight, dequantized, hessian)
        return None


def codec_method(entries: list[PlanEntry]) -> str:
    """The record's method of a run that only measures: the codec's calibration (`minmax`, `absmean`)."""
    return entries[0].decision.calibration.name.lower() if entries else "minmax"


def _encoded(entry: PlanEntry, weight: torch.Tensor, importance: torch.Tensor | None = None,
             calibration: Calibration | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The codec's payload of a Linear's `weight` ([out, in]) under its entry's scheme and calibration (or
    `calibration`; the pipeline's bytes), and its decode on W's axes."""
    encoding = entry.encoding
    assert encoding.scheme is not None, "a calibrated tensor is quantized"
    written = weight.t() if encoding.transpose else weight
    payload = qcli.codec.encode(written.cpu(), encoding.scheme, calibration or entry.decision.calibration,
                                name=entry.name, importance=importance)
    dequantized = qcli.codec.decode(payload, encoding.scheme, encoding.shape)
    return payload, dequantized.t() if encoding.transpose else dequantized


def _codec_output_error(entry: PlanEntry, weight: torch.Tensor, hessian: torch.Tensor) -> float:
    """`output_error` of the codec's own quantization of `weight` (`_encoded`)."""
    return output_error(weight, _encoded(entry, weight)[1], hessian)


def _from_imatrix(path: Path, checkpoint: Checkpoint, weighed: list[PlanEntry], blocks: frozenset[str]) -> Calibrated:
    """The importance of each searched tensor's input channels from a llama.cpp importance matrix
    (`file_importance`).

    A tensor the matrix lacks is searched unweighted, and a warning says so. One warning names those outside
    the model's blocks (`blocks`: the Linears in them), which `qcli imatrix` never measures (the token
    embedding, the output head); another names the block Linears the matrix should have held."""

    done = Calibrated(record=CalibrationRecord("mse", str(path), file_sha256(path)))
    done.importance = file_importance(path, checkpoint, [e.info for e in weighed])
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
