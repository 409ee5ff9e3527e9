"""llm-compressor's compressed-tensors checkpoints into Burn's QFloat layout (docs/input-formats.md).

A folder whose `config.json` has `quantization_config.quant_method = "compressed-tensors"` says, per
config group, which modules it quantizes (`targets`: module names, `re:` patterns, module types; less
`ignore`) and how (`weights`: `num_bits`, `type`, `symmetric`, `strategy`, `group_size`,
`block_structure`), in a `format` of its own or the top-level one. A quantized module `M` stores, by format:
- pack-quantized: `M.weight_packed` (I32; b-bit codes stored as `q + 2^(b-1)`, densely, element i of a
  row at bit `i * b` of the row's words, each row padded to whole words), `M.weight_scale`,
  `M.weight_shape` (I64, the dequantized shape) and, where asymmetric, `M.weight_zero_point` (packed the
  same way down the columns of its grid);
- int-quantized or naive-quantized: `M.weight` (I8 codes) and `M.weight_scale` (and the zero point);
- float-quantized: `M.weight` (F8_E4M3 codes) and `M.weight_scale` (`qcli.formats.fp8` transcodes it);
- nvfp4-pack-quantized: `M.weight_packed` (U8, E2M1 pairs), `M.weight_scale` (F8_E4M3, one per 16 along
  the row) and `M.weight_global_scale` (F32 [1]);
- mxfp4-pack-quantized: `M.weight_packed` (U8, E2M1 pairs) and `M.weight_scale` (U8 E8M0 exponents, one
  per 32 along the row), written as `qcli.formats.e2m1.mx_scales` writes MX scales.
Its decompressors compute `(q - zero_point) * scale` in the scale's dtype, each scale covering the whole
tensor, a row (channel), `group_size` values of a row, or a `block_structure` box; for NVFP4
`q * (scale / global_scale)` in f32, then rounded to bf16. Symmetric 2-, 4- and 8-bit codes are Burn's
Q2F, Q4F and Q8F (the full range `[-2^(b-1), 2^(b-1) - 1]` compressed-tensors rounds onto), so Burn's
`q * s` holds them with the checkpoint's scales (`qcli.formats.grid`) in f32; NVFP4 with f32 block scales
`scale / global_scale` formed as compressed-tensors forms them, because Burn's two-level decode multiplies
by its global scale where compressed-tensors divides. Zero points and other widths have no Burn form.
Detection reads headers and `config.json` only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar, TypeGuard

from qcli.errors import InputError
from qcli.formats import fp8
from qcli.formats.declaration import quantization_config
from qcli.formats.e2m1 import E8M0_BIAS, e2m1_codes, mx_scales
from qcli.formats.found import Encoded, Found, Load, Transcode
from qcli.formats.grid import ScaleGrid
from qcli.formats.nvfp4 import two_level_e2m1
from qcli.io.dtypes import EXACT_FLOAT_DTYPES
from qcli.patterns import PatternRefused, regex_matcher
from qcli.presets import REQUANTIZE_NARROW, REQUANTIZE_WIDE, ZERO_POINT_WHY
from qcli.problem import Kind
from qcli.scheme import PackedU32, QuantScheme, QuantValue, ScaleDtype
from qcli.text import printable, shown

if TYPE_CHECKING:
    import torch

    from qcli.formats.declaration import Declaration
    from qcli.io.source import TensorInfo

METHOD = "compressed-tensors"  # config.json's quant_method
METHODS = frozenset({METHOD})  # the quant_method values this module reads
NAME = "compressed-tensors"
REQUANTIZED = "zero points and widths Burn lacks"
# A quantized module's tensors, by their dtype: its layout, and the formats config.json may name for it.
LAYOUTS = {
    ("weight_packed", "I32"): ("pack-quantized", ("pack-quantized",)),
    ("weight_packed", "U8"): ("nvfp4-pack-quantized", ("nvfp4-pack-quantized", "mxfp4-pack-quantized")),
    ("weight", "I8"): ("int-quantized", ("int-quantized", "naive-quantized")),
    ("weight", "F8_E4M3"): ("float-quantized", ("float-quantized", "naive-quantized")),
}
NOT_YET = ("mxfp6-pack-quantized", "mxfp8-quantized")  # known, not transcoded
MX_GROUP = 32
COMPANIONS = ("weight_scale", "weight_zero_point", "weight_shape", "weight_global_scale")
SCALE_DTYPES = EXACT_FLOAT_DTYPES  # what its scales are in, each widened to f32 exactly
# Symmetric b-bit integers: compressed-tensors rounds onto [-2^(b-1), 2^(b-1) - 1], Burn's full range.
INTEGERS = {2: QuantValue.Q2F, 4: QuantValue.Q4F, 8: QuantValue.Q8F}
E2M1_PACKED = QuantScheme().with_value(QuantValue.E2M1).with_store(PackedU32(0))  # its scales still to choose
NVFP4_GROUP = 16
HINT = "re-save the checkpoint with compressed-tensors, or dequantize it first"
DECODED_AS = "dequantized as compressed-tensors does, then quantized"


@dataclass(frozen=True)
class Weights:
    """One config group's `weights`, as config.json spells them."""

    num_bits: int
    type: str  # "int" or "float"
    symmetric: bool
    strategy: str  # "tensor", "channel", "group", "tensor_group", "block"
    group_size: int | None
    block_structure: tuple[int, int] | None

    @staticmethod
    def of(obj: object) -> Weights | str:
        """The weights of a config group, or why they are not compressed-tensors' weights."""
        if not isinstance(obj, dict):
            return f"its weights are {type(obj).__name__}, not an object"
        size, block = obj.get("group_size"), obj.get("block_structure")
        num_bits, kind, symmetric, strategy = (obj.get("num_bits"), obj.get("type"), obj.get("symmetric", True),
                                               obj.get("strategy"))
        if (not _positive(num_bits) or not isinstance(kind, str) or kind not in ("int", "float")
                or not isinstance(symmetric, bool) or not isinstance(strategy, str)
                or strategy not in ("tensor", "channel", "group", "tensor_group", "block")):
            return f"its weights {printable(str(obj))} are not compressed-tensors' weights"
        sizes = (block[0], block[1]) if isinstance(block, list) and len(block) == 2 and all(map(_positive, block)) \
            else None
        weights = Weights(num_bits, kind, symmetric, strategy, size if _positive(size) else None, sizes)
        if weights.strategy in ("group", "tensor_group") and weights.group_size is None:
            return f"strategy {weights.strategy} with group_size {printable(str(size))}"
        if weights.strategy == "block" and weights.block_structure is None:
            return f"strategy block with block_structure {printable(str(block))}"
        return weights

    def describe(self) -> str:
        """`int4 group 128`, `fp8 channel`, `int8 block [128, 128]`."""
        how = {"group": f"group {self.group_size}", "tensor_group": f"group {self.group_size}",
               "block": f"block {list(self.block_structure or ())}"}.get(self.strategy, self.strategy)
        return f"{'int' if self.type == 'int' else 'fp'}{self.num_bits} {how}{'' if self.symmetric else ' asymmetric'}"

    def covers(self, shape: tuple[int, int]) -> tuple[int, int]:
        """The box of a tensor of `shape` each scale covers."""
        if self.strategy == "tensor":
            return shape
        if self.strategy == "channel":
            return (1, shape[1])
        if self.block_structure is not None and self.strategy == "block":
            return self.block_structure
        assert self.group_size is not None, "a group strategy has its size (`of`)"
        return (1, self.group_size)


