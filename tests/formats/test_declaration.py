"""The declaration rule: a checkpoint that declares a method qcli does not read (HQQ, EETQ, torchao, one it has
never heard of), a GPTQ checkpoint in another kernel's packing (Marlin, exllama v2), and tensors that show
packing with no declaration are refused from the headers (exit 2, a hint), never written as if float; a
declaration of quantization applied at load time over float weights leaves what is on disk to decide.

The checkpoints are packed by hand with each format's published tensor names, dtypes and shapes: HQQ's
`W_q` with its `scale` and `zero` but none of the meta tensors HQQ saves beside them (tests/formats/test_hqq.py
has HQQ's own checkpoints); EETQ's
int8 `weight` beside fp16 per-channel `weight_scales` (`eetq/modules/qlinear.py`); torchao's flattened
subclass tensors (`qdata`, `scale`); GPTQ Marlin's `B` (int32 [in / 16, out * 16 / 8]) and `s` (fp16
[groups, out]) (AutoGPTQ's `marlin` QuantLinear); exllama v2's `q_weight`, `q_scale`, `q_scale_max`,
`q_groups` and `q_invperm` (exllamav2's `ext.py`). No weight is read before the refusal: `load` raises.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from qcli.errors import PlanError
from qcli.io.burnpack import BurnpackReader
from qcli.io.dtypes import QFloat
from tests.cli_support import assert_user_error, cli, validate_json
from tests.format_support import model_problems, refused_from_headers

FLOAT = {"model.norm.weight": torch.ones(64, dtype=torch.float16),
         "model.layers.0.mlp.up_proj.weight": torch.randn(64, 64, generator=torch.Generator().manual_seed(0))}
M = "model.layers.0.self_attn.q_proj"
CHECKPOINTS = {  # name -> (its own tensors, the file that declares it and what it says, or None)
    "hqq-without-its-meta": ({f"{M}.W_q": torch.zeros(32, 128, dtype=torch.uint8),
                              f"{M}.scale": torch.ones(64, 1, dtype=torch.float16),
                              f"{M}.zero": torch.full((64, 1), 7.5, dtype=torch.float16),
                              f"{M}.shape": torch.tensor([64, 64])},
                             ("hqq_config.json", {"quant_config": {"weight_quant_params": {"nbits": 4}}})),
    "eetq": ({f"{M}.weight": torch.zeros(64, 64, dtype=torch.int8),
              f"{M}.weight_scales": torch.ones(64, dtype=torch.float16)},
             ("config.json", {"quantization_config": {"quant_method": "eetq", "weights": "int8"}})),
    "torchao": ({f"{M}.weight.qdata": torch.zeros(64, 64, dtype=torch.int8),
                 f"{M}.weight.scale": torch.ones(64, dtype=torch.bfloat16)},
                ("config.json", {"quantization_config": {"quant_method": "torchao", "quant_type": {"default": {}}}})),
    "foo": ({f"{M}.weight": torch.randn(64, 64)}, ("config.json", {"quantization_config": {"quant_method": "foo"}})),
    "marlin": ({f"{M}.B": torch.zeros(4, 128, dtype=torch.int32), f"{M}.s": torch.ones(1, 64, dtype=torch.float16)},
               ("config.json", {"quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": -1,
                                                        "checkpoint_format": "marlin"}})),
    "exllama-v2": ({f"{M}.q_weight": torch.zeros(32, 64, dtype=torch.int32),
                    f"{M}.q_scale": torch.zeros(1, 8, dtype=torch.int32),
                    f"{M}.q_scale_max": torch.ones(1, dtype=torch.float16),
                    f"{M}.q_groups": torch.zeros(2, dtype=torch.int16),
                    f"{M}.q_invperm": torch.arange(64, dtype=torch.int32)}, None),
    "uint8-codes-and-zeros": ({f"{M}.weight": torch.zeros(64, 32, dtype=torch.uint8),
                               f"{M}.weight_zero": torch.zeros(64, 2, dtype=torch.float16),
                               f"{M}.weight_scale": torch.ones(64, 2, dtype=torch.float16)}, None),
}
# name -> (the refusal's format, words its reason holds, the tensors it covers)
REFUSALS = {
    "hqq-without-its-meta": ("codes of an unread layout (quant_method 'hqq' in hqq_config.json)",
                             "integer codes beside float scales", [f"{M}.W_q", f"{M}.scale", f"{M}.zero"]),
    "eetq": ("quant_method 'eetq' in config.json", "EETQ's int8 weights with per-channel fp16 scales",
             [f"{M}.weight", f"{M}.weight_scales"]),
    "torchao": ("quant_method 'torchao' in config.json", "torchao's tensor subclasses",
                [f"{M}.weight.qdata", f"{M}.weight.scale"]),
    "foo": ("quant_method 'foo' in config.json", "a method qcli has never heard of",  # nothing shows packing:
            ["model.layers.0.mlp.up_proj.weight", f"{M}.weight"]),  # every weight, what it did to them unknown
    "marlin": ("codes of an unread layout (quant_method 'gptq' (checkpoint_format 'marlin') in config.json)",
               "integer codes beside float scales", [f"{M}.B", f"{M}.s"]),
    "exllama-v2": ("undeclared packed codes", "no config.json quantization_config or side file declares",
                   [f"{M}.q_groups", f"{M}.q_invperm", f"{M}.q_scale", f"{M}.q_scale_max", f"{M}.q_weight"]),
    "uint8-codes-and-zeros": ("undeclared packed codes", "integer codes beside float scales or zero points",
                              [f"{M}.weight", f"{M}.weight_scale", f"{M}.weight_zero"]),
}


def write(folder: Path, name: str) -> Path:
    tensors, declared = CHECKPOINTS[name]
    folder.mkdir(parents=True, exist_ok=True)
    save_file({**FLOAT, **tensors}, str(folder / "model.safetensors"))
    if declared is not None:
        (folder / declared[0]).write_text(json.dumps(declared[1]))
    return folder


@pytest.mark.parametrize("name", sorted(CHECKPOINTS))
def test_refused_from_the_headers_naming_the_method_file_and_tensors(name, tmp_path, monkeypatch):

    folder = write(tmp_path / "ckpt", name)
    format, why, tensors = REFUSALS[name]

    for flags in ({}, {"requantize": "q4f-b32"}):  # --requantize is no way out: qcli has no decoder for it
        [problem] = refused_from_headers(monkeypatch, folder, tmp_path / "out.bpk", **flags)
        assert sorted(problem.tensors) == tensors
        assert f" are {format}: " in problem.message and why in problem.message
        assert "dequantize the checkpoint to BF16 or F32" in problem.hint
    lines = assert_user_error(cli("quantize", folder, "-o", tmp_path / "out.bpk"), PlanError.exit_code)
    assert any(format in line for line in lines)
    assert not (tmp_path / "out.bpk").exists()
    assert_user_error(cli("quantize", folder, "--dry-run"), PlanError.exit_code)
    recipe = 'version = 1\n[[rule]]\nmatch = "*.norm.weight"\nkeep = true\n'
    [error] = [p for p in model_problems(recipe, folder, tmp_path, code=1) if p["severity"] == "error"]
    assert sorted(error["tensors"]) == tensors


@pytest.mark.parametrize("name, verdict", [
    ("eetq", "quant_method 'eetq' in config.json: a method qcli does not read, refused"),
    ("hqq-without-its-meta",
     "quant_method 'hqq' in hqq_config.json: its tensors are not that method's layout, refused"),
    ("marlin", "quant_method 'gptq' (checkpoint_format 'marlin') in config.json: its tensors are not that method's "
               "layout, refused"),
    ("exllama-v2", "no declaration; tensors show packing: refused"),
])
def test_inspect_shows_the_declaration_and_the_decision(name, verdict, tmp_path):
    folder = write(tmp_path, name)
    result = cli("inspect", folder, "--json")
    assert result.code == 0, result.err
    doc = json.loads(result.out)
    validate_json(doc)
    assert doc["plan"]["declaration"] == verdict
    planned = {t["name"]: t["plan"] for t in doc["tensors"]}
    assert all(planned[t]["refused"] for t in REFUSALS[name][2])
    assert f"declaration: {verdict}" in cli("inspect", folder).out


DISK = "the weights on disk are float, so what is on disk decides"
LOAD_TIME = {  # the declaration, and what inspect says of it
    "fp8-dynamic": ({"quant_method": "fp8", "activation_scheme": "dynamic"},
                    f"quant_method 'fp8' in config.json: quantization applied at load time, {DISK}"),
    "bitsandbytes-4bit": ({"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"},
                          f"quant_method 'bitsandbytes' in config.json: quantization applied at load time, {DISK}"),
    "awq-without-its-tensors": ({"quant_method": "awq", "version": "gemm"},
                                f"quant_method 'awq' (version 'gemm') in config.json: no tensor of that method on "
                                f"disk, {DISK}"),
}


@pytest.mark.parametrize("name", sorted(LOAD_TIME))
def test_a_declaration_over_float_weights_leaves_the_disk_to_decide(name, tmp_path):
    config, verdict = LOAD_TIME[name]
    save_file({k: v.to(torch.bfloat16) for k, v in FLOAT.items()}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": config}))
    result = cli("inspect", tmp_path, "--json")
    assert result.code == 0, result.err
    assert json.loads(result.out)["plan"]["declaration"] == verdict
    result = cli("quantize", tmp_path, "-o", tmp_path / "model.bpk")
    assert result.code == 0, result.err
    entries = {e.name: e for e in BurnpackReader.open(tmp_path / "model.bpk").entries()}
    assert isinstance(entries["model.layers.0.mlp.up_proj.weight"].dtype, QFloat)


def test_config_json_declares_before_a_side_file(tmp_path):
    """config.json's quantization_config is read first: an AutoGPTQ quantize_config.json beside a declared fp8
    config does not make it GPTQ; alone, the side file declares (AutoGPTQ's older files name no method)."""
    from qcli.formats.declaration import declaration

    (tmp_path / "quantize_config.json").write_text(json.dumps({"bits": 4, "group_size": 128}))
    assert (declaration(tmp_path).method, declaration(tmp_path).file) == ("gptq", "quantize_config.json")
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "FP8"}}))
    assert (declaration(tmp_path).method, declaration(tmp_path).file) == ("fp8", "config.json")
    (tmp_path / "config.json").write_text("{not json")  # declares nothing, as a missing config.json
    assert declaration(tmp_path).file == "quantize_config.json"


