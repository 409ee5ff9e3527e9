"""Minifloat codes: E4M3/E5M2 against torch's float8 conversions (an independent oracle), E2M1 against
the hand-written code table and the tie cases of qfloat-spec §2.5; each by torch's passes
(`minifloat.encode`) and by the compiled loop (`search_loop.minifloat_codes`, where it is built)."""

from __future__ import annotations

import pytest
import torch

from qcli.codec import minifloat, search_loop
from qcli.scheme import E2M1, E4M3, E5M2

FP8 = [pytest.param(E4M3, torch.float8_e4m3fn, id="E4M3"), pytest.param(E5M2, torch.float8_e5m2, id="E5M2")]

# qfloat-spec §3.5 / §4: codes 0..7 are these magnitudes, 8..15 their negatives (8 is -0).
E2M1_TABLE = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def _loop_codes(v: torch.Tensor, fmt) -> torch.Tensor:
    return search_loop.minifloat_codes(v.contiguous(), fmt).to(torch.int32)


ENCODERS = [
    pytest.param(minifloat.encode, id="torch"),
    pytest.param(_loop_codes, id="loop",
                 marks=pytest.mark.skipif(not search_loop.BUILT, reason="the compiled loop is not built")),
]


def oracle(v: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return v.to(dtype).view(torch.uint8).to(torch.int32)


def boundary_inputs(fmt) -> torch.Tensor:
    """Every finite code value, every midpoint between neighbours (the ties), and one f32 ulp either side."""
    table = minifloat.table(fmt)
    finite = table[: fmt.sign_bit][torch.isfinite(table[: fmt.sign_bit])]
    finite = finite[finite <= fmt.max].sort().values
    mids = ((finite[1:].double() + finite[:-1].double()) / 2).float()  # exact: one more bit than the format
    around = torch.cat([mids, finite])
    bits = around.view(torch.int32)
    near = torch.cat([around, (bits + 1).view(torch.float32), (bits - 1).clamp_min(0).view(torch.float32)])
    near = near[near <= fmt.max]
    return torch.cat([near, -near])


@pytest.mark.parametrize(("fmt", "dtype"), FP8)
@pytest.mark.parametrize("encode", ENCODERS)
def test_fp8_codes_at_every_boundary_match_torch(fmt, dtype, encode):
    v = boundary_inputs(fmt)
    assert torch.equal(encode(v, fmt), oracle(v, dtype))


@pytest.mark.parametrize(("fmt", "dtype"), FP8)
@pytest.mark.parametrize("encode", ENCODERS)
def test_fp8_codes_of_random_values_match_torch(fmt, dtype, encode):
    gen = torch.Generator().manual_seed(3)
    n = 400_000
    v = torch.randn(n, generator=gen) * torch.exp2(torch.randint(-40, 20, (n,), generator=gen).float())
    v = v.clamp(-fmt.max, fmt.max)
    assert torch.equal(encode(v, fmt), oracle(v, dtype))


@pytest.mark.parametrize(("fmt", "dtype"), FP8)
def test_fp8_table_matches_torch(fmt, dtype):
    expected = torch.arange(256, dtype=torch.uint8).view(dtype).to(torch.float32)
    got = minifloat.table(fmt)
    assert torch.equal(got.isnan(), expected.isnan())
    finite = ~expected.isnan()
    assert torch.equal(got[finite], expected[finite])
    assert torch.equal(got.signbit(), expected.signbit())


def test_e4m3_max_and_nan_codes():
    """e4m3fn: 448 is 0x7E, 0x7F and 0xFF are NaN; f32::MAX clamped to 448 saturates (fp8_e4m3.rs:316)."""
    table = minifloat.table(E4M3)
    assert table[0x7E] == 448 and table[0x7F].isnan() and table[0xFF].isnan()
    v = torch.tensor([3.4028235e38, -3.4028235e38]).clamp(-448, 448)
    assert minifloat.encode(v, E4M3).tolist() == [0x7E, 0xFE]


def test_e4m3_spec_examples():
    """qfloat-spec §4: 1.5 = 0x3C, 0.1171875 = 0x1F, 0.5 = 0x30, 0.125 = 0x20, 10 = 0x52, 0.0390625 = 0x12."""
    v = torch.tensor([1.5, 0.1171875, 0.5, 0.125, 10.0, 0.0390625])
    assert minifloat.encode(v, E4M3).tolist() == [0x3C, 0x1F, 0x30, 0x20, 0x52, 0x12]


def test_e2m1_table():
    assert minifloat.table(E2M1).tolist() == E2M1_TABLE + [-m for m in E2M1_TABLE]


@pytest.mark.parametrize("encode", ENCODERS)
def test_e2m1_codes_of_the_grid_and_their_negatives(encode):
    v = torch.tensor(E2M1_TABLE + [-m for m in E2M1_TABLE])
    assert encode(v, E2M1).tolist() == list(range(16))


@pytest.mark.parametrize(
    ("x", "code"),
    [
        # qfloat-spec §2.5 ties go to the even mantissa: 0.25->0, 0.75->1, 1.25->1, 2.5->2, 5->4;
        # 7 saturates to 6. (The second number is the code; codes 0..7 are 0, .5, 1, 1.5, 2, 3, 4, 6.)
        (0.25, 0),
        (0.75, 2),
        (1.25, 2),
        (1.75, 4),
        (2.5, 4),
        (3.5, 6),
        (5.0, 6),
        (7.0, 7),
        # not ties: nearest
        (0.2, 0),
        (0.3, 1),
        (1.4, 3),
        (2.6, 5),
        (4.9, 6),
        (5.5, 7),
        (100.0, 7),
        # the sign is kept, -0 included
        (-0.25, 8),
        (-0.0, 8),
        (-0.3, 9),
        (-5.0, 14),
        (-7.0, 15),
    ],
)
@pytest.mark.parametrize("encode", ENCODERS)
def test_e2m1_rounding(x, code, encode):
    v = torch.tensor([x]).clamp(-6, 6)
    assert encode(v, E2M1).item() == code


def test_decode_maps_codes_through_the_table():
    codes = torch.tensor([[0, 7], [8, 15]], dtype=torch.int32)
    assert minifloat.decode(codes, E2M1).tolist() == [[0.0, 6.0], [-0.0, -6.0]]