@dataclass(frozen=True)
class Group:
    """A config group: its name, its `targets`, the format its modules are stored in (None: not said)."""

    name: str
    targets: tuple[str, ...]
    format: str | None
    weights: Weights | str


def groups(config: dict[str, Any]) -> list[Group]:
    """The config groups that quantize weights, in config.json's order."""
    top = config.get("format") if config.get("format") != "mixed-precision" else None
    found = []
    raw = config.get("config_groups")
    for name, group in (raw.items() if isinstance(raw, dict) else ()):
        if not isinstance(group, dict) or group.get("weights") is None:
            continue
        targets = group.get("targets")
        form = group.get("format") or top
        found.append(Group(str(name), tuple(t for t in targets if isinstance(t, str)) if isinstance(targets, list)
                           else (), form if form is None or isinstance(form, str) else shown(form),
                           Weights.of(group["weights"])))
    return found


def group_of(module: str, found: Sequence[Group]) -> Group | str:
    """The config group that quantized `module`, as compressed-tensors picks it: an exact name among the
    targets first, then a `re:` pattern (in sorted order), then a module type (a target that is not a
    module name: Linear). The headers hold no module types, so where several groups target types, they
    must agree on the weights."""
    by_target: dict[str, Group] = {}
    for group in found:  # a later group takes a target an earlier one names
        by_target.update(dict.fromkeys(group.targets, group))
    named = []
    for target in sorted(by_target, key=lambda t: (t.startswith("re:"), t)):
        try:
            if target == module or target.startswith("re:") and regex_matcher(f"(?:{target[3:]}).*")(module):
                named.append(by_target[target])
        except PatternRefused as exc:
            return f"its config group {by_target[target].name}'s target {printable(target)} cannot be matched: {exc}"
    if named:
        return named[0]
    typed = list({id(g): g for t, g in by_target.items() if not t.startswith("re:") and t[:1].isupper()}.values())
    if not typed:
        return "no config group of config.json targets it"
    if len({g.weights for g in typed}) > 1:
        return (f"config groups {', '.join(g.name for g in typed)} target module types with other weights, and "
                "the checkpoint's headers do not say which module is of which type")
    return typed[0]


