"""compressed-tensors checkpoints written by compressed-tensors itself (its QuantizationConfig applied to a
torch model, the scales from its own `calculate_qparams`, compressed by `ModelCompressor` and described by
its `update_config`): the symmetric schemes transcode, and the `.bpk` decodes (qcli's decode and Burn's
wgpu) to compressed-tensors' own decompression (`CompressedTensorsDequantizer`) bit for bit: exactly its
f32 arithmetic, and, where it computes in the scale's bf16, exactly its output once rounded to bf16. Zero
points and other widths are refused from the headers, and `--requantize` quantizes compressed-tensors'
decompression."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from compressed_tensors.compressors import BaseCompressor, ModelCompressor
from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8
from compressed_tensors.entrypoints.convert.converters.ct_dequantizer import (
    CompressedTensorsDequantizer,
)
from compressed_tensors.quantization import (
    QuantizationArgs,
    QuantizationConfig,
    QuantizationScheme,
    apply_quantization_config,
)
from compressed_tensors.quantization.lifecycle.forward import dequantize as ct_dequantize
from compressed_tensors.quantization.quant_scheme import PRESET_SCHEMES
from compressed_tensors.quantization.utils.helpers import (
    calculate_qparams,
    compute_dynamic_scales_and_zp,
    generate_gparam,
)
from safetensors.torch import load_file, save_file

from qcli.burn_backends import BurnBackend
from qcli.codec.blocks import to_blocks
from qcli.errors import InputError, PlanError
from qcli.io.burnpack import BurnpackReader
from qcli.io.safetensors import SafetensorsSource
from qcli.layout import BlockGrid
from qcli.measure import error_bound
from qcli.plan.decisions import make_plan
from qcli.presets import PRESETS, ZERO_POINT_WHY
from qcli.scheme import PackedU32, QuantScheme, QuantValue, ScaleDtype
from tests.burn_harness import dequantize as burn_dequantize
from tests.burn_harness import same_bits
from tests.cli_support import assert_user_error, cli, validate_json
from tests.format_support import decoded, pipeline_payloads, refused_from_headers


def ints(bits: int, strategy: str, group_size: int | None = None, symmetric: bool = True) -> dict:
    return {"weights": QuantizationArgs(num_bits=bits, type="int", strategy=strategy, group_size=group_size,
                                        symmetric=symmetric)}


# module -> (out, in, its config group's weights, how the group targets it); each module its own group
SYMMETRIC = {
    "int4": (16, 256, PRESET_SCHEMES["W4A16"], "name"),  # group 128
    "int4_wide": (4, 1024, ints(4, "group", 512), "name"),  # a group over Burn's largest block: repeated
    "int4_channel": (6, 264, ints(4, "channel"), "name"),
    "int4_tensor": (8, 64, ints(4, "tensor"), "name"),
    "int8": (8, 128, ints(8, "group", 64), "name"),  # pack-quantized 8-bit
    "int2": (4, 64, ints(2, "group", 32), "name"),
    "w8a8": (8, 64, PRESET_SCHEMES["INT8"], "name"),  # int-quantized: I8 codes, per channel
    "fp8": (8, 64, PRESET_SCHEMES["FP8"], "name"),  # float-quantized per tensor, with a static input_scale
    "fp8_channel": (6, 128, PRESET_SCHEMES["FP8_DYNAMIC"], "name"),
    "fp8_block": (300, 136, PRESET_SCHEMES["FP8_BLOCK"], "name"),  # 128x128 blocks, partial at both edges
    "nvfp4": (8, 64, PRESET_SCHEMES["NVFP4A16"], "name"),
    "catchall": (8, 128, PRESET_SCHEMES["W4A16"], "re:catch"),  # matched by a pattern
}
REFUSED = {
    "asym": (24, 256, PRESET_SCHEMES["W4A16_ASYM"], "name"),  # group 128 with packed zero points
    "asym_channel": (12, 64, ints(8, "channel", symmetric=False), "name"),
    "int3": (8, 96, ints(3, "group", 32), "name"),  # no Burn value of 3 bits
}
Q4F, Q8F, Q2F, E4M3, E2M1 = (QuantScheme().with_value(v).with_store(PackedU32(0)) for v in (
    QuantValue.Q4F, QuantValue.Q8F, QuantValue.Q2F, QuantValue.E4M3, QuantValue.E2M1))
SCHEMES = {  # what each transcodes to
    "int4.weight_packed": Q4F.per_block([1, 128], ScaleDtype.F32),
    "int4_wide.weight_packed": Q4F.per_block([1, 128], ScaleDtype.F32),
    "int4_channel.weight_packed": Q4F.per_block([1, 132], ScaleDtype.F32),
    "int4_tensor.weight_packed": Q4F.per_tensor(ScaleDtype.F32),
    "int8.weight_packed": Q8F.per_block([1, 64], ScaleDtype.F32),
    "int2.weight_packed": Q2F.per_block([1, 32], ScaleDtype.F32),
    "w8a8.weight": Q8F.per_block([1, 64], ScaleDtype.F32),
    "fp8.weight": E4M3.per_tensor(ScaleDtype.F32),
    "fp8_channel.weight": E4M3.per_block([1, 128], ScaleDtype.F32),
    "fp8_block.weight": E4M3.per_block([128, 128], ScaleDtype.F32),
    "nvfp4.weight_packed": E2M1.per_block([1, 16], ScaleDtype.F32),
    "catchall.weight_packed": Q4F.per_block([1, 128], ScaleDtype.F32),
}
WRITTEN = sorted(n.removesuffix("_packed") for n in SCHEMES)  # the model's names: M.weight


def weight_qparams(w: torch.Tensor, args: QuantizationArgs, module: torch.nn.Module, global_scale=None):
    """compressed-tensors' own scales (and zero points) for `w`, by its strategy."""
    if args.strategy == "channel":
        return calculate_qparams(w.amin(dim=1, keepdim=True), w.amax(dim=1, keepdim=True), args)
    if args.strategy == "block":
        (bh, bw), (rows, cols) = args.block_structure, w.shape
        padded = torch.nn.functional.pad(w, (0, -cols % bw, 0, -rows % bh))
        blocks = padded.reshape(padded.shape[0] // bh, bh, padded.shape[1] // bw, bw)
        return calculate_qparams(blocks.amin(dim=(1, 3)), blocks.amax(dim=(1, 3)), args)
    return compute_dynamic_scales_and_zp(w, args, module, global_scale=global_scale)


def write(directory: Path, modules: dict, dtype: torch.dtype = torch.bfloat16) -> Path:
    """The checkpoint compressed-tensors writes for a model of `modules` (each a Linear quantized by a
    config group of its own) and a LayerNorm: `model.safetensors` and `config.json`."""
    torch.manual_seed(0)
    model = torch.nn.Module()
    groups = {}
    for name, (out, inp, scheme, target) in modules.items():
        linear = torch.nn.Linear(inp, out, bias=False)
        with torch.no_grad():  # rows of different magnitudes, so the scales differ across rows and groups
            linear.weight.mul_(torch.logspace(-3, 3, out, base=2.0)[:, None] * (1 + torch.rand(inp)))
        model.add_module(name, linear)
        groups[f"group_{name}"] = QuantizationScheme(targets=[name if target == "name" else target], **scheme)
    model.add_module("norm", torch.nn.LayerNorm(8))
    model.to(dtype)
    apply_quantization_config(model, QuantizationConfig(config_groups=groups), show_progress=False)
    for name in modules:
        module = getattr(model, name)
        args, w = module.quantization_scheme.weights, module.weight.data
        global_scale = None
        if args.strategy == "tensor_group":
            global_scale = generate_gparam(w.amin(), w.amax())
            module.weight_global_scale.data.copy_(global_scale)
        scale, zero_point = weight_qparams(w, args, module, global_scale)
        module.weight_scale.data = scale.to(module.weight_scale.dtype).reshape(module.weight_scale.shape)
        if hasattr(module, "weight_zero_point"):
            module.weight_zero_point.data = zero_point.to(module.weight_zero_point.dtype).reshape(
                module.weight_zero_point.shape)
    compressor = ModelCompressor.from_pretrained_model(model)
    compressor.compress_model(model)
    directory.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(directory / "model.safetensors"))
    compressor.update_config(str(directory))
    return directory


