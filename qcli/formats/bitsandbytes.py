"""bitsandbytes checkpoints (docs/input-formats.md): LLM.int8 transcoded into Q8S, the 4-bit codebooks (NF4,
FP4) refused or dequantized.

An 8-bit `Linear8bitLt` `m` is serialized as `m.weight` (I8 codes `[out, in]`, -127 to 127), `m.SCB` (F32
`[out]`: each row's absmax) and `m.weight_format` (a U8 scalar, 0 for the row-major layout; bitsandbytes
loads no other). Its CPU matmul (`MatMul8bitFp`) dequantizes `CB * (SCB * (1 / 127))` in f32: one scale per
row, so Burn's `f32(code) * scale` with Q8S values and that scale repeated over blocks inside the row (as
FP8 per channel is) is the same product of the same f32 operands. (`int8_vectorwise_dequant` rounds
`(CB * SCB) * (1 / 127)` instead: within one ulp of it.)

A 4-bit weight is serialized a 4-bit weight `W` as `W` (U8, two 4-bit codes a byte, the first in the high
nibble), `W.absmax` (one scale per block of `blocksize` values), `W.quant_map` (the 16-entry codebook),
with compressed statistics `W.nested_absmax` and `W.nested_quant_map` (`W.absmax` then holds 8-bit codes
of the scales, in blocks of `nested_blocksize`, plus `nested_offset`), and `W.quant_state.bitsandbytes__nf4`
(or `__fp4`): a U8 tensor holding JSON with `quant_type`, `blocksize`, `dtype`, `shape` and the nested
fields (`QuantState.as_dict(packed=True)`). A value decodes as `quant_map[code] * absmax[block]`: a table
lookup, which is Burn's `QuantMode::Lookup`, and no QFloat tensor carries the table. Detection reads the
headers only; `--requantize` reads the JSON (`with_state`) and decodes with `dequantize`, which computes
what bitsandbytes' `dequantize_4bit` does, in the same f32 operations.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from qcli.errors import InputError
from qcli.formats.found import Encoded, Found, Load
from qcli.formats.fp8 import Fp8
from qcli.formats.grid import ScaleGrid
from qcli.io.dtypes import EXACT_FLOAT_DTYPES, SAFETENSORS_TORCH_NAMES
from qcli.io.files import parse_json
from qcli.scheme import LOOKUP_PANICS_AT, LOOKUP_WHY, PackedU32, QuantScheme, QuantValue
from qcli.text import printable, quoted, shown

if TYPE_CHECKING:
    import torch

    from qcli.formats.declaration import Declaration
    from qcli.io.source import TensorInfo

METHODS = frozenset({"bitsandbytes"})  # the quant_method values this module reads
NAME = "bitsandbytes"
REQUANTIZED = "NF4 and FP4"
STATE_INFIX = ".quant_state.bitsandbytes__"
FORMATS = {"nf4": "NF4", "fp4": "FP4"}  # the JSON tensor's suffix -> the format's name
COMPANIONS = ("absmax", "quant_map", "nested_absmax", "nested_quant_map")
DTYPES = {SAFETENSORS_TORCH_NAMES[d]: d for d in EXACT_FLOAT_DTYPES}  # the JSON's dtype (torch's name) -> safetensors'
STATE_HINT = "re-save the checkpoint with bitsandbytes (QuantState.as_dict(packed=True))"
ROW_STATS, ROW_FORMAT = "SCB", "weight_format"  # an 8-bit `m.weight`'s companions `m.SCB`, `m.weight_format`
ROW_MAJOR = 0  # the weight_format bitsandbytes writes and loads ("row"; 1 to 3 are GPU tile layouts)
Q8S = QuantScheme().with_value(QuantValue.Q8S).with_store(PackedU32(0))


@dataclass(frozen=True)
class Int8(Fp8):
    """One LLM.int8 weight: its row stats (`companions[0]`, then its weight_format where there is one),
    packed and decoded as an FP8 per-channel transcode is, with each row's scale formed from its stats."""

    def scales(self, load: Load) -> torch.Tensor:
        """Each row's scale as `MatMul8bitFp` forms it, `SCB * (1 / 127)` in f32."""
        import torch

        return load(self.companions[0].name).to(torch.float32).mul(1.0 / 127.0)

    def payload(self, codes: torch.Tensor, load: Load) -> torch.Tensor:
        """The codes as Burn packs Q8S, then each row's scale once per Burn block of the row; `InputError`
        when the codes are in another layout or use -128, which bitsandbytes never writes."""
        import torch

        if len(self.companions) > 1 and int(load(self.companions[1].name).reshape(-1)[0]) != ROW_MAJOR:
            raise InputError(printable(f"{self.weight.file}: tensor '{self.companions[1].name}' says a weight "
                                       "format other than row-major (0), a GPU tile layout qcli does not read"),
                             hint="load the checkpoint with bitsandbytes and save it again: it writes row-major")
        if bool((codes.reshape(-1).view(torch.int8) == -128).any()):
            raise InputError(printable(f"{self.weight.file}: tensor '{self.weight.name}' has the code -128, "
                                       "which LLM.int8 never writes (its codes are -127 to 127)"),
                             hint="the file is damaged, or was not written by bitsandbytes")
        return super().payload(codes, load)


