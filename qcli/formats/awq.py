"""AutoAWQ checkpoints (GEMM and GEMV packings): zero points Burn cannot hold, refused with `--requantize` the way
out (docs/input-formats.md).

A checkpoint whose declaration (`config.json`'s `quantization_config`, or AutoAWQ's older `quant_config.json`)
says `quant_method: awq` stores each linear `m` as `m.qweight`, `m.qzeros` (I32, eight 4-bit codes a word, the
first in the low bits) and `m.scales` (F16), one scale and zero point per `group_size` inputs of an output,
with `version` saying how the words are laid out:
- `gemm`: `qweight` [in, out / 8] and `qzeros` [in / group, out / 8] pack along the output axis, word j's
  field k holding output `8 j + ORDER[k]`; `scales` [in / group, out];
- `gemv`: `qweight` [out, in / 8] packs along the input axis in order; `qzeros` [out, W] and `scales`
  [out, 8 W] hold the groups of a row in order, padded to W words (AutoAWQ's `calculate_zeros_width`).
Either decodes as `(code - zero) * scale`, AutoAWQ's `dequantize_gemm` formula, in the scales' dtype. AutoAWQ
writes a zero point for every group (its GEMM and GEMV layers take no other), so no Burn scheme holds the
values; symmetric AWQ is what llm-compressor writes as compressed-tensors' pack-quantized, transcoded there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from qcli.formats.found import Encoded, Found, Load
from qcli.io.dtypes import EXACT_FLOAT_DTYPES
from qcli.problem import Kind

if TYPE_CHECKING:
    import torch

    from qcli.formats.declaration import Declaration
    from qcli.io.source import TensorInfo

METHODS = frozenset({"awq"})  # the quant_method values this module reads
NAME = "AWQ"
REQUANTIZED = "zero points"
CODES, ZEROS, SCALES = "qweight", "qzeros", "scales"
BITS = 4  # AutoAWQ's GEMM and GEMV layers pack 4-bit codes only
PER_WORD = 32 // BITS
ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # GEMM: the output each of a word's fields holds, from the low bits up
VERSIONS = ("gemm", "gemv")
SCALE_DTYPES = EXACT_FLOAT_DTYPES  # each widens to f32 exactly


@dataclass(frozen=True)
class Awq(Encoded):
    """One AWQ linear: its qweight, with its qzeros and scales, and the layout `version` says."""

    version: str = "gemm"
    dims: tuple[int, int] = (0, 0)  # [out, in], the Hugging Face weight it dequantizes to
    group: int = 0

    kind = Kind.scheme
    encoding = "a zero point"
    decoded_as = "dequantized as AutoAWQ does, (code - zero) * scale in the scales' dtype, then quantized"

    @property
    def name(self) -> str:
        return self.weight.name.removesuffix(CODES) + "weight"

    @property
    def why(self) -> str:
        return ("each group's values are offset by a zero point of their own (qzeros), which Burn's symmetric "
                "schemes do not hold")

    @property
    def shape(self) -> tuple[int, ...]:
        return self.dims

    @property
    def dtype(self) -> str:
        return self.companions[1].dtype

    def dequantize(self, load: Load) -> torch.Tensor:
        """`(code - zero) * scale` in the scales' dtype, [out, in]."""
        groups = self.dims[1] // self.group
        words, zeros, scales = load(self.weight.name), load(self.companions[0].name), load(self.companions[1].name)
        if self.version == "gemm":  # fields along the output axis, in ORDER: transpose to [out, in] last
            codes, zero = fields(words, ORDER), fields(zeros, ORDER)
            values = (codes - zero.repeat_interleave(self.group, 0)) * scales.repeat_interleave(self.group, 0)
            return values.t().contiguous()
        codes, zero = fields(words, tuple(range(PER_WORD))), fields(zeros, tuple(range(PER_WORD)))[:, :groups]
        step = scales[:, :groups].repeat_interleave(self.group, 1)
        return (codes - zero.repeat_interleave(self.group, 1)) * step


