"""E2M1 codes as checkpoints store them: two to a byte, and the negative zero their tables decode as +0.0;
MX formats' E8M0 block scales as Burn loads them with E2M1.

An E8M0 scale is a power of two, 2^(e - 127) for e of 0 to 254 (255 is NaN), which only UE8M0 (4.25 bits a
weight over blocks of 32), BF16 or F32 hold. No backend of Burn 0.22.1 loads E2M1 with UE8M0 or BF16 scales
(`qcli.burn_backends`; wgpu reads F16 and F32), so MX scales are written as F16 block scales under one
power-of-two F32 global (`mx_scales`): 4.5 bits a weight. F16 holds the powers of two 2^-24 to 2^15
exactly; the global moves that window, so any tensor whose non-zero blocks' scales span at most 40 powers
of two decodes to its own values: each a product of powers of two, exact.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from qcli.errors import InputError
from qcli.text import printable

if TYPE_CHECKING:
    import torch

    from qcli.io.source import TensorInfo

NEGATIVE_ZERO = 8  # E2M1's code for -0: sign bit 3 over a zero exponent and mantissa
E8M0_BIAS = 127
E8M0_NAN = 0xFF  # no f32 power of two is 2^128
F16_POWERS = (-24, 15)  # the powers of two F16 holds exactly, its subnormals included


def e2m1_codes(packed: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
    """The uint8 E2M1 codes of `shape` in bytes that hold two each along the row, the first in the low nibble."""
    import torch

    packed = packed.reshape(-1).view(torch.uint8)
    return torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(tuple(shape))


def positive_zero(codes: torch.Tensor) -> torch.Tensor:
    """`codes` with -0 written as +0 (code 0): for formats whose tables decode code 8 to +0.0 (modelopt's,
    ggml's MXFP4), which Burn would decode to -0.0."""
    import torch

    return torch.where(codes == NEGATIVE_ZERO, 0, codes)


def mx_scales(exponents: torch.Tensor, live: torch.Tensor, weight: TensorInfo, format: str) -> torch.Tensor:
    """The scale region of a two-level E2M1 payload (`nvfp4.two_level_e2m1`) for blocks of E8M0 `exponents`
    (one a block, row-major): each block's 2^(e - 127 - k) in F16, then the global 2^k in f32. A block not
    `live` (every code zero) takes 2^0, which its decode does not see. `InputError` naming `weight` (of
    `format`) for a NaN exponent, or scales spanning more powers of two than F16 holds."""
    import torch

    from qcli.codec.pack import pack_global, pack_scales
    from qcli.scheme import ScaleDtype

    exponents = exponents.reshape(-1).to(torch.int32)
    where = f"{weight.file}: tensor '{weight.name}' ({format})"
    if bool((exponents == E8M0_NAN).any()):
        block = int((exponents == E8M0_NAN).nonzero()[0])
        raise InputError(printable(f"{where} has the scale exponent 255 (E8M0's NaN) in block {block}, which no "
                                   "f32 scale holds"),
                         hint="the file is damaged, or was not written by the format's quantizer")
    powers = exponents - E8M0_BIAS
    shift = _global_power(powers[live.reshape(-1)], where)
    scales = torch.ldexp(torch.ones(powers.shape), torch.where(live.reshape(-1), powers - shift, 0).to(torch.float32))
    return torch.cat([pack_scales(scales, ScaleDtype.F16), pack_global(math.ldexp(1.0, shift))])


def _global_power(powers: torch.Tensor, where: str) -> int:
    """k of the global 2^k: of those that bring every 2^(power - k) into what F16 holds exactly, the nearest
    0 (so 0 where F16 holds them all)."""
    low, high = F16_POWERS
    if not powers.numel():
        return 0
    lo, hi = int(powers.min()), int(powers.max())
    if hi - lo > high - low:
        raise InputError(printable(f"{where} has block scales from 2^{lo} to 2^{hi}, more powers of two than the "
                                   f"F16 block scales Burn loads E2M1 with hold under one global (2^{low} to "
                                   f"2^{high} of it)"),
                         hint="dequantize that tensor to F32 with its format's own decoder and quantize the floats "
                              "with qcli (docs/input-formats.md)")
    return min(max(0, hi - high), lo - low)
