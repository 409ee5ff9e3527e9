"""The functions the commands call: `quantize_file`, `inspect_file`, `validate_scheme`.

Each returns a report (`qcli.report`) or raises a `QcliError`; the CLI only parses and renders. They are
usable from Python as they are. torch is imported inside the functions that touch tensors.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import signal
import struct
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qcli import BURN_VERSION, __version__
from qcli.burn_backends import BURN_VERSIONS, BurnBackend
from qcli.errors import InputError, Interrupted, OutputError, PlanError, UsageError
from qcli.io.dtypes import TORCH_DTYPE_NAMES, dtype_str
from qcli.io.safetensors import NOT_REGULAR_HINT, not_regular_problem, printable
from qcli.report import (
    CompareReport,
    CompareRow,
    ErrorRow,
    InspectReport,
    ListedTensor,
    MemoryUse,
    Phase,
    QuantizeReport,
    SourceFile,
    TensorRow,
    TensorStats,
    Timings,
    ValidateReport,
    value_stats,
)
from qcli.resident import peak_resident_bytes, resident_bytes
from qcli.scheme import QuantScheme

if TYPE_CHECKING:
    import torch

    from qcli.measure import Measurement
    from qcli.plan import Plan
    from qcli.presets import Preset

DEVICES = ("auto", "cpu", "cuda")
INDEX_SUFFIX = ".safetensors.index.json"

# Called after each tensor with the next tensor's name (None when done), bytes read so far and in total.
ProgressHook = Callable[[str | None, int, int], None]


def default_output(input: Path) -> Path:
    """`x.safetensors` -> `x.bpk`; a directory `d` -> `d.bpk` beside it; an index -> its folder's `.bpk`."""
    if input.is_dir():
        return input.parent / f"{input.resolve().name}.bpk"
    if input.name.endswith(INDEX_SUFFIX):
        folder = input.resolve().parent
        return folder.parent / f"{folder.name}.bpk"
    return input.with_suffix(".bpk")


def _same_file(a: Path, b: Path) -> bool:
    """The same path after links, or the same inode (a hard link)."""
    try:
        if a.resolve() == b.resolve():
            return True
    except (OSError, RuntimeError):
        pass
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


def _refuse_input_as_output(output: Path, inputs: list[tuple[Path, str]]) -> None:
    """UsageError when `output` is one of the files the run reads (`(path, what it is)` pairs)."""
    for path, role in inputs:
        if _same_file(output, path):
            raise UsageError(printable(f"{output} is {role}"), hint="write the .bpk somewhere else with -o; "
                             "nothing was written")


def _refuse_special_output(output: Path) -> None:
    """UsageError when `output` exists and is not a regular file: --force replaces a file, never a device,
    a FIFO, a socket or a directory."""
    kind = not_regular_problem(output)
    if kind is not None:
        raise UsageError(printable(f"{output} is not a regular file ({kind}); qcli writes a new file or "
                                   "replaces a regular one"),
                         hint="give -o the path of a .bpk file; --force replaces only regular files")


def resolve_preset(name: str | None) -> Preset:
    """The preset `--scheme` names (any case), or the default; codebook and zero-point names are refused."""
    from qcli.presets import DEFAULT_PRESET, get_preset

    return get_preset(DEFAULT_PRESET if name is None else name)


def resolve_backend(name: str | None) -> BurnBackend | None:
    """The Burn backend `--burn-backend` names, or None for the common backends."""
    if name is None:
        return None
    try:
        return BurnBackend(name.lower())
    except ValueError:
        raise UsageError(f"unknown Burn backend {name!r}",
                         hint=f"use one of {', '.join(BurnBackend)} (docs/output.md says what each loads)") from None


def resolve_version(name: str | None) -> str:
    """The Burn release `--burn-version` names (`0.21` or `0.21.0`), or the newest stable one qcli targets."""
    if name is None:
        return BURN_VERSION
    chosen = [v for v in BURN_VERSIONS if name.strip() in (v, v.rsplit(".", 1)[0])]
    if not chosen:
        raise UsageError(f"Burn {name!r} is not a release qcli writes for",
                         hint=f"use one of {', '.join(BURN_VERSIONS)} (the default is {BURN_VERSION})")
    return chosen[0]


