"""bitsandbytes LLM.int8 checkpoints, written by bitsandbytes itself (`Linear8bitLt` on the CPU, its
`state_dict`): transcoded into Q8S with each row's scale, so qcli's decode of the `.bpk` is bitsandbytes'
own dequantized weight (what `Linear8bitLt`'s forward multiplies by) bit for bit, and Burn decodes the
file to the same values."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from qcli.burn_backends import BurnBackend
from qcli.errors import InputError
from qcli.io.burnpack import BurnpackReader
from qcli.io.safetensors import SafetensorsSource
from qcli.plan.decisions import make_plan
from qcli.scheme import PackedU32, QuantScheme, QuantValue, ScaleDtype
from tests.burn_harness import same_bits
from tests.cli_support import assert_user_error, cli, validate_json
from tests.format_support import assert_burn_decodes_as_qcli, decoded, pipeline_payloads

Q8S = QuantScheme().with_value(QuantValue.Q8S).with_store(PackedU32(0))
# name -> [out, in]: a row of 300 (Burn blocks of 150, two scales a row), rows of whole words, one row, and
# enough rows that some SCB / 127 round otherwise than SCB * (1 / 127)
LAYERS = {"model.layers.0.mlp.down_proj": (6, 300), "model.layers.0.self_attn.q_proj": (4, 64),
          "lm_head": (1, 32), "model.layers.0.mlp.gate_proj": (128, 16)}


def write(directory: Path) -> dict[str, torch.Tensor]:
    """The checkpoint bitsandbytes writes (its config.json beside, a norm kept) and, for each weight, the
    weight its forward multiplies by: `Linear8bitLt` applied to the identity."""
    bnb = pytest.importorskip("bitsandbytes")
    directory.mkdir(exist_ok=True)
    torch.manual_seed(0)
    tensors, want = {"model.norm.weight": torch.ones(64)}, {}
    for name, (out, into) in LAYERS.items():
        float_layer = torch.nn.Linear(into, out, bias=False)
        float_layer.weight.data[0, :4] *= 50  # an outlier row: its absmax far above the others'
        quantized = bnb.nn.Linear8bitLt(into, out, bias=False, has_fp16_weights=False)
        quantized.load_state_dict(float_layer.state_dict())
        quantized = quantized.to("cpu")  # where Linear8bitLt quantizes
        tensors.update({f"{name}.{k}": v for k, v in quantized.state_dict().items()})
        with torch.no_grad():
            want[f"{name}.weight"] = quantized(torch.eye(into)).t().contiguous()
    save_file(tensors, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps({"quantization_config": {
        "quant_method": "bitsandbytes", "load_in_8bit": True, "llm_int8_threshold": 6.0}}))
    return want


def test_the_plan_transcodes_each_weight_and_consumes_its_row_stats(tmp_path):
    write(tmp_path)
    plan = make_plan(SafetensorsSource.open(tmp_path).infos())
    decisions = {e.info.name: e.decision for e in plan.entries}
    assert sorted(decisions) == ["lm_head.weight", "model.layers.0.mlp.down_proj.weight",
                                 "model.layers.0.mlp.gate_proj.weight", "model.layers.0.self_attn.q_proj.weight",
                                 "model.norm.weight"]
    assert decisions["model.layers.0.mlp.down_proj.weight"].scheme == Q8S.per_block([1, 150], ScaleDtype.F32)
    assert decisions["model.layers.0.self_attn.q_proj.weight"].scheme == Q8S.per_block([1, 64], ScaleDtype.F32)
    assert decisions["lm_head.weight"].scheme == Q8S.per_tensor(ScaleDtype.F32)
    assert decisions["model.layers.0.mlp.down_proj.weight"].reason == (
        "default: transcode bitsandbytes LLM.int8 (I8 with per-row SCB) -> Q8S PackedU32(0) block [150] F32, "
        "exact")
    assert not plan.errors()
    entry = next(e for e in plan.entries if e.info.name == "model.layers.0.mlp.down_proj.weight")
    assert entry.out_nbytes == 6 * 300 + 6 * 2 * 4  # a byte a code, then two f32 scales a row


def test_the_decoded_bpk_is_bitsandbytes_dequantized_weight_bit_for_bit(tmp_path):
    want = write(tmp_path / "ckpt")
    out = tmp_path / "model.bpk"
    result = cli("quantize", tmp_path / "ckpt", "-o", out, "--json")
    assert result.code == 0, result.err
    validate_json(json.loads(result.out))
    got = decoded(out)
    assert sorted(got) == sorted(want)
    for name, values in want.items():
        assert same_bits(got[name], values), name
    assert [e.name for e in BurnpackReader.open(out).entries() if "SCB" in e.name or "format" in e.name] == []
    compared = cli("inspect", out, "--compare", tmp_path / "ckpt", "--json")
    assert compared.code == 0, compared.err
    doc = json.loads(compared.out)["compare"]
    assert doc["ok"] and all(r["exact"] for r in doc["tensors"]), doc


def test_int8_vectorwise_dequant_rounds_within_one_ulp_of_it(tmp_path):
    """bitsandbytes' other dequantization, `(CB * SCB) * (1 / 127)`, rounds twice in another order: one ulp
    at most from the forward's weight, which the transcode holds (docs/input-formats.md)."""
    functional = pytest.importorskip("bitsandbytes.functional")
    want = write(tmp_path)
    with SafetensorsSource.open(tmp_path) as source:
        for name, values in want.items():
            stats = source.load(name.removesuffix("weight") + "SCB")
            other = functional.int8_vectorwise_dequant(source.load(name), stats)
            ulps = (other.view(torch.int32).to(torch.int64) - values.view(torch.int32)).abs()
            assert int(ulps.max()) <= 1, name


