"""GPTQ (Frantar et al. 2022): a Linear's weight quantized one input column at a time, each column's rounding
error spread over the columns not yet quantized, so that the layer's output on calibration tokens errs
least rather than its weights.

For a weight W [out, in] (as a Hugging Face Linear holds it) and H = Σ x xᵀ over the calibration tokens
(`Hessian`, float64; GPTQ does not change when H is scaled, so the sum serves as the reference
implementations' mean 2/n Σ x xᵀ does):

1. Dead inputs: where H_jj = 0 (input j is zero on every token), H_jj is set to 1 and column j of W to 0.
2. Dampening: `damp · mean(diag H)` is added to H's diagonal (damp 1 % by default).
3. U, the upper Cholesky factor of H⁻¹ (H = L Lᵀ, H⁻¹ from L, H⁻¹ = Uᵀ U), all in float64. Where a
   factorization fails (not positive definite), the dampening is raised to each of DAMP_RETRIES (1 %,
   10 %, 100 %) above the one asked for in turn, then `InputError`.
4. The columns j = 0 … in-1 in order, in lazy blocks [i1, i2) of `block_size`: column j is quantized
   to q_j, its error e_j = (w_j - q_j) / U_jj, and w_k -= e_j U_jk for every later column k: at once for
   the columns of its lazy block, for those after it in one matmul when the lazy block ends
   (W[:, i2:] -= E U[i1:i2, i2:], E the lazy block's errors), which exact arithmetic does not tell apart.

Scales. The scheme's Burn blocks tile the tensor as written, W or (`transpose`) Wᵀ; seen on W a block is
r output rows by c input columns (block [32]: 1 x 32, or 32 x 1 when Wᵀ is written; [a, b]: a x b, or
b x a; per tensor: all of W). The scales of the blocks of columns [j, j + c), j a multiple of c, are fixed
when the loop reaches column j, from those columns' current weights: W with the errors of every column
before j spread (the pending updates of the lazy block applied to a copy of the columns past its end).
MinMax takes each block's amax to the codec's `scales_from_alpha`; `search` has the codec's Mse search
(qcli.codec.search) choose each block's scale over the same current weights, each column's error weighed
by `importance` where given (its input's mean square, diag H / tokens: the error the block's scale leaves
in a column reaches the output in proportion to it). A two-level scheme's
global is fixed once, as the codec fixes it, from the peak |W| of the original weight, and every block's
stored scale is relative to it (a block the updates grow past that peak gets the scale dtype's largest
scale, and its largest values clamp). A per-tensor scale is thus fixed at column 0 from all of W, dead columns
zeroed. (The reference code measures a group on the weights as they stood when its lazy block began.)

Values. q_j is the codec's: `to_fields` with each element's effective scale, then `dequantize`, the field
times the scale in f32, so that the packed fields and scales decode to exactly the q the loop spread
the error of.

Precision. H, its factorizations and inverse are float64: H = XᵀX has the square of X's condition number,
and in f32 the factorization of a correlated layer's H fails or loses the directions of small eigenvalue
the error spreading rests on; it is O(in³) once per tensor. U is then rounded to f32 and the weight updates
are f32, as the reference implementations': their rounding is far below a quantization step, and f32
matmuls run at full speed on any device (at torch's default full-f32 precision: with TF32 allowed, as the
reference code makes sure it is not, the updates would round to 10 mantissa bits). Every step is a torch
operation on the tensors' own device, so the same inputs give the same bytes on the same device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from qcli import layout
from qcli.codec.quantize import QuantizedParts
from qcli.codec.scales import Scales, block_reduce, global_of, scales_from_alpha
from qcli.codec.search import Search
from qcli.codec.values import dequantize, to_fields
from qcli.errors import InputError, NonFiniteTensor
from qcli.scheme import Calibration, QuantScheme, check_accepted

# Dampening fractions of mean(diag H) tried, those above the one asked for, where a factorization fails.
DAMP_RETRIES = (0.01, 0.1, 1.0)


class Hessian:
    """Σ x xᵀ over the calibration tokens of one Linear's input (`matrix`, float64 [in, in]) and how many
    tokens (`tokens`), accumulated a batch at a time on `device`."""

    def __init__(self, columns: int, device: torch.device | str | None = None) -> None:
        self.matrix = torch.zeros(columns, columns, dtype=torch.float64, device=device)
        self.tokens = 0

    def add(self, x: torch.Tensor) -> None:
        """One batch of activations `x` [..., in], every leading axis a token."""
        rows = x.detach().reshape(-1, self.matrix.shape[0]).to(self.matrix.device, torch.float64)
        self.matrix.addmm_(rows.T, rows)
        self.tokens += rows.shape[0]


@dataclass(frozen=True)
class GptqResult:
    """`parts`: fields and scales of the tensor as written (Wᵀ with `transpose`), for
    `qcli.codec.quantize.pack(parts, scheme, written_shape)`. `dequantized`: f32 [out, in], what Burn
    decodes, bit for bit. `error`: `output_error` of it. `damp`: the dampening fraction the factorization
    took (the one asked for, or a retry's)."""

    parts: QuantizedParts
    dequantized: torch.Tensor
    error: float
    damp: float


def gptq(weight: torch.Tensor, hessian: torch.Tensor, scheme: QuantScheme, *, transpose: bool = False,
         search: bool = False, importance: torch.Tensor | None = None, damp: float = 0.01, block_size: int = 128,
         name: str = "tensor") -> GptqResult:
    """GPTQ of `weight` (f32 [out, in]) under `scheme`, for the calibration tokens' `hessian` (float64
    [in, in], `Hessian.matrix`); the tensor written is `weight.T` with `transpose`; `importance` ([in])
    weighs the columns in the `search` for each block's scale. The module's docstring
    states the algorithm. Refuses schemes Burn refuses, non-finite weights and a Hessian that no dampening
    makes positive definite."""
    check_accepted(scheme, Calibration.Mse if search else Calibration.MinMax)
    if weight.dim() != 2 or hessian.shape != (weight.shape[1], weight.shape[1]):
        raise ValueError(f"GPTQ needs a weight [out, in] and a Hessian [in, in], got {list(weight.shape)} and "
                         f"{list(hessian.shape)}")
    original = weight.detach().to(torch.float32)
    if not bool(torch.isfinite(original).all()):
        raise NonFiniteTensor(name, weight.dtype == torch.float64 and bool(torch.isfinite(weight).all()))
    h = hessian.detach().to(original.device, torch.float64, copy=True)
    if not bool(torch.isfinite(h).all()):
        raise InputError(f"the calibration Hessian of {name!r} holds NaN or Inf values",
                         hint="the calibration activations overflowed or hold NaN; check the calibration data")
    w = original.clone()
    dead = torch.diagonal(h) == 0
    h.diagonal()[dead] = 1.0
    w[:, dead] = 0.0
    u, used = _inverse_factor(h, damp, name)
    fields, dequantized, stored, global_scale = _columns(w, u.to(torch.float32), scheme, transpose, search,
                                                        original.abs().amax(), block_size, importance)
    written_shape = tuple(reversed(w.shape)) if transpose else tuple(w.shape)
    scales = _as_written(stored, transpose).reshape(layout.params_shape(scheme, written_shape))
    parts = QuantizedParts(_as_written(fields, transpose), scales, global_scale)
    return GptqResult(parts, dequantized, output_error(original, dequantized, hessian), used)


def workspace_bytes(out_features: int, in_features: int) -> int:
    """Device bytes `gptq` holds at most beside its inputs: the Hessian's copy, its dampened copy, its
    Cholesky factor and inverse (float64 [in, in] each), and the weight's working copy, original, fields and
    decode (4 bytes each, [out, in])."""
    return 4 * in_features**2 * 8 + 4 * out_features * in_features * 4


def output_error(weight: torch.Tensor, dequantized: torch.Tensor, hessian: torch.Tensor) -> float:
    """The relative error ||X Wᵀ - X Ŵᵀ|| / ||X Wᵀ|| (Frobenius, over the calibration tokens X whose
    Σ x xᵀ is `hessian`) = sqrt(tr(ΔW H ΔWᵀ) / tr(W H Wᵀ)), in float64; 0 where nothing errs."""
    h = hessian.to(torch.float64)
    w = weight.to(h.device, torch.float64)
    delta = w - dequantized.to(h.device, torch.float64)
    erred = float(((delta @ h) * delta).sum())
    if erred == 0:
        return 0.0
    total = float(((w @ h) * w).sum())
    return math.sqrt(erred / total) if total > 0 else math.inf


def _as_written(t: torch.Tensor, transpose: bool) -> torch.Tensor:
    """A tensor (or block grid) on W's axes [out, in], on the written tensor's."""
    return t.T.contiguous() if transpose else t


def _inverse_factor(h: torch.Tensor, damp: float, name: str) -> tuple[torch.Tensor, float]:
    """U, the upper Cholesky factor of (H + λI)⁻¹ with λ = fraction · mean(diag H), and the fraction: `damp`,
    else the first of DAMP_RETRIES above it whose factorizations succeed."""
    mean = torch.diagonal(h).mean()
    for fraction in (damp, *(f for f in DAMP_RETRIES if f > damp)):
        damped = h.clone()
        damped.diagonal().add_(fraction * mean)
        lower, info = torch.linalg.cholesky_ex(damped)
        if int(info) == 0:
            u, info = torch.linalg.cholesky_ex(torch.cholesky_inverse(lower), upper=True)
            if int(info) == 0:
                return u, fraction
    raise InputError(
        f"the calibration Hessian of {name!r} is not positive definite, even dampened by "
        f"{max(damp, *DAMP_RETRIES):g} x its mean diagonal",
        hint="the Hessian must be a sum of x xᵀ over calibration tokens; check the calibration data",
    )


def _columns(w: torch.Tensor, u: torch.Tensor, scheme: QuantScheme, transpose: bool, search: bool,
             peak: torch.Tensor, block_size: int, importance: torch.Tensor | None = None
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float | None]:
    """The column loop (step 4) over `w` (f32 [out, in], updated in place) with the f32 factor `u`: the
    int32 fields and f32 dequantized values [out, in], the stored scales on W's block grid [rows, columns]
    and the global scale."""
    out, columns = w.shape
    if w.is_cuda:
        from qcli.kernels import gptq as kernel

        if kernel.takes(scheme, (out, columns), transpose, block_size):
            return columns_in_kernel(w, u, scheme, search, peak, block_size, importance)
    block = layout.BlockGrid.of(scheme, (columns, out) if transpose else (out, columns)).block
    r, c = tuple(reversed(block)) if transpose else block
    fields = torch.empty(w.shape, dtype=torch.int32, device=w.device)
    dequantized = torch.empty_like(w)
    stored = torch.empty(math.ceil(out / r), math.ceil(columns / c), dtype=torch.float32, device=w.device)
    element = layout.BlockGrid((out,), (1,), (out,))  # one column, each element with its own scale
    # each column's importance on the axis that runs along W's columns in the tensor as written
    along = importance if importance is None or not transpose else importance[:, None]
    global_scale = None
    for i1 in range(0, columns, block_size):
        i2 = min(i1 + block_size, columns)
        w1 = w[:, i1:i2].clone()
        errors = torch.zeros_like(w1)
        u1 = u[i1:i2, i1:i2]
        for i in range(i2 - i1):
            j = i1 + i
            if j % c == 0:
                stop = min(j + c, columns)
                beyond = w[:, i2:stop] - errors[:, :i] @ u[i1:j, i2:stop]  # empty unless the group outruns i2
                current = torch.cat([w1[:, i : stop - i1], beyond], dim=1)
                scales = _group_scales(current.T if transpose else current, scheme, search, peak,
                                       None if along is None else along[j:stop])
                stored[:, j // c] = scales.stored.reshape(-1)
                global_scale = scales.global_scale
                effective = scales.effective.reshape(-1).repeat_interleave(r)[:out]
                zero_scale = not bool(effective.all())
            column = w1[:, i]
            f = to_fields(column, effective, element, scheme.value, zero_scale=zero_scale)
            q = dequantize(f, effective, element, scheme.value)
            fields[:, j], dequantized[:, j] = f, q
            e = (column - q) / u1[i, i]
            w1[:, i:].addr_(e, u1[i, i:], alpha=-1)
            errors[:, i] = e
        w[:, i2:] -= errors @ u[i1:i2, i2:]
    return fields, dequantized, stored, global_scale


def columns_in_kernel(w: torch.Tensor, u: torch.Tensor, scheme: QuantScheme, search: bool, peak: torch.Tensor,
                      block_size: int, importance: torch.Tensor | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float | None]:
    """`_columns` with each lazy block's column loop in one Triton kernel (`qcli.kernels.gptq`; blocks [1, c]
    of W that tile the lazy blocks, W as written): the same steps, each column's update of the columns
    after it a product and a difference rounded apart, where the torch loop's `addr_` may fuse them."""
    from qcli.kernels import gptq as kernel

    out, columns = w.shape
    c = layout.BlockGrid.of(scheme, (out, columns)).block[1]
    u = u.contiguous()  # the kernel reads U's rows: the Cholesky factor comes column-major
    fields = torch.empty(w.shape, dtype=torch.int32, device=w.device)
    dequantized = torch.empty_like(w)
    stored = torch.empty(out, math.ceil(columns / c), dtype=torch.float32, device=w.device)
    errors = torch.empty(out, block_size, dtype=torch.float32, device=w.device)
    glob = global_of(peak, scheme) if scheme.is_two_level() else None  # fixed from the original weight's peak
    weights = None
    if search and importance is not None:
        weights = kernel.column_weights(importance, scheme, (out, columns), w.device)
    for i1 in range(0, columns, block_size):
        i2 = min(i1 + block_size, columns)
        kernel.lazy_block(w[:, i1:i2], u[i1:i2, i1:i2], fields[:, i1:i2], dequantized[:, i1:i2], errors,
                          stored[:, i1 // c :], scheme, search, glob,
                          None if weights is None else (weights[0][i1:i2], weights[1][i1 // c :]))
        w[:, i2:] -= errors[:, : i2 - i1] @ u[i1:i2, i2:]
    return fields, dequantized, stored, None if glob is None else float(glob)


def _group_scales(current: torch.Tensor, scheme: QuantScheme, search: bool, peak: torch.Tensor,
                  importance: torch.Tensor | None = None) -> Scales:
    """The scales of the blocks of `current`, one group of columns of W as written (so its blocks are
    the written tensor's), by MinMax or the Mse search; `peak`, the original weight's largest |w|, fixes
    a two-level scheme's global."""
    current = current.contiguous()
    grid = layout.BlockGrid.of(scheme, current.shape)
    alpha = block_reduce(current, grid, Calibration.MinMax)
    if not search:
        return scales_from_alpha(alpha, scheme, peak)
    chosen = Search(alpha, scheme, tuple(current.shape), peak, importance=importance)
    chosen.add(current, slice(0, grid.grid[0]))
    return chosen.scales()
