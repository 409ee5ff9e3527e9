"""AutoAWQ checkpoints (GEMM and GEMV packings): refused before any weight is read, their zero points having no
Burn form, with `--requantize` the way out, which dequantizes as AWQ does before quantizing.

AutoAWQ needs its CUDA kernels (`autoawq` builds against them), so the checkpoints are packed by hand from
AutoAWQ's published layout, with Python integers: GEMM packs eight 4-bit codes an int32 along the output axis,
word j's field k (bits 4k..4k+3) holding output 8j + [0, 2, 4, 6, 1, 3, 5, 7][k]
(`awq/utils/packing_utils.py`, AWQ_ORDER), qweight [in, out/8], qzeros [in/group, out/8], scales
[in/group, out]; GEMV packs along the input axis in order, qweight [out, in/8], and pads a row's zero points
to whole words (and to 128/group words for groups under 128: `calculate_zeros_width`), qzeros [out, W],
scales [out, 8W] (`awq/modules/linear/gemv.py`). The oracle is AWQ's formula `(code - zero) * scale`
(`dequantize_gemm`), worked here in float64, where it is exact, and rounded once to f16 as AutoAWQ's f16
product is.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from qcli.errors import PlanError
from qcli.io.burnpack import BurnpackReader
from tests.cli_support import assert_user_error, cli, validate_json
from tests.format_support import model_problems, refused_from_headers

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
MODULES = {"model.layers.0.self_attn.q_proj": (64, 256), "model.layers.0.mlp.down_proj": (32, 128)}  # [out, in]


def words(fields: list[list[int]]) -> torch.Tensor:
    """int32 words from rows of eight-field groups: each group of 8 codes one word, the first in the low bits."""
    packed = [[sum(c << (4 * k) for k, c in enumerate(row[i:i + 8])) for i in range(0, len(row), 8)] for row in fields]
    as_unsigned = torch.tensor(packed, dtype=torch.int64)
    return torch.where(as_unsigned >= 1 << 31, as_unsigned - (1 << 32), as_unsigned).to(torch.int32)


def gemm_pack(codes: torch.Tensor) -> torch.Tensor:
    """[rows, out] codes as GEMM words [rows, out/8]: field k of word j is output 8j + AWQ_ORDER[k]."""
    rows = codes.tolist()
    return words([[row[8 * (i // 8) + AWQ_ORDER[i % 8]] for i in range(len(row))] for row in rows])


def zeros_width(count: int, group: int) -> int:
    """AutoAWQ's `calculate_zeros_width`, worked out: groups in whole words, then in multiples of 128 / group."""
    multiple = {32: 4, 64: 2}.get(group, 1)
    base = -(-(count // group) // 8)
    return -(-base // multiple) * multiple


def write(folder: Path, version: str, group: int, *, side_file: bool = False, seed: int = 0) -> dict[str, torch.Tensor]:
    """An AWQ checkpoint of the two linears of MODULES and a norm, declared in config.json (or AutoAWQ's older
    quant_config.json); the oracle's f16 [out, in] of each weight, by its written name."""
    folder.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {"model.norm.weight": torch.ones(64, dtype=torch.float16)}
    oracle = {}
    for module, (out, count) in MODULES.items():
        groups = count // group
        codes = torch.randint(0, 16, (out, count), generator=g)
        zeros = torch.randint(0, 16, (out, groups), generator=g)
        scales = (torch.rand(out, groups, generator=g) * 0.02 + 1e-3).to(torch.float16)
        index = torch.arange(count) // group
        exact = (codes - zeros[:, index]).to(torch.float64) * scales.to(torch.float64)[:, index]
        oracle[f"{module}.weight"] = exact.to(torch.float16)
        if version == "gemm":
            packed = {"qweight": gemm_pack(codes.t()), "qzeros": gemm_pack(zeros.t()), "scales": scales.t()}
        else:
            width = zeros_width(count, group)
            padded_zeros = torch.zeros(out, 8 * width, dtype=torch.int64)
            padded_zeros[:, :groups] = zeros
            padded_scales = torch.zeros(out, 8 * width, dtype=torch.float16)
            padded_scales[:, :groups] = scales
            packed = {"qweight": words(codes.tolist()), "qzeros": words(padded_zeros.tolist()), "scales": padded_scales}
        tensors |= {f"{module}.{k}": v.contiguous() for k, v in packed.items()}
    tensors["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(64, dtype=torch.float16)
    save_file(tensors, str(folder / "model.safetensors"))
    if side_file:
        (folder / "quant_config.json").write_text(json.dumps(
            {"zero_point": True, "q_group_size": group, "w_bit": 4, "version": version.upper()}))
    else:
        (folder / "config.json").write_text(json.dumps({"quantization_config": {
            "quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True, "version": version}}))
    return oracle


def test_the_packings_by_hand():
    """A word of codes 0..7 for outputs (GEMM) or inputs (GEMV) 0..7, worked out by hand: GEMM's fields hold
    outputs 0, 2, 4, 6, 1, 3, 5, 7 from the low bits up, GEMV's in order."""
    assert gemm_pack(torch.arange(8)[None]).item() == 0x75316420
    assert words([list(range(8))]).item() == 0x76543210
    assert zeros_width(256, 32) == 4 and zeros_width(256, 128) == 1 and zeros_width(4096, 64) == 8


CASES = {"gemm-g128": ("gemm", 128, False), "gemm-g32-quant_config": ("gemm", 32, True),
         "gemv-g128": ("gemv", 128, False), "gemv-g32": ("gemv", 32, False)}


@pytest.mark.parametrize("case", sorted(CASES))
def test_refused_before_any_weight_is_read(case, tmp_path, monkeypatch):

    version, group, side_file = CASES[case]
    write(tmp_path / "ckpt", version, group, side_file=side_file)

    [problem] = refused_from_headers(monkeypatch, tmp_path / "ckpt", tmp_path / "refused.bpk")
    assert problem.kind == "scheme"
    assert problem.message.startswith(f"2 tensors (model.layers.0.mlp.down_proj.qweight, "
                                      f"model.layers.0.self_attn.q_proj.qweight) are AWQ {version.upper()} 4-bit "
                                      f"group {group}: each group's values are offset by a zero point")
    assert "--requantize q4s-b32 (dequantized as AutoAWQ does, (code - zero) * scale" in problem.hint
    assert_user_error(cli("quantize", tmp_path / "ckpt", "--dry-run"), PlanError.exit_code)
    assert not (tmp_path / "refused.bpk").exists()
    recipe = 'version = 1\n[[rule]]\nmatch = "*.norm.weight"\nkeep = true\n'
    [found] = [p for p in model_problems(recipe, tmp_path / "ckpt", tmp_path, code=1) if p["severity"] == "error"]
    assert found["tensors"] == ["model.layers.0.mlp.down_proj.qweight", "model.layers.0.self_attn.q_proj.qweight"]


@pytest.mark.parametrize("case", sorted(CASES))
def test_requantize_quantizes_awqs_dequantization(case, tmp_path):
    """`--requantize q4f-b32` writes what quantizing the oracle's f16 weights with q4f-b32 writes, byte for byte."""
    version, group, side_file = CASES[case]
    oracle = write(tmp_path / "ckpt", version, group, side_file=side_file)
    result = cli("quantize", tmp_path / "ckpt", "-o", tmp_path / "awq.bpk", "--requantize", "q4f-b32", "--json")
    assert result.code == 0, result.err
    doc = json.loads(result.out)
    validate_json(doc)
    rows = {t["name"]: t for t in doc["tensors"]}
    assert rows["model.layers.0.self_attn.q_proj.weight"]["reason"] == (
        f"requantize AWQ {version.upper()} 4-bit group {group} -> q4f-b32")
    float_folder = tmp_path / "float"
    float_folder.mkdir()
    save_file({"model.norm.weight": torch.ones(64, dtype=torch.float16),
               "model.layers.0.self_attn.q_proj.bias": torch.zeros(64, dtype=torch.float16), **oracle},
              str(float_folder / "model.safetensors"))
    result = cli("quantize", float_folder, "-o", tmp_path / "float.bpk", "--scheme", "q4f-b32")
    assert result.code == 0, result.err
    got, want = BurnpackReader.open(tmp_path / "awq.bpk"), BurnpackReader.open(tmp_path / "float.bpk")
    assert sorted(e.name for e in got.entries()) == sorted(e.name for e in want.entries())
    for entry in want.entries():
        assert bytes(got.read(entry.name)) == bytes(want.read(entry.name)), entry.name


def test_inspect_shows_the_declaration_and_the_format(tmp_path):
    write(tmp_path, "gemv", 128)
    result = cli("inspect", tmp_path, "--json")
    assert result.code == 0, result.err
    doc = json.loads(result.out)
    validate_json(doc)
    assert doc["plan"]["declaration"] == "quant_method 'awq' (version 'gemv') in config.json: read by its format module"
    planned = {t["name"]: t["plan"] for t in doc["tensors"]}
    assert planned["model.layers.0.mlp.down_proj.qweight"]["format"] == "AWQ GEMV 4-bit group 128"
    assert planned["model.layers.0.mlp.down_proj.qweight"]["refused"]
    assert "declaration: quant_method 'awq' (version 'gemv') in config.json" in cli("inspect", tmp_path).out


@pytest.mark.parametrize("config, why", [
    ({"version": "gemv_fast"}, "AWQ version 'gemv_fast' packs for its own kernel"),
    ({"version": "gemv"},
     "as AWQ gemv, model.layers.0.self_attn.q_proj.qweight [256, 8] has 64 inputs, not whole groups of 128"),
    ({"bits": 8}, "AWQ with bits 8 and group_size 128"),
])
def test_a_layout_qcli_does_not_read_is_refused_from_the_headers(config, why, tmp_path):
    """GEMM tensors declared as another version, or another width: an error naming why, exit 2, nothing written."""
    write(tmp_path, "gemm", 128)
    declared = json.loads((tmp_path / "config.json").read_text())
    declared["quantization_config"] |= config
    (tmp_path / "config.json").write_text(json.dumps(declared))
    lines = assert_user_error(cli("quantize", tmp_path, "-o", tmp_path / "m.bpk", "--requantize", "q4f-b32"),
                              PlanError.exit_code)
    assert any(why in line for line in lines), lines
    assert not (tmp_path / "m.bpk").exists()
