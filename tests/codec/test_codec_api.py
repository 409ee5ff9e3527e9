"""The codec's public API: errors a user can cause, input dtypes and layouts, ranks 0-5, N-d blocks, empty
tensors, chunking, payload types and error statistics. Expectations are hand-worked or come from the
pure-Python writer in tests/qfloat_reference.py."""

from __future__ import annotations

import math
import random
import struct

import numpy as np
import pytest
import torch

from qcli import layout
from qcli.codec import decode, encode, error_stats, quantize, quantize_parts
from qcli.errors import InputError, SchemeError
from qcli.scheme import (
    WEIGHT_CALIBRATIONS,
    Calibration,
    Native,
    PackedU32,
    QuantMode,
    QuantScheme,
    QuantValue,
    ScaleDtype,
)
from tests import qfloat_reference as ref

Q4S_B32 = QuantScheme().with_value(QuantValue.Q4S).per_block([32], ScaleDtype.F16)


def data(shape, seed=0) -> list[float]:
    rng = random.Random(seed)
    return [ref.f32(rng.gauss(0, 1)) for _ in range(math.prod(shape))]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("scheme", [Q4S_B32, QuantScheme.nvfp4(), QuantScheme()], ids=str)
@pytest.mark.parametrize("calibration", WEIGHT_CALIBRATIONS, ids=str)
def test_non_finite_input_names_the_tensor(bad, scheme, calibration):
    x = torch.ones(3, 64)
    x[2, 40] = bad
    if scheme.is_two_level() and calibration is Calibration.AbsMean:  # refused before the data is read
        with pytest.raises(SchemeError):
            encode(x, scheme, calibration)
        return
    with pytest.raises(InputError) as err:
        encode(x, scheme, calibration, name="model.layers.0.mlp.weight")
    assert "model.layers.0.mlp.weight" in err.value.message
    assert "keep = true" in err.value.hint
    assert err.value.exit_code == 3


def test_integer_input_is_refused():
    with pytest.raises(InputError, match="token_ids"):
        encode(torch.arange(32), Q4S_B32, name="token_ids")


@pytest.mark.parametrize(
    ("scheme", "calibration"),
    [
        (QuantScheme().with_mode(QuantMode.Lookup), Calibration.MinMax),
        (QuantScheme().per_block([32], ScaleDtype.UE8M0).per_tensor(ScaleDtype.F32), Calibration.MinMax),
        (QuantScheme().with_value(QuantValue.Q4S).with_store(Native()), Calibration.MinMax),
        (QuantScheme().per_block([32], ScaleDtype.F32).per_tensor(ScaleDtype.F32), Calibration.MinMax),
        (QuantScheme.nvfp4(), Calibration.AbsMean),
        (QuantScheme().with_store(PackedU32(1)), Calibration.MinMax),
    ],
    ids=["lookup", "ue8m0-under-global", "native-q4", "f32-under-global", "absmean-two-level", "packed-dim1"],
)
def test_refused_schemes_raise_scheme_error(scheme, calibration):
    with pytest.raises(SchemeError) as err:
        encode(torch.ones(4, 32), scheme, calibration)
    assert err.value.hint and err.value.exit_code == 2


def test_decode_refuses_a_wrong_length():
    with pytest.raises(InputError, match="holds 36 bytes, got 35"):
        decode(bytes(35), Q4S_B32, [2, 32])


@pytest.mark.parametrize(
    "scheme",
    [
        QuantScheme().with_value(QuantValue.Q4F).with_mode(QuantMode.Lookup),
        QuantScheme().with_value(QuantValue.Q4S).with_store(PackedU32(2)),
    ],
    ids=["lookup", "packed-dim2"],
)
def test_decode_refuses_what_no_decoder_reads(scheme):
    with pytest.raises(SchemeError):
        decode(bytes(layout.quantized_data_len(scheme, [4, 32])), scheme, [4, 32])


# ---- UE8M0 scales (Burn 0.22.1: one byte, the biased exponent) ---------------------------------------

