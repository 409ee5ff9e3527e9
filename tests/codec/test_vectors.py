"""Every vector of tests/data/burn-vectors.json that concerns a writer, codec, scheme or layout.

Each vector is one test, `test_vector[<index>-<source>]`, checked by the function registered for its
index; `test_every_vector_is_accounted_for` keeps the registry and the file in step.

Left to tests/io/test_burnpack.py (filtered out here by their source, `burn-pack`, `model.bpk` or
`burnpack-spec`): 52-58 and 62. 59 describes a Burn-written MNIST file the repository no longer holds:
test_burnpack.py reads the files the Burn harness writes (tests/data/burn) instead.

Vectors that do not apply to a writer, and what is asserted instead:
- 13 (`swap_block_dims`): Burn rewrites a scheme when a packed tensor is permuted; qcli never permutes a
  quantized tensor, it transposes the float tensor before quantizing. Not collected.
- 17, 35, 36 (NdArray / Flex): those backends round ties away from zero and Flex multiplies by 1/s; the
  vectors hold no tie and no reciprocal-sensitive value, so qcli's half-even true division gives the
  same q and is asserted as such.
- 25: Burn leaves an all-zero block's relative scale at 0; qcli stores round_up(f32::MIN_POSITIVE)
  (UE4M3 2^-9), as docs/arithmetic.md §2 says. The global (f32::MIN_POSITIVE) is asserted as in Burn.
- 33: the cubecl backend refuses PackedU32 when the last axis is not a multiple of the pack width; the
  codec pads each row as the layout says (asserted), and the plan is what refuses or warns.
- 45: F32 block scales under a global are a cubecl decoder test; Burn refuses to quantize that scheme
  (asserted), and qcli's decoder still reads it (asserted).
- 47 (Lookup decode): Lookup does not travel as QFloat at the pin; qcli refuses it (asserted).
- 49 (newer Burn): PackedU32(0) words asserted; the PackedU32(1) half is refused at the pin (asserted).
- 50 (UE8M0 block scales): the scale bytes and the payload length.
- 51 (newer cubek): the intended E2M1 RNE encode, which qcli implements, is asserted.
- 60 (worked example): bytes asserted with half-even rounding (qcli, CUDA); the half-away bytes
  (NdArray/Flex) differ only in the tie 2.5 -> 3 vs 2. Its block [4] is narrower than a Q4 word,
  which only Burn's own quantizer refuses; Burn loads it, so the codec writes it.
- 61: the QFloat entries are asserted; the plain DType entries (`F32`, `Bool(Native)`) belong to the
  container's dtype mapping.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable

import cbor2
import pytest
import torch

from qcli import layout
from qcli.codec import QuantizedParts, decode, encode, pack, quantize_parts, round_up
from qcli.codec.minifloat import encode as encode_minifloat
from qcli.codec.minifloat import table
from qcli.codec.pack import pack_fields, pack_scales, unpack_fields, unpack_scales
from qcli.codec.scales import block_alpha, block_reduce, scales_from_alpha
from qcli.codec.values import from_fields, to_fields
from qcli.errors import SchemeError
from qcli.scheme import (
    E4M3,
    F32_MIN_POSITIVE,
    BlockSize,
    Calibration,
    Native,
    PackedU32,
    QuantScheme,
    QuantValue,
    ScaleDtype,
    accept_problems,
    check_accepted,
)
from tests.burn_facts import VECTORS

CONTAINER_SOURCES = ("burn-pack", "model.bpk", "burnpack-spec")
NOT_COLLECTED = {13}  # see the module docstring
CHECKS: dict[int, Callable[[dict], None]] = {}


def check(*indices: int):
    def register(fn):
        for i in indices:
            CHECKS[i] = fn
        return fn

    return register


def f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


def f32_bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def words_bytes(words: list[int]) -> bytes:
    return b"".join(struct.pack("<I", w) for w in words)


def scheme_of(v: dict) -> QuantScheme:
    return QuantScheme.from_serde(v["scheme"])


def as_hex(t: torch.Tensor) -> str:
    return t.numpy().tobytes().hex()


def applies(i: int, v: dict) -> bool:
    return not any(s in v["source"] for s in CONTAINER_SOURCES) and i not in NOT_COLLECTED


# --- packing (burn-std quantization.rs) ---


@check(0, 1)
def _pack_i8s(v):
    got = pack_fields(torch.tensor(v["input"], dtype=torch.int32), scheme_of(v))
    assert got.numpy().tobytes() == words_bytes(v["expected"]["u32_words"])
    if "bytes_le" in v["expected"]:
        assert as_hex(got) == v["expected"]["bytes_le"]


@check(2, 3, 4)
def _unpack(v):
    words = v["input"]["u32_words"]
    region = torch.frombuffer(bytearray(words_bytes(words)), dtype=torch.uint8)
    assert unpack_fields(region, scheme_of(v), [v["input"]["numel"]]).tolist() == v["expected"]["values"]
    if len(words) == 16:  # 4: these words are quantize(arange(128)), Q4S per tensor, s = f32(127 / 7)
        payload = encode(torch.arange(128, dtype=torch.float32), scheme_of(v))
        assert payload.numpy().tobytes() == words_bytes(words) + struct.pack("<f", 127 / 7)


@check(5, 7)
def _quantized_bytes(v):
    scheme, shape, inp = scheme_of(v), v["shape"], v["input"]
    scales = inp.get("scales", inp.get("block_scales"))
    fields = torch.tensor(inp["i8_values"], dtype=torch.int32).reshape(shape)
    payload = pack(QuantizedParts(fields, torch.tensor(scales), None), scheme, shape)
    assert as_hex(payload) == v["expected"]["bytes"]
    assert payload.numel() == v["expected"]["len"] == layout.quantized_data_len(scheme, shape)
    n = layout.value_bytes(scheme, shape)
    assert unpack_fields(payload[:n], scheme, shape).reshape(-1).tolist() == inp["i8_values"]
    decoded_scales = unpack_scales(payload[n:], scheme.scale_dtype()).tolist()
    assert decoded_scales == v["expected"].get("decoded_scales", v["expected"].get("decoded_block"))


@check(20, 21)
def _packed_q8s_with_f32_scales(v):
    scheme, shape, inp = scheme_of(v), v["shape"], v["input"]
    fields = torch.tensor(inp["i8_values"], dtype=torch.int32)
    payload = pack(QuantizedParts(fields, torch.tensor(inp["scales"]), None), scheme, shape)
    assert as_hex(payload) == v["expected"]["bytes"]
    assert payload.numel() == v["expected"]["len"] == layout.quantized_data_len(scheme, shape)
    if scheme.block is None:  # 20: quantizing the data behind these values gives the same bytes
        x = torch.tensor([-1.8, -1.0, 0.0, 0.5])
        assert as_hex(encode(x, scheme)) == v["expected"]["bytes"]


@check(6)
def _two_level_bytes(v):
    scheme, shape, inp = scheme_of(v), v["shape"], v["input"]
    fields = torch.tensor(inp["i8_values"], dtype=torch.int32)
    payload = pack(QuantizedParts(fields, torch.tensor(inp["block_scales"]), inp["global"]), scheme, shape)
    assert as_hex(payload) == v["expected"]["bytes"]
    assert payload.numel() == v["expected"]["len"] == layout.quantized_data_len(scheme, shape)
    assert unpack_scales(payload[8:10], ScaleDtype.UE4M3).tolist() == v["expected"]["decoded_block"]
    assert struct.unpack("<f", payload[10:].numpy().tobytes())[0] == v["expected"]["decoded_global"]


# --- scales ---


@check(8)
def _scale_to_dtype(v):
    s = torch.tensor(v["input"], dtype=torch.float32)
    for dtype, expected in v["expected"].items():
        rounded = round_up(s, ScaleDtype(dtype))
        assert rounded.tolist() == expected["rounded"], dtype
        assert as_hex(pack_scales(rounded, ScaleDtype(dtype))) == expected["encoded_hex"], dtype


@check(14)
def _round_up_each_dtype(v):
    for dtype, expected in v["expected"].items():
        got = round_up(torch.tensor([v["input"]["scale"]]), ScaleDtype(dtype)).item()
        assert got == f32(expected), dtype


@check(15)
def _round_up_f32_identity(v):
    s = torch.tensor(v["input"], dtype=torch.float32)
    assert round_up(s, ScaleDtype.F32).tolist() == [f32(x) for x in v["expected"]["F32_round_up"]]


@check(16)
def _round_up_edges(v):
    for dtype, cases in v["expected"].items():
        maximum = ScaleDtype(dtype).max_representable()
        assert maximum == cases["max"]
        inputs = {
            "round_up(max)": maximum,
            "round_up(2*max)": 2 * maximum,
            "round_up(0)": 0.0,
            "round_up(1e-30)": 1e-30,
            "round_up(1.7)": 1.7,
            "round_up(2^-7)": 2.0**-7,
        }
        for key, x in inputs.items():
            got = round_up(torch.tensor([x], dtype=torch.float32), ScaleDtype(dtype)).item()
            assert got == cases[key], (dtype, key)


@check(22)
def _compute_q_params(v):
    alpha = max(abs(v["input"]["min"][0]), abs(v["input"]["max"][0]))
    got = scales_from_alpha(torch.tensor([alpha]), scheme_of(v)).stored.tolist()
    assert got == pytest.approx(v["expected"]["scales_approx"], rel=1e-6)


@check(23)
def _per_block_params(v):
    alpha = [max(abs(a), abs(b)) for a, b in zip(v["input"]["min"], v["input"]["max"], strict=True)]
    got = scales_from_alpha(torch.tensor(alpha), scheme_of(v)).stored.tolist()
    assert got == v["expected"]["scales_f32_computed"]


@check(24)
def _two_level_recipe(v):
    alpha = [max(abs(a), abs(b)) for a, b in zip(v["input"]["min"], v["input"]["max"], strict=True)]
    scheme = scheme_of(v)
    scales = scales_from_alpha(torch.tensor(alpha), scheme)
    e = v["expected"]
    assert f32_bits(scales.global_scale) == int(e["global_f32_bits"], 16)
    assert scales.global_scale == f32(e["global_computed"])
    assert scales.stored.tolist() == e["stored_ue4m3_after_round_up_computed"]
    assert round_up(torch.tensor(e["relative_scales_computed"]), ScaleDtype.UE4M3).tolist() == scales.stored.tolist()
    assert as_hex(pack_scales(scales.stored, ScaleDtype.UE4M3)) == e["stored_ue4m3_bytes_computed"]


@check(25)
def _two_level_all_zero(v):
    scales = scales_from_alpha(torch.zeros(4), scheme_of(v))
    assert scales.global_scale == v["expected"]["global_computed"] == F32_MIN_POSITIVE
    assert torch.isfinite(scales.stored).all()
    assert scales.stored.tolist() == [2.0**-9] * 4  # Burn: 0 (see the module docstring)


# --- values ---


def _fields_with_scale(x: list[float], scheme: QuantScheme, shape, scale: float) -> torch.Tensor:
    grid = layout.BlockGrid.of(scheme, shape)
    effective = torch.full(grid.grid, scale, dtype=torch.float32)
    return to_fields(torch.tensor(x, dtype=torch.float32).reshape(shape), effective, grid, scheme.value)


@check(26)
def _quantize_with_scale(v):
    q = _fields_with_scale(v["input"]["x"], scheme_of(v), v["shape"], v["input"]["scales"][0])
    assert q.tolist() == v["expected"]["q"]


@check(17, 27, 35, 39)
def _quantize_dynamic_per_tensor(v):
    parts = quantize_parts(torch.tensor(v["input"], dtype=torch.float32).reshape(v["shape"]), scheme_of(v))
    e = v["expected"]
    scale = parts.scales.item()
    if "scale_f32_bits" in e:
        assert f32_bits(scale) == int(e["scale_f32_bits"], 16)
    for key in ("scale", "scale_f32_computed"):
        if key in e:
            assert scale == e[key]
    q = parts.fields.reshape(-1).tolist()
    if "q" in e or "q_computed" in e:
        assert q == e.get("q", e.get("q_computed"))
    if "q_literal_subset" in e:
        assert all(q[int(i)] == val for i, val in e["q_literal_subset"].items())
    if "dequantized" in e:
        back = decode(encode(torch.tensor(v["input"]), scheme_of(v)), scheme_of(v), v["shape"])
        assert back.tolist() == pytest.approx(e["dequantized"], rel=1e-6)


@check(18)
def _quantize_per_block(v):
    parts = quantize_parts(torch.tensor(v["input"]), scheme_of(v))
    assert parts.fields.tolist() == v["expected"]["q"]


@check(28)
def _quantize_2d_block(v):
    parts = quantize_parts(torch.tensor(v["input"], dtype=torch.float32), scheme_of(v))
    e = v["expected"]
    assert list(parts.scales.shape) == e["block_scales_grid_shape"]
    assert parts.scales.reshape(-1).tolist() == e["block_scales_f32_computed"]
    assert parts.scales.reshape(-1).tolist() == pytest.approx(e["block_scales_approx"], rel=1e-6)
    assert parts.fields.eq(127).all()  # "every element 127"


@check(36)
def _zero_tensor(v):
    parts = quantize_parts(torch.tensor(v["input"]["x"], dtype=torch.float32), scheme_of(v))
    assert parts.fields.tolist() == v["expected"]["q"]
    assert parts.scales.tolist() == [F32_MIN_POSITIVE]  # round_up(f32::MIN_POSITIVE) onto F32, as Flex


@check(37)
def _ue4m3_per_tensor(v):
    x = torch.tensor(v["input"]).reshape(v["shape"])
    parts = quantize_parts(x, scheme_of(v))
    e = v["expected"]
    assert f32(9 / 254) == e["exact_f32"] and parts.scales.tolist() == [e["stored_ue4m3"]]
    assert as_hex(encode(x, scheme_of(v))[-1:]) == e["stored_byte"]


@check(38)
def _per_block_dynamic(v):
    parts = quantize_parts(torch.tensor(v["input"]), scheme_of(v))
    assert parts.scales.tolist() == pytest.approx(v["expected"]["scales_approx"], rel=1e-6)


@check(51)
def _e2m1_round_to_nearest_even(v):
    scheme = scheme_of(v)
    codes = _fields_with_scale(v["input"]["x"], scheme, v["shape"], v["input"]["scale"])
    assert from_fields(codes, scheme.value).reshape(-1).tolist() == v["expected"]["dequantized"]


# --- calibration ---


def _alpha(v, calibration: Calibration) -> list[float]:
    x = torch.tensor(v["input"], dtype=torch.float32)
    grid = layout.BlockGrid.of(scheme_of(v), x.shape)
    return block_alpha(block_reduce(x, grid, calibration), grid, calibration).reshape(-1).tolist()


@check(29, 30)
def _minmax(v):
    e = v["expected"]
    mins, maxs = torch.tensor(e["min"]).reshape(-1), torch.tensor(e["max"]).reshape(-1)
    assert _alpha(v, Calibration.MinMax) == torch.maximum(mins.abs(), maxs.abs()).tolist()


@check(31, 32)
def _absmean(v):
    e = v["expected"]
    assert _alpha(v, Calibration.AbsMean) == [f32(g) for g in torch.tensor(e["max"]).reshape(-1).tolist()]
    assert [-a for a in _alpha(v, Calibration.AbsMean)] == torch.tensor(e["min"]).reshape(-1).tolist()
    if "implied_scale_computed" in e:
        parts = quantize_parts(torch.tensor(v["input"]), scheme_of(v), Calibration.AbsMean)
        assert parts.scales.tolist() == [e["implied_scale_computed"]]


# --- decoding (cubecl-std quantized view tests) ---


def _payload(v, scales: bytes) -> bytes:
    return words_bytes(v["input"]["u32_words"]) + scales


@check(43)
def _decode_q4f(v):
    payload = _payload(v, struct.pack("<f", v["input"]["scale"]))
    assert decode(payload, scheme_of(v), v["shape"]).tolist() == v["expected"]["dequantized"]


@check(44)
def _decode_e2m1(v):
    payload = _payload(v, struct.pack("<f", v["input"]["scale"]))
    codes = unpack_fields(torch.frombuffer(bytearray(payload[:8]), dtype=torch.uint8), scheme_of(v), [16])
    assert codes.tolist() == v["expected"]["codes"]
    got = decode(payload, scheme_of(v), v["shape"])
    assert got.tolist() == v["expected"]["dequantized"]
    assert got[8].item() == 0.0 and got[8].signbit()  # code 8 is -0.0


@check(45)
def _decode_two_level_f32_blocks(v):
    scheme = scheme_of(v)
    assert accept_problems(scheme)  # Burn will not quantize F32 blocks under a global
    scales = struct.pack("<2f", *v["input"]["block_scales"]) + struct.pack("<f", v["input"]["global"])
    assert decode(_payload(v, scales), scheme, v["shape"]).tolist() == v["expected"]["dequantized"]


@check(46)
def _decode_two_level_ue4m3(v):
    scales = bytes.fromhex(v["input"]["block_scale_bytes"]) + struct.pack("<f", v["input"]["global"])
    assert (
        unpack_scales(torch.tensor(list(scales[:2]), dtype=torch.uint8), ScaleDtype.UE4M3).tolist()
        == (v["expected"]["block_scales"])
    )
    assert decode(_payload(v, scales), scheme_of(v), v["shape"]).tolist() == v["expected"]["dequantized"]


@check(19)
def _dequantize(v):
    scheme, shape = scheme_of(v), v["shape"]
    q = torch.tensor(v["input"]["q"], dtype=torch.int32).reshape(shape)
    payload = pack(QuantizedParts(q, torch.tensor([v["input"]["scale"]]), None), scheme, shape)
    got = decode(payload, scheme, shape).reshape(-1).tolist()
    assert got == pytest.approx(v["expected"]["dequantized_approx"], rel=1e-6)


@check(47)
def _lookup_refused(v):
    scheme = scheme_of(v)
    with pytest.raises(SchemeError, match="lookup"):
        decode(bytes(layout.quantized_data_len(scheme, v["shape"])), scheme, v["shape"])
    with pytest.raises(SchemeError):
        encode(torch.ones(v["shape"]), scheme)


@check(48)
def _e4m3_saturation(v):
    clamped = torch.tensor(v["input"], dtype=torch.float32).clamp(-448, 448)
    codes = encode_minifloat(clamped, E4M3)
    assert codes.tolist() == [int(v["expected"]["MAX_bits"], 16)] * 2
    assert table(E4M3)[codes.long()].tolist() == v["expected"]["e4m3_to_f32"]
    assert table(E4M3)[0x7F].isnan() and table(E4M3)[0xFF].isnan()


@check(49)
def _rows_pack_on_their_own(v):
    scheme = scheme_of(v)
    got = pack_fields(torch.tensor(v["input"]["rows"], dtype=torch.int32), scheme)
    assert got.numpy().tobytes() == words_bytes(v["expected"]["u32_words"])
    # The outer-axis half: Burn packs the [8, 2] transpose along its first axis (PackedU32(1)) into the same
    # words, so qcli's decode of those words under PackedU32(1) (scale 1) gives the transpose's codes.
    outer = scheme.with_store(PackedU32(1))
    payload = words_bytes(v["expected"]["u32_words"]) + struct.pack("<f", 1.0)
    rows = torch.tensor(v["input"]["rows"], dtype=torch.float32)
    assert torch.equal(decode(payload, outer, rows.t().shape), rows.t())


@check(50)
def _ue8m0_block_scales(v):
    scheme = scheme_of(v)
    check_accepted(scheme)
    scales = torch.tensor(v["input"]["block_scales"], dtype=torch.float32)
    assert as_hex(pack_scales(scales, ScaleDtype.UE8M0)) == v["expected"]["ue8m0_bytes_computed"]
    assert layout.quantized_data_len(scheme, v["shape"]) == v["expected"]["len"]


# --- schemes ---


QUANTIZABLE = {
    "default": QuantScheme(),
    "per_block([4],F16)": QuantScheme().per_block([4], ScaleDtype.F16),
    "per_block([4],UE4M3)+per_tensor(F32)": QuantScheme().per_block([4], ScaleDtype.UE4M3).per_tensor(ScaleDtype.F32),
    "per_block([4],UE8M0)": QuantScheme().per_block([4], ScaleDtype.UE8M0),
    "per_tensor(UE8M0)": QuantScheme().per_tensor(ScaleDtype.UE8M0),
    "per_block([4],F32)+per_tensor(F32)": QuantScheme().per_block([4], ScaleDtype.F32).per_tensor(ScaleDtype.F32),
    "per_block([4],UE4M3)+per_tensor(BF16)": QuantScheme().per_block([4], ScaleDtype.UE4M3).per_tensor(ScaleDtype.BF16),
}


@check(9)
def _quantizable(v):
    got = [not accept_problems(QUANTIZABLE[name]) for name in v["input"]]
    assert got == v["expected"]["quantizable"]


@check(10)
def _block_size_new(v):
    e = v["expected"]
    assert BlockSize.new([32]).to_dim_vec(2) == e["new([32]).to_dim_vec(2)"]
    assert BlockSize.new([32, 32]).to_dim_vec(2) == e["new([32,32]).to_dim_vec(2)"]
    assert (BlockSize.new([32]) != BlockSize.new([32, 32])) is e["new([32]) != new([32,32])"]
    assert (BlockSize.new([1, 32]) == BlockSize.new([32])) is e["new([1,32]) == new([32])"]
    assert (BlockSize.new([1, 1, 8, 4, 2, 3]) == BlockSize.new([8, 4, 2, 3])) is e[
        "new([1,1,8,4,2,3]) == new([8,4,2,3])"
    ]
    assert BlockSize.new([1, 32]).to_serde() == e["serde(new([1,32]))"]


@check(11)
def _num_blocks(v):
    for (block, shape), expected in zip(v["input"], v["expected"]["num_blocks"], strict=True):
        size = BlockSize.new(json.loads(block))
        assert size.num_blocks(shape) == expected
        scheme = (
            QuantScheme().with_value(QuantValue.Q8S).with_store(Native()).per_block(json.loads(block), ScaleDtype.F16)
        )
        assert layout.params_shape(scheme, shape) == expected


@check(12)
def _default_scheme(v):
    scheme, e = QuantScheme(), v["expected"]
    assert scheme == scheme_of(v)
    assert scheme.tensor_scale().value == e["tensor_scale"] and scheme.block_scale() is e["block_scale"]
    assert scheme.scale_dtype().value == e["scale_dtype"] and scheme.num_levels() == e["num_levels"]
    assert scheme.to_serde() == e["serde"]
    assert scheme != QuantScheme().per_tensor(ScaleDtype.F32)


SERDE_SCHEMES = {
    "default": QuantScheme(),
    "Q8S_PackedU32_pertensor": QuantScheme().with_value(QuantValue.Q8S),
    "Q8S_Native_pertensor_F32": QuantScheme()
    .with_value(QuantValue.Q8S)
    .with_store(Native())
    .per_tensor(ScaleDtype.F32),
    "nvfp4_preset": QuantScheme.nvfp4(),
    "Q4S_block_2x16_BF16": QuantScheme().with_value(QuantValue.Q4S).per_block([2, 16], ScaleDtype.BF16),
}


@check(61)
def _serde_cbor(v):
    for key, scheme in SERDE_SCHEMES.items():
        entry = v["expected"][key]
        assert {"QFloat": scheme.to_serde()} == entry["serde"], key
        assert cbor2.dumps({"QFloat": scheme.to_serde()}).hex() == entry["cbor_hex"], key
        assert QuantScheme.from_serde(entry["serde"]["QFloat"]) == scheme, key


# --- layout lengths ---


@check(40)
def _data_len_per_line(v):
    scheme = scheme_of(v)
    got = [layout.quantized_data_len(scheme, shape) for shape in v["input"]["shapes"]]
    assert got == v["expected"]["quantized_data_len"]


@check(41)
def _data_len_dense(v):
    one = scheme_of(v)
    two = one.per_tensor(ScaleDtype.F32)
    for key, expected in v["expected"].items():
        n, b = (int(t) for t in key.replace("v_block", " ").split())
        assert layout.quantized_data_len(one.per_block([b], ScaleDtype.UE4M3), [n]) == expected["one_level"]
        assert layout.quantized_data_len(two.per_block([b], ScaleDtype.UE4M3), [n]) == expected["two_level"]


@check(42)
def _data_len_table(v):
    for shape, row in v["expected"].items():
        shape = json.loads(shape)
        for value in (QuantValue.Q8S, QuantValue.Q4S, QuantValue.Q2S):
            native = QuantScheme().with_value(value).with_store(Native())
            assert layout.quantized_data_len(native, shape) == row["Native(Q8/Q4/Q2)"]
            packed = QuantScheme().with_value(value)
            assert layout.quantized_data_len(packed, shape) == row[f"PackedU32 Q{value.size_bits()}"]


@check(33)
def _rows_not_a_multiple_of_the_word(v):
    scheme, shape = scheme_of(v), v["shape"]
    payload = encode(torch.tensor(v["input"]), scheme)
    assert payload.numel() == 3 * 4 + 4  # each row of 2 values padded to one word, then the f32 scale
    assert payload[:12].reshape(3, 4)[:, 2:].eq(0).all()  # zero fields pad every row
    back = decode(payload, scheme, shape).reshape(-1).tolist()
    assert back == pytest.approx(torch.tensor(v["input"]).reshape(-1).tolist(), abs=6.35 / 127.5 / 2 + 1e-6)


@check(34)
def _packed_block_narrower_than_a_word(v):
    # Burn's own quantizer panics; its loader does not check, so the plan refuses it, not the codec.
    (refusal,) = accept_problems(scheme_of(v))
    assert "multiple of 16" in refusal.message and not accept_problems(scheme_of(v), quantizer=False)
    check_accepted(scheme_of(v))


# --- the worked example (qfloat-spec §6) ---


@check(60)
def _worked_example(v):
    scheme, shape, e = scheme_of(v), v["shape"], v["expected"]
    x = torch.tensor(v["input"], dtype=torch.float32)
    parts = quantize_parts(x, scheme)
    assert parts.scales.reshape(-1).tolist() == e["f16_scales"]
    assert parts.fields.reshape(-1).tolist() == e["q_half_even (cubecl GPU)"]
    payload = encode(x, scheme)
    assert as_hex(payload) == e["bytes_half_even"]
    assert as_hex(payload[-8:]) == e["f16_scale_bytes"]
    assert payload.numel() == e["quantized_data_len"] == layout.quantized_data_len(scheme, shape)
    away = bytes.fromhex(e["bytes_half_away"])
    assert [i for i, (a, b) in enumerate(zip(away, payload.numpy().tobytes(), strict=True)) if a != b] == [5]
    assert decode(payload, scheme, shape).tolist()[1][2] == 2.0  # the tie 2.5 / 1.0 went to even
    assert cbor2.dumps({"QFloat": scheme.to_serde()}).hex() == e["dtype_cbor_hex"]


# --- the collection ---

APPLICABLE = [i for i, v in enumerate(VECTORS) if applies(i, v)]


@pytest.mark.parametrize("index", APPLICABLE, ids=lambda i: f"{i}-{VECTORS[i]['source'].split('/')[-1]}")
def test_vector(index):
    CHECKS[index](VECTORS[index])


def test_every_vector_is_accounted_for():
    assert len(VECTORS) == 63
    container = [i for i, v in enumerate(VECTORS) if any(s in v["source"] for s in CONTAINER_SOURCES)]
    assert container == [52, 53, 54, 55, 56, 57, 58, 59, 62]
    assert sorted(CHECKS) == APPLICABLE
