"""The scale search of `Calibration.Mse`: each block keeps, of a few candidate scales, the one whose decode
errs least in squared error. Burn decodes any stored scale as `q * s`, so a better scale costs nothing at
load time (docs/arithmetic.md §6).

The candidates, in order: the scale MinMax stores (`amax / h` rounded up onto the scale dtype); then
`c * amax / h` rounded to nearest for each c in CLIPS; then, for a range `[a, b]` with unequal ends (Q8F,
Q4F, Q2F), `amax / b` and `amax / -a`, which put the block's largest value exactly on an end, and (for
scale dtypes with a sign) the negative scales `c * amax / a` for c in 1 and CLIPS, which put a positive
largest value on the longer end `a` as llama.cpp's Q4_0 does (Burn decodes `q * s` whatever the sign:
tests/io/test_burn.py).
Under a global scale (two levels) the global is MinMax's, and the stored scale relative to it is searched.

A candidate's error is integer arithmetic on f32 operations that round the same everywhere: with
`d = x - q * s` in f32 and `e` the exponent of the block's amax, each element adds `RN(d * 2^(J - e))^2`
to a sum that stays an integer below 2^53. An exact sum does not depend on its order, so a GPU's
reduction picks what the CPU picks; of equal errors the first candidate wins.

With `importance` (llama.cpp's importance matrix: per input channel of a Linear, the mean squared
activation it sees), each element's term is weighed by its channel's importance as a small integer
(`importance_weights`), so a block keeps the scale that errs least where the layer's output feels it; the
sum stays an exact integer (`error_bits`, `importance_bits`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from qcli.codec import search_loop
from qcli.codec.blocks import broadcast_to_blocks, from_blocks, per_block, to_blocks
from qcli.codec.scales import Scales, divided, global_of, nearest, scales_from_alpha
from qcli.codec.values import dequantize, to_fields
from qcli.errors import InputError, UsageError
from qcli.layout import BlockGrid
from qcli.scheme import Calibration, QuantScheme, QuantValue

# Clip factors k/32: exact in f32, so `c * raw` rounds once, the same in every implementation.
CLIPS = tuple((32 - k) / 32 for k in range(1, 10))  # 31/32 down to 23/32 (0.72)
ERROR_BITS = 20  # J at most: the fixed-point bits of |d| / 2^e
IMPORTANCE_BITS = 12  # K at most: an importance weight is an integer in [1, 2^K]
# Elements torch's measure (`stacked_errors`) takes at once (every candidate's copy of a piece), by device
# type: on the CPU the scratch (f32 and f64, 3 MiB) stays in cache, and larger slabs ran up to 3x slower on
# 4096 x 4096 (bench/search.py); a GPU takes larger slabs in fewer launches (8 Mi elements, 96 MiB).
STACKED_ELEMENTS = {"cpu": 1 << 18, "cuda": 1 << 23}


def error_bits(block_elements: int, weight_bits: int = 0) -> int:
    """J for blocks of n = `block_elements` whose terms are weighed by integers of at most 2^K, K =
    `weight_bits` (`importance_bits`; 0 unweighted): |d| stays below the block's amax < 2^(e + 1), so
    each term is at most 2^(2J + 2 + K) and a block's sum below 2^(bit_length(n) + 2J + 2 + K) <= 2^53,
    exact in an int64 and in a float64 alike."""
    return min(ERROR_BITS, (51 - weight_bits - max(block_elements, 1).bit_length()) // 2)


def importance_bits(block_elements: int) -> int:
    """K for blocks of `block_elements`: a third of the 51 - bit_length(n) bits that a block's terms share
    (`error_bits`), at most IMPORTANCE_BITS, so the errors keep the rest. Blocks of 16 to 4096 elements
    take K = 12, J = 17 to 13 (20 to 19 unweighted); a per-tensor scheme over 2^24 elements K = 8, J = 9
    (13 unweighted)."""
    return min(IMPORTANCE_BITS, (51 - max(block_elements, 1).bit_length()) // 3)


def importance_weights(importance: torch.Tensor, shape: tuple[int, ...], bits: int, name: str = "tensor"
                       ) -> torch.Tensor | None:
    """Integer weights in [1, 2^`bits`] from `importance` (finite, >= 0, broadcastable to `shape`): each
    value over the largest, times 2^bits, rounded to nearest (ties to even), at least 1; the largest
    weighs exactly 2^bits. Computed once, in float64 on the host, so every device weighs alike; float64
    of `shape`'s rank. None where all are equal (or all zero): weights alike scale every error alike, and
    the unweighted search, finer by its larger J, then picks its own bytes."""
    try:
        fits = importance.dim() <= len(shape) and torch.broadcast_shapes(importance.shape, shape) == tuple(shape)
    except RuntimeError:
        fits = False
    if not fits:
        raise InputError(f"the importance of tensor {name!r} has shape {list(importance.shape)}, which does not "
                         f"broadcast to the tensor's {list(shape)}",
                         hint="give one weight per input channel: the source tensor's last axis (the written "
                              "tensor's first, where it is transposed)")
    values = _checked_importance(importance, name)
    if values.numel() == 0 or not bool(values.max() > 0):
        return None
    weights = _integer_weights(values, values.max(), bits)
    if bool((weights == weights.max()).all()):
        return None
    return weights.reshape((1,) * (len(shape) - weights.dim()) + tuple(weights.shape))


def group_weights(importance: torch.Tensor, group: int, bits: int, name: str = "tensor"
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """`importance_weights` of each run of `group` values of the 1-D `importance` (the last run shorter) at
    once: float64 weights like `importance`, each run's relative to its own largest, and per run whether
    it weighs at all (a run of equal weights, or of zeros, does not: its weights are all 1 here)."""
    values = _checked_importance(importance, name)
    runs = torch.nn.functional.pad(values, (0, -values.numel() % group)).view(-1, group)
    largest = runs.amax(dim=1, keepdim=True)
    weights = _integer_weights(runs, largest.clamp_min(torch.finfo(torch.float64).tiny), bits)
    live = torch.arange(runs.numel()).view(runs.shape) < values.numel()
    heaviest = torch.where(live, weights, 0).amax(dim=1, keepdim=True)
    weighed = (largest > 0) & ((weights != heaviest) & live).any(dim=1, keepdim=True)
    return torch.where(weighed, weights, 1.0).reshape(-1)[: values.numel()], weighed.reshape(-1)


def _checked_importance(importance: torch.Tensor, name: str) -> torch.Tensor:
    """`importance` as float64 on the host, refused unless finite and >= 0."""
    values = importance.detach().to(device="cpu", dtype=torch.float64)
    if not bool((torch.isfinite(values) & (values >= 0)).all()):
        raise InputError(f"the importance of tensor {name!r} holds negative or non-finite values",
                         hint="an importance is a mean squared activation: finite and >= 0; compute it again")
    return values


def _integer_weights(values: torch.Tensor, largest: torch.Tensor, bits: int) -> torch.Tensor:
    """Each value over the largest, times 2^bits, rounded to nearest (ties to even), at least 1."""
    return (values / largest * 2.0**bits).round_().clamp_(1, 2**bits)


def candidates(alpha: torch.Tensor, scheme: QuantScheme, peak: torch.Tensor | None = None) -> Scales:
    """Every candidate's stored and effective scales for the blocks' amax `alpha` (grid-shaped f32), stacked
    on a new first axis in the order above; `peak` is the whole tensor's largest amax when `alpha` covers
    rows of it (`scales_from_alpha`). Each is computed element-wise as it would be alone: stacking them
    lets a search take them all in a few passes."""
    first = scales_from_alpha(alpha, scheme, peak)
    value, dtype = scheme.value, scheme.scale_dtype()
    a, b = value.range()
    clips = torch.tensor(CLIPS, dtype=torch.float32, device=alpha.device).reshape(-1, *(1,) * alpha.dim())
    tried = [divided(alpha, value.half_range()) * clips]
    if -a != b:  # both ends exactly, and (where the dtype has a sign) a positive amax on the longer end a
        tried += [divided(alpha, b)[None], divided(alpha, -a)[None]]
        if dtype.traits.signed:
            toward_a = divided(alpha, a)
            tried += [toward_a[None], toward_a * clips]
    slabs = [first.stored[None]]
    for part in torch.cat(tried).split(slab_size(alpha)):  # in slabs, as `Search.add` measures them
        relative = part if first.global_scale is None else divided(part, first.global_scale)
        rounded = nearest(relative.abs(), dtype)
        slabs.append(torch.where(rounded > 0, rounded.copysign(relative), first.stored))  # zero: MinMax's scale
    stored = torch.cat(slabs)
    if first.global_scale is None:
        return Scales(stored, stored, None)
    return Scales(stored, torch.cat([first.effective[None], first.global_scale * stored[1:]]), first.global_scale)


def candidate_count(scheme: QuantScheme) -> int:
    """How many candidates `candidates` stacks for `scheme`: MinMax's, the clips, and for a range with
    unequal ends both ends and (on a signed scale dtype) the negative scale with its clips."""
    a, b = scheme.value.range()
    count = 1 + len(CLIPS)
    if -a != b:
        count += 2 + (1 + len(CLIPS) if scheme.scale_dtype().traits.signed else 0)
    return count


def slab_size(piece: torch.Tensor, count: int | None = None) -> int:
    """How many copies of `piece` (at most `count`) fit `STACKED_ELEMENTS` on its device; at least one."""
    room = STACKED_ELEMENTS.get(piece.device.type, STACKED_ELEMENTS["cpu"])
    slab = max(1, room // max(piece.numel(), 1))
    return slab if count is None else min(count, slab)


def fixed_point_unit(alpha: torch.Tensor, bits: int) -> torch.Tensor:
    """2^(J - e) per block (grid-shaped f32), e = floor(log2 amax) read off the f32 exponent bits; the
    power is clamped to a normal f32 (an all-zero block errs by zero under any unit)."""
    exponent = (alpha.view(torch.int32) >> 23) - 127
    field = (127 + bits - exponent).clamp_(1, 254)
    return (field << 23).view(torch.float32)


def check_importance(importance: torch.Tensor | None, calibration: Calibration) -> None:
    """`UsageError` for an importance under a calibration other than Mse, which alone searches."""
    if importance is not None and calibration is not Calibration.Mse:
        raise UsageError(f"an importance weighs the scale search of Mse only, not {calibration.value}",
                         hint="quantize with --calibration mse, or without the importance")


def block_errors(blocks: torch.Tensor, effective: torch.Tensor, unit: torch.Tensor, grid: BlockGrid,
                 value: QuantValue, work: torch.Tensor, wide: torch.Tensor, weights: torch.Tensor | None = None
                 ) -> torch.Tensor:
    """Σ w * RN((x - q * s) * unit)^2 per block, for `blocks` (`to_blocks` of f32 x) at the grid-shaped
    scales `effective`, as float64 integers, w each element's integer weight (`weights`, f64 broadcasting
    over `blocks`; 1 where None): each term and partial sum is an integer below 2^53 (`error_bits`), so
    the sum is exact. `work` (f32) and `wide` (f64), shaped like `blocks`, are scratch. The torch
    reference of the compiled loops (`search_loop` on the CPU, the Triton kernel on CUDA)."""
    scales = per_block(effective, grid)
    if value.is_minifloat():
        x = from_blocks(blocks, grid)
        work.copy_(to_blocks(dequantize(to_fields(x, effective, grid, value), effective, grid, value), grid))
    else:  # to_fields' arithmetic on the block view, without its int8 round trip
        torch.div(blocks, scales, out=work)
        if not bool(effective.all()):
            torch.where(blocks == 0, blocks, work, out=work)
        work.clamp_(*value.range()).round_().mul_(scales)
    torch.sub(blocks, work, out=work).mul_(per_block(unit, grid)).round_()
    wide.copy_(work)
    wide.mul_(wide)
    if weights is not None:
        wide.mul_(weights)
    return wide.sum(dim=grid.block_axes)


def stacked_errors(blocks: torch.Tensor, grid: BlockGrid, effective: torch.Tensor, unit: torch.Tensor,
                   value: QuantValue, weights: torch.Tensor | None = None) -> torch.Tensor:
    """Every candidate's `block_errors` (float64 [candidates, *grid.grid]) for `blocks` (`to_blocks` of a
    piece on `grid`) under `effective` ([candidates, *grid.grid]), measured by torch as many candidates at
    a time as keep the scratch within `STACKED_ELEMENTS`; `weights` as `block_errors`' (over `blocks`)."""
    count = effective.shape[0]
    slab = slab_size(blocks, count)
    work = torch.empty((slab, *blocks.shape), dtype=torch.float32, device=blocks.device)
    wide = torch.empty(work.shape, dtype=torch.float64, device=blocks.device)
    errors = []
    for k in range(0, count, slab):
        n = min(slab, count - k)
        stacked = BlockGrid((n, *grid.shape), (1, *grid.block), (n, *grid.grid))  # candidates on axis 0
        errors.append(block_errors(blocks[None].expand(n, *blocks.shape), effective[k : k + n],
                                   unit[None].expand(n, *unit.shape), stacked, value, work[:n], wide[:n],
                                   None if weights is None else weights[None]))
    return torch.cat(errors)


