"""transformers' fbgemm_fp8 checkpoints (FbgemmFp8Config), packed by hand from their published layout: each
`weight` F8_E4M3 `[out, in]` quantized per row as fbgemm's reference does (`x * (448 / row absmax)` to
E4M3), its `weight_scale` the reciprocal, F32 `[out, 1]`, and `input_scale_ub` the activations' bound.
Transcoded per channel: qcli's decode is the layout's dequantization `weight.float() * weight_scale` bit for
bit, and Burn's wgpu decodes the file to the same values."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from qcli.burn_backends import BurnBackend
from qcli.io.burnpack import BurnpackReader
from qcli.io.safetensors import SafetensorsSource
from qcli.plan.decisions import make_plan
from qcli.scheme import PackedU32, QuantScheme, QuantValue, ScaleDtype
from tests.burn_harness import same_bits
from tests.cli_support import cli
from tests.format_support import assert_burn_decodes_as_qcli, decoded

E4M3 = QuantScheme().with_value(QuantValue.E4M3).with_store(PackedU32(0))
LAYERS = {"model.layers.0.mlp.up_proj": (8, 512), "model.layers.0.self_attn.o_proj": (4, 64)}


def quantize_per_row(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fbgemm's per-row FP8 quantization: codes E4M3 of `x * 448 / absmax` and the f32 reciprocal scale."""
    scale = (448.0 / x.abs().amax(dim=1)).clamp(max=448.0 * 512.0)
    return (x * scale[:, None]).to(torch.float8_e4m3fn), scale.reciprocal().to(torch.float32)[:, None]


def write(directory: Path) -> dict[str, torch.Tensor]:
    """The checkpoint (a BF16 lm_head left unconverted, as modules_to_not_convert says) and each weight's
    dequantization."""
    directory.mkdir(exist_ok=True)
    g = torch.Generator().manual_seed(0)
    tensors = {"lm_head.weight": torch.randn(16, 64, generator=g).to(torch.bfloat16)}
    want = {}
    for name, shape in LAYERS.items():
        codes, scale = quantize_per_row(torch.randn(shape, generator=g) * torch.logspace(-3, 3, shape[0])[:, None])
        tensors |= {f"{name}.weight": codes, f"{name}.weight_scale": scale,
                    f"{name}.input_scale_ub": torch.tensor([1200.0])}
        want[f"{name}.weight"] = codes.to(torch.float32) * scale
    save_file(tensors, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps({"quantization_config": {
        "quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0, "modules_to_not_convert": ["lm_head"]}}))
    return want


def test_each_weight_is_transcoded_per_channel_and_its_bound_kept(tmp_path):
    write(tmp_path)
    plan = make_plan(SafetensorsSource.open(tmp_path).infos())
    decisions = {e.info.name: e.decision for e in plan.entries}
    assert decisions["model.layers.0.mlp.up_proj.weight"].scheme == E4M3.per_block([1, 128], ScaleDtype.F32)
    assert decisions["model.layers.0.self_attn.o_proj.weight"].scheme == E4M3.per_block([1, 64], ScaleDtype.F32)
    assert decisions["model.layers.0.mlp.up_proj.weight"].reason == (
        "default: transcode F8_E4M3 with per-channel scales -> E4M3 PackedU32(0) block [128] F32, exact")
    assert "model.layers.0.mlp.up_proj.weight_scale" not in decisions  # consumed
    assert decisions["model.layers.0.mlp.up_proj.input_scale_ub"].scheme is None  # kept: an activation bound
    assert not plan.errors()


def test_the_decoded_bpk_is_the_layouts_dequantization_and_burn_wgpu_decodes_it_so(tmp_path):
    want = write(tmp_path / "ckpt")
    out = tmp_path / "model.bpk"
    # No --burn-backend: it also refuses what a model computes wrong with, not this test's.
    result = cli("quantize", tmp_path / "ckpt", "-o", out)
    assert result.code == 0, result.err
    got = decoded(out, want)
    for name, values in want.items():
        assert same_bits(got[name], values), name
    names = {e.name for e in BurnpackReader.open(out).entries()}
    assert not [n for n in names if n.endswith("weight_scale")] and "model.layers.0.mlp.up_proj.input_scale_ub" in names
    assert_burn_decodes_as_qcli(out, want, BurnBackend.wgpu, tmp_path)
