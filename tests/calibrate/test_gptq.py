"""GPTQ (`qcli.calibrate.gptq`): its guarantee against plain MinMax quantization on correlated activations,
the payload decoding to exactly the values it propagated, round-to-nearest where the Hessian is diagonal,
the output error against explicit activations, and what a degenerate Hessian does."""

from __future__ import annotations

import math

import pytest
import torch

from qcli import layout
from qcli.calibrate.gptq import Hessian, gptq, output_error
from qcli.codec import decode, encode, pack, quantize_parts
from qcli.codec.values import from_fields
from qcli.errors import InputError, NonFiniteTensor
from qcli.presets import PRESETS
from qcli.scheme import Calibration, Native, PackedU32, QuantScheme, QuantValue, ScaleDtype

OUT, IN, TOKENS = 64, 128, 512


def blocked(value: QuantValue, block: list[int], dtype: ScaleDtype = ScaleDtype.F16) -> QuantScheme:
    return QuantScheme().with_value(value).with_store(PackedU32(0)).per_block(block, dtype)


SCHEMES = {
    "q4s-b32": PRESETS["q4s-b32"].scheme,
    "q8s": PRESETS["q8s"].scheme,  # per tensor
    "q2s-b32": PRESETS["q2s-b32"].scheme,
    "fp4-b32": PRESETS["fp4-b32"].scheme,  # E2M1
    "q4f-b32": PRESETS["q4f-b32"].scheme,
    "e4m3": PRESETS["e4m3"].scheme,
    "nvfp4": QuantScheme.nvfp4(),  # two levels, UE4M3 under an f32 global
    "q4s-b32-global": PRESETS["q4s-b32"].scheme.per_tensor(ScaleDtype.F32),  # two levels, F16
    "q4s-4x32": blocked(QuantValue.Q4S, [4, 32]),  # a rank-2 block
    "q4s-b48": blocked(QuantValue.Q4S, [48]),  # partial blocks at the edge
    "q8s-b255-native": QuantScheme().with_value(QuantValue.Q8S).with_store(Native()).per_block([255], ScaleDtype.F16),
}


def generator() -> torch.Generator:
    return torch.Generator().manual_seed(25)


def correlated_activations(tokens: int = TOKENS, columns: int = IN) -> torch.Tensor:
    """X = Z A for Gaussian Z and a mixing A of decaying singular values e^(-k/16) along random directions:
    inputs correlated as a layer's are, which is where spreading the error beats rounding each weight."""
    g = generator()
    directions, _ = torch.linalg.qr(torch.randn(columns, columns, generator=g))
    mixing = torch.exp(-torch.arange(columns) / 16.0)[:, None] * directions
    return torch.randn(tokens, columns, generator=g) @ mixing


def weight(rows: int = OUT, columns: int = IN) -> torch.Tensor:
    return torch.randn(rows, columns, generator=torch.Generator().manual_seed(7))


def hessian_of(x: torch.Tensor) -> torch.Tensor:
    accumulated = Hessian(x.shape[-1])
    accumulated.add(x)
    return accumulated.matrix


def written(w: torch.Tensor, transpose: bool) -> torch.Tensor:
    return w.T.contiguous() if transpose else w


def round_to_nearest(w: torch.Tensor, scheme: QuantScheme, transpose: bool,
                     calibration: Calibration = Calibration.MinMax) -> torch.Tensor:
    """The codec's own quantization of the written tensor, decoded, on W's axes."""
    x = written(w, transpose)
    decoded = decode(encode(x, scheme, calibration), scheme, x.shape)
    return decoded.T if transpose else decoded