UE8M0_Q8S_B4 = QuantScheme().with_value(QuantValue.Q8S).with_store(Native()).per_block([4], ScaleDtype.UE8M0)
UE8M0_INPUT = [
    1.0, -0.5, 0.25, 2.0,                                # block 0
    0.0, -0.0, 0.0, 0.0,                                 # block 1: all zero
    127.0, -63.5, 1.0, 0.75,                             # block 2
    127 * 2.0**-127, -(2.0**-127), 0.0, 64 * 2.0**-127,  # block 3: subnormal values
    2.0**-120, -(2.0**-121), 2.0**-126, 0.0,             # block 4: a subnormal raw scale
]
# Worked by hand (x = q * 2^(code - 127)):
# block 0: alpha 2, raw 2/127 = 0.01575 > 2^-6, rounds up to 2^-5: code 127 - 5 = 122 = 0x7A;
#          q = 1/2^-5 = 32 (0x20), -16 (0xF0), 8 (0x08), 64 (0x40).
# block 1: raw 0 takes f32::MIN_POSITIVE = 2^-126, already a power of two: code 1; q = 0 0 0 0.
# block 2: alpha 127, raw exactly 1 = 2^0: code 127 = 0x7F; q = 127 (0x7F), -63.5 -> -64 (a tie, to
#          even: 0xC0), 1, 0.75 -> 1.
# block 3: alpha 127 * 2^-127, raw exactly 2^-127 (subnormal in f32), UE8M0's minimum: code 0;
#          q = 127 (0x7F), -1 (0xFF), 0, 64 (0x40).
# block 4: alpha 2^-120, raw 2^-120 / 127 ~ 2^-126.99 (subnormal), between 2^-127 and 2^-126, so up to
#          2^-126: code 1; q = 2^6 = 64 (0x40), -32 (0xE0), 1, 0.
UE8M0_PAYLOAD = bytes.fromhex("20f00840" "00000000" "7fc00101" "7fff0040" "40e00100" + "7a017f0001")


