"""What the commands and pipelines read a checkpoint through (`Source`), and `open_source`, which picks the
reader: a GGUF file (`qcli.io.gguf`) or safetensors (`qcli.io.safetensors`)."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from qcli.errors import UsageError
from qcli.io.gguf import GgufSource, is_gguf
from qcli.io.safetensors import SafetensorsSource, TensorInfo

if TYPE_CHECKING:
    import torch


class Source(Protocol):
    """A checkpoint whose headers were checked on opening: `infos()` without reading a weight, `load(name)`
    one tensor on the CPU in memory of its own. A tensor's bytes are `info.nbytes` at `info.offset` of
    `info.file`, as stored (the GPU pipeline reads them there), its rows in `info.rows` order when set."""

    files: list[Path]
    index: Path | None  # the index of a sharded checkpoint

    def infos(self) -> list[TensorInfo]: ...

    def load(self, name: str) -> torch.Tensor: ...

    def close(self) -> None: ...

    def __enter__(self) -> Source: ...

    def __exit__(self, *exc_info: object) -> None: ...


class Names(StrEnum):
    """`--names`: the tensor names a source gives."""

    file = "file"  # as the file has them
    hf = "hf"  # a GGUF file's llama.cpp names as Hugging Face's (`qcli.io.gguf_names`)


def open_source(path: Path | str, names: Names | str = Names.file) -> Source:
    """The checkpoint at `path`: a GGUF file (by its `.gguf` suffix or its magic), else safetensors (a
    file, a folder or an index); with `names` hf a GGUF file's tensors under Hugging Face's names."""
    path, names = Path(path), Names(names)
    if is_gguf(path):
        source = GgufSource.open(path)
        if names is Names.hf:
            from qcli.io.gguf_names import hf_names

            source = hf_names(source)
        return source
    if names is Names.hf:
        raise UsageError("--names hf maps the llama.cpp names of a GGUF file; this input is safetensors",
                         hint="drop --names: a safetensors checkpoint's names are kept as they are")
    return SafetensorsSource.open(path)
