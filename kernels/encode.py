"""Launch wrappers: check the arguments, allocate, and run the Triton kernels for one scheme.

`encode` returns the same bytes as `qcli.codec.encode` (docs/arithmetic.md). `enqueue` is its
asynchronous core for the pipeline: it writes the payload into a given buffer on the current stream and
raises a flag instead of an error, so no launch waits for the device. Tensors too large for the device
are encoded in row chunks: `tensor_range` accumulates, over all chunks, what the scales of a per-tensor or
two-level scheme depend on, and `enqueue(..., whole=...)` then encodes each chunk with it.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch
import triton

from qcli import layout
from qcli.errors import NonFiniteTensor, NotFloatTensor, NotKernelFloat, UsageError
from qcli.kernels import _quantize as K
from qcli.scheme import Calibration, Native, PackedU32, QuantScheme, QuantValue, ScaleDtype, check_accepted

_KIND = {ScaleDtype.F32: 0, ScaleDtype.F16: 1, ScaleDtype.BF16: 2, ScaleDtype.UE4M3: 3, ScaleDtype.UE8M0: 4}
# Scale dtypes whose every value lies in [2^-125, 2^125], where the kernels' reciprocal division is exact:
# one-level schemes with these need not rescale their scales into that range (UE8M0, 2^-127 to 2^127, does).
_SAFE_DTYPES = (ScaleDtype.F16, ScaleDtype.UE4M3)
_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_TILE = 4096          # values per program (bench/tune.py: the fastest on an H200 for most schemes)
_WARPS = 2            # warps per program (bench/tune.py, an H200) ...
_WIDE_WARPS = 4       # ... but 4 where a program gathers a scale per value or sums |x| in float64
_TENSOR_CHUNK = 4096  # values per partial range of a per-tensor scheme
# No multiply-add contraction: every product must round on its own, as on the CPU.
_OPTIONS = {"enable_fp_fusion": False}


def interpreted() -> bool:
    """Whether Triton runs kernels in its interpreter (TRITON_INTERPRET=1), on CPU tensors."""
    return os.environ.get("TRITON_INTERPRET") == "1"


@dataclass(frozen=True)
class _Geometry:
    """How a tensor is cut: rows of the last axis, blocks, storage units, and the payload's regions."""

    dims: list[int]       # the shape, [1] for a scalar
    rows: int
    cols: int
    block: list[int]      # block extents on every axis (the whole tensor for a per-tensor scheme)
    grid: list[int]       # blocks per axis
    per_unit: int         # values per stored word or byte
    unit_bytes: int
    value_bytes: int
    scale_offset: int
    global_offset: int

    @staticmethod
    def of(scheme: QuantScheme, shape: tuple[int, ...]) -> _Geometry:
        dims = list(shape) or [1]
        cols = dims[-1]
        rows = math.prod(dims[:-1])
        block = scheme.block.size.to_dim_vec(len(dims)) if scheme.block else dims
        grid = [math.ceil(d / b) for d, b in zip(dims, block, strict=True)]
        per_unit = scheme.num_quants() if not isinstance(scheme.store, Native) else 1
        value_bytes = layout.value_bytes(scheme, shape)
        scale_offset = value_bytes
        unit_bytes = 4 if isinstance(scheme.store, PackedU32) else 1
        return _Geometry(dims, rows, cols, block, grid, per_unit, unit_bytes, value_bytes, scale_offset,
                         scale_offset + layout.scale_bytes(scheme, shape))

    def fused(self, scheme: QuantScheme) -> bool:
        """Whether each program can compute its blocks' scales itself: blocks along the last axis only,
        of a power-of-two width holding whole storage units (a two-level scheme needs its global first)."""
        width = self.block[-1]
        return (scheme.block is not None and all(b == 1 for b in self.block[:-1]) and width & (width - 1) == 0
                and width % self.per_unit == 0)

    def flat(self, width: int) -> tuple[int, int, int]:
        """(rows, values per row, units per row) of the view the kernels take: with no partial block of
        `width` and no row padding, the tensor is one long row."""
        if self.cols % width == 0 and width % self.per_unit == 0:
            n = self.rows * self.cols
            return 1, n, n // self.per_unit
        return self.rows, self.cols, math.ceil(self.cols / self.per_unit)


