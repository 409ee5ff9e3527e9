"""optimum-quanto checkpoints, written by optimum-quanto itself (`quantize`, `freeze`, the state dict and
`quanto_qmap.json`): qint8 and qfloat8 weights transcoded per channel, so qcli's decode of the `.bpk` is
quanto's own `dequantize()` bit for bit (rounded to the scale's dtype where that is 16-bit, as quanto's is)
and Burn decodes the file to the same values; qint4 and qint2 (a shift per group) refused, and
`--requantize` quantizes quanto's own dequantization within the scheme's bound."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from qcli.burn_backends import BurnBackend
from qcli.codec.blocks import to_blocks
from qcli.errors import PlanError
from qcli.formats import quanto
from qcli.io.burnpack import BurnpackReader
from qcli.io.safetensors import SafetensorsSource
from qcli.layout import BlockGrid
from qcli.measure import error_bound
from qcli.plan.decisions import make_plan
from qcli.plan.options import PlanOptions
from qcli.presets import PRESETS
from qcli.scheme import PackedU32, QuantScheme, QuantValue, ScaleDtype
from tests.burn_harness import same_bits
from tests.cli_support import assert_user_error, cli, validate_json
from tests.format_support import assert_burn_decodes_as_qcli, decoded

# module -> (weight type, out, in, bias): a row of 300 (blocks of 150), whole u32 words for wgpu
BYTES = {"q8": ("qint8", 8, 64, False), "f8": ("qfloat8", 6, 300, False), "e5": ("qfloat8_e5m2", 4, 32, True)}
# qint4 groups of 128 (out read from the bias), qint2 over rows of 140 (not grouped: no group of 32 to 128 divides it)
BITS = {"q4": ("qint4", 16, 256, True), "q2": ("qint2", 12, 140, False)}


def write(directory: Path, layers: dict, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """The checkpoint quanto writes for `layers` (a LayerNorm beside, left float) in `dtype`, and quanto's
    own dequantization of each weight by the name qcli writes it under."""
    q = pytest.importorskip("optimum.quanto")
    directory.mkdir(exist_ok=True)
    torch.manual_seed(0)
    model = torch.nn.ModuleDict({name: torch.nn.Linear(i, o, bias=b) for name, (_, o, i, b) in layers.items()})
    model["norm"] = torch.nn.LayerNorm(8)
    model.to(dtype)
    for name, (qtype, *_) in layers.items():
        q.quantize(model, weights=getattr(q, qtype), include=name)
    q.freeze(model)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(directory / "model.safetensors"))
    (directory / quanto.QMAP).write_text(json.dumps(q.quantization_map(model)))
    (directory / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "quanto",
                                                                               "weights": "int8"}}))
    return {f"{name}.weight": model[name].weight.dequantize() for name in layers}


def test_the_plan_transcodes_qint8_and_qfloat8_per_channel(tmp_path):
    write(tmp_path, BYTES)
    plan = make_plan(SafetensorsSource.open(tmp_path).infos())
    decisions = {e.name: e.decision for e in plan.entries}
    q8f = QuantScheme().with_value(QuantValue.Q8F).with_store(PackedU32(0))
    e4m3 = QuantScheme().with_value(QuantValue.E4M3).with_store(PackedU32(0))
    assert decisions["q8.weight"].scheme == q8f.per_block([1, 64], ScaleDtype.F32)
    assert decisions["f8.weight"].scheme == e4m3.per_block([1, 150], ScaleDtype.F32)
    assert decisions["q8.weight"].reason == "default: transcode quanto qint8 per channel -> Q8F PackedU32(0) " \
                                            "block [64] F32 as q8.weight, exact"
    assert not [n for n in decisions if n.endswith(("._data", "._scale"))]  # written as m.weight, scales consumed
    assert decisions["q8.input_scale"].scheme is None  # the activations' scales are kept as they are
    assert not plan.errors()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_decoded_bpk_is_quantos_dequantization_bit_for_bit(tmp_path, dtype):
    want = write(tmp_path / "ckpt", BYTES, dtype)
    out = tmp_path / "model.bpk"
    result = cli("quantize", tmp_path / "ckpt", "-o", out, "--json")
    assert result.code == 0, result.err
    validate_json(json.loads(result.out))
    got = decoded(out)
    assert sorted(got) == sorted(want)
    for name, values in want.items():  # an f32 product, which quanto rounds once to a 16-bit scale's dtype
        assert values.dtype == dtype and same_bits(got[name].to(dtype), values), name
    compared = cli("inspect", out, "--compare", tmp_path / "ckpt", "--json")
    assert compared.code == 0, compared.err
    assert all(r["exact"] for r in json.loads(compared.out)["compare"]["tensors"])


@pytest.mark.parametrize("backend", [BurnBackend.flex, BurnBackend.wgpu])
def test_burn_decodes_the_transcoded_file_as_qcli_does(tmp_path, backend):
    layers = BYTES if backend is BurnBackend.wgpu else {"q8": BYTES["q8"]}  # flex decodes no minifloat
    want = write(tmp_path / "ckpt", layers)
    out = tmp_path / "model.bpk"
    # No --burn-backend: it also refuses what a model computes wrong with, not this test's.
    result = cli("quantize", tmp_path / "ckpt", "-o", out)
    assert result.code == 0, result.err
    assert_burn_decodes_as_qcli(out, want, backend, tmp_path)


def test_qint4_and_qint2_are_refused_from_the_headers_with_the_way_out(tmp_path):
    write(tmp_path, BITS)
    lines = assert_user_error(cli("quantize", tmp_path, "-o", tmp_path / "m.bpk"), PlanError.exit_code)
    text = "\n".join(lines)
    assert "1 tensor (q4.weight._data._data) is quanto qint4: 4-bit unsigned codes with a scale and a shift " \
           "per group of 128" in text and "--requantize q4s-b32" in text
    assert "1 tensor (q2.weight._data._data) is quanto qint2" in text and "--requantize q2s-b32" in text
    assert not (tmp_path / "m.bpk").exists()


def test_the_decoder_is_quantos_dequantize(tmp_path):
    want = write(tmp_path, BITS)
    with SafetensorsSource.open(tmp_path) as source:
        found = quanto.detect(source.infos(), None)
        for info_name, weight in found.items():
            got = weight.dequantize(source.load)
            assert got.dtype == want[weight.name].dtype and same_bits(got, want[weight.name]), info_name


@pytest.mark.parametrize(("layers", "preset"), [({"q4": BITS["q4"]}, "q4s-b32"), (BITS, "q8s")], ids=["offered", "q8s"])
def test_requantize_decodes_within_the_bound_of_quantos_dequantization(tmp_path, layers, preset):
    want = write(tmp_path / "ckpt", layers)
    out = tmp_path / "model.bpk"
    result = cli("quantize", tmp_path / "ckpt", "-o", out, "--requantize", preset, "--json")
    assert result.code == 0, result.err
    rows = {t["name"]: t for t in json.loads(result.out)["tensors"]}
    assert rows["q4.weight"]["reason"] == f"requantize quanto qint4 -> {preset}"
    assert rows["q4.weight"]["shape"] == [16, 256]
    schemes = {e.name: e.dtype.scheme for e in BurnpackReader.open(out).entries() if e.name in want}
    assert sorted(schemes) == sorted(want)
    for name, values in decoded(out, want).items():
        x, scheme = want[name], schemes[name]
        grid = BlockGrid.of(scheme, x.shape)
        worst = to_blocks((values - x).abs().to(torch.float64), grid).amax(dim=grid.block_axes)
        assert bool((worst <= error_bound(x, scheme, PRESETS[preset].calibration)).all()), name


def test_qint2_codes_whose_shape_the_checkpoint_does_not_say_have_no_way_out(tmp_path):
    write(tmp_path, {"q2": ("qint2", 12, 64, False)})  # 64 inputs, no bias: [12, 64] or [6, 128] alike
    plan = make_plan(SafetensorsSource.open(tmp_path).infos(), options=PlanOptions(requantize=PRESETS["q4f-b32"]))
    [error] = plan.errors()
    assert "the [out, in] its 768 codes dequantize to is not in the checkpoint" in error.message
