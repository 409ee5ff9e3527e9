"""Tensor digests: the sha256 of the sha256s of consecutive 1 MiB pieces, worked out here with hashlib."""

from __future__ import annotations

import hashlib
import os

from qcli.io.digest import digest, digest_file

MIB = 1 << 20


def sha(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def by_pieces(data: bytes) -> bytes:
    return sha(b"".join(sha(data[start : start + MIB]) for start in range(0, len(data), MIB)))


def test_pieces_are_hashed_in_order_and_the_hashes_hashed():
    data = os.urandom(2 * MIB + 5)  # pieces of 1, 1 and 5 bytes
    want = sha(sha(data[:MIB]) + sha(data[MIB : 2 * MIB]) + sha(data[2 * MIB :]))
    assert digest(memoryview(data)) == want
    data = os.urandom(40 * MIB + 5)
    assert digest(memoryview(data)) == by_pieces(data)


def test_a_swap_of_two_pieces_changes_the_digest():
    a, b = os.urandom(MIB), os.urandom(MIB)
    assert digest(memoryview(a + b)) != digest(memoryview(b + a))


def test_small_and_empty_payloads_are_one_piece():
    assert digest(memoryview(b"qcli")) == sha(sha(b"qcli"))
    assert digest(memoryview(b"")) == sha(sha(b""))


def test_a_file_region_is_read_and_hashed_by_pieces(tmp_path):
    data = os.urandom(40 * MIB + 5)
    path = tmp_path / "f"
    path.write_bytes(b"head" + data + b"tail")
    fd = os.open(path, os.O_RDONLY)
    try:
        assert digest_file(fd, 4, len(data)) == by_pieces(data)
        assert digest_file(fd, 4, 3) == sha(sha(data[:3]))
        assert digest_file(fd, 4, 0) == sha(sha(b""))
    finally:
        os.close(fd)
