"""The input read into the page cache, in plan order, ahead of the pipeline (`Prefetch`).

Importing torch and creating the CUDA context take seconds in which no tensor can be quantized, but the
disk can read; and once the GPU pipeline runs, its own reads keep only a few pieces in flight. Threads
read the plan's tensors, in the order the pipeline will, into the kernel's page cache until `limit` bytes
are read or the caller stops them (`stop`), so that the pipeline's reads come from memory. On Linux
they `sendfile` the slices to the null device: the pages are read but never copied into this process,
which holds no buffer for them, and a page already cached costs next to nothing; elsewhere each thread
reads into a scratch buffer of its own. Slices and threads are those of the fastest read that
`bench/end_to_end.py`'s I/O floor measures.
"""

from __future__ import annotations

import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

    from qcli.plan.entries import Plan

    _Job = tuple[Path, int, int]  # a read: the file, the offset, the length

SLICE = 16 << 20  # bytes per read
THREADS = 16
SENDFILE = sys.platform == "linux"  # Linux's sendfile writes to any file; others' only to a socket


class Prefetch:
    def __init__(self, plan: Plan, limit: int) -> None:
        self._stopped = threading.Event()
        self.read = 0  # bytes read so far
        jobs: list[_Job] = []
        total = 0
        for entry in plan.entries:
            info = entry.info
            for start in range(0, info.nbytes, SLICE):
                if total >= limit:
                    break
                n = min(SLICE, info.nbytes - start)
                jobs.append((info.file, info.offset + start, n))
                total += n
        self._thread = threading.Thread(target=self._run, args=(jobs,), name="qcli-prefetch", daemon=True)
        self._thread.start()

    def stop(self) -> int:
        """Stop reading, and return how many bytes were read."""
        self._stopped.set()
        self._thread.join()
        return self.read

    def _run(self, jobs: list[_Job]) -> None:
        local = threading.local()  # each thread's own descriptors (its own readahead) and sink
        opened: list[int] = []
        lock = threading.Lock()

        def read(job: _Job) -> None:
            if self._stopped.is_set():
                return
            path, offset, n = job
            if not hasattr(local, "files"):
                local.files = {}
                local.sink = os.open(os.devnull, os.O_WRONLY) if SENDFILE else bytearray(SLICE)
                if SENDFILE:
                    with lock:
                        opened.append(local.sink)
            fd = local.files.get(path)
            if fd is None:
                fd = local.files[path] = os.open(path, os.O_RDONLY)
                with lock:
                    opened.append(fd)
            got = _into_page_cache(fd, offset, n, local.sink)
            with lock:
                self.read += got

        try:
            with ThreadPoolExecutor(THREADS) as pool:
                list(pool.map(read, jobs))
        except Exception:  # noqa: BLE001 - the pipeline's own reads meet it again and report it
            pass
        finally:
            for fd in opened:
                os.close(fd)


def _into_page_cache(fd: int, offset: int, n: int, sink: int | bytearray) -> int:
    """Read bytes [offset, offset + n) of `fd` into the page cache, through `sink` (the null device's
    descriptor, or a scratch buffer of at least `n` bytes); how many there were before the file ended."""
    done = 0
    while done < n:
        if isinstance(sink, int):
            got = os.sendfile(sink, fd, offset + done, n - done)
        else:
            got = os.preadv(fd, [memoryview(sink)[: n - done]], offset + done)
        if got <= 0:
            break
        done += got
    return done