def bits(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view(torch.int32)


@pytest.mark.parametrize("search", [False, True], ids=["minmax", "mse"])
@pytest.mark.parametrize("transpose", [False, True], ids=["written", "transposed"])
@pytest.mark.parametrize("name", ["q4s-b32", "q8s", "q2s-b32", "fp4-b32"])
def test_gptq_errs_clearly_less_than_round_to_nearest_on_correlated_activations(name, transpose, search):
    """GPTQ's point: on correlated inputs the output error ||X Wᵀ - X Ŵᵀ|| falls well below that of
    rounding each weight to nearest with the same scheme (the codec's encode, MinMax or the Mse search)."""
    w, x = weight(), correlated_activations()
    h = hessian_of(x)
    scheme = SCHEMES[name]
    calibration = Calibration.Mse if search else Calibration.MinMax
    result = gptq(w, h, scheme, transpose=transpose, search=search)
    plain = output_error(w, round_to_nearest(w, scheme, transpose, calibration), h)
    assert result.error < 0.8 * plain


@pytest.mark.parametrize("transpose", [False, True], ids=["written", "transposed"])
@pytest.mark.parametrize("name", list(SCHEMES))
def test_the_payload_decodes_to_exactly_the_dequantized_weight(name, transpose):
    """pack(parts) read back by the codec's decoder is `dequantized` bit for bit, the scales have the
    payload's grid, and every field lies in its value type's range (a minifloat code decodes finite). The
    weight is 60 x 72, so rows pack into partial words and blocks either way round. The searched scales
    (their effective scale formed as the codec's search forms it) are checked written as W only, where
    the search is faster."""
    w, x = weight(60, 72), correlated_activations(columns=72)
    scheme = SCHEMES[name]
    for search in (False,) if transpose else (False, True):
        result = gptq(w, hessian_of(x), scheme, transpose=transpose, search=search, block_size=48)
        shape = written(w, transpose).shape
        assert list(result.parts.scales.shape) == layout.params_shape(scheme, shape)
        assert (result.parts.global_scale is not None) == scheme.is_two_level()
        decoded = decode(pack(result.parts, scheme, shape), scheme, shape)
        assert torch.equal(bits(decoded), bits(written(result.dequantized, transpose)))
        fields = result.parts.fields
        if scheme.value.is_minifloat():
            assert 0 <= int(fields.min()) and int(fields.max()) < 1 << scheme.value.size_bits()
            assert bool(torch.isfinite(from_fields(fields, scheme.value)).all())
        else:
            low, high = scheme.value.range()
            assert low <= int(fields.min()) and int(fields.max()) <= high


@pytest.mark.parametrize("search", [False, True], ids=["minmax", "mse"])
@pytest.mark.parametrize("transpose", [False, True], ids=["written", "transposed"])
@pytest.mark.parametrize("name", ["q4s-b32", "q8s", "nvfp4", "q4s-4x32", "q4s-b48"])
def test_a_diagonal_hessian_gives_round_to_nearest(name, transpose, search):
    """With H diagonal, U is diagonal and no error spreads: every block's current weights are the original
    ones, and GPTQ is the codec's plain quantization, field for field and scale for scale. H = I undampened,
    and (MinMax) a random positive diagonal with the default 1 % dampening, still diagonal."""
    w, scheme = weight(OUT, 72), SCHEMES[name]
    calibration = Calibration.Mse if search else Calibration.MinMax
    expected = quantize_parts(written(w, transpose), scheme, calibration)
    hessians = [(torch.eye(72, dtype=torch.float64), 0.0)]
    if not search:
        hessians.append((torch.diag(torch.rand(72, generator=generator(), dtype=torch.float64) + 0.5), 0.01))
    for h, damp in hessians:
        parts = gptq(w, h, scheme, transpose=transpose, search=search, damp=damp).parts
        assert torch.equal(parts.fields, expected.fields)
        assert torch.equal(bits(parts.scales), bits(expected.scales))
        assert parts.global_scale == expected.global_scale


@pytest.mark.parametrize("transpose", [False, True], ids=["written", "transposed"])
@pytest.mark.parametrize("name", ["q4s-b32", "q2s-b32"])
def test_the_blocks_search_weighs_each_column_by_its_importance_as_the_codecs_search_does(name, transpose):
    """With H = I no error spreads, so the search over each block's current weights is the codec's weighted
    search over the original weight (qcli.codec.search, itself held to a brute force), with the columns'
    importance. Each group of 32 columns holds the largest importance once, so that the weights, scaled to
    a group's largest in GPTQ and to the tensor's in the codec, are the same integers. Where W is written,
    a block spans 32 columns and the weighing changes the bytes, so it is not ignored; written transposed,
    a block lies in one column, whose one weight changes no block's choice."""
    w, scheme = weight(OUT, 96), SCHEMES[name]
    importance = torch.rand(96, generator=generator(), dtype=torch.float64) ** 4 + 1e-3
    importance[::32] = 2.0
    shape = tuple(written(w, transpose).shape)
    found = gptq(w, torch.eye(96, dtype=torch.float64), scheme, transpose=transpose, search=True,
                 importance=importance, damp=0.0).parts
    along = importance[:, None] if transpose else importance
    expected = encode(written(w, transpose), scheme, Calibration.Mse, importance=along)
    assert torch.equal(pack(found, scheme, shape), expected)
    assert torch.equal(expected, encode(written(w, transpose), scheme, Calibration.Mse)) == transpose


def test_a_blocks_scale_is_measured_on_its_current_weights_by_hand():
    """Q2S (fields -1, 0, 1; scale = amax) in blocks of two with F32 scales, and H = [[2, 0, -1, 0], [0, 1, 0,
    0], [-1, 0, 1, 0], [0, 0, 0, 1]], whose inverse [[1, 0, 1, 0], [0, 1, 0, 0], [1, 0, 2, 0], [0, 0, 0, 1]]
    has the upper Cholesky factor U = I + (row 0, column 2): column 0's error e_0 = w_0 - q_0 moves whole
    into w_2, and nothing else spreads. W = [0.375, 1, 0.125, 0.1875]: the first block's scale is 1, q_0 =
    round(0.375) = 0, q_1 = 1, and w_2 becomes 0.125 - 0.375 = -0.25. The second block's scale is its
    current amax 0.25 (not the original 0.1875), so w_2 = -0.25 is exact (q = -1) and 0.1875 / 0.25 = 0.75
    rounds to q = 1: Ŵ = [0, 1, -0.25, 0.25]."""
    h = torch.tensor([[2, 0, -1, 0], [0, 1, 0, 0], [-1, 0, 1, 0], [0, 0, 0, 1]], dtype=torch.float64)
    result = gptq(torch.tensor([[0.375, 1.0, 0.125, 0.1875]]), h, blocked(QuantValue.Q2S, [2], ScaleDtype.F32),
                  damp=0.0)
    assert result.parts.fields.tolist() == [[0, 1, -1, 1]]
    assert result.parts.scales.tolist() == [[1.0, 0.25]]
    assert result.dequantized.tolist() == [[0.0, 1.0, -0.25, 0.25]]


@pytest.mark.parametrize("transpose", [False, True], ids=["written", "transposed"])
def test_scaling_the_hessian_changes_nothing(transpose):
    """GPTQ depends on H only up to a factor (a sum of x xᵀ or the reference implementations' mean 2/n Σ x xᵀ
    alike): H scaled by 4^k scales its Cholesky factors by 2^k exactly, U by 2^-k, each error by 2^k and
    each update not at all, so the fields and scales stay the same bit for bit."""
    w, h, scheme = weight(), hessian_of(correlated_activations()), SCHEMES["q4s-b32"]
    expected = gptq(w, h, scheme, transpose=transpose).parts
    for factor in (4.0, 1 / 1024):
        parts = gptq(w, h * factor, scheme, transpose=transpose).parts
        assert torch.equal(parts.fields, expected.fields)
        assert torch.equal(bits(parts.scales), bits(expected.scales))


def test_output_error_by_hand():
    """W = [1, 0], Ŵ = [1, 1], H = diag(1, 4): tr(ΔW H ΔWᵀ) = 4, tr(W H Wᵀ) = 1, error sqrt(4 / 1) = 2."""
    h = torch.diag(torch.tensor([1.0, 4.0], dtype=torch.float64))
    assert output_error(torch.tensor([[1.0, 0.0]]), torch.tensor([[1.0, 1.0]]), h) == 2.0
    assert output_error(torch.tensor([[1.0, 0.0]]), torch.tensor([[1.0, 0.0]]), h) == 0.0


def test_output_error_is_the_relative_error_of_the_layer_output_on_the_tokens():
    """Against ||X Wᵀ - X Ŵᵀ|| / ||X Wᵀ|| computed with X itself in float64, for a perturbed weight and for
    GPTQ's own result."""
    w, x = weight(), correlated_activations(300)
    h = hessian_of(x)
    x64, w64 = x.double(), w.double()

    def direct(dequantized: torch.Tensor) -> float:
        return float(torch.linalg.norm(x64 @ (w64 - dequantized.double()).T) / torch.linalg.norm(x64 @ w64.T))

    perturbed = w + 0.01 * torch.randn(w.shape, generator=generator())
    assert output_error(w, perturbed, h) == pytest.approx(direct(perturbed), rel=1e-9)
    result = gptq(w, h, SCHEMES["q4s-b32"])
    assert result.error == pytest.approx(direct(result.dequantized), rel=1e-9)


def test_the_hessian_sums_x_xt_over_every_token_of_every_batch():
    x = torch.randn(3, 100, 16, generator=generator())
    accumulated = Hessian(16)
    accumulated.add(x[:2])
    accumulated.add(x[2])
    tokens = x.reshape(-1, 16).double()
    assert accumulated.tokens == 300
    torch.testing.assert_close(accumulated.matrix, tokens.T @ tokens, rtol=1e-12, atol=0)


@pytest.mark.parametrize("transpose", [False, True], ids=["written", "transposed"])
def test_dead_inputs_are_quantized_to_zero_and_the_rest_still_gains(transpose):
    """Inputs zero on every token (H_jj = 0) contribute nothing: their columns come out zero, and the
    others still err less than round-to-nearest."""
    w, x = weight(), correlated_activations()
    dead = [0, 3, 50, 51, 127]
    x[:, dead] = 0.0
    h = hessian_of(x)
    scheme = SCHEMES["q4s-b32"]
    result = gptq(w, h, scheme, transpose=transpose)
    assert not bool(result.dequantized[:, dead].any())
    assert result.error < 0.8 * output_error(w, round_to_nearest(w, scheme, transpose), h)


def test_a_two_level_global_is_the_codecs_even_where_the_peak_is_in_a_dead_input():
    """The global scale is fixed from the original weight, as the codec fixes it, though the dead column
    holding the weight's largest value is zeroed."""
    w, x = weight(), correlated_activations()
    w[9, 3] = 20.0
    x[:, 3] = 0.0
    scheme = SCHEMES["nvfp4"]
    result = gptq(w, hessian_of(x), scheme)
    assert result.parts.global_scale == quantize_parts(w, scheme).global_scale


def test_no_calibration_token_at_all_zeroes_the_weight():
    result = gptq(weight(), torch.zeros(IN, IN, dtype=torch.float64), SCHEMES["q4s-b32"])
    assert not bool(result.dequantized.any()) and result.error == 0.0


def test_a_singular_hessian_is_dampened_further():
    """Every token x = (1, ..., 1): H = 1 1ᵀ has rank 1, so undampened its Cholesky meets a zero pivot
    (1 - 1·1) and fails; the retry at 1 % succeeds, and the layer's output (the row sums of W) errs less
    than round-to-nearest's."""
    w, h = weight(), torch.ones(IN, IN, dtype=torch.float64)
    scheme = SCHEMES["q4s-b32"]
    result = gptq(w, h, scheme, damp=0.0)
    assert result.damp == 0.01
    assert result.error < output_error(w, round_to_nearest(w, scheme, False), h)


def test_a_hessian_no_dampening_makes_positive_definite_is_refused():
    with pytest.raises(InputError, match="not positive definite"):
        gptq(weight(), -torch.eye(IN, dtype=torch.float64), SCHEMES["q4s-b32"])
    nan = torch.eye(IN, dtype=torch.float64)
    nan[1, 2] = math.nan
    with pytest.raises(InputError, match="NaN or Inf"):
        gptq(weight(), nan, SCHEMES["q4s-b32"])
    w = weight()
    w[5, 5] = math.inf
    with pytest.raises(NonFiniteTensor):
        gptq(w, torch.eye(IN, dtype=torch.float64), SCHEMES["q4s-b32"], name="w")


def test_the_same_inputs_give_the_same_bytes():
    w, h, scheme = weight(), hessian_of(correlated_activations()), SCHEMES["fp4-b32"]
    first, second = (gptq(w, h, scheme, search=True) for _ in range(2))
    shape = w.shape
    assert torch.equal(pack(first.parts, scheme, shape), pack(second.parts, scheme, shape))
    assert torch.equal(bits(first.dequantized), bits(second.dequantized))


@pytest.mark.parametrize("transpose", [False, True], ids=["written", "transposed"])
@pytest.mark.parametrize("name", ["q4s-b48", "q4s-4x32", "q8s-b255-native"])
def test_lazy_blocks_do_not_change_the_result(name, transpose):
    """Lazy batching only reorders the updates (exact arithmetic gives the same W), so lazy blocks of 40 and
    128 columns, where a group of columns may run past the lazy block's end, give the fields and scales of
    lazy blocks of one column, whose every update is done before the next column: equal but for f32's
    rounding of the reordered sums, which may flip a rare field or scale (how rare depends on the machine's
    f32 matrix products: on an H200 host's CPU one of q4s-4x32's 64 scales flipped)."""
    w, h, scheme = weight(), hessian_of(correlated_activations()), SCHEMES[name]
    one = gptq(w, h, scheme, transpose=transpose, block_size=1)
    for block_size in (40, 128):
        lazy = gptq(w, h, scheme, transpose=transpose, block_size=block_size)
        for part in ("fields", "scales"):
            differ = int((getattr(lazy.parts, part) != getattr(one.parts, part)).sum())
            assert differ <= max(1, getattr(one.parts, part).numel() // 100), (part, differ)
        assert lazy.error == pytest.approx(one.error, rel=1e-3)


@pytest.mark.interpreter
@pytest.mark.parametrize(("name", "search", "weighed"), [
    ("q4s-b32", True, True), ("q4f-b32", True, False), ("fp4-b32", False, False), ("q8s-b32", True, True),
    ("q4s-b32-global", True, True), ("nvfp4", True, False)])
def test_the_column_kernel_takes_the_torch_loops_steps(device, name, search, weighed, monkeypatch):
    """GPTQ's column loop in one kernel a lazy block (`qcli.kernels.gptq`), against the torch loop on the same
    device, over 200 columns (a lazy block of 128 and one of 72, whose last group has 8 columns) and 40 rows:
    bit for bit where the kernel is interpreted on the CPU, whose torch rounds each update's product and
    difference apart as the kernel does; on CUDA, where torch may fuse them, as good a layer."""
    from qcli.calibrate import gptq as module
    from qcli.kernels import gptq as kernel

    scheme = PRESETS[name].scheme if name in PRESETS else SCHEMES[name]
    rows, columns = 40, 200
    assert kernel.takes(scheme, (rows, columns), False, 128)
    x = correlated_activations(columns=columns)
    h = hessian_of(x)
    w = weight(rows, columns).to(device)
    importance = torch.diagonal(h) / x.shape[0] if weighed else None
    u = module._inverse_factor(h.to(device), 0.01, name)[0].to(torch.float32)
    peak = w.abs().amax()
    in_kernel = module.columns_in_kernel(w.clone(), u, scheme, search, peak, 128, importance)
    monkeypatch.setattr(kernel, "takes", lambda *_: False)  # on CUDA, the torch loop where the kernel would run
    torch_loop = module._columns(w.clone(), u, scheme, False, search, peak, 128, importance)
    assert torch_loop[3] == in_kernel[3]  # the two-level global
    if device == "cpu":
        for loop_part, kernel_part in zip(torch_loop[:3], in_kernel[:3], strict=True):
            assert torch.equal(loop_part, kernel_part)
    else:
        errors = [output_error(w.cpu(), part[1].cpu(), h) for part in (torch_loop, in_kernel)]
        assert errors[1] == pytest.approx(errors[0], rel=0.01)
    assert bool((in_kernel[0] != 0).any())
