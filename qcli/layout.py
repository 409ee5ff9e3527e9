"""Burn's byte layout of a `DType::QFloat` tensor: how many bytes each region takes.

```
[ values ][ block-or-tensor scales, row-major over the block grid ][ f32 global, two-level only ]
```

No padding between the regions (burn-std `quantized_data_len`, B:quantization.rs:400-407). Packed
stores pad each row of the packed (last) axis on its own to whole storage elements. This module alone
answers `quantized_data_len`; the container takes lengths from here and never recomputes them.

`BlockGrid` is the integer geometry of the scale grid, which the codec's torch views and the kernels'
launches share.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from qcli.scheme import Native, QuantScheme, inner_packed, packs_outer


@dataclass(frozen=True)
class BlockGrid:
    """`shape` split into blocks of `block`, `grid` blocks per axis (all three of the same rank >= 1).

    Blocks are right-aligned on the trailing axes (`BlockSize.to_dim_vec`); a partial block at the edge
    takes a scale of its own. A per-tensor scheme is one block covering the whole tensor. A rank-0 tensor
    is handled as shape `[1]`.

    The derived shapes are worked out once per grid: the codec's views ask for them at every call, and
    GPTQ's column loop makes thousands of calls on one grid.
    """

    shape: tuple[int, ...]
    block: tuple[int, ...]
    grid: tuple[int, ...]

    @staticmethod
    def of(scheme: QuantScheme, shape: Sequence[int]) -> BlockGrid:
        shape = tuple(shape) or (1,)
        if scheme.block is None:
            return BlockGrid(shape, shape, (1,) * len(shape))
        block = tuple(scheme.block.size.to_dim_vec(len(shape)))
        return BlockGrid(shape, block, tuple(math.ceil(d / b) for d, b in zip(shape, block, strict=True)))

    @functools.cached_property
    def padded(self) -> tuple[int, ...]:
        """The shape rounded up to whole blocks."""
        return tuple(g * b for g, b in zip(self.grid, self.block, strict=True))

    @functools.cached_property
    def _splits(self) -> list[bool]:
        # Which axes split into (blocks, extent). An axis of extent 1 stays whole, so a [32] block on a
        # matrix is the view [rows, blocks, 32] and reductions run over one contiguous innermost axis;
        # the last axis always splits, so there is at least one axis to reduce over.
        last = len(self.shape) - 1
        return [b != 1 or i == last for i, b in enumerate(self.block)]

    def _view(self, inner: Sequence[int]) -> list[int]:
        parts = zip(self.grid, inner, self._splits, strict=True)
        return [n for g, b, split in parts for n in ((g, b) if split else (g,))]

    @functools.cached_property
    def blocked_shape(self) -> list[int]:
        """The padded shape with each block on its own axes (`qcli.codec.blocks.to_blocks`)."""
        return self._view(self.block)

    @functools.cached_property
    def scales_shape(self) -> list[int]:
        """The grid's shape viewed to broadcast over `blocked_shape`."""
        return self._view([1] * len(self.block))

    def blocked_shape_of(self, extents: Sequence[int]) -> list[int]:
        """`blocked_shape` for a tensor of `extents`, broadcastable to `shape` and of its rank: an axis of
        extent 1 stays 1 in both its parts (`qcli.codec.blocks.broadcast_to_blocks`)."""
        whole = [e != 1 for e in extents]
        parts = zip(self.grid, self.block, whole, self._splits, strict=True)
        return [n if w else 1 for g, b, w, split in parts for n in ((g, b) if split else (g,))]

    @functools.cached_property
    def block_axes(self) -> tuple[int, ...]:
        """The axes of `blocked_shape` that run inside one block."""
        ends = itertools.accumulate(2 if split else 1 for split in self._splits)
        return tuple(end - 1 for end, split in zip(ends, self._splits, strict=True) if split)


def row_elements(scheme: QuantScheme, last_dim: int) -> int:
    """Storage elements holding one row of `last_dim` values (rows are padded on their own)."""
    return math.ceil(last_dim / scheme.num_quants())