def measured_errors(piece: torch.Tensor, grid: BlockGrid, effective: torch.Tensor, unit: torch.Tensor,
                    value: QuantValue, weights: torch.Tensor | None = None) -> torch.Tensor:
    """`stacked_errors` of the f32 `piece` (of `grid.shape`): by the compiled loop on the CPU (`search_loop`,
    where it was built), else by torch's passes; both sum the same integers. (On CUDA, the kernels search
    a whole tensor's blocks in their fused kernel: `qcli.kernels.launch.searches_in_kernel`.)"""
    if piece.device.type == "cpu" and search_loop.BUILT:
        return search_loop.errors(piece, grid, effective, unit, value, weights)
    blocks = to_blocks(piece, grid)
    return stacked_errors(blocks, grid, effective, unit, value,
                          None if weights is None else broadcast_to_blocks(weights, grid))


def first_least(errors: torch.Tensor) -> torch.Tensor:
    """The index along axis 0 of each least error, the first of equal ones."""
    return (errors == errors.amin(dim=0)).to(torch.int32).argmax(dim=0)


class Search:
    """The search over one tensor of `shape` whose blocks' amax is `alpha`, fed its rows in whole blocks
    (`add`, any order; a per-tensor scheme's one block sums over all of them) until `scales` picks.

    `importance` (float, broadcastable to `shape`: per input channel, [in] for a Linear's [out, in] weight,
    [in, 1] for it transposed) weighs each element's error (`importance_weights`); `name` is the tensor's,
    for the errors it raises. A block scheme's candidates are worked out a piece at a time, for its rows,
    so the memory they take follows the piece, not the tensor."""

    def __init__(self, alpha: torch.Tensor, scheme: QuantScheme, shape: tuple[int, ...],
                 peak: torch.Tensor | None = None, *, importance: torch.Tensor | None = None,
                 name: str = "tensor") -> None:
        if scheme.is_two_level() and peak is None:  # the global is the whole tensor's, in every piece
            peak = alpha.amax() if alpha.numel() else alpha.new_zeros(())
        self.scheme, self.alpha, self.peak = scheme, alpha, peak
        elements = math.prod(BlockGrid.of(scheme, shape).block)
        bits = importance_bits(elements)
        weights = None if importance is None else importance_weights(importance, tuple(shape), bits, name)
        self.weights = None if weights is None else weights.to(alpha.device)
        self.unit = fixed_point_unit(alpha, error_bits(elements, 0 if weights is None else bits))
        self.per_tensor = scheme.block is None
        if self.per_tensor:  # one block: its candidates once, their errors summed over every piece
            self.found = candidates(alpha, scheme, peak)
            self.totals = torch.zeros(self.found.stored.shape[0], dtype=torch.float64, device=alpha.device)
        else:
            global_scale = float(global_of(peak, scheme)) if peak is not None and scheme.is_two_level() else None
            self.chosen = Scales(torch.empty_like(alpha), torch.empty_like(alpha), global_scale)

    def add(self, piece: torch.Tensor, grid_rows: slice, first_row: int = 0) -> None:
        """f32 rows of the tensor in whole blocks, covering `grid_rows` of its block grid, from its row
        `first_row` (which only an importance along the first axis reads)."""
        grid = BlockGrid.of(self.scheme, piece.shape)
        rows = slice(None) if self.per_tensor else grid_rows
        weights = self.weights
        if weights is not None and weights.shape[0] != 1:
            weights = weights[first_row : first_row + grid.shape[0]]
        if self.per_tensor:
            errors = measured_errors(piece, grid, self.found.effective, self.unit, self.scheme.value, weights)
            self.totals += errors.reshape(errors.shape[0], -1).sum(dim=1)
            return
        if piece.device.type == "cpu" and search_loop.BUILT:
            stored, effective = search_loop.choose(piece, grid, self.alpha[rows], self.unit[rows], self.scheme, CLIPS,
                                                   self.chosen.global_scale, weights)
        else:
            found = candidates(self.alpha[rows], self.scheme, self.peak)
            errors = measured_errors(piece, grid, found.effective, self.unit[rows], self.scheme.value, weights)
            taken = first_least(errors)[None]
            stored, effective = found.stored.gather(0, taken)[0], found.effective.gather(0, taken)[0]
        self.chosen.stored[rows] = stored
        self.chosen.effective[rows] = effective

    def scales(self) -> Scales:
        """Each block's candidate of least error."""
        if self.per_tensor:
            taken = int(first_least(self.totals))  # the first of equal minima
            return Scales(self.found.stored[taken], self.found.effective[taken], self.found.global_scale)
        return self.chosen


def search_scales(pieces: Iterable[tuple[torch.Tensor, slice, int]], alpha: torch.Tensor, scheme: QuantScheme,
                  shape: tuple[int, ...], *, importance: torch.Tensor | None = None, name: str = "tensor"
                  ) -> Scales:
    """The searched scales of a whole tensor, from its `pieces` (`Search.add`'s arguments), each element's
    error weighed by `importance` (`Search`)."""
    search = Search(alpha, scheme, shape, importance=importance, name=name)
    for piece in pieces:
        search.add(*piece)
    return search.scales()
