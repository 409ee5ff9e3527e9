"""`quantize_file`: plan a checkpoint (safetensors or GGUF) from its headers, then stream it through a pipeline into
burnpack output."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from qcli import BURN_VERSION
from qcli.burn_backends import BurnBackend, resolve_backend, resolve_version
from qcli.commands import collector_paused
from qcli.error_stats import ErrorStats
from qcli.errors import InputError, UsageError
from qcli.formats import detect
from qcli.formats.found import Found
from qcli.io.gguf import is_gguf
from qcli.io.hf_cache import is_model_name, snapshot
from qcli.io.safetensors import TensorInfo, printable
from qcli.io.source import Source, open_source
from qcli.output import (
    MODEL_FILE,
    ModelFolder,
    Output,
    check_folder,
    default_output,
    folder_record,
    is_folder_output,
    metadata,
    refuse_input_as_output,
    refuse_special_output,
    side_files,
)
from qcli.pipeline.device import Runtime
from qcli.plan import Plan, PlanEntry, make_plan
from qcli.presets import Preset, resolve_preset
from qcli.problem import Problem
from qcli.recipe import Recipe, load_recipe
from qcli.report import MemoryUse, Phase, QuantizeReport, SourceFile, TensorRow, Timings
from qcli.resident import peak_resident_bytes, resident_bytes
from qcli.scheme import Calibration, resolve_calibration
from qcli.verify import out_of_bound

if TYPE_CHECKING:
    from qcli.measure import Measurement
    from qcli.pipeline import Payload, Pipeline

# Called after each tensor with the next tensor's name (None when done), bytes read so far and in total.
ProgressHook = Callable[[str | None, int, int], None]


def make_checked_plan(infos: list[TensorInfo], recipe: Recipe | None, preset: Preset, split: bool = False,
                      backend: BurnBackend | None = None, burn_version: str = BURN_VERSION,
                      calibration: Calibration | None = None, requantize: Preset | None = None,
                      found: Mapping[str, Found] | None = None) -> Plan:
    """The plan for `infos` in name order (so shards and one file give the same output); every error is
    raised together as one PlanError. `split`: the output will be cut into several files; `backend` and
    `burn_version`: the Burn backend and release the file must load on; `calibration`: the one for every
    quantized tensor whose rule names none; `requantize` and `found`: the preset tensors no Burn scheme
    holds are requantized into, and the checkpoint's already-quantized weights (`make_plan`)."""
    plan = plan_by_name(infos, recipe, preset, split=split, backend=backend, burn_version=burn_version,
                        calibration=calibration, requantize=requantize, found=found)
    plan.raise_if_errors()
    return plan


def plan_by_name(infos: list[TensorInfo], recipe: Recipe | None = None, preset: Preset | None = None,
                 **options) -> Plan:
    """`make_plan` over `infos` in name order, the order quantize writes and shards them in, so one file
    and shards give the same output; its errors are left to the caller."""
    return make_plan(sorted(infos, key=lambda i: i.name), recipe, preset, **options)


