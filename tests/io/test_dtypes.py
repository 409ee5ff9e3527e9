"""The element types' rows (`qcli.io.dtypes.ELEMENT_TRAITS`) held to facts from outside them: torch's dtypes
(itemsize, finfo/iinfo), the safetensors library's own reading of each spelling, and every value widened
to f32 and compared in f64. A member added without a full row fails here."""

from __future__ import annotations

import dataclasses
import json
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from qcli.io.dtypes import (
    ELEMENT_TRAITS,
    EXACT_FLOAT_DTYPES,
    FLOAT_DTYPES,
    KERNEL_DTYPES,
    SAFETENSORS_BITS,
    Bool,
    BoolStore,
    ElementKind,
    ElementTraits,
    ElementType,
    Plain,
    burn_dtype,
    element_traits,
    is_quantized,
    torch_dtype,
)
from qcli.io.gguf import BY_NAME, PLAIN_TYPES

MEMBERS = list(ElementType)
WITH_TORCH = [m for m in MEMBERS if m.traits.torch is not None]
FIELD_TYPES = {"bits": int, "kind": ElementKind, "torch": (str, type(None)), "burn": (Plain, Bool, type(None)),
               "kernels": bool, "widens_exactly": bool, "quantized": bool}


def test_every_member_has_a_row_with_every_field() -> None:
    assert list(ELEMENT_TRAITS) == MEMBERS  # one row each, in the members' order
    assert [f.name for f in dataclasses.fields(ElementTraits)] == list(FIELD_TYPES)
    assert all(f.default is dataclasses.MISSING for f in dataclasses.fields(ElementTraits))  # none left out
    for member, row in ELEMENT_TRAITS.items():
        assert member.name == member.value  # safetensors' spelling, as written in a header
        for name, kind in FIELD_TYPES.items():
            assert isinstance(getattr(row, name), kind), (member, name)
        assert row.bits > 0


def test_a_member_compares_and_hashes_as_its_spelling() -> None:
    """`TensorInfo.dtype` stays the header's text: a member is that text, so either finds a row."""
    assert ElementType.F32 == "F32" and {"F32": 1}[ElementType.F32] == 1
    assert element_traits("BF16") is ElementType.BF16.traits
    assert element_traits("Q4_K") is None and not is_quantized("Q4_K")  # a GGUF type, no element type


@pytest.mark.parametrize("member", WITH_TORCH, ids=str)
def test_torch_agrees_with_the_row(member: ElementType) -> None:
    row = member.traits
    dtype = torch_dtype(member)
    assert dtype.itemsize * 8 == row.bits
    if row.kind in (ElementKind.float, ElementKind.minifloat):
        assert dtype.is_floating_point and torch.finfo(dtype).bits == row.bits
        assert (row.kind is ElementKind.minifloat) == (row.bits < 16)
    elif row.kind is ElementKind.int:
        assert not dtype.is_floating_point and torch.iinfo(dtype).bits == row.bits
    elif row.kind is ElementKind.bool:
        assert dtype is torch.bool
    else:
        assert row.kind is ElementKind.complex and dtype.is_complex


@pytest.mark.parametrize("member", WITH_TORCH, ids=str)
def test_safetensors_writes_and_reads_the_spelling(member: ElementType, tmp_path: Path) -> None:
    """safetensors' own writer spells a tensor of the row's torch dtype as the member, and reads it back
    as that dtype."""
    dtype = torch_dtype(member)
    path = tmp_path / "t.safetensors"
    save_file({"t": torch.zeros(4, dtype=dtype)}, str(path))
    (length,) = struct.unpack("<Q", path.read_bytes()[:8])
    assert json.loads(path.read_bytes()[8 : 8 + length])["t"]["dtype"] == member.value
    assert load_file(str(path))["t"].dtype == dtype


