"""FP8 checkpoints into Burn's QFloat layout, their codes unchanged (docs/input-formats.md).

An F8_E4M3 or F8_E5M2 checkpoint tensor with a scale companion decodes as `f32(code) * scale`, which is
Burn's E4M3 or E5M2 decode once the scale is repeated over Burn blocks that each lie inside one of the
checkpoint's scale blocks: the payload's values are the checkpoint's code bytes, packed as Burn packs
minifloats (four to a little-endian u32, each row padded to whole words), and its scales the
checkpoint's, in f32. No value is rounded, so the `.bpk` decodes to exactly what the checkpoint does.
Detection reads headers (and a folder's `config.json`) only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from qcli.formats.declaration import quantization_config
from qcli.formats.found import Found, Load, Transcode
from qcli.formats.grid import ScaleGrid
from qcli.io.dtypes import EXACT_FLOAT_DTYPES
from qcli.scheme import PackedU32, QuantScheme, QuantValue, ScaleDtype

if TYPE_CHECKING:
    import torch

    from qcli.formats.declaration import Declaration
    from qcli.io.source import TensorInfo

# The quant_methods of the config.json that declare these: transformers' FineGrainedFP8Config (DeepSeek's
# blocks), FbgemmFp8Config (`weight` E4M3 with `weight_scale` [out, 1] F32 per row, and an activation
# bound `input_scale_ub` kept as it is).
METHODS = frozenset({"fp8", "fbgemm_fp8"})
NAME = "FP8"
REQUANTIZED = None
# The scale companions of a weight `W`: `W_scale` (`m.weight_scale`), `W_scale_inv` (DeepSeek: it
# multiplies the weight despite its name), `W.scale`.
SCALE_SUFFIXES = ("_scale_inv", "_scale", ".scale")
SCALE_DTYPES = EXACT_FLOAT_DTYPES  # each widens to f32 exactly
DEEPSEEK_BLOCK = (128, 128)  # DeepSeek-V3's weight_block_size, where no config.json says otherwise
# safetensors' FP8 dtypes -> Burn's value of the same bits, packed four to a u32 as Burn packs minifloats
VALUES = {"F8_E4M3": QuantValue.E4M3, "F8_E5M2": QuantValue.E5M2}


@dataclass(frozen=True)
class Fp8(Transcode):
    """An F8_E4M3 or F8_E5M2 weight and its scale companion (`companions[0]`): the checkpoint's layout and
    how its scales cover the tensor."""

    layout: str  # "per-tensor", "per-channel", "block [128, 128]"
    grid: ScaleGrid

    def payload(self, codes: torch.Tensor, load: Load) -> torch.Tensor:
        """The codes packed as Burn packs minifloats, then the scales in f32, one per Burn block."""
        import torch

        from qcli.codec.pack import pack_fields, pack_scales

        fields = codes.reshape(-1).view(torch.uint8).reshape(self.shape)
        scales = self.grid.burn_scales(self.scales(load))
        return torch.cat([pack_fields(fields, self.scheme), pack_scales(scales, ScaleDtype.F32)])

    def dequantize(self, codes: torch.Tensor, load: Load) -> torch.Tensor:
        """Each code times the scale of the block it lies in, in f32, as torch computes
        `w.to(torch.float32) * scale`."""
        import torch

        scales = self.grid.per_value(self.scales(load))
        return codes.reshape(self.shape).to(torch.float32) * scales.to(torch.float32)

    def scales(self, load: Load) -> torch.Tensor:
        """The checkpoint's scales, in its order: its scale companion as stored."""
        return load(self.companions[0].name)