def _value_constants(value: QuantValue) -> dict:
    lo, hi = value.range()
    fmt = value.traits.minifloat
    ebits, mbits, bias = (fmt.exponent_bits, fmt.mantissa_bits, fmt.bias) if fmt else (0, 0, 0)
    return dict(IS_FLOAT=value.is_minifloat(), BITS=value.size_bits(), LO=lo, HI=hi, EBITS=ebits, MBITS=mbits,
                BIAS=bias)


def _check_tensor(x: torch.Tensor, name: str) -> None:
    if not x.dtype.is_floating_point:
        raise NotFloatTensor(name, x.dtype)
    if x.dtype not in _FLOAT_DTYPES:
        raise NotKernelFloat(name, x.dtype)
    if not x.is_contiguous():
        raise UsageError(f"tensor {name!r} is not contiguous", hint="pass x.contiguous()")
    if x.device.type != "cuda" and not (interpreted() and x.device.type == "cpu"):
        raise UsageError(f"tensor {name!r} is on {x.device}, the Triton kernels need a CUDA tensor",
                         hint="move it with .cuda(), or set TRITON_INTERPRET=1 to run the kernels on the CPU")


@dataclass
class Range:
    """What the scales of a per-tensor or two-level scheme depend on, accumulated over row chunks: the
    largest |x| (or block range, for two levels) as an f32 device tensor, or for a per-tensor AbsMean the
    float64 sum of |x| and the number of values summed."""

    value: torch.Tensor
    count: int

    def add(self, other: Range, calibration: Calibration, scheme: QuantScheme) -> Range:
        if calibration is Calibration.AbsMean and scheme.block is None:
            return Range(self.value + other.value, self.count + other.count)
        return Range(torch.maximum(self.value, other.value), self.count + other.count)

    def alpha(self, calibration: Calibration, scheme: QuantScheme) -> torch.Tensor:
        """The f32 range the scale kernel takes."""
        if calibration is Calibration.AbsMean and scheme.block is None:
            return (self.value / self.count).to(torch.float32)  # float64 division, IEEE on every device
        return self.value


def tensor_range(x: torch.Tensor, scheme: QuantScheme, calibration: Calibration, bad: torch.Tensor
                 ) -> Range:
    """The range of `x` (a tensor or a row chunk of it) that a per-tensor or two-level scheme needs;
    sets `bad[0]` on NaN or inf."""
    geo = _Geometry.of(scheme, tuple(x.shape))
    if scheme.is_two_level():
        if geo.fused(scheme):
            rows, cols, _ = geo.flat(geo.block[-1])
            peak = _row_alpha(x, rows, cols, geo.block[-1], calibration, bad, per_program=True)
        else:
            peak = _block_alpha(x, geo, calibration, bad)
        return Range(peak.amax().reshape(1), x.numel())
    partial = _row_alpha(x, 1, x.numel(), _TENSOR_CHUNK, calibration, bad)
    if calibration is Calibration.AbsMean:
        return Range(partial.sum().reshape(1), x.numel())
    return Range(partial.amax().reshape(1), x.numel())


