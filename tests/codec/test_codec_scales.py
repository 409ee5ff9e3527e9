"""Scales: round_up onto each dtype, zero and underflowing blocks, AbsMean over partial blocks, saturation."""

from __future__ import annotations

import random

import pytest
import torch

from qcli.codec import decode, encode, quantize_parts, round_up
from qcli.codec.scales import scales_from_alpha
from qcli.scheme import Calibration, QuantScheme, QuantValue, ScaleDtype
from tests import qfloat_reference as ref

MIN_POSITIVE = 2.0**-126


def random_scales(seed: int, n: int = 4000) -> list[float]:
    """Positive f32 values over the whole range, dense around each dtype's thresholds and maxima."""
    rng = random.Random(seed)
    out = [ref.f32(rng.uniform(0.5, 1.0) * 2.0 ** rng.randint(-149, 127)) for _ in range(n)]
    edges = (2.0**-14, 2.0**-24, 2.0**-6, 2.0**-9, 65504.0, 448.0, ref.SCALE_MAX["BF16"], 1.0,
             2.0**-127, 2.0**-126, 2.0**127)  # the last three: UE8M0's minimum, f32's smallest normal, UE8M0's max
    for edge in edges:
        bits = ref.f32_bits(edge)
        out += [ref.from_f32_bits(bits + d) for d in range(-3, 4)]
    return [x for x in out if 0 < x < float("inf")] + [0.0]


@pytest.mark.parametrize("dtype", list(ref.SCALE_GRID))
def test_round_up_is_the_smallest_grid_value_above(dtype):
    scales = random_scales(seed=len(dtype))
    got = round_up(torch.tensor(scales, dtype=torch.float32), ScaleDtype(dtype)).tolist()
    assert got == [ref.round_up(s, dtype) for s in scales]


# Worked by hand from cubecl 0.11.3 `round_up_to_power_of_two` (scheme.rs): at or below 2^-127 the answer
# is 2^-127 (f32 bits 0x00400000, subnormal), at or above 2^127 it is 2^127 (0x7F000000), else the next
# power of two up; NaN stays NaN.
UE8M0_ROUND_UP = [
    (0.0, 0x00400000),                      # ue8m0 has no zero: the minimum
    (2.0**-130, 0x00400000),                # below the minimum (subnormal in f32): clamped up to it
    (2.0**-127, 0x00400000),                # the minimum itself
    (2.0**-126, 0x00800000),                # f32::MIN_POSITIVE is a power of two
    (2.0**-127 * 1.5, 0x00800000),          # between 2^-127 and 2^-126: up to 2^-126
    (0.75, 0x3F800000),                     # 1.1b * 2^-1 -> 2^0
    (1.0, 0x3F800000),                      # already a power of two
    (1.0000001, 0x40000000),                # one ulp above 1 (f32 0x3F800001) -> 2
    (3.0, 0x40800000),                      # -> 4
    (2.0**126 * 1.5, 0x7F000000),           # -> 2^127 by the step, not by the clamp
    (2.0**127, 0x7F000000),                 # the maximum itself
    (3e38, 0x7F000000),                     # above 2^127 (1.70e38): saturates; the step would give inf
    (float("inf"), 0x7F000000),
]


@pytest.mark.parametrize(("s", "bits"), UE8M0_ROUND_UP, ids=[f"{s!r}" for s, _ in UE8M0_ROUND_UP])
def test_round_up_ue8m0_hand_worked(s, bits):
    got = round_up(torch.tensor([s], dtype=torch.float32), ScaleDtype.UE8M0)
    assert ref.f32_bits(got.item()) == bits


def test_round_up_ue8m0_keeps_nan():
    assert round_up(torch.tensor([float("nan"), 1.0]), ScaleDtype.UE8M0).isnan().tolist() == [True, False]


def test_ue8m0_bytes_are_the_biased_exponent():
    """Every code 0..254 round-trips; 2^-127 is code 0, 2^-126 code 1, 1.0 code 127, 2^127 code 254, NaN 0xFF
    (cubecl `f32_to_ue8m0` / `ue8m0_to_f32`); the expected values come from the reference's code table."""
    from qcli.codec.pack import pack_scales, unpack_scales

    values = [ref.ue8m0_value(c) for c in range(255)]
    codes = pack_scales(torch.tensor(values, dtype=torch.float32), ScaleDtype.UE8M0)
    assert codes.tolist() == list(range(255))
    assert [bytes([c]) for c in codes.tolist()] == [ref.scale_bytes(v, "UE8M0") for v in values]
    assert pack_scales(torch.tensor([2.0**-127, 2.0**-126, 1.0, 2.0**127, float("nan")]),
                       ScaleDtype.UE8M0).tolist() == [0, 1, 127, 254, 0xFF]
    decoded = unpack_scales(torch.arange(256, dtype=torch.int32).to(torch.uint8), ScaleDtype.UE8M0)
    assert [ref.f32_bits(v) for v in decoded[:255].tolist()] == [0x00400000] + [c << 23 for c in range(1, 255)]
    assert decoded[:255].tolist() == values and decoded[255].isnan()


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


@pytest.mark.parametrize("value", list(ref.RANGE))
def test_raw_scale_equals_burns_doubled_formula(value):
    """docs/arithmetic.md §2: alpha / h is bit-identical to Burn's (alpha * 2) / (b - a) where finite."""
    a, b = ref.RANGE[value]
    alphas = [x for x in random_scales(seed=5) if x < 1e38]
    stored = scales_from_alpha(torch.tensor(alphas), QuantScheme().with_value(QuantValue(value))).stored
    assert stored.tolist() == [ref.f32(ref.f32(x * 2) / (b - a)) or MIN_POSITIVE for x in alphas]


@pytest.mark.parametrize(
    ("dtype", "stored"),
    [("F32", MIN_POSITIVE), ("F16", 2.0**-24), ("BF16", MIN_POSITIVE), ("UE4M3", 2.0**-9),
     ("UE8M0", MIN_POSITIVE)],  # UE8M0: 2^-126 is a power of two (code 1), not its 2^-127 minimum
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
