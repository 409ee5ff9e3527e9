"""E2M1 codes as checkpoints store them: two to a byte, and the negative zero their tables decode as +0.0."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

NEGATIVE_ZERO = 8  # E2M1's code for -0: sign bit 3 over a zero exponent and mantissa


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
