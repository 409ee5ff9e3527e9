"""Decoding a QFloat payload back to f32, as Burn's decoders do (qfloat-spec §3.5)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from qcli import layout
from qcli.codec.pack import unpack_fields, unpack_scales
from qcli.codec.values import dequantize
from qcli.errors import InputError, SchemeError
from qcli.scheme import LOOKUP_WHY, Native, QuantMode, QuantScheme


def as_bytes(payload: object) -> torch.Tensor:
    """A 1-D uint8 tensor over bytes-like `payload` or a tensor's raw bytes, on the tensor's device."""
    if isinstance(payload, torch.Tensor):
        return payload.detach().contiguous().reshape(-1).view(torch.uint8)
    data = bytearray(payload)  # type: ignore[call-overload]  # by design: TypeError for anything not bytes-like
    if not data:  # torch.frombuffer refuses an empty buffer; a tensor with no element has no payload
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer(data, dtype=torch.uint8)


def decode(payload: object, scheme: QuantScheme, shape: Sequence[int]) -> torch.Tensor:
    """f32 tensor of `shape` from a payload of exactly `quantized_data_len(scheme, shape)` bytes.

    x = q * s for one level; x = (global * s_block) * q for two, the product formed in f32. A tensor payload
    is decoded on its own device (multiplications only: every device gives the same values).
    """
    stored, stored_shape = layout.stored_as(scheme, shape)
    if stored is not scheme:  # the inner-packed form's bytes on the transpose
        return decode(payload, stored, stored_shape).t().contiguous()
    _check_decodable(scheme)
    shape = tuple(shape)
    data = as_bytes(payload)
    expected = layout.quantized_data_len(scheme, shape)
    if data.numel() != expected:
        raise InputError(
            f"a {scheme} payload of shape {list(shape)} holds {expected} bytes, got {data.numel()}",
            hint="the payload and its scheme or shape do not belong together; re-quantize the tensor",
        )
    x = decode_values(data[: layout.value_bytes(scheme, shape)], block_scales(data, scheme, shape), scheme, shape)
    return x.reshape(shape).contiguous()


def decode_values(values: torch.Tensor, scales: torch.Tensor, scheme: QuantScheme, shape: Sequence[int]
                  ) -> torch.Tensor:
    """f32 values of `shape` from their packed bytes (uint8, the value region of a payload of `shape`, or
    the rows of one that `qcli.codec.encode` packs at a time) and their blocks' scales (`block_scales`)."""
    grid = layout.BlockGrid.of(scheme, tuple(shape))
    return dequantize(unpack_fields(values, scheme, tuple(shape)), scales.reshape(grid.grid), grid, scheme.value)


def block_scales(payload: object, scheme: QuantScheme, shape: Sequence[int]) -> torch.Tensor:
    """The f32 scale each block of a payload decodes with, grid-shaped: its stored scale, times the f32
    global of a two-level scheme (the product formed in f32, as `decode` forms it)."""
    stored, stored_shape = layout.stored_as(scheme, shape)
    if stored is not scheme:  # the scales in the inner-packed form's order
        return block_scales(payload, stored, stored_shape).t()
    shape = tuple(shape)
    data = as_bytes(payload)
    start = layout.value_bytes(scheme, shape)
    end = start + layout.scale_bytes(scheme, shape)
    scales = unpack_scales(data[start:end], scheme.scale_dtype()).reshape(layout.BlockGrid.of(scheme, shape).grid)
    if scheme.is_two_level():
        scales = data[end:].clone().view(torch.float32) * scales
    return scales


def unfinite_blocks(payload: object, scheme: QuantScheme, shape: Sequence[int]) -> tuple[int, int]:
    """(blocks whose values decode to NaN or infinity through their scale, all blocks) of a payload: the
    scale (`block_scales`) NaN or infinite, or so large that the value type's largest magnitude times it
    is. A quantized tensor's scales must be finite whatever its values are."""
    a, b = scheme.value.range()
    scales = block_scales(payload, scheme, shape).reshape(-1)
    return int((~torch.isfinite(scales * max(-a, b))).sum()), scales.numel()


def _check_decodable(scheme: QuantScheme) -> None:
    """Refuse what no decoder at the pin can read back. Schemes Burn only refuses to *quantize* (e.g. F32
    block scales under a global, PackedU32 blocks narrower than a word) still decode, as cubecl's do."""
    if scheme.mode is QuantMode.Lookup:
        raise SchemeError(f"cannot decode {scheme}: {LOOKUP_WHY}", hint="use a Symmetric scheme")
    if not isinstance(scheme.store, Native) and scheme.num_quants() > 1 and scheme.store.dim != 0:
        raise SchemeError(
            f"cannot decode {scheme}: qcli reads values packed along the last axis, or a 2-D tensor's first",
            hint="pack along the last axis (dim 0), or a 2-D tensor along its first (PackedU32(1))",
        )
