"""The files a quantize run writes: the one place that chooses the container, keeps its limits and shards it.

The container is Burn's burnpack (`qcli.io.burnpack`, which names Burn's limits): one file under Burn's file
limit, or with `--max-shard-size` shards beside the target (`split`) and their index (`qcli.io.burnpack_index`).
A model folder (`-o DIR/`) holds them as
`model.bpk`, beside the source's config and tokenizer files and a record of the run (`ModelFolder`). The
files are written beside their targets under temporary names, read back (`qcli.verify`) and renamed into
place together at one commit point; until then the targets are untouched.

The package's modules each own one part: `names` (default targets, shard names), `folder` (a model folder),
`metadata` (the burnpack metadata map), `shards` (the split under Burn's limits); this module writes and
commits the files.
"""

from __future__ import annotations

import signal
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from qcli.errors import Interrupted, OutputError, UsageError
from qcli.io.burnpack import BurnpackWriter
from qcli.io.burnpack_index import IndexWriter, index_path
from qcli.io.reads import Reads
from qcli.io.staged import StagedFile
from qcli.io.temporary import leftover_temporaries
from qcli.output.folder import ModelFolder, created, recorded_files
from qcli.output.names import TARGET_HINT
from qcli.output.shards import Shard, shards
from qcli.plan.entries import Plan
from qcli.problem import Kind, Problem, Severity
from qcli.text import printable
from qcli.verify import Verified, read_back


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
        self.shards = shards(plan, target, max_shard_size, metadata)
        self.index = index_path(target) if len(self.shards) > 1 else None
        self.folder = folder
        weights = [shard.path for shard in self.shards] + ([self.index] if self.index else [])
        self.staged = [] if folder is None else folder.staged(weights)
        self.paths = weights + [path for path, _ in self.staged]
        self.stale = [] if folder is None else [p for p in recorded_files(folder.path) if p not in self.paths]

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
                stack.enter_context(created(self.folder.path))
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
        committed: list[BurnpackWriter | StagedFile] = [*self._writers, *self._beside]
        with _interrupts_held() as held:
            try:
                for writer in committed:
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
        held[:] = [signum for signum in held if previous[signal.Signals(signum)] is not signal.SIG_IGN]