def make_checked_plan(infos: list, recipe: Any, preset: Preset, split: bool = False,
                      backend: BurnBackend | None = None, burn_version: str = BURN_VERSION) -> Plan:
    """The plan for `infos` in name order (so shards and one file give the same output); every error is
    raised together as one PlanError. `split`: the output will be cut into several files; `backend` and
    `burn_version`: the Burn backend and release the file must load on."""
    from qcli.plan import make_plan

    plan = make_plan(sorted(infos, key=lambda i: i.name), recipe, preset, split=split, backend=backend,
                     burn_version=burn_version)
    plan.raise_if_errors()
    return plan


def select_pipeline(device: str) -> tuple[str, Callable[..., Iterator]]:
    """`(device, run)`: auto is cuda when torch sees a GPU; QCLI_KERNELS=triton forces the GPU path."""
    if device not in DEVICES:
        raise UsageError(f"unknown device {device!r}", hint="use --device auto, cpu or cuda")
    if os.environ.get("QCLI_KERNELS") == "triton":
        device = "triton"
    else:
        import torch

        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        elif device == "cuda" and not torch.cuda.is_available():
            raise UsageError(
                "--device cuda: torch sees no CUDA device",
                hint="use --device cpu (or auto), or install a CUDA build of torch before qcli",
            )
    if device == "cpu":
        from qcli.pipeline import run

        return device, run
    try:
        from qcli.gpu.pipeline import run as gpu_run
    except ImportError as exc:
        raise UsageError(
            f"the GPU pipeline is unavailable: {exc}", hint="use --device cpu, or install qcli with triton"
        ) from None
    return device, gpu_run


class _TimedSource:
    """A source that times `load` per tensor, so the CPU pipeline's read time can be told from its compute
    (the GPU pipeline reads the files itself)."""

    def __init__(self, source: Any, seconds_by_name: dict[str, float]) -> None:
        self._source = source
        self._seconds = seconds_by_name

    def load(self, name: str) -> torch.Tensor:
        start = time.perf_counter()
        t = self._source.load(name)
        self._seconds[name] = self._seconds.get(name, 0.0) + time.perf_counter() - start
        return t

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._source, attr)


