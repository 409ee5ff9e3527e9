"""`quantize_file`: plan a checkpoint from its headers, then stream it through a pipeline into burnpack output.

The checkpoint is any format `qcli.io.readers.READERS` reads."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from qcli.calibrate.checkpoint import Checkpoint
from qcli.commands import collector_paused
from qcli.commands.options import Destination, QuantizeOptions
from qcli.error_stats import ErrorStats
from qcli.errors import InputError, RecipeError, UsageError
from qcli.formats import detect
from qcli.io.burnpack import size_bound
from qcli.io.files import file_sha256
from qcli.io.readers import open_source, reader_of
from qcli.io.reads import Reads, refuse_special
from qcli.io.source import Source
from qcli.io.staged import StagedFile
from qcli.output import Output
from qcli.output.folder import ModelFolder, check_folder, folder_record, read_beside, side_files
from qcli.output.metadata import metadata
from qcli.output.names import TARGET_HINT
from qcli.pipeline.device import Runtime, require_device
from qcli.pipeline.prepared import rest_of, with_prepared
from qcli.plan.decisions import make_checked_plan
from qcli.plan.entries import Plan, PlanEntry
from qcli.plan.options import Target
from qcli.plan.target import (
    Choice,
    achieved_bits,
    allocate,
    backend_words,
    budget,
    check_budget,
    forms,
    free_tensors,
    groups,
    recipe_text,
)
from qcli.problem import Problem
from qcli.recipe import Recipe, load_recipe, parse_recipe
from qcli.report.documents import SourceFile
from qcli.report.quantize import (
    BurnLoad,
    CalibrationRecord,
    MemoryUse,
    Phase,
    QuantizeReport,
    TargetRecord,
    TensorRow,
    Timings,
)
from qcli.resident import peak_resident_bytes, resident_bytes
from qcli.scheme import Calibration
from qcli.sensitivity import measure_losses
from qcli.text import printable
from qcli.verify import out_of_bound

if TYPE_CHECKING:
    from qcli.calibrate.runner import BlockProgress
    from qcli.calibrate.session import Calibrated
    from qcli.measure import Measurement
    from qcli.pipeline import Payload, Pipeline

# Called after each tensor with the next tensor's name (None when done), bytes read so far and in total.
ProgressHook = Callable[[str | None, int, int], None]


def quantize_file(input: str | Path, output: str | Path | None = None, *, progress: ProgressHook | None = None,
                  **options) -> QuantizeReport:
    """`quantize` from options named as a user writes them (`QuantizeOptions.parse`: `scheme="q4s-b32"`,
    `calibration="mse"`, `dry_run=True`, ...): the Python API."""
    return quantize(input, output, QuantizeOptions.parse(**options), progress)


def quantize(input: str | Path, output: str | Path | None, options: QuantizeOptions,
             progress: ProgressHook | None = None, blocks: BlockProgress | None = None) -> QuantizeReport:
    """Quantize a checkpoint into a burnpack file, or with `dry_run` only plan it.

    The plan is made from the headers and checked in full before any weight is read. The tensors then stream
    one at a time through the pipeline into the container, which is renamed onto `output` only once complete.
    An interruption or failure leaves `output` as it was; an interrupt during the rename takes effect after it,
    as `Interrupted`.

    The options (docs/cli.md says what each does):
    - `stats` reports each payload's error against the source, and `verify` checks it lies within its scheme's
      bound, then reads the complete files back before the rename (`qcli.measure`, `qcli.verify`). The
      pipeline decodes each payload once, on the device that holds it.
    - `max_shard_size` splits the output into `NAME-00001-of-0000N.bpk` files of at most that many bytes.
    - `burn_backend` stops the plan at every tensor that backend cannot load (`qcli.burn_backends`).
    - `requantize` dequantizes the tensors no Burn scheme holds (`qcli.formats.Encoded`) as their format does,
      and quantizes them into its preset; their `--stats` error is against the dequantized values.
    - With calibration data (`options.calibrating`) the model runs on it block by block before the write
      (`qcli.calibrate.session`; `blocks` hears of each block done). GPTQ's tensors are quantized there, and
      the mse search weighs each input channel by its activations.
    - `transpose` writes every Linear weight no recipe rule orients as `[in, out]` (`make_plan`).

    `Destination.of(input, output)` says where the run reads and writes (a model in the Hugging Face cache, a
    model folder). The report says how Burn loads the file (`BurnLoad`)."""
    where = Destination.of(input, output, options.revision)
    input, target, folder = where.input, where.target, where.folder
    force, dry_run, planned = options.force, options.dry_run, options.plan
    loaded_recipe = load_recipe(options.recipe) if options.recipe is not None else None
    if folder is not None:
        check_folder(folder, force)
    refuse_special(target, TARGET_HINT)  # a dry run refuses what the run would (docs/cli.md)
    if dry_run:
        require_device(options.device)
    if target.exists() and not force:
        raise UsageError(
            printable(f"{target} already exists"), hint="pass --force to replace it, or -o to write somewhere else"
        )
    with ExitStack() as stack:
        resume = stack.enter_context(collector_paused())
        source = stack.enter_context(open_source(input, options.names))
        checkpoint = Checkpoint.beside(input, source)
        reads = _reads(checkpoint.folder, source, options)
        reads.refuse_target(target, TARGET_HINT)
        found = detect(source.infos(), None if planned.requantize is None else source.load)
        gptq = Calibration.Gptq in (planned.calibration, *_rule_calibrations(loaded_recipe))
        reachable = _reachable(checkpoint) if gptq else ()
        chosen = None
        if planned.target is not None:
            _refuse_recipe_target(options, target, reads, force)
            chosen = _choose(checkpoint, source, loaded_recipe, options, found, reachable)
            loaded_recipe = chosen.recipe
        plan = make_checked_plan(source.infos(), loaded_recipe, planned, found=found, calibrated=reachable)
        # Torch loads from here, on a thread of its own, while the output is prepared: every refusal the
        # headers and the plan give has been made without it (its import alone takes seconds).
        runtime = None if dry_run else stack.enter_context(Runtime(options.device))
        copies = side_files(checkpoint.folder) if folder is not None and reader_of(input).side_files else []
        report = QuantizeReport(
            input=where.given,
            output=str(target),
            device=None,
            dry_run=dry_run,
            preset=planned.preset.name,
            burn_backend=None if planned.backend is None else planned.backend.value,
            burn_version=planned.burn_version,
            recipe=(str(options.write_recipe) if options.write_recipe is not None
                    else None if options.recipe is None else str(options.recipe)),
            recipe_sha256=None if loaded_recipe is None else loaded_recipe.sha256,
            source_files=[SourceFile(f.name, f.stat().st_size) for f in source.files],
            tensors=[TensorRow.of(e) for e in plan.entries],
            totals=plan.totals(),
            load=BurnLoad.of(plan, planned.burn_version),
            warnings=plan.warnings(),
            calibration=_calibration_record(plan, checkpoint, options),
            target=None if chosen is None else chosen.record(plan),
        )
        stats, verify = options.stats, options.verify
        if runtime is not None:
            runtime.warm(rest_of(plan, gptq_names(plan)), measure=stats or verify)
        recorded = options.record()
        record = folder_record(report, input, recorded)
        folder_output = None if folder is None else ModelFolder(folder, copies, record)
        outputs = Output(plan, target, options.max_shard_size, metadata(report, options.calibration_asked()),
                         folder_output)
        report.outputs = [str(path) for path in outputs.paths]
        report.warnings += outputs.prepare(reads, force=force, dry_run=dry_run)
        if report.target is not None:
            report.target.file_bytes_bound = size_bound(plan.container_entries(),
                                                        metadata(report, options.calibration_asked()))
        if dry_run:
            if chosen is not None:
                chosen.write(options.write_recipe)
            return report
        resume()
        requantizing = any(e.decision.requantize is not None for e in plan.entries)
        device = options.device
        assert runtime is not None, "a run that writes loads its runtime"
        report.device, run = runtime.select("cpu" if requantizing and device == "auto" else device)
        resident = _warm_runtime()
        calibrated: Calibrated | None = None
        if report.calibration is not None:
            from qcli.calibrate.session import calibrate

            calibrated = calibrate(plan, checkpoint, options.calibrating,
                                   "cpu" if report.device == "cpu" else "cuda", blocks)
            assert calibrated is not None, "the plan needs the calibration its record says"
            report.calibration, report.warnings = calibrated.record, report.warnings + calibrated.warnings
            run = with_prepared(run, calibrated.payloads, importance=calibrated.importance)
        report.tensors, report.timings = _write(plan, source, run, outputs, stats, progress, verify, report.warnings,
                                                reads, calibrated)
        report.memory = MemoryUse(resident, peak_resident_bytes())
        if chosen is not None:
            chosen.write(options.write_recipe)
    return report


RECIPE_HINT = "give --write-recipe another path"


def _refuse_recipe_target(options: QuantizeOptions, target: Path, reads: Reads, force: bool) -> None:
    """`--write-recipe`'s file refused as the model's own outputs are: a file the run reads, a special file,
    the model's output, or an existing file without --force."""
    path = options.write_recipe
    if path is None:
        return
    reads.refuse_target(path, RECIPE_HINT)
    if path.resolve() == target.resolve():
        raise UsageError(printable(f"--write-recipe {path} is the model's output"), hint=RECIPE_HINT)
    if path.exists() and not force:
        raise UsageError(printable(f"{path} already exists"), hint=f"pass --force to replace it, or {RECIPE_HINT}")