@dataclass(frozen=True)
class Gridded(Transcode):
    """A compressed-tensors weight written under its module's `weight` name, its scales over `grid`."""

    grid: ScaleGrid

    @property
    def name(self) -> str:
        return weight_name(self.weight)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.grid.shape


@dataclass(frozen=True)
class Integers(Gridded):
    """Symmetric 2-, 4- or 8-bit integer codes (I32 words of pack-quantized, or I8) and their scales
    (`companions[0]`; pack-quantized's weight_shape, `companions[1]`, checked as the codes are read)."""

    weights: Weights

    def payload(self, codes: torch.Tensor, load: Load) -> torch.Tensor:
        """The codes packed as Burn packs integers, then the scales in f32, one per Burn block."""
        import torch

        from qcli.codec.pack import pack_fields, pack_scales

        fields = stored_codes(self.weight, codes, self.companions, self.weights.num_bits, self.shape, load)
        scales = self.grid.burn_scales(load(self.companions[0].name))
        return torch.cat([pack_fields(fields, self.scheme), pack_scales(scales, ScaleDtype.F32)])

    def dequantize(self, codes: torch.Tensor, load: Load) -> torch.Tensor:
        """`q * scale` in f32: compressed-tensors' arithmetic in f32, which it rounds once to the scale's
        dtype (the f32 product of a code and a BF16 or F16 scale is exact)."""
        import torch

        fields = stored_codes(self.weight, codes, self.companions, self.weights.num_bits, self.shape, load)
        return fields.to(torch.float32) * self.grid.per_value(load(self.companions[0].name)).to(torch.float32)


@dataclass(frozen=True)
class Nvfp4(Gridded):
    """NVFP4 codes and their scales (`companions`: weight_scale, weight_global_scale), as E2M1 with one f32
    scale per 16 values: `scale / global_scale`, as compressed-tensors forms it."""

    def scales(self, load: Load) -> torch.Tensor:
        """Each group's f32 scale: its F8_E4M3 scale divided by the global one, rounded once."""
        import torch

        scale, global_scale = (load(c.name).to(torch.float32) for c in self.companions)
        return scale.reshape(self.grid.grid) / global_scale.reshape(())

    def payload(self, codes: torch.Tensor, load: Load) -> torch.Tensor:
        import torch

        from qcli.codec.pack import pack_fields, pack_scales

        fields = e2m1_codes(codes, self.shape)
        return torch.cat([pack_fields(fields, self.scheme), pack_scales(self.grid.burn_scales(self.scales(load)),
                                                                        ScaleDtype.F32)])

    def dequantize(self, codes: torch.Tensor, load: Load) -> torch.Tensor:
        """`q * (scale / global_scale)` in f32, as compressed-tensors computes it before rounding to bf16
        (its code 8 is -0.0, as Burn's)."""
        from qcli.codec import minifloat
        from qcli.scheme import E2M1

        return minifloat.decode(e2m1_codes(codes, self.shape), E2M1) * self.grid.per_value(self.scales(load))