def _header(tmp_path: Path, spelling: str, count: int, nbytes: int) -> Path:
    header = json.dumps({"t": {"dtype": spelling, "shape": [count], "data_offsets": [0, nbytes]}}).encode()
    header += b" " * (-len(header) % 8)
    path = tmp_path / f"{spelling}-{nbytes}.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + bytes(nbytes))
    return path


@pytest.mark.parametrize("member", MEMBERS, ids=str)
def test_safetensors_takes_the_spelling_at_the_rows_bits(member: ElementType, tmp_path: Path) -> None:
    """The safetensors library opens a header naming the member only when its bytes are `bits` a value
    (8 values: `bits` bytes), F4 and F6 too, which torch has not."""
    bits = member.traits.bits
    with safe_open(str(_header(tmp_path, member.value, 8, bits)), framework="numpy") as file:
        assert file.get_slice("t").get_dtype() == member.value
    with pytest.raises(SafetensorError):
        safe_open(str(_header(tmp_path, member.value, 8, bits + 1)), framework="numpy")


def _widens_exactly(member: ElementType) -> bool:
    """Whether an f32 holds every value of `member`, from torch and the type's width alone."""
    row = member.traits
    if row.torch is None:  # F4, F6: fewer exponent and mantissa bits than f32's 8 and 23
        return row.kind is ElementKind.minifloat and row.bits < 8
    dtype = torch_dtype(member)
    if dtype.is_complex:
        return False
    if dtype is torch.bool:
        values = torch.tensor([False, True])
    elif row.bits <= 16:  # every bit pattern, compared in f64 (which holds each of them)
        patterns = np.arange(1 << row.bits, dtype=np.uint16 if row.bits == 16 else np.uint8)
        values = torch.from_numpy(patterns).view(dtype)
    elif dtype.is_floating_point:
        return torch.finfo(dtype).eps >= torch.finfo(torch.float32).eps
    else:
        return torch.iinfo(dtype).max <= 1 << 24  # f32's integers are exact up to 2^24
    wide = values.to(torch.float64)
    through = values.to(torch.float32).to(torch.float64)
    return bool(((wide == through) | (wide.isnan() & through.isnan())).all())


@pytest.mark.parametrize("member", MEMBERS, ids=str)
def test_widens_exactly_is_what_f32_holds(member: ElementType) -> None:
    assert member.traits.widens_exactly == _widens_exactly(member)


@pytest.mark.parametrize("member", MEMBERS, ids=str)
def test_burn_dtype_is_the_plain_or_bool_of_the_same_width(member: ElementType) -> None:
    burn = member.traits.burn
    if isinstance(burn, Plain):
        assert burn.value == member.value and burn.size * 8 == member.traits.bits
    elif isinstance(burn, Bool):
        assert member is ElementType.BOOL and burn == Bool(BoolStore.Native)
    else:
        assert member.value not in tuple(Plain) and burn_dtype(member) is None


def test_the_kernels_and_the_already_quantized_rows() -> None:
    for member, row in ELEMENT_TRAITS.items():
        assert not row.kernels or row.kind is ElementKind.float and row.widens_exactly, member
        assert row.kind is not ElementKind.minifloat or row.quantized, member  # a minifloat is storage
        assert is_quantized(member) == row.quantized


def test_the_queries_give_the_tables_qcli_has_always_had() -> None:
    """The lists the messages and recipes show, widest first."""
    assert FLOAT_DTYPES == ("F64", "F32", "F16", "BF16")
    assert EXACT_FLOAT_DTYPES == KERNEL_DTYPES == ("F32", "F16", "BF16")
    assert [m for m in MEMBERS if ELEMENT_TRAITS[m].quantized] == [
        "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "F4", "F6_E2M3", "F6_E3M2"]


def test_ggufs_plain_types_are_rows_of_their_width() -> None:
    assert set(PLAIN_TYPES) == {"F32", "F16", "BF16", "F64", "I8", "I16", "I32", "I64"}
    for name in PLAIN_TYPES:
        assert BY_NAME[name].block == 1 and BY_NAME[name].nbytes * 8 == SAFETENSORS_BITS[name]