@pytest.mark.parametrize("backend", [BurnBackend.flex, BurnBackend.wgpu])
def test_burn_decodes_the_transcoded_file_as_qcli_does(tmp_path, backend):
    want = write(tmp_path / "ckpt")
    out = tmp_path / "model.bpk"
    result = cli("quantize", tmp_path / "ckpt", "-o", out, "--burn-backend", backend)
    assert result.code == 0, result.err
    assert_burn_decodes_as_qcli(out, want, backend, tmp_path)


@pytest.mark.parametrize(("tensor", "value", "message"), [
    ("w.weight_format", torch.tensor(1, dtype=torch.uint8), "says a weight format other than row-major"),
    ("w.weight", torch.full((2, 8), -128, dtype=torch.int8), "has the code -128"),
])
def test_codes_bitsandbytes_does_not_write_are_an_input_error(tmp_path, tensor, value, message):
    tensors = {"w.weight": torch.ones(2, 8, dtype=torch.int8), "w.SCB": torch.ones(2),
               "w.weight_format": torch.tensor(0, dtype=torch.uint8), tensor: value}
    save_file(tensors, str(tmp_path / "m.safetensors"))
    out = tmp_path / "m.bpk"
    lines = assert_user_error(cli("quantize", tmp_path / "m.safetensors", "-o", out), InputError.exit_code)
    assert message in lines[0]
    assert not out.exists()


def test_row_stats_of_another_shape_have_no_transcode(tmp_path):
    save_file({"w.weight": torch.ones(2, 8, dtype=torch.int8), "w.SCB": torch.ones(3)}, str(tmp_path / "m.safetensors"))
    plan = make_plan(SafetensorsSource.open(tmp_path / "m.safetensors").infos())
    [error] = plan.errors()
    assert "its row stats w.SCB are F32 [3], not F32 [2]" in error.message


@pytest.mark.interpreter
def test_the_gpu_pipeline_yields_the_cpu_pipelines_bytes(tmp_path):
    write(tmp_path)
    _, want, got = pipeline_payloads(tmp_path)
    assert got == want