def test_ue8m0_block_scales_hand_worked():
    x = torch.tensor(UE8M0_INPUT, dtype=torch.float32)
    assert layout.quantized_data_len(UE8M0_Q8S_B4, [20]) == 25
    payload = encode(x, UE8M0_Q8S_B4)
    assert payload.numpy().tobytes() == UE8M0_PAYLOAD
    assert payload.numpy().tobytes() == ref.quantize(UE8M0_INPUT, [20], "Q8S", "Native", [4], "UE8M0")[0]
    # decoded as Burn 0.22.1 does: q * 2^(code - 127), code 0 = 2^-127
    q = [f - 256 if f > 127 else f for f in UE8M0_PAYLOAD[:20]]
    s = [ref.ue8m0_value(c) for c in UE8M0_PAYLOAD[20:]]
    want = [ref.f32(qi * s[i // 4]) for i, qi in enumerate(q)]
    assert decode(payload, UE8M0_Q8S_B4, [20]).tolist() == want
    assert want[:4] == [1.0, -0.5, 0.25, 2.0] and want[12:16] == UE8M0_INPUT[12:16]


def test_ue8m0_per_tensor_hand_worked():
    """[-3, 1.5, 0.7] under Q8S per tensor: raw 3/127 = 0.0236 rounds up to 2^-5 (code 122); q = -96,
    48, 0.7 * 32 = 22.4 -> 22. PackedU32: one word 0x001630A0 (first value lowest), then the byte 0x7A."""
    scheme = QuantScheme().with_value(QuantValue.Q8S).per_tensor(ScaleDtype.UE8M0)
    payload = encode(torch.tensor([-3.0, 1.5, 0.7]), scheme).numpy().tobytes()
    assert payload == struct.pack("<I", 0x001630A0) + b"\x7a"
    assert decode(payload, scheme, [3]).tolist() == [-3.0, 1.5, 22 / 32]


@pytest.mark.parametrize("shape", [[6, 64], [3, 40]], ids=lambda s: "x".join(map(str, s)))
def test_ue8m0_payload_reads_back_by_hand(shape):
    """Q4S PackedU32(0) blocks of 32 with UE8M0 scales, decoded by the numpy hand decoder of the CLI tests."""
    from tests.cli_support import decode_packed, packed_len

    scheme = QuantScheme().with_value(QuantValue.Q4S).per_block([32], ScaleDtype.UE8M0)
    x = torch.tensor(data(shape, seed=9), dtype=torch.float32).reshape(shape) * 1e-3
    payload = encode(x, scheme).numpy().tobytes()
    assert len(payload) == packed_len(tuple(shape), 4, 32, "UE8M0")
    values, scales = decode_packed(payload, tuple(shape), bits=4, block=32, scale_dtype="UE8M0")
    assert np.array_equal(values, decode(payload, scheme, shape).numpy())
    assert np.array_equal(np.log2(scales), np.round(np.log2(scales)))  # every scale a power of two
    assert (np.abs(x.numpy()) <= 7 * np.repeat(scales, 32, axis=1)[:, : shape[1]]).all()  # none clips


def test_burns_ue8m0_block_scales_are_their_exponents():
    """Burn's should_pack_unpack_ue8m0_block_scales: Q8S Native [4] blocks of given i8 values with block
    scales 0.25 and 8.0 pack to 10 bytes, the scales to 0x7D and 0x82."""
    from qcli.codec.quantize import QuantizedParts, pack
    from tests.burn_facts import VECTORS

    v = next(v for v in VECTORS if v["source"].endswith("should_pack_unpack_ue8m0_block_scales"))
    scheme = QuantScheme.from_serde(v["scheme"])
    parts = QuantizedParts(torch.tensor(v["input"]["i8_values"], dtype=torch.int32),
                           torch.tensor(v["input"]["block_scales"]), None)
    payload = pack(parts, scheme, v["shape"]).numpy().tobytes()
    assert len(payload) == v["expected"]["len"]
    assert payload[8:].hex() == v["expected"]["ue8m0_bytes_computed"]
    assert decode(payload, scheme, v["shape"]).tolist() == [
        q * s for q, s in zip(v["input"]["i8_values"], [0.25] * 4 + [8.0] * 4, strict=True)]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_other_float_dtypes_are_widened(dtype):
    x = torch.tensor(data([4, 64]), dtype=torch.float32).to(dtype)
    assert torch.equal(encode(x, Q4S_B32), encode(x.to(torch.float32), Q4S_B32))


def test_non_contiguous_input():
    x = torch.tensor(data([64, 8]), dtype=torch.float32).t()
    assert torch.equal(encode(x, Q4S_B32), encode(x.contiguous(), Q4S_B32))


def test_rank_0_per_tensor():
    """3.5 under Q8S: s = 3.5 / 127, q = 127, one value padded to a word, then the f32 scale."""
    scheme = QuantScheme().with_value(QuantValue.Q8S)
    payload = encode(torch.tensor(3.5), scheme)
    assert payload.numpy().tobytes() == bytes([0x7F, 0, 0, 0]) + struct.pack("<f", 3.5 / 127)
    back = decode(payload, scheme, ())
    assert back.shape == () and back.item() == ref.f32(ref.f32(3.5 / 127) * 127)


def test_rank_1_per_tensor_native():
    """[-2, 1, 0.5] under Q8S Native: s = 2/127; q = -127, 63.5 -> 64 (tie to even), 31.75 -> 32."""
    scheme = QuantScheme().with_value(QuantValue.Q8S).with_store(Native())
    payload = encode(torch.tensor([-2.0, 1.0, 0.5]), scheme)
    s = ref.f32(2 / 127)
    assert [ref.f32(1 / s), ref.f32(0.5 / s)] == [63.5, 31.75]
    assert payload.numpy().tobytes() == bytes([0x81, 64, 32]) + struct.pack("<f", s)


NDIM_SHAPES = [[6, 40], [3, 5, 40], [2, 3, 5, 33], [2, 1, 3, 5, 20]]


@pytest.mark.parametrize("shape", NDIM_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("block", [[4, 32], [2, 16], [3, 2, 8]], ids=lambda b: "b" + "x".join(map(str, b)))
def test_nd_blocks_on_ranks_2_to_5(shape, block):
    scheme = QuantScheme().with_value(QuantValue.Q4S).per_block(block, ScaleDtype.F16)
    xs = data(shape, seed=len(shape))
    expected, *_ = ref.quantize(xs, shape, "Q4S", "PackedU32", block, "F16")
    x = torch.tensor(xs, dtype=torch.float32).reshape(shape)
    assert encode(x, scheme).numpy().tobytes() == expected
    assert list(quantize_parts(x, scheme).scales.shape) == layout.params_shape(scheme, shape)


@pytest.mark.parametrize(
    ("scheme", "shape"),
    [
        (Q4S_B32, [0, 32]),
        (Q4S_B32, [3, 0]),
        (QuantScheme().with_value(QuantValue.Q8S), [0]),
        (QuantScheme.nvfp4(), [0, 16]),
    ],
    ids=["rows0", "cols0", "rank1-empty-per-tensor", "nvfp4-empty"],
)
def test_empty_tensors(scheme, shape):
    payload = encode(torch.zeros(shape), scheme)
    assert payload.numel() == layout.quantized_data_len(scheme, shape)
    assert list(decode(payload, scheme, shape).shape) == shape
    assert list(decode(payload.numpy().tobytes(), scheme, shape).shape) == shape  # as a file gives it


@pytest.mark.parametrize(
    ("block", "dtype", "two_level", "calibration"),
    [
        ([4, 32], "F16", False, "MinMax"),
        ([32], "UE4M3", True, "MinMax"),
        (None, "F32", False, "MinMax"),
        (None, "F32", False, "AbsMean"),
        ([3, 16], "BF16", False, "AbsMean"),
    ],
)
@pytest.mark.parametrize("shape", [[13, 40], [517]], ids=["rows", "rank1"])
def test_row_chunks_give_the_same_bytes(monkeypatch, shape, block, dtype, two_level, calibration):
    """Tiny chunks (a few rows) exercise the chunk seams: scales from every chunk, values packed per chunk."""
    monkeypatch.setattr(quantize, "CHUNK_ELEMENTS", max(1, 100 // torch.get_num_threads()))  # per thread
    scheme = QuantScheme().with_value(QuantValue.Q4S)
    scheme = scheme.per_tensor(ScaleDtype(dtype)) if block is None else scheme.per_block(block, ScaleDtype(dtype))
    if two_level:
        scheme = scheme.per_tensor(ScaleDtype.F32)
    xs = data(shape, seed=3)
    expected, *_ = ref.quantize(xs, shape, "Q4S", "PackedU32", block, dtype, two_level, calibration)
    x = torch.tensor(xs).reshape(shape)
    assert encode(x, scheme, Calibration(calibration)).numpy().tobytes() == expected
    assert len(quantize._row_chunks(layout.BlockGrid.of(scheme, shape), scheme)) > 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_chunks_widen_and_gather_their_own_rows(monkeypatch, dtype):
    """A transposed bf16 view is widened and gathered a chunk at a time: its bytes are those of its values."""
    monkeypatch.setattr(quantize, "CHUNK_ELEMENTS", max(1, 100 // torch.get_num_threads()))
    x = torch.tensor(data([64, 13], seed=5)).to(dtype).t()  # a [13, 64] view, not contiguous
    xs = x.to(torch.float32).reshape(-1).tolist()  # widening is exact
    expected, *_ = ref.quantize(xs, [13, 64], "Q4S", "PackedU32", [32], "F16", False, "MinMax")
    assert encode(x, Q4S_B32).numpy().tobytes() == expected
    assert len(quantize._row_chunks(layout.BlockGrid.of(Q4S_B32, x.shape), Q4S_B32)) > 1


def test_decode_takes_any_bytes_like_payload():
    x = torch.tensor(data([2, 32]), dtype=torch.float32)
    payload = encode(x, Q4S_B32)
    raw = payload.numpy().tobytes()
    expected = decode(payload, Q4S_B32, [2, 32])
    for form in (raw, bytearray(raw), memoryview(raw), np.frombuffer(raw, dtype=np.uint8)):
        assert torch.equal(decode(form, Q4S_B32, (2, 32)), expected)


def test_error_stats_hand_worked():
    exact = error_stats(torch.tensor([3.0, 4.0]), torch.tensor([3.0, 4.0]))
    assert (exact.rel_rms, exact.sqnr_db, exact.max_abs) == (0.0, math.inf, 0.0)
    off = error_stats(torch.tensor([3.0, 4.0]), torch.tensor([3.0, 5.0]))
    assert off.rel_rms == pytest.approx(0.2) and off.max_abs == 1.0
    assert off.sqnr_db == pytest.approx(10 * math.log10(25))
    zeros = error_stats(torch.zeros(3), torch.zeros(3))
    assert (zeros.rel_rms, zeros.sqnr_db) == (0.0, math.inf)
    assert error_stats(torch.zeros(2), torch.tensor([0.0, 1.0])).rel_rms == math.inf
    assert error_stats(torch.zeros(0), torch.zeros(0)).max_abs == 0.0


def test_block_of_one_gives_every_value_its_own_scale():
    """BlockSize.new([1]) keeps no extent; each value is its own block, so |q| = 127 everywhere but at 0."""
    scheme = QuantScheme().with_value(QuantValue.Q8S).with_store(Native()).per_block([1], ScaleDtype.F32)
    xs = [1.5, -0.25, 0.0, 3.0, -7.0, 2.0]
    expected, fields, *_ = ref.quantize(xs, [2, 3], "Q8S", "Native", [], "F32")
    assert fields == [127, -127, 0, 127, -127, 127]
    assert encode(torch.tensor(xs).reshape(2, 3), scheme).numpy().tobytes() == expected