def decompressed(directory: Path) -> dict[str, torch.Tensor]:
    """compressed-tensors' own decompression of each quantized weight, in the dtype it computes in."""
    tensors = load_file(directory / "model.safetensors")
    return CompressedTensorsDequantizer(directory, dtype=None).process(dict(tensors))


def in_f32(directory: Path) -> dict[str, torch.Tensor]:
    """compressed-tensors' decompressors run in f32 (its scales widened to f32 first, as its NVFP4
    decompressor widens them itself): its arithmetic before it rounds to the checkpoint's bf16."""
    tensors = load_file(directory / "model.safetensors")
    config = json.loads((directory / "config.json").read_text())["quantization_config"]
    config = QuantizationConfig.model_validate(config)
    out = {}
    for group in config.config_groups.values():
        module = "catchall" if group.targets[0].startswith("re:") else group.targets[0]
        state = {k.rpartition(".")[2]: v for k, v in tensors.items() if k.startswith(f"{module}.")}
        if group.format == "nvfp4-pack-quantized":
            rows, half = state["weight_packed"].shape
            codes = unpack_fp4_from_uint8(state["weight_packed"], rows, half * 2, dtype=torch.float32)
            out[module] = ct_dequantize(x_q=codes, scale=state["weight_scale"].to(torch.float32), args=group.weights,
                                        global_scale=state["weight_global_scale"], dtype=torch.float32)
            continue
        state["weight_scale"] = state["weight_scale"].to(torch.float32)
        out[module] = BaseCompressor.get_value_from_registry(group.format).decompress(state, group)["weight"]
    return out




