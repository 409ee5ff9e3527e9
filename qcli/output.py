"""The files a quantize run writes: the one place that chooses the container, keeps its limits and shards it.

The container is Burn's burnpack (`qcli.io.burnpack`, which names Burn's limits): one file under Burn's file
limit, or with `--max-shard-size` shards beside the target (`split`) and their index (`qcli.io.burnpack_index`).
A model folder (`-o DIR/`) holds them as
`model.bpk`, beside the source's config and tokenizer files and a record of the run (`ModelFolder`). The
files are written beside their targets under temporary names, read back (`qcli.verify`) and renamed into
place together at one commit point; until then the targets are untouched.
"""

from __future__ import annotations

import json
import os
import re
import signal
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from qcli import __version__
from qcli.errors import InputError, Interrupted, OutputError, PlanError, UsageError
from qcli.formats.declaration import SIDE_FILES as DECLARATIONS
from qcli.io.burnpack import (
    GIB,
    MAX_TENSOR_COUNT,
    BurnpackWriter,
    TensorEntry,
    entry_bound,
    fixed_bound,
    gib,
    max_file_size,
    metadata_json,
    size_bound,
)
from qcli.io.burnpack_index import IndexWriter, index_path
from qcli.io.files import load_json
from qcli.io.reads import Reads
from qcli.io.staged import StagedFile
from qcli.io.temporary import left_by_killed_run, leftover_temporaries
from qcli.plan.entries import Plan
from qcli.problem import Kind, Problem, Severity
from qcli.text import printable
from qcli.verify import Verified, read_back

if TYPE_CHECKING:
    from qcli.report.quantize import QuantizeReport

INDEX_SUFFIX = ".safetensors.index.json"  # a sharded safetensors checkpoint's index
MODEL_FILE = "model.bpk"  # a model folder's weights (or the name its shards and index take)
RECORD_FILE = "qcli.json"  # a model folder's record of the run (docs/output.md)
# What a Burn user needs beside the weights to build and run the model, copied from the source's folder
# unchanged where it has them: Hugging Face's config files, the tokenizer files transformers reads and writes
# (tokenization_utils_base's, and the vocabularies of the Llama, GPT-2, BERT and T5 families), and the chat
# template (transformers' `chat_template.jinja`, or the older `chat_template.json`).
SIDE_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
              "special_tokens_map.json", "added_tokens.json", "tokenizer.model", "spiece.model", "vocab.txt",
              "vocab.json", "merges.txt", "chat_template.jinja", "chat_template.json")
# The names of the weights qcli writes into a model folder: MODEL_FILE, its shards and their index.
_OWN_WEIGHTS = re.compile(r"model(-\d{5,}-of-\d{5,})?\.bpk|model\.bpk\.index\.json")
TARGET_HINT = "give -o another path"


def default_output(input: Path) -> Path:
    """`x.safetensors` -> `x.bpk`; a directory `d` -> `d.bpk` beside it; an index -> its folder's `.bpk`."""
    if input.is_dir():
        return input.parent / f"{input.resolve().name}.bpk"
    if input.name.endswith(INDEX_SUFFIX):
        folder = input.resolve().parent
        return folder.parent / f"{folder.name}.bpk"
    return input.with_suffix(".bpk")


def is_folder_output(output: str | Path) -> bool:
    """`-o DIR/` (a name ending in a path separator) or an existing directory: a model folder."""
    return str(output).endswith(("/", os.sep)) or Path(output).is_dir()


def side_files(folder: Path) -> list[Path]:
    """The SIDE_FILES `folder` has, as regular files (after links: a Hugging Face cache links to blobs)."""
    return [path for path in (folder / name for name in SIDE_FILES) if path.is_file()]


def read_beside(folder: Path) -> list[Path]:
    """The files beside a checkpoint in `folder` that a run may open: its config and tokenizer files (a
    calibration builds the model from them, a model folder copies them) and the side files that declare how
    it was quantized (`qcli.formats.declaration`)."""
    return side_files(folder) + [path for path in (folder / name for name, _ in DECLARATIONS) if path.is_file()]


