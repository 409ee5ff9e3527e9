"""Reading files that may be hostile, for every reader: only regular files opened (`open_regular`), reads that
fill their buffer or say the file ended (`read_into`), an OSError as the user's `InputError` (`unreadable`),
and JSON parsed with duplicate keys, nesting past the stack and oversized integers refused (`read_json`)."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from qcli.errors import InputError, UsageError
from qcli.text import printable, quoted

READ_MAX = 1 << 30  # bytes per read call (Linux reads at most 2 GiB - 4 KiB at once)
NOT_REGULAR_HINT = "qcli reads regular files only, not pipes, devices or sockets; save the data to a file first"


class NotRegularFile(OSError):
    """The path names a FIFO, a device, a socket or a directory where a regular file is read."""

    def __init__(self, kind: str) -> None:
        super().__init__(f"not a regular file ({kind})")
        self.kind = kind


def file_kind(mode: int) -> str:
    """What a non-regular `st_mode` is, in words."""
    for test, kind in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISDIR, "a directory")):
        if test(mode):
            return kind
    return "not a file"


def open_regular(path: Path | str) -> BinaryIO:
    """`path` opened for reading, only if it is a regular file (after symbolic links).

    A FIFO, a device or a socket raises `NotRegularFile` (an `OSError`) without being opened: opening a
    FIFO blocks until a writer comes, and a device like /dev/zero never ends. The check is made again on
    the open descriptor (opened non-blocking), so a FIFO swapped in between cannot block either.
    """
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        raise NotRegularFile(file_kind(mode))
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFile(file_kind(mode))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def named_file(path: Path | str, what: str, hint: str) -> Path:
    """A file an option names (`what` it is, for the message), checked to be there as the options are parsed,
    so that a missing one is a UsageError before the slow imports (torch, transformers) a run makes."""
    path = Path(path)
    if not path.exists():
        raise UsageError(printable(f"cannot read {what} {path}: no such file"), hint=hint)
    return path


def not_regular_problem(path: Path) -> str | None:
    """None when `path` is missing or a regular file (after links), else what it is (`a FIFO`, ...)."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    return None if stat.S_ISREG(mode) else file_kind(mode)


class FileEnded(OSError):
    """The file ended before a read filled its buffer: it is shorter than its header said, or was cut short
    since it was opened."""


def read_into(fd: int, into: memoryview, offset: int) -> None:
    """Fill `into` from `fd` at `offset`; `FileEnded` (an OSError) when the file ends first."""
    done = 0
    while done < into.nbytes:
        count = os.preadv(fd, [into[done : done + READ_MAX]], offset + done)
        if count == 0:
            raise FileEnded(f"the file ends {into.nbytes - done} bytes before the tensor does")
        done += count


def file_sha256(path: Path | str) -> str:
    """The sha256 of the regular file at `path` (`open_regular`'s refusals for anything else)."""
    with open_regular(path) as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def unreadable(path: Path, exc: OSError) -> InputError:
    """The error for a file that cannot be read: what it is where it is not a regular file, else the OS's reason."""
    if isinstance(exc, NotRegularFile):
        return InputError(printable(f"cannot read {path}: {exc}"), hint=NOT_REGULAR_HINT)
    return InputError(printable(f"cannot read {path}: {exc.strerror or exc}"),
                      hint="check the path and its permissions")


def _invalid(path: Path, message: str, hint: str) -> InputError:
    return InputError(printable(f"{path}: {message}"), hint=hint)


def _unique_keys(path: Path, hint: str) -> Callable[[list[tuple[str, object]]], dict[str, object]]:
    """A JSON `object_pairs_hook` that refuses a key given twice (json keeps the last silently)."""

    def hook(pairs: list[tuple[str, object]]) -> dict[str, object]:
        result = dict(pairs)  # built in C: a header's 200k objects are checked in a blink
        if len(result) != len(pairs):
            seen: set[str] = set()
            twice = next(key for key, _ in pairs if key in seen or seen.add(key))
            raise _invalid(path, f"{quoted(twice)} appears twice in the JSON", hint)
        return result

    return hook


def read_json(path: Path, data: bytes, hint: str) -> object:
    """The JSON document `data` read from `path`; where it is none, an `InputError` saying why, with `hint`."""
    try:
        return json.loads(data.decode("utf-8"), object_pairs_hook=_unique_keys(path, hint))
    except UnicodeDecodeError as exc:
        raise _invalid(path, f"the JSON header is not UTF-8 ({exc.reason} at byte {exc.start})", hint) from None
    except json.JSONDecodeError as exc:
        raise _invalid(path, f"the JSON header does not parse: {exc}", hint) from None
    except RecursionError:  # `[[[[...` deeper than the interpreter's stack; a real header nests 3 deep
        raise _invalid(path, "the JSON header is nested too deeply (arrays or objects inside each other "
                       "past Python's recursion limit)", hint) from None
    except ValueError:  # json's only other ValueError: an integer past int's digit limit
        raise _invalid(path, f"the JSON header holds an integer of more than {sys.get_int_max_str_digits()} "
                       "digits", hint) from None