@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return write(tmp_path_factory.mktemp("ct") / "symmetric", SYMMETRIC)


@pytest.fixture(scope="module")
def refused(tmp_path_factory) -> Path:
    return write(tmp_path_factory.mktemp("ct") / "refused", {**REFUSED, "int4": SYMMETRIC["int4"]})


def test_the_plan_transcodes_each_scheme_from_the_headers_and_consumes_the_companions(checkpoint):
    config = json.loads((checkpoint / "config.json").read_text())["quantization_config"]
    assert config["format"] == "mixed-precision" and config["quant_method"] == "compressed-tensors"
    plan = make_plan(SafetensorsSource.open(checkpoint).infos())
    decisions = {e.info.name: e.decision for e in plan.entries}
    assert {n: d.scheme for n, d in decisions.items() if n in SCHEMES} == SCHEMES
    assert sorted(set(decisions) - set(SCHEMES)) == ["fp8.input_scale", "norm.bias", "norm.weight"]
    assert decisions["int4.weight_packed"].reason == (
        "default: transcode compressed-tensors pack-quantized int4 group 128 -> Q4F PackedU32(0) block [128] F32 "
        "as int4.weight, exact")
    assert decisions["nvfp4.weight_packed"].reason.startswith(
        "default: transcode compressed-tensors nvfp4-pack-quantized fp4 group 16 -> E2M1")
    assert decisions["fp8_block.weight"].reason.startswith(
        "default: transcode compressed-tensors float-quantized fp8 block [128, 128] -> E4M3")
    assert not plan.errors()
    entries = {e.info.name: e for e in plan.entries}
    # the dequantized shape, and the bytes: codes in whole words per row, then one f32 scale per Burn block
    assert entries["int4_channel.weight_packed"].shape == (6, 264)
    assert entries["int4_wide.weight_packed"].out_nbytes == 4 * 1024 // 2 + 4 * 8 * 4
    assert entries["nvfp4.weight_packed"].out_nbytes == 8 * 64 // 2 + 8 * 4 * 4
    assert entries["int4.weight_packed"].in_nbytes == 16 * 32 * 4 + 16 * 2 * 2 + 2 * 8


