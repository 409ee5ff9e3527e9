"""The scale search weighed by importance (llama.cpp's importance matrix): against a brute force in float64
over the candidates of the documented rule, the unweighted search it must equal under uniform importance,
the output error of a Linear it exists to lower, and the CPU pipeline's orientation of a transposed tensor."""

from __future__ import annotations

import math
import struct

import pytest
import torch

from qcli import layout
from qcli.codec import decode, encode
from qcli.codec import quantize as codec_quantize
from qcli.codec.search import importance_weights
from qcli.errors import InputError, UsageError
from qcli.presets import PRESETS
from qcli.scheme import Calibration, QuantScheme, QuantValue, ScaleDtype
from tests.kernel_support import fixed_plan
from tests.qfloat_reference import RANGE, f32, round_up

Mse = Calibration.Mse
CLIPS = [(32 - k) / 32 for k in range(1, 10)]  # docs/arithmetic.md §6: 31/32 down to 23/32
# docs/arithmetic.md §6 for blocks of 32 under importance: K = 12 bits of weight, J = 16 of error
WEIGHT_BITS, ERROR_BITS_32 = 12, 16


def f16_nearest(s: float) -> float:
    """s rounded to nearest (ties to even) onto float16, as Python's struct packs it."""
    return struct.unpack("<e", struct.pack("<e", s))[0]


def candidate_scales(amax: float, value: str) -> list[float]:
    """The documented candidates of a block of largest magnitude `amax` under F16 scales, in order: MinMax's
    scale, `raw * c` for each clip, and for an unequal range `amax / b`, `amax / -a` and the negative
    `c * amax / a` for c in 1 and the clips, each rounded to nearest (a zero becomes MinMax's)."""
    a, b = RANGE[value]
    raw = f32(amax / ((b - a) / 2))
    first = round_up(raw, "F16")
    tried = [f32(raw * c) for c in CLIPS]
    if -a != b:
        tried += [f32(amax / b), f32(amax / -a)] + [f32(f32(amax / a) * c) for c in (1.0, *CLIPS)]
    rounded = [math.copysign(f16_nearest(abs(s)), s) for s in tried]
    return [first] + [s if s != 0 else first for s in rounded]


def decoded(xs: list[float], s: float, value: str) -> list[float]:
    a, b = RANGE[value]
    return [f32(round(min(max(f32(x / s), a), b)) * s) if x != 0 else 0.0 for x in xs]


def skewed_weights(n: int, generator: torch.Generator) -> list[int]:
    """Integer weights in [1, 4096] over orders of magnitude, the largest exactly 4096, so that importance
    proportional to them is its own integer weight (K = 12)."""
    w = (4096 * torch.exp(-3 * torch.randn(n, generator=generator).abs())).round().clamp(1, 4096)
    w[int(w.argmax())] = 4096
    return [int(v) for v in w.tolist()]


def test_importance_becomes_integers_relative_to_the_largest_rounded_to_even():
    """Hand-worked at K = 12: v / 8 * 4096; 1.5 and 2.5 are ties that go to the even 2; anything below
    half a step, zero included, weighs 1; the largest 4096."""
    importance = torch.tensor([8.0, 4.0, 1.0, 0.0, 1e-4, 1.5 / 512, 2.5 / 512, 3.5 / 512, 7.99])
    got = importance_weights(importance, (3, 9), 12)
    assert got.shape == (1, 9)
    assert got.reshape(-1).tolist() == [4096, 2048, 512, 1, 1, 2, 2, 4, 4091]