def quantize_file(
    input: str | Path,
    output: str | Path | None = None,
    *,
    scheme: str | None = None,
    recipe: str | Path | None = None,
    device: str = "auto",
    dry_run: bool = False,
    force: bool = False,
    stats: bool = True,
    progress: ProgressHook | None = None,
    verify: bool = True,
    max_shard_size: int | None = None,
    burn_backend: str | None = None,
    burn_version: str | None = None,
) -> QuantizeReport:
    """Quantize a safetensors checkpoint into a burnpack file (or, with `dry_run`, only plan it).

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
    the Burn release to write for (default: the newest stable one, `qcli.BURN_VERSION`).
    """
    from qcli.io.safetensors import SafetensorsSource
    from qcli.recipe import load_recipe

    input = Path(input)
    preset = resolve_preset(scheme)
    backend = resolve_backend(burn_backend)
    version = resolve_version(burn_version)
    loaded_recipe = load_recipe(recipe) if recipe is not None else None
    target = Path(output) if output is not None else default_output(input)
    _refuse_special_output(target)  # a dry run refuses what the run would (docs/cli.md)
    if target.exists() and not force:
        raise UsageError(
            printable(f"{target} already exists"), hint="pass --force to replace it, or -o to write somewhere else"
        )
    with SafetensorsSource.open(input) as source:
        inputs = [(input, "the input"), *((f, "the input") for f in source.files)]
        if source.index is not None:
            inputs.append((source.index, "the input's index"))
        if recipe is not None:
            inputs.append((Path(recipe), "the recipe"))
        _refuse_input_as_output(target, inputs)
        plan = make_checked_plan(source.infos(), loaded_recipe, preset, split=max_shard_size is not None,
                                 backend=backend, burn_version=version)
        report = QuantizeReport(
            input=str(input),
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
        metadata = _metadata(report)
        from qcli.io.burnpack_index import index_path

        shards = _shards(plan, target, max_shard_size, metadata)
        files = [path for path, _ in shards] + ([index_path(target)] if len(shards) > 1 else [])
        report.outputs = [str(path) for path in files]
        for path in files if len(shards) > 1 else []:  # one file is `target`, checked above
            _refuse_input_as_output(path, inputs)
        report.warnings += _leftovers(files, remove=not dry_run)
        for path in files:
            _refuse_special_output(path)
            if not path.parent.is_dir():
                raise OutputError(printable(f"cannot write {path}: its folder {path.parent} does not exist"),
                                  hint="create the folder, or give -o a path in an existing one; nothing was written")
        taken = [path for path in files if path.exists()] if len(shards) > 1 and not force else []
        if taken:
            raise UsageError(f"{taken[0]} already exists", hint="pass --force to replace the files, or -o "
                             "to write somewhere else")
        if dry_run:
            return report
        report.device, run = select_pipeline(device)
        runtime = _warm_runtime()
        index = files[-1] if len(shards) > 1 else None
        report.tensors, report.timings = _write(plan, source, run, shards, metadata, stats, progress, verify, index)
        report.memory = MemoryUse(runtime, peak_resident_bytes())
    return report


def _warm_runtime() -> int:
    """Load and warm the pipelines' runtime (torch, its thread pool), so that its memory is counted apart
    from the tensors', and return the resident bytes then."""
    import torch

    torch.ones(1 << 20).sum()  # a parallel op: the worker threads and their stacks exist from here on
    return resident_bytes()


def _leftovers(files: list[Path], *, remove: bool) -> list:
    """A warning for each temporary file a killed run writing one of these outputs left beside it, removed
    when `remove` (the run about to write; a dry run only says so)."""
    from qcli.io.burnpack import leftover_temporaries
    from qcli.problem import Kind, Problem, Severity

    warnings = []
    for target in files:
        for path, pid in leftover_temporaries(target):
            if remove:
                try:
                    path.unlink(missing_ok=True)
                except OSError as exc:
                    raise OutputError(printable(f"cannot remove {path}, left by an interrupted run: "
                                                f"{exc.strerror or exc}"), hint="remove it by hand") from None
            verb = "removed" if remove else "would remove"
            warnings.append(Problem(Kind.leftover, printable(f"{verb} {path.name}: a temporary file process {pid} "
                                                          f"left writing {target.name} when it was killed"),
                                    "nothing to do: an interrupted run leaves its temporary file behind only "
                                    "when it is killed (SIGKILL, power loss)", Severity.warning))
    return warnings


def parse_size(text: str) -> int:
    """Bytes from `50GB`, `500MiB`, `1.5TB` or a plain count (decimal units, binary with `i`)."""
    number = text.strip().upper().removesuffix("B")
    scale = 1
    for i, prefix in enumerate("KMGT", start=1):
        if number.endswith(prefix + "I"):
            number, scale = number[:-2], 1024**i
        elif number.endswith(prefix):
            number, scale = number[:-1], 1000**i
    try:
        value = float(number) * scale
        size = int(value) if math.isfinite(value) else 0  # inf, nan, 1e400: no size
    except (ValueError, OverflowError):
        size = 0
    if size <= 0:
        raise UsageError(f"--max-shard-size {text!r} is not a size",
                         hint="give a byte count, e.g. 50GB, 500MiB or 2e9")
    return size


def shard_paths(target: Path, count: int) -> list[Path]:
    """`target` itself for one file, else `NAME-00001-of-0000N.bpk` beside it."""
    if count == 1:
        return [target]
    name = f"{target.stem}-{{:05d}}-of-{count:05d}{target.suffix}"
    return [target.with_name(name.format(i)) for i in range(1, count + 1)]


def _shards(plan: Plan, target: Path, max_shard_size: int | None, metadata: dict[str, str]) -> list[tuple]:
    """`(path, entries)` per output file: one file under Burn's 100 GiB limit, or the split asked for."""
    from qcli.io.burnpack import MAX_FILE_SIZE, TensorEntry, size_bound, split

    entries = [TensorEntry(e.info.name, e.out_dtype, tuple(e.out_shape), e.out_nbytes) for e in plan.entries]
    limit = f"Burn's reader refuses files over {MAX_FILE_SIZE} bytes (100 GiB)"
    if max_shard_size is None:
        size = size_bound(entries, metadata)
        if size > MAX_FILE_SIZE:
            raise PlanError(f"the output would take up to {size / 1024**3:.1f} GiB, over Burn's 100 GiB "
                            "file limit", hint=f"{limit}; split it with --max-shard-size 50GB")
        return [(target, entries)]
    if max_shard_size > MAX_FILE_SIZE:
        raise UsageError(f"--max-shard-size {max_shard_size} is over Burn's 100 GiB file limit",
                         hint=f"{limit}; give at most 100GiB")
    try:
        packs = split(entries, max_shard_size, metadata)
    except ValueError as exc:
        raise UsageError(f"--max-shard-size {max_shard_size}: {exc}",
                         hint="every tensor is written whole; give a larger size") from None
    return list(zip(shard_paths(target, len(packs)), packs, strict=True))


def _metadata(report: QuantizeReport) -> dict[str, str]:
    """The burnpack metadata map (docs/output.md)."""
    meta = {
        "format": "burnpack",
        "producer": "qcli",
        "producer_version": __version__,
        "burn_version": report.burn_version,
        **({} if report.burn_backend is None else {"burn_backend": report.burn_backend}),
        "source_files": json.dumps([f.to_json() for f in report.source_files]),
        "preset": report.preset,
        "transposed": json.dumps([t.name for t in report.tensors if t.transposed]),
    }
    if report.recipe_sha256 is not None:
        meta["recipe_sha256"] = report.recipe_sha256
    return meta


def _write(
    plan: Plan,
    source: Any,
    run: Callable[..., Iterator],
    shards: list[tuple],
    metadata: dict[str, str],
    stats: bool,
    progress: ProgressHook | None,
    verify: bool,
    index: Path | None = None,
) -> tuple[list[TensorRow], Timings]:
    """Stream the pipeline's payloads into the containers, time each phase, and report each quantized
    tensor's measurement by the pipeline (its error with `stats`, its bound check with `verify`).
    Several shards get an `index` (`qcli.io.burnpack_index`), put in place with them.

    With `verify`, the complete files are then read back (`qcli.verify.read_back`) before they are
    renamed into place.
    """
    from qcli.io.burnpack import BurnpackWriter
    from qcli.io.burnpack_index import IndexWriter

    shard_of = {entry.name: i for i, (_, entries) in enumerate(shards) for entry in entries}
    total = sum(e.info.nbytes for e in plan.entries)
    load_seconds: dict[str, float] = {}
    timed = _TimedSource(source, load_seconds)
    timings, rows, done = Timings(verify=Phase() if verify else None), [], 0
    started = time.perf_counter()
    if progress:
        progress(plan.entries[0].info.name if plan.entries else None, 0, total)
    with ExitStack() as stack:
        writers = [stack.enter_context(BurnpackWriter(path, entries, metadata, digests=verify))
                   for path, entries in shards]
        index_writers = [stack.enter_context(IndexWriter(index, shards, metadata))] if index else []
        tick = time.perf_counter()
        payloads = run(plan, timed, measure=stats or verify)
        for i, (entry, payload, measured) in enumerate(_naming_files(plan, payloads)):
            name = entry.info.name
            produced = time.perf_counter() - tick
            read = load_seconds.get(name, 0.0)
            timings.read.seconds += read
            timings.read.bytes += entry.info.nbytes
            timings.quantize.seconds += max(produced - read, 0.0)
            timings.quantize.bytes += entry.info.nbytes

            tick = time.perf_counter()
            writer = writers[shard_of[name]]
            writer.write(name, payload)
            timings.write.seconds += time.perf_counter() - tick
            timings.write.bytes += entry.out_nbytes

            error = _reported(entry, measured, writer.target, stats, timings) if measured is not None else None
            rows.append(TensorRow.of(entry, error))
            del payload

            done += entry.info.nbytes
            if progress:
                following = plan.entries[i + 1].info.name if i + 1 < len(plan.entries) else None
                progress(following, done, total)
            tick = time.perf_counter()
        tick = time.perf_counter()
        files = [writer.finish() for writer in writers]
        timings.write.seconds += time.perf_counter() - tick
        if timings.verify is not None:
            from qcli.verify import read_back

            digests = {name: d for writer in writers for name, d in (writer.digests or {}).items()}
            inputs = [info.name for info in source.infos()]
            verified = read_back(files, plan, inputs, digests, [writer.target for writer in writers])
            timings.verify.seconds += verified.seconds
            timings.verify.bytes += verified.bytes
        tick = time.perf_counter()
        _commit_all(writers + index_writers)
        timings.write.seconds += time.perf_counter() - tick
    timings.total_seconds = time.perf_counter() - started
    return rows, timings


def _naming_files(plan: Plan, payloads: Iterator) -> Iterator:
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


def _commit_all(writers: list) -> None:
    """Rename every file into place; if one fails, the ones already renamed are removed again.

    This is the commit point: SIGINT and SIGTERM are held back across it, so an interrupt lands either
    before (nothing written, exit 130) or after it, as `Interrupted` saying the output was written.
    """
    done = []
    with _interrupts_held() as held:
        try:
            for writer in writers:
                writer.commit()
                done.append(writer.target)
        except BaseException:
            for path in done:
                path.unlink(missing_ok=True)
            raise
    if held:
        raise Interrupted(
            f"interrupted after the output was written: {', '.join(map(str, done))} is complete",
            hint="the run had finished when the interrupt arrived; the output can be used as it is",
        )


@contextmanager
def _interrupts_held() -> Iterator[list[int]]:
    """The signals SIGINT and SIGTERM that arrive inside the block, recorded instead of raised (those the
    process ignored before are dropped).

    A Python-level handler rather than a signal mask: the mask is per thread, and torch's threads
    would still take the signal. Outside the main thread handlers cannot change, and nothing is held.
    """
    held: list[int] = []
    try:
        previous = {signum: signal.signal(signum, lambda n, _: held.append(n))
                    for signum in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:
        yield held
        return
    try:
        yield held
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        held[:] = [signum for signum in held if previous[signum] is not signal.SIG_IGN]


def _reported(entry: Any, measured: Measurement, target: Path, stats: bool, timings: Timings) -> ErrorRow | None:
    """A quantized tensor's measurement (`qcli.measure`), read back: its error with `stats`, and with
    `timings.verify` set its bound check, raising `OutputError` for a block over the bound.

    The decode and measuring ran in the pipeline: the host time it spent on them (`Measurement.seconds`:
    all of it on the CPU; on a GPU the launches, the work itself overlapping the stream) moves from the
    quantize phase to the stats phase, with the time taken to read the results back."""
    from qcli.verify import out_of_bound

    tick = time.perf_counter()
    error = ErrorRow.of(measured.stats()) if stats else None
    timings.quantize.seconds = max(timings.quantize.seconds - measured.seconds, 0.0)
    timings.stats.seconds += measured.seconds + time.perf_counter() - tick
    timings.stats.bytes += entry.info.nbytes
    if timings.verify is not None:
        tick = time.perf_counter()
        failure = measured.failure()
        timings.verify.seconds += time.perf_counter() - tick
        if failure is not None:
            raise out_of_bound(failure, entry.decision.scheme, entry.info.name, target)
    return error


# ----------------------------------------------------------------------------- inspect

def qfloat_scheme(dtype: Any) -> QuantScheme | None:
    """The scheme of a `{"QFloat": …}` Burn DType (serde form, as the reader gives it); None otherwise."""
    if isinstance(dtype, dict) and "QFloat" in dtype:
        return QuantScheme.from_serde(dtype["QFloat"])
    return None


def _dtype_key(dtype: Any) -> str:
    """The plain name of a non-QFloat dtype, Burn's or safetensors' spelling (`{"Bool": …}` -> BOOL)."""
    if isinstance(dtype, dict):
        return "BOOL" if "Bool" in dtype else dtype_str(dtype)
    return str(dtype).upper()


def _tensor_from_bytes(data: Any, dtype: Any, shape: tuple[int, ...]) -> torch.Tensor:
    import torch

    key = _dtype_key(dtype)
    if key not in TORCH_DTYPE_NAMES:
        raise UsageError(
            f"qcli cannot decode dtype {dtype_str(dtype)}", hint="inspect lists it without --tensor"
        )
    if key == "BOOL":
        # Burn's Bool(U32) holds a u32 per element, Bool(Native|U8) and safetensors' BOOL a byte; any
        # nonzero element is true (a torch bool read from a byte other than 0 or 1 is undefined).
        store = dtype.get("Bool") if isinstance(dtype, dict) else None
        if math.prod(shape) == 0:
            return torch.empty(shape, dtype=torch.bool)
        raw = torch.int32 if store == "U32" else torch.uint8
        return torch.frombuffer(bytearray(data), dtype=raw).reshape(shape).ne(0)
    t = getattr(torch, TORCH_DTYPE_NAMES[key])
    if math.prod(shape) == 0:
        return torch.empty(shape, dtype=t)
    return torch.frombuffer(bytearray(data), dtype=t).reshape(shape)


def _decoded(data: Any, dtype: Any, shape: tuple[int, ...]) -> torch.Tensor:
    """A burnpack tensor's values: a QFloat decoded to f32, anything else reinterpreted."""
    scheme = qfloat_scheme(dtype)
    if scheme is None:
        return _tensor_from_bytes(data, dtype, shape)
    from qcli.codec import decode

    return decode(data, scheme, shape)


def _scale_stats(data: Any, scheme: QuantScheme, shape: tuple[int, ...]) -> tuple[Any, float | None]:
    """Statistics of the stored (innermost) scales and the f32 global of a two-level scheme; called after
    `decode` accepted the scheme, so its scales are ones the codec unpacks."""
    from qcli import layout
    from qcli.codec.decode import as_bytes
    from qcli.codec.pack import unpack_scales

    start = layout.value_bytes(scheme, shape)
    end = start + layout.scale_bytes(scheme, shape)
    scales = unpack_scales(as_bytes(data[start:end]), scheme.scale_dtype())
    global_scale = struct.unpack_from("<f", data, end)[0] if scheme.is_two_level() else None
    return value_stats(scales), global_scale


def _suggest_tensor(name: str, names: list[str]) -> UsageError:
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.5)
    return UsageError(
        f"no tensor named {name!r}" + (f"; did you mean {close[0]!r}?" if close else ""),
        hint="`qcli inspect FILE` lists the tensor names",
    )


def _is_burnpack(path: Path) -> bool:
    """By its extension (the index of sharded output too), or by burnpack's magic number at the start."""
    from qcli.io.burnpack import EXTENSION, MAGIC_NUMBER
    from qcli.io.burnpack_index import standing_index

    if standing_index(path) is not None:
        return True
    if path.suffix == EXTENSION:
        return True
    if not path.is_file():
        return False
    with path.open("rb") as f:
        return f.read(4) == struct.pack("<I", MAGIC_NUMBER)


def inspect_file(
    path: str | Path, *, tensor: str | None = None, compare: str | Path | None = None
) -> InspectReport:
    """List a safetensors checkpoint or a burnpack file; optionally one tensor's statistics, or a comparison
    of a burnpack file against its source."""
    path = Path(path)
    if _is_burnpack(path):
        return _inspect_burnpack(path, tensor, compare)
    if compare is not None:
        raise UsageError(
            "--compare checks a .bpk against its source", hint="run `qcli inspect OUTPUT.bpk --compare INPUT`"
        )
    from qcli.io.safetensors import SafetensorsSource

    with SafetensorsSource.open(path) as source:
        infos = source.infos()
        report = InspectReport(
            path=str(path),
            format="safetensors",
            files=[SourceFile(f.name, f.stat().st_size) for f in source.files],
            tensors=[ListedTensor(i.name, i.dtype, i.dtype, tuple(i.shape), i.nbytes) for i in infos],
        )
        if tensor is not None:
            if tensor not in {i.name for i in infos}:
                raise _suggest_tensor(tensor, [i.name for i in infos])
            report.tensor_stats = TensorStats(tensor, value_stats(source.load(tensor)), None, None)
    return report


def _inspect_burnpack(path: Path, tensor: str | None, compare: str | Path | None) -> InspectReport:
    """One burnpack file, or through its index (`qcli.io.burnpack_index`) every shard of sharded output."""
    from qcli.io.burnpack_index import BurnpackSet

    reader = BurnpackSet.open(path)
    entries = reader.entries()
    report = InspectReport(
        path=str(path),
        format="burnpack",
        files=[SourceFile(r.path.name, r.path.stat().st_size) for r in reader.readers],
        tensors=[
            ListedTensor(e.name, dtype_str(e.dtype), e.dtype, tuple(e.shape), e.nbytes)
            for e in entries
        ],
        version=reader.version,
        metadata=dict(reader.metadata),
    )
    if tensor is not None:
        by_name = {e.name: e for e in entries}
        if tensor not in by_name:
            raise _suggest_tensor(tensor, list(by_name))
        entry = by_name[tensor]
        data = reader.read(tensor)
        values = value_stats(_decoded(data, entry.dtype, tuple(entry.shape)))
        scheme = qfloat_scheme(entry.dtype)
        scales, global_scale = _scale_stats(data, scheme, tuple(entry.shape)) if scheme else (None, None)
        report.tensor_stats = TensorStats(tensor, values, scales, global_scale)
    if compare is not None:
        report.compare = _compare(reader, entries, Path(compare))
    return report


def _compare(reader: Any, entries: list, source_path: Path) -> CompareReport:
    """Each written tensor against its source: kept ones must be byte-identical (to the source cast to the
    written dtype, for a kept tensor a recipe's cast wrote in another floating dtype), quantized ones
    measured."""
    import torch

    from qcli.codec import error_stats
    from qcli.io.safetensors import SafetensorsSource
    from qcli.plan import FLOAT_DTYPES

    try:
        transposed = json.loads(reader.metadata.get("transposed", "[]"))
    except json.JSONDecodeError:
        transposed = None
    if not isinstance(transposed, list) or not all(isinstance(n, str) for n in transposed):
        raise InputError(
            f"{reader.path}: metadata 'transposed' is not a JSON list of tensor names",
            hint="the file was not written by qcli, or was edited; write it again from its source",
        )
    rows: list[CompareRow] = []
    with SafetensorsSource.open(source_path) as source:
        infos = {i.name: i for i in source.infos()}
        written = {e.name for e in entries}
        for e in entries:
            if e.name not in infos:
                continue
            x = source.load(e.name)
            flip = e.name in transposed
            if flip:
                x = x.t()
            text = dtype_str(e.dtype)
            if tuple(x.shape) != tuple(e.shape):
                src = "the transposed source" if flip else "the source"
                problem = f"shape {list(e.shape)} but {src} is {list(x.shape)}"
                rows.append(CompareRow(e.name, text, flip, False, None, problem))
                continue
            data = reader.read(e.name)
            scheme = qfloat_scheme(e.dtype)
            if scheme is None:
                written_as, source_dtype = _dtype_key(e.dtype), infos[e.name].dtype
                cast = written_as != source_dtype and {written_as, source_dtype} <= set(FLOAT_DTYPES)
                if cast:
                    from qcli.pipeline import cast_kept

                    try:
                        x = cast_kept(x, written_as, e.name)
                    except InputError:
                        x = x.to(getattr(torch, TORCH_DTYPE_NAMES[written_as]))  # the difference shows below
                exact = bytes(data) == x.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
                problem = None if exact else (f"a kept tensor differs from its source cast to {written_as}" if cast
                                              else "a kept tensor differs from its source")
                error = ErrorRow(0.0, math.inf, 0.0) if exact else None
                rows.append(CompareRow(e.name, text, flip, exact, error, problem))
                continue
            x = x.contiguous()
            decoded = _decoded(data, e.dtype, tuple(e.shape))
            error = ErrorRow.of(error_stats(x, decoded))
            block, block_error, bound = _judged(x, decoded, data, scheme)
            problem = None if block is None or block_error <= bound else (
                f"block {block} is {block_error:.3g} off, over its bound {bound:.3g}")
            rows.append(CompareRow(e.name, text, flip, error.max_abs == 0.0, error, problem,
                                   block, block_error, bound))
    return CompareReport(
        source=str(source_path),
        rows=rows,
        missing=sorted(set(infos) - written),
        extra=sorted(written - set(infos)),
    )


def _judged(x: torch.Tensor, decoded: torch.Tensor, data: Any, scheme: QuantScheme
            ) -> tuple[int | None, float, float]:
    """A quantized tensor's worst block against its scheme's bound: (flat block index, its max |error|, its
    bound), the first block over its bound if any is (NaN counts as over); (None, 0, 0) without a block.

    The bound per block is the smaller of the one the payload's stored scales give (`stored_bound`) and the
    one the source alone gives (`error_bound`, under AbsMean: the looser calibration, since the file does
    not record which one was used), so neither other data under the right scales nor inflated scales pass.
    """
    import torch

    from qcli.measure import block_errors, error_bound, stored_bound
    from qcli.scheme import Calibration

    errors = block_errors(x, decoded, scheme).reshape(-1)
    if not errors.numel():
        return None, 0.0, 0.0
    bounds = torch.minimum(stored_bound(x, data, scheme), error_bound(x, scheme, Calibration.AbsMean)).reshape(-1)
    over = ~(errors <= bounds)
    ratio = torch.where(over, math.inf, torch.nan_to_num(errors / bounds, nan=0.0, posinf=math.inf))
    worst = int(ratio.argmax())
    return worst, float(errors[worst]), float(bounds[worst])


# ----------------------------------------------------------------------------- validate-scheme


def validate_scheme(
    recipes: str | Path | Sequence[str | Path], *, model: str | Path | None = None, scheme: str | None = None,
    burn_backend: str | None = None,
    burn_version: str | None = None,
) -> ValidateReport:
    """Every problem in each recipe, and with `model` every problem of the plan each makes from headers;
    with `burn_backend`, every scheme that Burn backend cannot load."""
    from qcli import validate

    paths = [Path(recipes)] if isinstance(recipes, (str, Path)) else [Path(r) for r in recipes]
    for path in paths:
        kind = not_regular_problem(path)
        if kind is not None:
            raise UsageError(
                printable(f"cannot read recipe {path}: not a regular file ({kind})"),
                hint=NOT_REGULAR_HINT,
            )
        if not path.is_file():
            raise UsageError(
                printable(f"cannot read recipe {path}: no such file"),
                hint="pass the path of a TOML recipe (docs/recipes.md)",
            )
    infos = None
    if model is not None:
        from qcli.io.safetensors import SafetensorsSource

        with SafetensorsSource.open(Path(model)) as source:
            infos = source.infos()
    preset = resolve_preset(scheme)
    backend = resolve_backend(burn_backend)
    version = resolve_version(burn_version)
    problems = [p for path in paths for p in validate.validate_scheme(path, infos, preset, backend, version)]
    return ValidateReport([str(p) for p in paths], None if model is None else str(model), problems)
