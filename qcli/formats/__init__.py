"""Checkpoints another tool already quantized: what each format's weights become (docs/input-formats.md).

Each module here owns one format. From the headers alone (names, dtypes, shapes, a folder's
`config.json`) it finds the format's weights and says of each one of three things:
- a `Transcode`: Burn's QFloat layout holds the format exactly, so the weight's codes are written as they
  are beside its scales (`payload`), decoding to exactly what the format's own dequantization gives
  (`dequantize`);
- an `Encoded` weight that no Burn scheme holds (a codebook, a zero point): refused, saying `why`, or
  with `--requantize` dequantized as the format's reference decoder does and quantized into a preset;
- a string: why a weight that looks quantized has no transcode.
A weight's companions (its scales, tables, states) are consumed: written inside its payload, or not at all.
The checkpoint's declaration (`qcli.formats.declaration`) decides first: a method no module reads, and
tensors that show packing no module claimed, are refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from qcli.formats import awq, bitsandbytes, compressed_tensors, declaration, fp8, gguf, gptq, hqq, nvfp4, quanto
from qcli.formats.found import Encoded, Found, Load, Transcode
from qcli.io.dtypes import is_quantized

if TYPE_CHECKING:
    from qcli.io.source import TensorInfo



class FormatModule(Protocol):
    """What each format module offers: its name in help and messages, what of it `--requantize` dequantizes
    and quantizes again (None where none of its weights is `Encoded`), the `quant_method` values it reads,
    and `detect`."""

    # Read-only, as a module's constants are to its readers: a module whose REQUANTIZED is a str, or None,
    # is a FormatModule either way (an attribute `str | None` would hold it to that type exactly).
    @property
    def NAME(self) -> str: ...

    @property
    def REQUANTIZED(self) -> str | None: ...

    @property
    def METHODS(self) -> frozenset[str]: ...

    def detect(self, infos: Sequence[TensorInfo], declared: declaration.Declaration | None) -> dict[str, Found]: ...


# Each module's `detect(infos, declaration)`. A later module's finding for a weight takes the place
# of an earlier one's: compressed-tensors' config says the FP8 layout fp8 infers from the scale's shape.
FORMATS: tuple[FormatModule, ...] = (fp8, nvfp4, gptq, awq, hqq, bitsandbytes, quanto, compressed_tensors, gguf)
# What `--requantize` covers, each format named once: "GPTQ zero points, ...; GGUF types with ...".
REQUANTIZED = "; ".join(f"{f.NAME} {f.REQUANTIZED}" for f in FORMATS if f.REQUANTIZED is not None)
HANDLED = frozenset().union(*(f.METHODS for f in FORMATS))  # every quant_method a module reads
# The token embedding's module in the formats that name tensors their own way (llama.cpp's), beside the names
# common checkpoints give it, which the plan knows (`qcli.plan.roles.EMBEDDING_MODULES`).
FORMAT_EMBEDDINGS = gguf.EMBEDDING_MODULES


def detect(infos: Sequence[TensorInfo], load: Load | None = None) -> dict[str, Found]:
    """Every already-quantized weight of a checkpoint by name, from its headers (and `config.json`);
    with `load`, each `Encoded` weight's small state read too, as `--requantize` needs (no weight)."""
    declared = declared_by(infos)  # read once, handed to every module
    found: dict[str, Found] = {}
    for format in FORMATS:
        found.update(format.detect(infos, declared))
    found.update(declaration.decide(infos, found, declared, HANDLED))
    if load is not None:
        found = {n: f.with_state(load) if isinstance(f, Encoded) else f for n, f in found.items()}
    return found


def declared_by(infos: Sequence[TensorInfo]) -> declaration.Declaration | None:
    """The declaration in the folder of a checkpoint's first file (Hugging Face's layout), or None."""
    return declaration.declaration(infos[0].file.parent) if infos else None


def verdict(infos: Sequence[TensorInfo], found: dict[str, Found]) -> str:
    """What the checkpoint's declaration decides, in words (`inspect`)."""
    return declaration.verdict(found, declared_by(infos), HANDLED)


def consumed(found: dict[str, Found], requantized: bool) -> set[str]:
    """The companions written inside their weights' payloads (and, when `requantized`, the encoded
    weights' companions, which are not written at all): no plan entry of their own."""
    return {c.name for f in found.values()
            if isinstance(f, Transcode) or requantized and isinstance(f, Encoded) for c in f.companions}


def scale_owners(infos: Sequence[TensorInfo]) -> fp8.ScaleOwners:
    """Whose scale each tensor is, by name, among the tensors of `infos` another tool already quantized (by
    their dtype): the default policy keeps such a scale, saying whose it is."""
    return fp8.ScaleOwners(i.name for i in infos if is_quantized(i.dtype))
