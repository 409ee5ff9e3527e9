"""Scales: round_up onto each dtype, zero and underflowing blocks, AbsMean over partial blocks, saturation."""

from __future__ import annotations

import random

import pytest
import qfloat_reference as ref
import torch

from qcli.codec import decode, encode, quantize_parts, round_up
from qcli.codec.scales import scales_from_alpha
from qcli.scheme import Calibration, QuantScheme, QuantValue, ScaleDtype

MIN_POSITIVE = 2.0**-126


def random_scales(seed: int, n: int = 4000) -> list[float]:
    """Positive f32 values over the whole range, dense around each dtype's thresholds and maxima."""
    rng = random.Random(seed)
    out = [ref.f32(rng.uniform(0.5, 1.0) * 2.0 ** rng.randint(-149, 127)) for _ in range(n)]
    for edge in (2.0**-14, 2.0**-24, 2.0**-6, 2.0**-9, 65504.0, 448.0, ref.SCALE_MAX["BF16"], 1.0):
        bits = ref.f32_bits(edge)
        out += [ref.from_f32_bits(bits + d) for d in range(-3, 4)]
    return [x for x in out if 0 < x < float("inf")] + [0.0]


@pytest.mark.parametrize("dtype", ["F16", "BF16", "UE4M3"])
def test_round_up_is_the_smallest_grid_value_above(dtype):
    scales = random_scales(seed=len(dtype))
    got = round_up(torch.tensor(scales, dtype=torch.float32), ScaleDtype(dtype)).tolist()
    assert got == [ref.round_up(s, dtype) for s in scales]


def test_round_up_f32_is_the_identity():
    s = torch.tensor(random_scales(seed=1), dtype=torch.float32)
    assert torch.equal(round_up(s, ScaleDtype.F32), s)


@pytest.mark.parametrize(
    ("dtype", "expected"),
    # qfloat-spec §2.4 table: 0.3, 1/3, 500, 1e-3, 7.7e-4 rounded up.
    [
        ("F16", [0.30004883, 0.3334961, 500, 0.0010004044, 0.000770092]),
        ("BF16", [0.30078125, 0.33398438, 500, 0.0010070801, 0.00077056885]),
        ("UE4M3", [0.3125, 0.34375, 448, 0.001953125, 0.001953125]),
    ],
)
def test_round_up_spec_table(dtype, expected):
    got = round_up(torch.tensor([0.3, 1 / 3, 500, 1e-3, 7.7e-4]), ScaleDtype(dtype))
    assert torch.allclose(got, torch.tensor(expected), rtol=1e-7, atol=0)


@pytest.mark.parametrize("value", ["Q8S", "Q8F", "Q4S", "Q4F", "Q2S", "Q2F", "E4M3", "E5M2", "E2M1"])
def test_raw_scale_equals_burns_doubled_formula(value):
    """docs/arithmetic.md §2: alpha / h is bit-identical to Burn's (alpha * 2) / (b - a) where finite."""
    a, b = ref.RANGE[value]
    alphas = [x for x in random_scales(seed=5) if x < 1e38]
    stored = scales_from_alpha(torch.tensor(alphas), QuantScheme().with_value(QuantValue(value))).stored
    assert stored.tolist() == [ref.f32(ref.f32(x * 2) / (b - a)) or MIN_POSITIVE for x in alphas]


@pytest.mark.parametrize(
    ("dtype", "stored"),
    [("F32", MIN_POSITIVE), ("F16", 2.0**-24), ("BF16", MIN_POSITIVE), ("UE4M3", 2.0**-9)],
)
def test_all_zero_block_stores_round_up_of_min_positive_and_decodes_to_zeros(dtype, stored):
    scheme = QuantScheme().with_value(QuantValue.Q8S).per_block([4], ScaleDtype(dtype))
    x = torch.tensor([[0.0, -0.0, 0.0, 0.0, 1.0, -2.0, 0.5, 0.0]])
    parts = quantize_parts(x, scheme)
    assert parts.scales[0, 0].item() == stored
    assert parts.fields[0, :4].tolist() == [0, 0, 0, 0]
    back = decode(encode(x, scheme), scheme, x.shape)
    assert back[0, :4].tolist() == [0.0, 0.0, 0.0, 0.0]


