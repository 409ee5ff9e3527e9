"""Burn's scheme vocabulary: BlockSize canonicalisation, serde and CBOR bytes, and every refusal.

Expectations come from qfloat-spec §1 (cubecl scheme.rs at 48348968); vectors 9-12 and 61 are in
tests/codec/test_vectors.py.
"""

from __future__ import annotations

import cbor2
import pytest

from qcli.errors import SchemeError
from qcli.scheme import (
    BlockSize,
    Calibration,
    Native,
    PackedNative,
    PackedU32,
    QuantMode,
    QuantScheme,
    QuantValue,
    ScaleDtype,
    accept_problems,
    check_accepted,
)
from tests import qfloat_reference as ref


@pytest.mark.parametrize(
    ("dims", "storage", "length"),
    [
        ([32], (32, 1, 1, 1, 1), 1),
        ([1, 32], (32, 1, 1, 1, 1), 1),
        (32, (32, 1, 1, 1, 1), 1),
        ([4, 32], (4, 32, 1, 1, 1), 2),
        ([1, 1], (1, 1, 1, 1, 1), 0),
        ([2, 1, 16], (2, 1, 16, 1, 1), 3),  # only leading 1s are dropped
        ([1, 1, 8, 4, 2, 3], (8, 4, 2, 3, 1), 4),
        ([1, 2, 3, 4, 5, 6], (2, 3, 4, 5, 6), 5),
    ],
)
def test_block_size_canonical_form(dims, storage, length):
    block = BlockSize.new(dims)
    assert (block.storage, block.len) == (storage, length)
    assert block.to_serde() == {"storage": list(storage), "len": length}


@pytest.mark.parametrize("dims", [[2, 1, 1, 1, 1, 1], [0], [256], [32, -1], [True], [1.5]])
def test_block_size_refuses_what_burn_cannot_store(dims):
    with pytest.raises(SchemeError) as err:
        BlockSize.new(dims)
    assert err.value.hint


def test_block_is_right_aligned():
    assert BlockSize.new([4, 32]).to_dim_vec(4) == [1, 1, 4, 32]
    assert BlockSize.new([4, 32]).to_dim_vec(1) == [32]
    assert BlockSize.new([32]).num_blocks([3, 70]) == [3, 3]


def test_levels_set_in_either_order_build_the_same_scheme():
    a = QuantScheme().per_block([16], ScaleDtype.UE4M3).per_tensor(ScaleDtype.F32)
    b = QuantScheme().per_tensor(ScaleDtype.F32).per_block([16], ScaleDtype.UE4M3)
    assert a == b and hash(a) == hash(b)


def test_cbor_of_the_spec_example_is_byte_exact():
    """qfloat-spec §1.8: default().with_value(Q4S).per_block([4], F16) as DType::QFloat, 102 bytes."""
    expected = (
        "a1 6651466c6f6174 a5 6576616c7565 63513453 6573746f7265 a1 695061636b6564553332 00 646d6f6465 "
        "6953796d6d6574726963 6674656e736f72 f6 65626c6f636b a2 6473697a65 a2 6773746f72616765 85 04 01 01 "
        "01 01 636c656e 01 656474797065 63463136"
    )
    scheme = QuantScheme().with_value(QuantValue.Q4S).per_block([4], ScaleDtype.F16)
    encoded = cbor2.dumps({"QFloat": scheme.to_serde()})
    assert encoded == bytes.fromhex(expected.replace(" ", "")) and len(encoded) == 102


@pytest.mark.parametrize(
    "scheme",
    [
        QuantScheme(),
        QuantScheme.nvfp4(),
        QuantScheme().with_value(QuantValue.E5M2).with_store(Native()).per_tensor(ScaleDtype.BF16),
        QuantScheme().with_value(QuantValue.Q2F).with_mode(QuantMode.Lookup).per_block([2, 3, 16], ScaleDtype.F16),
    ],
    ids=str,
)
def test_serde_round_trip(scheme):
    assert QuantScheme.from_serde(cbor2.loads(cbor2.dumps(scheme.to_serde()))) == scheme


