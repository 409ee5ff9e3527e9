"""The scale search (`Calibration.Mse`): against hand-worked blocks, an independent nearest-on-grid, the
MinMax payload it must never do worse than, and its claim that chunking and threads cannot change a byte."""

from __future__ import annotations

import bisect
import math
import struct

import pytest
import torch

from qcli.codec import decode, encode
from qcli.codec import quantize as codec_quantize
from qcli.codec.scales import nearest
from qcli.presets import PRESETS
from qcli.scheme import Calibration, QuantScheme, QuantValue, ScaleDtype
from tests.qfloat_reference import SCALE_GRID, SCALE_MAX


def q4f_b32_f16() -> QuantScheme:
    return QuantScheme().with_value(QuantValue.Q4F).per_block([32], ScaleDtype.F16)


def f16_scale(payload: torch.Tensor, values_bytes: int) -> float:
    return struct.unpack("<e", bytes(payload[values_bytes : values_bytes + 2].tolist()))[0]


def test_a_q4f_block_whose_largest_value_is_positive_gets_a_negative_scale_onto_minus_8():
    """Hand-worked: a block of 7.5 and zeros. MinMax stores s = 7.5 / 7.5 = 1, and 7.5 / 1 clamps to 7
    (error 0.5). amax / 7 = 1.0714... rounds to the f16 1.0712890625 and decodes 7.4990234375; the negative
    scale -7.5 / 8 = -0.9375 (exact in f16) takes 7.5 to q = -8 exactly, error 0, so it is stored."""
    x = torch.zeros(32)
    x[5] = 7.5
    scheme = q4f_b32_f16()
    minmax, searched = encode(x, scheme, Calibration.MinMax), encode(x, scheme, Calibration.Mse)
    assert f16_scale(minmax, 16) == 1.0
    assert f16_scale(searched, 16) == -0.9375
    assert decode(searched, scheme, (32,))[5].item() == 7.5


def test_without_a_sign_bit_the_same_block_takes_amax_over_7():
    """UE4M3 scales have no sign. MinMax's 1.0 clamps 7.5 to 7 (error 0.5), and the clips, smaller, clamp it
    lower; 7.5 / 7 = 1.0714 rounds to the nearer e4m3 1.125 (not 1.0), and 7.5 / 1.125 = 6.67 gives q = 7,
    decoded 7.875 (error 0.375): the least error of the candidates."""
    x = torch.zeros(32)
    x[5] = 7.5
    scheme = QuantScheme().with_value(QuantValue.Q4F).per_block([32], ScaleDtype.UE4M3)
    decoded = decode(encode(x, scheme, Calibration.Mse), scheme, (32,))
    assert decoded[5].item() == 7.875


def test_a_q4f_block_whose_largest_value_is_negative_keeps_the_exact_scale_amax_over_8():
    """-8 is on Q4F's range, so amax / 8 = 1 decodes -8 exactly; MinMax's 8 / 7.5 errs on it."""
    x = torch.zeros(32)
    x[0], x[1] = -8.0, 3.0
    scheme = q4f_b32_f16()
    searched = encode(x, scheme, Calibration.Mse)
    assert f16_scale(searched, 16) == 1.0
    assert decode(searched, scheme, (32,))[:2].tolist() == [-8.0, 3.0]


def nearest_on_grid(s: float, dtype: str) -> float:
    """The grid value nearest s (bisection over the whole grid), ties to the even code (UE8M0: to the
    larger power), saturating at the dtype's max."""
    grid = SCALE_GRID[dtype]
    s = min(s, SCALE_MAX[dtype])
    i = bisect.bisect_left(grid, s)
    if i == len(grid) or grid[i] == s:
        return grid[min(i, len(grid) - 1)]
    if i == 0:
        return 0.0 if s < grid[0] / 2 or (s == grid[0] / 2 and dtype != "UE8M0") else grid[0]
    lo, hi = grid[i - 1], grid[i]
    if s - lo != hi - s:
        return lo if s - lo < hi - s else hi
    return hi if dtype == "UE8M0" or i % 2 == 0 else lo


@pytest.mark.parametrize("dtype", list(SCALE_GRID))
def test_nearest_matches_a_bisection_over_the_dtypes_whole_grid(dtype):
    generator = torch.Generator().manual_seed(3)
    grid = SCALE_GRID[dtype]
    smallest = grid[1] if grid[0] == 0 else grid[0]
    exponents = torch.empty(3000).uniform_(math.log2(smallest) - 1, math.log2(SCALE_MAX[dtype]) + 1,
                                           generator=generator)
    s = torch.exp2(exponents).to(torch.float32)
    middle = len(grid) // 2
    pairs = zip(grid[middle : middle + 40], grid[middle + 1 : middle + 41], strict=True)
    midpoints = torch.tensor([(a + b) / 2 for a, b in pairs])
    s = torch.cat([s, midpoints.to(torch.float32), torch.tensor(grid[:5] + grid[-3:], dtype=torch.float32)])
    got = nearest(s, ScaleDtype(dtype)).tolist()
    want = [nearest_on_grid(v, dtype) for v in s.tolist()]
    if dtype == "UE8M0":  # nothing below 2^-127: the smallest power is what a tiny scale gets
        want = [max(w, grid[0]) for w in want]
    assert got == want


