"""Options about the source: `--requantize` for already-quantized weights no Burn scheme holds (`quantize` and
`validate-scheme`), `--names` for a GGUF file's tensor names (`quantize` and `inspect`)."""

from __future__ import annotations

from typing import Annotated

import typer

from qcli.io.source import Names

RequantizeOption = Annotated[
    str | None,
    typer.Option(
        "--requantize",
        metavar="NAME",
        help="Preset for already-quantized weights no Burn scheme holds (bitsandbytes NF4 and FP4; compressed-tensors"
        " and GPTQ zero points and widths Burn lacks; GPTQ's activation order; GGUF's types with a minimum, a width"
        " or a codebook): dequantized as their format does,"
        " then quantized into it; --stats reports the error added to the dequantized weights"
        " (docs/input-formats.md).",
    ),
]

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
