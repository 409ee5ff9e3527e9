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

from qcli.codec.blocks import broadcast_to_blocks, from_blocks, per_block, to_blocks
from qcli.codec.scales import Scales, divided, nearest, scales_from_alpha
from qcli.codec.values import dequantize, to_fields
from qcli.errors import InputError, UsageError
from qcli.layout import BlockGrid
from qcli.scheme import Calibration, QuantScheme, QuantValue

# Clip factors k/32: exact in f32, so `c * raw` rounds once, the same in every implementation.
CLIPS = tuple((32 - k) / 32 for k in range(1, 10))  # 31/32 down to 23/32 (0.72)
ERROR_BITS = 20  # J at most: the fixed-point bits of |d| / 2^e
IMPORTANCE_BITS = 12  # K at most: an importance weight is an integer in [1, 2^K]
# Elements `Search.add` measures at once (every candidate's copy of a piece), by device type: on the CPU
# the scratch (f32 and f64, 3 MiB) stays in cache, and larger slabs ran up to 3x slower on 4096 x 4096
# (bench/search.py); a GPU takes larger slabs in fewer launches (8 Mi elements, 96 MiB of scratch).
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
    values = importance.detach().to(device="cpu", dtype=torch.float64)
    if not bool((torch.isfinite(values) & (values >= 0)).all()):
        raise InputError(f"the importance of tensor {name!r} holds negative or non-finite values",
                         hint="an importance is a mean squared activation: finite and >= 0; compute it again")
    if values.numel() == 0 or not bool(values.max() > 0):
        return None
    weights = (values / values.max() * 2.0**bits).round_().clamp_(1, 2**bits)
    if bool((weights == weights.max()).all()):
        return None
    return weights.reshape((1,) * (len(shape) - weights.dim()) + tuple(weights.shape))


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
    stored = [first.stored[None]]
    for part in torch.cat(tried).split(slab_size(alpha)):  # in slabs, as `Search.add` measures them
        relative = part if first.global_scale is None else divided(part, first.global_scale)
        rounded = nearest(relative.abs(), dtype)
        stored.append(torch.where(rounded > 0, rounded.copysign(relative), first.stored))  # zero: MinMax's scale
    stored = torch.cat(stored)
    if first.global_scale is None:
        return Scales(stored, stored, None)
    return Scales(stored, torch.cat([first.effective[None], first.global_scale * stored[1:]]), first.global_scale)


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
    the sum is exact. `work` (f32) and `wide` (f64), shaped like `blocks`, are scratch."""
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


class Search:
    """The search over one tensor of `shape` whose blocks' amax is `alpha`, fed its rows in whole blocks
    (`add`, any order; a per-tensor scheme's one block sums over all of them) until `scales` picks.

    `importance` (float, broadcastable to `shape`: per input channel, [in] for a Linear's [out, in] weight,
    [in, 1] for it transposed) weighs each element's error (`importance_weights`); `name` is the tensor's,
    for the errors it raises."""

    def __init__(self, alpha: torch.Tensor, scheme: QuantScheme, shape: tuple[int, ...],
                 peak: torch.Tensor | None = None, *, importance: torch.Tensor | None = None,
                 name: str = "tensor") -> None:
        self.scheme, self.found = scheme, candidates(alpha, scheme, peak)
        elements = math.prod(BlockGrid.of(scheme, shape).block)
        bits = importance_bits(elements)
        weights = None if importance is None else importance_weights(importance, tuple(shape), bits, name)
        self.weights = None if weights is None else weights.to(alpha.device)
        self.unit = fixed_point_unit(alpha, error_bits(elements, 0 if weights is None else bits))
        self.per_tensor = scheme.block is None
        self.least = torch.full(alpha.shape, math.inf, dtype=torch.float64, device=alpha.device)
        self.totals = torch.zeros(self.found.stored.shape[0], dtype=torch.float64, device=alpha.device)
        self.choice = torch.zeros(alpha.shape, dtype=torch.int64, device=alpha.device)

    def add(self, piece: torch.Tensor, grid_rows: slice, first_row: int = 0) -> None:
        """f32 rows of the tensor in whole blocks, covering `grid_rows` of its block grid, from its row
        `first_row` (which only an importance along the first axis reads). The candidates are measured
        together, as many at a time as keep the scratch within `STACKED_ELEMENTS`: a small piece (one of
        GPTQ's groups) then takes a few passes in all rather than a few for each candidate."""
        grid = BlockGrid.of(self.scheme, piece.shape)
        rows = slice(None) if self.per_tensor else grid_rows
        blocks = to_blocks(piece, grid)
        weights = self.weights
        if weights is not None:
            if weights.shape[0] != 1:
                weights = weights[first_row : first_row + grid.shape[0]]
            weights = broadcast_to_blocks(weights, grid)[None]
        count = self.found.stored.shape[0]
        slab = slab_size(blocks, count)
        work = torch.empty((slab, *blocks.shape), dtype=torch.float32, device=blocks.device)
        wide = torch.empty(work.shape, dtype=torch.float64, device=blocks.device)
        unit, least, choice = self.unit[rows], self.least[rows], self.choice[rows]
        for k in range(0, count, slab):
            n = min(slab, count - k)
            stacked = BlockGrid((n, *grid.shape), (1, *grid.block), (n, *grid.grid))  # candidates on axis 0
            errors = block_errors(blocks[None].expand(n, *blocks.shape), self.found.effective[k : k + n, rows],
                                  unit[None].expand(n, *unit.shape), stacked, self.scheme.value, work[:n],
                                  wide[:n], weights)
            if self.per_tensor:
                self.totals[k : k + n] += errors.reshape(n, -1).sum(dim=1)
                continue
            best = errors.amin(dim=0)
            earliest = (errors == best).to(torch.int32).argmax(dim=0)  # of equal errors the first candidate
            better = best < least  # strictly: a tie keeps the earlier slab's
            least.copy_(torch.where(better, best, least))
            choice.copy_(torch.where(better, earliest + k, choice))

    def scales(self) -> Scales:
        """Each block's candidate of least error."""
        if self.per_tensor:
            self.choice.fill_(int(self.totals.argmin()))  # the first of equal minima
        taken = self.choice[None]
        return Scales(self.found.stored.gather(0, taken)[0], self.found.effective.gather(0, taken)[0],
                      self.found.global_scale)


def search_scales(pieces: Iterable[tuple[torch.Tensor, slice, int]], alpha: torch.Tensor, scheme: QuantScheme,
                  shape: tuple[int, ...], *, importance: torch.Tensor | None = None, name: str = "tensor"
                  ) -> Scales:
    """The searched scales of a whole tensor, from its `pieces` (`Search.add`'s arguments), each element's
    error weighed by `importance` (`Search`)."""
    search = Search(alpha, scheme, shape, importance=importance, name=name)
    for piece in pieces:
        search.add(*piece)
    return search.scales()
