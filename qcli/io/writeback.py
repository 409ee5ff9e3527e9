"""Early writeback: a file's data goes to disk while more of it is being written.

Linux keeps up to a tenth of memory dirty before it writes back on its own, so gigabytes of output would
otherwise reach the disk only in the closing fsync, after everything else has finished. `Writeback`
syncs the file's data from a thread each time `STEP` more bytes were written, so the disk writes while
the caller reads and quantizes, and the closing fsync has little left to do.
"""

from __future__ import annotations

import os
import threading

STEP = 256 << 20
_sync = getattr(os, "fdatasync", os.fsync)  # macOS has no fdatasync


class Writeback:
    """A thread syncing the data of the open file `fd`, every `step` bytes the writer reports."""

    def __init__(self, fd: int, step: int = STEP) -> None:
        self._fd, self._step = fd, step
        self._written = 0   # bytes reported by `wrote`
        self._synced = 0    # bytes reported when the last sync began
        self._closing = False
        self._error: OSError | None = None
        self._wake = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="qcli-writeback", daemon=True)
        self._thread.start()

    def wrote(self, nbytes: int) -> None:
        with self._wake:
            self._written += nbytes
            if self._written - self._synced >= self._step:
                self._wake.notify()

    def close(self) -> None:
        """Stop the thread (before the file is closed, so it never syncs a reused descriptor) and raise the
        error a sync met: Linux reports a writeback error once per open file, so the writer's own closing
        fsync would not see it again."""
        with self._wake:
            self._closing = True
            self._wake.notify()
        self._thread.join()
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        while True:
            with self._wake:
                self._wake.wait_for(lambda: self._closing or self._written - self._synced >= self._step)
                if self._closing:
                    return
                self._synced = self._written
            try:
                _sync(self._fd)
            except OSError as exc:
                self._error = exc
                return
