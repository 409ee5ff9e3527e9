"""Sharded burnpack output: the index beside the shards, written with them, and the shards read as one.

Burn opens each `.bpk` on its own; the index is for tools and people. `NAME.bpk.index.json` sits beside
`NAME-00001-of-0000N.bpk` ... in the form of Hugging Face's sharded-checkpoint index: `metadata` with the
total payload size, and a `weight_map` from each tensor to its shard. With it `qcli inspect` and `--compare`
read the whole model, and any tool that reads a safetensors index finds its way."""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from pathlib import Path

from qcli.io.burnpack import EXTENSION, MAGIC_NUMBER, BurnpackReader, TensorEntry
from qcli.io.files import open_regular
from qcli.io.hf_index import check_weight_map, read_weight_map
from qcli.io.staged import StagedFile

INDEX_SUFFIX = ".index.json"


def index_path(target: Path) -> Path:
    """Where the index of output `target`'s shards goes: `NAME.bpk.index.json`."""
    return target.with_name(target.name + INDEX_SUFFIX)


def is_index(path: Path) -> bool:
    """Whether `path` names a burnpack index (a safetensors one is `*.safetensors.index.json`)."""
    return path.name.endswith(EXTENSION + INDEX_SUFFIX)


def standing_index(path: Path) -> Path | None:
    """The index that `path` stands for: itself when it names one, the index of `NAME.bpk` when that file
    is not there but its index is (sharded output, given by its target's name); else None."""
    if is_index(path):
        return path
    if not path.exists() and index_path(path).exists():
        return index_path(path)
    return None


def is_container(path: Path) -> bool:
    """Whether `path` is a file of the container qcli writes, or the index of its shards: by the extension,
    else by the container's magic number at the start (a regular file only: nothing else is opened)."""
    if standing_index(path) is not None or path.suffix == EXTENSION:
        return True
    if not path.is_file():
        return False
    try:
        with open_regular(path) as f:
            return f.read(4) == struct.pack("<I", MAGIC_NUMBER)
    except OSError:  # unreadable: its reader says why
        return False


class IndexWriter(StagedFile):
    """The index of `shards` (their paths and entries), written to a temporary file beside `target` and
    renamed into place on `commit()`, as `BurnpackWriter` puts a shard in place; removed on leaving the
    context without it."""

    def __init__(self, target: Path, shards: Sequence[tuple[Path, Sequence[TensorEntry]]],
                 metadata: dict[str, str]) -> None:
        """`metadata`: the shards' own, which the index repeats beside `total_size`, their payload bytes."""
        document = {
            "metadata": {**metadata, "total_size": sum(e.nbytes for _, entries in shards for e in entries)},
            "weight_map": {e.name: path.name for path, entries in shards for e in entries},
        }
        super().__init__(target, (json.dumps(document, indent=2, ensure_ascii=False) + "\n").encode())


class BurnpackSet:
    """The shards an index names, read as one file (every tensor in exactly the shard the index says), or
    one burnpack file alone."""

    def __init__(self, index: Path, readers: list[BurnpackReader]) -> None:
        self.path = index
        self.readers = readers
        self._by_name = {entry.name: reader for reader in readers for entry in reader.entries()}

    @staticmethod
    def open(path: Path) -> BurnpackSet:
        """The shards of the index `path` stands for (`standing_index`), or the single file `path`."""
        index = standing_index(path)
        if index is None:
            reader = BurnpackReader.open(path)
            return BurnpackSet(reader.path, [reader])
        weight_map = read_weight_map(index, "bpk")
        readers = [BurnpackReader.open(shard) for shard in sorted(set(weight_map.values()))]
        check_weight_map(index, weight_map, [(e.name, r.path) for r in readers for e in r.entries()])
        return BurnpackSet(index, readers)

    @property
    def version(self) -> int:
        return self.readers[0].version if self.readers else 0

    @property
    def metadata(self) -> dict[str, str]:
        """The first shard's metadata: qcli writes the same into every shard."""
        return dict(self.readers[0].metadata) if self.readers else {}

    def entries(self) -> list[TensorEntry]:
        return [entry for reader in self.readers for entry in reader.entries()]

    def read(self, name: str) -> memoryview:
        return self._by_name[name].read(name)
