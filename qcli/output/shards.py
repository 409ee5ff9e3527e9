"""The output's files under Burn's limits.

Without `--max-shard-size` the output is one file under its reader's file limit. With it, the tensors go to
consecutive shards, each bounded by the container's `size_bound` and by Burn's tensor count."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

from qcli.errors import PlanError, UsageError
from qcli.io.burnpack import (
    GIB,
    MAX_TENSOR_COUNT,
    TensorEntry,
    entry_bound,
    fixed_bound,
    gib,
    max_file_size,
    size_bound,
)
from qcli.output.names import shard_paths
from qcli.plan.entries import Plan


class Shard(NamedTuple):
    """One output file and the tensors it holds, in plan order."""

    path: Path
    entries: list[TensorEntry]


def shards(plan: Plan, target: Path, max_shard_size: int | None, metadata: Mapping[str, str]) -> list[Shard]:
    """One file under Burn's file limit, or the split asked for.

    The plan refuses data over the limit (a lower bound on the file); this bounds the whole file, header
    and metadata included, so that no file Burn's reader refuses is written."""
    entries = plan.container_entries()
    most = max_file_size(metadata.get("burn_version"))  # 500 GiB for Burn 0.23, else 100 GiB
    limit = f"Burn's reader refuses files over {most} bytes ({gib(most)})"
    if max_shard_size is None:
        size = size_bound(entries, metadata)
        if size > most:
            raise PlanError(f"the output would take up to {size / GIB:.1f} GiB, over Burn's {gib(most)} "
                            "file limit", hint=f"{limit}; split it with --max-shard-size 50GB")
        return [Shard(target, entries)]
    if max_shard_size > most:
        raise UsageError(f"--max-shard-size {max_shard_size} is over Burn's {gib(most)} file limit",
                         hint=f"{limit}; give at most {most // GIB}GiB")
    try:
        packs = split(entries, max_shard_size, metadata)
    except ValueError as exc:
        raise UsageError(f"--max-shard-size {max_shard_size}: {exc}",
                         hint="every tensor is written whole; give a larger size") from None
    return [Shard(path, pack) for path, pack in zip(shard_paths(target, len(packs)), packs, strict=True)]


def split(
    entries: Sequence[TensorEntry], max_size: int, metadata: Mapping[str, str] | None = None
) -> list[list[TensorEntry]]:
    """The entries, in order, cut into consecutive files of at most `max_size` bytes (each bounded by the
    container's `size_bound`) and Burn's tensor count.

    ValueError names a tensor too large to fit a file of its own.
    """
    packs: list[list[TensorEntry]] = [[]]
    size = fixed = fixed_bound(metadata)
    for entry in entries:
        cost = entry_bound(entry)
        if fixed + cost > max_size:
            raise ValueError(f"tensor '{entry.name}' takes {entry.nbytes} bytes, more than fits a file of "
                             f"{max_size} bytes")
        if (size + cost > max_size and packs[-1]) or len(packs[-1]) == MAX_TENSOR_COUNT:
            packs.append([])
            size = fixed
        packs[-1].append(entry)
        size += cost
    return packs
