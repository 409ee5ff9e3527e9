"""`qcli inspect` through the real entry point: sample weights, Burn's own model.bpk, qcli output."""

from __future__ import annotations

import math

import numpy as np
import pytest
from cli_support import (
    SHARDED,
    SHARED,
    SINGLE,
    assert_user_error,
    cli,
    decode_packed,
    source_bytes,
    source_tensors,
    validate_json,
)

MODEL_BPK = SHARED / "fixtures" / "burn" / "model.bpk"
MNIST = SHARED / "fixtures" / "burn" / "mnist.safetensors"


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    out = tmp_path_factory.mktemp("i") / "tiny.bpk"
    assert cli("quantize", SINGLE, "-o", out, "--device", "cpu").code == 0
    return out


def test_lists_a_safetensors_file():
    raw = source_bytes()
    result = cli("inspect", SINGLE)
    assert result.code == 0, result.err
    for name in raw:
        assert name in result.out
    doc = cli("inspect", SINGLE, "--json").json
    validate_json(doc)
    assert doc["format"] == "safetensors" and doc["version"] is None
    assert {t["name"]: t["bytes"] for t in doc["tensors"]} == {k: len(v) for k, v in raw.items()}
    assert doc["totals"]["params"] == sum(len(v) // 2 for v in raw.values())  # all bf16
    lm_head = next(t for t in doc["tensors"] if t["name"] == "lm_head.weight")
    assert lm_head["dtype"] == "BF16" and lm_head["shape"] == [1000, 128]


def test_lists_a_sharded_checkpoint():
    doc = cli("inspect", SHARDED, "--json").json
    assert [f["name"] for f in doc["files"]] == [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ]
    assert len(doc["tensors"]) == 21


def test_tensor_statistics_of_a_source_tensor():
    x = source_tensors()["model.layers.0.mlp.up_proj.weight"].astype(np.float64)
    doc = cli("inspect", SINGLE, "--tensor", "model.layers.0.mlp.up_proj.weight", "--json").json
    stats = doc["tensor_stats"]["values"]
    assert stats["min"] == x.min() and stats["max"] == x.max()
    assert stats["mean"] == pytest.approx(x.mean(), rel=1e-9)
    assert stats["std"] == pytest.approx(x.std(), rel=1e-9)
    assert stats["rms"] == pytest.approx(math.sqrt((x**2).mean()), rel=1e-9)
    assert doc["tensor_stats"]["scales"] is None


def test_reads_burns_own_model_bpk():
    result = cli("inspect", MODEL_BPK, "--json")
    assert result.code == 0, result.err
    doc = result.json
    validate_json(doc)
    assert doc["format"] == "burnpack" and doc["version"] == 1
    assert len(doc["tensors"]) == 18 and doc["metadata"] == {}
    shapes = {t["name"]: t["shape"] for t in doc["tensors"]}
    assert shapes["fc1.weight"] == [1600, 128]  # Burn's Linear is [in, out]
    assert shapes["conv1.conv.weight"] == [64, 1, 3, 3]
    assert all(t["dtype"] == "F32" for t in doc["tensors"])


def test_tensor_statistics_of_a_qfloat_tensor_include_its_scales(quantized):
    from qcli.io.burnpack import BurnpackReader

    name = "model.layers.1.mlp.down_proj.weight"
    payload = bytes(BurnpackReader.open(quantized).read(name))
    values, scales = decode_packed(payload, (128, 352), bits=4, block=32)
    doc = cli("inspect", quantized, "--tensor", name, "--json").json
    validate_json(doc)
    stats = doc["tensor_stats"]
    assert stats["values"]["min"] == pytest.approx(float(values.min()))
    assert stats["values"]["max"] == pytest.approx(float(values.max()))
    assert stats["values"]["rms"] == pytest.approx(math.sqrt((values.astype(np.float64) ** 2).mean()))
    assert stats["scales"]["min"] == float(scales.min()) and stats["scales"]["max"] == float(scales.max())
    assert stats["global_scale"] is None
    listed = {t["name"]: t for t in doc["tensors"]}
    assert listed[name]["dtype"] == "QFloat(Q4S PackedU32(0) block [32] F16)"
    assert doc["metadata"]["producer"] == "qcli"


def test_compare_against_its_source(quantized):
    result = cli("inspect", quantized, "--compare", SINGLE, "--json")
    assert result.code == 0, result.out
    compare = result.json["compare"]
    assert compare["ok"] and compare["missing"] == [] and compare["extra"] == []
    rows = {r["name"]: r for r in compare["tensors"]}
    assert len(rows) == 21
    assert rows["model.norm.weight"]["exact"] and rows["model.norm.weight"]["rel_rms"] == 0.0
    q = rows["lm_head.weight"]
    assert not q["exact"] and 0 < q["rel_rms"] < 0.15
    text = cli("inspect", quantized, "--compare", SINGLE)
    assert "all tensors match" in text.out


def test_compare_lists_missing_and_extra_tensors_and_exits_1():
    # Burn's MNIST model.bpk and the PyTorch MNIST checkpoint are different models
    result = cli("inspect", MODEL_BPK, "--compare", MNIST, "--json")
    assert result.code == 1
    compare = result.json["compare"]
    assert not compare["ok"]
    assert "conv3.weight" in compare["missing"] and "norm1.num_batches_tracked" in compare["missing"]
    assert "conv1.conv.weight" in compare["extra"] and "fc3.weight" in compare["extra"]
    assert "fc1.weight" in compare["mismatched"]  # [1600, 128] against [32, 11616]
    assert cli("inspect", MODEL_BPK, "--compare", MNIST).code == 1


def test_compare_needs_a_burnpack():
    lines = assert_user_error(cli("inspect", SINGLE, "--compare", SINGLE), 2)
    assert "--compare" in lines[0]


def test_unknown_tensor_suggests_a_name():
    lines = assert_user_error(cli("inspect", SINGLE, "--tensor", "lm_head.weigth"), 2)
    assert "did you mean 'lm_head.weight'" in lines[0]


def test_a_checkpoint_with_integer_scalars_round_trips_exactly(tmp_path):
    """mnist.safetensors holds I64 scalars (num_batches_tracked) and F32 tensors; they are kept exactly."""
    out = tmp_path / "mnist.bpk"
    doc = cli("quantize", MNIST, "-o", out, "--device", "cpu", "--json").json
    kept = {t["name"]: t for t in doc["tensors"] if t["decision"] == "keep"}
    scalar = kept["norm1.num_batches_tracked"]
    assert scalar["shape"] == [] and scalar["dtype"] == "I64"
    result = cli("inspect", out, "--compare", MNIST, "--json")
    assert result.code == 0
    rows = {r["name"]: r for r in result.json["compare"]["tensors"]}
    assert all(rows[name]["exact"] for name in kept)


def test_corrupt_burnpack_is_an_input_error(tmp_path):
    bad = tmp_path / "bad.bpk"
    bad.write_bytes(b"NOPE" + bytes(20))
    lines = assert_user_error(cli("inspect", bad), 3)
    assert "bad.bpk" in lines[0]


def test_two_level_statistics_report_the_global_scale(tmp_path):
    """nvfp4 (docs/arithmetic.md): global = max|x| / 6 / 448, so the block holding max|x| stores 448."""
    out = tmp_path / "n.bpk"
    assert cli("quantize", SINGLE, "-o", out, "--scheme", "nvfp4", "--device", "cpu", "--no-stats").code == 0
    x = source_tensors()["lm_head.weight"]
    stats = cli("inspect", out, "--tensor", "lm_head.weight", "--json").json["tensor_stats"]
    assert stats["global_scale"] == pytest.approx(float(np.abs(x).max()) / 6 / 448, rel=1e-6)
    assert stats["scales"]["max"] == 448.0 and stats["scales"]["min"] > 0


def test_compare_refuses_a_malformed_transposed_list(tmp_path):
    from qcli.io.burnpack import BurnpackWriter, TensorEntry

    bpk = tmp_path / "odd.bpk"
    norm = source_bytes()["model.norm.weight"]
    with BurnpackWriter(bpk, [TensorEntry("model.norm.weight", "BF16", (128,), len(norm))], {"transposed": "x"}) as w:
        w.write("model.norm.weight", norm)
        w.commit()
    lines = assert_user_error(cli("inspect", bpk, "--compare", SINGLE), 3)
    assert "transposed" in lines[0]
