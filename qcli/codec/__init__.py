"""The CPU codec: a float tensor to the bytes of a Burn QFloat payload and back (docs/arithmetic.md).

`encode` and `decode` are what the pipelines call; `quantize_parts`, `round_up` and `pack` expose the
intermediate steps the GPU path is compared against.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from qcli.codec.blocks import BlockGrid
from qcli.codec.decode import decode
from qcli.codec.pack import pack_fields, pack_global, pack_scales
from qcli.codec.scales import block_alpha, round_up, scales_from_alpha
from qcli.codec.stats import ErrorStats, error_stats
from qcli.codec.values import fields as value_fields
from qcli.errors import InputError
from qcli.scheme import Calibration, QuantScheme, check_accepted

__all__ = [
    "ErrorStats",
    "QuantizedParts",
    "decode",
    "encode",
    "error_stats",
    "pack",
    "quantize_parts",
    "round_up",
]


@dataclass(frozen=True)
class QuantizedParts:
    """A quantized tensor before packing.

    `fields`: int32 shaped like the input, the integer q or the minifloat code. `scales`: the stored f32
    scales shaped like `layout.params_shape` (relative ones under a global). `global_scale`: the f32
    global of a two-level scheme, else None.
    """

    fields: torch.Tensor
    scales: torch.Tensor
    global_scale: float | None


def quantize_parts(
    x: torch.Tensor,
    scheme: QuantScheme,
    calibration: Calibration = Calibration.MinMax,
    *,
    name: str = "tensor",
) -> QuantizedParts:
    """Fields and scales of `x` under `scheme`; refuses schemes Burn refuses and non-finite data."""
    check_accepted(scheme, calibration)
    x = _as_f32(x, name)
    grid = BlockGrid.of(scheme, x.shape)
    alpha = block_alpha(x, grid, calibration)
    if not bool(torch.isfinite(alpha).all()):  # max and sum propagate NaN and inf from any element
        raise InputError(
            f"tensor {name!r} holds NaN or Inf values, which cannot be quantized",
            hint="keep it unquantized with a `keep = true` rule, or fix the checkpoint",
        )
    scales = scales_from_alpha(alpha, scheme)
    q = value_fields(x, scales.effective, grid, scheme.value).reshape(x.shape)
    params = [1] if scheme.block is None else list(grid.grid)
    return QuantizedParts(q, scales.stored.reshape(params), scales.global_scale)


def pack(parts: QuantizedParts, scheme: QuantScheme, shape: Sequence[int]) -> torch.Tensor:
    """The payload bytes (uint8, 1-D): values, stored scales, then the f32 global for two levels."""
    regions = [
        pack_fields(parts.fields.reshape(tuple(shape)), scheme),
        pack_scales(parts.scales, scheme.scale_dtype()),
    ]
    if parts.global_scale is not None:
        regions.append(pack_global(parts.global_scale))
    return torch.cat(regions)


def encode(
    x: torch.Tensor,
    scheme: QuantScheme,
    calibration: Calibration = Calibration.MinMax,
    *,
    name: str = "tensor",
) -> torch.Tensor:
    """The QFloat payload of `x`: uint8, 1-D, exactly `layout.quantized_data_len(scheme, x.shape)` bytes."""
    return pack(quantize_parts(x, scheme, calibration, name=name), scheme, x.shape)


def _as_f32(x: torch.Tensor, name: str) -> torch.Tensor:
    if not x.dtype.is_floating_point:
        raise InputError(
            f"tensor {name!r} has dtype {x.dtype}, not a float type, so it cannot be quantized",
            hint="keep it unquantized with a `keep = true` rule",
        )
    return x.detach().to(device="cpu", dtype=torch.float32).contiguous()
