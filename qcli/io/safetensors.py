"""Lazy safetensors source: headers first, one tensor at a time."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str                 # safetensors spelling: "F32", "BF16", "F16", "I64", "F8_E4M3", ...
    shape: tuple[int, ...]
    nbytes: int
    file: Path                 # the file (shard) that holds it