@dataclass
class _Chosen:
    """What a target chose: the recipe its plan is made with (the given one's rules, then one rule per
    chosen tensor), that recipe's text, and what the report says of it."""

    recipe: Recipe
    text: str
    target: Target
    choices: list[Choice]
    forms: list[str]
    sensitivity: str
    written: Path | None = None

    def record(self, plan: Plan) -> TargetRecord:
        return TargetRecord(self.target.bpw, self.target.size, achieved_bits(plan), self.forms, self.sensitivity,
                            groups(self.choices), {c.name: c.preset.name for c in self.choices},
                            None if self.written is None else str(self.written))

    def write(self, path: Path | None) -> None:
        if path is None:
            return
        with StagedFile(path, self.text.encode()) as staged:
            staged.commit()


def _choose(checkpoint: Checkpoint, source: Source, given: Recipe | None, options: QuantizeOptions, found: dict,
            reachable: frozenset[str] | tuple) -> _Chosen:
    """The forms `options.plan.target` chooses (`qcli.plan.target`): the plan of `given` and the default
    policy, the forms the backend loads, the budget refused where even the smallest forms overspend it,
    each free tensor's loss under each form (`qcli.sensitivity`, weighed by the importance matrix or the
    calibration text's activations where given), then the greedy allocation, as a recipe."""
    planned = options.plan
    target, backend, version = planned.target, planned.backend, planned.burn_version
    assert target is not None, "chosen for a run with a target"
    base = make_checked_plan(source.infos(), given, planned, found=found, calibrated=reachable)
    candidates = forms(backend, version, planned.calibration)
    choices = free_tensors(base, candidates, backend, version)
    estimate = {"source_files": json.dumps([SourceFile(f.name, f.stat().st_size).to_json() for f in source.files]),
                "transposed": json.dumps([e.name for e in base.entries if e.decision.transpose])}
    limit = budget(target, base, choices, estimate)
    where = backend_words(backend, version)
    check_budget(choices, limit, target, where)
    importance, sensitivity = _importance(checkpoint, options, choices)
    measure_losses(choices, source, importance)
    allocate(choices, limit, target, where)
    quantized = [e for e in base.entries if e.decision.scheme is not None]
    chosen_bytes = {c.name: c.nbytes[c.chosen] for c in choices}
    bits = 8 * sum(chosen_bytes.get(e.name, e.out_nbytes) for e in quantized)
    achieved = bits / limit.weights if limit.weights else 0.0
    base_text = None if options.recipe is None else options.recipe.read_bytes().decode("utf-8-sig")
    text = recipe_text(choices, target, achieved, base_text)
    name = str(options.write_recipe) if options.write_recipe is not None else f"<{target.given}>"
    recipe, faults = parse_recipe(text.encode(), name, options.write_recipe)
    if faults:
        raise RecipeError(f"the recipe {target.given} chose does not read back: {faults[0]}",
                          hint="a recipe given with a target must use [[rule]] tables, to which the chosen rules "
                          "are added")
    return _Chosen(recipe, text, target, choices, [p.name for p in candidates], sensitivity, options.write_recipe)


