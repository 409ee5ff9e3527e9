"""Values: divide by the effective scale, then round onto the value type's grid (docs/arithmetic.md §3)."""

from __future__ import annotations

import math

import torch

from qcli.codec import minifloat, search_loop
from qcli.codec.blocks import from_blocks, per_block, to_blocks
from qcli.layout import BlockGrid
from qcli.scheme import QuantValue


def to_fields(
    x: torch.Tensor,
    effective: torch.Tensor,
    grid: BlockGrid,
    value: QuantValue,
    scratch: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    zero_scale: bool | None = None,
) -> torch.Tensor:
    """Fields shaped like `grid.shape`: the integer q as int8, or the minifloat code as uint8.

    `x` is f32; `effective` holds one scale per block, grid-shaped. `scratch` (flat f32) holds the quotients
    and `out` (flat, one byte per element) the fields when given, each at least as long as the blocks:
    buffers reused chunk after chunk, where a fresh tensor each time costs its page faults. `zero_scale`
    says whether any of `effective` is zero, when the caller knows (for every chunk of a tensor at once).
    On the CPU the compiled loop makes the same codes in one pass (`search_loop.integer_codes`, where the
    blocks lie in the tensor's own order, and `search_loop.minifloat_codes`).
    """
    if not value.is_minifloat() and _compiled(x) and x.is_contiguous():
        target = _part(None if out is None else out.view(torch.int8), grid.shape)
        codes = search_loop.integer_codes(x, effective, grid, value, target)
        if codes is not None:
            return codes
    blocks = to_blocks(x, grid)
    v = torch.div(blocks, per_block(effective, grid), out=_part(scratch, blocks.shape))  # IEEE, as div_rn
    # An exact zero stays zero. x / s already gives x for x == ±0 unless s underflowed to 0 (0/0), so the
    # where runs only when some scale is zero (all() is one pass, `== 0` then any() two); under
    # torch.compile it always runs.
    if zero_scale is None:
        zero_scale = torch.compiler.is_compiling() or not bool(effective.all())
    if zero_scale:
        v = torch.where(blocks == 0, blocks, v)
    a, b = value.range()
    v = from_blocks(v, grid).clamp_(a, b)
    if value.is_minifloat():
        fmt, target = minifloat.FORMATS[value], _part(None if out is None else out.view(torch.uint8), grid.shape)
        if _compiled(v):
            return search_loop.minifloat_codes(v.contiguous(), fmt, target)
        codes = minifloat.encode(v.contiguous(), fmt)
        return codes.to(torch.uint8) if target is None else target.copy_(codes)  # codes fit a byte
    v.round_()  # half to even; clamping first is the same, a and b are integers
    target = _part(None if out is None else out.view(torch.int8), grid.shape)
    return v.to(torch.int8) if target is None else target.copy_(v)


def _compiled(x: torch.Tensor) -> bool:
    """Whether the compiled loop makes the codes of `x`: f32 on the CPU, where it is built, outside
    torch.compile."""
    return search_loop.BUILT and x.device.type == "cpu" and x.dtype == torch.float32 \
        and not torch.compiler.is_compiling()


def _part(buffer: torch.Tensor | None, shape: tuple[int, ...]) -> torch.Tensor | None:
    """The start of a flat buffer viewed as `shape`, or None without one."""
    return None if buffer is None else buffer[: math.prod(shape)].view(shape)


def from_fields(fields: torch.Tensor, value: QuantValue) -> torch.Tensor:
    """f32 values of fields: integers as they are, minifloat codes through the format's table."""
    if value.is_minifloat():
        return minifloat.decode(fields, minifloat.FORMATS[value])
    return fields.to(torch.float32)


def dequantize(fields: torch.Tensor, scales: torch.Tensor, grid: BlockGrid, value: QuantValue) -> torch.Tensor:
    """f32 values `q * s` shaped like `grid.shape`: each field's value times its block's scale (`scales`
    grid-shaped f32, a global already multiplied in), as Burn decodes them."""
    # Integer fields go into the product as they are (torch widens them exactly on the way): one pass.
    q = from_fields(fields, value) if value.is_minifloat() else fields
    return from_blocks(per_block(scales, grid) * to_blocks(q, grid), grid).reshape(grid.shape)
