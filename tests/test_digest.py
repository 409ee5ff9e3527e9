"""Tensor digests: the sha256 of the sha256s of consecutive 16 MiB pieces, worked out here with hashlib."""

from __future__ import annotations

import hashlib
import os

from qcli.io.digest import digest, digest_file

MIB = 1 << 20


def sha(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def test_pieces_are_hashed_in_order_and_the_hashes_hashed():
    data = os.urandom(40 * MIB + 5)  # pieces of 16, 16 and 8 MiB + 5 bytes
    want = sha(sha(data[: 16 * MIB]) + sha(data[16 * MIB : 32 * MIB]) + sha(data[32 * MIB :]))
    assert digest(memoryview(data)) == want


def test_a_swap_of_two_pieces_changes_the_digest():
    a, b = os.urandom(16 * MIB), os.urandom(16 * MIB)
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
        want = sha(sha(data[: 16 * MIB]) + sha(data[16 * MIB : 32 * MIB]) + sha(data[32 * MIB :]))
        assert digest_file(fd, 4, len(data)) == want
        assert digest_file(fd, 4, 3) == sha(sha(data[:3]))
        assert digest_file(fd, 4, 0) == sha(sha(b""))
    finally:
        os.close(fd)
