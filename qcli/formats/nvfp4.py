"""NVIDIA's NVFP4 checkpoints into Burn's two-level E2M1 QFloat, their codes unchanged (docs/input-formats.md).

TensorRT Model Optimizer (`nvidia-modelopt`) exports an NVFP4 linear `m` as `m.weight` (U8 [out, in/2], two
E2M1 codes a byte, the first in the low nibble), `m.weight_scale` (F8_E4M3 [out, in/16], one scale per
16 values of a row), `m.weight_scale_2` (one F32, the global scale) and `m.input_scale` (one F32, the
activation scale). Its dequantization (`NVFP4QTensor.dequantize`) forms each block's scale as
`f32(weight_scale) * weight_scale_2` in f32 and multiplies the code's E2M1 value by it, which is Burn's
two-level decode, `(global * block) * value`, formed in f32 in that order. The codes are packed as Burn
packs E2M1 (eight to a little-endian u32, the first in the low bits: the checkpoint's bytes themselves),
the E4M3 scales held in F16, which holds every E4M3 value, since Burn 0.22.1's wgpu reads no UE4M3 scales,
and the global as Burn's f32 global. Detection reads the names, dtypes and shapes only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from qcli.formats.e2m1 import e2m1_codes, positive_zero
from qcli.formats.found import Found, Load, Transcode
from qcli.scheme import MAX_BLOCK_EXTENT, PackedU32, QuantScheme, QuantValue, ScaleDtype

if TYPE_CHECKING:
    import torch

    from qcli.formats.declaration import Declaration
    from qcli.io.source import TensorInfo

METHODS = frozenset({"modelopt"})  # the quant_method values this module reads
NAME = "NVFP4 (TensorRT Model Optimizer)"
REQUANTIZED = None
SCALE, GLOBAL = "_scale", "_scale_2"  # `m.weight_scale`, `m.weight_scale_2`
PRE_QUANT_SCALE = "pre_quant_scale"  # AWQ's (NVFP4_AWQ, NVFP4_SVD): the input is scaled first
# modelopt's E2M1 table (`e2m1_values`), by code: sign bit 3, then two exponent bits and one mantissa bit;
# code 8, the negative zero, is +0.0 there.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def two_level_e2m1(group: int) -> QuantScheme:
    """E2M1 in PackedU32, blocks of `group` along the row with F16 scales under an F32 global: NVFP4 as
    Burn 0.22.1's wgpu loads it (Burn's own `QuantScheme::nvfp4()`, UE4M3 in PackedNative, loads nowhere)."""
    return (QuantScheme().with_value(QuantValue.E2M1).with_store(PackedU32(0))
            .per_block([group], ScaleDtype.F16).per_tensor(ScaleDtype.F32))


@dataclass(frozen=True)
class Nvfp4(Transcode):
    """An NVFP4 weight, its block scales (`companions[0]`) and its global scale (`companions[1]`)."""

    group: int = 16  # values per block scale, along the row

    @property
    def shape(self) -> tuple[int, ...]:
        rows, half = self.weight.shape
        return (rows, 2 * half)

    def payload(self, codes: torch.Tensor, load: Load) -> torch.Tensor:
        """The codes packed as Burn packs E2M1 (code 8 as code 0: modelopt decodes it to +0.0, Burn to
        -0.0), the block scales in F16, the global in f32."""
        import torch

        from qcli.codec.pack import pack_fields, pack_global, pack_scales

        fields = positive_zero(e2m1_codes(codes, self.shape))
        scales, global_scale = self.scales(load)
        return torch.cat([pack_fields(fields, self.scheme), pack_scales(scales, ScaleDtype.F16),
                          pack_global(float(global_scale))])

    def dequantize(self, codes: torch.Tensor, load: Load) -> torch.Tensor:
        """modelopt's `NVFP4QTensor.dequantize` in f32: each code's E2M1 value times its block's
        `f32(weight_scale) * weight_scale_2`, the scale's product formed first."""
        import torch

        values = torch.tensor(E2M1_VALUES, dtype=torch.float32)[e2m1_codes(codes, self.shape).to(torch.int64)]
        scales, global_scale = self.scales(load)
        blocks = values.reshape(self.shape[0], -1, self.group) * (scales * global_scale).unsqueeze(-1)
        return blocks.reshape(self.shape)

    def scales(self, load: Load) -> tuple[torch.Tensor, torch.Tensor]:
        """The block scales in f32 ([out, in/group]) and the 0-D f32 global."""
        import torch

        block, global_scale = (load(c.name) for c in self.companions)
        return block.to(torch.float32), global_scale.to(torch.float32).reshape(())


def detect(infos: Sequence[TensorInfo], declared: Declaration | None) -> dict[str, Found]:
    """Each U8 weight beside an F8_E4M3 `_scale` and a `_scale_2` (modelopt's names): its transcode, or why
    Burn has no exact form for it."""
    by_name = {i.name: i for i in infos}
    found: dict[str, Found] = {}
    for info in infos:
        scale, global_scale = by_name.get(info.name + SCALE), by_name.get(info.name + GLOBAL)
        if info.dtype == "U8" and scale is not None and scale.dtype == "F8_E4M3" and global_scale is not None:
            module = info.name.rpartition(".")[0]
            pre_quant = by_name.get(f"{module}.{PRE_QUANT_SCALE}" if module else PRE_QUANT_SCALE)
            found[info.name] = plan(info, scale, global_scale, pre_quant)
    return found


def plan(info: TensorInfo, scale: TensorInfo, global_scale: TensorInfo, pre_quant: TensorInfo | None) -> Found:
    """The transcode of NVFP4 weight `info` with its block and global scales, or why it has none."""
    if pre_quant is not None:
        return (f"its input is multiplied by {pre_quant.name} before the product (AWQ), which a Burn Linear "
                "does not do")
    if global_scale.dtype != "F32" or len(global_scale.shape) > 1 or sum(global_scale.shape) > 1:
        return f"its global scale {global_scale.name} is {global_scale.dtype} {list(global_scale.shape)}, not one F32"
    if len(info.shape) != 2 or 0 in info.shape:
        return f"NVFP4 codes of shape {list(info.shape)}: only non-empty 2-D weights have rows of blocks"
    rows, cols = info.shape[0], 2 * info.shape[1]
    blocks = tuple(scale.shape)
    if len(blocks) != 2 or blocks[0] != rows or not blocks[1] or cols % blocks[1]:
        return f"its scale {scale.name} {list(blocks)} is not one per block of a row of [{rows}, {cols}]"
    group = cols // blocks[1]
    if group > MAX_BLOCK_EXTENT or group % 8:
        return (f"blocks of {group} values: a PackedU32 block holds whole u32 words of 8 E2M1 values, up to "
                f"{MAX_BLOCK_EXTENT}")
    return Nvfp4(info, f"NVFP4 group {group}", two_level_e2m1(group),
                 (scale, global_scale), group)
