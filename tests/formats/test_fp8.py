"""FP8 checkpoints written by torch, transcoded into E4M3 and E5M2 QFloat: qcli's decode of the `.bpk` is
torch's own dequantization bit for bit, on either pipeline, and Burn's wgpu decodes the file to the same
values."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from qcli.burn_backends import BurnBackend
from qcli.io.burnpack import BurnpackReader
from qcli.io.safetensors import SafetensorsSource
from qcli.plan.decisions import make_plan
from qcli.scheme import PackedU32, QuantScheme, QuantValue, ScaleDtype
from tests.burn_harness import dequantize, same_bits
from tests.cli_support import cli, validate_json
from tests.format_support import assert_burn_decodes_as_qcli, decoded, model_problems, pipeline_payloads

E4M3 = QuantScheme().with_value(QuantValue.E4M3).with_store(PackedU32(0))


def codes(shape: tuple[int, ...], seed: int, dtype: torch.dtype = torch.float8_e4m3fn) -> torch.Tensor:
    """torch's float8_e4m3fn (or float8_e5m2) of wide normal values: codes over the whole grid, subnormals
    and the largest finite value included."""
    g = torch.Generator().manual_seed(seed)
    top, binades = (448, 8) if dtype == torch.float8_e4m3fn else (57344, 15)
    x = torch.randn(shape, generator=g) * torch.logspace(-binades, binades, shape[-1], base=2.0)
    return x.clamp(-top, top).to(dtype)


def scales(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(shape, generator=g, dtype=torch.float32) * 0.01 + 1e-4


# name -> (weight, its scale companion's suffix and shape, how torch broadcasts the scale over the weight)
def layouts(words: bool) -> dict[str, tuple[torch.Tensor, str, torch.Tensor]]:
    """Per-tensor (0-D and [1]), per-channel ([out] and [out, 1]) and DeepSeek 128x128 blocks with partial
    edges; `words`: every row a whole number of u32 words (what wgpu loads), else rows that need padding."""
    cols = 260 if words else 262  # 262 = 2 * 131: blocks of 131, each row padded by two codes
    return {
        "tensor.weight": (codes((6, 12 if words else 10), 1), "_scale", scales((), 2)),
        "tensor1.weight": (codes((4, 8), 3), ".scale", scales((1,), 4)),
        "channel.weight": (codes((5, cols), 5), "_scale", scales((5, 1), 6)),
        "channel1.weight": (codes((7, 24), 7), "_scale", scales((7,), 8)),
        "blocks.weight": (codes((300, 136 if words else 140), 9), "_scale_inv", scales((3, 2), 10)),
        "e5m2.weight": (codes((3, cols), 11, torch.float8_e5m2), "_scale", scales((3,), 12)),
    }


def torch_dequantized(weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The format's own dequantization: f32 codes times the scale, a 128x128 block's repeated over it."""
    if scale.dim() == 2 and scale.shape[1] > 1:
        scale = scale.repeat_interleave(128, 0).repeat_interleave(128, 1)[: weight.shape[0], : weight.shape[1]]
    elif scale.dim() == 1 and scale.numel() > 1:
        scale = scale[:, None]
    return weight.to(torch.float32) * scale


