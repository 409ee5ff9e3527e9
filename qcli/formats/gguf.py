"""GGUF's tensor types into Burn (docs/input-formats.md): the block types a Burn scheme holds transcoded with
their codes unchanged; the other quantized types refused, or dequantized by the `gguf` package for
`--requantize`.

A GGUF tensor of a quantized type is rows of ggml blocks (`qcli.io.gguf`); each, as llama.cpp lays it out
(ggml-common.h's `block_*` structs, ggml-quants.c's `dequantize_row_*`):
- Q8_0 (32 values): an f16 scale `d`, then 32 int8 codes; value `q * d`.
- Q4_0 (32): an f16 `d`, then 16 bytes whose low nibbles are values 0..15 and high nibbles 16..31;
  value `(nibble - 8) * d`. `d` is negative where the block's largest magnitude is (ggml divides by -8).
- MXFP4 (32): an E8M0 exponent `e`, then 16 bytes of E2M1 codes laid out as Q4_0's nibbles; value
  `2^(e-127) * e2m1(code)`, code 8 (E2M1's -0) decoding to +0.0 as ggml's table has it.
- NVFP4 (64): four UE4M3 scales `d`, one per 16 values, then 32 bytes, 8 to each 16 values: their low
  nibbles values 0..7, their high ones 8..15; value `ue4m3(d) * e2m1(code)`, code 8 as +0.0 again.
- Q2_0 (64): an f16 `d`, then 16 bytes of 2-bit codes, value j in bits 2(j % 4) of byte j / 4;
  value `(q - 1) * d`.
- TQ2_0 (256): 64 bytes of 2-bit codes, then an f16 `d`; each 32 bytes hold 128 values, value 32k + i in
  bits 2k of byte i; value `(q - 1) * d`.
- Q1_0 (128): an f16 `d`, then 16 bytes of bits, value j in bit j % 8 of byte j / 8; value `d` for a 1,
  `-d` for a 0.
Each is Burn's `q * s` with blocks along the row, the codes packed as Burn packs them and the f16 scales as
they are: Q8_0 as Q8S block [32] F16 (where no block holds -128, which Q8S's -127..127 lacks), Q4_0 as Q4F
block [32] F16, Q2_0 as Q2S block [64] F16 and TQ2_0 as Q2S block [128] F16, each scale written for both
halves of its 256 values (where no block holds q = 3, the value 2d, which Q2S's -1..1 lacks: ggml's
quantizers write neither), Q1_0 as Q2S block [128] F16 (codes -1 and 1), NVFP4 as E2M1 block [16] F16
(F16 holds every UE4M3 value). MXFP4's power-of-two scales are written as F16 block scales under one
power-of-two F32 global (4.5 bits a weight, `qcli.formats.e2m1.mx_scales`), the narrowest Burn 0.22.1 loads
E2M1 with: no backend reads UE8M0 scales (4.25 bits) or decodes E2M1 with BF16 ones, wgpu reads F16 and F32
only, flex and ndarray no E2M1 at all (measured, `qcli.burn_backends`). Both sides form each product once
in f32, so the `.bpk` decodes to exactly what llama.cpp dequantizes to. Detection reads the ggml type of
each tensor from the header only; a code a symmetric value lacks is found when the tensor is read.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, ClassVar

from qcli.errors import PlanError
from qcli.formats.e2m1 import mx_scales, positive_zero
from qcli.formats.found import Encoded, Found, Load, Transcode
from qcli.formats.nvfp4 import two_level_e2m1
from qcli.io.gguf import BY_NAME
from qcli.presets import REQUANTIZE_NARROW, REQUANTIZE_WIDE, ZERO_POINT_WHY
from qcli.problem import Kind
from qcli.scheme import LOOKUP_PANICS_AT, LOOKUP_WHY, PackedU32, QuantScheme, QuantValue, ScaleDtype
from qcli.text import printable

if TYPE_CHECKING:
    import torch

    from qcli.formats.declaration import Declaration
    from qcli.io.source import TensorInfo

METHODS: frozenset[str] = frozenset()  # a GGUF file declares no quant_method: its tensor types say it all
NAME = "GGUF"
REQUANTIZED = "types with a minimum, a width or a codebook"
# llama.cpp's module name for the token embedding, which the default policy keeps at 8 bits under a narrower
# preset (`qcli.plan.roles.tensor_role`); its output head, a top-level `output.weight`, has Meta's Llama's name.
EMBEDDING_MODULES = ("token_embd",)
DECODED_AS = "dequantized by the gguf package (gguf.quants.dequantize), then quantized"


def _block_scheme(value: QuantValue, block: int, scale: ScaleDtype = ScaleDtype.F16) -> QuantScheme:
    return QuantScheme().with_value(value).with_store(PackedU32(0)).per_block([block], scale)


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
        """The stored bytes as one row of bytes per ggml block."""
        import torch

        return codes.reshape(-1).view(torch.uint8).reshape(-1, BY_NAME[self.weight.dtype].nbytes)

    @abstractmethod
    def split(self, blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The fields (one row per block) and the scales' payload bytes."""

    def payload(self, codes: torch.Tensor, load: Load) -> torch.Tensor:
        import torch

        from qcli.codec.pack import pack_fields

        fields, scales = self.split(self.blocks(codes))
        return torch.cat([pack_fields(fields.reshape(self.shape), self.scheme), scales])

    def dequantize(self, codes: torch.Tensor, load: Load) -> torch.Tensor:
        return reference_dequantize(self.weight, codes)


