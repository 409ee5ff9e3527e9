"""NVFP4 checkpoints written by NVIDIA's TensorRT Model Optimizer itself (`nvidia-modelopt`: `mtq.quantize` with
`NVFP4_DEFAULT_CFG` on a small Llama, then `export_hf_checkpoint`, on the CPU), transcoded into two-level E2M1
QFloat: qcli's decode of the `.bpk` is modelopt's own dequantization (`NVFP4QTensor.dequantize`, in f32) bit
for bit, on either pipeline, and Burn's wgpu decodes the file to the same values; a block worked out by
hand holds the layout (low nibble first, code 8 as +0.0) to the format's documentation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from qcli.burn_backends import BurnBackend
from qcli.formats.e2m1 import e2m1_codes
from qcli.io.burnpack import BurnpackReader
from qcli.io.safetensors import SafetensorsSource
from qcli.plan.decisions import make_plan
from qcli.scheme import PackedU32, QuantScheme, QuantValue, ScaleDtype
from tests.burn_harness import same_bits
from tests.cli_support import cli, validate_json
from tests.format_support import (
    assert_burn_decodes_as_qcli,
    decoded,
    model_problems,
    pipeline_payloads,
    refused_from_headers,
)

SCHEME = (QuantScheme().with_value(QuantValue.E2M1).with_store(PackedU32(0))
          .per_block([16], ScaleDtype.F16).per_tensor(ScaleDtype.F32))
LINEARS = [f"model.layers.0.self_attn.{p}_proj" for p in "qkvo"] + [
    f"model.layers.0.mlp.{p}_proj" for p in ("gate", "up", "down")]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> tuple[Path, dict[str, torch.Tensor]]:
    """A folder modelopt exported (a BF16 Llama of one layer, hidden 64, intermediate 96, its NVFP4 linears)
    and modelopt's own f32 dequantization of each NVFP4 weight."""
    mtq = pytest.importorskip("modelopt.torch.quantization")
    from modelopt.torch.export import export_hf_checkpoint
    from modelopt.torch.quantization.qtensor.nvfp4_tensor import NVFP4QTensor
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                         architectures=["LlamaForCausalLM"])
    model = mtq.quantize(LlamaForCausalLM(config).to(torch.bfloat16), mtq.NVFP4_DEFAULT_CFG,
                         lambda m: m(torch.randint(0, 64, (2, 8))))
    folder = tmp_path_factory.mktemp("nvfp4")
    export_hf_checkpoint(model, export_dir=folder)
    tensors = load_file(folder / "model.safetensors")
    want = {}
    for linear in LINEARS:
        codes = tensors[f"{linear}.weight"]
        shape = torch.Size([codes.shape[0], 2 * codes.shape[1]])
        want[f"{linear}.weight"] = NVFP4QTensor(shape, torch.bfloat16, codes).dequantize(
            dtype=torch.float32, scale=tensors[f"{linear}.weight_scale"],
            double_scale=tensors[f"{linear}.weight_scale_2"], block_sizes={-1: 16})
    return folder, want




def test_modelopt_writes_what_the_format_module_reads(checkpoint):
    """The export's layout, as docs/input-formats.md describes it, and its config."""
    folder, _ = checkpoint
    with SafetensorsSource.open(folder) as source:
        infos = {i.name: i for i in source.infos()}
    down = "model.layers.0.mlp.down_proj"
    assert (infos[f"{down}.weight"].dtype, infos[f"{down}.weight"].shape) == ("U8", (64, 48))
    assert (infos[f"{down}.weight_scale"].dtype, infos[f"{down}.weight_scale"].shape) == ("F8_E4M3", (64, 6))
    assert (infos[f"{down}.weight_scale_2"].dtype, infos[f"{down}.weight_scale_2"].shape) == ("F32", ())
    assert (infos[f"{down}.input_scale"].dtype, infos[f"{down}.input_scale"].shape) == ("F32", ())
    quantization = json.loads((folder / "hf_quant_config.json").read_text())["quantization"]
    assert (quantization["quant_algo"], quantization["group_size"]) == ("NVFP4", 16)
    # code 8 (E2M1's negative zero) occurs, so the test below sees how it decodes
    codes = load_file(folder / "model.safetensors")[f"{down}.weight"]
    assert bool(((codes & 0xF) == 8).any())


