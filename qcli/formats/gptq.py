"""GPTQ checkpoints (AutoGPTQ, GPTQModel, optimum): symmetric ones transcoded into Burn's Q2F/Q4F/Q8F, the
others refused with `--requantize` the way out (docs/input-formats.md).

A GPTQ linear `m` is `m.qweight` (I32 `[in * bits / 32, out]`: each output column's codes packed along the
input axis, a little-endian bit stream of `bits` a code, so `32 / bits` to a word, the first in the low
bits), `m.qzeros` (I32 `[groups, out * bits / 32]`: a zero point per group and column, packed the same way
along the output axis), `m.scales` (F16 `[groups, out]`), `m.g_idx` (I32 `[in]`: each input's group) and
`m.bias`. `quantize_config.json`, or `config.json`'s `quantization_config` with `quant_method: gptq`, says
`bits`, `group_size` (-1: one group a row), `sym`, `desc_act` (`static_groups`) and the checkpoint format:
`gptq` (v1) stores each zero point less one, `gptq_v2` as it is. GPTQ's reference dequantization
(GPTQModel's `dequantize_weight`) is `scales[g_idx[i], o] * (code[i, o] - zero[g_idx[i], o])`, in f16.

With symmetric zero points (the midpoint, `2^(bits - 1)`) and groups in order (`g_idx[i] = i // group_size`),
a value is `(code - 2^(bits - 1)) * scale`: Burn's Q{bits}F, blocks of the group along the input axis with
the F16 scales, written as the Hugging Face `m.weight` `[out, in]` (the name Burn's and PyTorch's loaders
look for). Detection reads the headers and the config only; the payload checks the zero points and the
order it was promised before it writes a value.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from qcli.errors import InputError
from qcli.formats.found import Encoded, Found, Load, Transcode
from qcli.formats.grid import ScaleGrid
from qcli.presets import REQUANTIZE_NARROW, REQUANTIZE_WIDE
from qcli.problem import Kind
from qcli.scheme import PackedU32, QuantScheme, QuantValue, ScaleDtype
from qcli.text import printable, shown

if TYPE_CHECKING:
    import torch

    from qcli.formats.declaration import Declaration
    from qcli.io.source import TensorInfo

METHODS = frozenset({"gptq"})  # the quant_method values this module reads
NAME = "GPTQ"
REQUANTIZED = "zero points, widths Burn lacks and activation order"
CODES, ZEROS, SCALES, ORDER = "qweight", "qzeros", "scales", "g_idx"
FORMATS = {"gptq": True, "gptq_v2": False}  # checkpoint format -> whether it stores each zero point less one
VALUES = {2: QuantValue.Q2F, 4: QuantValue.Q4F, 8: QuantValue.Q8F}  # bits -> Burn's full-range integer
CONFIG_HINT = ("correct the checkpoint's quantize_config.json (sym, desc_act) to describe its tensors: qcli then "
               "refuses them, and --requantize dequantizes them as GPTQ does")


@dataclass(frozen=True)
class Config:
    """What a GPTQ checkpoint's config says of its weights."""

    bits: int
    group_size: int  # -1: one group a row
    sym: bool
    in_order: bool  # groups in input order: no activation reordering, or static groups
    v1: bool  # zero points stored less one
    source: str  # the file it was read from, for messages

    @staticmethod
    def of(declared: Declaration | None) -> Config | str:
        """The config the checkpoint's declaration gives (`config.json`'s `quantization_config`, else
        `quantize_config.json`), or why there is none."""
        if declared is None or declared.method not in METHODS:
            return "no quantize_config.json or config.json quantization_config says its bits and zero points"
        config, source = declared.raw, declared.file
        bits, group, form = config.get("bits"), config.get("group_size", -1), config.get(
            "checkpoint_format", config.get("format", "gptq"))
        if not isinstance(bits, int) or not isinstance(group, int) or not (group == -1 or group > 0):
            return f"its {source} has no integer bits and group_size"
        if not isinstance(form, str) or form not in FORMATS:  # a list or an object where a name belongs
            return f"its {source} says checkpoint format {shown(form)}: qcli reads {' and '.join(FORMATS)}"
        in_order = not config.get("desc_act", False) or bool(config.get("static_groups", False))
        return Config(bits, group, bool(config.get("sym", True)), in_order, FORMATS[form], source)

    @property
    def midpoint(self) -> int:
        """The symmetric zero point."""
        return 1 << (self.bits - 1)


