"""Options about the source: `--requantize` for already-quantized weights no Burn scheme holds (`quantize` and
`validate-scheme`), `--names` for a GGUF file's tensor names (`quantize` and `inspect`). The formats the help
names come from the registries (`qcli.formats.FORMATS`, `qcli.io.readers.READERS`), so a new one shows in it."""

from __future__ import annotations

from typing import Annotated

import typer

from qcli.formats import REQUANTIZED
from qcli.io.readers import given, titles
from qcli.io.source import Names

# The checkpoints a command reads, for its input's help: each reader's paths, then a model in the cache.
CHECKPOINT_HELP = f"{given()}, or ORG/NAME: a model in the local Hugging Face cache"
# The formats read, as the help lists them: "GGUF or safetensors".
FORMATS_READ = titles()

REQUANTIZE_HELP = (
    f"Preset for already-quantized weights no Burn scheme holds ({REQUANTIZED}), and, with --burn-backend,"
    " transcodable ones that backend cannot load: dequantized as their format does, then quantized into it"
    " (docs/input-formats.md)."
)


def requantize_option(help_more: str = "") -> object:
    """`--requantize NAME`, its help followed by what the command adds (quantize: what --stats reports)."""
    return Annotated[str | None, typer.Option("--requantize", metavar="NAME", help=REQUANTIZE_HELP + help_more)]


NamesOption = Annotated[
    Names,
    typer.Option(
        "--names",
        metavar="file|hf",
        case_sensitive=False,
        help="A GGUF file's tensor names: as in the file (llama.cpp's), or hf: Hugging Face's, from the gguf"
        " package's tables, the Q and K rows of llama models put back in Hugging Face's order (docs/input-formats.md).",
    ),
]