def fields(words: torch.Tensor, order: Sequence[int]) -> torch.Tensor:
    """The 4-bit fields of int32 `words` [n, m] as [n, 8 m] (int16), word j's field k at column `8 j + order[k]`."""
    import torch

    shifts = torch.arange(0, 32, BITS, dtype=torch.int32)
    unpacked = (words.unsqueeze(-1) >> shifts) & (1 << BITS) - 1  # [n, m, 8]: field k at k
    placed = torch.empty_like(unpacked)
    placed[..., list(order)] = unpacked
    return placed.reshape(words.shape[0], -1).to(torch.int16)


def zeros_width(count: int, group: int) -> int:
    """AutoAWQ GEMV's words of zero points a row: its groups in whole words, and in multiples of 128 / group
    words for groups under 128."""
    multiple = 128 // group if group < 128 else 1
    words = -(-(count // group) // PER_WORD)
    return -(-words // multiple) * multiple


def detect(infos: Sequence[TensorInfo], declared: Declaration | None) -> dict[str, Found]:
    """Each `qweight` with its qzeros and scales (and no GPTQ g_idx) in a checkpoint that declares AWQ: its
    refusal, or why its tensors are not the layout its version says."""
    if declared is None or declared.method not in METHODS:
        return {}
    by_name = {i.name: i for i in infos}
    found: dict[str, Found] = {}
    for info in infos:
        base, dot, leaf = info.name.rpartition(".")
        zeros, scales = (by_name.get(f"{base}{dot}{c}") for c in (ZEROS, SCALES))
        if leaf == CODES and zeros is not None and scales is not None and f"{base}{dot}g_idx" not in by_name:
            found[info.name] = plan(info, zeros, scales, declared.raw, by_name)
    return found


def plan(info: TensorInfo, zeros: TensorInfo, scales: TensorInfo, config: dict[str, Any],
         by_name: dict[str, TensorInfo]) -> Found:
    """What AWQ weight `info` becomes: refused (requantizable), or why its tensors are not AWQ's."""
    version = str(config.get("version", "gemm")).lower()
    bits = config.get("bits", config.get("w_bit", BITS))
    group = config.get("group_size", config.get("q_group_size", 128))
    if version not in VERSIONS:
        return f"AWQ version {version!r} packs for its own kernel; qcli reads {' and '.join(VERSIONS)}"
    if bits != BITS or not isinstance(group, int) or not (group == -1 or group > 0):
        return f"AWQ with bits {bits!r} and group_size {group!r}: AutoAWQ's {version} packs 4 bits in groups"
    if any(t.dtype != "I32" or len(t.shape) != 2 for t in (info, zeros)) or scales.dtype not in SCALE_DTYPES:
        return f"{info.name} and {zeros.name} are not 2-D I32 words beside {' or '.join(SCALE_DTYPES)} scales"
    if version == "gemm":
        count, out = info.shape[0], info.shape[1] * PER_WORD
    else:
        out, count = info.shape[0], info.shape[1] * PER_WORD
    size = count if group == -1 else group
    if not count or count % size:
        return f"as AWQ {version}, {info.name} {list(info.shape)} has {count} inputs, not whole groups of {size}"
    groups = count // size
    expected = ({zeros.name: (groups, out // PER_WORD), scales.name: (groups, out)} if version == "gemm" else
                {zeros.name: (out, zeros_width(count, size)), scales.name: (out, zeros_width(count, size) * PER_WORD)})
    for name, shape in expected.items():
        if tuple(by_name[name].shape) != shape:
            return (f"{name} is {list(by_name[name].shape)}, not the {list(shape)} of AWQ {version} [{out}, {count}] "
                    f"in groups of {size}")
    written = info.name.removesuffix(CODES) + "weight"
    if written in by_name:
        return f"{written} is in the checkpoint too, so its codes cannot be written under that name"
    return Awq(info, f"AWQ {version.upper()} 4-bit group {size}", (zeros, scales), version, (out, count), size)