@pytest.mark.parametrize("pipeline", ["cpu", pytest.param("triton", marks=pytest.mark.interpreter)])
def test_the_decoded_bpk_is_compressed_tensors_decompression_bit_for_bit(checkpoint, tmp_path, pipeline,
                                                                         monkeypatch):
    if pipeline == "triton":
        monkeypatch.setenv("QCLI_KERNELS", "triton")  # the GPU pipeline (under TRITON_INTERPRET on the CPU)
    out = tmp_path / "model.bpk"
    result = cli("quantize", checkpoint, "-o", out, "--json")
    assert result.code == 0, result.err
    assert json.loads(result.out)["device"] == pipeline
    got, exact, rounded = decoded(out), in_f32(checkpoint), decompressed(checkpoint)
    assert sorted(got) == WRITTEN
    for name, values in got.items():
        module = name.rpartition(".")[0]
        assert same_bits(values, exact[module]), name  # compressed-tensors' arithmetic in f32
        want = rounded[name]
        assert want.dtype == torch.bfloat16, name  # what it returns: its arithmetic in bf16, or rounded to it
        assert torch.equal(values.to(torch.bfloat16).view(torch.int16), want.view(torch.int16)), name
    names = [e.name for e in BurnpackReader.open(out).entries()]
    assert not [n for n in names if n.rpartition(".")[2] in ("weight_scale", "weight_shape", "weight_global_scale")]
    compared = cli("inspect", out, "--compare", checkpoint, "--json")
    assert compared.code == 0, compared.err
    doc = json.loads(compared.out)["compare"]
    assert doc["ok"] and all(r["exact"] for r in doc["tensors"]), doc


def test_f32_checkpoints_decode_to_compressed_tensors_output_itself(tmp_path):
    modules = {n: SYMMETRIC[n] for n in ("int4", "int8", "w8a8", "fp8_channel", "nvfp4")}
    directory = write(tmp_path / "f32", modules, dtype=torch.float32)
    out = tmp_path / "model.bpk"
    assert cli("quantize", directory, "-o", out).code == 0
    want = decompressed(directory)
    for name, values in decoded(out).items():
        reference = want[name]
        if name.startswith("nvfp4"):  # its decompressor returns bf16 whatever the checkpoint's dtype
            assert torch.equal(values.to(torch.bfloat16).view(torch.int16), reference.view(torch.int16)), name
        else:
            assert reference.dtype == torch.float32 and same_bits(values, reference), name


def test_a_group_that_targets_a_module_type_quantizes_every_module_it_names(tmp_path):
    """The common checkpoint: one group targets Linear, which the headers cannot check; its modules are
    those that hold its tensors."""
    modules = {n: (8, 128, PRESET_SCHEMES["W8A16"], "Linear") for n in ("q_proj", "k_proj")}
    directory = write(tmp_path / "linear", modules)
    config = json.loads((directory / "config.json").read_text())["quantization_config"]
    assert {t for g in config["config_groups"].values() for t in g["targets"]} == {"Linear"}
    out = tmp_path / "model.bpk"
    assert cli("quantize", directory, "-o", out).code == 0
    want = decompressed(directory)
    got = decoded(out)
    assert sorted(got) == ["k_proj.weight", "q_proj.weight"]
    for name, values in got.items():
        reference = want[name]
        assert torch.equal(values.to(torch.bfloat16).view(torch.int16), reference.view(torch.int16)), name


@pytest.mark.interpreter
def test_the_gpu_pipeline_yields_the_cpu_pipelines_bytes(checkpoint):
    _, want, got = pipeline_payloads(checkpoint)
    assert got == want