@dataclass(frozen=True)
class Codebook(Encoded):
    """One bitsandbytes 4-bit weight: its companions (the state last) and, once its JSON is read, what
    it dequantizes to."""

    state: dict[str, Any] | None = None  # the quant_state JSON, read by `with_state`

    decoded_as = "dequantized as bitsandbytes does, then quantized"

    @property
    def why(self) -> str:
        return (f"4-bit codes into a 16-entry codebook (quant_map) scaled per block (absmax), which no Burn "
                f"scheme holds: {LOOKUP_WHY} ({LOOKUP_PANICS_AT})")

    @property
    def shape(self) -> tuple[int, ...]:
        assert self.state is not None, "the state is read before the shape is asked"
        return tuple(self.state["shape"])

    @property
    def dtype(self) -> str:
        assert self.state is not None, "the state is read before the dtype is asked"
        return DTYPES[self.state["dtype"]]

    def companion(self, field: str) -> TensorInfo | None:
        return next((c for c in self.companions if c.name == f"{self.weight.name}.{field}"), None)

    def _loaded(self, field: str, load: Load) -> torch.Tensor:
        """A companion the state names, loaded (`with_state` found each there)."""
        info = self.companion(field)
        assert info is not None, "the state is read before the weight is dequantized"
        return load(info.name)

    def with_state(self, load: Load) -> Codebook:
        """This weight with its quant_state JSON read (a few hundred bytes, no weight); `InputError` naming
        the tensor when it is not what bitsandbytes writes."""
        name = self.companions[-1].name
        try:
            # untrusted JSON: a value of the wrong type fails its use below (TypeError, caught)
            state: Any = parse_json(self.weight.file, bytes(load(name).reshape(-1).tolist()), STATE_HINT,
                               f"tensor {quoted(name)}'s quant_state")
            shape, blocksize = [int(d) for d in state["shape"]], int(state["blocksize"])
            absmax, table, n = self.companion("absmax"), self.companion("quant_map"), math.prod(shape)
            fits = (state["quant_type"].upper() == self.quant_type and state["dtype"] in DTYPES and blocksize > 0
                    and (n + 1) // 2 == self.weight.nbytes and absmax is not None and table is not None
                    and math.prod(absmax.shape) == -(-n // blocksize) and tuple(table.shape) == (16,)
                    and absmax.dtype == ("U8" if nested(state) else "F32")
                    and nested(state) == (self.companion("nested_absmax") is not None)
                    and nested(state) == (self.companion("nested_quant_map") is not None)
                    and (not nested(state) or int(state["nested_blocksize"]) > 0
                         and math.isfinite(float(state["nested_offset"]))))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise InputError(printable(f"tensor {quoted(name)} is not bitsandbytes' quant_state JSON: "
                                       f"{shown(str(exc))}"), hint=STATE_HINT) from None
        if not fits:
            raise InputError(printable(f"tensor '{name}' does not describe {self.weight.name} "
                                       f"({self.weight.nbytes} bytes of codes): {shown(state)}"), hint=STATE_HINT)
        return replace(self, state={**state, "shape": shape, "blocksize": blocksize})

    @property
    def quant_type(self) -> str:
        """The state's `quant_type`, upper case: NF4 or FP4."""
        return self.format.rpartition(" ")[2]

    def dequantize(self, load: Load) -> torch.Tensor:
        """What bitsandbytes' `dequantize_4bit` gives (in the state's dtype): each code's codebook entry
        times its block's absmax, in f32, then rounded to the dtype once."""
        import torch

        state = self.state
        assert state is not None, "the state is read before the weight is dequantized"
        n = math.prod(self.shape)
        absmax = self._loaded("absmax", load).reshape(-1)
        if nested(state):  # the scales are 8-bit codes themselves, with an f32 offset added
            scales = _blockwise(self._loaded("nested_quant_map", load).to(torch.float32), absmax,
                                self._loaded("nested_absmax", load), int(state["nested_blocksize"]))
            absmax = scales + torch.tensor(float(state["nested_offset"]), dtype=torch.float32)
        codes = load(self.weight.name).reshape(-1)
        nibbles = torch.stack([codes >> 4, codes & 0xF], dim=1).reshape(-1)[:n]
        table = self._loaded("quant_map", load).to(torch.float32)
        values = _blockwise(table, nibbles, absmax.to(torch.float32), state["blocksize"])
        return values.reshape(self.shape).to(getattr(torch, state["dtype"]))


def detect(infos: Sequence[TensorInfo], declared: Declaration | None) -> dict[str, Found]:
    """Each bitsandbytes 8-bit and 4-bit weight, by its name, from the names and dtypes alone."""
    by_name = {i.name: i for i in infos}
    found: dict[str, Found] = {}
    for info in infos:
        prefix = info.name.removesuffix(ROW_STATS)
        if prefix != info.name and prefix + "weight" in by_name and by_name[prefix + "weight"].dtype == "I8":
            found[prefix + "weight"] = int8(by_name[prefix + "weight"], info, by_name.get(prefix + ROW_FORMAT))
        base, infix, suffix = info.name.rpartition(STATE_INFIX)
        if infix and suffix in FORMATS and base in by_name and by_name[base].dtype == "U8":
            companions = tuple(by_name[f"{base}.{c}"] for c in COMPANIONS if f"{base}.{c}" in by_name)
            found[base] = Codebook(by_name[base], f"bitsandbytes {FORMATS[suffix]}", (*companions, info))
    return found


def int8(weight: TensorInfo, stats: TensorInfo, form: TensorInfo | None) -> Found:
    """The Q8S transcode of LLM.int8 `weight` with its row `stats` (and `form`, its weight_format), or why
    it has none."""
    if len(weight.shape) != 2 or 0 in weight.shape:
        return f"an LLM.int8 weight is a non-empty [out, in] matrix, not {list(weight.shape)}"
    rows, cols = weight.shape
    if stats.dtype != "F32" or tuple(stats.shape) != (rows,):
        return f"its row stats {stats.name} are {stats.dtype} {list(stats.shape)}, not F32 [{rows}]"
    if form is not None and (form.dtype != "U8" or math.prod(form.shape) != 1):
        return f"its {form.name} is {form.dtype} {list(form.shape)}, not a U8 scalar"
    grid = ScaleGrid((rows, cols), (1, cols))
    companions = (stats,) if form is None else (stats, form)
    return Int8(weight, "bitsandbytes LLM.int8 (I8 with per-row SCB)", grid.scheme(Q8S), companions, "per-channel",
                grid)


def nested(state: dict[str, Any]) -> bool:
    """Whether the state's absmax are 8-bit codes themselves (bitsandbytes' compressed statistics)."""
    return "nested_offset" in state


def _blockwise(table: torch.Tensor, codes: torch.Tensor, absmax: torch.Tensor, blocksize: int) -> torch.Tensor:
    """`table[code]` times the absmax of its block of `blocksize` (the last block may be partial), in f32."""
    import torch

    scales = absmax.reshape(-1).to(torch.float32).repeat_interleave(blocksize)[: codes.numel()]
    return table[codes.to(torch.int64)] * scales
