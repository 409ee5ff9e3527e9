"""Element types on both sides: safetensors' spellings, Burn's `DType`, and the bytes each takes.

Burn's `DType` (burn-std `tensor/dtype.rs`) is a plain variant (`Plain`), `Bool(BoolStore)` or
`QFloat(QuantScheme)`; its serde form is the variant's name as text (`"F32"`) for a plain one and a
one-entry map (`{"Bool": "Native"}`, `{"QFloat": scheme}`) for the others. A QFloat payload's length
comes from `qcli.layout`, never from an element size.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
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


class ElementType(StrEnum):
    """A source tensor's element type, by its safetensors spelling (a GGUF file's plain types are spelled the
    same). Its row in `ELEMENT_TRAITS` says everything qcli knows of it; the tables below are read from the
    rows, so a new element type is one member and one row. Declared in safetensors' order (by width), the
    order `SAFETENSORS_BITS` and the hints list them in."""

    BOOL = "BOOL"
    U8 = "U8"
    I8 = "I8"
    F8_E5M2 = "F8_E5M2"
    F8_E4M3 = "F8_E4M3"
    F8_E8M0 = "F8_E8M0"
    I16 = "I16"
    U16 = "U16"
    F16 = "F16"
    BF16 = "BF16"
    I32 = "I32"
    U32 = "U32"
    F32 = "F32"
    C64 = "C64"
    F64 = "F64"
    I64 = "I64"
    U64 = "U64"
    F4 = "F4"
    F6_E2M3 = "F6_E2M3"
    F6_E3M2 = "F6_E3M2"

    @property
    def traits(self) -> ElementTraits:
        return ELEMENT_TRAITS[self]


class ElementKind(StrEnum):
    """What an element type's values are."""

    float = "float"  # a floating type torch computes in: the default policy quantizes it, a cast converts it
    minifloat = "minifloat"  # a float narrower than 16 bits (F8, F6, F4): another tool's quantized storage
    int = "int"
    bool = "bool"
    complex = "complex"


@dataclass(frozen=True)
class ElementTraits:
    """Everything qcli knows of one element type (`ElementType`).

    `bits`: of one element (sub-byte types pack densely); `kind`; `torch`: torch's dtype name, None where
    torch has none (F4, F6); `burn`: the plain or Bool DType qcli writes a kept tensor of it as, None where
    Burn has none; `kernels`: whether the GPU kernels quantize it; `widens_exactly`: whether an f32 holds
    every value of it; `quantized`: whether it holds values another tool already quantized (the 8-bit
    integers and the minifloats), which qcli keeps and never requantizes."""

    bits: int
    kind: ElementKind
    torch: str | None
    burn: Plain | Bool | None
    kernels: bool
    widens_exactly: bool
    quantized: bool

    def exact_float(self) -> bool:
        """A floating type torch computes in whose every value an f32 holds (F32, F16, BF16)."""
        return self.kind is ElementKind.float and self.widens_exactly


