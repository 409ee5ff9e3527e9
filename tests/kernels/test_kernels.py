"""The Triton kernels write the same payload bytes as the CPU codec, for every scheme Burn accepts.

Marker `interpreter`: small shapes, on CUDA tensors or, under `--device cpu` (the default where there is
no GPU; tests/conftest.py), on CPU tensors with TRITON_INTERPRET=1. Marker `gpu`: large shapes, only under
`--device cuda`. Expectations come from the CPU codec
(`qcli.codec.encode`) and, for the hand-worked cases, from Burn's literals and the spec's worked example
(tests/data/burn-vectors.json) or arithmetic done by hand in the comments.
"""

from __future__ import annotations

import logging
import struct
from functools import partial

import numpy as np
import pytest
import torch

from qcli import layout
from qcli.codec import encode as codec_encode
from qcli.errors import InputError, NonFiniteTensor, NotFloatTensor, NotKernelFloat, SchemeError, UsageError
from qcli.pipeline import GpuSettings
from qcli.pipeline.device import select_pipeline
from qcli.scheme import (
    Calibration,
    Native,
    PackedNative,
    QuantScheme,
    QuantValue,
    ScaleDtype,
    accept_problems,
)
from tests.burn_facts import VECTORS
from tests.cases import all_schemes
from tests.kernel_support import checkpoint, fixed_plan, wide

POISON = 0xA5
CASES = all_schemes()
# The interpreter computes every lane with numpy, masked-off and discarded ones too, which warns.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


@pytest.fixture
def payload(kernels, device):
    """The kernels' payload of a tensor, written on the device into a poisoned buffer, so an unwritten
    byte cannot pass for a zero."""

    def write(x: torch.Tensor, scheme: QuantScheme, calibration=Calibration.MinMax) -> bytes:
        x = x.to(device)
        out = torch.full((layout.quantized_data_len(scheme, tuple(x.shape)),), POISON, dtype=torch.uint8,
                         device=device)
        bad = torch.zeros(1, dtype=torch.int32, device=device)
        kernels.enqueue(x, scheme, calibration, out, bad)
        assert int(bad.item()) == 0
        return out.cpu().numpy().tobytes()

    return write


def expected(x: torch.Tensor, scheme: QuantScheme, calibration=Calibration.MinMax) -> bytes:
    return codec_encode(x.cpu(), scheme, calibration).numpy().tobytes()


def assert_same(got: bytes, want: bytes) -> None:
    if got != want:
        a, b = np.frombuffer(got, np.uint8), np.frombuffer(want, np.uint8)
        diff = np.nonzero(a != b)[0]
        pytest.fail(f"{len(diff)} of {len(b)} bytes differ, first at {diff[:6].tolist()}: "
                    f"got {a[diff[:6]].tolist()}, want {b[diff[:6]].tolist()}")


def case_id(case) -> str:
    scheme, calibration, shape = case
    return f"{scheme}-{calibration.value}-{'x'.join(map(str, shape))}".replace(" ", "_")


# ---- byte-identity with the codec on random data --------------------------------------------------


def _ue8m0_cases() -> list[tuple[QuantScheme, Calibration, tuple[int, ...]]]:
    """UE8M0 scales (Burn 0.22.1), one level only, shaped like the cases of tests/cases.py (which hold every
    value in fused blocks of 32 under every scale dtype): MXFP4 (E2M1 pairs in blocks of 32), per tensor,
    and blocks the fused kernel cannot take."""
    ue8m0 = ScaleDtype.UE8M0
    e2m1 = QuantScheme().with_value(QuantValue.E2M1).with_store(PackedNative(0))
    cases = [
        (e2m1.per_block([32], ue8m0), Calibration.MinMax, (4, 48)),
        (e2m1.per_block([5], ue8m0), Calibration.AbsMean, (3, 13)),
        (QuantScheme().with_value(QuantValue.Q4S).per_tensor(ue8m0), Calibration.AbsMean, (5, 37)),
        (QuantScheme().with_value(QuantValue.E4M3).with_store(Native()).per_tensor(ue8m0), Calibration.MinMax,
         (7, 9)),
        (QuantScheme().with_value(QuantValue.Q8S).with_store(Native()).per_block([2, 16], ue8m0),
         Calibration.MinMax, (3, 5, 48)),
        (QuantScheme().with_value(QuantValue.Q2F).per_block([3, 16], ue8m0), Calibration.AbsMean, (7, 2, 19)),
    ]
    return cases


UE8M0_CASES = _ue8m0_cases()


@pytest.mark.interpreter
@pytest.mark.parametrize("case", CASES + UE8M0_CASES, ids=[case_id(c) for c in CASES + UE8M0_CASES])
def test_random_data_matches_codec(payload, case):
    scheme, calibration, shape = case
    for seed, dtype in enumerate((torch.float32, torch.bfloat16)):
        x = wide(shape, seed).to(dtype)
        assert_same(payload(x, scheme, calibration), expected(x, scheme, calibration))