def test_two_level_all_zero_tensor():
    """The global clamps to f32::MIN_POSITIVE; relative scales of 0 become MIN_POSITIVE -> UE4M3 2^-9."""
    scheme = QuantScheme.nvfp4()
    parts = quantize_parts(torch.zeros(2, 32), scheme)
    assert parts.global_scale == MIN_POSITIVE
    assert parts.scales.tolist() == [[2.0**-9] * 2] * 2
    assert parts.fields.eq(0).all()
    assert decode(encode(torch.zeros(2, 32), scheme), scheme, [2, 32]).eq(0).all()


def test_two_level_zero_block_beside_a_nonzero_one():
    scheme = QuantScheme.nvfp4()
    x = torch.zeros(1, 32)
    x[0, 16:] = 6.0
    parts = quantize_parts(x, scheme)
    # raw = 1 in block 1; global = 1/448; relative = 448 -> stored 448; block 0 relative 0 -> 2^-9.
    assert parts.global_scale == ref.f32(1 / 448)
    assert parts.scales.tolist() == [[2.0**-9, 448.0]]
    assert parts.fields[0, :16].eq(0).all() and parts.fields[0, 16:].eq(7).all()


def test_underflowing_raw_scale_takes_min_positive():
    """alpha = 2^-149 gives alpha / 127 = 0 in f32, so s = f32::MIN_POSITIVE and q = 0."""
    scheme = QuantScheme().with_value(QuantValue.Q8S)
    parts = quantize_parts(torch.tensor([2.0**-149, 0.0]), scheme)
    assert parts.scales.tolist() == [MIN_POSITIVE]
    assert parts.fields.tolist() == [0, 0]


def test_huge_values_saturate_the_scale_and_clamp():
    scheme = QuantScheme().with_value(QuantValue.Q2S).per_block([16], ScaleDtype.F16)
    x = torch.tensor([[3e38, -3e38] + [1.0] * 14])
    parts = quantize_parts(x, scheme)
    assert parts.scales.tolist() == [[65504.0]]
    assert parts.fields[0, :3].tolist() == [1, -1, 0]


def test_absmean_counts_only_the_elements_of_an_edge_block():
    """Block [4] over 6 values: the second block holds 2, so its mean divides by 2, not 4."""
    scheme = QuantScheme().with_value(QuantValue.Q8S).per_block([4], ScaleDtype.F32)
    parts = quantize_parts(torch.tensor([1.0, -2.0, 3.0, 4.0, 1.0, -3.0]), scheme, Calibration.AbsMean)
    assert parts.scales.tolist() == [ref.f32(2.5 / 127), ref.f32(2.0 / 127)]


def test_absmean_counts_of_a_2d_block_grid():
    """Block [2, 4] over [3, 6]: blocks hold 8, 4, 4 and 2 elements; all ones means alpha = 1 in each."""
    scheme = QuantScheme().with_value(QuantValue.Q8S).per_block([2, 4], ScaleDtype.F32)
    parts = quantize_parts(torch.ones(3, 6), scheme, Calibration.AbsMean)
    assert parts.scales.tolist() == [[ref.f32(1 / 127)] * 2] * 2


def test_absmean_is_f64_mean_rounded_once():
    """[2^24, 1, 1, 1]: the f64 mean 2^22 + 0.75 rounds once to 2^22 + 1; an f32 sum loses ones."""
    x = torch.tensor([2.0**24, 1.0, 1.0, 1.0], dtype=torch.float32)
    scheme = QuantScheme().with_value(QuantValue.Q2S).per_tensor(ScaleDtype.F32)
    parts = quantize_parts(x, scheme, Calibration.AbsMean)
    assert parts.scales.tolist() == [2.0**22 + 1]
