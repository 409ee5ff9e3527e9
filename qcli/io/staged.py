"""A small file written whole under a temporary name beside its target, then renamed into place on `commit()`.

A burnpack is put in place the same way (`qcli.io.temporary`): the target is either untouched or complete."""

from __future__ import annotations

import shutil
from pathlib import Path

from qcli.errors import OutputError
from qcli.io.files import open_regular
from qcli.io.temporary import TemporaryFile, sync
from qcli.text import printable


class StagedFile:
    """`content` (bytes, or the path of a file to copy as it is) in a temporary file beside `target`,
    written and synced on entering the context, renamed onto `target` by `commit()`, removed on leaving
    the context without it."""

    def __init__(self, target: Path, content: bytes | Path) -> None:
        self.target = target
        self._content = content
        self._temporary = TemporaryFile(target)

    def __enter__(self) -> StagedFile:
        try:
            with self._temporary.create() as file:
                if isinstance(self._content, bytes):
                    file.write(self._content)
                else:
                    with open_regular(self._content) as source:  # a FIFO swapped in would block a plain open
                        shutil.copyfileobj(source, file)
                sync(file)
        except BaseException as exc:
            self._temporary.discard()
            if isinstance(exc, OSError):
                raise OutputError(printable(f"cannot write {self.target}: {exc.strerror or exc}"),
                                  hint=f"check that {self.target.parent} is writable and has room; nothing was "
                                  "written") from None
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._temporary.discard()

    def commit(self) -> None:
        self._temporary.commit()