@pytest.mark.parametrize(
    "obj",
    [
        "Q4S",
        {"value": "Q4S"},
        {"value": "Q9S", "store": "Native", "mode": "Symmetric", "tensor": None, "block": None},
        {"value": "Q4S", "store": {"PackedU32": -1}, "mode": "Symmetric", "tensor": None, "block": None},
        {
            "value": "Q4S",
            "store": "Native",
            "mode": "Symmetric",
            "tensor": None,
            "block": {"size": {"storage": [32, 1, 1, 1], "len": 1}, "dtype": "F16"},
        },
    ],
)
def test_malformed_serde_is_a_scheme_error(obj):
    with pytest.raises(SchemeError):
        QuantScheme.from_serde(obj)


Q8S, Q4S, Q2S = QuantValue.Q8S, QuantValue.Q4S, QuantValue.Q2S
REFUSED = [
    ("lookup", QuantScheme().with_mode(QuantMode.Lookup), "Lookup"),
    # Burn 0.22.1 quantizable(): UE8M0 reaches 2^127, past f16, so it has no two-level form.
    ("ue8m0-under-global", QuantScheme().per_block([32], ScaleDtype.UE8M0).per_tensor(ScaleDtype.F32), "f16"),
    ("f32-under-global", QuantScheme().per_block([32], ScaleDtype.F32).per_tensor(ScaleDtype.F32), "f16"),
    ("bf16-under-global", QuantScheme().per_block([32], ScaleDtype.BF16).per_tensor(ScaleDtype.F32), "f16"),
    ("f16-global", QuantScheme().per_block([32], ScaleDtype.UE4M3).per_tensor(ScaleDtype.F16), "as f32"),
    ("native-q4", QuantScheme().with_value(Q4S).with_store(Native()), "sub-byte"),
    ("native-q2", QuantScheme().with_value(Q2S).with_store(Native()), "sub-byte"),
    ("native-e2m1", QuantScheme().with_value(QuantValue.E2M1).with_store(Native()), "sub-byte"),
    ("packednative-q8", QuantScheme().with_value(Q8S).with_store(PackedNative(0)), "native packing"),
    ("packednative-q4", QuantScheme().with_value(Q4S).with_store(PackedNative(0)), "native packing"),
    ("packedu32-dim2", QuantScheme().with_store(PackedU32(2)), "outer axis"),
    ("packednative-dim1", QuantScheme.nvfp4().with_store(PackedNative(1)), "outer axis"),
]

# Refused by Burn's own quantizer only: Burn loads such payloads, so the codec writes them (the spec's
# worked example packs Q4S in blocks of 4) and the plan reports them.
QUANTIZER_ONLY = [
    ("q2-block8", QuantScheme().with_value(Q2S).per_block([8], ScaleDtype.F16), "multiple of 16"),
    ("q4-block4", QuantScheme().with_value(Q4S).per_block([4], ScaleDtype.F16), "multiple of 8"),
    ("q8-block2", QuantScheme().with_value(Q8S).per_block([4, 2], ScaleDtype.F16), "multiple of 4"),
]


@pytest.mark.parametrize(("scheme", "why"), [pytest.param(s, w, id=i) for i, s, w in REFUSED])
def test_refusals(scheme, why):
    problems = accept_problems(scheme)
    assert any(why in p.message for p in problems), [p.message for p in problems]
    assert all(p.message and p.hint for p in problems)
    with pytest.raises(SchemeError) as err:
        check_accepted(scheme)
    assert err.value.hint and err.value.exit_code == 2


@pytest.mark.parametrize(("scheme", "why"), [pytest.param(s, w, id=i) for i, s, w in QUANTIZER_ONLY])
def test_quantizer_only_refusals_leave_the_layout_to_the_codec(scheme, why):
    (refusal,) = accept_problems(scheme)
    assert why in refusal.message and refusal.hint and not accept_problems(scheme, quantizer=False)
    check_accepted(scheme)