# Shapes that fill every program's tile (4096 values), so the kernels take their unmasked path; the
# cases above all end in a partial tile.
WHOLE_TILES = [
    (QuantScheme().with_value(QuantValue.Q4S).per_block([32], ScaleDtype.F16), Calibration.MinMax),
    (QuantScheme().with_value(QuantValue.Q8S).per_block([32], ScaleDtype.BF16), Calibration.AbsMean),
    (QuantScheme.nvfp4(), Calibration.MinMax),
    (QuantScheme().with_value(QuantValue.E4M3).with_store(Native()).per_block([32], ScaleDtype.UE4M3),
     Calibration.MinMax),
    (QuantScheme().with_value(QuantValue.Q4S).per_block([4, 32], ScaleDtype.BF16), Calibration.MinMax),
    (QuantScheme().with_value(QuantValue.Q8S), Calibration.MinMax),
    (QuantScheme().with_value(QuantValue.E5M2).with_store(Native()).per_tensor(ScaleDtype.F16),
     Calibration.AbsMean),
    (QuantScheme().with_value(QuantValue.E2M1).with_store(PackedNative(0)).per_block([32], ScaleDtype.UE8M0),
     Calibration.MinMax),
    (QuantScheme().with_value(QuantValue.Q8S).per_tensor(ScaleDtype.UE8M0), Calibration.AbsMean),
]


@pytest.mark.interpreter
@pytest.mark.parametrize("case", WHOLE_TILES, ids=[case_id((*c, (4, 4096))) for c in WHOLE_TILES])
def test_whole_tiles_match_codec(payload, case):
    scheme, calibration = case
    x = wide((4, 4096), 11).to(torch.bfloat16)
    assert_same(payload(x, scheme, calibration), expected(x, scheme, calibration))


HALF_SCHEMES = [c for c in CASES if c[0].value in (QuantValue.Q4S, QuantValue.E2M1)]


@pytest.mark.interpreter
@pytest.mark.parametrize("case", HALF_SCHEMES, ids=[case_id(c) for c in HALF_SCHEMES])
def test_float16_input_matches_codec(payload, case):
    scheme, calibration, shape = case
    x = wide(shape, 7).clamp(-6e4, 6e4).to(torch.float16)  # inside float16's range
    assert_same(payload(x, scheme, calibration), expected(x, scheme, calibration))


SPECIAL = [
    # (name, transform of wide data): subnormal inputs and scales, scales past every dtype's max,
    # values on the half-integer grid of an exact scale (ties), and blocks of zeros among random ones.
    ("subnormal", lambda x: x * 1e-41),
    ("tiny", lambda x: x * 1e-36),
    ("saturating", lambda x: x * 1e33),
    ("huge", lambda x: x / x.abs().max() * 3e38),  # scales past 2^125, for schemes of a small half range
    ("ties", lambda x: torch.round(torch.clamp(x, -6, 6) * 2) / 2 + torch.where(x > 0, 0.5, -0.5)),
    ("zero_blocks", lambda x: x * (torch.arange(x.numel()).reshape(x.shape) % 96 < 48)),
]
SPECIAL_SCHEMES = [
    (QuantScheme().with_value(QuantValue.Q4S).per_block([16], ScaleDtype.F16), Calibration.MinMax, (4, 96)),
    (QuantScheme().with_value(QuantValue.Q8S).with_store(Native()).per_block([8], ScaleDtype.UE4M3),
     Calibration.MinMax, (3, 96)),
    (QuantScheme().with_value(QuantValue.Q2F).per_block([2, 16], ScaleDtype.BF16), Calibration.AbsMean,
     (5, 96)),
    (QuantScheme.nvfp4(), Calibration.MinMax, (4, 96)),
    (QuantScheme().with_value(QuantValue.Q4F).per_block([32], ScaleDtype.BF16), Calibration.MinMax, (3, 96)),
    (QuantScheme().with_value(QuantValue.Q2S).per_block([16], ScaleDtype.F32), Calibration.MinMax, (3, 96)),
    (QuantScheme().with_value(QuantValue.E5M2).with_store(Native()), Calibration.MinMax, (3, 96)),
    (QuantScheme().with_value(QuantValue.E4M3).per_tensor(ScaleDtype.F16), Calibration.AbsMean, (3, 96)),
    # UE8M0 reaches 2^-127 (subnormal in f32) and 2^127: its scales take the rescaled division at both ends
    (QuantScheme().with_value(QuantValue.Q2S).per_block([16], ScaleDtype.UE8M0), Calibration.MinMax, (3, 96)),
    (QuantScheme().with_value(QuantValue.Q8S).with_store(Native()).per_block([2, 8], ScaleDtype.UE8M0),
     Calibration.AbsMean, (5, 96)),
    (QuantScheme().with_value(QuantValue.E2M1).with_store(PackedNative(0)).per_block([32], ScaleDtype.UE8M0),
     Calibration.MinMax, (4, 96)),
    (QuantScheme().with_value(QuantValue.Q4F).per_tensor(ScaleDtype.UE8M0), Calibration.MinMax, (3, 96)),
]


@pytest.mark.interpreter
@pytest.mark.parametrize("special", SPECIAL, ids=[s[0] for s in SPECIAL])
@pytest.mark.parametrize("case", SPECIAL_SCHEMES, ids=[case_id(c) for c in SPECIAL_SCHEMES])
def test_edge_data_matches_codec(payload, special, case):
    scheme, calibration, shape = case
    x = special[1](wide(shape, 3)).to(torch.float32)
    assert_same(payload(x, scheme, calibration), expected(x, scheme, calibration))


# ---- hand-worked and Burn-derived expectations ----------------------------------------------------


def _vector(source_end: str) -> dict:
    return next(v for v in VECTORS if v["source"].endswith(source_end))


def f32_bytes(*values: float) -> bytes:
    return struct.pack("<" + "f" * len(values), *values)


