"""The input read into the page cache, in plan order, while the runtime loads (`Prefetch`).

Importing torch and creating the CUDA context take seconds in which no tensor can be quantized, but the
disk can read: threads read the plan's tensors, in the order the pipeline will, into a small scratch
buffer each (the bytes land in the kernel's page cache, not in this process), until the pipeline starts
its own reads (`stop`) or `limit` bytes are read. On a cached input they find the pages there and cost
little; on a cold one the pipeline's first reads then come from memory.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from qcli.plan.entries import Plan

SLICE = 8 << 20  # bytes per read
THREADS = 8


class Prefetch:
    def __init__(self, plan: Plan, limit: int) -> None:
        self._stopped = threading.Event()
        self.read = 0  # bytes read so far
        jobs, total = [], 0
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

    def _run(self, jobs: list) -> None:
        local = threading.local()
        fds: dict = {}
        lock = threading.Lock()

        def read(job) -> None:
            if self._stopped.is_set():
                return
            path, offset, n = job
            with lock:
                fd = fds.get(path)
                if fd is None:
                    fd = fds[path] = os.open(path, os.O_RDONLY)
            buffer = getattr(local, "buffer", None)
            if buffer is None:
                buffer = local.buffer = bytearray(SLICE)
            got = os.preadv(fd, [memoryview(buffer)[:n]], offset)
            with lock:
                self.read += got

        try:
            with ThreadPoolExecutor(THREADS) as pool:
                list(pool.map(read, jobs))
        except Exception:  # noqa: BLE001 - the pipeline's own reads meet it again and report it
            pass
        finally:
            for fd in fds.values():
                os.close(fd)
