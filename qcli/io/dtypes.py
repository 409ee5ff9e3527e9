"""Element types on both sides: safetensors' spellings, Burn's `DType` serde, and the bytes each takes.

Burn's `DType` (burn-std `tensor/dtype.rs`) serialises plain variants as text (`"F32"`) and newtype
variants as a one-entry map (`{"Bool": "Native"}`, `{"QFloat": scheme}`). A QFloat payload's length
comes from `qcli.layout`, never from an element size, so `element_size` answers None for it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from qcli import layout
from qcli.errors import SchemeError
from qcli.scheme import QuantScheme

if TYPE_CHECKING:
    import torch

# Bytes of one element of each plain Burn DType.
BURN_PLAIN_SIZES = {
    "F64": 8, "F32": 4, "Flex32": 4, "F16": 2, "BF16": 2,
    "I64": 8, "I32": 4, "I16": 2, "I8": 1,
    "U64": 8, "U32": 4, "U16": 2, "U8": 1,
}
# Bytes of one element of `Bool(BoolStore)`: a Rust bool, a u8 or a u32.
BOOL_STORE_SIZES = {"Native": 1, "U8": 1, "U32": 4}

# Bits of one element of each dtype the safetensors format knows (sub-byte types pack densely).
SAFETENSORS_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32, "C64": 64,
    "F64": 64, "I64": 64, "U64": 64,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}
# torch's name for each plain dtype (safetensors' spelling; `BOOL` a byte per element).
TORCH_DTYPE_NAMES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
    "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8",
    "U64": "uint64", "U32": "uint32", "U16": "uint16", "U8": "uint8", "BOOL": "bool",
}
# torch's name for every safetensors dtype torch has (F4 and F6 it has not).
SAFETENSORS_TORCH_NAMES = {
    **TORCH_DTYPE_NAMES, "F8_E5M2": "float8_e5m2", "F8_E4M3": "float8_e4m3fn", "F8_E8M0": "float8_e8m0fnu",
    "C64": "complex64",
}
_SAFETENSORS_TO_BURN: dict[str, object] = {
    **{name: name for name in BURN_PLAIN_SIZES if name != "Flex32"},
    "BOOL": {"Bool": "Native"},
}


def torch_dtype(safetensors_dtype: str) -> torch.dtype:
    """torch's dtype for a safetensors dtype; KeyError for one torch has not (`SAFETENSORS_TORCH_NAMES`)."""
    import torch

    return getattr(torch, SAFETENSORS_TORCH_NAMES[safetensors_dtype])


def burn_dtype(safetensors_dtype: str) -> object | None:
    """Burn's DType serde for a safetensors dtype, or None where Burn has none (F8_E4M3, F4, C64, ...)."""
    return _SAFETENSORS_TO_BURN.get(safetensors_dtype)


def parse_dtype(obj: object) -> object:
    """Burn's DType serde in canonical form (QFloat keys in declaration order); ValueError when malformed."""
    if isinstance(obj, str) and obj in BURN_PLAIN_SIZES:
        return obj
    if isinstance(obj, dict) and len(obj) == 1:
        ((kind, inner),) = obj.items()
        if kind == "Bool" and isinstance(inner, str) and inner in BOOL_STORE_SIZES:
            return {"Bool": inner}
        if kind == "QFloat":
            try:
                scheme = QuantScheme.from_serde(inner)
            except SchemeError as exc:
                raise ValueError(exc.message) from None
            older = isinstance(inner, dict) and ("param" in inner or "level" in inner)
            if older and (scheme.is_two_level() or inner != scheme.to_serde(with_0_21_keys=True)):
                raise ValueError(f"the Burn 0.21 keys of {inner!r} do not say what its other keys say")
            return {"QFloat": scheme.to_serde(with_0_21_keys=older)}
    raise ValueError(f"not a Burn DType: {obj!r}")


def element_size(dtype: object) -> int | None:
    """Bytes of one element of a canonical DType; None for QFloat, whose length is `quantized_data_len`."""
    if isinstance(dtype, str):
        return BURN_PLAIN_SIZES[dtype]
    assert isinstance(dtype, dict), f"not a canonical DType: {dtype!r}"
    if "Bool" in dtype:
        return BOOL_STORE_SIZES[dtype["Bool"]]
    return None


def payload_len(dtype: object, shape: Sequence[int]) -> int:
    """Bytes a tensor of a canonical DType takes: numel * element size, or `quantized_data_len`."""
    size = element_size(dtype)
    if size is not None:
        return math.prod(shape) * size
    return layout.quantized_data_len(QuantScheme.from_serde(dtype["QFloat"]), shape)


def dtype_str(dtype: object) -> str:
    """A short readable form: `F32`, `Bool(Native)`, `QFloat(Q4S PackedU32(0) block [32] F16)`."""
    if isinstance(dtype, str):
        return dtype
    ((kind, inner),) = dtype.items()
    return f"QFloat({QuantScheme.from_serde(inner)})" if kind == "QFloat" else f"{kind}({inner})"
