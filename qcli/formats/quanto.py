"""optimum-quanto checkpoints (`freeze`d modules' state dicts, `quanto_qmap.json` beside): 8-bit weights
transcoded with their codes unchanged, 4- and 2-bit ones refused or dequantized (docs/input-formats.md).

quanto serializes a quantized weight `m.weight` by its inner tensors:
- qint8, qfloat8 (`WeightQBytesTensor`): `m.weight._data` (I8, F8_E4M3 or F8_E5M2 `[out, in]`) and
  `m.weight._scale` (`[out, 1]` in the model's float dtype). Its dequantization is `scale * code` (the code
  widened to the scale's dtype): per channel, Burn's `f32(code) * scale` with Q8F or the minifloat of the
  code's bits and the scale repeated over blocks inside the row, one f32 product. With F32 scales that is
  quanto's value bit for bit; with F16 or BF16 scales quanto rounds the product once to that dtype, which is
  what the f32 value becomes when a model in that dtype takes it.
- qint4, qint2 (`WeightQBitsTensor`): `m.weight._data._data` (U8, the unsigned codes of the weight grouped as
  `[n, group]` row-major, packed along axis 0: byte `r` holds rows `r`, `r + rows`, ... from its low bits up),
  `m.weight._scale` and `m.weight._shift` (`[n, 1]`); its dequantization `scale * code - shift` has a zero
  point, which no Burn scheme holds. The weight's `[out, in]` is not in the checkpoint (quanto takes it from
  the model): it is read from `m.bias` where there is one, or from a group wider than quanto's 128.
`quanto_qmap.json` names each module's weight type; detection reads it and the headers only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from qcli.errors import InputError
from qcli.formats import fp8
from qcli.formats.found import Encoded, Found, Load
from qcli.formats.grid import ScaleGrid
from qcli.io.files import load_json
from qcli.presets import REQUANTIZE_NARROW, ZERO_POINT_WHY
from qcli.problem import Kind
from qcli.scheme import PackedU32, QuantScheme, QuantValue

if TYPE_CHECKING:
    from pathlib import Path

    import torch

    from qcli.formats.declaration import Declaration
    from qcli.io.source import TensorInfo

METHODS = frozenset({"quanto"})  # the quant_method of the config.json that declares these (QuantoConfig)
NAME = "optimum-quanto"
REQUANTIZED = "4- and 2-bit weights"
QMAP = "quanto_qmap.json"
DATA, SCALE, SHIFT = "._data", "._scale", "._shift"
VALUES = {"I8": QuantValue.Q8F, **fp8.VALUES}  # the codes' dtype -> Burn's value of the same bits
QTYPES = {"I8": "qint8", "F8_E4M3": "qfloat8_e4m3fn", "F8_E5M2": "qfloat8_e5m2"}
BITS = {"qint4": 4, "qint2": 2}
LARGEST_GROUP = 128  # quanto groups a row of more inputs in at most 128 (qmodule.py)


@dataclass(frozen=True)
class Bytes(fp8.Fp8):
    """A qint8 or qfloat8 weight, packed and decoded as an FP8 per-channel transcode is, written as `m.weight`."""

    @property
    def name(self) -> str:
        return self.weight.name.removesuffix(DATA)


@dataclass(frozen=True)
class Bits(Encoded):
    """A qint4 or qint2 weight (`weight` its packed codes, `companions` its scale and shift)."""

    bits: int
    out_in: tuple[int, int]

    kind = Kind.scheme
    encoding = "a zero point"
    decoded_as = "dequantized as optimum-quanto does (scale * code - shift), then quantized"

    @property
    def offered(self) -> str:
        return REQUANTIZE_NARROW if self.bits == 4 else "q2s-b32"

    @property
    def name(self) -> str:
        return self.weight.name.removesuffix(DATA + DATA)

    @property
    def why(self) -> str:
        return (f"{self.bits}-bit unsigned codes with a scale and a shift per group of {self.weight.shape[1]} "
                f"(scale * code - shift): {ZERO_POINT_WHY}")

    @property
    def shape(self) -> tuple[int, ...]:
        return self.out_in

    @property
    def dtype(self) -> str:
        return self.companions[0].dtype

    def dequantize(self, load: Load) -> torch.Tensor:
        """quanto's `QBitsDequantizer`: the codes unpacked, `scale * code - shift` in the scale's dtype (a
        shift of integers taken from the code first), as `[out, in]`."""
        import torch

        packed = load(self.weight.name).reshape(self.weight.shape)
        per_byte, mask = 8 // self.bits, (1 << self.bits) - 1
        codes = torch.cat([(packed >> (self.bits * i)) & mask for i in range(per_byte)])
        scale, shift = (load(c.name) for c in self.companions)
        codes = codes[: scale.shape[0]]
        if shift.dtype.is_floating_point:
            values = scale * codes.to(scale.dtype) - shift
        else:
            values = scale * (codes.to(torch.int8) - shift.to(torch.int8)).to(scale.dtype)
        return values.reshape(self.out_in)


def detect(infos: Sequence[TensorInfo], declared: Declaration | None) -> dict[str, Found]:
    """Each quanto weight (`m.weight._data` beside `m.weight._scale`) by the name of its codes."""
    by_name = {i.name: i for i in infos}
    qmap = weight_types(infos[0].file.parent / QMAP) if infos else {}
    found: dict[str, Found] = {}
    for info in infos:
        if info.name.endswith(DATA + DATA):
            weight = info.name.removesuffix(DATA + DATA)
            scale, shift = by_name.get(weight + SCALE), by_name.get(weight + SHIFT)
            if scale is not None and shift is not None:
                found[info.name] = bits(info, scale, shift, qmap.get(weight.removesuffix(".weight")), by_name)
        elif info.name.endswith(DATA) and info.name.removesuffix(DATA) + SCALE in by_name:
            weight = info.name.removesuffix(DATA)
            if weight + SHIFT not in by_name:
                found[info.name] = per_channel(info, by_name[weight + SCALE])
    return found


def weight_types(path: Path) -> dict[str, str]:
    """`quanto_qmap.json`'s weight type by module, or {} where there is none or it is not quanto's."""
    try:
        qmap = load_json(path, "") if path.exists() else {}
    except InputError:
        return {}
    return {m: q["weights"] for m, q in qmap.items() if isinstance(q, dict) and isinstance(q.get("weights"), str)} \
        if isinstance(qmap, dict) else {}


def per_channel(info: TensorInfo, scale: TensorInfo) -> Found:
    """The transcode of qint8 or qfloat8 codes `info` with their per-channel `scale`, or why there is none."""
    if info.dtype not in VALUES:
        return f"quanto codes of {info.dtype} have no transcode: Burn has no value type of their bits"
    if len(info.shape) != 2 or 0 in info.shape:
        return f"quanto codes {list(info.shape)}: only non-empty 2-D weights have per-channel scales"
    rows, cols = info.shape
    if scale.dtype not in fp8.SCALE_DTYPES or tuple(scale.shape) not in ((rows, 1), (rows,)):
        return f"its scale {scale.name} is {scale.dtype} {list(scale.shape)}, not one of [{rows}, 1] per channel"
    grid = ScaleGrid((rows, cols), (1, cols))
    values = QuantScheme().with_value(VALUES[info.dtype]).with_store(PackedU32(0))
    return Bytes(info, f"quanto {QTYPES[info.dtype]} per channel", grid.scheme(values), (scale,), "per-channel", grid)


def bits(info: TensorInfo, scale: TensorInfo, shift: TensorInfo, qtype: str | None,
         by_name: dict[str, TensorInfo]) -> Found:
    """The refused qint4 or qint2 weight whose packed codes are `info`, or why it cannot even be dequantized."""
    rows = scale.shape[0] if len(scale.shape) == 2 and scale.shape[1] == 1 else None
    if info.dtype != "U8" or len(info.shape) != 2 or rows is None or tuple(shift.shape) != tuple(scale.shape):
        return (f"quanto's packed codes {info.dtype} {list(info.shape)} with scale {list(scale.shape)} and shift "
                f"{list(shift.shape)} are not the U8 [rows, group] and [n, 1] it writes")
    width = BITS.get(qtype or "") or next((b for b in (4, 2) if math.ceil(rows / (8 // b)) == info.shape[0]), None)
    if width is None or math.ceil(rows / (8 // width)) != info.shape[0]:
        return f"its {QMAP} names weight type {qtype!r}, not qint4 or qint2 codes of {list(info.shape)}"
    numel, bias = rows * info.shape[1], by_name.get(info.name.removesuffix(".weight" + DATA + DATA) + ".bias")
    if bias is not None and len(bias.shape) == 1 and bias.shape[0] and numel % bias.shape[0] == 0:
        out_in = (bias.shape[0], numel // bias.shape[0])
    elif info.shape[1] > LARGEST_GROUP:  # not grouped: the codes' rows are the weight's
        out_in = (rows, info.shape[1])
    else:
        return (f"the [out, in] its {numel} codes dequantize to is not in the checkpoint (quanto takes it from the "
                f"model; no bias beside gives out)")
    name = f"quanto {qtype or f'qint{width}'}"
    return Bits(info, name, (scale, shift), width, out_in)
