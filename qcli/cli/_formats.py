"""Options about the source: `--requantize` for already-quantized weights no Burn scheme holds (`quantize` and
`validate-scheme`), `--names` for a GGUF file's tensor names (`quantize` and `inspect`)."""

from __future__ import annotations

from typing import Annotated

import typer

from qcli.formats import REQUANTIZED
from qcli.io.source import Names

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