@pytest.mark.interpreter
def test_worked_example_rounds_the_tie_to_even(payload):
    # qfloat-spec §6: [2, 8] Q4S PackedU32 blocks of 4, F16 scales; element [1, 2] = 2.5 / 1.0 is a tie.
    vec = _vector("worked example (this spec, section 6)")
    scheme = QuantScheme.from_serde(vec["scheme"])
    got = payload(torch.tensor(vec["input"], dtype=torch.float32), scheme)
    assert got.hex() == vec["expected"]["bytes_half_even"]


@pytest.mark.interpreter
def test_burn_quantize_dynamic_scale(payload):
    # Burn ops/quantize.rs:71: [5, 0, 4, -12.7] Q8S per tensor gives q [50, 0, 40, -127], scale 0x3dcccccd.
    vec = _vector("quantization/ops/quantize.rs:71")
    scheme = QuantScheme.from_serde(vec["scheme"])
    got = payload(torch.tensor(vec["input"], dtype=torch.float32), scheme)
    want = bytes(q & 0xFF for q in vec["expected"]["q"]) + struct.pack("<I", 0x3DCCCCCD)
    assert got == want


@pytest.mark.interpreter
def test_ue4m3_tensor_scale_is_rounded_up_before_dividing(payload):
    # Burn flex qtensor.rs:545: alpha 4.5, 9/254 rounds up to 0.0390625 (byte 0x12). By hand:
    # -3/0.0390625 = -76.8 -> -77, -1.5/.. = -38.4 -> -38, 0, 38, 77, 4.5/.. = 115.2 -> 115.
    scheme = QuantScheme().with_value(QuantValue.Q8S).with_store(Native()).per_tensor(ScaleDtype.UE4M3)
    got = payload(torch.tensor([[-3.0, -1.5, 0.0], [1.5, 3.0, 4.5]]), scheme)
    assert got == bytes([0xB3, 0xDA, 0x00, 0x26, 0x4D, 0x73, 0x12])


@pytest.mark.interpreter
def test_two_level_scales_follow_burns_recipe(payload):
    # Burn scheme.rs:52: block ranges 1.8, 1.8, 0.04, 0.04 under Q8S give the global 0x3804b19e and
    # UE4M3 block scales 448, 448, 10, 10 (bytes 7e 7e 52 52).
    vec = _vector("quantization/scheme.rs:52")
    scheme = QuantScheme.from_serde(vec["scheme"])
    x = torch.tensor([-1.8, 0.5, 0.1, 0.2, -0.5, 1.8, 0.3, -0.3,
                      0.01, 0.04, 0.02, 0.03, -0.04, -0.01, -0.02, -0.03])
    got = payload(x, scheme)
    assert got[16:20].hex() == vec["expected"]["stored_ue4m3_bytes_computed"]
    assert got[20:] == struct.pack("<I", int(vec["expected"]["global_f32_bits"], 16))


@pytest.mark.interpreter
def test_integer_ties_round_to_even(payload):
    # alpha 3.5 makes the Q4S scale exactly 0.5: x / 0.5 = 7, .5, 1.5, -2.5, -.5, 2.5, 4.5, -7
    # round half to even: 7, 0, 2, -2, 0, 2, 4, -7 -> nibbles 7 0 2 e 0 2 4 9, first in the low bits.
    scheme = QuantScheme().with_value(QuantValue.Q4S)
    got = payload(torch.tensor([3.5, 0.25, 0.75, -1.25, -0.25, 1.25, 2.25, -3.5]), scheme)
    assert got == struct.pack("<I", 0x9420E207) + f32_bytes(0.5)


@pytest.mark.interpreter
def test_e2m1_ties_round_to_even_mantissa_and_keep_the_sign(payload):
    # alpha 6 gives scale 1. Codes: 6 -> 7, 0.25 -> 0 (0 | 0.5), 0.75 -> 2 (1.0), 1.25 -> 2 (1.0),
    # 2.5 -> 4 (2), 5 -> 6 (4), -1.75 -> 0xC (-2), -0.1 -> 8 (-0). Pairs: even element in the low nibble.
    scheme = QuantScheme().with_value(QuantValue.E2M1).with_store(PackedNative(0))
    got = payload(torch.tensor([6.0, 0.25, 0.75, 1.25, 2.5, 5.0, -1.75, -0.1]), scheme)
    assert got == bytes([0x07, 0x22, 0x64, 0x8C]) + f32_bytes(1.0)


@pytest.mark.interpreter
def test_e4m3_codes_from_the_spec(payload):
    # qfloat-spec §4: 448 = 0x7E, 1.5 = 0x3C, 0.1171875 = 0x1F, 0.5 = 0x30, 0.125 = 0x20, 10 = 0x52,
    # 0.0390625 = 0x12; alpha 448 makes the scale 1.
    scheme = QuantScheme().with_value(QuantValue.E4M3).with_store(Native())
    x = torch.tensor([448.0, 1.5, 0.1171875, 0.5, 0.125, 10.0, 0.0390625, -448.0])
    assert payload(x, scheme) == bytes([0x7E, 0x3C, 0x1F, 0x30, 0x20, 0x52, 0x12, 0xFE]) + f32_bytes(1.0)


ROUND_UP = _vector("cubecl-common/src/quant/scheme.rs:737")["expected"]