def _nibbles(packed: torch.Tensor) -> torch.Tensor:
    """Bytes to their nibbles in order, per row: the low nibbles first, then the high ones."""
    import torch

    return torch.cat([packed & 0xF, packed >> 4], dim=1)


def _crumbs(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """Bytes to their `bits`-wide fields (unsigned), each byte's from its low bits up, byte after byte."""
    import torch

    shifts = torch.arange(0, 8, bits, dtype=torch.uint8)
    return ((packed.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)).reshape(packed.shape[0], -1)


def _f16(data: torch.Tensor) -> torch.Tensor:
    """Two bytes per row as the f16 each holds."""
    import torch

    return data.contiguous().view(torch.float16).reshape(-1)


@dataclass(frozen=True)
class SymmetricBlocks(GgufBlocks):
    """A type whose codes are those of a symmetric Burn value (Q8S, Q2S) under f16 scales, but for one code
    its format allows and that value lacks (`OUTSIDE`), which ggml's quantizer never writes: a tensor that
    holds it in some block is refused, naming the blocks, or under `--requantize` those blocks alone are
    quantized again into the scheme from their values as llama.cpp decodes them."""

    requantize_outside: bool = False

    OUTSIDE: ClassVar[int | None] = None

    @abstractmethod
    def codes(self, blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The int8 codes, one row per Burn block, and each Burn block's f16 scale."""

    def requantizing(self) -> SymmetricBlocks:
        return replace(self, requantize_outside=True)

    def split(self, blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        codes, scales = self.codes(blocks)
        if self.OUTSIDE is not None:
            outside = (codes == self.OUTSIDE).any(dim=1)
            if bool(outside.any()):
                codes, scales = self.requantized(codes, scales, outside)
        return codes, scales.to(torch.float16).contiguous().view(torch.uint8)

    def requantized(self, codes: torch.Tensor, scales: torch.Tensor, outside: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`codes` and `scales` with the blocks `outside` quantized again (MinMax) from their values, or
        `PlanError` naming them unless `--requantize` asked for that."""
        import torch

        from qcli.codec.quantize import quantize_parts

        (count, value), (low, high) = (int(outside.sum()), self.scheme.value), self.scheme.value.range()
        if not self.requantize_outside:
            raise PlanError(printable(
                f"{self.weight.file}: tensor '{self.weight.name}' ({self.format}) holds the code {self.OUTSIDE} in "
                f"{count} of its {outside.numel()} blocks of {codes.shape[1]} values, which {value} ({low:g} "
                f"to {high:g}) does not hold; ggml's quantizer never writes it"),
                hint=f"requantize those blocks alone into {value} with --requantize {REQUANTIZE_NARROW} (the other "
                     "blocks stay exact), or dequantize the tensor with the gguf package and quantize the floats")
        values = codes[outside].to(torch.float32) * scales[outside].to(torch.float32).unsqueeze(1)
        parts = quantize_parts(values, self.scheme, name=self.weight.name)
        codes, scales = codes.clone(), scales.clone()
        codes[outside] = parts.fields.to(torch.int8)
        scales[outside] = parts.scales.reshape(-1).to(scales.dtype)
        return codes, scales

    def dequantize(self, codes: torch.Tensor, load: Load) -> torch.Tensor:
        """`f32(code) * f32(d)`, as ggml's `dequantize_row_*` forms it (the gguf package has no decoder for
        Q1_0 and Q2_0)."""
        import torch

        codes, scales = self.codes(self.blocks(codes))
        return (codes.to(torch.float32) * scales.to(torch.float32).unsqueeze(1)).reshape(self.shape)


class Q8_0(SymmetricBlocks):
    OUTSIDE = -128

    def codes(self, blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        return blocks[:, 2:].contiguous().view(torch.int8), _f16(blocks[:, :2])


class Q2_0(SymmetricBlocks):
    OUTSIDE = 2

    def codes(self, blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        return _crumbs(blocks[:, 2:], 2).to(torch.int8) - 1, _f16(blocks[:, :2])


class Tq2_0(SymmetricBlocks):
    """256 values under one scale, held by two Burn blocks of 128 (Burn's extents stop at 255)."""

    OUTSIDE = 2

    def codes(self, blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        quarters = _crumbs(blocks[:, :64].reshape(-1, 32), 2).reshape(-1, 32, 4)  # per 32 bytes: byte, shift
        codes = quarters.transpose(1, 2).reshape(blocks.shape[0] * 2, 128).to(torch.int8) - 1
        return codes, _f16(blocks[:, 64:66]).repeat_interleave(2)


class Q1_0(SymmetricBlocks):
    def codes(self, blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        return _crumbs(blocks[:, 2:], 1).to(torch.int8) * 2 - 1, _f16(blocks[:, :2])


class Q4_0(GgufBlocks):
    def split(self, blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        import torch

        return _nibbles(blocks[:, 2:]).to(torch.int8) - 8, blocks[:, :2].reshape(-1)


class Mxfp4(GgufBlocks):
    def split(self, blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The E2M1 codes (-0 as +0), then the E8M0 exponents as F16 block scales under a global."""
        codes = positive_zero(_nibbles(blocks[:, 1:]))
        return codes, mx_scales(blocks[:, 0], (codes != 0).any(dim=1), self.weight, "MXFP4")


def ue4m3(codes: torch.Tensor) -> torch.Tensor:
    """ggml's UE4M3 scales in f32 (`ggml_ue4m3_to_fp32`, less its halving, which ggml's doubled E2M1 table
    undoes): exponent bits 6..3 (bias 7), mantissa bits 2..0, subnormal below exponent 1; bit 7 is not read,
    and 0x7F (E4M3's NaN) is 0."""
    import torch

    exponent, mantissa = ((codes >> 3) & 0xF).to(torch.int32), (codes & 0x7).to(torch.float32)
    normal = torch.ldexp(1 + mantissa / 8, exponent - 7)
    values = torch.where(exponent == 0, torch.ldexp(mantissa, torch.tensor(-9)), normal)
    return torch.where(codes == 0x7F, 0.0, values)


class Nvfp4(GgufBlocks):
    def split(self, blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The E2M1 codes (-0 as +0), a row per 16, then the UE4M3 scales in F16, which holds each exactly."""
        import torch

        codes = positive_zero(_nibbles(blocks[:, 4:].reshape(-1, 8)))
        return codes, ue4m3(blocks[:, :4].reshape(-1)).to(torch.float16).view(torch.uint8)


TRANSCODES = {
    "Q8_0": (Q8_0, _block_scheme(QuantValue.Q8S, 32)),
    "Q4_0": (Q4_0, _block_scheme(QuantValue.Q4F, 32)),
    "MXFP4": (Mxfp4, two_level_e2m1(32)),
    "NVFP4": (Nvfp4, _block_scheme(QuantValue.E2M1, 16)),
    "Q2_0": (Q2_0, _block_scheme(QuantValue.Q2S, 64)),
    "TQ2_0": (Tq2_0, _block_scheme(QuantValue.Q2S, 128)),
    "Q1_0": (Q1_0, _block_scheme(QuantValue.Q2S, 128)),
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
    "IQ4_NL": _codebook("4-bit indices into a 16-entry non-linear codebook (kvalues_iq4nl) with an f16 scale per 32"),
    "IQ4_XS": _codebook("4-bit indices into a 16-entry non-linear codebook (kvalues_iq4nl) with 6-bit scales"),
    **{name: _codebook(_LATTICE) for name in ("IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S")},
}
# Types the gguf package has no decoder for: nothing to transcode against, nothing to requantize from.
UNDECODED = {
    "Q8_1": "llama.cpp's in-memory type for dot products, which its converter and quantizer never write",
    "Q8_K": "llama.cpp's in-memory type for dot products, which its converter and quantizer never write",
}


@dataclass(frozen=True)
class GgufEncoded(Encoded):
    """A GGUF tensor of a type no Burn scheme holds, dequantized by the gguf package for `--requantize`."""

    refusal: Refusal

    decoded_as = DECODED_AS

    @property
    def kind(self) -> Kind:
        return self.refusal.kind

    @property
    def encoding(self) -> str:
        return self.refusal.encoding

    @property
    def offered(self) -> str:
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