def quantize_file(
    input: str | Path,
    output: str | Path | None = None,
    *,
    scheme: str | None = None,
    recipe: str | Path | None = None,
    calibration: str | None = None,
    device: str = "auto",
    dry_run: bool = False,
    force: bool = False,
    stats: bool = True,
    progress: ProgressHook | None = None,
    verify: bool = True,
    max_shard_size: int | None = None,
    burn_backend: str | None = None,
    burn_version: str | None = None,
    requantize: str | None = None,
    names: str = "file",
    revision: str | None = None,
) -> QuantizeReport:
    """Quantize a safetensors checkpoint or a GGUF file into a burnpack file (or, with `dry_run`, only plan it).

    The plan is made from the headers and checked in full before any weight is read. Tensors are then
    streamed one at a time through the pipeline into the container, which is renamed onto `output` only
    once complete; an interruption or failure leaves `output` as it was (an interrupt during the rename
    takes effect after it, as `Interrupted` saying so). With `stats` or `verify`, the pipeline decodes
    each quantized payload once, on the device that holds it (`qcli.measure`): `stats` reports its error
    against the source, `verify` checks it lies within its scheme's error bound and reads the
    complete files back before the rename, checking them against the plan and the hashes of the bytes
    written (`qcli.verify`); a file that fails never reaches `output`. With `max_shard_size`, the output
    is split into `NAME-00001-of-0000N.bpk` files of at most that many bytes each. With `burn_backend`,
    every tensor that Burn backend cannot load stops the plan (`qcli.burn_backends`); `burn_version` is
    the Burn release to write for (default: the newest stable one, `qcli.BURN_VERSION`). `calibration`
    (`minmax`, `absmean`, `mse`, any case) replaces the presets' calibration and covers every recipe rule
    that names none. `requantize` (a preset name): tensors no Burn scheme holds (`qcli.formats.Encoded`:
    bitsandbytes NF4, FP4; GPTQ with zero points, activation order or 3 bits) are dequantized as their
    format does and quantized into it; their `--stats` error is against the dequantized values. `names`
    (`qcli.io.source.Names`): a GGUF file's tensor names as in the file, or `hf`, Hugging Face's.

    `input` may also name a model `ORG/NAME` in the local Hugging Face cache (`qcli.io.hf_cache`; at
    `revision`, default main) where no such path exists. An `output` ending in `/`, or an existing
    directory, is a model folder: the weights as `model.bpk` (or its shards and index), the source
    folder's config and tokenizer files copied unchanged, and a record of the run (`qcli.output`); a
    cache name without `output` writes the folder `NAME/` here.
    """
    given = str(input)
    input, model = _located(input, revision)
    folder = None
    if output is None and model is not None:
        folder = Path(model.split("/")[1])
    elif output is not None and is_folder_output(output):
        folder = Path(output)
    preset = resolve_preset(scheme)
    backend = resolve_backend(burn_backend)
    version = resolve_version(burn_version)
    loaded_recipe = load_recipe(recipe) if recipe is not None else None
    chosen = None if calibration is None else resolve_calibration(calibration)
    requantized = None if requantize is None else resolve_preset(requantize)
    target = folder / MODEL_FILE if folder else Path(output) if output is not None else default_output(input)
    folder_warnings = [] if folder is None else check_folder(folder, force, dry_run)
    refuse_special_output(target)  # a dry run refuses what the run would (docs/cli.md)
    if target.exists() and not (force or dry_run):  # a dry run warns of it instead (Output.prepare)
        raise UsageError(
            printable(f"{target} already exists"), hint="pass --force to replace it, or -o to write somewhere else"
        )
    runtime = None if dry_run else Runtime(device)  # torch and CUDA load while the headers are read
    with collector_paused() as resume, open_source(input, names) as source:
        inputs = [(input, "the input"), *((f, "the input") for f in source.files)]
        if source.index is not None:
            inputs.append((source.index, "the input's index"))
        if recipe is not None:
            inputs.append((Path(recipe), "the recipe"))
        refuse_input_as_output(target, inputs)
        found = detect(source.infos(), None if requantized is None else source.load)
        plan = make_checked_plan(source.infos(), loaded_recipe, preset, split=max_shard_size is not None,
                                 backend=backend, burn_version=version, calibration=chosen,
                                 requantize=requantized, found=found)
        copies = [] if folder is None or is_gguf(input) else side_files(input if input.is_dir() else input.parent)
        inputs += [(path, "a file the model folder copies") for path in copies]
        report = QuantizeReport(
            input=given,
            output=str(target),
            device=None,
            dry_run=dry_run,
            preset=preset.name,
            burn_backend=None if backend is None else backend.value,
            burn_version=version,
            recipe=None if recipe is None else str(recipe),
            recipe_sha256=None if loaded_recipe is None else loaded_recipe.sha256,
            source_files=[SourceFile(f.name, f.stat().st_size) for f in source.files],
            tensors=[TensorRow.of(e) for e in plan.entries],
            totals=plan.totals(),
            warnings=plan.warnings(),
        )
        if runtime is not None:
            runtime.warm(plan, measure=stats or verify)
        options = {"calibration": calibration, "requantize": requantize, "names": str(names),
                   "max_shard_size": max_shard_size}
        model_folder = None if folder is None else ModelFolder(folder, copies, folder_record(report, input, options))
        outputs = Output(plan, target, max_shard_size, metadata(report), model_folder)
        report.outputs = [str(path) for path in outputs.paths]
        report.warnings += folder_warnings + outputs.prepare(inputs, force=force, dry_run=dry_run)
        if dry_run:
            return report
        resume()
        requantizing = any(e.decision.requantize is not None for e in plan.entries)
        report.device, run = runtime.select("cpu" if requantizing and device == "auto" else device)
        resident = _warm_runtime()
        report.tensors, report.timings = _write(plan, source, run, outputs, stats, progress, verify, report.warnings)
        report.memory = MemoryUse(resident, peak_resident_bytes())
    return report


def _located(input: str | Path, revision: str | None) -> tuple[Path, str | None]:
    """The path to read, and the model name when `input` named one in the Hugging Face cache: a path that
    exists always wins, and a name with a checkpoint's suffix is a path."""
    path = Path(input)
    named = str(input)
    if path.exists() or not is_model_name(named) or named.lower().endswith((".safetensors", ".gguf", ".json")):
        if revision is not None:
            raise UsageError(printable(f"--revision picks a revision of a model in the Hugging Face cache; "
                                       f"{named} is a path"),
                             hint="drop --revision, or give the model's ORG/NAME")
        return path, None
    return snapshot(named, revision), named