def scale_bytes(value: float, dtype: ScaleDtype) -> bytes:
    """Encoding of a value already on the dtype's grid, by numpy (F16), bit truncation (BF16), or §4."""
    if dtype is ScaleDtype.F16:
        return np.array([value], np.float16).tobytes()
    if dtype is ScaleDtype.BF16:
        return struct.pack("<H", struct.unpack("<I", f32_bytes(value))[0] >> 16)
    # e4m3: 448 = 0x7E; 1.75 = 1.11b * 2^0 -> exponent 7, mantissa 6 = 0x3E; 2^-7 = 4 * 2^-9 and
    # 2^-9 = 1 * 2^-9 are subnormal codes 0x04 and 0x01.
    return {448.0: b"\x7e", 1.75: b"\x3e", 2.0**-7: b"\x04", 2.0**-9: b"\x01"}[value]


@pytest.mark.interpreter
@pytest.mark.parametrize("dtype", [ScaleDtype.F16, ScaleDtype.BF16, ScaleDtype.UE4M3])
@pytest.mark.parametrize("alpha,key", [(1.7, "round_up(1.7)"), (1e-30, "round_up(1e-30)"),
                                       (2.0**-7, "round_up(2^-7)"), (3.4e38, "round_up(2*max)")])
def test_scale_rounds_up_saturates_and_keeps_subnormals(payload, dtype, alpha, key):
    # Q2S has h = 1, so the raw scale is alpha itself; cubecl scheme.rs:737 gives the stored scale
    # (3.4e38 is past every dtype's max, so it saturates like 2 * max).
    scheme = QuantScheme().with_value(QuantValue.Q2S).per_block([16], dtype)
    stored = ROUND_UP[dtype.value][key]
    x = torch.full((16,), alpha / 2)
    x[3] = -alpha
    assert payload(x, scheme)[4:] == scale_bytes(stored, dtype)


# cubecl 0.11.3 `round_up_to_power_of_two` then `f32_to_ue8m0`, worked by hand: the code is the biased
# exponent of the smallest power of two >= the scale, clamped to 2^-127 (code 0) and 2^127 (code 254).
UE8M0_CODES = [
    (2.0**-130, 0x00),        # below the minimum (a subnormal raw scale): 2^-127
    (2.0**-127, 0x00),        # the minimum
    (1.5 * 2.0**-127, 0x01),  # up to 2^-126
    (2.0**-126, 0x01),
    (0.75, 0x7F),             # up to 2^0
    (1.0, 0x7F),
    (1.0000001, 0x80),        # f32 0x3F800001, up to 2^1
    (3.0, 0x81),              # up to 2^2
    (2.0**127, 0xFE),         # the maximum
    (3e38, 0xFE),             # past the maximum: saturates
]


@pytest.mark.interpreter
@pytest.mark.parametrize("alpha,code", UE8M0_CODES, ids=[repr(a) for a, _ in UE8M0_CODES])
def test_ue8m0_scale_is_the_exponent_rounded_up(payload, alpha, code):
    # Q2S has h = 1, so the raw scale is alpha itself; 16 fields of 2 bits fill one word.
    for block in ([16], [2, 16]):  # the fused kernel, then the separate scale kernel
        scheme = QuantScheme().with_value(QuantValue.Q2S).per_block(block, ScaleDtype.UE8M0)
        x = torch.full((1, 16), alpha / 2)
        x[0, 3] = -alpha
        assert payload(x, scheme)[4:] == bytes([code])


@pytest.mark.interpreter
def test_ue8m0_block_scales_hand_worked(payload):
    # Q8S Native, blocks of 4 with UE8M0 scales (x = q * 2^(code - 127)):
    # block 0: alpha 2, raw 2/127 = 0.01575 > 2^-6 -> 2^-5, code 122 = 0x7A; q = 32, -16, 8, 64.
    # block 1: all zero -> f32::MIN_POSITIVE = 2^-126, code 1; q = 0.
    # block 2: alpha 127, raw exactly 1, code 127 = 0x7F; q = 127, -63.5 -> -64 (tie to even) = 0xC0, 1, 1.
    # block 3: alpha 127 * 2^-127, raw exactly 2^-127 (subnormal), the minimum: code 0; q = 127, -1, 0, 64.
    # block 4: alpha 2^-120, raw ~2^-126.99 (subnormal) -> 2^-126, code 1; q = 64, -32 = 0xE0, 1, 0.
    scheme = QuantScheme().with_value(QuantValue.Q8S).with_store(Native()).per_block([4], ScaleDtype.UE8M0)
    x = torch.tensor([1.0, -0.5, 0.25, 2.0, 0.0, -0.0, 0.0, 0.0, 127.0, -63.5, 1.0, 0.75,
                      127 * 2.0**-127, -(2.0**-127), 0.0, 64 * 2.0**-127, 2.0**-120, -(2.0**-121), 2.0**-126, 0.0])
    want = bytes.fromhex("20f00840" "00000000" "7fc00101" "7fff0040" "40e00100" + "7a017f0001")
    assert payload(x, scheme) == want
    assert payload(x.reshape(5, 4), scheme.per_block([1, 4], ScaleDtype.UE8M0)) == want  # not fused


@pytest.mark.interpreter
@pytest.mark.parametrize("dtype,floor", [(ScaleDtype.F32, struct.pack("<I", 0x00800000)),
                                         (ScaleDtype.F16, b"\x01\x00"), (ScaleDtype.UE4M3, b"\x01"),
                                         (ScaleDtype.UE8M0, b"\x01")])
