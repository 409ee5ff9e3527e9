"""Measuring a payload where it is: the error statistics and the first block over its bound, whole or in
row slices, and through both pipelines.

Payloads and their decodes come from the independent pure-Python writer (tests/qfloat_reference.py);
the statistics expected are worked in numpy float64 from that decode; damaged blocks are found by hand
from the byte layout (docs/arithmetic.md §4).
"""

from __future__ import annotations

import math
import struct
from functools import partial

import numpy as np
import pytest
import torch

import qcli.codec
from qcli import layout, measure
from qcli.codec import search_loop
from qcli.error_stats import ErrorStats
from qcli.measure import Measurement, whole_range
from qcli.pipeline import GpuSettings
from qcli.presets import PRESETS
from qcli.scheme import Calibration, Native, PackedU32, QuantScheme, QuantValue, ScaleDtype, accept_problems
from tests import qfloat_reference as ref
from tests.kernel_support import checkpoint, fixed_plan

Q8_BLOCK = QuantScheme().with_value(QuantValue.Q8S).with_store(Native()).per_block([16], ScaleDtype.F32)
Q4_TILE = QuantScheme().with_value(QuantValue.Q4S).with_store(PackedU32(0)).per_block([4, 8], ScaleDtype.F16)
Q4_TENSOR = QuantScheme().with_value(QuantValue.Q4S).with_store(PackedU32(0)).per_tensor(ScaleDtype.F32)
E4M3_TENSOR = QuantScheme().with_value(QuantValue.E4M3).with_store(Native()).per_tensor(ScaleDtype.BF16)
NVFP4 = QuantScheme.nvfp4()

# (scheme, calibration, the reference writer's arguments)
CASES = {
    "q8s-block16-f32": (Q8_BLOCK, Calibration.MinMax, ("Q8S", "Native", [16], "F32", False)),
    "q4s-u32-block4x8-f16": (Q4_TILE, Calibration.MinMax, ("Q4S", "PackedU32", [4, 8], "F16", False)),
    "q4s-u32-tensor-minmax": (Q4_TENSOR, Calibration.MinMax, ("Q4S", "PackedU32", None, "F32", False)),
    "q4s-u32-tensor-absmean": (Q4_TENSOR, Calibration.AbsMean, ("Q4S", "PackedU32", None, "F32", False)),
    "e4m3-tensor-bf16": (E4M3_TENSOR, Calibration.MinMax, ("E4M3", "Native", None, "BF16", False)),
    "nvfp4": (NVFP4, Calibration.MinMax, ("E2M1", "PackedNative", [16], "UE4M3", True)),
}


def source(shape: tuple[int, ...], seed: int = 3) -> torch.Tensor:
    """Random f32 values whose rows span five orders of magnitude: a slice's own peak or mean is far from
    the tensor's, so a per-tensor bound taken from a slice alone would be wrong."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    rows = torch.tensor([10.0 ** (i % 5 - 2) for i in range(shape[0])]).reshape(-1, *[1] * (len(shape) - 1))
    return (x * rows).contiguous()


def reference(x: torch.Tensor, case: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(payload, decoded) of `x` by the reference writer."""
    _, calibration, (value, store, block, dtype, two_level) = CASES[case]
    payload, _, _, decoded, _ = ref.quantize(x.reshape(-1).tolist(), list(x.shape), value, store, block, dtype,
                                             two_level, calibration.value)
    data = torch.frombuffer(bytearray(payload), dtype=torch.uint8) if payload else torch.empty(0, dtype=torch.uint8)
    return data, torch.tensor(decoded, dtype=torch.float32).reshape(x.shape)


# The CPU pipeline sums a part's energies in f32 (`ErrorSums.add_difference`), and every difference is
# taken in f32: the statistics agree with a float64 reference to about 1e-7.
F32_SUMS = 1e-6