@pytest.mark.parametrize("value", ["Q4F", "Q4S"])
def test_each_block_keeps_the_candidate_of_least_weighted_squared_error(value):
    """Brute force in float64 over the documented candidates; the codec's measure is the fixed-point one,
    whose rounding of each term (by at most |d| / u + 1/4 in units of 1/u^2, u = 2^(J - e)) may separate
    candidates only that close, so a block takes the brute force's best scale or one that close to it."""
    g = torch.Generator().manual_seed(7)
    rows, cols = 16, 256
    x = torch.randn(rows, cols, generator=g) * 0.02
    weights = skewed_weights(cols, g)
    importance = torch.tensor(weights, dtype=torch.float64) * 2.0**-7  # any power of two: the same weights
    scheme = QuantScheme().with_value(QuantValue(value)).per_block([32], ScaleDtype.F16)
    weighted, plain = (encode(x, scheme, Mse, importance=imp) for imp in (importance, None))
    start = layout.value_bytes(scheme, (rows, cols))
    stored = struct.unpack(f"<{rows * cols // 32}e", bytes(weighted[start:].tolist()))
    plain_stored = struct.unpack(f"<{rows * cols // 32}e", bytes(plain[start:].tolist()))
    matched = moved = 0
    for i, (got, unweighted_choice) in enumerate(zip(stored, plain_stored, strict=True)):
        r, c0 = divmod(i, cols // 32)
        xs = x[r, c0 * 32 : (c0 + 1) * 32].tolist()
        ws = weights[c0 * 32 : (c0 + 1) * 32]
        amax = max(abs(v) for v in xs)
        unit = 2.0 ** (ERROR_BITS_32 - (math.frexp(amax)[1] - 1))

        def measure(s, xs=xs, ws=ws, unit=unit):
            d = [xi - yi for xi, yi in zip(xs, decoded(xs, s, value), strict=True)]
            error = math.fsum(w * di * di for w, di in zip(ws, d, strict=True))
            slack = math.fsum(w * (abs(di) / unit + 1 / unit**2) for w, di in zip(ws, d, strict=True))
            return error, slack

        scales = candidate_scales(amax, value)
        assert got in scales
        best = min(scales, key=lambda s: measure(s)[0])
        (best_error, best_slack), (got_error, got_slack) = measure(best), measure(got)
        assert got == best or got_error <= best_error + best_slack + got_slack, (i, got, best)
        matched += got == best
        moved += best != unweighted_choice
    assert matched >= 0.95 * len(stored)
    assert moved >= 0.25 * len(stored)  # the weights do move choices: the brute force's differs from plain


@pytest.mark.parametrize("scheme", [PRESETS["q4s-b32"].scheme, PRESETS["q4f-b32"].scheme, PRESETS["q8s"].scheme,
                                    QuantScheme.nvfp4()], ids=["q4s-b32", "q4f-b32", "q8s", "nvfp4"])
@pytest.mark.parametrize("importance", [torch.full((512,), 0.37), torch.zeros(512), torch.full((64, 1), 5.0)],
                         ids=["uniform", "zero", "uniform-rows"])
def test_uniform_importance_gives_the_unweighted_bytes(scheme, importance):
    """Equal weights scale every candidate's error alike, but the weighted measure's coarser J would part
    near-ties otherwise than the unweighted one: this data holds such ties for q4f-b32 (8 bytes apart)."""
    x = torch.randn(64, 512, generator=torch.Generator().manual_seed(3)) * 0.03
    assert torch.equal(encode(x, scheme, Mse, importance=importance), encode(x, scheme, Mse))


@pytest.mark.parametrize("preset", ["q4s-b32", "q4f-b32", "fp4-b32"])
def test_on_a_linear_with_skewed_activations_the_weighted_search_lowers_the_output_error(preset):
    """importance = mean x^2 per input channel; ||X W^T - X Ŵ^T|| is what a layer's output feels."""
    scheme = PRESETS[preset].scheme
    ratios = []
    for seed in range(4):
        g = torch.Generator().manual_seed(seed)
        w = torch.randn(32, 256, generator=g) * 0.02
        x = torch.randn(256, 256, generator=g) * torch.exp(torch.randn(256, generator=g) * 1.5)
        importance = (x * x).mean(0)

        def output_error(payload, w=w, x=x):
            return (x.double() @ (w.double() - decode(payload, scheme, (32, 256)).double()).T).norm().item()

        weighted = output_error(encode(w, scheme, Mse, importance=importance))
        plain = output_error(encode(w, scheme, Mse))
        assert weighted <= plain, seed
        ratios.append(weighted / plain)
    assert sum(ratios) / len(ratios) < 0.8


@pytest.mark.parametrize("transposed", [False, True], ids=["as-is", "transposed"])
def test_chunking_and_threads_change_no_weighted_byte(monkeypatch, transposed):
    """Row chunks of the CPU codec take their rows' part of an importance along the first axis."""
    g = torch.Generator().manual_seed(8)
    x = torch.randn(96, 1024, generator=g) * 0.05
    importance = torch.exp(torch.randn(96 if transposed else 1024, generator=g) * 2)
    importance = importance.reshape(-1, 1) if transposed else importance
    for scheme in (PRESETS["q8s"].scheme, PRESETS["q4s-b32"].scheme):
        reference = encode(x, scheme, Mse, importance=importance)
        threads = torch.get_num_threads()
        try:
            for chunk, count in ((1 << 12, 1), (1 << 14, 2)):
                monkeypatch.setattr(codec_quantize, "CHUNK_ELEMENTS", chunk)
                torch.set_num_threads(count)
                assert torch.equal(encode(x, scheme, Mse, importance=importance), reference), (chunk, count)
        finally:
            torch.set_num_threads(threads)


def test_importance_that_does_not_fit_the_tensor_or_the_calibration_is_refused():
    x = torch.randn(8, 64)
    scheme = PRESETS["q4s-b32"].scheme
    with pytest.raises(InputError, match="'w'.*does not broadcast"):
        encode(x, scheme, Mse, name="w", importance=torch.ones(8))
    with pytest.raises(InputError, match="negative or non-finite"):
        encode(x, scheme, Mse, importance=torch.tensor([-1.0] + [1.0] * 63))
    with pytest.raises(InputError, match="negative or non-finite"):
        encode(x, scheme, Mse, importance=torch.tensor([math.nan] + [1.0] * 63))
    with pytest.raises(UsageError, match="Mse only"):
        encode(x, scheme, Calibration.MinMax, importance=torch.ones(64))


# ---- the CPU pipeline -----------------------------------------------------------------------------


def linear_checkpoint(tmp_path):
    """Linear weights [out, in] with one importance per input channel; two written transposed, under schemes
    whose blocks span several input channels there (two rows, or the whole tensor), so the orientation
    shows in the bytes."""
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(9)
    tensors = {
        "mlp.up.weight": torch.randn(48, 96, generator=g) * 0.02,
        "lm_head.weight": (torch.randn(96, 64, generator=g) * 0.02).to(torch.bfloat16),
        "attn.o.weight": torch.randn(40, 64, generator=g) * 0.02,
        "attn.q.weight": torch.randn(40, 64, generator=g) * 0.02,
        "norm.weight": torch.ones(96),
    }
    path = tmp_path / "model.safetensors"
    save_file(tensors, str(path))
    rows = QuantScheme().with_value(QuantValue.Q4S).per_block([2, 16], ScaleDtype.F16)
    decisions = {
        "mlp.up.weight": (PRESETS["q4s-b32"].scheme, Mse, False),
        "lm_head.weight": (rows, Mse, True),
        "attn.o.weight": (PRESETS["q8s"].scheme, Mse, True),
        "attn.q.weight": (PRESETS["q4s-b32"].scheme, Calibration.MinMax, False),  # no search: no importance
        "norm.weight": (None, Calibration.MinMax, False),
    }
    importance = {name: torch.exp(torch.randn(t.shape[-1], generator=g) * 2) for name, t in tensors.items()}
    return path, decisions, tensors, importance


def test_the_cpu_pipeline_weighs_each_element_by_its_input_channel_transposed_or_not(tmp_path):
    """Expected: `encode` of the tensor written with each element's own weight, the importance of its
    column in the source [out, in], as a full tensor transposed along with the weight."""
    from qcli.pipeline import cpu

    path, decisions, tensors, importance = linear_checkpoint(tmp_path)
    plan, source = fixed_plan(path, decisions)
    with source:
        got = {p.entry.info.name: bytes(p.data.numpy()) for p in cpu.run(plan, source, importance=importance)}
        plain = {p.entry.info.name: bytes(p.data.numpy()) for p in cpu.run(plan, source)}
    for name, (scheme, calibration, transpose) in decisions.items():
        if scheme is None or calibration is not Mse:
            assert got[name] == plain[name], name
            continue
        w = tensors[name]
        each = importance[name].expand(w.shape)  # element [o, i] weighs importance[i]
        if transpose:
            w, each = w.t(), each.t()
        want = bytes(encode(w, scheme, Mse, importance=each).numpy())
        assert got[name] == want, name
        assert got[name] != plain[name], name  # the importance took effect


def test_the_cpu_pipeline_refuses_an_importance_of_another_length(tmp_path):
    from qcli.pipeline import cpu

    path, decisions, _, importance = linear_checkpoint(tmp_path)
    plan, source = fixed_plan(path, decisions)
    importance["lm_head.weight"] = torch.ones(96)  # its output channels, not its 64 input channels
    with source, pytest.raises(InputError, match=r"'lm_head.weight' has shape \[96\], not \[64\]"):
        list(cpu.run(plan, source, importance=importance))