def test_all_zero_block_stores_the_smallest_positive_scale(payload, dtype, floor):
    # An all-zero block takes round_up(f32::MIN_POSITIVE): F32 0x00800000, F16 2^-24, UE4M3 2^-9,
    # UE8M0 2^-126 (code 1: f32::MIN_POSITIVE is a power of two).
    scheme = QuantScheme().with_value(QuantValue.Q4S).per_block([8], dtype)
    x = torch.tensor([0.0] * 8 + [7.0, 1, 2, 3, 4, 5, 6, -7])
    got = payload(x, scheme)
    assert got[:4] == b"\x00\x00\x00\x00"
    assert got[8 : 8 + len(floor)] == floor


# ---- errors -------------------------------------------------------------------------------------


def same_error(gpu: pytest.ExceptionInfo, cpu: pytest.ExceptionInfo) -> bool:
    """One wording, one hint and one exit code, whichever device raised it."""
    return (type(gpu.value), gpu.value.message, gpu.value.hint, gpu.value.exit_code) == (
        type(cpu.value), cpu.value.message, cpu.value.hint, cpu.value.exit_code)


@pytest.mark.interpreter
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_values_are_refused_naming_the_tensor(kernels, device, bad):
    x = wide((4, 32), 1)
    x[2, 5] = bad
    scheme = QuantScheme().with_value(QuantValue.Q4S).per_block([32], ScaleDtype.F16)
    with pytest.raises(NonFiniteTensor, match="layers.0.w") as gpu:
        kernels.encode(x.to(device), scheme, name="layers.0.w")
    with pytest.raises(NonFiniteTensor) as cpu:
        codec_encode(x, scheme, name="layers.0.w")
    assert gpu.value.hint and gpu.value.exit_code == InputError.exit_code and same_error(gpu, cpu)


@pytest.mark.interpreter
def test_tensors_the_kernels_cannot_take_are_input_errors(kernels, device):
    scheme = QuantScheme().with_value(QuantValue.Q8S)
    ints = torch.ones(4, 4, dtype=torch.int32)
    with pytest.raises(NotFloatTensor, match="int32") as gpu:
        kernels.encode(ints.to(device), scheme, name="ids")
    with pytest.raises(NotFloatTensor) as cpu:
        codec_encode(ints, scheme, name="ids")
    assert gpu.value.exit_code == InputError.exit_code and same_error(gpu, cpu)
    with pytest.raises(NotKernelFloat, match="float64") as wide64:
        kernels.encode(wide((8, 8), 0).double().to(device), scheme, name="w")
    assert wide64.value.exit_code == InputError.exit_code


@pytest.mark.interpreter
def test_bad_arguments_are_usage_errors(kernels, device):
    scheme = QuantScheme().with_value(QuantValue.Q8S)
    with pytest.raises(UsageError, match="contiguous"):
        kernels.encode(wide((8, 8), 0).to(device).t(), scheme)
    with pytest.raises(SchemeError):
        # UE8M0 block scales under a global: wider than f16, so Burn has no two-level form of them
        kernels.encode(wide((8, 8), 0).to(device), scheme.per_block([8], ScaleDtype.UE8M0).per_tensor(ScaleDtype.F32))


# ---- large shapes on the GPU --------------------------------------------------------------------

GPU_SHAPES = [(2048, 4096), (517, 1031)]


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES + UE8M0_CASES, ids=[case_id(c) for c in CASES + UE8M0_CASES])
def test_large_random_data_matches_codec_on_gpu(payload, case):
    scheme, calibration, small = case
    for i, (rows, cols) in enumerate(GPU_SHAPES):
        lead = (2,) * (len(small) - 2)  # the case's rank, about the same number of values
        shape = (*lead, max(1, rows >> len(lead)), cols)
        x = wide(shape, 100 + i).to(torch.bfloat16 if i % 2 else torch.float32)
        x = torch.where(torch.rand(shape) < 0.001, x * 1e-40, x)  # subnormal inputs and blocks
        assert_same(payload(x, scheme, calibration), expected(x, scheme, calibration))


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_repeated_launches_match_codec_on_gpu(kernels, case):
    # A shape's second launch goes straight to its compiled kernel with raw addresses
    # (qcli.kernels.launcher.Launch); a payload 4 bytes off 16-byte alignment, and an input of another
    # dtype, are compiled for apart.
    scheme, calibration, shape = case
    for offset, dtype in ((0, torch.float32), (0, torch.float32), (4, torch.bfloat16), (4, torch.float32),
                          (0, torch.float16), (0, torch.bfloat16)):
        largest = torch.finfo(dtype).max  # wide's values reach past float16's range
        x = wide(shape, 300).clamp(-largest, largest).to(dtype)
        want = expected(x, scheme, calibration)
        n = len(want)
        out = torch.full((n + 4,), POISON, dtype=torch.uint8, device="cuda")
        bad = torch.zeros(1, dtype=torch.int32, device="cuda")
        kernels.enqueue(x.cuda(), scheme, calibration, out[offset : offset + n], bad)
        assert int(bad.item()) == 0
        assert_same(out[offset : offset + n].cpu().numpy().tobytes(), want)
        assert int(out[n if offset == 0 else 0]) == POISON  # nothing written outside the payload


# ---- the scale search weighed by importance --------------------------------------------------------


MSE_CASES = [c for c in CASES if c[1] is Calibration.Mse]


