"""GGUF's tensor types into Burn (docs/input-formats.md): Q8_0, Q4_0 and MXFP4 transcoded with their codes
unchanged; the other quantized types refused, or dequantized by the `gguf` package for `--requantize`.

A GGUF tensor of a quantized type is rows of blocks of 32 values (`qcli.io.gguf`), each block:
- Q8_0: an f16 scale `d`, then 32 int8 codes; value `q * d`.
- Q4_0: an f16 scale `d`, then 16 bytes whose low nibbles are values 0..15 and high nibbles 16..31;
  value `(nibble - 8) * d`. `d` is negative where the block's largest magnitude is (ggml divides by -8).
- MXFP4: an E8M0 exponent `e`, then 16 bytes of E2M1 codes laid out as Q4_0's nibbles; value
  `2^(e-127) * e2m1(code)`, code 8 (E2M1's -0) decoding to +0.0 as ggml's table has it.
Each is Burn's `q * s` with blocks [32] along the row: the codes packed as Burn packs them, Q8_0's and
Q4_0's f16 scales as they are (Q8F, Q4F block [32] F16). MXFP4's power-of-two scales are written
as F16 block scales under one power-of-two F32 global (4.5 bits a weight, `qcli.formats.e2m1.mx_scales`),
the narrowest Burn 0.22.1 loads E2M1 with: no backend reads UE8M0 scales (4.25 bits) or decodes E2M1 with
BF16 ones, wgpu reads F16 and F32 only, flex and ndarray no E2M1 at all (measured, `qcli.burn_backends`).
Both sides form each product once in f32, so the `.bpk` decodes to exactly what `gguf.quants.dequantize`
gives. Detection reads the ggml type of each tensor from the header only.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from qcli.formats.e2m1 import mx_scales, positive_zero
from qcli.formats.found import Encoded, Found, Load, Transcode
from qcli.formats.nvfp4 import two_level_e2m1
from qcli.io.gguf import BY_NAME
from qcli.presets import REQUANTIZE_NARROW, REQUANTIZE_WIDE, ZERO_POINT_WHY
from qcli.problem import Kind
from qcli.scheme import LOOKUP_PANICS_AT, LOOKUP_WHY, MAX_BLOCK_EXTENT, PackedU32, QuantScheme, QuantValue, ScaleDtype

if TYPE_CHECKING:
    import torch

    from qcli.formats.declaration import Declaration
    from qcli.io.source import TensorInfo

METHODS: frozenset[str] = frozenset()  # a GGUF file declares no quant_method: its tensor types say it all
BLOCK = 32  # values per Q8_0, Q4_0 and MXFP4 block
# llama.cpp's module name for the token embedding, which the default policy keeps at 8 bits under a narrower
# preset (`qcli.plan.decisions.tensor_role`); its output head, a top-level `output.weight`, has Meta's Llama's name.
EMBEDDING_MODULES = ("token_embd",)
DECODED_AS = "dequantized by the gguf package (gguf.quants.dequantize), then quantized"


def _block_scheme(value: QuantValue, scale: ScaleDtype) -> QuantScheme:
    return QuantScheme().with_value(value).with_store(PackedU32(0)).per_block([BLOCK], scale)


def reference_dequantize(info: TensorInfo, codes: torch.Tensor) -> torch.Tensor:
    """The gguf package's own dequantization of a tensor's stored bytes, f32 of its shape."""
    import gguf
    import torch

    data = codes.reshape(-1).view(torch.uint8).numpy().reshape(*info.shape[:-1], -1)
    values = gguf.quants.dequantize(data, gguf.GGMLQuantizationType[info.dtype])
    return torch.from_numpy(values.copy()).reshape(info.shape)


@dataclass(frozen=True)
class GgufBlocks(Transcode):
    """A GGUF tensor of one of the block types Burn holds exactly; `split` gives its fields and scales."""

    def blocks(self, codes: torch.Tensor) -> torch.Tensor:
        """The stored bytes as one row of bytes per block."""
        import torch

        return codes.reshape(-1).view(torch.uint8).reshape(-1, BY_NAME[self.weight.dtype].nbytes)

    @abstractmethod
    def split(self, blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The fields (one row of 32 per block) and the scales' payload bytes."""

    def payload(self, codes: torch.Tensor, load: Load) -> torch.Tensor:
        import torch

        from qcli.codec.pack import pack_fields

        fields, scales = self.split(self.blocks(codes))
        return torch.cat([pack_fields(fields.reshape(self.shape), self.scheme), scales])

    def dequantize(self, codes: torch.Tensor, load: Load) -> torch.Tensor:
        return reference_dequantize(self.weight, codes)


def _nibbles(packed: torch.Tensor) -> torch.Tensor:
    """16 bytes a block to its 32 nibbles in order: the low nibbles first, then the high ones."""
    import torch

    return torch.cat([packed & 0xF, packed >> 4], dim=1)


