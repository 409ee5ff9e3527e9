"""Quantizing a tensor: scales over the whole tensor first, then fields and bytes one row chunk at a time.

Chunks run along axis 0 in whole blocks, so each chunk's scales are a slice of the grid and its packed
rows a contiguous piece of the value region; the working copies stay a few MiB whatever the tensor.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from qcli import layout
from qcli.codec.pack import pack_fields, pack_global, pack_scales
from qcli.codec.scales import REDUCE_DTYPE, Scales, block_alpha, block_reduce, scales_in_pieces
from qcli.codec.search import check_importance, search_scales
from qcli.codec.values import to_fields
from qcli.errors import NonFiniteTensor, NotFloatTensor
from qcli.scheme import Calibration, QuantScheme, check_accepted

# Elements per chunk and thread: 1 MiB of f32, so each core's share of a chunk and its temporaries stay
# in a 2 MiB L2. Measured on 4096x4096: 2^16 pays per-op overhead (2x slower), 2^24 spills (2x slower),
# 2^18 to 2^20 alike.
CHUNK_ELEMENTS = 1 << 18


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
    work, chunks, scales, _, workspace = _prepare(x, scheme, calibration, name)
    pieces = [f.to(torch.int32) for _, f in _chunk_fields(work, chunks, scales, scheme, workspace)]
    fields = torch.cat(pieces).reshape(x.shape)
    return QuantizedParts(fields, scales.stored.reshape(layout.params_shape(scheme, x.shape)), scales.global_scale)


class EncodeObserver(Protocol):
    """What `encode` shows of a tensor while it encodes it (`qcli.measure.ChunkedTensor` measures it)."""

    def begin(self, reduced: torch.Tensor, payload: torch.Tensor) -> None:
        """Before any chunk: the whole tensor's `block_reduce`, grid-shaped (f32 max|x| under MinMax, f64
        sum|x| under AbsMean), and the payload, whose scales are in place and whose values follow."""

    def chunk(self, rows: torch.Tensor, fields: torch.Tensor, values: torch.Tensor, first_block: int) -> None:
        """A chunk just packed: its source rows (f32, the tensor's grid shape), their fields (one byte each,
        `qcli.codec.values.to_fields`' of the same shape), the payload bytes that now hold them, and the
        flat index of its first block in the tensor's grid."""


def encode(
    x: torch.Tensor,
    scheme: QuantScheme,
    calibration: Calibration = Calibration.MinMax,
    *,
    name: str = "tensor",
    observer: EncodeObserver | None = None,
    importance: torch.Tensor | None = None,
) -> torch.Tensor:
    """The QFloat payload of `x`: uint8, 1-D, exactly `layout.quantized_data_len(scheme, x.shape)` bytes.

    f16 and bf16 inputs are widened to f32; NaN or Inf raises `NonFiniteTensor` naming the tensor. The scales
    are written first, then the values a chunk at a time; an `observer` sees each chunk's bytes as soon
    as they are packed, while the chunk is in cache. `importance` (float, broadcastable to `x`: one weight
    per input channel, [in] for a Linear's [out, in] weight, [in, 1] for it transposed) weighs each
    element's error in `Calibration.Mse`'s search (`qcli.codec.search`), which alone takes it.
    """
    work, chunks, scales, reduced, workspace = _prepare(x, scheme, calibration, name, importance)
    out = torch.empty(layout.quantized_data_len(scheme, x.shape), dtype=torch.uint8)
    offset = layout.value_bytes(scheme, x.shape)
    for region in _scale_regions(scales.stored, scales.global_scale, scheme):
        out[offset : offset + region.numel()] = region
        offset += region.numel()
    assert offset == out.numel(), f"wrote {offset} of {out.numel()} payload bytes for {scheme} {list(x.shape)}"
    if observer is not None:
        observer.begin(reduced, out)
    offset = 0
    blocks_per_row = math.prod(layout.BlockGrid.of(scheme, x.shape).grid[1:])
    # Fields one byte each, in order and unpadded, are the value region itself: written there directly.
    direct = scheme.value.size_bits() == 8 and layout.value_bytes(scheme, x.shape) == x.numel()
    for (_, grid_rows), (piece, fields) in zip(
        chunks, _chunk_fields(work, chunks, scales, scheme, workspace, out if direct else None), strict=True
    ):
        values = out[offset : offset + layout.value_bytes(scheme, fields.shape)]
        if not direct:
            pack_fields(fields, scheme, values)
        offset += values.numel()
        if observer is not None:
            observer.chunk(piece, fields, values, grid_rows.start * blocks_per_row)
    return out


def pack(parts: QuantizedParts, scheme: QuantScheme, shape: Sequence[int]) -> torch.Tensor:
    """The payload (uint8, 1-D) of `parts`, on their device: values, stored scales, then the f32 global for
    two levels (as `encode` writes them, a chunk of values at a time)."""
    regions = [pack_fields(parts.fields.reshape(tuple(shape)), scheme)]
    regions += _scale_regions(parts.scales, parts.global_scale, scheme)
    return torch.cat(regions)


def _scale_regions(stored: torch.Tensor, global_scale: float | None, scheme: QuantScheme) -> list[torch.Tensor]:
    regions = [pack_scales(stored, scheme.scale_dtype())]
    if global_scale is not None:
        regions.append(pack_global(global_scale, stored.device))
    return regions


@dataclass(frozen=True)
class _Workspace:
    """Flat buffers for the largest chunk of a tensor, reused by every chunk: a fresh chunk-sized tensor
    per step costs its page faults, measured at about the time of the pass that fills it.

    `rows`: f32 for rows widened or gathered (None when the tensor is already contiguous f32). `scratch`:
    f32 for |x| and the quotients. `fields`: one byte per field.
    """

    rows: torch.Tensor | None
    scratch: torch.Tensor
    fields: torch.Tensor

    @staticmethod
    def of(work: torch.Tensor, chunks: list[tuple[slice, slice]], scheme: QuantScheme) -> _Workspace:
        shapes = [(rows.stop - rows.start, *work.shape[1:]) for rows, _ in chunks]
        elements = max(math.prod(shape) for shape in shapes)
        padded = max(math.prod(layout.BlockGrid.of(scheme, shape).padded) for shape in shapes)
        widened = work.dtype != torch.float32 or not work.is_contiguous()
        return _Workspace(torch.empty(elements) if widened else None, torch.empty(padded),
                          torch.empty(padded, dtype=torch.int8))


def _prepare(
    x: torch.Tensor, scheme: QuantScheme, calibration: Calibration, name: str,
    importance: torch.Tensor | None = None,
) -> tuple[torch.Tensor, list[tuple[slice, slice]], Scales, torch.Tensor, _Workspace]:
    """The work tensor, its chunks, its scales, the block ranges they were taken from, and the chunks'
    workspace."""
    check_accepted(scheme, calibration)
    if calibration is Calibration.Gptq:
        raise ValueError(f"{name}: GPTQ needs calibration activations (qcli.calibrate.gptq), not the codec")
    check_importance(importance, calibration)
    if not x.dtype.is_floating_point:
        raise NotFloatTensor(name, x.dtype)
    grid = layout.BlockGrid.of(scheme, x.shape)
    work = x.detach().to(device="cpu").reshape(grid.shape)
    chunks = _row_chunks(grid, scheme)
    workspace = _Workspace.of(work, chunks, scheme)
    # Reductions go straight into one grid (a row per chunk for a per-tensor scale): small results kept
    # between the chunks' temporaries would fragment the heap, about a chunk lost per chunk.
    per_tensor = scheme.block is None
    reduced = torch.empty((len(chunks), *grid.grid) if per_tensor else grid.grid, dtype=REDUCE_DTYPE[calibration])
    for i, (rows, grid_rows) in enumerate(chunks):
        piece = _f32_rows(work, rows, workspace.rows)
        into = reduced[i] if per_tensor else reduced[grid_rows]
        block_reduce(piece, layout.BlockGrid.of(scheme, piece.shape), calibration, into, workspace.scratch)
    if per_tensor:  # one block over every chunk
        reduced = reduced.sum(0) if calibration is Calibration.AbsMean else reduced.amax(0)
    alpha = block_alpha(reduced, grid, calibration)
    if not bool(torch.isfinite(alpha).all()):
        raise NonFiniteTensor(name, x.dtype == torch.float64 and bool(torch.isfinite(x).all()))
    if calibration is Calibration.Mse:
        pieces = ((_f32_rows(work, rows), grid_rows, rows.start) for rows, grid_rows in chunks)
        searched = search_scales(pieces, alpha, scheme, grid.shape, importance=importance, name=name)
        return work, chunks, searched, reduced, workspace
    return work, chunks, scales_in_pieces(alpha, scheme), reduced, workspace


def _row_chunks(grid: layout.BlockGrid, scheme: QuantScheme) -> list[tuple[slice, slice]]:
    """(rows of the tensor, rows of the scale grid) along axis 0, in whole blocks, about CHUNK_ELEMENTS each.

    A rank-1 tensor is one packed row, cut only where a storage element ends.
    """
    rows = grid.shape[0]
    block_rows = 1 if scheme.block is None else grid.block[0]
    if len(grid.shape) == 1:
        unit, row_elements = math.lcm(block_rows, scheme.num_quants()), 1
    else:
        unit, row_elements = block_rows, math.prod(grid.shape[1:])
    if row_elements == 0 or rows == 0:
        return [(slice(0, rows), slice(0, grid.grid[0]))]
    step = max(1, CHUNK_ELEMENTS * torch.get_num_threads() // (row_elements * unit)) * unit
    chunks = []
    for start in range(0, rows, step):
        stop = min(rows, start + step)
        grid_rows = slice(0, 1) if scheme.block is None else slice(start // block_rows, math.ceil(stop / block_rows))
        chunks.append((slice(start, stop), grid_rows))
    return chunks


def _f32_rows(work: torch.Tensor, rows: slice, into: torch.Tensor | None = None) -> torch.Tensor:
    """Rows of `work` as contiguous f32: a view when they already are, else a chunk-sized copy (into the
    start of the flat f32 `into` when given), so a bf16 or transposed tensor is widened or gathered a
    chunk at a time, never as a whole."""
    part = work[rows]
    if into is None or (part.dtype == torch.float32 and part.is_contiguous()):
        return part.to(torch.float32, memory_format=torch.contiguous_format)
    return into[: part.numel()].view(part.shape).copy_(part)


def _chunk_fields(
    work: torch.Tensor,
    chunks: list[tuple[slice, slice]],
    scales: Scales,
    scheme: QuantScheme,
    workspace: _Workspace,
    out: torch.Tensor | None = None,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Each chunk's rows in f32 and their fields: in the workspace, valid until the next chunk, or with
    `out` (the payload, when its value region is the fields themselves) written into its place there."""
    offset = 0
    zero_scale = torch.compiler.is_compiling() or not bool(scales.effective.all())  # once, not per chunk
    for rows, grid_rows in chunks:
        piece = _f32_rows(work, rows, workspace.rows)
        grid = layout.BlockGrid.of(scheme, piece.shape)
        target = workspace.fields if out is None else out[offset : offset + piece.numel()]
        offset += piece.numel()
        yield piece, to_fields(piece, scales.effective[grid_rows], grid, scheme.value, workspace.scratch, target,
                               zero_scale)