@dataclass(frozen=True)
class Mxfp4(Gridded):
    """MXFP4 codes and their E8M0 exponents (`companions[0]`, one per 32 along the row)."""

    def payload(self, codes: torch.Tensor, load: Load) -> torch.Tensor:
        """The codes packed as Burn packs E2M1 (code 8 is -0.0 in compressed-tensors' table too), then the
        exponents as F16 block scales under a global."""
        import torch

        from qcli.codec.pack import pack_fields

        fields = e2m1_codes(codes, self.shape)
        live = (fields.reshape(-1, MX_GROUP) & 0x7 != 0).any(dim=1)  # a block of ±0 codes only decodes to zeros
        return torch.cat([pack_fields(fields, self.scheme), mx_scales(load(self.companions[0].name), live,
                                                                        self.weight, "mxfp4-pack-quantized")])

    def dequantize(self, codes: torch.Tensor, load: Load) -> torch.Tensor:
        """`q * 2^(e - 127)` in f32, as compressed-tensors computes it before rounding to bf16 (exact there)."""
        import torch

        from qcli.codec import minifloat
        from qcli.scheme import E2M1

        powers = load(self.companions[0].name).to(torch.int32) - E8M0_BIAS
        scales = torch.ldexp(torch.ones(powers.shape), powers.to(torch.float32))
        return minifloat.decode(e2m1_codes(codes, self.shape), E2M1) * self.grid.per_value(scales)


@dataclass(frozen=True)
class Coded(Encoded):
    """Integer codes no Burn scheme holds (`weights`), with their companions (weight_scale first, then
    weight_zero_point and weight_shape where stored): dequantized as compressed-tensors does."""

    weights: Weights
    dims: tuple[int, int]  # the dequantized shape: from the headers, then from weight_shape (`with_state`)

    decoded_as: ClassVar[str] = DECODED_AS

    @property
    def name(self) -> str:
        return weight_name(self.weight)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.dims

    @property
    def dtype(self) -> str:
        return self.companions[0].dtype

    @property
    def offered(self) -> str:  # a preset at least as wide as the codes
        return REQUANTIZE_NARROW if self.weights.num_bits <= 4 else REQUANTIZE_WIDE

    def companion(self, param: str) -> TensorInfo | None:
        return next((c for c in self.companions if c.name.endswith(f".{param}")), None)

    def with_state(self, load: Load) -> Coded:
        """This weight with its shape read from weight_shape, where stored."""
        shape = self.companion("weight_shape")
        if shape is None:
            return self
        return replace(self, dims=stored_shape(self.weight, shape, self.weights.num_bits, load))

    def dequantize(self, load: Load) -> torch.Tensor:
        """`(q - zero_point) * scale`, each operation in the scale's dtype, as compressed-tensors'
        decompressor computes it (a packed zero point unpacked down its grid's columns)."""
        import torch

        scale = load(self.companions[0].name)
        q = stored_codes(self.weight, load(self.weight.name), (), self.weights.num_bits, self.dims, load)
        grid = ScaleGrid(self.dims, self.weights.covers(self.dims))
        x = q.to(scale.dtype)
        zero = self.companion("weight_zero_point")
        if zero is not None:
            points = load(zero.name)
            if points.dtype == torch.int32:  # packed down the columns of the grid
                points = unpack(points.t(), self.weights.num_bits, grid.grid[::-1]).t()
            x = x - grid.per_value(points).to(scale.dtype)
        return x * grid.per_value(scale)


@dataclass(frozen=True)
class ZeroPoint(Coded):
    kind: ClassVar[Kind] = Kind.scheme
    encoding: ClassVar[str] = "a zero point"

    @property
    def why(self) -> str:
        return f"codes (q - zero_point) * scale: {ZERO_POINT_WHY}"


@dataclass(frozen=True)
class Width(Coded):
    kind: ClassVar[Kind] = Kind.scheme
    encoding: ClassVar[str] = "integers of a width Burn lacks"

    @property
    def why(self) -> str:
        return f"{self.weights.num_bits}-bit integer codes, which no Burn value holds (it has 2, 4 and 8 bits)"


def detect(infos: Sequence[TensorInfo], declared: Declaration | None) -> dict[str, Found]:
    """Each weight a compressed-tensors checkpoint quantized, by its tensors' names and dtypes and the
    config group that targets its module."""
    config = quantization_config(declared)
    if config.get("quant_method") != METHOD:
        return {}
    by_name = {i.name: i for i in infos}
    found_groups = groups(config)
    found: dict[str, Found] = {}
    for info in infos:
        module, _, param = info.name.rpartition(".")
        layout = LAYOUTS.get((param, info.dtype))
        if layout is None or f"{module}.weight_scale" not in by_name:
            continue
        companions = {p: by_name[f"{module}.{p}"] for p in COMPANIONS if f"{module}.{p}" in by_name}
        group = group_of(module, found_groups)
        found[info.name] = group if isinstance(group, str) else plan(info, layout, companions, group)
    return found


