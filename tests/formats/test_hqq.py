"""HQQ checkpoints, written by HQQ itself: refused before any weight is read (HQQ's zero points have no Burn
form), with `--requantize` the way out, which dequantizes exactly as HQQ does before quantizing.

The checkpoints are HQQ 0.2.8's own: `HQQLinear` quantizes torch linears on the CPU and its `state_dict()` (the
encoded form transformers' `save_pretrained` writes, every meta entry a tensor) is saved under each module's
name, with `config.json`'s `quantization_config` as transformers writes it. The oracle is HQQ's
`HQQLinear.dequantize()`. hqq installs without its dependencies and CUDA kernels
(`DISABLE_CUDA=1 pip install --no-deps hqq==0.2.8.post1 termcolor`, as `.ci/run` does).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from qcli.errors import InputError, PlanError
from qcli.io.burnpack import BurnpackReader
from qcli.io.safetensors import SafetensorsSource
from tests.cli_support import assert_user_error, cli, validate_json
from tests.format_support import refused_from_headers

HQQ_INSTALL = "DISABLE_CUDA=1 pip install --no-deps hqq==0.2.8.post1 termcolor==3.3.0"
try:
    import hqq.core.quantize as hqq
except ImportError:  # where it is not installed the tests skip, or under CI fail, as .ci/run installs it
    if os.environ.get("CI") == "true":
        pytest.fail(f"hqq writes and judges these checkpoints: {HQQ_INSTALL} (.ci/run installs it)", pytrace=False)
    pytest.skip(f"hqq writes and judges these checkpoints: {HQQ_INSTALL}", allow_module_level=True)

MODULES = {"model.layers.0.self_attn.q_proj": (64, 256), "model.layers.0.mlp.down_proj": (32, 128)}  # [out, in]
NORM = {"model.norm.weight": torch.ones(64, dtype=torch.float16)}


def write(folder: Path, nbits: int, group: int, axis: int = 1,
          compute_dtype: torch.dtype = torch.float16) -> dict[str, torch.Tensor]:
    """HQQ's checkpoint of MODULES' linears and a norm; HQQ's own dequantization of each, by its written name."""
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    tensors, oracle = dict(NORM), {}
    config = hqq.BaseQuantizeConfig(nbits=nbits, group_size=group, axis=axis)
    for module, (out, count) in MODULES.items():
        layer = hqq.HQQLinear(torch.nn.Linear(count, out, bias=module.endswith("q_proj")), config,
                              compute_dtype=compute_dtype, device="cpu")
        tensors |= {f"{module}.{k}": v.contiguous() for k, v in layer.state_dict().items()}
        oracle[f"{module}.weight"] = layer.dequantize()
    save_file(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({"quantization_config": {
        "quant_method": "hqq", "quant_config": config, "skip_modules": ["lm_head"]}}))
    return oracle


def test_refused_before_any_weight_is_read(tmp_path, monkeypatch):

    write(tmp_path / "ckpt", 4, 64)

    [problem] = refused_from_headers(monkeypatch, tmp_path / "ckpt", tmp_path / "refused.bpk")
    assert problem.kind == "scheme"
    assert problem.message.startswith("2 tensors (model.layers.0.mlp.down_proj.W_q, "
                                      "model.layers.0.self_attn.q_proj.W_q) are HQQ: each group's values are "
                                      "offset by a zero point")
    assert "--requantize q4s-b32 (dequantized as HQQ does, (code - zero) * scale" in problem.hint
    assert_user_error(cli("quantize", tmp_path / "ckpt", "--dry-run"), PlanError.exit_code)
    assert not (tmp_path / "refused.bpk").exists()
    result = cli("inspect", tmp_path / "ckpt", "--json")
    assert result.code == 0, result.err
    assert json.loads(result.out)["plan"]["declaration"] == (
        "quant_method 'hqq' in config.json: read by its format module")


# name -> (nbits, group, axis, compute dtype, the preset): every byte packing, both axes, a bf16 model
CASES = {"4bit-g64": (4, 64, 1, torch.float16, "q4f-b32"), "2bit-g32": (2, 32, 1, torch.float16, "q4f-b32"),
         "8bit-g128": (8, 128, 1, torch.float16, "q8s-b32"), "1bit-g64": (1, 64, 1, torch.float16, "q4f-b32"),
         "4bit-g64-axis0": (4, 64, 0, torch.float16, "q4f-b32"), "4bit-g64-bf16": (4, 64, 1, torch.bfloat16, "q4f-b32")}


@pytest.mark.parametrize("case", sorted(CASES))
def test_requantize_quantizes_hqqs_own_dequantization(case, tmp_path):
    """`--requantize` writes what quantizing HQQ's `dequantize()` with the preset writes, byte for byte, and
    `inspect --tensor` on the source shows HQQ's values."""
    nbits, group, axis, dtype, preset = CASES[case]
    oracle = write(tmp_path / "ckpt", nbits, group, axis, dtype)
    result = cli("quantize", tmp_path / "ckpt", "-o", tmp_path / "hqq.bpk", "--requantize", preset, "--json")
    assert result.code == 0, result.err
    doc = json.loads(result.out)
    validate_json(doc)
    assert {t["name"]: t["reason"] for t in doc["tensors"]}["model.layers.0.mlp.down_proj.weight"] == (
        f"requantize HQQ -> {preset}")
    (tmp_path / "float").mkdir()
    bias = {"model.layers.0.self_attn.q_proj.bias": saved_bias(tmp_path / "ckpt")}
    save_file({**NORM, **bias, **oracle}, str(tmp_path / "float" / "model.safetensors"))
    result = cli("quantize", tmp_path / "float", "-o", tmp_path / "float.bpk", "--scheme", preset)
    assert result.code == 0, result.err
    got, want = BurnpackReader.open(tmp_path / "hqq.bpk"), BurnpackReader.open(tmp_path / "float.bpk")
    assert sorted(e.name for e in got.entries()) == sorted(e.name for e in want.entries())
    for entry in want.entries():
        assert bytes(got.read(entry.name)) == bytes(want.read(entry.name)), entry.name


def saved_bias(folder: Path) -> torch.Tensor:
    """The q_proj bias HQQ saved beside its codes (a float tensor qcli plans as any)."""
    with SafetensorsSource.open(folder) as source:
        return source.load("model.layers.0.self_attn.q_proj.bias")


def test_meta_that_does_not_describe_the_codes_is_an_input_error(tmp_path):
    """A group_size the W_q does not have: the run stops reading the meta (exit 3), before any weight, nothing
    written."""
    write(tmp_path, 4, 64)
    with SafetensorsSource.open(tmp_path) as source:
        tensors = {i.name: source.load(i.name) for i in source.infos()}
    tensors["model.layers.0.mlp.down_proj.group_size"] = torch.tensor(32, dtype=torch.int32)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    lines = assert_user_error(cli("quantize", tmp_path, "-o", tmp_path / "m.bpk", "--requantize", "q4f-b32"),
                              InputError.exit_code)
    assert "HQQ module 'model.layers.0.mlp.down_proj': its meta" in lines[0]
    assert not (tmp_path / "m.bpk").exists()