def test_the_plan_transcodes_each_linear_and_keeps_the_activation_scale(checkpoint):
    folder, _ = checkpoint
    plan = make_plan(SafetensorsSource.open(folder).infos())
    entries = {e.info.name: e for e in plan.entries}
    for linear in LINEARS:
        entry = entries[f"{linear}.weight"]
        assert entry.decision.scheme == SCHEME and entry.shape == tuple(entry.info.shape[:1]) + (
            2 * entry.info.shape[1],)
        assert entry.decision.reason == ("default: transcode NVFP4 group 16 -> E2M1 PackedU32(0) block [16] F16 "
                                         "global F32, exact")
        assert {f"{linear}.weight_scale", f"{linear}.weight_scale_2"} <= plan.consumed()
        assert entries[f"{linear}.input_scale"].decision.reason == (
            f"default: keep, scale of the already-quantized tensor {linear}.weight")
    rows, cols = entries["model.layers.0.mlp.down_proj.weight"].shape
    # the codes' bytes, then an F16 scale per 16 values, then the f32 global: 5 bits a weight
    assert entries["model.layers.0.mlp.down_proj.weight"].out_nbytes == rows * cols // 2 + rows * cols // 16 * 2 + 4
    assert not plan.errors()


@pytest.mark.parametrize("pipeline", ["cpu", pytest.param("triton", marks=pytest.mark.interpreter)])
def test_the_decoded_bpk_is_modelopts_dequantization_bit_for_bit(checkpoint, tmp_path, pipeline, monkeypatch):
    if pipeline == "triton":
        monkeypatch.setenv("QCLI_KERNELS", "triton")  # the GPU pipeline (under TRITON_INTERPRET on the CPU)
    folder, want = checkpoint
    out = tmp_path / "model.bpk"
    result = cli("quantize", folder, "-o", out, "--json")
    assert result.code == 0, result.err
    assert json.loads(result.out)["device"] == pipeline
    got = decoded(out)
    for name, values in want.items():
        assert same_bits(got[name], values), name
    names = [e.name for e in BurnpackReader.open(out).entries()]
    assert not [n for n in names if n.endswith(("weight_scale", "weight_scale_2"))]  # consumed
    assert all(f"{linear}.input_scale" in names for linear in LINEARS)  # kept, as it is
    compared = cli("inspect", out, "--compare", folder, "--json")
    assert compared.code == 0, compared.err
    doc = json.loads(compared.out)["compare"]
    assert doc["ok"] and all(r["exact"] for r in doc["tensors"] if r["name"] in want), doc


@pytest.mark.interpreter
def test_the_gpu_pipeline_yields_the_cpu_pipelines_bytes(checkpoint):
    folder, _ = checkpoint
    _, want, got = pipeline_payloads(folder)
    assert got == want


def test_burn_wgpu_decodes_the_transcoded_file_as_qcli_does(checkpoint, tmp_path):
    folder, want = checkpoint
    out = tmp_path / "model.bpk"
    # No --burn-backend: it also refuses what a model computes wrong with, not this test's.
    result = cli("quantize", folder, "-o", out, "--device", "cpu")
    assert result.code == 0, result.err
    assert_burn_decodes_as_qcli(out, want, BurnBackend.wgpu, tmp_path)