def plan(info: TensorInfo, layout: tuple[str, tuple[str, ...]], companions: dict[str, TensorInfo],
         group: Group) -> Found:
    """What weight `info`, stored in `layout` with its `companions`, becomes under its config `group`."""
    stored, formats = layout
    weights = group.weights
    if isinstance(weights, str):
        return f"config group {group.name}: {weights}"
    if group.format in NOT_YET:
        return f"{group.format} has no transcode yet"
    if group.format is not None and group.format not in formats:
        return f"config group {group.name} says {printable(group.format)}, but its tensors are {stored}'s"
    if weights.type != ("int" if stored in ("pack-quantized", "int-quantized") else "float"):
        return f"config group {group.name} quantizes {weights.describe()}, but its tensors are {stored}'s"
    if len(info.shape) != 2 or 0 in info.shape:
        return f"{stored} {list(info.shape)}: qcli transcodes non-empty 2-D weights only"
    scale = companions["weight_scale"]
    format = f"{METHOD} {stored} {weights.describe()}"
    rows, width = info.shape
    if group.format == "mxfp4-pack-quantized":
        return mxfp4(info, format, weights, scale)
    if stored == "nvfp4-pack-quantized":
        return nvfp4(info, format, weights, companions)
    if scale.dtype not in SCALE_DTYPES:
        return f"its scale {scale.name} is {scale.dtype}, not one of {', '.join(SCALE_DTYPES)}"
    if stored == "pack-quantized":  # the row length: the scales' groups, else as many codes as the words hold
        per_scale = weights.group_size if weights.strategy in ("group", "tensor_group") else None
        cols = scale.shape[-1] * per_scale if per_scale is not None and scale.shape else width * 32 // weights.num_bits
        if "weight_shape" not in companions or math.ceil(cols * weights.num_bits / 32) != width:
            return f"{stored} {list(info.shape)} does not hold {weights.describe()} rows of its scales"
    else:
        cols = width
    shape = (rows, cols)
    grid = ScaleGrid(shape, weights.covers(shape))
    if len(scale.shape) > 2 or _squeezed(scale.shape) != _squeezed(grid.grid):  # the same scales in the same order
        return f"its scale {scale.name} {list(scale.shape)} is not {weights.describe()} of {list(shape)}"
    kept = tuple(companions[p] for p in ("weight_scale", "weight_zero_point", "weight_shape") if p in companions)
    if not weights.symmetric or "weight_zero_point" in companions:
        return ZeroPoint(info, format, kept, weights, shape)
    if stored == "float-quantized":
        return fp8.transcode(info, scale, weights.strategy, grid.covers, format) if weights.num_bits == 8 else (
            f"{weights.describe()} is not FP8")
    if weights.num_bits not in INTEGERS:
        return Width(info, format, kept, weights, shape)
    values = QuantScheme().with_value(INTEGERS[weights.num_bits]).with_store(PackedU32(0))
    return Integers(info, format, grid.scheme(values), kept, grid, weights)


def nvfp4(info: TensorInfo, format: str, weights: Weights, companions: dict[str, TensorInfo]) -> Found:
    """An NVFP4 weight as E2M1 with f32 scales per 16, or why it has no transcode."""
    scale, global_scale = companions["weight_scale"], companions.get("weight_global_scale")
    shape = (info.shape[0], info.shape[1] * 2)
    if weights.num_bits != 4 or weights.group_size != NVFP4_GROUP or not weights.symmetric:
        return f"{weights.describe()} is not NVFP4 (symmetric fp4 in groups of {NVFP4_GROUP})"
    if global_scale is None or global_scale.dtype != "F32" or math.prod(global_scale.shape) != 1:
        return f"it has no F32 weight_global_scale of one value beside {info.name}"
    grid = ScaleGrid(shape, (1, NVFP4_GROUP))
    if scale.dtype != "F8_E4M3" or tuple(scale.shape) != grid.grid:
        return f"its scale {scale.name} is {scale.dtype} {list(scale.shape)}, not F8_E4M3 {list(grid.grid)}"
    return Nvfp4(info, format, grid.scheme(E2M1_PACKED), (scale, global_scale), grid)