def _warm_runtime() -> int:
    """Load and warm the pipelines' runtime (torch, its thread pool), so that its memory is counted apart
    from the tensors', and return the resident bytes then."""
    import torch

    torch.ones(1 << 20).sum()  # a parallel op: the worker threads and their stacks exist from here on
    return resident_bytes()


def _write(
    plan: Plan,
    source: Source,
    run: Pipeline,
    outputs: Output,
    stats: bool,
    progress: ProgressHook | None,
    verify: bool,
    warnings: list[Problem],
) -> tuple[list[TensorRow], Timings]:
    """Stream the pipeline's payloads into the output files, time each phase, and report each quantized
    tensor's measurement by the pipeline (its error with `stats`, its bound check with `verify`, and into
    `warnings` the blocks whose scale left its dtype's range).

    With `verify`, the complete files are then read back (`qcli.verify.read_back`) before they are
    renamed into place.
    """
    total = sum(e.info.nbytes for e in plan.entries)
    timings, rows, done = Timings(verify=Phase() if verify else None), [], 0
    started = time.perf_counter()
    if progress:
        progress(plan.entries[0].name if plan.entries else None, 0, total)
    with outputs.open(digests=verify) as out:
        tick = time.perf_counter()
        payloads = run(plan, source, measure=stats or verify)
        for i, (entry, payload, measured, read) in enumerate(_naming_files(plan, payloads)):
            produced = time.perf_counter() - tick
            timings.read.seconds += read
            timings.read.bytes += entry.info.nbytes
            timings.quantize.seconds += max(produced - read, 0.0)
            timings.quantize.bytes += entry.info.nbytes

            tick = time.perf_counter()
            target = out.write(entry.name, payload)
            timings.write.seconds += time.perf_counter() - tick
            timings.write.bytes += entry.out_nbytes

            error = _reported(entry, measured, target, stats, timings, warnings) if measured is not None else None
            rows.append(TensorRow.of(entry, error))
            del payload

            done += entry.info.nbytes
            if progress:
                following = plan.entries[i + 1].name if i + 1 < len(plan.entries) else None
                progress(following, done, total)
            tick = time.perf_counter()
        tick = time.perf_counter()
        out.finish()
        timings.write.seconds += time.perf_counter() - tick
        if timings.verify is not None:
            verified = out.read_back(plan, [info.name for info in source.infos()])
            timings.verify.seconds += verified.seconds
            timings.verify.bytes += verified.bytes
        tick = time.perf_counter()
        out.commit()
        timings.write.seconds += time.perf_counter() - tick
    timings.total_seconds = time.perf_counter() - started
    return rows, timings


def _naming_files(plan: Plan, payloads: Iterator[Payload]) -> Iterator[Payload]:
    """The pipeline's payloads; an InputError about a tensor's values (NaN, Inf) also names its file."""
    done = 0
    try:
        for item in payloads:
            yield item
            done += 1
    except InputError as exc:
        file = plan.entries[done].info.file if done < len(plan.entries) else None
        if file is None or str(file) in exc.message:
            raise
        raise InputError(f"{file}: {exc.message}", hint=exc.hint) from exc


def _reported(entry: PlanEntry, measured: Measurement, target: Path, stats: bool, timings: Timings,
              warnings: list[Problem]) -> ErrorStats | None:
    """A quantized tensor's measurement (`qcli.measure`), read back: its error with `stats`, with
    `timings.verify` set its bound check, raising `OutputError` for a block over the bound, and a warning
    for blocks whose scale its scale dtype cannot hold (`Measurement.range_loss`), with its SQNR.

    The decode and measuring ran in the pipeline: the host time it spent on them (`Measurement.seconds`:
    all of it on the CPU; on a GPU the launches, the work itself overlapping the stream) moves from the
    quantize phase to the stats phase, with the time taken to read the results back."""
    tick = time.perf_counter()
    error = measured.stats() if stats else None
    loss = measured.range_loss()
    if loss is not None:
        warnings.append(loss.problem(entry.name, (error or measured.stats()).sqnr_db))
    timings.quantize.seconds = max(timings.quantize.seconds - measured.seconds, 0.0)
    timings.stats.seconds += measured.seconds + time.perf_counter() - tick
    timings.stats.bytes += entry.info.nbytes
    if timings.verify is not None:
        tick = time.perf_counter()
        failure = measured.failure()
        timings.verify.seconds += time.perf_counter() - tick
        if failure is not None:
            raise out_of_bound(failure, entry.decision.scheme, entry.name, target)
    return error