def _importance(checkpoint: Checkpoint, options: QuantizeOptions, choices: list[Choice]
                ) -> tuple[dict | None, str]:
    """What weighs each input channel's error: an importance matrix (`--imatrix`), the activations of the
    calibration text (`--calibration-data`, run here as `qcli imatrix` runs it), or nothing."""
    given = options.calibrating
    if given.imatrix is not None:
        from qcli.calibrate.importance import file_importance

        return file_importance(given.imatrix, checkpoint, [c.entry.info for c in choices]), "imatrix"
    if given.data is not None:
        from qcli.calibrate.importance import input_importance

        device = "cpu" if options.device == "cpu" else "auto"
        return input_importance(checkpoint, given, device), "calibration-data"
    return None, "weights"


def _reads(beside: Path, source: Source, options: QuantizeOptions) -> Reads:
    """Every file a quantize run reads: the checkpoint's, the files `beside` it, the recipe, the calibration
    text or importance matrix."""
    reads = Reads()
    reads.add_source(source)
    reads.extend(read_beside(beside), "a file beside the input that the run reads")
    for path, role in ((options.recipe, "the recipe"), (options.calibrating.data, "the calibration text"),
                       (options.calibrating.imatrix, "the importance matrix")):
        if path is not None:
            reads.add(path, role)
    return reads


