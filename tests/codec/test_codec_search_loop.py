"""The compiled search loop (`qcli.codec.search_loop`, the `_search` extension) against torch's passes
(`qcli.codec.search.stacked_errors`): the same integer errors for every candidate of every block, so the
same bytes; and the search without the loop (a build without a C compiler) writes those bytes too."""

from __future__ import annotations

import math
import os

import pytest
import torch

from qcli.codec import encode, search_loop
from qcli.codec import search as codec_search
from qcli.codec.blocks import broadcast_to_blocks, to_blocks
from qcli.codec.scales import block_reduce
from qcli.layout import BlockGrid
from qcli.presets import PRESETS
from qcli.scheme import Calibration, QuantScheme, QuantValue, ScaleDtype
from tests.cases import all_schemes

MSE_SCHEMES = sorted({scheme for scheme, calibration, _ in all_schemes() if calibration is Calibration.Mse}
                     | {QuantScheme().with_value(value).per_block([32], dtype)
                        for value in QuantValue for dtype in ScaleDtype}, key=str)


@pytest.fixture(autouse=True)
def built():
    """The loop is built wherever a C compiler was (CI has one: there its absence fails)."""
    if not search_loop.BUILT:
        if os.environ.get("CI"):
            pytest.fail("qcli.codec._search was not built: pip install -e . needs a C compiler")
        pytest.skip("qcli.codec._search was not built (no C compiler at install)")