class ModelFolder(NamedTuple):
    """A Burn user's model folder: the weights as MODEL_FILE (or its shards and index), `copies` (files of
    the source's folder) beside them unchanged, and `record` as RECORD_FILE."""

    path: Path
    copies: list[Path]
    record: dict

    def staged(self, weights: list[Path]) -> list[tuple[Path, bytes | Path]]:
        """Each file beside the `weights` (the burnpack files and index), and what it holds: a copy's
        source, or the record's bytes, which list both."""
        record = {**self.record, "weights": [path.name for path in weights], "copied": [c.name for c in self.copies]}
        text = json.dumps(record, indent=2, ensure_ascii=False) + "\n"
        return [(self.path / c.name, c) for c in self.copies] + [(self.path / RECORD_FILE, text.encode())]


def shard_paths(target: Path, count: int) -> list[Path]:
    """`target` itself for one file, else `NAME-00001-of-0000N.bpk` beside it."""
    if count == 1:
        return [target]
    name = f"{target.stem}-{{:05d}}-of-{count:05d}{target.suffix}"
    return [target.with_name(name.format(i)) for i in range(1, count + 1)]


def written_transposed(path: Path, metadata: Mapping[str, str]) -> set[str]:
    """The tensors a file's metadata says `metadata` wrote `[in, out]` (none where it does not say)."""
    listed = metadata_json(path, "transposed", metadata.get("transposed", "[]"))
    if not isinstance(listed, list) or not all(isinstance(n, str) for n in listed):
        raise InputError(printable(f"{path}: metadata 'transposed' is not a JSON list of tensor names"),
                         hint="the file was not written by qcli, or was edited; write it again from its source")
    return set(listed)


def metadata(report: QuantizeReport, calibration: str | None = None) -> dict[str, str]:
    """The burnpack metadata map (docs/output.md); `calibration`, the `--calibration` asked for (`mse`),
    recorded with no file where the run has no calibration data."""
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
    record = report.calibration
    if record is not None:  # what it is asked to run on: the windows a short text gives are fewer
        meta["calibration"] = json.dumps({"method": record.method, "file": Path(record.file).name,
                                          "sha256": record.sha256, "samples": record.samples,
                                          "seq_len": record.seq_len, "seed": record.seed})
    elif calibration is not None:  # chosen from the weights alone
        meta["calibration"] = json.dumps({"method": calibration, "file": None, "sha256": None, "samples": None,
                                          "seq_len": None, "seed": None})
    return meta


def folder_record(report: QuantizeReport, source: Path, options: Mapping[str, object]) -> dict:
    """RECORD_FILE's document (docs/json-schema.json, `model_folder`): which qcli and Burn, the source and
    its files, the options that shaped the plan, the files written and how many tensors took each decision."""
    totals = report.totals
    return {
        "producer": "qcli",
        "producer_version": __version__,
        "burn_version": report.burn_version,
        "burn_backend": report.burn_backend,
        "source": {"input": report.input, "path": str(source.resolve()),
                   "files": [f.to_json() for f in report.source_files]},
        "options": {"scheme": report.preset, "recipe_sha256": report.recipe_sha256, **options},
        "tensors": {"total": totals.tensors, "quantized": totals.quantized, "kept": totals.kept,
                    "transposed": totals.transposed},
    }


class Shard(NamedTuple):
    """One output file and the tensors it holds, in plan order."""

    path: Path
    entries: list[TensorEntry]


