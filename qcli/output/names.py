"""Where a quantize run's files go by default: the target beside the input, a model folder's `-o DIR/`, and the
names of a split output's shards."""

from __future__ import annotations

import os
from pathlib import Path

INDEX_SUFFIX = ".safetensors.index.json"  # a sharded safetensors checkpoint's index
TARGET_HINT = "give -o another path"


def default_output(input: Path) -> Path:
    """`x.safetensors` -> `x.bpk`; a directory `d` -> `d.bpk` beside it; an index -> its folder's `.bpk`."""
    if input.is_dir():
        return input.parent / f"{input.resolve().name}.bpk"
    if input.name.endswith(INDEX_SUFFIX):
        folder = input.resolve().parent
        return folder.parent / f"{folder.name}.bpk"
    return input.with_suffix(".bpk")


def is_folder_output(output: str | Path) -> bool:
    """`-o DIR/` (a name ending in a path separator) or an existing directory: a model folder."""
    return str(output).endswith(("/", os.sep)) or Path(output).is_dir()


def shard_paths(target: Path, count: int) -> list[Path]:
    """`target` itself for one file, else `NAME-00001-of-0000N.bpk` beside it."""
    if count == 1:
        return [target]
    name = f"{target.stem}-{{:05d}}-of-{count:05d}{target.suffix}"
    return [target.with_name(name.format(i)) for i in range(1, count + 1)]