def write(directory: Path, words: bool = False, config: bool = True) -> dict[str, torch.Tensor]:
    """The checkpoint (`model.safetensors` with a norm kept beside, and DeepSeek's config.json) and each
    weight's torch dequantization."""
    directory.mkdir(exist_ok=True)
    tensors, want = {"norm.weight": torch.ones(8)}, {}
    for name, (weight, suffix, scale) in layouts(words).items():
        tensors[name], tensors[name + suffix] = weight, scale
        want[name] = torch_dequantized(weight, scale)
    save_file(tensors, str(directory / "model.safetensors"))
    if config:
        (directory / "config.json").write_text(json.dumps(
            {"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}))
    return want




def test_the_plan_transcodes_each_layout_from_the_headers_and_consumes_the_scales(tmp_path):
    write(tmp_path)
    plan = make_plan(SafetensorsSource.open(tmp_path).infos())
    decisions = {e.info.name: e.decision for e in plan.entries}
    assert sorted(decisions) == ["blocks.weight", "channel.weight", "channel1.weight", "e5m2.weight",
                                 "norm.weight", "tensor.weight", "tensor1.weight"]
    assert decisions["tensor.weight"].scheme == E4M3.per_tensor(ScaleDtype.F32)
    assert decisions["tensor.weight"].reason == (
        "default: transcode F8_E4M3 with per-tensor scales -> E4M3 PackedU32(0) tensor F32, exact")
    assert decisions["channel.weight"].scheme == E4M3.per_block([1, 131], ScaleDtype.F32)
    assert decisions["channel1.weight"].scheme == E4M3.per_block([1, 24], ScaleDtype.F32)
    assert decisions["blocks.weight"].scheme == E4M3.per_block([128, 128], ScaleDtype.F32)
    assert "block [128, 128] scale" in decisions["blocks.weight"].reason
    e5m2 = QuantScheme().with_value(QuantValue.E5M2).with_store(PackedU32(0))
    assert decisions["e5m2.weight"].scheme == e5m2.per_block([1, 131], ScaleDtype.F32)
    assert not plan.errors()
    # the bytes: the codes padded to whole words per row, then one f32 scale per Burn block
    entry = next(e for e in plan.entries if e.info.name == "channel.weight")
    assert entry.out_nbytes == 5 * 264 + 5 * 2 * 4


@pytest.mark.parametrize("pipeline", ["cpu", pytest.param("triton", marks=pytest.mark.interpreter)])
def test_the_decoded_bpk_is_torchs_dequantization_bit_for_bit(tmp_path, pipeline, monkeypatch):
    if pipeline == "triton":
        monkeypatch.setenv("QCLI_KERNELS", "triton")  # the GPU pipeline (under TRITON_INTERPRET on the CPU)
    want = write(tmp_path / "ckpt")
    out = tmp_path / "model.bpk"
    result = cli("quantize", tmp_path / "ckpt", "-o", out, "--json")
    assert result.code == 0, result.err
    assert json.loads(result.out)["device"] == pipeline
    got = decoded(out)
    assert sorted(got) == sorted(want)
    for name, values in want.items():
        assert same_bits(got[name], values), name
    names = [e.name for e in BurnpackReader.open(out).entries()]
    assert not [n for n in names if "scale" in n]  # consumed, not written beside
    compared = cli("inspect", out, "--compare", tmp_path / "ckpt", "--json")
    assert compared.code == 0, compared.err
    doc = json.loads(compared.out)["compare"]
    assert doc["ok"] and all(r["exact"] for r in doc["tensors"]), doc


def test_dry_run_json_and_validate_scheme_show_the_transcode(tmp_path):
    write(tmp_path)
    result = cli("quantize", tmp_path, "--dry-run", "--json")
    assert result.code == 0, result.err
    doc = json.loads(result.out)
    validate_json(doc)
    row = next(t for t in doc["tensors"] if t["name"] == "blocks.weight")
    assert row["decision"] == "transcode"
    assert row["reason"].startswith("default: transcode F8_E4M3 with block [128, 128] scales -> E4M3")
    problems = model_problems('version = 1\n[[rule]]\nmatch = "*.weight"\npreset = "q8s-b32"\n', tmp_path, tmp_path)
    [warning] = [p for p in problems if p["kind"] == "transcoded"]
    assert "6 tensors (blocks.weight, channel.weight, channel1.weight, ...) are already quantized" in warning["message"]
    assert "transcode F8_E4M3 with block [128, 128] scales -> E4M3 PackedU32(0) block [128, 128] F32, exact" in (
        warning["message"])


def test_a_block_size_from_config_json_and_formats_without_a_burn_form(tmp_path):
    tensors = {"a.weight": codes((64, 64), 1), "a.weight_scale_inv": scales((2, 2), 2),
               "b.weight": torch.ones(8, 8).to(torch.float8_e8m0fnu), "b.weight_scale": scales((), 4),
               "c.weight": codes((8, 8), 5), "c.weight_scale": scales((3, 3), 6),
               "d.weight": codes((0, 8), 7), "d.weight_scale": scales((), 8)}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": {"weight_block_size": [32, 32]}}))
    plan = make_plan(SafetensorsSource.open(tmp_path).infos())
    decisions = {e.info.name: e.decision for e in plan.entries}
    assert decisions["a.weight"].scheme == E4M3.per_block([32, 32], ScaleDtype.F32)
    assert decisions["b.weight"].scheme is None and decisions["c.weight"].scheme is None
    errors = {p.tensors[0]: p for p in plan.errors()}
    assert sorted(errors) == ["b.weight", "c.weight", "d.weight"]
    assert "nor transcoded: a 0-D or empty tensor has no block" in errors["d.weight"].message
    assert "nor transcoded: F8_E8M0 with a scale tensor has no transcode" in errors["b.weight"].message
    assert "[3, 3] is neither per tensor, per channel" in errors["c.weight"].message
    assert "docs/input-formats.md" in errors["c.weight"].hint
    assert "c.weight_scale" in decisions  # what is not transcoded keeps its scale beside it


@pytest.mark.interpreter
def test_the_gpu_pipeline_yields_the_cpu_pipelines_bytes(tmp_path):
    write(tmp_path)
    plan, want, got = pipeline_payloads(tmp_path)
    assert got == want
    # a tensor larger than a piece comes whole
    assert max(math.prod(e.info.shape) for e in plan.entries if e.decision.transcode) > 1000


def test_burn_wgpu_decodes_the_transcoded_file_as_qcli_does(tmp_path):
    want = write(tmp_path / "ckpt", words=True)
    out = tmp_path / "model.bpk"
    # No --burn-backend: it also refuses what a model computes wrong with, not this test's.
    result = cli("quantize", tmp_path / "ckpt", "-o", out, "--device", "cpu")
    assert result.code == 0, result.err
    assert_burn_decodes_as_qcli(out, want, BurnBackend.wgpu, tmp_path)


def test_a_backend_that_cannot_load_a_transcode_is_not_offered_another_scheme(tmp_path):
    """flex reads no E4M3: the warning says so, and its hint points to a backend that reads the codes
    rather than to a scheme, which would not be the checkpoint's values."""
    write(tmp_path)
    plan = make_plan(SafetensorsSource.open(tmp_path).infos())
    flex = [p for p in plan.problems if p.kind == "backend" and "flex backend" in p.message]
    assert flex and all("checkpoint's own codes" in p.hint and "use " not in p.hint for p in flex)


def test_e5m2_infinities_and_nans_transcode_and_compare_exactly(tmp_path):
    """E5M2 has codes for ±inf and NaN (E4M3 only NaN): a transcode writes them as they are, so the file
    decodes to torch's own values bit for bit, in qcli and in Burn's wgpu, and `inspect --compare` finds
    it exact rather than measuring inf - inf."""
    codes = torch.arange(256, dtype=torch.uint8).reshape(8, 32).view(torch.float8_e5m2)
    assert codes.to(torch.float32).isinf().sum() == 2 and codes.to(torch.float32).isnan().sum() == 6
    (tmp_path / "ckpt").mkdir()
    save_file({"w.weight": codes, "w.weight_scale": torch.tensor(0.5)}, str(tmp_path / "ckpt" / "model.safetensors"))
    out = tmp_path / "model.bpk"
    # No --burn-backend: it also refuses what a model computes wrong with, not this test's.
    result = cli("quantize", tmp_path / "ckpt", "-o", out, "--device", "cpu")
    assert result.code == 0, result.err
    want = codes.to(torch.float32) * 0.5
    burn, mine = dequantize(BurnBackend.wgpu, out, tmp_path / "burn.safetensors")["w.weight"], decoded(out)["w.weight"]
    for got in (mine, burn):  # bit for bit, NaN for NaN (torch keeps a NaN code's mantissa, Burn and qcli do not)
        nan = want.isnan()
        assert torch.equal(got.isnan(), nan) and same_bits(got[~nan], want[~nan])
    compared = cli("inspect", out, "--compare", tmp_path / "ckpt", "--json")
    assert compared.code == 0, compared.err
    doc = json.loads(compared.out)["compare"]
    assert doc["ok"] and [r["exact"] for r in doc["tensors"]] == [True], doc
