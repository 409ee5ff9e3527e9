"""Bytes of a QFloat payload: values, then the stored scales, then the f32 global (docs/arithmetic.md §4).

Packed stores (PackedU32(0), PackedNative(0)) pack the last axis, each row padded with zero fields on
its own. A little-endian u32 holding `32 / bits` fields with the first in the least significant bits
is byte for byte the same as bytes holding `8 / bits` fields each, first in the low bits, so both
stores pack bytes; they differ only in the whole-row multiple (a word, or one e2m1x2 byte).
Multi-byte scales are written in the host's byte order, which torch shares; qcli runs on little-endian
hosts only, like Burn.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from qcli import layout
from qcli.codec import minifloat
from qcli.scheme import QuantScheme, ScaleDtype, f32_bits

# An integer type as wide as the bytes whose fields share one packed byte (2 or 4 of them).
_WORD = {2: torch.int16, 4: torch.int32}


def pack_fields(fields: torch.Tensor, scheme: QuantScheme, out: torch.Tensor | None = None) -> torch.Tensor:
    """The value region of integer `fields` (any shape; rank 0 is one row of one), written into the uint8
    `out` when given (exactly the region's length) and returned."""
    bits = scheme.value.size_bits()
    low = _low_byte(fields)
    if scheme.num_quants() == 1:  # one byte per value (Native, or PackedNative of a non-E2M1 value)
        return _into(low.reshape(-1), out)
    num_rows, last = _rows(fields.shape)
    width = layout.row_elements(scheme, last) * scheme.num_quants()
    rows = low.reshape(num_rows, last)
    if width != last:
        rows = torch.nn.functional.pad(rows, (0, width - last))
    per_byte = 8 // bits
    if per_byte == 1 or rows.numel() == 0:
        return _into(rows.reshape(-1), out)
    if torch.compiler.is_compiling() or rows.storage_offset() % per_byte:  # compile cannot trace the offset
        rows = rows.clone()
    # The `per_byte` bytes that share an output byte, read as one little-endian integer: field j sits in
    # its byte j, at bit 8j. Masked, then each shift-or moves the upper half of the fields down beside the
    # lower (field j then starts at bit j * bits), so the word's low byte is the packed byte, which the
    # conversion to uint8 keeps.
    mask = sum(((1 << bits) - 1) << (8 * j) for j in range(per_byte))
    packed = rows.view(_WORD[per_byte]) & mask
    for step in range(per_byte.bit_length() - 1):
        packed |= packed >> ((8 - bits) << step)
    return packed.to(torch.uint8).reshape(-1) if out is None else out.view(packed.shape).copy_(packed).reshape(-1)


def _into(region: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """`region` copied into `out`, or `region` itself (made contiguous) when there is no `out`."""
    if out is None:
        return region.contiguous().reshape(-1)
    return out.view(region.shape).copy_(region).reshape(-1)


def unpack_fields(region: torch.Tensor, scheme: QuantScheme, shape: Sequence[int]) -> torch.Tensor:
    """Fields of `shape` from the value region: int8 for integer values (sign-extended), uint8 codes for
    minifloats."""
    signed = not scheme.value.is_minifloat()
    if scheme.num_quants() == 1 or scheme.value.size_bits() == 8:
        fields = region.view(torch.int8) if signed else region
    else:
        bits = scheme.value.size_bits()
        per_byte = 8 // bits
        if signed:  # shift field k to the top of the byte, then back down arithmetically
            parts = [(region << (8 - bits * (k + 1))).view(torch.int8) >> (8 - bits) for k in range(per_byte)]
        else:
            parts = [(region >> (bits * k)) & ((1 << bits) - 1) for k in range(per_byte)]
        fields = torch.stack(parts, dim=-1).reshape(-1)
    if scheme.num_quants() > 1:
        num_rows, last = _rows(shape)
        fields = fields.reshape(num_rows, layout.row_elements(scheme, last) * scheme.num_quants())[:, :last]
    return fields.reshape(shape)


def pack_scales(stored: torch.Tensor, dtype: ScaleDtype) -> torch.Tensor:
    """Stored scales (already on `dtype`'s grid, so every conversion here is exact) as bytes, row-major: each
    a minifloat's code or an f32's top bits (`ScaleTraits`), little-endian."""
    traits = dtype.traits
    stored = stored.reshape(-1).to(torch.float32).contiguous()
    if dtype is ScaleDtype.F16:  # on the grid, torch's own conversion is exact: one pass, not ten
        return stored.to(torch.float16).view(torch.uint8)
    if traits.minifloat is not None:
        codes = minifloat.encode(stored, traits.minifloat)
    else:  # cubecl `f32_to_ue8m0` for UE8M0: the exponent field, so 2^-127 (exponent field 0) is code 0
        codes = stored.view(torch.int32) >> traits.step_bits
    return codes.view(torch.uint8).reshape(-1, 4)[:, : traits.bytes].reshape(-1)


def unpack_scales(region: torch.Tensor, dtype: ScaleDtype) -> torch.Tensor:
    """f32 scales from their bytes: a minifloat's code through its table, or an f32's top bits; F16's by
    torch's own widening, exact as the table (binary16 is the table's F16, NaN to NaN)."""
    traits = dtype.traits
    if dtype is ScaleDtype.F16:
        return region.clone().view(torch.float16).to(torch.float32)  # the clone: a 2-byte aligned start
    words = torch.zeros(region.numel() // traits.bytes, 4, dtype=torch.uint8, device=region.device)
    words[:, : traits.bytes] = region.reshape(-1, traits.bytes)
    codes = words.view(torch.int32).reshape(-1)
    if traits.minifloat is not None:
        return minifloat.decode(codes, traits.minifloat)
    bits = codes << traits.step_bits
    if traits.floor is None:
        return bits.view(torch.float32)
    # cubecl `ue8m0_to_f32`: code 0 is the floor, and all ones, a bare exponent with no mantissa to tell
    # infinity from NaN, is NaN
    values = torch.where(codes == 0, f32_bits(traits.floor), bits).view(torch.float32)
    return torch.where(codes == (1 << 8 * traits.bytes) - 1, float("nan"), values)


def pack_global(global_scale: float, device: torch.device | str | None = None) -> torch.Tensor:
    return torch.tensor([global_scale], dtype=torch.float32, device=device).view(torch.uint8)


def _low_byte(fields: torch.Tensor) -> torch.Tensor:
    """The low 8 bits of each field as uint8 (two's complement for negative integers)."""
    if fields.dtype is torch.uint8:
        return fields
    if fields.dtype is torch.int8:
        return fields.contiguous().view(torch.uint8)
    return (fields & 0xFF).to(torch.uint8)


def _rows(shape: Sequence[int]) -> tuple[int, int]:
    """(rows, last-axis length) of `shape`; rank 0 is one row of one value."""
    if not len(shape):
        return 1, 1
    return math.prod(shape[:-1]), shape[-1]