def test_burn_wgpu_decodes_the_transcoded_file_as_qcli_does(checkpoint, tmp_path):
    out = tmp_path / "model.bpk"
    # No --burn-backend: it also refuses what a model computes wrong with, not this test's.
    result = cli("quantize", checkpoint, "-o", out, "--device", "cpu")
    assert result.code == 0, result.err
    burn, mine, exact = burn_dequantize(BurnBackend.wgpu, out, tmp_path / "burn.safetensors"), decoded(out), in_f32(
        checkpoint)
    assert sorted(mine) == WRITTEN
    for name, values in mine.items():
        assert same_bits(burn[name], values), f"{name}: Burn (wgpu) decodes other values than qcli"
        assert same_bits(burn[name], exact[name.rpartition(".")[0]]), name


def test_inspect_and_dry_run_name_the_format_and_the_decisions(checkpoint):
    result = cli("inspect", checkpoint, "--json")
    assert result.code == 0, result.err
    doc = json.loads(result.out)
    planned = {t["name"]: t["plan"] for t in doc["tensors"]}
    assert planned["int4.weight_packed"]["format"] == "compressed-tensors pack-quantized int4 group 128"
    assert planned["int4.weight_packed"]["decision"] == "transcode"
    assert planned["int4.weight_scale"]["decision"] == planned["int4.weight_shape"]["decision"] == "consumed"
    assert planned["nvfp4.weight_global_scale"]["decision"] == "consumed"
    assert planned["fp8_channel.weight"]["format"] == "compressed-tensors float-quantized fp8 channel"
    text = cli("inspect", checkpoint)
    assert text.code == 0, text.err
    assert "compressed-tensors nvfp4-pack-quantized fp4 group 16: 1 tensor, transcode" in text.out
    result = cli("quantize", checkpoint, "--dry-run", "--json")
    assert result.code == 0, result.err
    doc = json.loads(result.out)
    validate_json(doc)
    row = next(t for t in doc["tensors"] if t["name"] == "int2.weight")
    assert row["decision"] == "transcode" and row["shape"] == [4, 64]
    assert row["reason"] == ("default: transcode compressed-tensors pack-quantized int2 group 32 -> Q2F PackedU32(0) "
                             "block [32] F32 as int2.weight, exact")


def test_zero_points_and_other_widths_are_refused_before_any_weight_is_read(refused, monkeypatch):
    problems = refused_from_headers(monkeypatch, refused, refused / "model.bpk")
    by_format = {p.message.split(":")[0]: p for p in problems}
    assert sorted(by_format) == [
        "1 tensor (asym.weight_packed) is compressed-tensors pack-quantized int4 group 128 asymmetric",
        "1 tensor (asym_channel.weight_packed) is compressed-tensors pack-quantized int8 channel asymmetric",
        "1 tensor (int3.weight_packed) is compressed-tensors pack-quantized int3 group 32"]
    asym = by_format["1 tensor (asym.weight_packed) is compressed-tensors pack-quantized int4 group 128 asymmetric"]
    assert ZERO_POINT_WHY in asym.message and asym.kind == "scheme"
    assert "--requantize q4s-b32 (dequantized as compressed-tensors does" in asym.hint
    [wide] = [p for p in problems if p.tensors == ("asym_channel.weight_packed",)]
    assert "--requantize q8s-b32" in wide.hint  # a preset as wide as its codes
    width = by_format["1 tensor (int3.weight_packed) is compressed-tensors pack-quantized int3 group 32"]
    assert "3-bit integer codes, which no Burn value holds" in width.message and "q4s-b32" in width.hint
    assert not (refused / "model.bpk").exists()
    lines = assert_user_error(cli("quantize", refused, "--dry-run"), PlanError.exit_code)
    assert "no weight was read" in lines[0]


