"""QFloat byte lengths (qfloat-spec §3.4 and hand counts); Burn's length vectors are in test_vectors.py."""

from __future__ import annotations

import pytest

from qcli import layout
from qcli.scheme import Native, PackedNative, QuantScheme, QuantValue, ScaleDtype

Q4S = QuantScheme().with_value(QuantValue.Q4S)
NATIVE_Q8S_B4 = QuantScheme().with_value(QuantValue.Q8S).with_store(Native()).per_block([4], ScaleDtype.UE4M3)


@pytest.mark.parametrize(
    ("scheme", "shape", "length"),
    [
        (Q4S, [3, 3], 16),
        (Q4S, [2, 5, 9], 84),
        (Q4S, [4, 8], 20),
        (NATIVE_Q8S_B4, [8], 10),
        (NATIVE_Q8S_B4.per_tensor(ScaleDtype.F32), [8], 14),
        (QuantScheme().with_value(QuantValue.Q2S).with_store(Native()), [5, 5], 29),
        (QuantScheme.nvfp4(), [4, 32], 76),
    ],
)
def test_spec_table(scheme, shape, length):
    assert layout.quantized_data_len(scheme, shape) == length


def test_regions():
    """Q4S [32] F16 on [3, 40]: rows of 40 nibbles take 5 words; grid [3, 2] of 2-byte scales."""
    scheme = Q4S.per_block([32], ScaleDtype.F16)
    assert layout.row_elements(scheme, 40) == 5
    assert layout.value_bytes(scheme, [3, 40]) == 3 * 5 * 4
    assert layout.params_shape(scheme, [3, 40]) == [3, 2]
    assert layout.scale_bytes(scheme, [3, 40]) == 12
    assert layout.global_bytes(scheme) == 0 and layout.global_bytes(QuantScheme.nvfp4()) == 4
    assert layout.quantized_data_len(scheme, [3, 40]) == 72


def test_packed_native_e2m1_pads_rows_to_whole_bytes():
    scheme = QuantScheme().with_value(QuantValue.E2M1).with_store(PackedNative(0))
    assert layout.quantized_data_len(scheme, [3, 5]) == 3 * 3 + 4


@pytest.mark.parametrize(
    ("scheme", "length"),
    [(QuantScheme().with_value(QuantValue.Q8S), 4 + 4), (QuantScheme().with_store(Native()), 1 + 4)],
    ids=["packed", "native"],
)
def test_rank_0_is_one_value(scheme, length):
    assert layout.quantized_data_len(scheme, []) == length
    assert layout.params_shape(scheme, []) == [1]


def test_bits_per_weight():
    """Q4S [32] F16 on [64, 64]: 4 bits per value plus one 16-bit scale per 32 values = 4.5."""
    q4s_b32 = Q4S.per_block([32], ScaleDtype.F16)
    assert layout.bits_per_weight(layout.quantized_data_len(q4s_b32, [64, 64]), 64 * 64) == 4.5
    assert layout.bits_per_weight(layout.quantized_data_len(Q4S, [0, 8]), 0) == 0.0
