"""Launching GPTQ's column kernel (`_gptq`): one launch for each lazy block of a Linear's weight, where the
scheme's blocks run along W's input columns (`takes`); `qcli.calibrate.gptq` holds the algorithm and runs
the torch loop for every other layout."""

from __future__ import annotations

import torch
import triton

from qcli import layout
from qcli.codec.search import CLIPS, candidate_count, error_bits, group_weights, importance_bits
from qcli.kernels import _gptq as KG
from qcli.kernels import _search as KS
from qcli.kernels.constants import COMPILE_OPTIONS, clips, scale_constants, value_constants
from qcli.scheme import QuantScheme

ROWS = 16  # rows of W a program holds: [16, 128] f32 of the lazy block in registers


def takes(scheme: QuantScheme, shape: tuple[int, int], transpose: bool, block_size: int) -> bool:
    """Whether the kernel takes GPTQ of a weight of `shape` [out, in] under `scheme`: blocks [1, c] of W, one
    row by c input columns (a block [c] of W written as it is), c a power of two whose groups tile the
    lazy blocks of `block_size` columns (a power of two too)."""
    if scheme.block is None or transpose or block_size & (block_size - 1):
        return False
    r, c = layout.BlockGrid.of(scheme, shape).block
    return r == 1 and c & (c - 1) == 0 and block_size % c == 0


def lazy_block(w: torch.Tensor, u: torch.Tensor, fields: torch.Tensor, dequantized: torch.Tensor,
               errors: torch.Tensor, stored: torch.Tensor, scheme: QuantScheme, search: bool,
               glob: torch.Tensor | None, weights: tuple[torch.Tensor, torch.Tensor] | None) -> None:
    """GPTQ's column loop over the lazy block `w` (f32 [out, width], a view of W, its rows' stride W's) with
    `u` (U's [width, width] block): `fields` (int32) and `dequantized` (f32) of the same view shape, the
    errors into `errors` ([out, >= width]), each group's stored scale into `stored` ([out, groups], a view of
    the grid); `glob` the two-level global (a 0-d f32), `weights` the column weights and each group's flag
    (`group_weights`, on w's device) that weigh the search."""
    rows, width = w.shape
    if u.stride(1) != 1 or w.stride(1) != 1 or fields.stride() != dequantized.stride() or stored.stride(1) != 1:
        raise ValueError("lazy_block reads rows: w, u, fields, dequantized and stored need unit column strides, "
                         "fields and dequantized the same")
    c = layout.BlockGrid.of(scheme, (rows, width)).block[1]
    weigh = KS.WEIGH_NONE.value if weights is None else KS.WEIGH_COLUMNS.value
    weight_values, weighed = (None, None) if weights is None else weights
    KG.gptq_columns_kernel[(triton.cdiv(rows, ROWS),)](
        w, u, fields, dequantized, errors, stored, weight_values, weighed, clips(w.device),
        rows, width, w.stride(0), u.stride(0), fields.stride(0), errors.stride(0), stored.stride(0),
        float(glob) if glob is not None else 1.0,
        R=ROWS, BW=triton.next_power_of_2(max(width, c)), C=c, SEARCH=search, WEIGH=weigh,
        J_PLAIN=error_bits(c, 0), J_WEIGHED=error_bits(c, importance_bits(c)), CLIP_COUNT=len(CLIPS),
        CANDIDATES=candidate_count(scheme), TWO_LEVEL=scheme.is_two_level(),
        HALF_RANGE=scheme.value.half_range(), num_warps=4,
        **_taken(scale_constants(scheme.scale_dtype())), **_taken(value_constants(scheme.value)), **COMPILE_OPTIONS)


def _taken(constants: dict) -> dict:
    """The constexprs the column kernel declares, of a row's (`constants.scale_constants`, `value_constants`):
    it stores no packed field and no scale bytes, so it takes no width of either."""
    return {name: value for name, value in constants.items() if name not in ("BITS", "SCALE_SIZE")}


def column_weights(importance: torch.Tensor, scheme: QuantScheme, shape: tuple[int, int], device: torch.device
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """The search's integer weights of W's input columns, each group's relative to its own largest, and
    which groups they weigh, as `qcli.codec.search.Search` makes them for one group at a time; int32 on
    `device`."""
    c = layout.BlockGrid.of(scheme, shape).block[1]
    weights, weighed = group_weights(importance, c, importance_bits(c))
    return weights.to(device, torch.int32), weighed.to(device, torch.int32)
