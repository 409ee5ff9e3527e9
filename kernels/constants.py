"""What every launch hands the Triton kernels besides the tensors: the compile options, a value type's and a
scale dtype's rows (`qcli.scheme`) as constexprs, and the search's clip factors on the device. Shared by the
quantize launches (`launch`) and GPTQ's (`gptq`)."""

from __future__ import annotations

import functools

import torch

from qcli.codec.search import CLIPS
from qcli.scheme import QuantValue, ScaleDtype, f32_bits

# No multiply-add contraction: every product must round on its own, as on the CPU.
COMPILE_OPTIONS = {"enable_fp_fusion": False}


def value_constants(value: QuantValue) -> dict:
    """A value type's row (`qcli.scheme.ValueTraits`) as the kernels' constexprs."""
    lo, hi = value.range()
    fmt = value.traits.minifloat
    ebits, mbits, bias = (fmt.exponent_bits, fmt.mantissa_bits, fmt.bias) if fmt else (0, 0, 0)
    return dict(IS_FLOAT=value.is_minifloat(), BITS=value.size_bits(), LO=lo, HI=hi, EBITS=ebits, MBITS=mbits,
                BIAS=bias)


def scale_constants(dtype: ScaleDtype) -> dict:
    """A scale dtype's row (`qcli.scheme.ScaleTraits`) as the kernels' constexprs (`_arith.round_up`)."""
    traits = dtype.traits
    fmt = traits.minifloat
    ebits, mbits, bias = (fmt.exponent_bits, fmt.mantissa_bits, fmt.bias) if fmt else (0, 0, 0)
    return dict(SCALE_STEP=traits.step_bits, SCALE_FLOOR=0 if traits.floor is None else f32_bits(traits.floor),
                SCALE_MAX=traits.max, SCALE_EBITS=ebits, SCALE_MBITS=mbits, SCALE_BIAS=bias,
                SCALE_SIZE=traits.bytes)


@functools.cache
def clips(device: torch.device) -> torch.Tensor:
    """The search's clip factors (`qcli.codec.search.CLIPS`) on `device`, read by the searched kernel."""
    clips = torch.tensor(CLIPS, dtype=torch.float32, device=device)
    if clips.is_cuda:  # complete before any stream reads it
        torch.cuda.current_stream().synchronize()
    return clips
