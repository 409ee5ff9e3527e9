"""`qcli inspect` through the real entry point: sample weights, packs Burn wrote, qcli output."""

from __future__ import annotations

import math
import re
import struct

import numpy as np
import pytest

from qcli.io.readers import READERS
from tests.burn_facts import BURN_FIXTURES
from tests.cli_support import (
    SCHEMA,
    SHARDED,
    SINGLE,
    assert_user_error,
    cli,
    decode_packed,
    source_bytes,
    source_tensors,
    table_rows,
    validate_json,
)

BURNS_FILE = BURN_FIXTURES / "linear-f32.bpk"
BURNS_SOURCE = BURN_FIXTURES / "linear.safetensors"


@pytest.fixture(scope="module")
def quantized(tmp_path_factory):
    out = tmp_path_factory.mktemp("i") / "tiny.bpk"
    assert cli("quantize", SINGLE, "-o", out, "--device", "cpu").code == 0
    return out


def test_lists_a_safetensors_file(monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")  # room for every name whole
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


def test_the_json_schema_names_every_reader_and_burnpack():
    """inspect's `format` is its source's reader's name, or burnpack's."""
    formats = SCHEMA["$defs"]["inspect"]["properties"]["format"]["enum"]
    assert sorted(formats) == sorted([*(reader.name for reader in READERS), "burnpack"])


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


@pytest.mark.parametrize(
    ("name", "weight_dtype"),
    [("linear-f32.bpk", "F32"), ("linear-q8s-b32.bpk", "QFloat(Q8S Native block [32] F32)"),
     ("linear-q4s-b32.bpk", "QFloat(Q4S PackedU32(0) block [32] F16)")],
)
def test_reads_burns_own_packs(name, weight_dtype):
    """Burn quantizes the weights and keeps the biases F32; the shapes are the source's ([in, out])."""
    result = cli("inspect", BURN_FIXTURES / name, "--json")
    assert result.code == 0, result.err
    doc = result.json
    validate_json(doc)
    assert doc["format"] == "burnpack" and doc["version"] == 1
    assert doc["metadata"] == {"format": "burnpack", "producer": "burn", "version": "0.22.1"}
    listed = {t["name"]: (t["shape"], t["dtype"]) for t in doc["tensors"]}
    assert listed == {
        tensor: (list(array.shape), weight_dtype if tensor.endswith(".weight") else "F32")
        for tensor, array in source_tensors(BURNS_SOURCE).items()
    }


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


def test_compare_against_burns_source_is_exact():
    """Burn stored its f32 source verbatim, so every tensor compares exact."""
    result = cli("inspect", BURNS_FILE, "--compare", BURNS_SOURCE, "--json")
    assert result.code == 0, result.out
    compare = result.json["compare"]
    assert compare["ok"] and compare["missing"] == compare["extra"] == compare["mismatched"] == []
    rows = {r["name"]: r for r in compare["tensors"]}
    assert rows.keys() == source_tensors(BURNS_SOURCE).keys()
    assert all(r["exact"] and r["rel_rms"] == 0.0 for r in rows.values())
    assert "all tensors match" in cli("inspect", BURNS_FILE, "--compare", BURNS_SOURCE).out


def test_compare_lists_missing_and_extra_tensors_and_exits_1(tmp_path):
    """A checkpoint that lacks one of Burn's tensors, has one Burn lacks and one of another shape."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(BURNS_SOURCE)
    del tensors["layers.1.bias"]
    tensors["layers.2.weight"] = tensors["layers.1.weight"].clone()
    tensors["layers.0.weight"] = tensors["layers.0.weight"][:64].clone()
    other = tmp_path / "other.safetensors"
    save_file(tensors, other)
    result = cli("inspect", BURNS_FILE, "--compare", other, "--json")
    assert result.code == 1
    compare = result.json["compare"]
    assert not compare["ok"]
    assert compare["missing"] == ["layers.2.weight"] and compare["extra"] == ["layers.1.bias"]
    assert compare["mismatched"] == ["layers.0.weight"]  # [128, 64] against [64, 64]
    text = cli("inspect", BURNS_FILE, "--compare", other)
    assert text.code == 1
    for phrase in ("shape [128, 64] but the source is [64, 64]", "missing from the .bpk: layers.2.weight",
                   "not in the source: layers.1.bias", "the .bpk does not match its source"):
        assert phrase in text.out, text.out


def test_compare_needs_a_burnpack():
    lines = assert_user_error(cli("inspect", SINGLE, "--compare", SINGLE), 2)
    assert "--compare" in lines[0]


def test_unknown_tensor_suggests_a_name():
    lines = assert_user_error(cli("inspect", SINGLE, "--tensor", "lm_head.weigth"), 2)
    assert "did you mean 'lm_head.weight'" in lines[0]


def test_a_checkpoint_with_integer_scalars_round_trips_exactly(tmp_path, small_checkpoint):
    """The small checkpoint holds an I64 scalar (num_batches_tracked) beside float tensors; every tensor
    quantize keeps comes back exactly."""
    out = tmp_path / "small.bpk"
    doc = cli("quantize", small_checkpoint, "-o", out, "--device", "cpu", "--json").json
    kept = {t["name"]: t for t in doc["tensors"] if t["decision"] == "keep"}
    scalar = kept["norm1.num_batches_tracked"]
    assert scalar["shape"] == [] and scalar["dtype"] == "I64"
    result = cli("inspect", out, "--compare", small_checkpoint, "--json")
    assert result.code == 0
    rows = {r["name"]: r for r in result.json["compare"]["tensors"]}
    assert all(rows[name]["exact"] for name in kept)


def test_corrupt_burnpack_is_an_input_error(tmp_path):
    bad = tmp_path / "bad.bpk"
    bad.write_bytes(b"NOPE" + bytes(20))
    lines = assert_user_error(cli("inspect", bad), 3)
    assert "bad.bpk" in lines[0]


def test_two_level_statistics_report_the_global_scale(tmp_path):
    """NVFP4's layout (docs/arithmetic.md): global = max|x| / 6 / 448, so the block holding max|x| stores 448."""
    out, recipe = tmp_path / "n.bpk", tmp_path / "nvfp4.toml"
    recipe.write_text('version = 1\n[[rule]]\nmatch = "lm_head.weight"\nvalue = "E2M1"\nblock = [16]\n'
                      'block_scale = "UE4M3"\ntensor_scale = "F32"\n')
    assert cli("quantize", SINGLE, "-o", out, "--recipe", recipe, "--device", "cpu", "--no-stats").code == 0
    x = source_tensors()["lm_head.weight"]
    stats = cli("inspect", out, "--tensor", "lm_head.weight", "--json").json["tensor_stats"]
    assert stats["global_scale"] == pytest.approx(float(np.abs(x).max()) / 6 / 448, rel=1e-6)
    assert stats["scales"]["max"] == 448.0 and stats["scales"]["min"] > 0


def test_compare_refuses_a_malformed_transposed_list(tmp_path):
    from qcli.io.burnpack import BurnpackWriter, TensorEntry
    from qcli.io.dtypes import Plain

    bpk = tmp_path / "odd.bpk"
    norm = source_bytes()["model.norm.weight"]
    entries = [TensorEntry("model.norm.weight", Plain.BF16, (128,), len(norm))]
    with BurnpackWriter(bpk, entries, {"transposed": "x"}) as w:
        w.write("model.norm.weight", norm)
        w.commit()
    lines = assert_user_error(cli("inspect", bpk, "--compare", SINGLE), 3)
    assert "transposed" in lines[0]


def _impostor(tmp_path, quantized_names):
    """The sample's tensors, same names, shapes and dtypes, with every quantized tensor's values negated
    and reversed: a different checkpoint that a .bpk of the sample must not match."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(SINGLE))
    for name in quantized_names:
        tensors[name] = (-tensors[name]).flatten().flip(0).reshape(tensors[name].shape).contiguous()
    other = tmp_path / "other.safetensors"
    save_file(tensors, str(other))
    return other


def _quantized_names(doc):
    return [t["name"] for t in doc["tensors"] if t["dtype"].startswith("QFloat")]


def test_compare_fails_on_a_different_checkpoint_with_the_same_tensors(quantized, tmp_path):
    names = _quantized_names(cli("inspect", quantized, "--json").json)
    assert names
    other = _impostor(tmp_path, names)
    result = cli("inspect", quantized, "--compare", other, "--json")
    assert result.code == 1, result.out
    doc = result.json
    validate_json(doc)
    compare = doc["compare"]
    assert not compare["ok"]
    assert set(names) <= set(compare["mismatched"])
    rows = {r["name"]: r for r in compare["tensors"]}
    for name in names:
        row = rows[name]
        assert row["problem"] and "bound" in row["problem"]
        assert row["bound"] is not None and row["block_error"] is not None
        assert row["block_error"] > row["bound"]
    text = cli("inspect", quantized, "--compare", other)
    assert text.code == 1
    assert "all tensors match" not in text.out and "does not match" in text.out
    assert names[0] in text.out and "bound" in text.out


def test_compare_against_its_true_source_judges_every_quantized_tensor(quantized):
    result = cli("inspect", quantized, "--compare", SINGLE, "--json")
    assert result.code == 0, result.out
    doc = result.json
    validate_json(doc)
    names = _quantized_names(doc)
    rows = {r["name"]: r for r in doc["compare"]["tensors"]}
    for name in names:
        row = rows[name]
        assert row["problem"] is None
        assert row["bound"] is not None and 0 <= row["block_error"] <= row["bound"]
    assert cli("inspect", quantized, "--compare", SINGLE).code == 0


def test_bits_per_weight_of_a_quantized_file(quantized):
    doc = cli("inspect", quantized, "--json").json
    validate_json(doc)
    by_name = {t["name"]: t for t in doc["tensors"]}
    names = _quantized_names(doc)
    for name in names:
        t = by_name[name]
        assert t["bits_per_weight"] == pytest.approx(t["bytes"] * 8 / math.prod(t["shape"]))
        assert 0 < t["bits_per_weight"] < 16
    kept = [t for t in doc["tensors"] if not t["dtype"].startswith("QFloat")]
    assert all(t["bits_per_weight"] is None for t in kept)
    quantized_bits = sum(by_name[n]["bytes"] * 8 for n in names)
    quantized_values = sum(math.prod(by_name[n]["shape"]) for n in names)
    assert doc["totals"]["bits_per_weight"] == pytest.approx(quantized_bits / quantized_values)
    text = cli("inspect", quantized).out
    assert "bits/weight" in text
    assert f"{doc['totals']['bits_per_weight']:.2f} bits/weight" in text


@pytest.mark.parametrize("preset", ["q4f-b32", "q4s-b32", "q8s", "fp4-b32"])
def test_compare_accepts_searched_scales_and_still_catches_inflated_ones(preset, tmp_path):
    """A `--calibration mse` file (nearest-rounded, clipped and negative scales) passes --compare against
    its source; the same file's first scale multiplied by 4 does not."""
    out = tmp_path / "mse.bpk"
    assert cli("quantize", SINGLE, "-o", out, "--device", "cpu", "--scheme", preset, "--calibration", "mse").code == 0
    assert cli("inspect", out, "--compare", SINGLE).code == 0
    doc = cli("inspect", out, "--json").json
    name = next(t["name"] for t in doc["tensors"] if t["dtype"].startswith("QFloat") and "proj" in t["name"])
    damaged = tmp_path / "damaged.bpk"
    _scale_times_four(out, damaged, name)
    assert cli("inspect", damaged, "--compare", SINGLE).code == 1


def _scale_times_four(path, out, name):
    """A copy of `path` with tensor `name`'s first stored scale (F16 or F32) multiplied by 4 in place."""
    from qcli import layout
    from qcli.io.burnpack import BurnpackReader
    from qcli.scheme import ScaleDtype

    reader = BurnpackReader.open(path)
    entry = next(e for e in reader.entries() if e.name == name)
    scheme = entry.dtype.scheme
    at = reader.data_start + reader.data_offsets(name)[0] + layout.value_bytes(scheme, tuple(entry.shape))
    kind = "<e" if scheme.scale_dtype() is ScaleDtype.F16 else "<f"
    data = bytearray(path.read_bytes())
    (scale,) = struct.unpack_from(kind, data, at)
    struct.pack_into(kind, data, at, scale * 4)
    out.write_bytes(bytes(data))


def _dry_run(source, tmp_path) -> dict[str, dict]:
    result = cli("quantize", source, "--dry-run", "-o", tmp_path / "plan.bpk", "--json")
    assert result.code == 0, result.err
    return {t["name"]: t for t in result.json["tensors"]}


def _planned(doc) -> dict[str, dict]:
    return {t["name"]: t["plan"] for t in doc["tensors"]}


def test_a_checkpoint_lists_the_default_plan_as_dry_run_makes_it(tmp_path):
    doc = cli("inspect", SINGLE, "--json").json
    validate_json(doc)
    planned, dry_run = _planned(doc), _dry_run(SINGLE, tmp_path)
    assert planned.keys() == dry_run.keys()
    for name, row in dry_run.items():
        assert (planned[name]["decision"], planned[name]["reason"], planned[name]["scheme"]) == (
            row["decision"], row["reason"], row["scheme"]), name
        assert planned[name]["format"] == "BF16" and not planned[name]["refused"]
    assert doc["plan"]["preset"] == "q4s-b32"
    # the default preset's one warning: its 4-bit blocks panic in a Linear on wgpu (docs/output.md)
    assert [(p["severity"], p["kind"]) for p in doc["plan"]["problems"]] == [("warning", "backend")]
    quantized = sum(row["decision"] == "quantize" for row in dry_run.values())
    (formats,) = doc["plan"]["formats"]
    assert formats["format"] == "BF16" and formats["tensors"] == 21
    assert (formats["quantize"], formats["keep"], formats["transcode"], formats["consumed"]) == (
        quantized, 21 - quantized, 0, 0)
    text = cli("inspect", SINGLE).out
    assert f"BF16: 21 tensors: {quantized} quantized, {21 - quantized} kept" in text
    assert "default: output head, 8 bits -> q8s-b32" in text and "default: keep, 1-D tensor (norm/bias)" in text


def test_a_burnpack_has_no_plan(quantized):
    doc = cli("inspect", quantized, "--json").json
    validate_json(doc)
    assert doc["plan"] is None and all(t["plan"] is None for t in doc["tensors"])


def _fp8_checkpoint(directory):
    """A torch-written FP8 checkpoint (DeepSeek's config.json beside it): two per-tensor weights, one
    per-channel and one of 128x128 blocks, each with its scale companion, and a BF16 norm."""
    import json

    import torch
    from safetensors.torch import save_file

    def codes(*shape):
        return torch.randn(shape, generator=torch.Generator().manual_seed(len(shape))).to(torch.float8_e4m3fn)

    directory.mkdir()
    save_file({
        "a.weight": codes(4, 8), "a.weight_scale": torch.tensor(0.5),
        "b.weight": codes(6, 12), "b.weight.scale": torch.tensor([0.25]),
        "c.weight": codes(5, 24), "c.weight_scale": torch.rand(5, 1),
        "d.weight": codes(300, 136), "d.weight_scale_inv": torch.rand(3, 2),
        "norm.weight": torch.ones(8, dtype=torch.bfloat16),
    }, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(
        {"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}))
    return directory


def test_an_fp8_checkpoint_is_named_by_format_with_its_scales_consumed(tmp_path):
    source = _fp8_checkpoint(tmp_path / "fp8")
    doc = cli("inspect", source, "--json").json
    validate_json(doc)
    planned, dry_run = _planned(doc), _dry_run(source, tmp_path)
    consumed = {"a.weight_scale": "a.weight", "b.weight.scale": "b.weight", "c.weight_scale": "c.weight",
                "d.weight_scale_inv": "d.weight"}
    assert planned.keys() - dry_run.keys() == consumed.keys()
    for name, row in dry_run.items():
        assert (planned[name]["decision"], planned[name]["reason"], planned[name]["scheme_text"]) == (
            row["decision"], row["reason"], row["scheme_text"]), name
    formats = {"a.weight": "per-tensor", "b.weight": "per-tensor", "c.weight": "per-channel",
               "d.weight": "block [128, 128]"}
    for weight, layout in formats.items():
        assert planned[weight]["decision"] == "transcode"
        assert planned[weight]["format"] == f"F8_E4M3 with {layout} scales"
        assert f"transcode F8_E4M3 with {layout} scales -> E4M3" in planned[weight]["reason"]
    for scale, weight in consumed.items():
        assert planned[scale] == {"format": planned[weight]["format"], "decision": "consumed", "reason":
                                  f"companion of {weight}, written inside its transcode", "scheme": None,
                                  "scheme_text": None, "refused": False}
    summaries = {f["format"]: f for f in doc["plan"]["formats"]}
    assert summaries.keys() == {"F8_E4M3 with per-tensor scales", "F8_E4M3 with per-channel scales",
                                "F8_E4M3 with block [128, 128] scales", "BF16"}
    per_tensor = summaries["F8_E4M3 with per-tensor scales"]
    assert (per_tensor["tensors"], per_tensor["transcode"], per_tensor["consumed"]) == (2, 2, 2)
    assert summaries["BF16"]["keep"] == 1 and summaries["BF16"]["consumed"] == 0
    text = cli("inspect", source).out
    for line in ("F8_E4M3 with per-tensor scales: 2 tensors, transcoded exactly; 2 companion tensors consumed",
                 "F8_E4M3 with per-channel scales: 1 tensor, transcoded exactly; 1 companion tensor consumed",
                 "F8_E4M3 with block [128, 128] scales: 1 tensor, transcoded exactly; 1 companion tensor consumed",
                 "BF16: 1 tensor, kept", "companion of d.weight, written inside its transcode"):
        assert line in text, text
    assert "quantize stops" not in text


def test_an_fp8_source_burn_cannot_hold_is_refused_by_name(tmp_path):
    """F8_E5M2, and F8_E4M3 without a scale: kept by the plan, which Burn cannot (no F8 dtype), so quantize
    stops on them; inspect lists them with the plan's errors and still exits 0."""
    import torch
    from safetensors.torch import save_file

    source = tmp_path / "f8.safetensors"
    save_file({"e5m2.weight": torch.zeros(4, 8).to(torch.float8_e5m2),
               "bare.weight": torch.zeros(4, 8).to(torch.float8_e4m3fn),
               "w.weight": torch.zeros(4, 32, dtype=torch.bfloat16)}, str(source))
    result = cli("inspect", source, "--json")
    assert result.code == 0, result.err
    doc = result.json
    validate_json(doc)
    planned = _planned(doc)
    for name in ("e5m2.weight", "bare.weight"):
        assert planned[name]["decision"] == "keep" and planned[name]["refused"]
    assert planned["w.weight"]["decision"] == "quantize" and not planned["w.weight"]["refused"]
    errors = [p for p in doc["plan"]["problems"] if p["severity"] == "error"]
    assert sorted(n for p in errors for n in p["tensors"]) == ["bare.weight", "e5m2.weight"]
    assert all(p["kind"] == "dtype" for p in errors)
    summaries = {f["format"]: f for f in doc["plan"]["formats"]}
    assert summaries["F8_E5M2"]["refused"] == summaries["F8_E4M3"]["refused"] == 1
    lines = assert_user_error(cli("quantize", source, "--dry-run", "-o", tmp_path / "f8.bpk"), 2)
    text = cli("inspect", source).out
    for line in ("F8_E5M2: 1 tensor, refused (quantize stops on it)", "quantize stops on 2 problems",
                 "`qcli quantize` says of this plan (its options in the hints):",
                 "  error: bare.weight (F8_E4M3) cannot be kept: Burn has no F8_E4M3 dtype"):
        assert line in text, text
    rows = {row[0]: row for row in table_rows(text)}
    assert rows["e5m2.weight"][4] == rows["bare.weight"][4] == "refused" and rows["w.weight"][4] == "Q4S [32] F16"
    assert any("e5m2.weight" in line for line in lines)


@pytest.mark.parametrize("columns", ["80", "0", "garbage"])
def test_at_80_columns_every_row_tells_its_tensor(quantized, monkeypatch, columns):
    """A layer's gate, up and down rows stay apart however the names are shortened, in the listing and the
    comparison, and no line is wider than 80."""
    monkeypatch.setenv("COLUMNS", columns)
    for args in (("inspect", SINGLE), ("inspect", quantized), ("inspect", quantized, "--compare", SINGLE)):
        result = cli(*args)
        assert result.code == 0, result.err
        assert max(len(line) for line in result.out.splitlines()) <= 80, result.out
        shown = [row[0] for row in table_rows(result.out.split("compared with")[-1])]
        assert len(shown) == len(set(shown)) == 21, shown
        for projection in ("down", "gate", "up"):  # each `…` stands for what was left out
            name = f"model.layers.0.mlp.{projection}_proj.weight"
            rows = [s for s in shown if re.fullmatch(".+".join(map(re.escape, s.split("…"))), name)]
            assert len(rows) == 1 and rows[0].endswith(f"{projection}_proj.weight"), (name, shown)
