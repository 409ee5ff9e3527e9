"""The option for already-quantized weights no Burn scheme holds, shared by `quantize` and `validate-scheme`."""

from __future__ import annotations

from typing import Annotated

import typer

RequantizeOption = Annotated[
    str | None,
    typer.Option(
        "--requantize",
        metavar="NAME",
        help="Preset for already-quantized weights no Burn scheme holds (bitsandbytes NF4 and FP4; compressed-tensors"
        " and GPTQ zero points and widths Burn lacks; GPTQ's activation order): dequantized as their format does,"
        " then quantized into it; --stats reports the error added to the dequantized weights"
        " (docs/input-formats.md).",
    ),
]
