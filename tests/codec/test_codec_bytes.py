"""Payload bytes of every accepted (value, store) at four scale levels, against the pure-Python writer.

The expectations come from tests/qfloat_reference.py, which shares no code with qcli.codec. Shapes
include partial blocks, last axes that are not a multiple of the pack width, rank 3, and rows shorter
than a word; data mixes exactly representable values, zeros, negative zeros and f32 noise.
"""

from __future__ import annotations

import random
import struct

import pytest
import torch

from qcli import layout
from qcli.codec import decode, encode, quantize_parts
from qcli.scheme import Calibration, Native, PackedNative, PackedU32, QuantScheme, QuantValue, ScaleDtype
from tests import qfloat_reference as ref

STORES = {
    QuantValue.Q8F: [Native(), PackedU32(0)],
    QuantValue.Q8S: [Native(), PackedU32(0)],
    QuantValue.E4M3: [Native(), PackedU32(0)],
    QuantValue.E5M2: [Native(), PackedU32(0)],
    QuantValue.Q4F: [PackedU32(0)],
    QuantValue.Q4S: [PackedU32(0)],
    QuantValue.Q2F: [PackedU32(0)],
    QuantValue.Q2S: [PackedU32(0)],
    QuantValue.E2M1: [PackedU32(0), PackedNative(0)],
}
# (id, block, scale dtype, two-level)
LEVELS = [
    ("tensorF32", None, ScaleDtype.F32, False),
    ("b32F16", [32], ScaleDtype.F16, False),
    ("b16UE4M3+F32", [16], ScaleDtype.UE4M3, True),
    ("b4x32BF16", [4, 32], ScaleDtype.BF16, False),
    ("b16UE8M0", [16], ScaleDtype.UE8M0, False),
    ("tensorUE8M0", None, ScaleDtype.UE8M0, False),
]
SHAPES = [[8, 64], [5, 36], [2, 3, 20], [3]]


def scheme_of(value: QuantValue, store, block, dtype: ScaleDtype, two_level: bool) -> QuantScheme:
    scheme = QuantScheme().with_value(value).with_store(store)
    if block is None:
        return scheme.per_tensor(dtype)
    scheme = scheme.per_block(block, dtype)
    return scheme.per_tensor(ScaleDtype.F32) if two_level else scheme