class ScaleOwners:
    """Whose scale a tensor is, by its name alone, among a checkpoint's already-quantized tensors: `W_scale`,
    `W_scale_inv` and `W.scale` are `W`'s (`SCALE_SUFFIXES`), a `…scale…` leaf of a module that holds one
    (`m.input_scale`) that one's (the first by name)."""

    def __init__(self, quantized: Iterable[str]) -> None:
        self.quantized = set(quantized)
        self.modules: dict[str, str] = {}
        for name in sorted(self.quantized):
            self.modules.setdefault(name.rpartition(".")[0], name)

    def of(self, name: str) -> str | None:
        """The already-quantized tensor `name` holds the scale of (`w_scale`, `w_scale_inv`, `w.scale`,
        `m.weight_scale`, `m.input_scale`), or None."""
        for suffix in SCALE_SUFFIXES:
            if name.endswith(suffix) and name[: -len(suffix)] in self.quantized:
                return name[: -len(suffix)]
        module, _, leaf = name.rpartition(".")
        return self.modules.get(module) if "scale" in leaf else None


def detect(infos: Sequence[TensorInfo], declared: Declaration | None) -> dict[str, Found]:
    """Each F8 tensor with a scale companion beside it (by the names checkpoints give it): its transcode,
    or why Burn has no exact form for it."""
    by_name = {i.name: i for i in infos}
    block = block_size(quantization_config(declared))
    found: dict[str, Found] = {}
    for info in infos:
        scale = next((by_name[info.name + s] for s in SCALE_SUFFIXES if info.name + s in by_name), None)
        if info.dtype.startswith("F8_") and scale is not None:
            found[info.name] = plan(info, scale, block)
    return found


def block_size(config: dict[str, Any]) -> tuple[int, int] | None:
    """The `weight_block_size` of a checkpoint's `quantization_config`, or None."""
    size = config.get("weight_block_size")
    if isinstance(size, list) and len(size) == 2 and all(isinstance(d, int) and d > 0 for d in size):
        return (size[0], size[1])
    return None


def plan(info: TensorInfo, scale: TensorInfo, block: tuple[int, int] | None) -> Found:
    """The transcode of F8 tensor `info` with its `scale`, or why Burn has no exact form for it.
    `block`: the checkpoint's block size where its config names one."""
    if info.dtype not in VALUES:
        return f"{info.dtype} with a scale tensor has no transcode: Burn has no value type of its bits"
    if scale.dtype not in SCALE_DTYPES:
        return f"its scale {scale.name} is {scale.dtype}, not one of {', '.join(SCALE_DTYPES)}"
    shape, scales = tuple(info.shape), tuple(scale.shape)
    if not shape or 0 in shape:
        return "a 0-D or empty tensor has no block to hold a scale"

    if math.prod(scales) == 1 and len(scales) <= 1:
        return transcode(info, scale, "per-tensor", shape)
    if len(shape) != 2:
        return f"scale {list(scales)} for a tensor of rank {len(shape)}: only 2-D weights have channels and blocks"
    rows, cols = shape
    if scales in ((rows,), (rows, 1)):
        return transcode(info, scale, "per-channel", (1, cols))
    size = block or DEEPSEEK_BLOCK
    if scales == (math.ceil(rows / size[0]), math.ceil(cols / size[1])):
        return transcode(info, scale, f"block {list(size)}", size)
    return (f"its scale {scale.name} {list(scales)} is neither per tensor, per channel ([{rows}] or [{rows}, 1]) "
            f"nor blocks {list(size)} of {list(shape)}")


def transcode(info: TensorInfo, scale: TensorInfo, layout: str, covers: tuple[int, ...],
              format: str | None = None) -> Fp8:
    """FP8 tensor `info` (F8_E4M3 or F8_E5M2) whose `scale`s each cover a box of `covers`, as Burn's
    minifloat of its bits with f32 scales: per tensor where one scale covers it all. `format`: how inspect
    names it, by default its dtype and layout."""
    grid = ScaleGrid(tuple(info.shape), covers)
    values = QuantScheme().with_value(VALUES[info.dtype]).with_store(PackedU32(0))
    return Fp8(info, format or f"{info.dtype} with {layout} scales", grid.scheme(values), (scale,), layout, grid)