def test_requantize_quantizes_compressed_tensors_decompression(refused, tmp_path):
    from qcli.formats import detect

    want = decompressed(refused)
    with SafetensorsSource.open(refused) as source:  # the decoder: compressed-tensors' output, bit for bit
        found = detect(source.infos(), source.load)
        for name in REFUSED:
            encoded = found[f"{name}.weight_packed"]
            got = encoded.dequantize(source.load)
            assert encoded.dtype == "BF16" and got.dtype == torch.bfloat16, name
            assert torch.equal(got.view(torch.int16), want[f"{name}.weight"].view(torch.int16)), name
    out = tmp_path / "model.bpk"
    result = cli("quantize", refused, "-o", out, "--requantize", "q4f-b32", "--json")
    assert result.code == 0, result.err
    doc = json.loads(result.out)
    validate_json(doc)
    rows = {t["name"]: t for t in doc["tensors"]}
    assert sorted(rows) == sorted([f"{n}.weight" for n in [*REFUSED, "int4"]] + ["norm.bias", "norm.weight"])
    assert rows["asym.weight"]["reason"] == (
        "requantize compressed-tensors pack-quantized int4 group 128 asymmetric -> q4f-b32")
    assert rows["asym.weight"]["shape"] == [24, 256] and rows["asym.weight"]["sqnr_db"] is not None
    assert rows["int4.weight"]["decision"] == "transcode"
    for name, values in decoded(out).items():
        if name == "int4.weight":
            continue
        x = want[name].to(torch.float32)
        scheme = PRESETS["q4f-b32"].scheme
        grid = BlockGrid.of(scheme, x.shape)
        worst = to_blocks((values - x).abs().to(torch.float64), grid).amax(dim=grid.block_axes)
        assert bool((worst <= error_bound(x, scheme, PRESETS["q4f-b32"].calibration)).all()), name


def test_a_weight_shape_that_is_not_the_packed_rows_is_an_input_error(tmp_path):
    directory = write(tmp_path / "ragged", {"int4_channel": (6, 260, ints(4, "channel"), "name")})
    plan = make_plan(SafetensorsSource.open(directory).infos())
    # 260 codes fill 33 words as 264 would: the headers say 264, weight_shape says 260
    assert next(e for e in plan.entries if e.info.name == "int4_channel.weight_packed").shape == (6, 264)
    lines = assert_user_error(cli("quantize", directory, "-o", tmp_path / "m.bpk"), InputError.exit_code)
    assert lines[0].endswith("model.safetensors: int4_channel.weight_shape is not [6, 264], the shape "
                             "int4_channel.weight_packed's scales and words give")


def test_a_config_that_does_not_describe_the_tensors_stops_the_plan(checkpoint, tmp_path):
    directory = tmp_path / "edited"
    directory.mkdir()
    (directory / "model.safetensors").write_bytes((checkpoint / "model.safetensors").read_bytes())
    config = json.loads((checkpoint / "config.json").read_text())
    groups = config["quantization_config"]["config_groups"]
    named = {g["targets"][0]: name for name, g in groups.items()}
    groups[named["int4"]]["weights"]["num_bits"] = 8  # the words hold 4-bit codes
    groups[named["int8"]]["format"] = "float-quantized"
    del groups[named["int2"]]
    catchall = groups[named["re:catch"]]  # now by module type, beside a group of other weights by another
    catchall["targets"] = ["Linear"]
    groups["other"] = {**catchall, "targets": ["Embedding"], "weights": {**catchall["weights"], "group_size": 64}}
    (directory / "config.json").write_text(json.dumps(config))
    plan = make_plan(SafetensorsSource.open(directory).infos())
    errors = {p.tensors[0]: p.message for p in plan.errors()}
    assert sorted(errors) == ["catchall.weight_packed", "int2.weight_packed", "int4.weight_packed",
                              "int8.weight_packed"]
    assert "does not hold int8 group 128 rows of its scales" in errors["int4.weight_packed"]
    assert "says float-quantized, but its tensors are pack-quantized's" in errors["int8.weight_packed"]
    assert errors["int2.weight_packed"] == errors["catchall.weight_packed"].replace("catchall", "int2")
    assert errors["int2.weight_packed"] == (
        "int2.weight_packed (I32) holds another tool's quantized codes, which kept as they are would not decode in "
        f"Burn, and is not transcoded: config groups {named['re:catch']}, other target module types with other "
        "weights, and the checkpoint's headers do not say which module is of which type")
    del groups["other"], groups[named["re:catch"]]
    (directory / "config.json").write_text(json.dumps(config))
    errors = {p.tensors[0]: p.message for p in make_plan(SafetensorsSource.open(directory).infos()).errors()}
    assert errors["int2.weight_packed"].endswith("is not transcoded: no config group of config.json targets it")


