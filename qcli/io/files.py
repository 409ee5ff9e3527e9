"""Reading files that may be hostile, for every reader.

Only regular files are opened (`open_regular`). A read fills its buffer or says the file ended (`read_into`),
and a whole file is read only up to a size (`read_bounded`). An OSError becomes the user's `InputError`
(`unreadable`). JSON is parsed with duplicate keys, deep nesting and huge integers refused (`read_json`), and a
checkpoint's side file (config, tokenizer, index, record) is bounded in size and depth too (`load_json`)."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
from collections.abc import Callable
from io import BufferedReader
from pathlib import Path
from typing import NamedTuple, TypeVar

from qcli.errors import InputError, UsageError
from qcli.text import printable, quoted

READ_MAX = 1 << 30  # bytes per read call (Linux reads at most 2 GiB - 4 KiB at once)
NOT_REGULAR_HINT = "qcli reads regular files only, not pipes, devices or sockets; save the data to a file first"
_J = TypeVar("_J")  # a JSON document: `checked_json` gives back what it checked


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


def open_regular(path: Path | str) -> BufferedReader:
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
            for key, _ in pairs:
                if key in seen:
                    raise _invalid(path, f"{quoted(key)} appears twice in the JSON", hint)
                seen.add(key)
        return result

    return hook


def read_json(path: Path, data: bytes | str, hint: str, what: str = "the JSON header") -> object:
    """The JSON document `data` read from `path`; where it is none, an `InputError` saying why, with `hint`.
    `what` names the document in the message."""
    try:
        return json.loads(data if isinstance(data, str) else data.decode("utf-8"),
                          object_pairs_hook=_unique_keys(path, hint))
    except UnicodeDecodeError as exc:
        raise _invalid(path, f"{what} is not UTF-8 ({exc.reason} at byte {exc.start})", hint) from None
    except json.JSONDecodeError as exc:
        raise _invalid(path, f"{what} does not parse: {exc}", hint) from None
    except RecursionError:  # `[[[[...` deeper than the interpreter's stack; a real header nests 3 deep
        raise _invalid(path, f"{what} is nested too deeply (arrays or objects inside each other "
                       "past Python's recursion limit)", hint) from None
    except ValueError:  # json's only other ValueError: an integer past int's digit limit
        raise _invalid(path, f"{what} holds an integer of more than {sys.get_int_max_str_digits()} "
                       "digits", hint) from None


# A checkpoint's JSON side files (config.json, tokenizer.json, an index, qcli.json) are read whole up to this
# size, the safetensors library's largest header (the largest tokenizer.json is a few tens of MB), and nest
# at most this deep: a config nests 4 deep, a tokenizer 6; what transformers and tokenizers then parse again
# is a document qcli has read in full.
MAX_JSON_BYTES = 100_000_000
MAX_JSON_DEPTH = 64


def read_bounded(path: Path, limit: int, what: str, hint: str) -> bytes:
    """The bytes of the regular file at `path` (`open_regular`), at most `limit` of them: a larger file (by
    its size, or one that grows while it is read) is an `InputError` naming `what` it is, with `hint`; an
    OSError is `unreadable`'s."""
    try:
        with open_regular(path) as file:
            size = os.fstat(file.fileno()).st_size
            data = file.read(limit + 1) if size <= limit else b""
    except OSError as exc:
        raise unreadable(path, exc) from exc
    if size > limit or len(data) > limit:
        raise _invalid(path, f"{what} of {max(size, len(data)):,} bytes is larger than the {limit:,} qcli reads",
                       hint)
    return data


def load_json(path: Path, hint: str, limit: int = MAX_JSON_BYTES, what: str = "the JSON") -> object:
    """The JSON document in the file at `path`, read by `read_bounded` and parsed by `parse_json`."""
    return parse_json(path, read_bounded(path, limit, what, hint), hint, what)


def parse_json(path: Path, data: bytes | str, hint: str, what: str = "the JSON",
               depth: int = MAX_JSON_DEPTH) -> object:
    """`read_json`, then `checked_json`: what qcli hands on is plain, shallow, encodable JSON."""
    return checked_json(path, read_json(path, data, hint, what), hint, what, depth)


def checked_json(path: Path, document: _J, hint: str, what: str = "the JSON", depth: int = MAX_JSON_DEPTH) -> _J:
    """`document`, parsed JSON, once its nesting is measured (without recursion) and found within `depth`,
    and its strings hold no lone surrogate (a `\\ud800` escape, which is no Unicode character and which
    tokenizers and encoders fail on); else an `InputError` naming `what` it is, with `hint`."""
    pending = [(document, 1)]
    while pending:
        value, level = pending.pop()
        if isinstance(value, str):
            if not value.isascii():
                _encodable(path, value, what, hint)
            continue
        if not isinstance(value, dict | list):
            continue
        if level > depth:
            raise _invalid(path, f"{what} nests arrays or objects more than {depth} deep", hint)
        items = [*value, *value.values()] if isinstance(value, dict) else value
        pending.extend((item, level + 1) for item in items)
    return document


def _encodable(path: Path, text: str, what: str, hint: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise _invalid(path, f"{what} holds a lone surrogate ({text[exc.start]!r} at character {exc.start} of a "
                       "string), which is no Unicode character", hint) from None


class FileState(NamedTuple):
    """What tells a file's contents changed without reading them: its identity, size and times."""

    device: int
    inode: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, file: Path | int) -> FileState:
        """The state of the file at a path (after links) or of an open descriptor; OSError where there is none."""
        st = os.fstat(file) if isinstance(file, int) else os.stat(file)
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    def change(self, now: FileState) -> str:
        """What differs in `now`, in words."""
        if (now.device, now.inode) != (self.device, self.inode):
            return "it was replaced by another file"
        if now.size != self.size:
            return f"its size went from {self.size} to {now.size} bytes"
        return "it was written to"