def assert_close(got: ErrorStats, want: ErrorStats, what: str = "") -> None:
    """Equal statistics but for that f32 rounding (the SQNR compared in dB, not relative to its size)."""
    assert (got.rel_rms, got.max_abs) == pytest.approx((want.rel_rms, want.max_abs), rel=F32_SUMS), what
    assert got.sqnr_db == pytest.approx(want.sqnr_db, abs=F32_SUMS * 10), what


def measured(x: torch.Tensor, payload: torch.Tensor, case: str) -> Measurement:
    scheme, calibration, _ = CASES[case]
    m = Measurement.on(x.device)
    m.add(x, payload, scheme, calibration)
    return m


def expected_stats(x: torch.Tensor, decoded: torch.Tensor) -> tuple[float, float, float]:
    a, b = x.double().numpy().reshape(-1), decoded.double().numpy().reshape(-1)
    signal, error = float(np.dot(a, a)), float(np.dot(b - a, b - a))
    return math.sqrt(error / signal), 10 * math.log10(signal / error), float(np.abs(b - a).max())


@pytest.fixture
def counted_decodes(monkeypatch) -> list[tuple[int, ...]]:
    """The shapes qcli.codec.decode is called with."""
    calls: list[tuple[int, ...]] = []
    real = qcli.codec.decode
    monkeypatch.setattr(qcli.codec, "decode", lambda p, s, shape: calls.append(tuple(shape)) or real(p, s, shape))
    return calls


@pytest.mark.parametrize("case", list(CASES))
def test_stats_are_those_of_the_reference_decode(case: str) -> None:
    x = source((8, 48))
    payload, decoded = reference(x, case)
    m = measured(x, payload, case)
    assert_close(m.stats(), ErrorStats(*expected_stats(x, decoded)))
    assert m.failure() is None


def test_special_cases_match_error_stats() -> None:
    # All-zero source: every scale is the smallest positive, every value 0, the decode exact.
    x = torch.zeros(4, 32)
    payload, _ = reference(x, "q8s-block16-f32")
    stats = measured(x, payload, "q8s-block16-f32").stats()
    assert (stats.rel_rms, stats.sqnr_db, stats.max_abs) == (0.0, math.inf, 0.0)
    # Zero source with a nonzero decode: no signal, some error.
    payload[0] = 5
    stats = measured(x, payload, "q8s-block16-f32").stats()
    assert stats.rel_rms == math.inf and stats.sqnr_db == -math.inf and stats.max_abs > 0


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("shape", [(40, 48), (6, 5, 16)], ids=["2d", "3d"])
def test_slices_measure_what_the_whole_tensor_does(case, shape, monkeypatch, counted_decodes) -> None:
    x = source(shape)
    payload, decoded = reference(x, case)
    whole = measured(x, payload, case)
    monkeypatch.setattr(measure, "SLICE_VALUES", 100)  # a slice of 1-2 rows, or the 4 rows of a [4, 8] block
    sliced = measured(x, payload, case)
    assert len(counted_decodes) > 1 + 4  # one whole decode, then several slices
    got, want = sliced.stats(), whole.stats()
    assert_close(got, want)
    assert got.max_abs == pytest.approx(expected_stats(x, decoded)[2], rel=F32_SUMS)
    assert sliced.failure() is None and whole.failure() is None


def encoded_and_measured(x: torch.Tensor, scheme: QuantScheme, calibration: Calibration
                         ) -> tuple[torch.Tensor, Measurement]:
    """The payload of `x` and its measurement as the CPU pipeline takes them, while the codec encodes."""
    m = Measurement.on("cpu")
    observer = m.measuring(x, scheme, calibration)
    payload = qcli.codec.encode(x, scheme, calibration, observer=observer)
    observer.finish()
    return payload, m