def channel_importance(shape: tuple[int, ...], seed: int, along_rows: bool) -> torch.Tensor:
    """Importance over orders of magnitude, one value per input channel: along the last axis, or (a
    transposed weight's) along the first, as a column."""
    n = shape[0] if along_rows else shape[-1]
    importance = torch.exp(torch.randn(n, generator=torch.Generator().manual_seed(seed)) * 2)
    return importance.reshape(n, *([1] * (len(shape) - 1))) if along_rows else importance


def assert_weighted_matches_codec(kernels, device: str, x: torch.Tensor, scheme: QuantScheme, seed: int) -> None:
    for along_rows in (False, True):
        importance = channel_importance(tuple(x.shape), seed, along_rows)
        got = kernels.encode(x.to(device), scheme, Calibration.Mse, importance=importance)
        want = codec_encode(x, scheme, Calibration.Mse, importance=importance)
        assert_same(got.cpu().numpy().tobytes(), want.numpy().tobytes())


@pytest.mark.interpreter
@pytest.mark.parametrize("case", MSE_CASES, ids=[case_id(c) for c in MSE_CASES])
def test_weighted_search_matches_codec(kernels, device, case):
    scheme, _, shape = case
    for seed, dtype in enumerate((torch.float32, torch.bfloat16)):
        assert_weighted_matches_codec(kernels, device, wide(shape, 400 + seed).to(dtype), scheme, seed)


@pytest.mark.gpu
@pytest.mark.parametrize("case", MSE_CASES, ids=[case_id(c) for c in MSE_CASES])
def test_large_weighted_search_matches_codec_on_gpu(kernels, case):
    scheme, _, small = case
    for i, (rows, cols) in enumerate(GPU_SHAPES):
        lead = (2,) * (len(small) - 2)
        shape = (*lead, max(1, rows >> len(lead)), cols)
        x = wide(shape, 500 + i).to(torch.bfloat16 if i % 2 else torch.float32)
        assert_weighted_matches_codec(kernels, "cuda", x, scheme, i)


# Every value in blocks of 32 under every scale dtype, one level and two: the fused kernel searches them
# itself (`launch.searches_in_kernel`), the candidates worked out in registers.
SEARCHED = [scheme for scheme in [QuantScheme().with_value(value).per_block([32], dtype)
                                  for value in QuantValue for dtype in ScaleDtype]
            + [QuantScheme().with_value(value).per_block([16], ScaleDtype.F16).per_tensor(ScaleDtype.F32)
               for value in QuantValue]
            if not accept_problems(scheme, Calibration.Mse, quantizer=False)]


def assert_searched_in_the_kernel(kernels, device: str, x: torch.Tensor, scheme: QuantScheme, seed: int) -> None:
    from qcli.kernels import launch

    assert launch.searches_in_kernel(scheme, tuple(x.shape))
    launch.searched_launch.cache_clear()
    x[0, :40] = 0  # all-zero blocks, and a block of equal values (ties between candidates)
    x[1, 32:64] = 0.75
    for importance in (None, *(channel_importance(tuple(x.shape), seed, rows) for rows in (False, True))):
        got = kernels.encode(x.to(device), scheme, Calibration.Mse, importance=importance)
        want = codec_encode(x, scheme, Calibration.Mse, importance=importance)
        assert_same(got.cpu().numpy().tobytes(), want.numpy().tobytes())
    assert launch.searched_launch.cache_info().misses == 3  # unweighed, by columns, by rows: all in the kernel


@pytest.mark.interpreter
@pytest.mark.parametrize("scheme", SEARCHED, ids=str)
def test_the_fused_kernel_searches_the_codecs_scales(kernels, device, scheme):
    assert_searched_in_the_kernel(kernels, device, wide((5, 100), 600), scheme, 0)  # a partial block a row


@pytest.mark.gpu
@pytest.mark.parametrize("scheme", SEARCHED, ids=str)
def test_the_fused_kernel_searches_the_codecs_scales_on_gpu(kernels, scheme):
    for i, shape in enumerate(GPU_SHAPES):
        x = wide(shape, 700 + i).to(torch.bfloat16 if i % 2 else torch.float32)
        assert_searched_in_the_kernel(kernels, "cuda", x, scheme, i)


def test_a_compiled_launch_is_reused_only_for_pointers_of_its_dtypes_and_alignment(monkeypatch):
    """The memoized launch goes through the JIT (which compiles) for every new combination of pointer
    dtypes and 16-byte alignments, and straight to the compiled kernel only for one seen before."""
    from qcli.kernels import launcher

    jit, direct = [], []

    class Compiled:
        def __getitem__(self, grid):
            return lambda *args: direct.append(args)

    class Kernel:
        arg_names = ("x", "out", "n", "K")

        def __getitem__(self, grid):
            def run(*args, **constexprs):
                jit.append(tuple(a.dtype for a in args[:2]))
                return Compiled()
            return run

    monkeypatch.setattr(launcher, "interpreted", lambda: False)
    call = launcher.Launch(Kernel(), 4, (7,), {"K": 1})
    out = torch.zeros(64, dtype=torch.uint8)
    f32, bf16 = torch.zeros(8), torch.zeros(8, dtype=torch.bfloat16)
    for x in (f32, f32, bf16, bf16, f32):
        call(x, out)
    assert jit == [(torch.float32, torch.uint8), (torch.bfloat16, torch.uint8)]
    assert len(direct) == 3 and direct[0] == (f32.data_ptr(), out.data_ptr(), 7, 1)
    call(f32, out[4:])  # 4 bytes off alignment: compiled apart
    assert len(jit) == 3



