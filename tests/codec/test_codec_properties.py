"""Properties of encode/decode over random shapes, data and every accepted scheme (hypothesis).

- the payload is uint8, 1-D, exactly `quantized_data_len` bytes;
- decoding is within half a grid step of the input wherever the input lies inside the value range
  (the step is s_eff for integers, s_eff times the local minifloat spacing for minifloats), and
  saturates outside it;
- values already on the grid (every block's maximum h * 2^k, the rest grid values times 2^k) come back
  bit-exact under one-level schemes, and as the same fields under two-level ones;
- any byte string of the right length decodes, and encoding never writes into its input.
"""

from __future__ import annotations

import math

import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from qcli import layout
from qcli.codec import decode, encode, quantize_parts
from qcli.codec.values import from_fields
from qcli.scheme import (
    WEIGHT_CALIBRATIONS,
    Calibration,
    Native,
    PackedNative,
    PackedU32,
    QuantScheme,
    QuantValue,
    ScaleDtype,
    accept_problems,
)

# Format parameters restated from qfloat-spec §4: (mantissa bits, smallest normal).
MINIFLOAT = {QuantValue.E4M3: (3, 2.0**-6), QuantValue.E5M2: (2, 2.0**-14), QuantValue.E2M1: (1, 1.0)}
GRID_VALUES = {
    QuantValue.E4M3: [0.0, 0.015625, 0.5, 1.5, 3.25, 10.0, 96.0, 448.0],
    QuantValue.E5M2: [0.0, 2.0**-16, 0.75, 1.5, 96.0, 3072.0, 57344.0],
    QuantValue.E2M1: [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0],
}
BLOCKS = [[32], [16], [4, 32], [2, 16], [3], [2, 5], [1], [8], [4]]
# The block scale dtypes a two-level scheme takes: those no wider than f16 (F16, UE4M3).
UNDER_A_GLOBAL = [dtype for dtype in ScaleDtype
                  if not accept_problems(QuantScheme().per_block([32], dtype).per_tensor(ScaleDtype.F32))]


def test_the_format_tables_cover_every_minifloat():
    assert set(MINIFLOAT) == set(GRID_VALUES) == {value for value in QuantValue if value.is_minifloat()}


@st.composite
def schemes(draw, calibration=Calibration.MinMax):
    value = draw(st.sampled_from(list(QuantValue)))
    store = draw(st.sampled_from([Native(), PackedU32(0), PackedNative(0)]))
    scheme = QuantScheme().with_value(value).with_store(store)
    level = draw(st.sampled_from(["tensor", "block", "two"]))
    if level == "tensor":
        scheme = scheme.per_tensor(draw(st.sampled_from(list(ScaleDtype))))
    else:
        dtypes = UNDER_A_GLOBAL if level == "two" else list(ScaleDtype)
        scheme = scheme.per_block(draw(st.sampled_from(BLOCKS)), draw(st.sampled_from(dtypes)))
        if level == "two":
            scheme = scheme.per_tensor(ScaleDtype.F32)
    assume(not accept_problems(scheme, calibration, quantizer=False))
    return scheme


shapes = st.lists(st.integers(1, 40), min_size=0, max_size=4).filter(lambda s: math.prod(s) <= 3000)


@st.composite
def tensors(draw, shape):
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    kind = draw(st.sampled_from(["normal", "uniform", "sparse", "heavy"]))
    scale = 2.0 ** draw(st.integers(-30, 30))
    if kind == "normal":
        x = torch.randn(shape, generator=gen)
    elif kind == "uniform":
        x = torch.rand(shape, generator=gen) * 2 - 1
    elif kind == "sparse":
        x = torch.randn(shape, generator=gen) * (torch.rand(shape, generator=gen) < 0.2)
    else:
        x = torch.randn(shape, generator=gen) ** 3
    return (x * scale).to(torch.float32)


def effective_scales(scheme: QuantScheme, parts, shape) -> torch.Tensor:
    """s_eff per element: the stored scales spread over their blocks, times the global for two levels."""
    scales = parts.scales
    if parts.global_scale is not None:
        scales = torch.tensor(parts.global_scale, dtype=torch.float32) * scales
    if scheme.block is None or not shape:
        return scales.reshape(()).expand(shape)
    for axis, b in enumerate(scheme.block.size.to_dim_vec(len(shape))):
        scales = scales.repeat_interleave(b, dim=axis)
    return scales[tuple(slice(0, d) for d in shape)]