def _rule_calibrations(recipe: Recipe | None) -> list[Calibration]:
    return [] if recipe is None else [r.calibration for r in recipe.rules if r.calibration is not None]


def _reachable(checkpoint: Checkpoint) -> frozenset[str]:
    """The tensors GPTQ can reach, from the model config.json describes (importing transformers)."""
    from qcli.calibrate.session import reachable

    return reachable(checkpoint)


def gptq_names(plan: Plan) -> frozenset[str]:
    """The entries GPTQ quantizes: the calibration run's, not the pipeline's."""
    return frozenset(e.name for e in plan.calibrated_by(Calibration.Gptq))


def _calibration_record(plan: Plan, checkpoint: Checkpoint, options: QuantizeOptions) -> CalibrationRecord | None:
    """What the run will calibrate on, with the dry run's memory estimate; None when nothing is calibrated."""
    given = options.calibrating
    weighed = given.data is not None or given.imatrix is not None
    gptq = bool(plan.calibrated_by(Calibration.Gptq))
    searched = weighed and bool(plan.calibrated_by(Calibration.Mse))
    measured = [] if given.data is None else plan.codec_calibrated()  # their output error only
    if not gptq and not searched and not measured:
        return None
    if given.data is None:
        from qcli.io.imatrix import read_imatrix

        assert given.imatrix is not None, "the importance comes from calibration data or an imatrix"
        read_imatrix(given.imatrix)  # its faults refused here, a dry run's too
        return CalibrationRecord("mse", str(given.imatrix), file_sha256(given.imatrix))
    from qcli.calibrate.data import read_calibration_text
    from qcli.calibrate.session import codec_method, estimate

    text = read_calibration_text(given.data)  # its faults refused here, a dry run's too
    return CalibrationRecord("gptq" if gptq else "mse" if searched else codec_method(measured), str(given.data),
                             text.sha256,
                             samples=given.samples, seq_len=given.seq_len, seed=given.seed,
                             memory_estimate_bytes=estimate(checkpoint, given, gptq))


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
    reads: Reads,
    calibrated: Calibrated | None = None,
) -> tuple[list[TensorRow], Timings]:
    """Stream the pipeline's payloads into the output files, time each phase, and report each quantized
    tensor's measurement by the pipeline (its error with `stats`, its bound check with `verify`, and into
    `warnings` the blocks whose scale left its dtype's range).

    With `verify`, the complete files are then read back (`qcli.verify.read_back`) before they are
    renamed into place, as they are only once no file the run `reads` changed since it was opened.
    `calibrated`: the calibration run before, its time and each tensor's output error.
    """
    total = sum(e.info.nbytes for e in plan.entries)
    timings, rows, done = Timings(verify=Phase() if verify else None), [], 0
    output_errors = {} if calibrated is None else calibrated.errors
    if calibrated is not None:
        timings.calibrate = Phase(calibrated.seconds, calibrated.bytes)
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
            rows.append(TensorRow.of(entry, error, output_errors.get(entry.name)))
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
        reads.unchanged()
        tick = time.perf_counter()
        out.commit()
        timings.write.seconds += time.perf_counter() - tick
    timings.total_seconds = time.perf_counter() - started + (0.0 if calibrated is None else calibrated.seconds)
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
    """A quantized tensor's measurement read back (`qcli.measure`): its error with `stats`, and with
    `timings.verify` set its bound check, raising `OutputError` for a block over the bound.

    It also warns of blocks whose scale its scale dtype cannot hold (`Measurement.range_loss`). The pipeline ran
    the decode; the host time it spent there (`Measurement.seconds`) moves from the quantize phase to the stats
    phase, with the time taken here to read the results back."""
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
            scheme = entry.decision.scheme
            assert scheme is not None, "a measured tensor is a quantized one"
            raise out_of_bound(failure, scheme, entry.name, target)
    return error