@pytest.mark.parametrize("dtype", list(ScaleDtype))
def test_no_scale_dtype_is_refused_for_its_own_sake(dtype: ScaleDtype) -> None:
    """Burn 0.22.1 (cubecl 0.11.3) has a round-up rule for every scale dtype, UE8M0 included, so each
    stores a one-level scale."""
    assert not accept_problems(QuantScheme().per_tensor(dtype))
    assert not accept_problems(QuantScheme().per_block([32], dtype))


def test_absmean_has_no_two_level_form():
    assert any("AbsMean" in p.message for p in accept_problems(QuantScheme.nvfp4(), Calibration.AbsMean))
    assert not accept_problems(QuantScheme().per_block([32], ScaleDtype.F16), Calibration.AbsMean)


@pytest.mark.parametrize(
    "scheme",
    [
        QuantScheme(),
        QuantScheme.nvfp4(),
        QuantScheme().with_value(Q4S).per_block([32], ScaleDtype.F16),
        QuantScheme().with_value(Q2S).per_block([16], ScaleDtype.F16).per_tensor(ScaleDtype.F32),
        QuantScheme().with_value(Q8S).with_store(Native()).per_tensor(ScaleDtype.F32),
        QuantScheme().with_value(QuantValue.E4M3).with_store(Native()).per_block([32], ScaleDtype.UE4M3),
        QuantScheme().with_value(QuantValue.E2M1).per_block([4, 32], ScaleDtype.BF16),
        QuantScheme().with_value(Q8S).with_store(Native()).per_block([3], ScaleDtype.F32),
        # Burn 0.22.1 (burn-std quantization.rs quantizable_declines_what_no_backend_can_store): one-level
        # UE8M0 per block and per tensor, and MXFP4's E2M1 in blocks of 32 with UE8M0 scales.
        QuantScheme().per_block([4], ScaleDtype.UE8M0),
        QuantScheme().per_tensor(ScaleDtype.UE8M0),
        QuantScheme().with_value(QuantValue.E2M1).per_block([32], ScaleDtype.UE8M0),
        QuantScheme().with_value(QuantValue.E2M1).with_store(PackedNative(0)).per_block([32], ScaleDtype.UE8M0),
    ],
    ids=str,
)
def test_accepted(scheme):
    assert accept_problems(scheme) == []
    check_accepted(scheme)


@pytest.mark.parametrize("value", list(QuantValue))
def test_each_value_types_traits_agree_with_the_independent_oracle(value: QuantValue) -> None:
    # The one row qcli keeps per value type (`VALUE_TRAITS`) against tests/qfloat_reference.py, which
    # enumerates every minifloat code on its own: width, range, and half the widest gap of the grid.
    assert value.size_bits() == ref.BITS[value.value] and value.range() == ref.RANGE[value.value]
    grid = ref.MINIFLOAT.get(value.value, [float(q) for q in range(0, int(value.range()[1]) + 1)])
    widest = max(b - a for a, b in zip(grid, grid[1:], strict=False))
    assert value.half_step() == widest / 2
    assert value.is_minifloat() == (value.value in ref.MINIFLOAT)


@pytest.mark.parametrize("dtype", list(ScaleDtype))
def test_each_scale_dtypes_traits_agree_with_the_independent_oracle(dtype: ScaleDtype) -> None:
    # The one row qcli keeps per scale dtype (`SCALE_TRAITS`) against tests/qfloat_reference.py, which
    # enumerates every grid but F32's on its own: bytes, largest and smallest positive scale, and a sign.
    assert dtype.scale_size() == len(ref.scale_bytes(1.0, dtype.value))
    assert dtype.max_representable() == ref.SCALE_MAX[dtype.value]
    assert dtype.traits.smallest == ref.round_up(2.0**-149, dtype.value)
    assert dtype.traits.signed == (dtype.value in ref.SIGNED_SCALES)
