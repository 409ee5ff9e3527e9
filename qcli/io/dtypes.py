"""Element types on both sides: safetensors' spellings, Burn's `DType`, and the bytes each takes.

Burn's `DType` (burn-std `tensor/dtype.rs`) is a plain variant (`Plain`), `Bool(BoolStore)` or
`QFloat(QuantScheme)`; its serde form is the variant's name as text (`"F32"`) for a plain one and a
one-entry map (`{"Bool": "Native"}`, `{"QFloat": scheme}`) for the others. A QFloat payload's length
comes from `qcli.layout`, never from an element size.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

from qcli import layout
from qcli.errors import SchemeError
from qcli.scheme import QuantScheme

if TYPE_CHECKING:
    import torch


class Plain(StrEnum):
    """A plain Burn DType, which is its own serde form."""

    F64 = "F64"
    F32 = "F32"
    Flex32 = "Flex32"
    F16 = "F16"
    BF16 = "BF16"
    I64 = "I64"
    I32 = "I32"
    I16 = "I16"
    I8 = "I8"
    U64 = "U64"
    U32 = "U32"
    U16 = "U16"
    U8 = "U8"

    @property
    def size(self) -> int:
        """Bytes of one element."""
        return _PLAIN_SIZES[self]

    def nbytes(self, shape: Sequence[int]) -> int:
        return math.prod(shape) * self.size

    def to_serde(self) -> str:
        return self.value


_PLAIN_SIZES = {
    Plain.F64: 8, Plain.F32: 4, Plain.Flex32: 4, Plain.F16: 2, Plain.BF16: 2,
    Plain.I64: 8, Plain.I32: 4, Plain.I16: 2, Plain.I8: 1,
    Plain.U64: 8, Plain.U32: 4, Plain.U16: 2, Plain.U8: 1,
}


class BoolStore(StrEnum):
    """How Burn stores one Bool element: a Rust bool, a u8 or a u32."""

    Native = "Native"
    U8 = "U8"
    U32 = "U32"


_BOOL_STORE_SIZES = {BoolStore.Native: 1, BoolStore.U8: 1, BoolStore.U32: 4}


@dataclass(frozen=True)
class Bool:
    """Burn's `DType::Bool(BoolStore)`."""

    store: BoolStore

    @property
    def size(self) -> int:
        """Bytes of one element."""
        return _BOOL_STORE_SIZES[self.store]

    def nbytes(self, shape: Sequence[int]) -> int:
        return math.prod(shape) * self.size

    def to_serde(self) -> dict[str, str]:
        return {"Bool": self.store.value}

    def __str__(self) -> str:
        return f"Bool({self.store})"


@dataclass(frozen=True)
class QFloat:
    """Burn's `DType::QFloat(QuantScheme)`. `with_0_21_keys`: its serde form also has the keys Burn 0.21
    reads (`QuantScheme.to_serde`), as a file written for 0.21 has them."""

    scheme: QuantScheme
    with_0_21_keys: bool = False

    def nbytes(self, shape: Sequence[int]) -> int:
        return layout.quantized_data_len(self.scheme, shape)

    def to_serde(self) -> dict[str, dict]:
        return {"QFloat": self.scheme.to_serde(with_0_21_keys=self.with_0_21_keys)}

    def __str__(self) -> str:
        """`QFloat(Q4S PackedU32(0) block [32] F16)`."""
        return f"QFloat({self.scheme})"


DType = Plain | Bool | QFloat


def dtype_from_serde(obj: object) -> DType:
    """Burn's DType from its serde form; ValueError when malformed. A QFloat's 0.21 keys must say what its
    other keys say."""
    if isinstance(obj, str) and obj in tuple(Plain):
        return Plain(obj)
    if isinstance(obj, dict) and len(obj) == 1:
        ((kind, inner),) = obj.items()
        if kind == "Bool" and isinstance(inner, str) and inner in tuple(BoolStore):
            return Bool(BoolStore(inner))
        if kind == "QFloat":
            try:
                scheme = QuantScheme.from_serde(inner)
            except SchemeError as exc:
                raise ValueError(exc.message) from None
            older = isinstance(inner, dict) and ("param" in inner or "level" in inner)
            if older and (scheme.is_two_level() or inner != scheme.to_serde(with_0_21_keys=True)):
                raise ValueError(f"the Burn 0.21 keys of {inner!r} do not say what its other keys say")
            return QFloat(scheme, with_0_21_keys=older)
    raise ValueError(f"not a Burn DType: {obj!r}")


# Bits of one element of each dtype the safetensors format knows (sub-byte types pack densely).
SAFETENSORS_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32, "C64": 64,
    "F64": 64, "I64": 64, "U64": 64,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}
# The floating dtypes, which the default policy quantizes and a cast converts between.
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")
# Already quantized by another tool: 8-bit integers and the sub-16-bit float formats (F8_E4M3, F8_E5M2,
# F8_E8M0, F6_*, F4) of newer safetensors.
QUANTIZED_DTYPES = ("I8", "U8")
QUANTIZED_PREFIXES = ("F8_", "F6_", "F4")
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
_SAFETENSORS_TO_BURN: dict[str, DType] = {
    **{plain.value: plain for plain in Plain if plain is not Plain.Flex32},
    "BOOL": Bool(BoolStore.Native),
}


def torch_dtype(safetensors_dtype: str) -> torch.dtype:
    """torch's dtype for a safetensors dtype; KeyError for one torch has not (`SAFETENSORS_TORCH_NAMES`)."""
    import torch

    return getattr(torch, SAFETENSORS_TORCH_NAMES[safetensors_dtype])


def burn_dtype(safetensors_dtype: str) -> DType | None:
    """Burn's DType for a safetensors dtype, or None where Burn has none (F8_E4M3, F4, C64, ...)."""
    return _SAFETENSORS_TO_BURN.get(safetensors_dtype)


def is_quantized(dtype: str) -> bool:
    """Whether a safetensors dtype holds values another tool already quantized."""
    return dtype in QUANTIZED_DTYPES or dtype.startswith(QUANTIZED_PREFIXES)
