"""`open_source`, which picks the reader of a checkpoint: a GGUF file (`qcli.io.gguf`) or safetensors
(`qcli.io.safetensors`)."""

from __future__ import annotations

from pathlib import Path

from qcli.errors import UsageError
from qcli.io.gguf import GgufSource, is_gguf
from qcli.io.safetensors import SafetensorsSource
from qcli.io.source import Names, Source


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
