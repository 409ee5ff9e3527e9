"""Verified output: the written files read back, and the error when a decode is out of its bound.

While the output is written, each quantized tensor is measured once, by the pipeline (`qcli.measure`;
the same measuring gives the error statistics: on the CPU from its codes and its payload's scales, a
sample of its packed rows held to its codes; elsewhere from the decode of its payload), and must lie,
block by block, within its scheme's error bound of its source (`qcli.measure.error_bound`;
`out_of_bound` is the error when it does not); the writer records a digest of every payload it writes
(`qcli.io.digest`), a kept tensor's being its source bytes as written. Before the rename, the complete
files are opened again with the bounded reader (`read_back`): every input tensor must be there exactly
once, with the dtype, shape and length the plan gave it, and its bytes must hash to what was checked.
Nothing is decoded or read from the source twice. Any failure is an `OutputError`; the caller then
leaves the target untouched.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from qcli.errors import InputError, OutputError
from qcli.scheme import QuantScheme

if TYPE_CHECKING:
    from qcli.io.burnpack import BurnpackReader, TensorEntry
    from qcli.measure import BoundFailure
    from qcli.plan.entries import Plan


@dataclass(frozen=True)
class Verified:
    """How many tensors were read back, their bytes, and the time taken."""

    tensors: int
    bytes: int
    seconds: float


def out_of_bound(failure: BoundFailure, scheme: QuantScheme, name: str, target: Path) -> OutputError:
    """The `OutputError` for tensor `name` whose decode lies outside its scheme's bound in `failure`'s block."""
    return _failed(target, f"tensor '{name}' decodes {failure.error:.6g} away from its source in "
                   f"block {failure.block}, over its scheme's bound {failure.bound:.6g} ({scheme})")


def read_back(
    paths: Sequence[Path], plan: Plan, inputs: Iterable[str], digests: Mapping[str, bytes],
    targets: Sequence[Path] | None = None,
) -> Verified:
    """Read the written files back and check them against `plan`; raises `OutputError` naming what is wrong.

    Every name of `inputs` but those the plan consumed (`Plan.consumed`) must be there exactly once, with
    the dtype, shape and length the plan gave it, and its bytes must hash to the digest the writer recorded
    for them (`digests`, `qcli.io.digest`), read from the file a piece at a time.
    `targets` are the names the files will have, used in messages (the files themselves may still be
    temporary ones).
    """
    from qcli.io.burnpack import BurnpackReader

    started = time.perf_counter()
    targets = targets or paths
    found: dict[str, tuple[BurnpackReader, TensorEntry, Path]] = {}
    for path, target in zip(paths, targets, strict=True):
        try:
            reader = BurnpackReader.open(path)
        except InputError as exc:
            raise _failed(target, f"it does not read back: {exc.message}") from None
        for written in reader.entries():
            if written.name in found:
                raise _failed(target, f"tensor '{written.name}' is written twice")
            found[written.name] = (reader, written, target)
    renamed = {entry.info.name: entry.name for entry in plan.entries}  # source name -> name written
    inputs = {renamed.get(name, name) for name in set(inputs) - plan.consumed()}
    for name in sorted(inputs | set(renamed.values())):
        if name not in found:
            raise _failed(targets[0], f"input tensor '{name}' is missing from the output")
    for name in sorted(set(found) - inputs):
        raise _failed(found[name][2], f"tensor '{name}' is not in the input")
    read = 0
    for entry in plan.entries:
        name = entry.name
        reader, written, target = found[name]
        expected = (entry.out_dtype, tuple(entry.out_shape), entry.out_nbytes)
        if (written.dtype, written.shape, written.nbytes) != expected:
            raise _failed(target, f"tensor '{name}' is written as {written.dtype} {list(written.shape)} "
                          f"in {written.nbytes} bytes; the plan says {expected[0]} {list(expected[1])} in "
                          f"{expected[2]} bytes")
    by_file: dict[BurnpackReader, list[str]] = {}
    for name, (reader, _, _) in found.items():
        by_file.setdefault(reader, []).append(name)
    for reader, names in by_file.items():
        for name, got in _written_digests(reader, names).items():
            if got != digests[name]:
                raise _failed(found[name][2], f"tensor '{name}' reads back other bytes than were written")
            read += found[name][1].nbytes
    return Verified(len(plan.entries), read, time.perf_counter() - started)


def _written_digests(reader: BurnpackReader, names: list[str]) -> dict[str, bytes]:
    """The digest of each named tensor's bytes in the file `reader` opened."""
    from qcli.io.digest import digest_file

    fd = os.open(reader.path, os.O_RDONLY)
    try:
        result = {}
        for name in names:
            start, end = reader.data_offsets(name)
            result[name] = digest_file(fd, reader.data_start + start, end - start)
        return result
    finally:
        os.close(fd)


def _failed(path: Path, problem: str) -> OutputError:
    return OutputError(
        f"verification of {path} failed: {problem}",
        hint="nothing was written at the target; run again, and if it fails again report it with the "
        "command line (--no-verify skips the check)",
    )