def mxfp4(info: TensorInfo, format: str, weights: Weights, scale: TensorInfo) -> Found:
    """An MXFP4 weight as two-level E2M1 with F16 block scales per 32, or why it has no transcode."""
    shape = (info.shape[0], info.shape[1] * 2)
    if weights.num_bits != 4 or weights.group_size != MX_GROUP or not weights.symmetric or shape[1] % MX_GROUP:
        return f"{weights.describe()} of {list(shape)} is not MXFP4 (symmetric fp4 in whole groups of {MX_GROUP})"
    grid = ScaleGrid(shape, (1, MX_GROUP))
    if scale.dtype != "U8" or tuple(scale.shape) != grid.grid:
        return f"its scale {scale.name} is {scale.dtype} {list(scale.shape)}, not U8 E8M0 exponents {list(grid.grid)}"
    return Mxfp4(info, format, two_level_e2m1(MX_GROUP), (scale,), grid)


def stored_codes(weight: TensorInfo, codes: torch.Tensor, companions: Sequence[TensorInfo], bits: int,
                 shape: tuple[int, ...], load: Load) -> torch.Tensor:
    """The codes of `shape` from the weight as stored: I8 or F8 as they are, or int8 unpacked from
    pack-quantized's I32 words once its weight_shape (among `companions`) is found to be `shape`."""
    import torch

    from qcli.io.dtypes import torch_dtype

    codes = codes.reshape(-1).view(torch.uint8).view(torch_dtype(weight.dtype))  # the GPU pipeline hands its bytes
    if codes.dtype != torch.int32:
        return codes.reshape(shape)
    stored = next((c for c in companions if c.name.endswith(".weight_shape")), None)
    if stored is not None and stored_shape(weight, stored, bits, load) != tuple(shape):
        raise InputError(printable(f"{stored.name} is not {list(shape)}, the shape {weight.name}'s scales and "
                                   f"words give"), hint=HINT)
    return unpack(codes, bits, tuple(shape))


def stored_shape(weight: TensorInfo, info: TensorInfo, bits: int, load: Load) -> tuple[int, int]:
    """The shape pack-quantized's weight_shape tensor `info` holds, held to the words of `weight`."""
    import torch

    shape = tuple(load(info.name).reshape(-1).to(torch.int64).tolist()) if math.prod(info.shape) == 2 else ()
    if (len(shape) != 2 or shape[0] != weight.shape[0] or shape[1] <= 0
            or math.ceil(shape[1] * bits / 32) != weight.shape[1]):
        raise InputError(printable(f"{info.name} holds {list(shape)}, not the shape of {weight.name} "
                                   f"{list(weight.shape)} ({bits}-bit codes in I32 words)"), hint=HINT)
    return shape


def unpack(words: torch.Tensor, bits: int, shape: tuple[int, ...]) -> torch.Tensor:
    """int8 codes of `shape` (rows, columns) from compressed-tensors' dense packing: each row's codes `q + 2^(bits-1)`,
    element i at bit `i * bits` of the row's little-endian words, spanning two words where it must."""
    import torch

    rows, cols = shape
    if 8 % bits == 0:  # whole codes in each byte, the first in the low bits
        data = words.reshape(-1).view(torch.uint8).reshape(rows, -1)  # reshape: strides torch calls contiguous
        parts = [(data >> (bits * k)) & ((1 << bits) - 1) for k in range(8 // bits)]
        fields = torch.stack(parts, dim=-1).reshape(rows, -1)[:, :cols].to(torch.int16)
    else:
        wide = torch.nn.functional.pad(words.reshape(rows, -1).to(torch.int64) & 0xFFFFFFFF, (0, 1))
        start = torch.arange(cols) * bits
        pair = wide[:, start // 32] | (wide[:, start // 32 + 1] << 32)
        fields = (pair >> (start % 32)) & ((1 << bits) - 1)
    return (fields - (1 << (bits - 1))).to(torch.int8)


def weight_name(codes: TensorInfo) -> str:
    """The name a module's weight is written under: `M.weight`, as the model names it, for codes that
    pack-quantized and nvfp4-pack-quantized store as `M.weight_packed`."""
    return codes.name.removesuffix("_packed")


def _squeezed(shape: Sequence[int]) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)


def _positive(n: object) -> TypeGuard[int]:
    return isinstance(n, int) and not isinstance(n, bool) and n > 0