@pytest.mark.parametrize("loop", [True, False], ids=["codes", "decode"])
@pytest.mark.parametrize("case", list(CASES))
def test_the_cpu_pipeline_measures_the_reference_decode(case, loop, monkeypatch) -> None:
    # Measured from the codes in the compiled loop, or from the decode of every chunk without it: the same
    # payload as the reference writer's, the statistics of its decode (to the f32 rounding of the differences).
    if loop and not search_loop.BUILT:
        pytest.skip("the compiled loop is not built (no C compiler)")
    monkeypatch.setattr(search_loop, "BUILT", loop)
    scheme, calibration, _ = CASES[case]
    x = source((40, 48))
    payload, decoded = reference(x, case)
    got, m = encoded_and_measured(x, scheme, calibration)
    assert torch.equal(got, payload)
    assert_close(m.stats(), ErrorStats(*expected_stats(x, decoded)))
    assert m.failure() is None


@pytest.mark.skipif(not search_loop.BUILT, reason="the compiled loop is not built (no C compiler)")
@pytest.mark.parametrize("preset,calibration", [
    (name, calibration) for name, preset in PRESETS.items()
    for calibration in (Calibration.MinMax, Calibration.AbsMean, Calibration.Mse)
    if not accept_problems(preset.scheme, calibration)
])
def test_measuring_from_the_codes_gives_what_the_decode_does(preset, calibration) -> None:
    # Every preset, a bf16 tensor of rows five orders of magnitude apart, in several chunks: the compiled
    # loop's sums against a decode of the whole payload (`Measurement.add`, held to the reference writer
    # above): the largest error, the bound check and the range loss alike, the energies to f32 rounding.
    scheme = PRESETS[preset].scheme
    x = (source((1200, 512)) * 100).to(torch.bfloat16)
    payload, chunked = encoded_and_measured(x, scheme, calibration)
    decoded = Measurement.on("cpu")
    decoded.add(x, payload, scheme, calibration)
    assert_close(chunked.stats(), decoded.stats())
    assert chunked.stats().max_abs == decoded.stats().max_abs
    assert (chunked.failure(), chunked.range_loss()) == (decoded.failure(), decoded.range_loss())


@pytest.mark.skipif(not search_loop.BUILT, reason="the compiled loop is not built (no C compiler)")
def test_measuring_from_the_codes_sums_tiny_and_huge_values_in_float64() -> None:
    # Squares of 1e-30 underflow f32 and of 1e25 overflow it: the block is summed again in float64.
    scheme = PRESETS["q8s-b32"].scheme
    for magnitude in (1e-30, 1e25):
        x = source((64, 64)) / 100 * magnitude
        payload, chunked = encoded_and_measured(x, scheme, Calibration.MinMax)
        decoded = qcli.codec.decode(payload, scheme, x.shape).double()
        want = expected_stats(x.double(), decoded)
        got = chunked.stats()
        assert (got.rel_rms, got.max_abs) == pytest.approx(want[::2], rel=F32_SUMS), magnitude