def block_squared_errors(x: torch.Tensor, decoded: torch.Tensor) -> torch.Tensor:
    return ((x.double() - decoded.double()) ** 2).reshape(x.shape[0], -1, 32).sum(-1)


@pytest.mark.parametrize(("preset", "gains"), [("q4s-b32", True), ("q4f-b32", True), ("q2s-b32", True),
                                               ("fp4-b32", True), ("q8s-b32", False), ("e4m3-b32", False)])
def test_no_searched_block_errs_more_than_minmax_and_the_tensor_errs_less(preset, gains):
    """MinMax's scale is the first candidate, so a searched block errs at most as much (up to the
    fixed-point resolution of the comparison, 2^-20 of the block's amax per element); on Gaussian weights
    the search lowers the whole tensor's squared error at 4 bits and below (at 8 bits a clipped largest
    value costs more than the finer step saves, so MinMax's scale mostly stays)."""
    scheme = PRESETS[preset].scheme
    x = torch.randn(64, 512, generator=torch.Generator().manual_seed(1)) * 0.02
    errors = {c: block_squared_errors(x, decode(encode(x, scheme, c), scheme, tuple(x.shape)))
              for c in (Calibration.MinMax, Calibration.Mse)}
    amax = x.abs().reshape(64, -1, 32).amax(-1).double()
    slack = 32 * 2 * 2.0**-19 * amax**2
    assert bool((errors[Calibration.Mse] <= errors[Calibration.MinMax] + slack).all())
    if gains:
        assert errors[Calibration.Mse].sum() < 0.97 * errors[Calibration.MinMax].sum()


@pytest.mark.parametrize("preset", ["q8s", "q4s-b32", "e4m3"])
def test_chunking_and_threads_change_no_byte(preset, monkeypatch):
    """The candidates' errors are integer sums, so a per-tensor scheme summed over other chunks, or a
    block scheme cut otherwise, picks the same scales."""
    scheme = PRESETS[preset].scheme
    x = torch.randn(96, 1024, generator=torch.Generator().manual_seed(2)) * 0.05
    reference = encode(x, scheme, Calibration.Mse)
    threads = torch.get_num_threads()
    try:
        for chunk, count in ((1 << 12, 1), (1 << 14, 2), (1 << 20, 1)):
            monkeypatch.setattr(codec_quantize, "CHUNK_ELEMENTS", chunk)
            torch.set_num_threads(count)
            assert torch.equal(encode(x, scheme, Calibration.Mse), reference), (chunk, count)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("preset", ["q8s", "q4f-b32", "fp4-b32"])
def test_candidates_measured_together_or_one_at_a_time_pick_the_same_bytes(preset, monkeypatch):
    """The search measures as many candidates at once as its scratch allows (`STACKED_ELEMENTS`); with room
    for one, a few, or all of them it picks the same scales: of equal errors the first candidate wins."""
    from qcli.codec import search

    scheme = PRESETS[preset].scheme
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(5)) * 0.05
    x[:, :32] = 0.5  # equal errors for many candidates
    results = []
    for room in (1, 3 * x.numel(), 1 << 23):
        monkeypatch.setitem(search.STACKED_ELEMENTS, "cpu", room)
        results.append(encode(x, scheme, Calibration.Mse))
    assert all(torch.equal(r, results[0]) for r in results[1:])


def test_a_two_level_scheme_keeps_minmaxs_global_and_searches_under_it():
    scheme = QuantScheme().with_value(QuantValue.E2M1).per_block([16], ScaleDtype.UE4M3).per_tensor(ScaleDtype.F32)
    x = torch.randn(8, 256, generator=torch.Generator().manual_seed(4))
    minmax, searched = encode(x, scheme, Calibration.MinMax), encode(x, scheme, Calibration.Mse)
    assert torch.equal(minmax[-4:], searched[-4:])  # the f32 global, last in the payload
    assert not torch.equal(minmax, searched)
    assert block_squared_errors(x, decode(searched, scheme, (8, 256))).sum() < \
        block_squared_errors(x, decode(minmax, scheme, (8, 256))).sum()