class Output:
    """The files of one run, from its plan: `target` alone, or shards of at most `max_shard_size` bytes
    beside it and their index."""

    def __init__(self, plan: Plan, target: Path, max_shard_size: int | None, metadata: dict[str, str],
                 folder: ModelFolder | None = None) -> None:
        """`folder`: `target` is its MODEL_FILE, its other files are written beside it, and the weights an
        earlier run's record in it lists that this run does not write are removed at the commit (a stale
        `model.bpk` beside new shards would load the old model), as are the copies it lists that this
        source does not have."""
        self.metadata = metadata
        self.shards = _shards(plan, target, max_shard_size, metadata)
        self.index = index_path(target) if len(self.shards) > 1 else None
        self.folder = folder
        weights = [shard.path for shard in self.shards] + ([self.index] if self.index else [])
        self.staged = [] if folder is None else folder.staged(weights)
        self.paths = weights + [path for path, _ in self.staged]
        self.stale = [] if folder is None else [p for p in _recorded_files(folder.path) if p not in self.paths]

    def prepare(self, reads: Reads, *, force: bool, dry_run: bool) -> list[Problem]:
        """Refuse files the run must not write or remove (a file it `reads`, a special file, one in a missing
        folder, a shard already there without `force`), and warn of the temporary files killed runs left
        beside them, removed unless `dry_run`. A dry run refuses what the run would."""
        for path in self.paths:
            reads.refuse_target(path, TARGET_HINT)
        for path in self.stale:
            reads.refuse_removal(path)
        warnings = _leftovers(self.paths, remove=not dry_run)
        for path in self.paths:
            folder = path.parent if self.folder is None else self.folder.path.parent
            if not folder.is_dir():
                raise OutputError(printable(f"cannot write {path}: its folder {folder} does not exist"),
                                  hint="create the folder, or give -o a path in an existing one; nothing was written")
        taken = [] if force else [path for path in self.paths if path.exists()]
        if taken:  # a dry run refuses it too, as the run would
            more = f" (and {len(taken) - 1} more of its files)" if len(taken) > 1 else ""
            raise UsageError(printable(f"{taken[0]} already exists{more}"),
                             hint=f"pass --force to replace {'it' if len(taken) == 1 else 'them'}, or -o to write "
                             "somewhere else")
        return warnings

    @contextmanager
    def open(self, digests: bool) -> Iterator[OpenOutput]:
        """The files opened under temporary names, removed again unless the block commits them (with a
        model folder the run created); with `digests`, each tensor's bytes are hashed as they are written,
        for the read-back."""
        with ExitStack() as stack:
            if self.folder is not None:
                stack.enter_context(_created(self.folder.path))
            writers = [stack.enter_context(BurnpackWriter(shard.path, shard.entries, self.metadata, digests=digests))
                       for shard in self.shards]
            index = [stack.enter_context(IndexWriter(self.index, self.shards, self.metadata))] if self.index else []
            staged = [stack.enter_context(StagedFile(path, content)) for path, content in self.staged]
            yield OpenOutput(self.shards, writers, [*index, *staged], self.stale)


class OpenOutput:
    """The open files: each tensor handed to its shard in plan order, then the files finished, read back
    and committed together with the others (`beside`: the index, a model folder's other files), `stale`
    removed then."""

    def __init__(self, shards: list[Shard], writers: list[BurnpackWriter], beside: list[StagedFile],
                 stale: list[Path]) -> None:
        self._writers, self._beside, self._stale = writers, beside, stale
        self._writer_of = {entry.name: writer for shard, writer in zip(shards, writers, strict=True)
                           for entry in shard.entries}
        self._finished: list[Path] = []

    def write(self, name: str, data: object) -> Path:
        """Hand tensor `name`'s payload to its shard; the shard's target, for messages about the tensor."""
        writer = self._writer_of[name]
        writer.write(name, data)
        return writer.target

    def finish(self) -> None:
        """Complete every file, still under its temporary name."""
        self._finished = [writer.finish() for writer in self._writers]

    def read_back(self, plan: Plan, inputs: Iterable[str]) -> Verified:
        """The finished files read back against the plan and the digests of what was written (`qcli.verify`)."""
        digests = {name: d for writer in self._writers for name, d in (writer.digests or {}).items()}
        return read_back(self._finished, plan, inputs, digests, [writer.target for writer in self._writers])

    def commit(self) -> None:
        """Rename every file into place; if one fails, the ones already renamed are removed again.

        This is the commit point: SIGINT and SIGTERM are held back across it, so an interrupt lands either
        before (nothing written, exit 130) or after it, as `Interrupted` saying the output was written.
        """
        done = []
        with _interrupts_held() as held:
            try:
                for writer in [*self._writers, *self._beside]:
                    writer.commit()
                    done.append(writer.target)
            except BaseException:
                for path in done:
                    path.unlink(missing_ok=True)
                raise
            for path in self._stale:
                try:
                    path.unlink(missing_ok=True)
                except OSError as exc:
                    raise OutputError(printable(f"wrote {', '.join(map(str, done))}, but cannot remove {path}, "
                                                f"an earlier run's: {exc.strerror or exc}"),
                                      hint="remove it by hand: this run does not write it") from None
        if held:
            raise Interrupted(
                f"interrupted after the output was written: {', '.join(map(str, done))} is complete",
                hint="the run had finished when the interrupt arrived; the output can be used as it is",
            )