def test_a_block_of_compressed_tensors_ints_is_held_by_burn_blocks_inside_it():
    """ScaleGrid by hand: a [3, 300] tensor with scales over [2, 150] boxes is held by Burn blocks [2, 150],
    and a 512 group by blocks of 128 that each repeat its scale."""
    from qcli.formats.grid import ScaleGrid

    grid = ScaleGrid((3, 300), (2, 150))
    assert grid.grid == (2, 2) and grid.block == (2, 150)
    scales = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    assert torch.equal(grid.burn_scales(scales), scales)
    assert torch.equal(grid.per_value(scales)[:, [0, 149, 150, 299]],
                       torch.tensor([[1.0, 1.0, 2.0, 2.0], [1.0, 1.0, 2.0, 2.0], [3.0, 3.0, 4.0, 4.0]]))
    wide = ScaleGrid((1, 1024), (1, 512))
    assert wide.block == (1, 128)
    assert torch.equal(wide.burn_scales(torch.tensor([[5.0, 7.0]])), torch.tensor([[5.0] * 4 + [7.0] * 4]))
    assert math.prod(ScaleGrid((4, 8), (4, 8)).grid) == 1 and ScaleGrid((4, 8), (4, 8)).burn_scales(
        torch.tensor(2.0)).tolist() == [2.0]


def test_two_level_nvfp4_would_not_be_compressed_tensors_decode():
    """Why NVFP4 takes f32 block scales: Burn's two-level decode multiplies the block scale by the global
    one, compressed-tensors divides by its global scale, and no f32 factor makes the two agree in general."""
    scale, global_scale = torch.tensor([1.5, 2.5, 3.5]), torch.tensor(3.0)
    assert not torch.equal(scale / global_scale, scale * (1 / global_scale))


def test_mxfp6_stops_the_plan_naming_it(tmp_path):
    directory = write(tmp_path / "mx", {"mxfp6": (8, 64, PRESET_SCHEMES["MXFP6A16"], "name")})
    [error] = make_plan(SafetensorsSource.open(directory).infos()).errors()
    assert error.message.endswith("mxfp6-pack-quantized has no transcode yet")


def test_mxfp4_is_transcoded_at_4_5_bits_and_decodes_as_compressed_tensors_does(tmp_path):
    """E2M1 pairs with U8 E8M0 exponents per 32 (4.25 bits a weight): written as E2M1 with F16 block scales
    under an F32 global (4.5), which Burn's wgpu loads; the decompressor's bf16 values are the f32 decode,
    each a product of powers of two that bf16 holds."""
    directory = write(tmp_path / "mx", {"mxfp4": (8, 64, PRESET_SCHEMES["MXFP4A16"], "name")})
    infos = SafetensorsSource.open(directory).infos()
    assert {i.name: i.dtype for i in infos}["mxfp4.weight_scale"] == "U8"
    plan = make_plan(infos)
    [entry] = [e for e in plan.entries if e.name == "mxfp4.weight"]
    assert str(entry.decision.scheme) == "E2M1 PackedU32(0) block [32] F16 global F32" and not plan.errors()
    assert entry.out_nbytes == 8 * 64 // 2 + 8 * 2 * 2 + 4
    out = tmp_path / "model.bpk"
    result = cli("quantize", directory, "-o", out, "--burn-backend", "wgpu")
    assert result.code == 0, result.err
    want = decompressed(directory)["mxfp4.weight"]
    mine = decoded(out)["mxfp4.weight"]
    assert want.dtype == torch.bfloat16 and same_bits(mine.to(torch.bfloat16), want) and torch.equal(mine, want.float())
    burn = burn_dequantize(BurnBackend.wgpu, out, tmp_path / "burn.safetensors")["mxfp4.weight"]
    assert same_bits(burn, mine)
