"""Digests of tensor bytes, to check a written file against the bytes handed to the writer.

A digest is the sha256 of the concatenated sha256s of consecutive `PIECE`-byte pieces (no bytes are
one empty piece). The pieces are
hashed on several threads (hashlib releases the GIL while it hashes), so gigabytes of payloads hash at
several cores' speed instead of one's. Only qcli compares these digests, with each other.
"""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from functools import cache

PIECE = 16 << 20


@cache
def _pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max(1, min(8, os.cpu_count() or 1)), thread_name_prefix="qcli-digest")


def digest(view: memoryview) -> bytes:
    """The digest of the bytes of `view` (a 1-D byte view)."""
    pieces = [view[start : start + PIECE] for start in range(0, max(view.nbytes, 1), PIECE)]  # empty: one
    if len(pieces) > 1:
        hashes = list(_pool().map(_sha256, pieces))
    else:
        hashes = [_sha256(piece) for piece in pieces]
    for piece in pieces:  # views of a mapped file must be released before it is closed
        piece.release()
    return hashlib.sha256(b"".join(hashes)).digest()


def _sha256(piece: memoryview) -> bytes:
    return hashlib.sha256(piece).digest()
