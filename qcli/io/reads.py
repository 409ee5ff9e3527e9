"""The files a run reads, and the one rule every command that writes keeps with them (`Reads`).

A file the run reads is never its output, nor a file it replaces or removes, with `--force` or not. Those
files are the checkpoint and its shards, the index, the files beside them that it opens, the recipe, the
calibration text and the importance matrix. They are compared by path after links and by (device, inode),
so a symbolic or hard link to an input counts as the input. A path that is not a regular file (a device, a
FIFO, a socket, a directory) is never replaced (`refuse_special`).

Each file's state (device, inode, size, modification and change times in nanoseconds) is recorded when the
run opens it, and compared before the output is renamed into place (`unchanged`). An input rewritten while it
was read fails the run with nothing written, even with the same size and header. The change time moves on
every write and every change of the modification time, so a rewrite that sets the old one back is seen too."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from qcli.errors import InputError, UsageError
from qcli.io.files import FileState, not_regular_problem
from qcli.text import printable

if TYPE_CHECKING:
    from qcli.io.source import Source


@dataclass(frozen=True)
class _Read:
    path: Path
    role: str  # what the file is to the run, as a message says it: "the input", "the recipe"
    resolved: Path | None  # None where the path cannot be resolved (a loop of links)
    state: FileState


class Reads:
    """The regular files one run reads, each with its role and its state when the run opened it."""

    def __init__(self) -> None:
        self._files: list[_Read] = []

    def add(self, path: Path, role: str, state: FileState | None = None) -> None:
        """`path` as a file the run reads, in `role`; `state`: its state when it was opened, else now. A path
        that is missing or not a regular file is not recorded: its reader refuses it."""
        if not_regular_problem(path) is not None:
            return
        try:
            self._files.append(_Read(path, role, _resolved(path), state or FileState.of(path)))
        except OSError:
            pass

    def extend(self, paths: Iterable[Path], role: str) -> None:
        for path in paths:
            self.add(path, role)

    def add_source(self, source: Source) -> None:
        """A checkpoint's files, each with its state when its header was read, and its index."""
        for path in source.files:
            self.add(path, "the input", source.opened.get(path))
        if source.index is not None:
            self.add(source.index, "the input's index")

    def role_of(self, path: Path) -> str | None:
        """The role of the file the run reads that `path` is (after links, or by inode), else None."""
        resolved = _resolved(path)
        try:
            st = os.stat(path)
            identity = (st.st_dev, st.st_ino)
        except (OSError, ValueError):
            identity = None
        for read in self._files:
            if (resolved is not None and read.resolved == resolved) or identity == (read.state.device,
                                                                                 read.state.inode):
                return read.role
        return None

    def refuse_target(self, path: Path, hint: str) -> None:
        """UsageError when the run would write `path` (an output, a file it replaces) and `path` is a file
        the run reads or is not a regular file (`refuse_special`)."""
        refuse_special(path, hint)
        role = self.role_of(path)
        if role is not None:
            raise UsageError(printable(f"{path} is {role}; qcli never writes over a file it reads"),
                             hint=f"{hint}; nothing was written")

    def refuse_removal(self, path: Path) -> None:
        """UsageError when the run would remove `path` and it is a file the run reads."""
        role = self.role_of(path)
        if role is not None:
            raise UsageError(printable(f"{path} is {role}, but an earlier run's record in its folder lists it as "
                                       "its own, to be removed; qcli never removes a file it reads"),
                             hint="write the model folder somewhere else with -o DIR/, or remove the record "
                             "qcli.json there; nothing was written")

    def unchanged(self) -> None:
        """InputError (exit 3) naming the first file the run reads that changed since it was opened: call it
        after the last read and before the output is renamed into place."""
        for read in self._files:
            try:
                now = FileState.of(read.path)
            except OSError as exc:
                change = f"it can no longer be read ({exc.strerror or exc})"
            else:
                if now == read.state:
                    continue
                change = read.state.change(now)
            raise InputError(printable(f"{read.path} ({read.role}) changed while qcli read it: {change}"),
                             hint="run again once nothing writes to it; nothing was written")


def refuse_special(path: Path, hint: str) -> None:
    """UsageError when `path` exists and is not a regular file: a run writes a new file or replaces a regular
    one, never a device node, a FIFO, a socket or a directory (as root, the rename would replace
    /dev/null itself)."""
    kind = not_regular_problem(path)
    if kind is not None:
        raise UsageError(printable(f"{path} is not a regular file ({kind}); qcli writes a new file or replaces "
                                   "a regular one"), hint=f"{hint}; --force replaces only regular files")


def _resolved(path: Path) -> Path | None:
    try:
        return path.resolve()
    except (OSError, RuntimeError):
        return None