def flip_value(payload: torch.Tensor, case: str, shape: tuple[int, int], row: int, col: int) -> None:
    """Flip the top bit of element (row, col)'s value field: 8 or more steps away."""
    if case == "q8s-block16-f32":  # one byte per value
        payload[row * shape[1] + col] ^= 0x80
    else:  # 4-bit fields, 8 to a little-endian u32 (or 2 to a byte), rows padded on their own, first low
        row_bytes = math.ceil(shape[1] / 8) * 4
        payload[row * row_bytes + col // 2] ^= 0x08 << (4 * (col % 2))


@pytest.mark.parametrize("sliced", [False, True], ids=["whole", "sliced"])
@pytest.mark.parametrize("case,block", [
    ("q8s-block16-f32", 23 * 3 + 37 // 16),       # blocks of 16 along rows of 48: 3 per row
    ("q4s-u32-block4x8-f16", 23 // 4 * 6 + 37 // 8),  # [4, 8] tiles of a 48-column matrix: 6 per row of tiles
    ("q4s-u32-tensor-minmax", 0),                   # one block
])
def test_a_damaged_value_is_reported_in_its_block(case, block, sliced, monkeypatch) -> None:
    shape = (40, 48)
    x = source(shape)
    x[23, 37] = x[20:24].abs().max() if case != "q4s-u32-tensor-minmax" else 0.5  # a field of 7, or 0
    payload, _ = reference(x, case)
    flip_value(payload, case, shape, 23, 37)
    if sliced:
        monkeypatch.setattr(measure, "SLICE_VALUES", 100)
    failure = measured(x, payload, case).failure()
    assert failure is not None and failure.block == block and failure.error > failure.bound


@pytest.mark.parametrize("sliced", [False, True], ids=["whole", "sliced"])
def test_a_nan_block_scale_of_nvfp4_is_reported_in_its_block(sliced, monkeypatch) -> None:
    # (40, 48) in [16] blocks: 3 per row; the UE4M3 scales follow 24 bytes of packed values per row.
    # Scale 0x7f is E4M3's NaN; the first block of the damaged ones is reported.
    x = source((40, 48))
    payload, _ = reference(x, "nvfp4")
    payload[40 * 24 + 31] = 0x7F
    payload[40 * 24 + 95] = 0x7F
    if sliced:
        monkeypatch.setattr(measure, "SLICE_VALUES", 100)
    failure = measured(x, payload, "nvfp4").failure()
    assert failure is not None and failure.block == 31 and math.isnan(failure.error)


def test_a_nan_global_scale_is_reported_in_the_first_block() -> None:
    x = source((8, 48))
    payload, _ = reference(x, "nvfp4")
    payload[-4:] = torch.frombuffer(bytearray(struct.pack("<f", math.nan)), dtype=torch.uint8)
    failure = measured(x, payload, "nvfp4").failure()
    assert failure is not None and failure.block == 0


@pytest.mark.parametrize("shape", [(), (7,), (0, 16)], ids=["scalar", "vector", "empty"])
def test_small_ranks_and_empty_tensors_are_measured_whole(shape, monkeypatch) -> None:
    monkeypatch.setattr(measure, "SLICE_VALUES", 1)
    x = torch.full(shape, 3.0) if shape else torch.tensor(-3.0)
    payload, decoded = reference(x.reshape(shape), "q8s-block16-f32")
    m = measured(x, payload, "q8s-block16-f32")
    assert m.failure() is None
    assert m.stats().max_abs == (float((decoded - x).abs().max()) if x.numel() else 0.0)


def test_whole_range_takes_peak_and_mean_over_all_rows(monkeypatch) -> None:
    monkeypatch.setattr(measure, "SLICE_VALUES", 4)
    x = torch.tensor([[1.0, -2.0], [0.5, 0.0], [-8.0, 4.0]], dtype=torch.bfloat16)
    whole = whole_range(x)
    assert whole.peak.tolist() == [8.0] and whole.count == 6 and whole.mean().tolist() == [15.5 / 6]
    halves = whole_range(x[:1]).add(whole_range(x[1:]))
    assert halves.peak.tolist() == [8.0] and halves.mean().tolist() == [15.5 / 6]


# ---- through the pipelines ------------------------------------------------------------------------


def _pipeline_measures(run, plan, source) -> list[tuple[str, object, object]]:
    return [(p.entry.info.name, None if p.measurement is None else p.measurement.stats(),
             None if p.measurement is None else p.measurement.failure()) for p in run(plan, source, measure=True)]


@pytest.mark.interpreter
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("settings", [GpuSettings(), GpuSettings(budget=6 << 10)], ids=["whole", "chunked"])
def test_gpu_pipeline_measures_what_the_cpu_pipeline_does(tmp_path, monkeypatch, settings) -> None:
    # The tiny budget splits every quantized tensor into row chunks of whole blocks (two passes for nvfp4
    # and the per-tensor AbsMean one); small slices split chunks further.
    from qcli.pipeline import cpu, gpu

    monkeypatch.setattr(measure, "SLICE_VALUES", 1000)
    path, decisions = checkpoint(tmp_path)
    plan, source = fixed_plan(path, decisions)
    with source:
        want = _pipeline_measures(cpu.run, plan, source)
        got = _pipeline_measures(partial(gpu.run, settings=settings), plan, source)
    assert [n for n, _, _ in got] == [n for n, _, _ in want]
    assert sum(stats is not None for _, stats, _ in got) == 5
    for (name, g, gf), (_, w, wf) in zip(got, want, strict=True):
        assert gf is None and wf is None, name
        if w is not None:
            assert_close(g, w, name)


def _scale_to_nan(out: torch.Tensor, scheme: QuantScheme, shape: tuple[int, ...]) -> None:
    """The payload's first stored scale as all ones bytes: NaN in every scale dtype, so its block decodes
    to NaN."""
    start = layout.value_bytes(scheme, shape)
    out[start : start + scheme.scale_dtype().scale_size()] = 0xFF


@pytest.mark.interpreter
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_gpu_pipeline_reports_a_damaged_payload(tmp_path, monkeypatch) -> None:
    from qcli.pipeline import gpu

    real = gpu.enqueue

    def enqueue(x, scheme, calibration, out, bad, whole=None, searched=None, **options):
        real(x, scheme, calibration, out, bad, whole=whole, searched=searched, **options)
        _scale_to_nan(out, scheme, tuple(x.shape))

    monkeypatch.setattr(gpu, "enqueue", enqueue)
    plan, source = fixed_plan(*checkpoint(tmp_path))
    with source:
        failures = [p.measurement.failure() for p in gpu.run(plan, source, measure=True, settings=GpuSettings())
                    if p.measurement is not None]
    assert len(failures) == 5 and all(f is not None and f.block == 0 and math.isnan(f.error) for f in failures)


@pytest.mark.interpreter
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_gpu_pipeline_reports_a_damaged_chunk_by_its_block_in_the_tensor(tmp_path, monkeypatch) -> None:
    # A tiny budget cuts each tensor (but the transposed lm_head) into row chunks; the second chunk of each
    # gets its first scale damaged. Its first block, counted in the whole tensor's block grid, is reported.
    from qcli.pipeline import gpu

    real = gpu.enqueue
    first_rows: dict[tuple, int] = {}  # per tensor, told apart by value type and dtype

    def enqueue(x, scheme, calibration, out, bad, whole=None, searched=None, **options):
        real(x, scheme, calibration, out, bad, whole=whole, searched=searched, **options)
        key = (scheme.value.name, x.dtype)
        if key in first_rows:
            if first_rows[key] >= 0:
                _scale_to_nan(out, scheme, tuple(x.shape))
                first_rows[key] = -first_rows[key]  # damage one chunk only
        else:
            first_rows[key] = x.shape[0]

    monkeypatch.setattr(gpu, "enqueue", enqueue)
    plan, source = fixed_plan(*checkpoint(tmp_path))
    with source:
        got = {p.entry.info.name: p.measurement.failure()
               for p in gpu.run(plan, source, measure=True, settings=GpuSettings(budget=6 << 10)) if p.measurement}
    embed, q = -first_rows["E2M1", torch.bfloat16], -first_rows["Q4S", torch.float32]
    assert embed > 0 and q > 0 and -first_rows["Q2F", torch.bfloat16] == 3
    assert first_rows["Q4S", torch.bfloat16] > 0  # lm_head is whole: nothing damaged
    assert {name: f and f.block for name, f in got.items()} == {
        "embed.weight": 6 * embed,  # [16] blocks: 6 to a row of 96
        "layers.0.attn.q.weight": 3 * q,  # [32] blocks: 3 to a row
        "layers.0.mlp.up.weight": 0,  # one block
        "layers.0.conv.weight": 8,  # [3, 1, 16] on [6, 4, 32]: 4 * 2 blocks to each 3 rows
        "lm_head.weight": None,
    }


@pytest.mark.parametrize("case", ["q4s-u32-block4x8-f16", "q4s-u32-tensor-absmean", "nvfp4"])
def test_measuring_reads_nothing_back_to_the_host(case, monkeypatch) -> None:
    # On a GPU any of these would wait for the device; here they are refused while measuring.
    x = source((40, 48))
    payload, _ = reference(x, case)
    m = Measurement.on("cpu")

    def refuse(*args, **kwargs):
        raise AssertionError("read back to the host while measuring")

    with monkeypatch.context() as patched:
        for name in ("item", "tolist", "__bool__", "__float__", "__int__", "__index__", "nonzero", "cpu", "numpy"):
            patched.setattr(torch.Tensor, name, refuse)
        patched.setattr(torch, "nonzero", refuse)
        patched.setattr(measure, "SLICE_VALUES", 100)
        m.add(x, payload, *CASES[case][:2])
    assert m.failure() is None


# ---- blocks whose scale leaves the scale dtype's range --------------------------------------------------
#
# Each source is built so that the blocks outside the range are known by construction: a block of
# values near 1e-9 needs a scale near 1e-10, far below F16's smallest (2^-24, 6e-8); one near 1e7 needs
# one near 1e6, far above F16's largest (65504); the other blocks need scales near 0.1. Nothing here
# depends on the half range's exact value (7 or 7.5 for Q4S, 127 or 127.5 for Q8S).

Q8_TENSOR_F16 = QuantScheme().with_value(QuantValue.Q8S).with_store(Native()).per_tensor(ScaleDtype.F16)


def _blocks_scaled(shape: tuple[int, int], block: tuple[int, int], factors: dict[tuple[int, int], float]
                   ) -> torch.Tensor:
    """Values in [0.5, 1) with random signs, the block at each key of `factors` multiplied by its value."""
    g = torch.Generator().manual_seed(11)
    x = (torch.rand(shape, generator=g) * 0.5 + 0.5) * torch.where(torch.rand(shape, generator=g) < 0.5, -1.0, 1.0)
    for (i, j), factor in factors.items():
        x[i * block[0] : (i + 1) * block[0], j * block[1] : (j + 1) * block[1]] *= factor
    return x.contiguous()


def _both_measures(x: torch.Tensor, scheme: QuantScheme, calibration: Calibration):
    """The range loss as the CPU pipeline measures it (while the codec encodes) and as the GPU pipeline's
    `Measurement.add` does from the payload, here on the CPU device."""
    chunked = Measurement.on("cpu")
    observer = chunked.measuring(x, scheme, calibration)
    payload = qcli.codec.encode(x, scheme, calibration, observer=observer)
    observer.finish()
    added = Measurement.on("cpu")
    added.add(x, payload, scheme, calibration)
    return payload, chunked.range_loss(), added.range_loss()


@pytest.mark.parametrize("sliced", [False, True], ids=["whole", "sliced"])
@pytest.mark.parametrize("calibration", [Calibration.MinMax, Calibration.AbsMean, Calibration.Mse])
def test_blocks_outside_f16_scales_are_counted_by_both_measures(calibration, sliced, monkeypatch) -> None:
    if sliced:
        monkeypatch.setattr(measure, "SLICE_VALUES", 64)  # two rows of blocks a slice
    x = _blocks_scaled((16, 32), (4, 8), {(0, 0): 1e-9, (2, 1): 1e-9, (3, 3): 1e7})
    payload, chunked, added = _both_measures(x, Q4_TILE, calibration)
    for loss in (chunked, added):
        assert (loss.scale_dtype, loss.blocks, loss.underflowed, loss.saturated) == (ScaleDtype.F16, 16, 2, 1)
        assert 1e-11 < loss.least < 2e-10 and 1e5 < loss.largest < 2e6
        assert loss.holders() == [ScaleDtype.BF16, ScaleDtype.F32]
        assert "a recipe rule's block_scale" in loss.problem("w", 0.0).hint
    # what the counts say, seen in the decode: the underflowed blocks are zeros, the saturated one clipped
    decoded = qcli.codec.decode(payload, Q4_TILE, tuple(x.shape))
    assert not decoded[0:4, 0:8].any() and not decoded[8:12, 8:16].any()
    assert decoded[12:16, 24:32].abs().max() <= 65504 * 8 < x[12:16, 24:32].abs().max()


def test_a_tensor_inside_its_scale_range_has_no_range_loss() -> None:
    x = _blocks_scaled((16, 32), (4, 8), {(0, 0): 1e-3, (3, 3): 1e3})  # scales of 1e-4 and 1e2 fit F16
    _, chunked, added = _both_measures(x, Q4_TILE, Calibration.MinMax)
    assert chunked is None and added is None
    zeros = torch.zeros(16, 32)  # a zero block needs no scale at all: it decodes exactly
    assert _both_measures(zeros, Q4_TILE, Calibration.MinMax)[1:] == (None, None)


def test_a_per_tensor_scale_is_one_block() -> None:
    x = _blocks_scaled((16, 32), (16, 32), {(0, 0): 1e-9})
    _, chunked, added = _both_measures(x, Q8_TENSOR_F16, Calibration.MinMax)
    for loss in (chunked, added):
        assert (loss.blocks, loss.underflowed, loss.saturated) == (1, 1, 0)
        assert "a recipe rule's tensor_scale" in loss.problem("w", 0.0).hint


def test_two_level_scales_are_judged_relative_to_the_global() -> None:
    # NVFP4: UE4M3 block scales under an f32 global set by the tensor's peak; a block 1e-7 of the peak needs
    # a relative scale near 1e-7 * 448, below UE4M3's smallest (2^-9); the global keeps any block from saturating.
    x = _blocks_scaled((4, 64), (1, 16), {(0, 0): 1e-7, (1, 1): 1e30})
    _, chunked, added = _both_measures(x, NVFP4, Calibration.MinMax)
    for loss in (chunked, added):
        assert (loss.scale_dtype, loss.blocks, loss.underflowed, loss.saturated) == (ScaleDtype.UE4M3, 16, 15, 0)
        assert loss.holders() == []  # 1e-30 of the global is beyond F16, and Burn takes nothing wider there
        assert "one-level scheme" in loss.problem("w", 0.0).hint
    x = _blocks_scaled((4, 64), (1, 16), {(0, 0): 1e-7})
    for loss in _both_measures(x, NVFP4, Calibration.MinMax)[1:]:
        assert (loss.blocks, loss.underflowed, loss.saturated) == (16, 1, 0)
        assert loss.holders() == [ScaleDtype.F16]  # F16 relative scales reach 2^-24
        assert "F16 scales" in loss.problem("w", 0.0).hint


@pytest.mark.interpreter
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_gpu_pipeline_counts_the_range_loss_the_cpu_pipeline_does(tmp_path) -> None:
    from safetensors.torch import save_file

    from qcli.pipeline import cpu, gpu
    from tests.kernel_support import fixed_plan

    path = tmp_path / "model.safetensors"
    save_file({"tiny.weight": _blocks_scaled((16, 64), (1, 32), {(0, 0): 1e-9, (5, 1): 1e-9}),
               "huge.weight": _blocks_scaled((16, 64), (1, 32), {(3, 0): 1e8}),
               "fine.weight": _blocks_scaled((16, 64), (1, 32), {})}, str(path))
    q4 = QuantScheme().with_value(QuantValue.Q4S).per_block([32], ScaleDtype.F16)
    plan, source = fixed_plan(path, {n: (q4, Calibration.MinMax, False) for n in ("tiny.weight", "huge.weight",
                                                                              "fine.weight")})

    def losses(run):
        return {p.entry.info.name: p.measurement.range_loss() for p in run(plan, source, measure=True)}

    with source:
        want = losses(cpu.run)
        got = losses(partial(gpu.run, settings=GpuSettings()))
    assert got == want
    assert (want["tiny.weight"].underflowed, want["huge.weight"].saturated, want["fine.weight"]) == (2, 1, None)
