"""HQQ checkpoints (Half-Quadratic Quantization, as transformers saves them): zero points Burn cannot hold,
refused with `--requantize` the way out (docs/input-formats.md).

HQQ stores a quantized linear `m` as its `HQQLinear.state_dict()`, each entry a tensor (strings as their
bytes, flags and integers as scalars): `m.W_q` (uint8 codes, `8 / nbits` a byte: the weight reshaped to
[-1, group_size] (axis 1) or [group_size, -1] (axis 0) and its rows cut into `8 / nbits` slabs, slab j in the
byte's bits from the top down), `m.scale` and `m.zero` (one per group, in the compute dtype), and the meta:
`m.shape`, `m.nbits`, `m.group_size`, `m.axis`, `m.packing`, `m.compute_dtype`, `m.view_as_float`, ... A value
is `(code - zero) * scale` formed in the compute dtype (HQQ's `Quantizer.dequantize`), reshaped to `shape`.
Detection reads the names and dtypes; `--requantize` reads the meta scalars (`with_state`), no weight.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from qcli.errors import InputError
from qcli.formats.found import Encoded, Found, Load
from qcli.io.dtypes import EXACT_FLOAT_DTYPES, SAFETENSORS_TORCH_NAMES
from qcli.presets import REQUANTIZE_NARROW, REQUANTIZE_WIDE
from qcli.problem import Kind
from qcli.text import printable

if TYPE_CHECKING:
    import torch

    from qcli.formats.declaration import Declaration
    from qcli.io.source import TensorInfo

METHODS = frozenset({"hqq"})  # the quant_method values this module reads
NAME = "HQQ"
REQUANTIZED = "zero points"
CODES = "W_q"
WRITTEN = "weight"
SCALE, ZERO = "scale", "zero"
META = ("shape", "nbits", "group_size", "axis", "packing", "compute_dtype")  # read for --requantize
OTHER_META = ("unpack_view_dtype", "view_as_float", "quant_scale", "quant_zero", "offload_meta", "encoded_state_dict",
              "stores_quant_config", "channel_wise", "optimize", "round_zero")  # consumed, not needed to decode
PACKINGS = {"8bit_u8": 8, "4bit_u8": 4, "2bit_u8": 2, "1bit_u8": 1}  # HQQ's byte packings -> bits a code
# HQQ's compute_dtype (torch's name) -> safetensors': the floats an f32 holds exactly
DTYPES = {f"torch.{SAFETENSORS_TORCH_NAMES[d]}": d for d in EXACT_FLOAT_DTYPES}
STATE_HINT = "re-save the checkpoint with HQQ (HQQLinear.state_dict) or transformers' save_pretrained"


@dataclass(frozen=True)
class Hqq(Encoded):
    """One HQQ linear: its W_q with the scale, zero and meta tensors, and once read (`with_state`) its meta."""

    meta: dict[str, Any] | None = None

    kind = Kind.scheme
    encoding = "a zero point"
    decoded_as = "dequantized as HQQ does, (code - zero) * scale in its compute dtype, then quantized"

    @property
    def name(self) -> str:
        return self.weight.name.removesuffix(CODES) + WRITTEN

    @property
    def why(self) -> str:
        return ("each group's values are offset by a zero point of their own (HQQ's zero, a float), which Burn's "
                "symmetric schemes do not hold")

    @property
    def offered(self) -> str:
        return REQUANTIZE_WIDE if self.meta is not None and self.meta["nbits"] > 4 else REQUANTIZE_NARROW

    @property
    def shape(self) -> tuple[int, ...]:
        assert self.meta is not None, "the meta is read before the shape is asked"
        shape: tuple[int, ...] = self.meta["shape"]
        return shape

    @property
    def dtype(self) -> str:
        assert self.meta is not None, "the meta is read before the dtype is asked"
        return DTYPES[self.meta["compute_dtype"]]

    def companion(self, leaf: str) -> TensorInfo:
        return next(c for c in self.companions if c.name.rpartition(".")[2] == leaf)

    def with_state(self, load: Load) -> Hqq:
        """This weight with its meta scalars read; `InputError` naming the module where they do not describe
        its W_q, scale and zero."""
        module = self.weight.name.rpartition(".")[0]
        try:
            tensors = {leaf: load(self.companion(leaf).name) for leaf in META}
            meta: dict[str, Any] = {
                "shape": tuple(int(d) for d in tensors["shape"].reshape(-1).tolist()),
                **{k: int(tensors[k].item()) for k in ("nbits", "group_size", "axis")},
                **{k: bytes(tensors[k].reshape(-1).tolist()).decode() for k in ("packing", "compute_dtype")}}
        except (ValueError, RuntimeError, UnicodeDecodeError) as exc:
            raise InputError(printable(f"HQQ module '{module}': its meta tensors are not HQQ's: {exc}"),
                             hint=STATE_HINT) from None
        per_byte = 8 // meta["nbits"] if PACKINGS.get(meta["packing"]) == meta["nbits"] else 0
        rows, cols = self.weight.shape[0] * per_byte, self.weight.shape[1]
        groups = math.prod(self.companion(SCALE).shape)
        group = cols if meta["axis"] == 1 else rows
        fits = (per_byte and meta["compute_dtype"] in DTYPES and meta["axis"] in (0, 1) and len(meta["shape"]) == 2
                and rows * cols == math.prod(meta["shape"]) and group == meta["group_size"]
                and groups == rows * cols // group == math.prod(self.companion(ZERO).shape))
        if not fits:
            raise InputError(printable(f"HQQ module '{module}': its meta {meta} does not describe its {CODES} "
                                       f"{list(self.weight.shape)} and {groups} scales"), hint=STATE_HINT)
        return replace(self, meta=meta)

    def dequantize(self, load: Load) -> torch.Tensor:
        """HQQ's `(code - zero) * scale` in its compute dtype, reshaped to its shape."""
        import torch

        meta = self.meta
        assert meta is not None, "the meta is read before the weight is dequantized"
        bits, words = meta["nbits"], load(self.weight.name)
        slabs = [(words >> (8 - bits * (j + 1))) & ((1 << bits) - 1) for j in range(8 // bits)]
        codes = torch.cat(slabs, dim=0).to(getattr(torch, meta["compute_dtype"].removeprefix("torch.")))
        return ((codes - load(self.companion(ZERO).name)) * load(self.companion(SCALE).name)).reshape(meta["shape"])


def detect(infos: Sequence[TensorInfo], declared: Declaration | None) -> dict[str, Found]:
    """Each `W_q` beside its scale, zero and meta tensors: its refusal, or why it is not a layout qcli reads."""
    by_name = {i.name: i for i in infos}
    found: dict[str, Found] = {}
    for info in infos:
        module, dot, leaf = info.name.rpartition(".")
        if leaf != CODES:
            continue
        named = {c: by_name.get(f"{module}{dot}{c}") for c in (SCALE, ZERO, *META, *OTHER_META)}
        if any(named[c] is None for c in (SCALE, ZERO, *META)):
            continue
        if info.dtype != "U8" or len(info.shape) != 2:
            found[info.name] = (f"HQQ codes {info.dtype} {list(info.shape)}: qcli reads the 2-D uint8 packings "
                                f"({', '.join(PACKINGS)}), not 3-bit words or codes viewed as floats")
        elif f"{module}{dot}{WRITTEN}" in by_name:
            found[info.name] = (f"{module}{dot}{WRITTEN} is in the checkpoint too, so its codes cannot be written "
                                "under that name")
        else:
            found[info.name] = Hqq(info, "HQQ", tuple(c for c in named.values() if c is not None))
    return found