def half_step(value: QuantValue, v: torch.Tensor) -> torch.Tensor:
    """Half the grid spacing at |v| (in units of the scale)."""
    if value not in MINIFLOAT:
        return torch.full_like(v, 0.5)
    m, min_normal = MINIFLOAT[value]
    binade = torch.floor(torch.log2(v.abs().clamp_min(min_normal)))
    return torch.exp2(binade - m) / 2


@settings(max_examples=150, deadline=None)
@given(data=st.data(), calibration=st.sampled_from(WEIGHT_CALIBRATIONS))
def test_round_trip_is_within_half_a_step(data, calibration):
    scheme = data.draw(schemes(calibration))
    shape = data.draw(shapes)
    x = data.draw(tensors(shape))
    payload = encode(x, scheme, calibration)
    assert payload.dtype == torch.uint8 and payload.dim() == 1
    assert payload.numel() == layout.quantized_data_len(scheme, shape)
    back = decode(payload, scheme, shape)
    assert back.dtype == torch.float32 and list(back.shape) == shape

    s = effective_scales(scheme, quantize_parts(x, scheme, calibration), shape).double()
    xd, bd = x.double(), back.double()
    v = xd / s
    a, b = scheme.value.range()
    inside = (v >= a) & (v <= b)
    eps = 2.0**-21 * (xd.abs() + s.abs())  # a searched scale (Mse) may be negative
    assert ((xd - bd).abs() <= half_step(scheme.value, v) * s.abs() + eps)[inside].all()
    # Outside the range (AbsMean, or an f32 rounding at the edge) the value saturates at the range's end.
    edge = torch.where(v > 0, torch.full_like(v, b), torch.full_like(v, a)) * s
    assert ((bd - edge).abs() <= eps)[~inside].all()


@settings(max_examples=120, deadline=None)
@given(data=st.data())
def test_values_on_the_grid_come_back_exactly(data):
    """Q*F are left out: their h = b + 1/2 is not a value, so no block maximum on the grid gives s = 2^k. The
    values kept have a range symmetric around zero: Q8S, Q4S, Q2S and the minifloats."""
    scheme = data.draw(schemes().filter(lambda s: -s.value.range()[0] == s.value.range()[1]))
    shape = data.draw(shapes.filter(lambda s: len(s) >= 1))
    value = scheme.value
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31)))
    if value.is_minifloat():
        grid = torch.tensor(GRID_VALUES[value])
        q = grid[torch.randint(len(grid), shape, generator=gen)]
        q = q * torch.where(torch.rand(shape, generator=gen) < 0.5, -1.0, 1.0)
    else:
        a, b = value.range()
        q = torch.randint(int(a), int(b) + 1, shape, generator=gen).to(torch.float32)
    # The first element of every block is h, so every block's raw scale is exactly 2^k.
    blocks = shape if scheme.block is None else scheme.block.size.to_dim_vec(len(shape))
    firsts = [torch.arange(0, d, b) for d, b in zip(shape, blocks, strict=True)]
    q[torch.meshgrid(*firsts, indexing="ij")] = value.half_range()
    x = q * 2.0 ** data.draw(st.integers(-8, 8))
    assert torch.equal(from_fields(quantize_parts(x, scheme).fields, value), q)
    if not scheme.is_two_level():  # under a global, s_eff = global * stored is not 2^k
        assert torch.equal(decode(encode(x, scheme), scheme, shape), x)


@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_any_payload_of_the_right_length_decodes(data):
    """A decoder reads foreign files: every byte string of the right length gives an f32 tensor (NaN codes
    and all), never an exception."""
    scheme = data.draw(schemes())
    shape = data.draw(shapes)
    payload = data.draw(st.binary(min_size=(n := layout.quantized_data_len(scheme, shape)), max_size=n))
    back = decode(payload, scheme, shape)
    assert back.dtype == torch.float32 and list(back.shape) == shape


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_encode_leaves_its_input_alone(data):
    scheme = data.draw(schemes())
    shape = data.draw(shapes)
    x = data.draw(tensors(shape))
    before = x.clone()
    encode(x, scheme)
    quantize_parts(x, scheme)
    assert torch.equal(x, before)
