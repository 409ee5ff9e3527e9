"""What the commands and pipelines read a checkpoint through.

`TensorInfo` is one tensor as its header describes it; `Source` is the protocol every reader gives
(`qcli.io.readers` holds the readers)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Protocol

if TYPE_CHECKING:
    import torch

    from qcli.io.files import FileState


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as its header describes it; reading this costs no weight bytes."""

    name: str
    # The header's text: an element type's spelling (`io/dtypes.ElementType`, which compares equal to it)
    # or a ggml type with no element type (`Q4_K`); its row, where it has one, is `element_traits(dtype)`.
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    file: Path
    offset: int = 0  # where its bytes start in `file`
    # The stored row (slice along the first axis) each row of the tensor is read from, where the source
    # reorders them (a GGUF file's Q and K rows under `--names hf`); None: rows as stored.
    rows: tuple[int, ...] | None = None


def in_row_order(data: torch.Tensor, info: TensorInfo) -> torch.Tensor:
    """A tensor's stored bytes (1-D uint8) with its rows in `info.rows` order (unchanged when None): both
    pipelines read a reordered tensor so."""
    if info.rows is None:
        return data
    return data.view(len(info.rows), -1)[list(info.rows)].reshape(-1)


class Source(Protocol):
    """A checkpoint whose headers were checked on opening: `infos()` without reading a weight, `load(name)`
    one tensor on the CPU in memory of its own. A tensor's bytes are `info.nbytes` at `info.offset` of
    `info.file`, as stored (the GPU pipeline reads them there), its rows in `info.rows` order when set."""

    format: ClassVar[str]  # its reader's name (`qcli.io.readers.READERS`): "safetensors", "gguf"
    files: list[Path]
    index: Path | None  # the index of a sharded checkpoint
    opened: dict[Path, FileState]  # each of `files`' state when its header was read (`qcli.io.reads`)

    def infos(self) -> list[TensorInfo]: ...

    def load(self, name: str) -> torch.Tensor: ...

    def close(self) -> None: ...

    def __enter__(self) -> Source: ...

    def __exit__(self, *exc_info: object) -> None: ...


class Names(StrEnum):
    """`--names`: the tensor names a source gives."""

    file = "file"  # as the file has them
    hf = "hf"  # a GGUF file's llama.cpp names as Hugging Face's (`qcli.io.gguf_names`)


def checkpoint_folder(path: Path) -> Path:
    """The folder a checkpoint at `path` (a file, an index, or a folder) sits in with its config.json and
    tokenizer files."""
    return path if path.is_dir() else path.parent