def hostile(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """Values over many binades, rows of zeros, equal values (ties between candidates), some subnormal."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.exp(torch.randn(shape[0], *(1,) * (len(shape) - 1), generator=g) * 4)
    flat = x.view(-1)
    flat[: shape[-1]] = 0
    flat[shape[-1] : 2 * shape[-1]] = 0.5
    flat[-7:] = torch.tensor([1e-39, -3e-40, 2e-45, 1e-30, -1e-35, 7.0, -8.0])
    return x


def both_measures(x: torch.Tensor, scheme: QuantScheme, weights: torch.Tensor | None):
    grid = BlockGrid.of(scheme, x.shape)
    alpha = block_reduce(x, grid, Calibration.MinMax)
    found = codec_search.candidates(alpha, scheme)
    bits = codec_search.importance_bits(math.prod(grid.block))
    unit = codec_search.fixed_point_unit(alpha, codec_search.error_bits(math.prod(grid.block),
                                                                        0 if weights is None else bits))
    loop = search_loop.errors(x, grid, found.effective, unit, scheme.value, weights)
    torch_passes = codec_search.stacked_errors(to_blocks(x, grid), grid, found.effective, unit, scheme.value,
                                               None if weights is None else broadcast_to_blocks(weights, grid))
    return loop, torch_passes


@pytest.mark.parametrize("scheme", MSE_SCHEMES, ids=str)
def test_the_loop_sums_torchs_integers_for_every_candidate_and_block(scheme):
    shape = (6, 2, 96) if scheme.block is not None and len(scheme.block.size.to_dim_vec(3)) > 1 else (12, 100)
    x = hostile(shape, seed=len(str(scheme)))
    loop, torch_passes = both_measures(x, scheme, None)
    assert loop.dtype == torch.float64 and loop.shape == torch_passes.shape
    assert torch.equal(loop, torch_passes)
    assert bool((loop > 0).any())  # not a sum of nothing


@pytest.mark.parametrize("scheme", [s for s in MSE_SCHEMES if s.block is not None], ids=str)
@pytest.mark.parametrize("weighed", [False, True], ids=["plain", "weighed"])
def test_the_loop_chooses_torchs_candidate_for_every_block(scheme, weighed):
    """`choose` works the candidates out itself: the same scales, stored and effective, as torch's
    `candidates` and the first least of their errors, on every value type and scale dtype, one level or
    two (under the whole tensor's global)."""
    x = hostile((24, 2, 96) if len(scheme.block.size.to_dim_vec(3)) > 1 else (24, 160), seed=len(str(scheme)))
    grid = BlockGrid.of(scheme, x.shape)
    alpha = block_reduce(x, grid, Calibration.MinMax)
    bits = codec_search.importance_bits(math.prod(grid.block))
    weights = None
    if weighed:
        importance = torch.rand(x.shape[-1], generator=torch.Generator().manual_seed(1)) ** 6
        weights = codec_search.importance_weights(importance, tuple(x.shape), bits)
    unit = codec_search.fixed_point_unit(alpha, codec_search.error_bits(math.prod(grid.block),
                                                                        bits if weighed else 0))
    found = codec_search.candidates(alpha, scheme)
    errors = codec_search.stacked_errors(to_blocks(x, grid), grid, found.effective, unit, scheme.value,
                                         None if weights is None else broadcast_to_blocks(weights, grid))
    taken = codec_search.first_least(errors)[None]
    stored, effective = search_loop.choose(x, grid, alpha, unit, scheme, codec_search.CLIPS, found.global_scale,
                                           weights)
    assert torch.equal(stored, found.stored.gather(0, taken)[0])
    assert torch.equal(effective, found.effective.gather(0, taken)[0])
    if not scheme.value.is_minifloat() and scheme.value.size_bits() <= 4:
        assert bool((taken > 0).any())  # some block chose other than MinMax's scale


@pytest.mark.parametrize("preset", ["q4s-b32", "q4f-b32", "fp4-b32", "q8s", "e4m3-b32"])
@pytest.mark.parametrize("along", ["columns", "rows"])
def test_weighed_errors_are_torchs_too(preset, along):
    scheme = PRESETS[preset].scheme
    x = hostile((32, 160), seed=3)
    g = torch.Generator().manual_seed(9)
    importance = torch.rand(160 if along == "columns" else 32, generator=g) ** 6
    importance = importance if along == "columns" else importance[:, None]
    bits = codec_search.importance_bits(math.prod(BlockGrid.of(scheme, x.shape).block))
    weights = codec_search.importance_weights(importance, tuple(x.shape), bits)
    loop, torch_passes = both_measures(x, scheme, weights)
    assert torch.equal(loop, torch_passes)


def test_one_large_block_is_measured_in_rows_that_add_up_to_the_whole():
    """A per-tensor scheme's block of more than `ROW` elements is shared out as rows (and a tail)."""
    scheme = PRESETS["q8s"].scheme
    x = hostile((3, search_loop.ROW + 77), seed=1)
    loop, torch_passes = both_measures(x, scheme, None)
    assert loop.shape == torch_passes.shape == (torch_passes.shape[0], 1, 1)
    assert torch.equal(loop, torch_passes)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_threads_share_the_blocks_without_changing_an_error(threads, monkeypatch):
    monkeypatch.setattr(search_loop, "ALONE", 0)
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        loop, torch_passes = both_measures(hostile((31, 256), seed=4), PRESETS["q4f-b32"].scheme, None)
    finally:
        torch.set_num_threads(previous)
    assert torch.equal(loop, torch_passes)


@pytest.mark.parametrize("preset", ["q4s-b32", "q4f-b32", "q2s-b32", "fp4-b32", "q8s", "e4m3-b32"])
def test_without_the_loop_the_search_writes_the_same_bytes(preset, monkeypatch):
    scheme = PRESETS[preset].scheme
    x = hostile((40, 256), seed=6)
    importance = torch.rand(256, generator=torch.Generator().manual_seed(2)) ** 4
    with_loop = encode(x, scheme, Calibration.Mse), encode(x, scheme, Calibration.Mse, importance=importance)
    monkeypatch.setattr(search_loop, "BUILT", False)
    without = encode(x, scheme, Calibration.Mse), encode(x, scheme, Calibration.Mse, importance=importance)
    assert torch.equal(with_loop[0], without[0]) and torch.equal(with_loop[1], without[1])
    if scheme.block is not None:  # the search chose scales of its own
        assert not torch.equal(with_loop[0], encode(x, scheme, Calibration.MinMax))


@pytest.mark.parametrize("scheme,calibration,shape", [case for case in all_schemes()
                                                      if case[1] is not Calibration.Mse],
                         ids=lambda case: str(case))
def test_the_compiled_codes_write_torchs_bytes(scheme, calibration, shape, monkeypatch):
    # Every value type's codes (`integer_codes`, `minifloat_codes`) against torch's passes without the
    # loop, on values over many binades with zero rows, in every store, block and scale dtype.
    x = hostile(shape, seed=7)
    with_loop = encode(x, scheme, calibration)
    monkeypatch.setattr(search_loop, "BUILT", False)
    assert torch.equal(with_loop, encode(x, scheme, calibration))


def test_the_compiled_integer_codes_take_blocks_in_the_tensors_own_order_only():
    # Rows of [32] blocks (and one per-tensor block) are the tensor's order; [2, 16] tiles and padded
    # edge blocks are not, and torch's passes take those.
    x = hostile((4, 64), seed=8)
    value = QuantValue.Q4S
    for block, taken in (([32], True), ([2, 16], False), ([48], False)):
        grid = BlockGrid.of(QuantScheme().with_value(value).per_block(block, ScaleDtype.F32), x.shape)
        effective = torch.ones(grid.grid)
        assert (search_loop.integer_codes(x, effective, grid, value) is not None) == taken, block
    grid = BlockGrid.of(QuantScheme().with_value(value).per_tensor(ScaleDtype.F32), x.shape)
    assert search_loop.integer_codes(x, torch.ones(grid.grid), grid, value) is not None