@dataclass(frozen=True)
class Layout:
    """One GPTQ weight's tensors (`weight` its qweight, `companions` its qzeros, scales and g_idx) and config."""

    weight: TensorInfo
    companions: tuple[TensorInfo, ...]
    config: Config

    @property
    def shape(self) -> tuple[int, int]:
        """[out, in], as the Hugging Face `weight` it dequantizes to."""
        return (self.weight.shape[1], self.companions[2].shape[0])

    @property
    def group(self) -> int:
        return self.shape[1] if self.config.group_size == -1 else self.config.group_size

    @property
    def written(self) -> str:
        """`m.weight` for `m.qweight`."""
        return self.weight.name.removesuffix(CODES) + "weight"

    def parts(self, load: Load, codes: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        """codes [in, out], zero points and scales [groups, out] (integers, and the scales as stored), each
        input's group [in] (int64). `codes`: the qweight as stored, where the caller has it."""
        import torch

        out, count = self.shape
        qweight, qzeros, scales, order = (load(self.weight.name) if codes is None else codes, *(
            load(c.name) for c in self.companions))
        as_words = qweight.reshape(-1).view(torch.uint8).view(torch.int32).reshape(self.weight.shape)
        zeros = unpack(qzeros.reshape(qzeros.shape[0], -1).t(), self.config.bits, out).t()
        return (unpack(as_words, self.config.bits, count), zeros + int(self.config.v1), scales,
                order.reshape(-1).to(torch.int64))

    def reference(self, load: Load) -> torch.Tensor:
        """GPTQ's reference dequantization, `scales[g_idx] * (codes - zeros[g_idx])`, in the scales' dtype
        (f16), transposed to [out, in]."""
        import torch

        values, zeros, scales, order = self.parts(load)
        return (scales[order] * (values - zeros[order]).to(torch.int16)).t().contiguous()


@dataclass(frozen=True)
class Gptq(Transcode):
    """A symmetric GPTQ weight with its groups in order, written as Q{bits}F blocks of its group."""

    layout: Layout
    grid: ScaleGrid  # the scales over [out, in]: one per group of a row, as Burn blocks inside the group

    @property
    def name(self) -> str:
        return self.layout.written

    @property
    def shape(self) -> tuple[int, ...]:
        return self.layout.shape

    def payload(self, codes: torch.Tensor, load: Load) -> torch.Tensor:
        """`code - 2^(bits - 1)` as Burn packs Q{bits}F along each row of [out, in], then the F16 scales,
        once the zero points and the order are those the config promised."""
        import torch

        from qcli.codec.pack import pack_fields, pack_scales

        values, zeros, scales, order = self.layout.parts(load, codes)
        self.check(zeros, order)
        fields = (values - self.layout.config.midpoint).to(torch.int8).t()
        return torch.cat([pack_fields(fields, self.scheme), pack_scales(self.grid.burn_scales(scales.t()),
                                                                        ScaleDtype.F16)])

    def dequantize(self, codes: torch.Tensor, load: Load) -> torch.Tensor:
        """GPTQ's reference dequantization formed in f32 rather than f16: `scale * (code - zero)`, which f32
        holds exactly (the f16 reference is this, rounded once)."""
        import torch

        values, zeros, scales, order = self.layout.parts(load, codes)
        return (scales.to(torch.float32)[order] * (values - zeros[order]).to(torch.float32)).t().contiguous()

    def check(self, zeros: torch.Tensor, order: torch.Tensor) -> None:
        """`InputError` where the zero points are not the midpoint, or the groups not in input order."""
        import torch

        config, names = self.layout.config, [c.name for c in self.companions]
        if not bool((zeros == config.midpoint).all()):
            raise InputError(printable(f"tensor '{names[0]}' holds zero points other than {config.midpoint}, "
                                       f"though {config.source} says sym: true"), hint=CONFIG_HINT)
        if not torch.equal(order, torch.arange(order.numel()) // self.layout.group):
            raise InputError(printable(f"tensor '{names[2]}' puts inputs out of their groups' order, though "
                                       f"{config.source} says desc_act: false (or static_groups)"), hint=CONFIG_HINT)


@dataclass(frozen=True)
class Unheld(Encoded):
    """A GPTQ weight no Burn scheme holds: a zero point, an activation order, or a width Burn has no value of."""

    layout: Layout

    kind = Kind.scheme
    decoded_as = "dequantized as GPTQ does, in f16, then quantized"

    @property
    def encoding(self) -> str:
        config = self.layout.config
        return ("a zero point" if not config.sym else "an activation order" if not config.in_order
                else f"{config.bits}-bit codes")

    @property
    def offered(self) -> str:
        return REQUANTIZE_WIDE if self.layout.config.bits > 4 else REQUANTIZE_NARROW

    @property
    def name(self) -> str:
        return self.layout.written

    @property
    def why(self) -> str:
        return {
            "a zero point": "each group's values are offset by a zero point of their own (sym: false), which "
                            "Burn's symmetric schemes do not hold",
            "an activation order": "each input's group is given by g_idx (desc_act: true), so a group's values are "
                                   "not one block along the row, which is how Burn lays out its scales",
        }.get(self.encoding, f"{self.layout.config.bits}-bit codes, a width Burn has no value of")

    @property
    def shape(self) -> tuple[int, ...]:
        return self.layout.shape

    @property
    def dtype(self) -> str:
        return "F16"

    def dequantize(self, load: Load) -> torch.Tensor:
        return self.layout.reference(load)


def unpack(words: torch.Tensor, bits: int, count: int) -> torch.Tensor:
    """The first `count` codes of each column of int32 `words` [n, m], a little-endian bit stream of `bits` a
    code down each column: [count, m], int32 where `bits` divides 32, else int64 (a code may straddle two
    words)."""
    import torch

    mask = (1 << bits) - 1
    if 32 % bits == 0:  # whole codes a word: each word's fields in turn
        shifts = torch.arange(0, 32, bits, dtype=torch.int32)
        return ((words.unsqueeze(1) >> shifts[None, :, None]) & mask).reshape(-1, words.shape[1])[:count]
    stream = words.to(torch.int64) & 0xFFFFFFFF
    start = torch.arange(count) * bits
    low, shift = start // 32, (start % 32)[:, None]
    high = torch.clamp(low + 1, max=stream.shape[0] - 1)
    return ((stream[low] | stream[high] << 32) >> shift) & mask


def detect(infos: Sequence[TensorInfo], declared: Declaration | None) -> dict[str, Found]:
    """Each `qweight` with its qzeros, scales and g_idx beside it: a transcode, a refused weight, or why it
    is neither (from the headers and the declaration)."""
    by_name = {i.name: i for i in infos}
    found: dict[str, Found] = {}
    settings: Config | str | None = None
    for info in infos:
        base, dot, leaf = info.name.rpartition(".")
        zeros, scales, order = (by_name.get(f"{base}{dot}{c}") for c in (ZEROS, SCALES, ORDER))
        if leaf == CODES and zeros is not None and scales is not None and order is not None:
            settings = settings or Config.of(declared)
            found[info.name] = plan(info, (zeros, scales, order), settings, by_name)
    return found


def plan(info: TensorInfo, companions: tuple[TensorInfo, ...], config: Config | str,
         by_name: dict[str, TensorInfo]) -> Found:
    """What GPTQ weight `info` becomes: a transcode, a refused weight, or why it has neither."""
    if isinstance(config, str):
        return config
    zeros, scales, order = companions
    if len(info.shape) != 2 or len(order.shape) != 1 or 0 in info.shape or not order.shape[0]:
        return f"GPTQ codes {list(info.shape)} with g_idx {list(order.shape)}: only non-empty 2-D weights"
    layout = Layout(info, companions, config)
    (out, count), bits, group = layout.shape, config.bits, layout.group
    if (count * bits) % 32 or (out * bits) % 32:
        return f"{bits}-bit codes of [{out}, {count}] are not whole int32 words along both axes"
    groups = math.ceil(count / group)
    expected = {info.name: ("I32", (count * bits // 32, out)), zeros.name: ("I32", (groups, out * bits // 32)),
                scales.name: ("F16", (groups, out)), order.name: ("I32", (count,))}
    for name, (dtype, shape) in expected.items():
        if (by_name[name].dtype, tuple(by_name[name].shape)) != (dtype, shape):
            return (f"{name} is {by_name[name].dtype} {list(by_name[name].shape)}, not the {dtype} {list(shape)} "
                    f"of {bits}-bit codes in groups of {group}")
    if layout.written in by_name:
        return f"{layout.written} is in the checkpoint too, so its codes cannot be written under that name"
    format = f"GPTQ {bits}-bit {'per channel' if config.group_size == -1 else f'group {group}'}"
    if not config.sym or not config.in_order or bits not in VALUES:
        return Unheld(info, format, companions, layout)
    if count % group:
        return f"its {count} inputs are not whole groups of {group}"
    grid = ScaleGrid((out, count), (1, group))
    scheme = QuantScheme().with_value(VALUES[bits]).with_store(PackedU32(0)).per_block(list(grid.block), ScaleDtype.F16)
    return Gptq(info, format, scheme, companions, layout, grid)