def test_a_block_by_hand(tmp_path):
    """One row of 16 codes, 0..15 (byte k holds codes 2k and 2k+1, the first in the low nibble), scale 1.5
    (E4M3 0x3C), global 0.25: value = e2m1(code) * 0.375, code 8 giving +0.0 as modelopt's table does."""
    codes = torch.tensor([(2 * k + 1) << 4 | 2 * k for k in range(8)], dtype=torch.uint8).reshape(1, 8)
    save_file({"m.weight": codes, "m.weight_scale": torch.tensor([[0x3C]], dtype=torch.uint8).view(torch.float8_e4m3fn),
               "m.weight_scale_2": torch.tensor(0.25)}, str(tmp_path / "m.safetensors"))
    out = tmp_path / "m.bpk"
    assert cli("quantize", tmp_path / "m.safetensors", "-o", out).code == 0, "quantize failed"
    e2m1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    want = torch.tensor([[v * 0.375 for v in e2m1] + [-v * 0.375 if v else 0.0 for v in e2m1]])
    got = decoded(out)["m.weight"]
    assert same_bits(got, want)
    assert not torch.signbit(got[0, 8])


def test_formats_without_a_burn_form_are_refused_before_any_weight_is_read(tmp_path, monkeypatch):
    scale = torch.ones(4, 2).to(torch.float8_e4m3fn)
    tensors = {"awq.weight": torch.zeros(4, 16, dtype=torch.uint8), "awq.weight_scale": scale,
               "awq.weight_scale_2": torch.tensor(1.0), "awq.pre_quant_scale": torch.ones(32),
               "wide.weight": torch.zeros(4, 16, dtype=torch.uint8), "wide.weight_scale": scale.clone(),
               "wide.weight_scale_2": torch.tensor(1.0, dtype=torch.float64),
               "odd.weight": torch.zeros(4, 16, dtype=torch.uint8), "odd.weight_scale": torch.ones(4, 3).to(
                   torch.float8_e4m3fn), "odd.weight_scale_2": torch.tensor(1.0)}
    save_file(tensors, str(tmp_path / "m.safetensors"))

    problems = refused_from_headers(monkeypatch, tmp_path / "m.safetensors", tmp_path / "m.bpk")
    errors = {p.tensors[0]: p.message for p in problems}
    # each weight, and its F8 scale, which Burn has no dtype to keep in
    assert sorted(errors) == sorted(f"{m}.{t}" for m in ("awq", "odd", "wide") for t in ("weight", "weight_scale"))
    assert "is not transcoded: its input is multiplied by awq.pre_quant_scale" in errors["awq.weight"]
    assert "its global scale wide.weight_scale_2 is F64 [], not one F32" in errors["wide.weight"]
    assert "odd.weight_scale [4, 3] is not one per block of a row of [4, 32]" in errors["odd.weight"]
    assert not (tmp_path / "m.bpk").exists()


def test_inspect_and_dry_run_name_the_format(checkpoint):
    folder, _ = checkpoint
    weight = "model.layers.0.mlp.up_proj.weight"
    result = cli("inspect", folder, "--json")
    assert result.code == 0, result.err
    planned = {t["name"]: t["plan"] for t in json.loads(result.out)["tensors"]}
    assert planned[weight]["format"] == "NVFP4 group 16" and planned[weight]["decision"] == "transcode"
    assert planned[f"{weight}_scale_2"]["decision"] == "consumed"
    result = cli("quantize", folder, "--dry-run", "--json")
    assert result.code == 0, result.err
    doc = json.loads(result.out)
    validate_json(doc)
    row = next(t for t in doc["tensors"] if t["name"] == weight)
    assert row["decision"] == "transcode" and row["reason"].startswith("default: transcode NVFP4 group 16 -> E2M1")


def test_a_rule_on_nvfp4_weights_warns_that_they_are_transcoded(checkpoint, tmp_path):
    folder, _ = checkpoint
    problems = model_problems('version = 1\n[[rule]]\nmatch = "*_proj.weight"\npreset = "q8s-b32"\n', folder, tmp_path)
    [warning] = [p for p in problems if p["kind"] == "transcoded"]
    assert "7 tensors (model.layers.0.mlp.down_proj.weight, " in warning["message"]
    assert "are already quantized: they are transcoded instead" in warning["message"]


def test_the_codes_unpack_low_nibble_first():
    assert e2m1_codes(torch.tensor([0x21, 0xF8], dtype=torch.uint8), (1, 4)).tolist() == [[1, 2, 8, 15]]