def enqueue(x: torch.Tensor, scheme: QuantScheme, calibration: Calibration, out: torch.Tensor,
            bad: torch.Tensor, whole: Range | None = None) -> None:
    """Write the payload of `x` into `out` (uint8, 1-D) on the current stream; set `bad[0]` on NaN or inf.

    `whole` is the range of the whole tensor when `x` is one row chunk of it (per-tensor and two-level
    schemes); other schemes need only the chunk, whose blocks must not straddle chunks.
    """
    geo = _Geometry.of(scheme, tuple(x.shape))
    values = out[: geo.value_bytes]
    values = values.view(torch.int32) if geo.unit_bytes == 4 else values
    dtype = scheme.scale_dtype()
    two_level = scheme.is_two_level()
    safe_scales = not two_level and dtype in _SAFE_DTYPES
    const = dict(_value_constants(scheme.value), CAL=_cal(calibration), TWO_LEVEL=two_level,
                 HALF_RANGE=scheme.value.half_range(), KIND=_KIND[dtype], SCALE_SIZE=dtype.scale_size(),
                 DTYPE_MAX=dtype.max_representable(), N=geo.per_unit, SAFE=safe_scales, **_OPTIONS)
    pointers = dict(x_ptr=x, values_ptr=values, scales_ptr=out[geo.scale_offset :],
                    global_ptr=out[geo.global_offset :], s_eff_ptr=out, r_eff_ptr=out,
                    alpha_max_ptr=out, row_base_ptr=out, bad_ptr=bad)  # `out` where a mode reads nothing
    if geo.fused(scheme):
        width = geo.block[-1]
        if two_level:
            pointers["alpha_max_ptr"] = (whole or tensor_range(x, scheme, calibration, bad)).value
        rows, cols, units_per_row = geo.flat(width)
        blocks_per_row = math.ceil(cols / width)
        g = max(1, _TILE // width)
        chunks = triton.cdiv(blocks_per_row, g)
        K._quantize_kernel[(rows * chunks,)](
            **pointers, C=cols, units_per_row=units_per_row, chunks_per_row=chunks,
            blocks_per_row=blocks_per_row, BC=width, G=g, U=width // geo.per_unit, MODE=K.MODE_FUSED.value,
            EVEN=cols % (g * width) == 0, num_warps=_WIDE_WARPS if calibration is Calibration.AbsMean else _WARPS,
            **const)
        return
    n_scales = math.prod(geo.grid)
    s_eff = torch.empty(n_scales, dtype=torch.float32, device=x.device)
    r_eff = torch.empty_like(s_eff)
    _scales(x, scheme, calibration, geo, out, s_eff, r_eff, bad, whole)
    pointers.update(s_eff_ptr=s_eff, r_eff_ptr=r_eff)
    u = max(1, 64 // geo.per_unit)
    g = _TILE // (u * geo.per_unit)
    if scheme.block is None:
        rows, cols, units_per_row = geo.flat(1)
        mode, width = K.MODE_TENSOR.value, 1
    else:
        rows, cols, units_per_row = geo.rows, geo.cols, math.ceil(geo.cols / geo.per_unit)
        mode, width = K.MODE_BLOCKS.value, geo.block[-1]
        pointers["row_base_ptr"] = _row_base(geo, x.device)
    chunks = triton.cdiv(units_per_row, g * u)
    K._quantize_kernel[(rows * chunks,)](
        **pointers, C=cols, units_per_row=units_per_row, chunks_per_row=chunks, blocks_per_row=1, BC=width,
        G=g, U=u, MODE=mode, EVEN=cols % (g * u * geo.per_unit) == 0,
        num_warps=_WIDE_WARPS if mode == K.MODE_BLOCKS.value else _WARPS, **const)


def _scales(x, scheme: QuantScheme, calibration: Calibration, geo: _Geometry, out, s_eff, r_eff, bad,
            whole: Range | None) -> None:
    """Run the range and scale kernels: stored scales (and the global) into `out`, effective scales and
    their reciprocals into s_eff and r_eff."""
    if scheme.block is None:
        alpha = (whole or tensor_range(x, scheme, calibration, bad)).alpha(calibration, scheme)
    else:
        alpha = _block_alpha(x, geo, calibration, bad)
        if scheme.is_two_level() and whole is None:
            whole = Range(alpha.amax().reshape(1), x.numel())
    n = alpha.numel()
    dtype = scheme.scale_dtype()
    block = 1024
    K._scales_kernel[(triton.cdiv(n, block),)](
        alpha, whole.value if scheme.is_two_level() else alpha, out[geo.scale_offset :],
        out[geo.global_offset :], s_eff, r_eff, n, BLOCK=block, TWO_LEVEL=scheme.is_two_level(),
        HALF_RANGE=scheme.value.half_range(), KIND=_KIND[dtype], SCALE_SIZE=dtype.scale_size(),
        DTYPE_MAX=dtype.max_representable(), **_OPTIONS)


def _row_alpha(x, rows: int, cols: int, width: int, calibration: Calibration, bad, per_program: bool = False
               ) -> torch.Tensor:
    """Per row and block of `width` values along it: max |x| (f32) or the f64 sum of |x|; with
    per_program, the largest f32 block range (mean for AbsMean) of each program's blocks."""
    blocks_per_row = math.ceil(cols / width)
    bp = triton.next_power_of_2(width)
    g = max(1, _TILE // bp)
    chunks = triton.cdiv(blocks_per_row, g)
    if per_program:
        out = torch.empty(rows * chunks, dtype=torch.float32, device=x.device)
    else:
        dtype = torch.float64 if calibration is Calibration.AbsMean else torch.float32
        out = torch.empty(rows * blocks_per_row, dtype=dtype, device=x.device)
    K._alpha_kernel[(rows * chunks,)](
        x, out, bad, cols, blocks_per_row, chunks, BC=width, G=g, BP=bp, CAL=_cal(calibration),
        PER_PROGRAM=per_program, **_OPTIONS)
    return out


def _block_alpha(x, geo: _Geometry, calibration: Calibration, bad) -> torch.Tensor:
    """f32 range per block of the grid, row-major: max |x|, or f32(f64 sum |x| / count) for AbsMean.
    A kernel reduces along the last axis, torch over the leading axes."""
    alpha = _row_alpha(x, geo.rows, geo.cols, geo.block[-1], calibration, bad)
    alpha = alpha.reshape(*geo.dims[:-1], geo.grid[-1])
    for axis, b in enumerate(geo.block[:-1]):
        if b == 1:
            continue
        pad = geo.grid[axis] * b - geo.dims[axis]
        if pad:  # zeros change neither a max of |x| nor a sum
            zeros = alpha.new_zeros(*alpha.shape[:axis], pad, *alpha.shape[axis + 1 :])
            alpha = torch.cat([alpha, zeros], axis)
        alpha = alpha.unflatten(axis, (geo.grid[axis], b))
        alpha = alpha.sum(axis + 1) if calibration is Calibration.AbsMean else alpha.amax(axis + 1)
    alpha = alpha.reshape(-1)
    if calibration is Calibration.AbsMean:  # float64 division, IEEE on every device
        alpha = (alpha / _block_counts(geo, x.device)).to(torch.float32)
    return alpha.contiguous()


def _block_counts(geo: _Geometry, device) -> torch.Tensor:
    """Elements in each block (a partial edge block counts only its own), row-major over the grid, as f64."""
    counts = torch.ones(1, dtype=torch.float64, device=device)
    for d, b, g in zip(geo.dims, geo.block, geo.grid, strict=True):
        extent = torch.clamp(d - torch.arange(g, device=device, dtype=torch.float64) * b, max=b)
        counts = (counts[:, None] * extent[None, :]).reshape(-1)
    return counts


def _row_base(geo: _Geometry, device) -> torch.Tensor:
    """For each row of the last axis, the index of its first block's scale in the row-major grid."""
    base = torch.zeros(1, dtype=torch.int64, device=device)
    for d, b, g in zip(geo.dims[:-1], geo.block[:-1], geo.grid[:-1], strict=True):
        base = (base[:, None] * g + torch.arange(d, device=device) // b).reshape(-1)
    return base * geo.grid[-1]


def encode(x: torch.Tensor, scheme: QuantScheme, calibration: Calibration = Calibration.MinMax,
           *, name: str = "tensor") -> torch.Tensor:
    """The payload of `x` (uint8, 1-D, `quantized_data_len` bytes) on x's device, as `qcli.codec.encode`."""
    check_accepted(scheme, calibration)
    _check_tensor(x, name)
    out = torch.empty(layout.quantized_data_len(scheme, tuple(x.shape)), dtype=torch.uint8, device=x.device)
    bad = torch.zeros(1, dtype=torch.int32, device=x.device)
    enqueue(x, scheme, calibration, out, bad)
    if bad.item():
        raise NonFiniteTensor(name, beyond_float32=False)  # float32, float16 or bfloat16 (`_check_tensor`)
    return out




def _cal(calibration: Calibration) -> int:
    return (K.CAL_ABSMEAN if calibration is Calibration.AbsMean else K.CAL_MINMAX).value