_F, _M, _I = ElementKind.float, ElementKind.minifloat, ElementKind.int  # the rows' kinds, short
_B, _C = ElementKind.bool, ElementKind.complex
ELEMENT_TRAITS = {
    # ElementTraits(bits, kind, torch, burn, kernels, widens_exactly, quantized)
    ElementType.BOOL:    ElementTraits( 8, _B, "bool",           Bool(BoolStore.Native), False, True,  False),
    ElementType.U8:      ElementTraits( 8, _I, "uint8",          Plain.U8,               False, True,  True),
    ElementType.I8:      ElementTraits( 8, _I, "int8",           Plain.I8,               False, True,  True),
    ElementType.F8_E5M2: ElementTraits( 8, _M, "float8_e5m2",    None,                   False, True,  True),
    ElementType.F8_E4M3: ElementTraits( 8, _M, "float8_e4m3fn",  None,                   False, True,  True),
    ElementType.F8_E8M0: ElementTraits( 8, _M, "float8_e8m0fnu", None,                   False, True,  True),
    ElementType.I16:     ElementTraits(16, _I, "int16",          Plain.I16,              False, True,  False),
    ElementType.U16:     ElementTraits(16, _I, "uint16",         Plain.U16,              False, True,  False),
    ElementType.F16:     ElementTraits(16, _F, "float16",        Plain.F16,              True,  True,  False),
    ElementType.BF16:    ElementTraits(16, _F, "bfloat16",       Plain.BF16,             True,  True,  False),
    ElementType.I32:     ElementTraits(32, _I, "int32",          Plain.I32,              False, False, False),
    ElementType.U32:     ElementTraits(32, _I, "uint32",         Plain.U32,              False, False, False),
    ElementType.F32:     ElementTraits(32, _F, "float32",        Plain.F32,              True,  True,  False),
    ElementType.C64:     ElementTraits(64, _C, "complex64",      None,                   False, False, False),
    ElementType.F64:     ElementTraits(64, _F, "float64",        Plain.F64,              False, False, False),
    ElementType.I64:     ElementTraits(64, _I, "int64",          Plain.I64,              False, False, False),
    ElementType.U64:     ElementTraits(64, _I, "uint64",         Plain.U64,              False, False, False),
    ElementType.F4:      ElementTraits( 4, _M, None,             None,                   False, True,  True),
    ElementType.F6_E2M3: ElementTraits( 6, _M, None,             None,                   False, True,  True),
    ElementType.F6_E3M2: ElementTraits( 6, _M, None,             None,                   False, True,  True),
}


def element_traits(dtype: str) -> ElementTraits | None:
    """The row of a source tensor's dtype, or None for one that is no element type (GGUF's `Q4_K`)."""
    return ELEMENT_TRAITS.get(dtype)  # type: ignore[call-overload]  # a member hashes as its text


def spellings(keep: Callable[[ElementTraits], bool]) -> tuple[str, ...]:
    """The spellings of the element types whose row `keep` takes, widest first (then in declaration order),
    as plain strings: the order the messages list them in."""
    kept = [member for member, row in ELEMENT_TRAITS.items() if keep(row)]
    return tuple(member.value for member in sorted(kept, key=lambda member: -member.traits.bits))


# The tables the rows give, each a query of them.
SAFETENSORS_BITS = {member.value: row.bits for member, row in ELEMENT_TRAITS.items()}
# The floating dtypes, which the default policy quantizes and a cast converts between.
FLOAT_DTYPES = spellings(lambda row: row.kind is ElementKind.float)
# The floating dtypes an f32 holds exactly: the scales formats store, the compute dtypes they name, a cast's
# targets.
EXACT_FLOAT_DTYPES = spellings(ElementTraits.exact_float)
KERNEL_DTYPES = spellings(lambda row: row.kernels)  # the source dtypes the GPU kernels quantize
# torch's name for each dtype torch has (F4 and F6 it has not), and for each Burn holds as a plain or Bool
# DType (`BOOL` a byte per element).
SAFETENSORS_TORCH_NAMES = {member.value: row.torch for member, row in ELEMENT_TRAITS.items() if row.torch is not None}
TORCH_DTYPE_NAMES = {member.value: row.torch for member, row in ELEMENT_TRAITS.items()
                     if row.torch is not None and row.burn is not None}
_SAFETENSORS_TO_BURN: dict[str, DType] = {member.value: row.burn for member, row in ELEMENT_TRAITS.items()
                                          if row.burn is not None}


def torch_dtype(safetensors_dtype: str) -> torch.dtype:
    """torch's dtype for a safetensors dtype; KeyError for one torch has not (`SAFETENSORS_TORCH_NAMES`)."""
    import torch

    return getattr(torch, SAFETENSORS_TORCH_NAMES[safetensors_dtype])


def burn_dtype(safetensors_dtype: str) -> DType | None:
    """Burn's DType for a safetensors dtype, or None where Burn has none (F8_E4M3, F4, C64, ...)."""
    return _SAFETENSORS_TO_BURN.get(safetensors_dtype)


def is_quantized(dtype: str) -> bool:
    """Whether a source tensor's dtype holds values another tool already quantized (its row's `quantized`)."""
    row = element_traits(dtype)
    return row is not None and row.quantized
