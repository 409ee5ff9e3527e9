"""GPTQ checkpoints: symmetric ones with their groups in order transcoded into Burn's Q2F/Q4F/Q8F, written as
the Hugging Face `weight`; zero points, activation order and 3-bit codes refused before any weight is read,
with `--requantize` the way out.

Two sets of checkpoints. The first is written with GPTQ's documented layout (AutoGPTQ, GPTQModel and
optimum save the same tensors), the packing worked by hand with Python integers (each column's codes one
little-endian bit stream, `bits` a code, cut into int32 words; v1 stores each zero point less one), and the
values are held to GPTQ's reference dequantization as GPTQModel's `dequantize_weight` computes it,
`scales[g_idx] * (codes - zeros[g_idx])` with f16 scales and integer codes, written out below: it pins the
layout independently of any GPTQ library. The second is packed by AutoGPTQ 0.7.1's own `QuantLinear.pack`
(GPTQModel needs torch >= 2.14 and its CUDA stack; AutoGPTQ's QuantLinear runs on the CPU in pure torch) and
held to AutoGPTQ's own dequantization, its forward of the identity. Either reference is f16; Burn decodes in
f32, where `(code - zero) * scale` is exact (an 11-bit significand times an integer of at most 8 bits), so
Burn's f32 is the exact product, and rounded to f16 it is the reference's f16 output bit for bit (both are
the exact product rounded once)."""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import json
import os
import sys
import types
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from qcli.burn_backends import BurnBackend
from qcli.codec.blocks import to_blocks
from qcli.errors import InputError, PlanError
from qcli.io.burnpack import BurnpackReader
from qcli.io.safetensors import SafetensorsSource
from qcli.layout import BlockGrid
from qcli.measure import error_bound
from qcli.plan.decisions import make_plan
from qcli.plan.options import PlanOptions
from qcli.presets import PRESETS
from qcli.scheme import PackedU32, QuantScheme, QuantValue, ScaleDtype
from tests.burn_harness import dequantize as burn_dequantize
from tests.burn_harness import same_bits
from tests.cli_support import assert_user_error, cli, validate_json
from tests.format_support import decoded, pipeline_payloads, refused_from_headers

Q4F = QuantScheme().with_value(QuantValue.Q4F).with_store(PackedU32(0))


def pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """int32 words [rows * bits / 32, cols]: each column of `codes` [rows, cols] one little-endian bit stream."""
    rows, cols = codes.shape
    words = []
    for column in codes.t().tolist():
        stream = sum(int(c) << (bits * i) for i, c in enumerate(column))
        words.append([(stream >> (32 * k)) & 0xFFFFFFFF for k in range(rows * bits // 32)])
    as_unsigned = torch.tensor(words, dtype=torch.int64).t()
    return torch.where(as_unsigned >= 1 << 31, as_unsigned - (1 << 32), as_unsigned).to(torch.int32).contiguous()


def reference(codes: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, g_idx: torch.Tensor) -> torch.Tensor:
    """GPTQ's dequantization (GPTQModel `dequantize_weight`): codes [in, out] and zeros [groups, out] as
    integers (the zero point itself, v1's stored one plus one), f16 scales; [out, in] f16."""
    g = g_idx.long()
    return (scales[g] * (codes - zeros[g]).to(torch.int16)).t()


def exact(codes: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, g_idx: torch.Tensor) -> torch.Tensor:
    """The same product in float64, where it is exact: [out, in]."""
    g = g_idx.long()
    return (scales.to(torch.float64)[g] * (codes - zeros[g]).to(torch.float64)).t()


def write(folder: Path, bits: int, group: int, *, sym: bool = True, desc_act: bool = False, v1: bool = True,
          in_config_json: bool = False, seed: int = 0) -> dict[str, tuple[torch.Tensor, ...]]:
    """A GPTQ checkpoint of two linears ([64, 256] with a bias, [64, 128]) and a norm, its config in
    quantize_config.json (or config.json's quantization_config); each weight's codes, zero points, scales
    and g_idx, by its written name."""
    folder.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {"model.norm.weight": torch.ones(64, dtype=torch.float16)}
    parts = {}
    for module, (out, count) in {"model.layers.0.self_attn.q_proj": (64, 256), "model.layers.0.mlp.down_proj":
                                 (64, 128)}.items():
        size = count if group == -1 else group
        groups = -(-count // size)
        codes = torch.randint(0, 1 << bits, (count, out), generator=g)
        zeros = (torch.full((groups, out), 1 << (bits - 1)) if sym
                 else torch.randint(1, 1 << bits, (groups, out), generator=g))  # v1 cannot store 0
        scales = (torch.rand(groups, out, generator=g) * 0.02 + 1e-3).to(torch.float16)
        g_idx = torch.arange(count, dtype=torch.int32) // size
        if desc_act:
            g_idx = g_idx[torch.randperm(count, generator=g)]
        tensors |= {f"{module}.qweight": pack(codes, bits), f"{module}.qzeros": pack((zeros - int(v1)).t(), bits).t(),
                    f"{module}.scales": scales, f"{module}.g_idx": g_idx}
        parts[f"{module}.weight"] = (codes, zeros, scales, g_idx)
    tensors["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(64, dtype=torch.float16)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    config = {"bits": bits, "group_size": group, "sym": sym, "desc_act": desc_act,
              "checkpoint_format": "gptq" if v1 else "gptq_v2"}
    if in_config_json:
        (folder / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "gptq", **config}}))
    else:
        (folder / "quantize_config.json").write_text(json.dumps(config))
    return parts


# name -> (bits, group, v1, config in config.json): the Burn value, a row that is one group (-1, blocks of 128
# repeating its scale), both zero-point conventions, both config files
TRANSCODED = {"q4-g32-v1": (4, 32, True, False), "q8-row-v2": (8, -1, False, True), "q2-g64-v1": (2, 64, True, False)}


@pytest.fixture(scope="module", params=sorted(TRANSCODED))
def checkpoint(request, tmp_path_factory) -> tuple[Path, str, dict[str, tuple[torch.Tensor, ...]]]:
    bits, group, v1, in_config_json = TRANSCODED[request.param]
    folder = tmp_path_factory.mktemp(request.param)
    return folder, request.param, write(folder, bits, group, v1=v1, in_config_json=in_config_json)




def test_the_packing_by_hand():
    """Eight 4-bit codes 0..7 down one column are one word, 0x76543210, the first in the low bits; 3-bit codes
    cross words: code 10 takes bits 30, 31 of the first word and bit 0 of the second."""
    assert pack(torch.arange(8).reshape(8, 1), 4).tolist() == [[0x76543210]]
    words = pack(torch.tensor([0] * 10 + [0b111] + [0] * 21).reshape(32, 1), 3)
    assert words.tolist() == [[-(1 << 31) + (1 << 30)], [1], [0]]


def test_the_plan_transcodes_each_weight_as_the_hugging_face_weight(checkpoint):
    folder, name, _ = checkpoint
    bits, group, _, _ = TRANSCODED[name]
    plan = make_plan(SafetensorsSource.open(folder).infos())
    entries = {e.info.name: e for e in plan.entries}
    q_proj = entries["model.layers.0.self_attn.q_proj.qweight"]
    value = {2: QuantValue.Q2F, 4: QuantValue.Q4F, 8: QuantValue.Q8F}[bits]
    extent = 128 if group == -1 else group  # a row of 256 in blocks of 128, each repeating the row's scale
    scheme = QuantScheme().with_value(value).with_store(PackedU32(0)).per_block([1, extent], ScaleDtype.F16)
    assert q_proj.name == "model.layers.0.self_attn.q_proj.weight" and q_proj.shape == (64, 256)
    assert q_proj.decision.scheme == scheme
    grouped = "per channel" if group == -1 else f"group {group}"
    assert q_proj.decision.reason == (f"default: transcode GPTQ {bits}-bit {grouped} -> {scheme} as "
                                      "model.layers.0.self_attn.q_proj.weight, exact")
    assert q_proj.out_nbytes == 64 * 256 * bits // 8 + 64 * 256 // extent * 2
    assert {f"model.layers.0.self_attn.q_proj.{c}" for c in ("qzeros", "scales", "g_idx")} <= plan.consumed()
    assert entries["model.layers.0.self_attn.q_proj.bias"].decision.reason == "default: keep, 1-D tensor (norm/bias)"
    assert not plan.errors()


@pytest.mark.parametrize("pipeline", ["cpu", pytest.param("triton", marks=pytest.mark.interpreter)])
def test_the_decoded_bpk_is_gptqs_dequantization(checkpoint, tmp_path, pipeline, monkeypatch):
    if pipeline == "triton":
        monkeypatch.setenv("QCLI_KERNELS", "triton")  # the GPU pipeline (under TRITON_INTERPRET on the CPU)
    folder, _, parts = checkpoint
    out = tmp_path / "model.bpk"
    result = cli("quantize", folder, "-o", out, "--json")
    assert result.code == 0, result.err
    assert json.loads(result.out)["device"] == pipeline
    names = sorted(e.name for e in BurnpackReader.open(out).entries())
    assert names == ["model.layers.0.mlp.down_proj.weight", "model.layers.0.self_attn.q_proj.bias",
                     "model.layers.0.self_attn.q_proj.weight", "model.norm.weight"]
    got = decoded(out)
    for name, (codes, zeros, scales, g_idx) in parts.items():
        assert same_bits(got[name], exact(codes, zeros, scales, g_idx).to(torch.float32)), name
        want = reference(codes, zeros, scales, g_idx)
        assert torch.equal(got[name].to(torch.float16).view(torch.int16), want.view(torch.int16)), name
    compared = cli("inspect", out, "--compare", folder, "--json")
    assert compared.code == 0, compared.err
    doc = json.loads(compared.out)["compare"]
    assert doc["ok"] and not doc["missing"] and not doc["extra"], doc
    assert all(r["exact"] for r in doc["tensors"]), doc


@pytest.mark.interpreter
def test_the_gpu_pipeline_yields_the_cpu_pipelines_bytes(checkpoint):
    folder, _, _ = checkpoint
    _, want, got = pipeline_payloads(folder)
    assert got == want


def test_burn_flex_decodes_the_transcoded_file_as_qcli_does(checkpoint, tmp_path):
    folder, _, _ = checkpoint
    out = tmp_path / "model.bpk"
    # No --burn-backend: it also refuses what a model computes wrong with (flex requantizes Q4F), not this test's.
    result = cli("quantize", folder, "-o", out, "--device", "cpu")
    assert result.code == 0, result.err
    burn, mine = burn_dequantize(BurnBackend.flex, out, tmp_path / "burn.safetensors"), decoded(out)
    assert sorted(mine) == ["model.layers.0.mlp.down_proj.weight", "model.layers.0.self_attn.q_proj.weight"]
    for name, values in mine.items():
        assert same_bits(burn[name], values), f"{name}: Burn (flex) decodes other values than qcli"


def test_a_word_by_hand(tmp_path):
    """8 inputs, 8 outputs, one group: column o holds codes (o + i) % 16 down its 8 inputs, v1 zero points
    stored as 7 (0x77777777: the midpoint 8 less one), scales 0.5 + o / 4: value [o, i] = ((o + i) % 16 - 8) * scale."""
    qweight = torch.tensor([[sum(((o + i) % 16) << (4 * i) for i in range(8)) for o in range(8)]], dtype=torch.int64)
    qweight = torch.where(qweight >= 1 << 31, qweight - (1 << 32), qweight).to(torch.int32)
    scales = torch.tensor([[0.5 + o / 4 for o in range(8)]], dtype=torch.float16)
    save_file({"m.qweight": qweight, "m.qzeros": torch.tensor([[0x77777777]], dtype=torch.int32), "m.scales": scales,
               "m.g_idx": torch.zeros(8, dtype=torch.int32)}, str(tmp_path / "model.safetensors"))
    (tmp_path / "quantize_config.json").write_text(json.dumps({"bits": 4, "group_size": 8, "sym": True}))
    out = tmp_path / "m.bpk"
    result = cli("quantize", tmp_path, "-o", out)
    assert result.code == 0, result.err
    want = torch.tensor([[((o + i) % 16 - 8) * (0.5 + o / 4) for i in range(8)] for o in range(8)])
    assert same_bits(decoded(out)["m.weight"], want)


REFUSED = {  # name -> (write's options, the refusal's words, the tensors' format)
    "asymmetric": ({"bits": 4, "group": 32, "sym": False}, "offset by a zero point of their own (sym: false)",
                   "GPTQ 4-bit group 32"),
    "act-order": ({"bits": 4, "group": 32, "desc_act": True}, "each input's group is given by g_idx (desc_act: true)",
                  "GPTQ 4-bit group 32"),
    "three-bit": ({"bits": 3, "group": 64}, "3-bit codes, a width Burn has no value of", "GPTQ 3-bit group 64"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refused_before_any_weight_is_read_then_requantized(case, tmp_path, monkeypatch):
    options, why, format = REFUSED[case]
    options = dict(options)
    parts = write(tmp_path / "ckpt", options.pop("bits"), options.pop("group"), **options)
    assert_refused_from_the_headers(tmp_path / "ckpt", format, why, monkeypatch)
    assert_requantized_within_bound(tmp_path / "ckpt", tmp_path / "model.bpk", format,
                                    {name: reference(*p) for name, p in parts.items()})


def assert_refused_from_the_headers(folder: Path, format: str, why: str, monkeypatch) -> None:
    """The checkpoint at `folder` (the two linears of `write`) is refused as `format` for reason `why`, with
    `--requantize` offered, before any weight is read; `--dry-run` says why."""

    [problem] = refused_from_headers(monkeypatch, folder, folder.parent / "refused.bpk")
    assert problem.kind == "scheme"
    assert problem.message.startswith(f"2 tensors (model.layers.0.mlp.down_proj.qweight, "
                                      f"model.layers.0.self_attn.q_proj.qweight) are {format}: ")
    assert why in problem.message
    assert "--requantize q4s-b32 (dequantized as GPTQ does, in f16" in problem.hint
    lines = assert_user_error(cli("quantize", folder, "--dry-run"), PlanError.exit_code)
    assert any(why in line for line in lines)


def assert_requantized_within_bound(folder: Path, out: Path, format: str, references: dict[str, torch.Tensor]) -> None:
    """`--requantize q4f-b32` writes `out`, each weight within the preset's bound of its GPTQ dequantization
    in `references` (f16 [out, in], by the weight's written name)."""
    result = cli("quantize", folder, "-o", out, "--requantize", "q4f-b32", "--json")
    assert result.code == 0, result.err
    doc = json.loads(result.out)
    validate_json(doc)
    rows = {t["name"]: t for t in doc["tensors"]}
    assert rows["model.layers.0.self_attn.q_proj.weight"]["reason"] == f"requantize {format} -> q4f-b32"
    assert sorted(e.name for e in BurnpackReader.open(out).entries()) == sorted(rows)
    preset = PRESETS["q4f-b32"]
    got = decoded(out)
    assert sorted(got) == sorted(references)
    for name, values in got.items():
        x = references[name].to(torch.float32)
        grid = BlockGrid.of(preset.scheme, x.shape)
        worst = to_blocks((values - x).abs().to(torch.float64), grid).amax(dim=grid.block_axes)
        assert bool((worst <= error_bound(x, preset.scheme, preset.calibration)).all()), name


def test_zero_points_the_config_does_not_describe_are_an_input_error(tmp_path):
    write(tmp_path, 4, 32)
    config = json.loads((tmp_path / "quantize_config.json").read_text())
    asymmetric = tmp_path / "asym"
    write(asymmetric, 4, 32, sym=False)
    (asymmetric / "quantize_config.json").write_text(json.dumps(config))  # says sym: true, holds zero points
    lines = assert_user_error(cli("quantize", asymmetric, "-o", tmp_path / "m.bpk"), InputError.exit_code)
    assert lines[0] == (f"error: {asymmetric / 'model.safetensors'}: tensor 'model.layers.0.mlp.down_proj.qzeros' "
                        "holds zero points other than 8, though quantize_config.json says sym: true")
    assert "correct the checkpoint's quantize_config.json" in lines[-1]
    assert not (tmp_path / "m.bpk").exists()


def test_inspect_and_dry_run_name_the_format(tmp_path):
    write(tmp_path, 4, 32)
    weight = "model.layers.0.self_attn.q_proj.qweight"
    result = cli("inspect", tmp_path, "--json")
    assert result.code == 0, result.err
    planned = {t["name"]: t["plan"] for t in json.loads(result.out)["tensors"]}
    assert planned[weight]["format"] == "GPTQ 4-bit group 32" and planned[weight]["decision"] == "transcode"
    assert planned["model.layers.0.self_attn.q_proj.qzeros"]["decision"] == "consumed"
    result = cli("quantize", tmp_path, "--dry-run", "--json")
    assert result.code == 0, result.err
    doc = json.loads(result.out)
    validate_json(doc)
    row = next(t for t in doc["tensors"] if t["name"] == "model.layers.0.self_attn.q_proj.weight")
    assert row["decision"] == "transcode" and row["reason"].startswith("default: transcode GPTQ 4-bit group 32 -> Q4F")
    assert row["dtype"] == "I32" and row["shape"] == [64, 256]


def test_without_a_config_the_codes_are_not_kept_as_integers(tmp_path):
    write(tmp_path, 4, 32)
    (tmp_path / "quantize_config.json").unlink()
    plan = make_plan(SafetensorsSource.open(tmp_path).infos())
    errors = {p.tensors[0]: p.message for p in plan.errors()}
    assert "model.layers.0.self_attn.q_proj.qweight" in errors
    assert "no quantize_config.json or config.json quantization_config says its bits" in (
        errors["model.layers.0.self_attn.q_proj.qweight"])


# Checkpoints AutoGPTQ itself packs, held to its own dequantization.
AUTOGPTQ, AUTOGPTQ_VERSION = "auto-gptq", "0.7.1"
AUTOGPTQ_INSTALL = f"pip install --no-deps {AUTOGPTQ}=={AUTOGPTQ_VERSION}"
LINEARS = {"model.layers.0.self_attn.q_proj": (64, 256), "model.layers.0.mlp.down_proj": (96, 384)}  # [out, in]


def autogptq_quant_linear(desc_act: bool) -> type:
    """AutoGPTQ's QuantLinear as its `pack_model` picks it where no CUDA kernel is built: `qlinear_cuda_old`
    for groups in input order, `qlinear_cuda` for an activation order (both fall back to pure torch on the
    CPU)."""
    autogptq_packages()
    kind = "qlinear_cuda" if desc_act else "qlinear_cuda_old"
    return importlib.import_module(f"auto_gptq.nn_modules.qlinear.{kind}").QuantLinear


@functools.cache
def autogptq_packages() -> None:
    """Empty packages in place of `auto_gptq` and its `nn_modules` folders, so that a QuantLinear module can be
    imported alone: the package's `__init__` imports its model classes, which need a transformers older than
    ours (its declared dependencies conflict with ours too: it is installed with --no-deps). Where it is not
    installed the tests skip, or under CI fail, as .ci/run installs it."""
    try:
        installed = importlib.metadata.version(AUTOGPTQ)
    except importlib.metadata.PackageNotFoundError:
        installed = None
    if installed != AUTOGPTQ_VERSION:
        message = (f"{AUTOGPTQ} {AUTOGPTQ_VERSION} is not installed ({installed or 'none'} is), and its packer and "
                   f"dequantization write and judge these checkpoints: {AUTOGPTQ_INSTALL}")
        if os.environ.get("CI") == "true":
            pytest.fail(message + " (.ci/run installs it)")
        pytest.skip(message)
    folder = Path(importlib.util.find_spec("auto_gptq").submodule_search_locations[0])
    for name, under in (("auto_gptq", folder), ("auto_gptq.nn_modules", folder / "nn_modules"),
                        ("auto_gptq.nn_modules.qlinear", folder / "nn_modules" / "qlinear")):
        package = types.ModuleType(name)
        package.__path__ = [str(under)]
        sys.modules[name] = package


def autogptq_dequantized(layer: torch.nn.Module) -> torch.Tensor:
    """AutoGPTQ's dequantization of a QuantLinear, [out, in] f16: its forward of the identity, bias aside. On
    the CPU the forward unpacks the codes and zero points (v1: each stored one plus one), forms
    `scales[g] * (codes - zeros[g])` in f16 (f16 scales times integers) and multiplies the input by it in
    f16: the identity's rows pick its rows out unchanged (every other term an exact zero)."""
    bias, layer.bias = layer.bias, None
    try:
        return layer(torch.eye(layer.infeatures, dtype=torch.float16)).t().contiguous()
    finally:
        layer.bias = bias


def write_autogptq(folder: Path, bits: int, group: int, *, sym: bool = True, desc_act: bool = False,
                   seed: int = 0) -> dict[str, tuple[torch.nn.Module, torch.Tensor]]:
    """A checkpoint as AutoGPTQ saves one: each of LINEARS packed by its QuantLinear from an f16 linear holding
    GPTQ's quantized weight (`scale * (code - zero)` rounded to f16, what GPTQ leaves in the layer; the f32
    scales and float zero points as GPTQ's quantizer hands them to `pack`), its state dict under the module's
    name, a norm beside them, with the metadata `save_quantized` gives the file, and `quantize_config.json` as
    `BaseQuantizeConfig.to_dict` writes it (no checkpoint format: v1). Each QuantLinear and its exact
    dequantization in float64 (the codes drawn times the scales AutoGPTQ stored), by the written weight's name."""
    quant_linear = autogptq_quant_linear(desc_act)
    folder.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {"model.norm.weight": torch.ones(64, dtype=torch.float16)}
    layers = {}
    for module, (out, count) in LINEARS.items():
        size = count if group == -1 else group
        codes = torch.randint(0, 1 << bits, (out, count), generator=g)
        zeros = (torch.full((out, count // size), float(1 << (bits - 1))) if sym
                 else torch.randint(1, 1 << bits, (out, count // size), generator=g).to(torch.float32))
        scales = torch.rand(out, count // size, generator=g) * 0.02 + 1e-3
        g_idx = (torch.arange(count) // size).to(torch.int32)
        if desc_act:
            g_idx = g_idx[torch.randperm(count, generator=g)]
        linear = torch.nn.Linear(count, out, dtype=torch.float16)
        linear.weight.data = ((codes - zeros[:, g_idx]) * scales[:, g_idx]).to(torch.float16)
        layer = quant_linear(bits, group, count, out, True)
        layer.pack(linear, scales, zeros.clone(), g_idx)  # its `zeros -= 1` reaches a one-group caller
        tensors |= {f"{module}.{k}": v for k, v in layer.state_dict().items()}
        stored = layer.scales.to(torch.float64).t()
        layers[f"{module}.weight"] = (layer, (codes - zeros[:, g_idx]).to(torch.float64) * stored[:, g_idx])
    config = {"bits": bits, "group_size": group, "damp_percent": 0.01, "desc_act": desc_act, "static_groups": False,
              "sym": sym, "true_sequential": True, "model_name_or_path": None, "model_file_base_name": "model",
              "is_marlin_format": False, "quant_method": "gptq"}
    metadata = {"format": "pt", "auto_gptq_version": AUTOGPTQ_VERSION, "gptq_bits": str(bits),
                "gptq_group_size": str(group), "gptq_desc_act": str(desc_act), "gptq_damp_percent": "0.01",
                "gptq_is_marlin_format": "False"}
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"), metadata)
    (folder / "quantize_config.json").write_text(json.dumps(config, indent=2))
    return layers


AUTOGPTQ_TRANSCODED = {"q2-g128": (2, 128), "q4-g128": (4, 128), "q8-g128": (8, 128), "q4-row": (4, -1)}


@pytest.fixture(scope="module", params=sorted(AUTOGPTQ_TRANSCODED))
def autogptq_checkpoint(request, tmp_path_factory) -> tuple[Path, dict[str, tuple[torch.nn.Module, torch.Tensor]]]:
    folder = tmp_path_factory.mktemp(f"autogptq-{request.param}")
    return folder, write_autogptq(folder, *AUTOGPTQ_TRANSCODED[request.param])


def assert_autogptqs_dequantization(got: dict[str, torch.Tensor], layers: dict, who: str = "qcli") -> None:
    """Each decoded weight in `got` (f32) is the exact product, and rounded to f16 AutoGPTQ's dequantization."""
    assert sorted(got) == sorted(layers), who
    for name, (layer, exact_values) in layers.items():
        assert same_bits(got[name], exact_values.to(torch.float32)), f"{name}: {who} is not the exact product"
        want = autogptq_dequantized(layer)
        assert torch.equal(got[name].to(torch.float16).view(torch.int16), want.view(torch.int16)), (
            f"{name}: {who} rounded to f16 is not AutoGPTQ's dequantization")


def test_autogptqs_dequantization_is_its_exact_product_rounded_once(autogptq_checkpoint):
    """What the comparisons below rest on: AutoGPTQ packed the codes drawn, and its f16 dequantization is their
    exact product with its stored scales, rounded once."""
    _, layers = autogptq_checkpoint
    for name, (layer, exact_values) in layers.items():
        want = autogptq_dequantized(layer)
        assert torch.equal(want.view(torch.int16), exact_values.to(torch.float16).view(torch.int16)), name


@pytest.mark.parametrize("pipeline", ["cpu", pytest.param("triton", marks=pytest.mark.interpreter)])
def test_an_autogptq_checkpoint_decodes_to_autogptqs_dequantization(autogptq_checkpoint, tmp_path, pipeline,
                                                                      monkeypatch):
    if pipeline == "triton":
        monkeypatch.setenv("QCLI_KERNELS", "triton")
    folder, layers = autogptq_checkpoint
    out = tmp_path / "model.bpk"
    result = cli("quantize", folder, "-o", out, "--json")
    assert result.code == 0, result.err
    assert json.loads(result.out)["device"] == pipeline
    assert_autogptqs_dequantization(decoded(out), layers)
    reader = BurnpackReader.open(out)
    for name, (layer, _) in layers.items():  # the biases as AutoGPTQ stored them
        assert bytes(reader.read(name.removesuffix("weight") + "bias")) == layer.bias.detach().numpy().tobytes()
    compared = cli("inspect", out, "--compare", folder, "--json")
    assert compared.code == 0, compared.err
    doc = json.loads(compared.out)["compare"]
    assert doc["ok"] and all(r["exact"] for r in doc["tensors"]), doc


@pytest.mark.interpreter
def test_the_gpu_pipeline_yields_the_cpu_pipelines_bytes_for_autogptq(autogptq_checkpoint):
    _, want, got = pipeline_payloads(autogptq_checkpoint[0])
    assert got == want


@pytest.mark.parametrize("backend", [BurnBackend.flex, BurnBackend.wgpu], ids=str)
def test_burn_decodes_an_autogptq_checkpoint_to_autogptqs_dequantization(autogptq_checkpoint, tmp_path, backend):
    folder, layers = autogptq_checkpoint
    out = tmp_path / "model.bpk"
    # No --burn-backend: it also refuses what a model computes wrong with (flex requantizes Q4F), not this test's.
    result = cli("quantize", folder, "-o", out, "--device", "cpu")
    assert result.code == 0, result.err
    burn = burn_dequantize(backend, out, tmp_path / "burn.safetensors")
    assert_autogptqs_dequantization({name: burn[name] for name in layers}, layers, f"Burn ({backend})")


AUTOGPTQ_REFUSED = {  # name -> (write_autogptq's options, the refusal's words)
    "asymmetric": ({"sym": False}, "offset by a zero point of their own (sym: false)"),
    "act-order": ({"desc_act": True}, "each input's group is given by g_idx (desc_act: true)"),
}


@pytest.mark.parametrize("case", sorted(AUTOGPTQ_REFUSED))
def test_an_autogptq_checkpoint_burn_cannot_hold_is_refused_then_requantized(case, tmp_path, monkeypatch):
    options, why = AUTOGPTQ_REFUSED[case]
    folder = tmp_path / "ckpt"
    layers = write_autogptq(folder, 4, 128, **options)
    assert_refused_from_the_headers(folder, "GPTQ 4-bit group 128", why, monkeypatch)
    references = {name: autogptq_dequantized(layer) for name, (layer, _) in layers.items()}
    plan = make_plan(SafetensorsSource.open(folder).infos(), options=PlanOptions(requantize=PRESETS["q4f-b32"]))
    with SafetensorsSource.open(folder) as source:  # qcli dequantizes as AutoGPTQ does, bit for bit
        for entry in plan.entries:
            if entry.decision.requantize is not None:
                got = entry.decision.requantize.dequantize(source.load)
                assert torch.equal(got.view(torch.int16), references[entry.name].view(torch.int16)), entry.name
    assert_requantized_within_bound(folder, tmp_path / "model.bpk", "GPTQ 4-bit group 128", references)