@pytest.mark.parametrize("form", ["marlin", "bitblas"])
def test_a_gptq_checkpoint_format_qcli_does_not_read_is_refused_not_kept(form, tmp_path):
    """GPTQ's own tensors (qweight, qzeros, scales, g_idx) under a `checkpoint_format` of another kernel's
    packing: refused from the headers (exit 2), naming the format, never written as kept integers."""
    from tests.formats.test_gptq import write as write_gptq

    write_gptq(tmp_path, 4, 32, in_config_json=True)
    config = json.loads((tmp_path / "config.json").read_text())
    config["quantization_config"]["checkpoint_format"] = form
    (tmp_path / "config.json").write_text(json.dumps(config))
    lines = assert_user_error(cli("quantize", tmp_path, "-o", tmp_path / "m.bpk", "--requantize", "q4f-b32"),
                              PlanError.exit_code)
    assert any(f"its config.json says checkpoint format '{form}': qcli reads gptq and gptq_v2" in line
               for line in lines), lines
    assert not (tmp_path / "m.bpk").exists()


def test_a_declaration_file_that_is_a_fifo_or_nests_past_the_stack_declares_nothing(tmp_path):
    """A FIFO config.json would block a read until a writer comes, and JSON nested 100k deep recurses out of
    the stack: each declares nothing (as a file that is not JSON), and the run goes on from the tensors."""
    import os

    save_file(FLOAT, str(tmp_path / "model.safetensors"))
    os.mkfifo(tmp_path / "config.json")
    (tmp_path / "quantize_config.json").write_text("[" * 100_000)
    result = cli("quantize", tmp_path, "--dry-run")
    assert result.code == 0, result.err
    assert json.loads(cli("inspect", tmp_path, "--json").out)["plan"]["declaration"] == (
        "no declaration: every tensor is planned from its dtype and name")