def sample(n: int, seed: int) -> list[float]:
    """f32 values: noise over several binades, exact multiples of 2^-3, zeros and -0.0."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        kind = i % 5
        if kind == 0:
            out.append(ref.f32(rng.gauss(0, 1) * 2.0 ** rng.randint(-6, 3)))
        elif kind == 1:
            out.append(rng.randint(-60, 60) / 8)
        elif kind == 2:
            out.append(0.0 if rng.random() < 0.5 else -0.0)
        else:
            out.append(ref.f32(rng.uniform(-3, 3)))
    return out


def test_the_cases_cover_every_value_and_scale_dtype():
    assert set(STORES) == set(QuantValue) and {dtype for _, _, dtype, _ in LEVELS} == set(ScaleDtype)


CASES = [
    pytest.param(value, store, level, shape, id=f"{value.value}-{store}-{level[0]}-{'x'.join(map(str, shape))}")
    for value, stores in STORES.items()
    for store in stores
    for level in LEVELS
    for shape in SHAPES
]


def reference(data, shape, value, store, level, calibration="MinMax"):
    _, block, dtype, two_level = level
    store_name = type(store).__name__
    return ref.quantize(data, shape, value.value, store_name, block, dtype.value, two_level, calibration)


@pytest.mark.parametrize(("value", "store", "level", "shape"), CASES)
def test_payload_matches_reference(value, store, level, shape):
    scheme = scheme_of(value, store, *level[1:])
    n = 1
    for d in shape:
        n *= d
    data = sample(n, seed=n + len(value.value))
    payload, fields, scales, decoded, global_scale = reference(data, shape, value, store, level)
    x = torch.tensor(data, dtype=torch.float32).reshape(shape)

    got = encode(x, scheme)
    assert got.dtype == torch.uint8 and got.dim() == 1
    assert len(payload) == layout.quantized_data_len(scheme, shape)
    assert bytes(got.numpy()) == payload

    parts = quantize_parts(x, scheme)
    assert parts.fields.dtype == torch.int32 and list(parts.fields.shape) == shape
    assert parts.fields.reshape(-1).tolist() == fields
    assert list(parts.scales.shape) == layout.params_shape(scheme, shape)
    assert parts.scales.reshape(-1).tolist() == scales
    assert parts.global_scale == global_scale

    back = decode(payload, scheme, shape)
    assert back.dtype == torch.float32 and list(back.shape) == shape
    assert struct.pack(f"<{n}f", *decoded) == back.numpy().tobytes()


@pytest.mark.parametrize("value", ["Q8S", "Q4F", "Q2S", "E4M3", "E2M1"], ids=str)
@pytest.mark.parametrize("level", [LEVELS[0], LEVELS[1], LEVELS[3], LEVELS[4]], ids=lambda lv: lv[0])
def test_absmean_payload_matches_reference(value, level):
    value = QuantValue(value)
    shape = [5, 36]
    scheme = scheme_of(value, PackedU32(0), *level[1:])
    data = sample(180, seed=7)
    payload, *_ = reference(data, shape, value, PackedU32(0), level, calibration="AbsMean")
    got = encode(torch.tensor(data).reshape(shape), scheme, Calibration.AbsMean)
    assert bytes(got.numpy()) == payload


def test_powers_of_two_give_the_obvious_fields():
    """alpha = 7 * 2^-2 in every block of Q4S [8], so s = 0.25 exactly and q = 4x: no rounding involved."""
    q = [7, -3, 0, 5, -7, 2, 1, -1, -7, 6, 4, 0, 0, 0, 0, 3]
    x = torch.tensor([v / 4 for v in q], dtype=torch.float32).reshape(2, 8)
    scheme = QuantScheme().with_value(QuantValue.Q4S).per_block([8], ScaleDtype.F16)
    # Nibbles low first: row 0 = 7 D 0 5 9 2 1 F, row 1 = 9 6 4 0 0 0 0 3; then F16 0.25 = 0x3400, twice.
    assert encode(x, scheme).numpy().tobytes() == bytes.fromhex("d75029f1 69040030 0034 0034")


@pytest.mark.parametrize(
    ("x", "scheme", "hex_bytes"),
    [
        # Q2S, s = 1: q = 1, -1, 0, 1, round(-0.5) = 0 -> 2-bit fields 01 11 00 01 | 00, one word; f32 1.0.
        (
            [[1.0, -1.0, 0.0, 1.0, -0.5]],
            QuantScheme().with_value(QuantValue.Q2S),
            "4d000000 0000803f",
        ),
        # nvfp4: alpha 5.25, raw 0.875, global 0.875 / 448 = 2^-9, relative 448 (0x7E), s_eff 0.875;
        # v = 6, -3, 0.5 -> codes 7, 13, 1 -> bytes D7 01; then 0x7E and f32 2^-9.
        ([[5.25, -2.625, 0.4375]], QuantScheme.nvfp4(), "d701 7e 0000003b"),
        # E4M3 Native, BF16 per tensor: s = 448 / 448 = 1 -> 448 = 0x7E, -1 = 0xB8, 2^-9 = 0x01 (smallest
        # subnormal), 0.3 -> 0.3125 = 0x2A (nearer than 0.28125); bf16 1.0 = 0x3F80.
        (
            [448.0, -1.0, 2.0**-9, 0.3],
            QuantScheme().with_value(QuantValue.E4M3).with_store(Native()).per_tensor(ScaleDtype.BF16),
            "7eb8012a 803f",
        ),
        # MXFP4-like, E2M1 pairs in blocks of 32 with UE8M0 scales: alpha 6, raw 6 / 6 = 1 = 2^0 -> code
        # 127 (0x7F); v = 6, -3, 0.5 -> codes 7, 8 | 5 = 0xD, 1 -> bytes D7 01 (even element low).
        (
            [[6.0, -3.0, 0.5]],
            QuantScheme().with_value(QuantValue.E2M1).with_store(PackedNative(0)).per_block([32], ScaleDtype.UE8M0),
            "d701 7f",
        ),
        # Q2S per tensor, UE8M0: raw 3e38 is past 2^127, so the scale saturates at 2^127 (code 254 = 0xFE);
        # 3e38 / 2^127 = 1.76 -> clamped to 1 (01), -1e38 / 2^127 = -0.59 -> -1 (11): byte 0b1101, one word.
        (
            [3e38, -1e38],
            QuantScheme().with_value(QuantValue.Q2S).per_tensor(ScaleDtype.UE8M0),
            "0d000000 fe",
        ),
    ],
    ids=["q2s-word", "nvfp4", "e4m3-native-bf16", "mxfp4-ue8m0", "q2s-ue8m0-saturates"],
)
def test_hand_worked_payloads(x, scheme, hex_bytes):
    assert encode(torch.tensor(x), scheme).numpy().tobytes() == bytes.fromhex(hex_bytes)
