"""A file written beside its target under a temporary name and renamed into place: the target is either
untouched or complete.

The temporary file is `.NAME.PID-N.tmp` in the target's folder, so that the rename never crosses a
filesystem. It is created for writing (`TemporaryFile.create`), synced to disk once complete (`sync`),
renamed onto the target at the commit (`commit`, which syncs the folder too), and removed when the writer
gives up, on an error or an interrupt (`discard`). Only SIGKILL or a power loss leaves one behind: its
writer's process id tells the next run that nobody is writing it any more (`leftover_temporaries`).
"""

from __future__ import annotations

import glob
import hashlib
import itertools
import os
import re
from pathlib import Path
from typing import BinaryIO

NAME_MAX = 255  # bytes of one file name on Linux, macOS and Windows filesystems
_serial = itertools.count()  # two temporary files of one process never share a name


class TemporaryFile:
    """The temporary file beside `target` (`path`), and whether it has been renamed onto it."""

    def __init__(self, target: Path) -> None:
        self.target = target
        self.path = target.with_name(temporary_name(target.name, next(_serial)))
        self.committed = False

    def create(self) -> BinaryIO:
        """The temporary file, opened for writing; the caller closes it."""
        return open(self.path, "wb")  # noqa: SIM115 - the writer holds it open across its calls

    def commit(self) -> None:
        """Rename the file onto the target, then sync the folder so that the rename outlives a crash."""
        os.replace(self.path, self.target)
        self.committed = True
        try:
            folder = os.open(self.target.parent, os.O_RDONLY)
            try:
                os.fsync(folder)
            finally:
                os.close(folder)
        except OSError:
            pass  # some filesystems refuse to fsync a directory; the rename itself has happened

    def discard(self) -> None:
        """Remove the file, unless it was committed."""
        if not self.committed:
            self.path.unlink(missing_ok=True)


def sync(file: BinaryIO) -> None:
    """Flush `file` and have its data and size on the disk before it is renamed into place."""
    file.flush()
    os.fsync(file.fileno())


def temporary_name(name: str, serial: int) -> str:
    """`.NAME.PID-N.tmp`, the temporary file beside a target called `name`.

    A name too long for that to fit in NAME_MAX bytes keeps its start, then `~` and 8 hex digits of the
    sha256 of the whole name: `.NAME-START~1a2b3c4d.PID-N.tmp`, still recognisable and distinct.
    """
    suffix = f".{os.getpid()}-{serial}.tmp"
    whole = f".{name}{suffix}"
    if len(os.fsencode(whole)) <= NAME_MAX:
        return whole
    tag = "~" + hashlib.sha256(os.fsencode(name)).hexdigest()[:8]
    room = NAME_MAX - len(os.fsencode(f".{tag}{suffix}"))
    start = name
    while len(os.fsencode(start)) > room:  # cut whole characters (never split a UTF-8 sequence)
        start = start[: max(len(start) - max(len(os.fsencode(start)) - room, 1), 0)]
    return f".{start}{tag}{suffix}"


def leftover_temporaries(target: Path) -> list[tuple[Path, int]]:
    """The temporary files (and their writers' process ids) that writers to `target` left behind when
    they were killed: `temporary_name`s of `target` whose process no longer runs. A running process's
    file, another run writing the same target now, is not one."""
    own = temporary_name(target.name, 0)
    prefix = own[: -len(f".{os.getpid()}-0.tmp")]
    pattern = re.compile(re.escape(prefix) + r"\.(\d+)-\d+\.tmp")
    leftovers = []
    for path in target.parent.glob(glob.escape(prefix) + ".*.tmp"):
        match = pattern.fullmatch(path.name)
        if match is not None and not _process_runs(int(match.group(1))):
            leftovers.append((path, int(match.group(1))))
    return sorted(leftovers)


def left_by_killed_run(path: Path) -> bool:
    """Whether `path` is a `temporary_name` (of any target) whose writer no longer runs."""
    match = re.fullmatch(r"\..+\.(\d+)-\d+\.tmp", path.name)
    return match is not None and not _process_runs(int(match.group(1)))


def _process_runs(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
