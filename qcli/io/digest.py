"""Digests of tensor bytes, to check a written file against the bytes handed to the writer.

A digest is the sha256 of the concatenated sha256s of consecutive `PIECE`-byte pieces (no bytes are
one empty piece). The pieces are hashed on as many threads as there are cores (hashlib releases the GIL
while it hashes); they are small, so that a payload of tens of MiB, the size of most, keeps every thread
busy. Only qcli compares these digests, with each other.
"""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from functools import cache

PIECE = 1 << 20


@cache
def _pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max(1, min(32, os.cpu_count() or 1)), thread_name_prefix="qcli-digest")


def digest(view: memoryview) -> bytes:
    """The digest of the bytes of `view` (a 1-D byte view)."""
    pieces = [view[start : start + PIECE] for start in range(0, max(view.nbytes, 1), PIECE)]  # empty: one
    hashes = _hash_all(_sha256, pieces)
    for piece in pieces:  # the caller cannot release `view` while slices of it are alive
        piece.release()
    return _combined(hashes)


def digest_file(fd: int, offset: int, nbytes: int) -> bytes:
    """The digest of `nbytes` bytes of the open file `fd` from `offset`, read a piece at a time on the
    hashing threads, so memory holds a few pieces however large the tensor."""
    end = offset + nbytes
    return _combined(_hash_all(lambda start: _sha256(os.pread(fd, min(PIECE, end - start), start)),
                               range(offset, max(end, offset + 1), PIECE)))


def _hash_all(hash_one, items) -> list[bytes]:
    if len(items) > 1:
        return list(_pool().map(hash_one, items))
    return [hash_one(item) for item in items]


def _combined(hashes: list[bytes]) -> bytes:
    return hashlib.sha256(b"".join(hashes)).digest()


def _sha256(piece) -> bytes:
    return hashlib.sha256(piece).digest()