def test_a_shapes_launch_is_worked_out_again_under_new_tuning_once_the_caches_are_cleared(kernels, monkeypatch):
    """bench/tune.py's loop: the memoized launch keeps the tile it was worked out with until
    `clear_launch_caches`; then the same shape takes the new tile, 8192 values per program in place of 4096."""
    from qcli.kernels import launch

    scheme = QuantScheme().with_value(QuantValue.Q8S).per_tensor(ScaleDtype.F32)
    shape = (3, 1 << 16)
    launch.clear_launch_caches()
    before = launch.tensor_launch(scheme, shape, False)
    monkeypatch.setattr(launch, "TILE", 2 * launch.TILE)
    assert launch.tensor_launch(scheme, shape, False) is before
    launch.clear_launch_caches()
    after = launch.tensor_launch(scheme, shape, False)
    assert (before.grid, after.grid) == (3 * 16, 3 * 8)
    assert after.constexprs["G"] == 2 * before.constexprs["G"]
    launch.clear_launch_caches()  # no launch worked out under the patched tile outlives this test


@pytest.mark.parametrize("triton_api", ["no-launcher", "no-arg-names"])
def test_a_triton_without_the_direct_launch_runs_every_launch_through_its_jit(monkeypatch, triton_api):
    """Where a Triton release's compiled kernel has no launcher of its own (or its JIT function no
    `arg_names`), the memoized launch falls back to `kernel[grid](...)` for every call, and warns once."""
    from qcli.kernels import launcher

    jit = []

    class Kernel:
        def __getitem__(self, grid):
            def run(*args, **constexprs):
                jit.append((grid, args[2:], constexprs))
                return object() if triton_api == "no-launcher" else Compiled()
            return run

    class Compiled:
        def __getitem__(self, grid):
            raise AssertionError("no direct launch without the parameters' order")

    if triton_api == "no-launcher":
        Kernel.arg_names = ("x", "out", "n", "K")
    monkeypatch.setattr(launcher, "interpreted", lambda: False)
    launcher.warn_jit_launches.cache_clear()
    call = launcher.Launch(Kernel(), 4, (7,), {"K": 1})
    x, out = torch.zeros(8), torch.zeros(64, dtype=torch.uint8)
    with pytest.warns(RuntimeWarning, match="through its JIT") as warned:
        for _ in range(3):
            call(x, out)
    assert jit == [((4,), (7,), {"K": 1})] * 3
    assert len(warned) == 1

# ---- the streaming pipeline ---------------------------------------------------------------------


@pytest.mark.interpreter
@pytest.mark.parametrize("settings", [
    GpuSettings(read_slice=1000),
    GpuSettings(piece_bytes=1000, read_slice=1000),
    GpuSettings(budget=6 << 10, piece_bytes=1000, read_slice=1000),
    GpuSettings(budget=30000, piece_bytes=7 << 10, read_slice=1000),
], ids=["whole", "whole-pieces", "chunked", "chunked-pieces"])
@pytest.mark.parametrize("searched", [False, True], ids=["as-decided", "mse"])
def test_pipeline_yields_the_cpu_pipelines_bytes(tmp_path, settings, searched):
    # Small budgets split tensors into row chunks of whole blocks (and per-tensor/two-level schemes into
    # two passes, a per-tensor Mse scheme into three); small pieces split each chunk into several reads,
    # and small read slices each piece into several reads in flight.
    from qcli.pipeline import cpu, gpu

    path, decisions = checkpoint(tmp_path)
    if searched:
        decisions = {name: (scheme, Calibration.Mse if scheme else calibration, transpose)
                     for name, (scheme, calibration, transpose) in decisions.items()}
    plan, source = fixed_plan(path, decisions)
    with source:
        want = [(p.entry.info.name, bytes(p.data.numpy())) for p in cpu.run(plan, source)]
        got = [(p.entry.info.name, bytes(p.data.numpy())) for p in gpu.run(plan, source, settings=settings)]
    assert [n for n, _ in got] == [n for n, _ in want]
    for (name, g), (_, w) in zip(got, want, strict=True):
        assert g == w, name


@pytest.mark.interpreter
@pytest.mark.parametrize("settings", [GpuSettings(read_slice=1000), GpuSettings(budget=6 << 10, piece_bytes=1000)],
                         ids=["whole", "chunked"])
def test_pipeline_weighs_the_search_as_the_cpu_pipeline_does(tmp_path, settings):
    # Every quantized tensor under Mse, each with an importance per input channel (the transposed lm_head's
    # along its written first axis), none on the channel of its largest value, whose clipping then costs
    # nothing, so that even a per-tensor scale moves; chunked, that one's search takes a pass of its own.
    from qcli.pipeline import cpu, gpu

    path, decisions = checkpoint(tmp_path)
    decisions = {name: (scheme, Calibration.Mse if scheme else calibration, transpose)
                 for name, (scheme, calibration, transpose) in decisions.items()}
    plan, source = fixed_plan(path, decisions)
    with source:
        importance = {}
        for i, entry in enumerate(plan.entries):
            x = source.load(entry.info.name).float()
            importance[entry.info.name] = channel_importance(tuple(x.shape), i, False)
            importance[entry.info.name][int(x.abs().reshape(-1, x.shape[-1]).amax(0).argmax())] = 0.0
        plain = [bytes(p.data.numpy()) for p in cpu.run(plan, source)]
        want = [bytes(p.data.numpy()) for p in cpu.run(plan, source, importance=importance)]
        got = [bytes(p.data.numpy()) for p in gpu.run(plan, source, settings=settings, importance=importance)]
    assert got == want
    moved = {e.info.name for e, w, p in zip(plan.entries, want, plain, strict=True) if w != p}
    assert {"layers.0.attn.q.weight", "layers.0.mlp.up.weight", "embed.weight"} <= moved  # it reached the search