def _shards(plan: Plan, target: Path, max_shard_size: int | None, metadata: Mapping[str, str]) -> list[Shard]:
    """One file under Burn's file limit, or the split asked for.

    The plan refuses data over the limit (a lower bound on the file); this bounds the whole file, header
    and metadata included, so that no file Burn's reader refuses is written."""
    entries = [TensorEntry(e.name, e.out_dtype, tuple(e.out_shape), e.out_nbytes) for e in plan.entries]
    most = max_file_size(metadata.get("burn_version"))  # 500 GiB for Burn 0.23, else 100 GiB
    limit = f"Burn's reader refuses files over {most} bytes ({gib(most)})"
    if max_shard_size is None:
        size = size_bound(entries, metadata)
        if size > most:
            raise PlanError(f"the output would take up to {size / GIB:.1f} GiB, over Burn's {gib(most)} "
                            "file limit", hint=f"{limit}; split it with --max-shard-size 50GB")
        return [Shard(target, entries)]
    if max_shard_size > most:
        raise UsageError(f"--max-shard-size {max_shard_size} is over Burn's {gib(most)} file limit",
                         hint=f"{limit}; give at most {most // GIB}GiB")
    try:
        packs = split(entries, max_shard_size, metadata)
    except ValueError as exc:
        raise UsageError(f"--max-shard-size {max_shard_size}: {exc}",
                         hint="every tensor is written whole; give a larger size") from None
    return [Shard(path, pack) for path, pack in zip(shard_paths(target, len(packs)), packs, strict=True)]


def split(
    entries: Sequence[TensorEntry], max_size: int, metadata: Mapping[str, str] | None = None
) -> list[list[TensorEntry]]:
    """The entries, in order, cut into consecutive files of at most `max_size` bytes (each bounded by the
    container's `size_bound`) and Burn's tensor count.

    ValueError names a tensor too large to fit a file of its own.
    """
    packs: list[list[TensorEntry]] = [[]]
    size = fixed = fixed_bound(metadata)
    for entry in entries:
        cost = entry_bound(entry)
        if fixed + cost > max_size:
            raise ValueError(f"tensor '{entry.name}' takes {entry.nbytes} bytes, more than fits a file of "
                             f"{max_size} bytes")
        if (size + cost > max_size and packs[-1]) or len(packs[-1]) == MAX_TENSOR_COUNT:
            packs.append([])
            size = fixed
        packs[-1].append(entry)
        size += cost
    return packs


def _recorded_files(folder: Path) -> list[Path]:
    """The files an earlier run's RECORD_FILE in `folder` lists that qcli writes there: weights by the names
    it gives them (MODEL_FILE, its shards and index), copies among SIDE_FILES. Any other name in the record
    is not qcli's to remove, whoever wrote it there."""
    try:
        record = load_json(folder / RECORD_FILE, "")
        weights, copied = record.get("weights", []), record.get("copied", [])
        own = [*(n for n in weights if isinstance(n, str) and _OWN_WEIGHTS.fullmatch(n)),
               *(n for n in copied if isinstance(n, str) and n in SIDE_FILES)]
    except (InputError, AttributeError, TypeError):
        return []
    return [folder / name for name in own]


def check_folder(folder: Path, force: bool) -> None:
    """A model folder is written into a new or empty folder (the temporary files of a killed run aside),
    or with `force` into one that has files (those qcli writes are replaced, the others left as they are);
    never onto a file. A dry run refuses what the run would."""
    if folder.exists() and not folder.is_dir():
        raise UsageError(printable(f"{folder} is not a folder; -o DIR/ writes a model folder"),
                         hint="give -o the path of a folder, or of a .bpk file without the trailing /")
    if folder.is_dir() and not force and not all(map(left_by_killed_run, folder.iterdir())):
        raise UsageError(printable(f"{folder} already exists and is not empty"),
                         hint="pass --force to replace the files qcli writes there, or -o to write somewhere else")


@contextmanager
def _created(folder: Path) -> Iterator[None]:
    """`folder` created if it is missing, and removed again if the block raises while it is empty: a run
    that does not commit leaves no folder of its own behind (its files' temporaries are removed inside the
    block), and an interrupt after the commit leaves the complete folder."""
    if folder.is_dir():
        yield
        return
    try:
        folder.mkdir()
    except OSError as exc:
        raise OutputError(printable(f"cannot create {folder}: {exc.strerror or exc}"),
                          hint=f"check that {folder.parent} is writable; nothing was written") from None
    try:
        yield
    except BaseException:
        try:
            folder.rmdir()
        except OSError:
            pass  # not empty: committed, or another process wrote into it
        raise


def _leftovers(files: list[Path], *, remove: bool) -> list[Problem]:
    """A warning for each temporary file a killed run writing one of these outputs left beside it, removed
    when `remove` (the run about to write; a dry run only says so)."""
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