def storage_elements(scheme: QuantScheme, shape: Sequence[int]) -> int:
    """Storage elements of the value region."""
    n = scheme.num_quants()
    if n > 1 and not isinstance(scheme.store, Native) and len(shape) > 0:
        return math.prod(shape[:-1]) * row_elements(scheme, shape[-1])
    return math.ceil(math.prod(shape) / n)


def value_bytes(scheme: QuantScheme, shape: Sequence[int]) -> int:
    """Bytes of the value region; a sub-byte Native element is accounted as a whole byte."""
    scheme, shape = stored_as(scheme, shape)
    return storage_elements(scheme, shape) * math.ceil(scheme.size_bits_stored() / 8)


def stored_as(scheme: QuantScheme, shape: Sequence[int]) -> tuple[QuantScheme, tuple[int, ...]]:
    """The scheme and shape whose last axis the payload's rows run along: a 2-D tensor packed along its
    outer axis holds its inner-packed form's bytes on the transpose (`qcli.scheme.inner_packed`); any other
    tensor, `scheme` itself and its shape."""
    if packs_outer(scheme) and len(shape) == 2:
        return inner_packed(scheme), tuple(shape)[::-1]
    return scheme, tuple(shape)


def params_shape(scheme: QuantScheme, shape: Sequence[int]) -> list[int]:
    """Shape of the scale grid: `[1]` per tensor, else the blocks per axis."""
    if scheme.block is None:
        return [1]
    return scheme.block.size.num_blocks(shape)


def num_scales(scheme: QuantScheme, shape: Sequence[int]) -> int:
    return math.prod(params_shape(scheme, shape))


def scale_bytes(scheme: QuantScheme, shape: Sequence[int]) -> int:
    """Bytes of the innermost scale level."""
    return num_scales(scheme, shape) * scheme.scale_dtype().scale_size()


def global_bytes(scheme: QuantScheme) -> int:
    """Bytes of the f32 global scale that follows the block scales of a two-level scheme."""
    return 4 if scheme.is_two_level() else 0


def quantized_data_len(scheme: QuantScheme, shape: Sequence[int]) -> int:
    """Total payload bytes: values, then scales, then the optional global (`stored_as`)."""
    return _quantized_data_len(*stored_as(scheme, shape))


@functools.lru_cache(maxsize=1 << 12)  # a model's tensors share a few shapes: planning 200k is linear, not slow
def _quantized_data_len(scheme: QuantScheme, shape: tuple[int, ...]) -> int:
    return value_bytes(scheme, shape) + scale_bytes(scheme, shape) + global_bytes(scheme)


def bits_per_weight(nbytes: int, count: int) -> float:
    """Bits per logical element of `count` elements stored in `nbytes` (a payload's: its scales included);
    0 where there is no element."""
    return 8 * nbytes / count if count else 0.0


def row_regions(scheme: QuantScheme, shape: Sequence[int], start: int, stop: int) -> list[tuple[int, int, int]]:
    """`(offset in the payload of shape, offset in the payload of rows [start, stop) alone, length)` of each
    region those rows fill. Rows along the first axis in whole blocks (the last run may end at the edge)
    fill a contiguous part of the values and of the scales, and share the global; a tensor of rank < 2,
    or all its rows, is one region."""
    shape = tuple(shape)
    if len(shape) < 2 or (start, stop) == (0, shape[0]):
        return [(0, 0, quantized_data_len(scheme, shape))]
    rows = (stop - start, *shape[1:])
    values, scales = value_bytes(scheme, rows), scale_bytes(scheme, rows)
    full_values = value_bytes(scheme, shape)
    if scheme.block is None:
        scale_offset = 0
    else:
        step = scheme.block.size.to_dim_vec(len(shape))[0]
        scale_offset = start // step * scale_bytes(scheme, (step, *shape[1:]))
    regions = [(start * value_bytes(scheme, (1, *shape[1:])), 0, values), (full_values + scale_offset, values, scales)]
    if scheme.is_two_level():
        regions.append((full_values + scale_bytes(scheme, shape), values + scales, global_bytes(scheme)))
    return regions