class Q8_0(GgufBlocks):
    def split(self, blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        return blocks[:, 2:].contiguous().view(torch.int8), blocks[:, :2].reshape(-1)


class Q4_0(GgufBlocks):
    def split(self, blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        return _nibbles(blocks[:, 2:]).to(torch.int8) - 8, blocks[:, :2].reshape(-1)


class Mxfp4(GgufBlocks):
    def split(self, blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The E2M1 codes (-0 as +0), then the E8M0 exponents as F16 block scales under a global."""
        codes = positive_zero(_nibbles(blocks[:, 1:]))
        return codes, mx_scales(blocks[:, 0], (codes != 0).any(dim=1), self.weight, "MXFP4")


TRANSCODES = {
    "Q8_0": (Q8_0, _block_scheme(QuantValue.Q8F, ScaleDtype.F16)),
    "Q4_0": (Q4_0, _block_scheme(QuantValue.Q4F, ScaleDtype.F16)),
    "MXFP4": (Mxfp4, two_level_e2m1(BLOCK)),
}


@dataclass(frozen=True)
class Refusal:
    """Why Burn holds no GGUF type: the problem's kind, what the type is (after "is"), how it encodes
    values and why no Burn scheme holds them, and the preset offered."""

    kind: Kind
    encoding: str
    why: str
    offered: str = REQUANTIZE_NARROW


def _zero_point(layout: str) -> Refusal:
    return Refusal(Kind.scheme, "a format with a minimum per block", f"{layout}: {ZERO_POINT_WHY}")


def _width(layout: str, offered: str = REQUANTIZE_WIDE) -> Refusal:
    return Refusal(Kind.scheme, "a format Burn has no value type for", f"{layout}; Burn's values are 8, 4 or 2 "
                   "bits wide, integers or E4M3, E5M2, E2M1", offered)


def _codebook(layout: str) -> Refusal:
    return Refusal(Kind.lookup, "a codebook", f"{layout}: {LOOKUP_WHY} ({LOOKUP_PANICS_AT})")


_LATTICE = "each group of values is an index into a fixed grid of value vectors (a lattice codebook)"
REFUSALS = {
    "Q4_1": _zero_point("4-bit codes with an f16 scale and an f16 minimum per 32 values (d * q + m)"),
    "Q5_1": _zero_point("5-bit codes with an f16 scale and an f16 minimum per 32 values (d * q + m)"),
    "Q2_K": _zero_point("2-bit codes with a 4-bit scale and a 4-bit minimum per 16 values under f16 d and dmin"),
    "Q4_K": _zero_point("4-bit codes with a 6-bit scale and a 6-bit minimum per 32 values under f16 d and dmin"),
    "Q5_K": _zero_point("5-bit codes with a 6-bit scale and a 6-bit minimum per 32 values under f16 d and dmin"),
    "Q5_0": _width("5-bit codes (the fifth bit in a 32-bit mask beside the nibbles) with an f16 scale per 32"),
    "Q3_K": _width("3-bit codes with a 6-bit scale per 16 values under an f16 super-block scale", REQUANTIZE_NARROW),
    "Q6_K": _width("6-bit codes with an 8-bit scale per 16 values under an f16 super-block scale"),
    "TQ1_0": _width("ternary values packed five to a byte in base 3 with an f16 scale per 256", "q2s-b32"),
    "TQ2_0": Refusal(Kind.scheme, "a format qcli does not transcode", "2-bit codes of q - 1 (-1 to 2) with an f16 "
                     f"scale per 256 values, wider than Burn's largest block extent of {MAX_BLOCK_EXTENT}; qcli has "
                     "no transcode for it", "q2s-b32"),
    "NVFP4": Refusal(Kind.scheme, "a format qcli does not transcode", "E2M1 codes with a UE4M3 scale per 16 values "
                     "and no global scale, as ggml lays them out; qcli has no transcode for it", "fp4-b32"),
    "IQ4_NL": _codebook("4-bit indices into a 16-entry non-linear codebook (kvalues_iq4nl) with an f16 scale per 32"),
    "IQ4_XS": _codebook("4-bit indices into a 16-entry non-linear codebook (kvalues_iq4nl) with 6-bit scales"),
    **{name: _codebook(_LATTICE) for name in ("IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S")},
}
# Types the gguf package has no decoder for: nothing to transcode against, nothing to requantize from.
UNDECODED = {
    "Q8_1": "llama.cpp's in-memory type for dot products, which its converter and quantizer never write",
    "Q8_K": "llama.cpp's in-memory type for dot products, which its converter and quantizer never write",
    "Q1_0": "1-bit codes per 128 values",
}


@dataclass(frozen=True)
class GgufEncoded(Encoded):
    """A GGUF tensor of a type no Burn scheme holds, dequantized by the gguf package for `--requantize`."""

    refusal: Refusal | None = None

    decoded_as = DECODED_AS

    @property
    def kind(self) -> Kind:  # type: ignore[override]
        return self.refusal.kind

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self.refusal.encoding

    @property
    def offered(self) -> str:  # type: ignore[override]
        return self.refusal.offered

    @property
    def why(self) -> str:
        return self.refusal.why

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.weight.shape)

    @property
    def dtype(self) -> str:
        return "F32"

    def dequantize(self, load: Load) -> torch.Tensor:
        return reference_dequantize(self.weight, load(self.weight.name))


def detect(infos: Sequence[TensorInfo], declared: Declaration | None) -> dict[str, Found]:
    """Each tensor of a quantized ggml type: its transcode, its refusal, or why it has neither."""
    found: dict[str, Found] = {}
    for info in infos:
        ggml = BY_NAME.get(info.dtype)
        if ggml is None or not ggml.quantized:
            continue
        format = f"GGUF {info.dtype}"
        if info.dtype in TRANSCODES:
            kind, scheme = TRANSCODES[info.dtype]
            found[info.name] = kind(info, format, scheme, ())
        elif info.dtype in REFUSALS:
            found[info.name] = GgufEncoded(info, format, (), REFUSALS[info.dtype])
        else:
            found[info.name] = f"{UNDECODED[info.dtype]}; the gguf package has no decoder for {info.dtype}"
    return found