@pytest.mark.interpreter
def test_the_runtime_compiles_ahead_and_its_pipeline_yields_the_cpu_pipelines_bytes(tmp_path, device):
    # Runtime: torch, CUDA and Triton loaded on a thread, the plan's kernels compiled ahead on another (on
    # a GPU; the interpreter compiles nothing), and the pipeline's first launch waiting for them.
    from qcli.pipeline import cpu
    from qcli.pipeline.device import Runtime

    path, decisions = checkpoint(tmp_path)
    plan, source = fixed_plan(path, decisions)
    environ = {} if device == "cuda" else {"QCLI_KERNELS": "triton"}
    with Runtime(device, environ) as runtime, source:
        runtime.warm(plan, measure=True)
        chosen, run = runtime.select(device)
        assert chosen == ("cuda" if device == "cuda" else "triton") and run.keywords["ahead"] is not None
        want = [(p.entry.info.name, bytes(p.data.numpy())) for p in cpu.run(plan, source)]
        got = [(p.entry.info.name, bytes(p.data.numpy())) for p in run(plan, source, measure=True)]
    assert got == want


@pytest.mark.interpreter
def test_the_runtime_reads_ahead_until_the_cpu_pipeline_starts_or_a_gpu_run_ends(tmp_path, device, caplog):
    # Beside the GPU pipeline the input is read into the page cache to the end of the run; the CPU
    # pipeline's cores quantize, so there it stops once the pipeline is chosen (the debug log says when).
    from qcli.pipeline.device import Runtime

    path, decisions = checkpoint(tmp_path)
    plan, source = fixed_plan(path, decisions)
    source.close()
    caplog.set_level(logging.DEBUG, logger="qcli.pipeline.device")
    gpu_environ = {} if device == "cuda" else {"QCLI_KERNELS": "triton"}
    for asked, environ, to_the_end in (("cpu", {}, False), (device, gpu_environ, True)):
        caplog.clear()
        with Runtime(asked, environ) as runtime:
            runtime.warm(plan, measure=False)
            runtime.select(asked)
            stopped_at_select = "read into the page cache in all" in caplog.text
        assert stopped_at_select is not to_the_end and "read into the page cache in all" in caplog.text


@pytest.mark.gpu
def test_compile_ahead_makes_each_distinct_tensors_launches_once(tmp_path):
    from qcli.pipeline import gpu

    path, decisions = checkpoint(tmp_path)
    plan, source = fixed_plan(path, decisions)
    source.close()
    quantized = {(tuple(e.info.shape), e.info.dtype, e.decision.scheme, e.decision.calibration,
                  e.decision.transpose) for e in plan.entries if e.decision.scheme is not None}
    assert gpu.compile_ahead(plan, True, GpuSettings()) == len(quantized) == 5


@pytest.mark.interpreter
def test_pipeline_refuses_non_finite_values_naming_the_tensor(tmp_path):
    from safetensors.torch import save_file

    from qcli.pipeline import cpu, gpu

    x = wide((8, 32), 0)
    x[3, 3] = float("nan")
    save_file({"w": x}, str(tmp_path / "model.safetensors"))
    raised = []
    for run in (partial(gpu.run, settings=GpuSettings()), cpu.run):
        plan, source = fixed_plan(tmp_path / "model.safetensors",
                             {"w": (QuantScheme().with_value(QuantValue.Q8S), Calibration.MinMax, False)})
        with source, pytest.raises(NonFiniteTensor, match="'w'") as err:
            list(run(plan, source))
        raised.append(err)
    assert same_error(*raised)


@pytest.mark.interpreter
def test_pipeline_refuses_a_file_cut_short_after_it_was_opened(tmp_path):
    from qcli.pipeline import gpu

    path, decisions = checkpoint(tmp_path)
    plan, source = fixed_plan(path, decisions)
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size - 1000)
    with source, pytest.raises(InputError, match="cut short while reading tensor"):
        list(gpu.run(plan, source, settings=GpuSettings()))


@pytest.mark.interpreter
@pytest.mark.parametrize("value", ["lots", "0", "-5GiB", "12 XB"])
def test_the_gpu_pipeline_refuses_a_malformed_budget(value):
    with pytest.raises(UsageError, match="QCLI_GPU_BUDGET"):
        select_pipeline("cpu", {"QCLI_KERNELS": "triton", "QCLI_GPU_BUDGET": value})


@pytest.mark.interpreter
def test_the_gpu_pipeline_takes_its_settings_from_the_environment():
    # Spelled as --max-shard-size is: decimal units, binary ones with an i; a blank variable is unset.
    environ = {"QCLI_KERNELS": "triton", "QCLI_GPU_BUDGET": "12 TB", "QCLI_PIECE_BYTES": "64kib"}
    device, run = select_pipeline("cpu", environ)
    assert device == "triton"
    assert run.keywords["settings"] == GpuSettings(budget=12 * 10**12, piece_bytes=64 << 10)
    assert GpuSettings.from_env({"QCLI_GPU_BUDGET": " "}) == GpuSettings()
