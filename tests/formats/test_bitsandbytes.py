"""bitsandbytes NF4 and FP4 checkpoints: refused from the headers with Burn's Lookup refusal and the way
out, `--requantize`, which quantizes bitsandbytes' own dequantization (`dequantize_4bit`) within the
scheme's bound; the checkpoints are written by bitsandbytes itself (`quantize_4bit` on the CPU,
`QuantState.as_dict(packed=True)`), and the decoder is also held to values worked out by hand."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from qcli.burn_backends import BurnBackend
from qcli.codec.blocks import to_blocks
from qcli.errors import InputError, PlanError
from qcli.formats import bitsandbytes
from qcli.io.burnpack import BurnpackReader
from qcli.io.safetensors import SafetensorsSource
from qcli.layout import BlockGrid
from qcli.measure import error_bound
from qcli.presets import PRESETS
from qcli.scheme import LOOKUP_PANICS_AT, LOOKUP_WHY
from tests.burn_harness import dequantize as burn_dequantize
from tests.burn_harness import require, same_bits
from tests.cli_support import assert_user_error, cli, validate_json
from tests.format_support import decoded, model_problems, refused_from_headers

# name -> (shape, quant_type, compressed statistics, blocksize): a partial last block, nested absmax, FP4
LAYOUTS = {
    "model.layers.0.mlp.weight": ((64, 96), "nf4", True, 64),
    "model.layers.0.attn.weight": ((16, 64), "nf4", False, 64),
    "model.layers.1.mlp.weight": ((24, 40), "fp4", False, 128),
}


def write(path: Path) -> dict[str, torch.Tensor]:
    """A checkpoint bitsandbytes wrote (a BF16 norm beside) and bitsandbytes' dequantization of each weight."""
    functional = pytest.importorskip("bitsandbytes.functional")
    g = torch.Generator().manual_seed(0)
    tensors, want = {"model.norm.weight": torch.ones(96, dtype=torch.bfloat16)}, {}
    for name, (shape, quant_type, nested, blocksize) in LAYOUTS.items():
        w = torch.randn(shape, generator=g).to(torch.bfloat16)
        codes, state = functional.quantize_4bit(w, blocksize=blocksize, quant_type=quant_type,
                                                compress_statistics=nested)
        tensors[name] = codes
        tensors.update({f"{name}.{k}": v for k, v in state.as_dict(packed=True).items()})
        # bitsandbytes' CPU kernel (0.49, 0.50) takes each row of `shape` as its own run of blocks, so a
        # block that crosses a row (96 values a row in blocks of 64) decodes with the wrong absmax; its
        # blocks run over the flat tensor, as the quantizer made them, when the shape is given flat.
        flat = copy.copy(state)
        flat.shape = torch.Size([w.numel()])
        want[name] = functional.dequantize_4bit(codes, flat).reshape(shape)
    save_file(tensors, str(path))
    return want


@pytest.fixture
def checkpoint(tmp_path) -> tuple[Path, dict[str, torch.Tensor]]:
    path = tmp_path / "model.safetensors"
    return path, write(path)


def test_the_decoder_is_bitsandbytes_dequantize_4bit(checkpoint):
    path, want = checkpoint
    with SafetensorsSource.open(path) as source:
        books = bitsandbytes.detect(source.infos(), None)
        assert sorted(books) == sorted(LAYOUTS)
        assert len(books["model.layers.0.mlp.weight"].companions) == 5  # absmax, maps, nested, the state
        for name, book in books.items():
            got = book.with_state(source.load).dequantize(source.load)
            assert got.dtype == want[name].dtype and got.shape == want[name].shape
            assert torch.equal(got, want[name]), name  # FP4's code 8: bitsandbytes' C kernel gives -0.0


def test_the_decoder_by_hand(tmp_path):
    """A [2, 3] tensor in blocks of 4 with nested absmax, its values worked out from the layout: codes
    1, 15, 2, 0 | 7, 8 (high nibble first), absmax = nested_map[code] * nested_absmax + offset."""
    quant_map = torch.linspace(-1, 1, 16)  # entry k is -1 + 2k/15
    state = {"quant_type": "nf4", "blocksize": 4, "dtype": "float32", "shape": [2, 3], "nested_blocksize": 256,
             "nested_dtype": "float32", "nested_offset": 0.5}
    tensors = {"w": torch.tensor([[0x1F], [0x20], [0x78]], dtype=torch.uint8),
               "w.absmax": torch.tensor([1, 2], dtype=torch.uint8),
               "w.quant_map": quant_map,
               "w.nested_absmax": torch.tensor([2.0]),
               "w.nested_quant_map": torch.tensor([0.0, 0.25, 1.0]),
               "w.quant_state.bitsandbytes__nf4": torch.tensor(list(json.dumps(state).encode()), dtype=torch.uint8)}
    save_file(tensors, str(tmp_path / "m.safetensors"))
    with SafetensorsSource.open(tmp_path / "m.safetensors") as source:
        [book] = bitsandbytes.detect(source.infos(), None).values()
        got = book.with_state(source.load).dequantize(source.load)
    absmax = [0.25 * 2 + 0.5, 1.0 * 2 + 0.5]  # 1.0 for the first block, 2.5 for the second
    codes = [1, 15, 2, 0, 7, 8]
    values = [(-1 + 2 * k / 15) * absmax[i // 4] for i, k in enumerate(codes)]
    assert torch.allclose(got, torch.tensor(values).reshape(2, 3), rtol=1e-6, atol=0)


def test_refused_before_any_weight_is_read(checkpoint, monkeypatch):
    path, _ = checkpoint

    nf4, fp4 = refused_from_headers(monkeypatch, path, path.with_suffix(".bpk"))
    assert nf4.message.startswith("2 tensors (model.layers.0.attn.weight, model.layers.0.mlp.weight) are "
                                  "bitsandbytes NF4: 4-bit codes into a 16-entry codebook")
    assert fp4.message.startswith("1 tensor (model.layers.1.mlp.weight) is bitsandbytes FP4")
    assert f"{LOOKUP_WHY} ({LOOKUP_PANICS_AT})" in nf4.message and "--requantize q4s-b32" in nf4.hint
    assert not path.with_suffix(".bpk").exists()


@pytest.mark.parametrize("flags", [(), ("--dry-run",)], ids=["run", "dry-run"])
def test_the_cli_refuses_with_the_way_out(checkpoint, flags):
    path, _ = checkpoint
    lines = assert_user_error(cli("quantize", path, *flags), PlanError.exit_code)
    assert "no weight was read" in lines[0]
    assert any(LOOKUP_WHY in line and "hint: requantize them into a Burn scheme: --requantize q4s-b32" in line
               for line in lines)
    result = cli("quantize", path, *flags, "--json")
    assert result.code == PlanError.exit_code
    doc = json.loads(result.out)
    validate_json(doc)
    assert doc["error"]["exit_code"] == PlanError.exit_code


def test_validate_scheme_model_reports_the_refusal(checkpoint, tmp_path):
    path, _ = checkpoint
    recipe = 'version = 1\n[[rule]]\nmatch = "*.norm.weight"\nkeep = true\n'
    lookups = [p for p in model_problems(recipe, path, tmp_path, code=1) if p["kind"] == "lookup"]
    assert [p["message"].split(":")[0] for p in lookups] == [
        "2 tensors (model.layers.0.attn.weight, model.layers.0.mlp.weight) are bitsandbytes NF4",
        "1 tensor (model.layers.1.mlp.weight) is bitsandbytes FP4"]
    # the way out the refusal offers, checked as quantize would take it: the states read, no weight
    offered = model_problems(recipe, path, tmp_path, "--requantize", "q4s-b32", "--burn-backend", "flex")
    assert [p["kind"] for p in offered] == ["uncovered"]


def test_inspect_shows_the_refusal(checkpoint):
    path, _ = checkpoint
    result = cli("inspect", path, "--json")
    assert result.code == 0, result.err
    doc = json.loads(result.out)
    planned = {t["name"]: t["plan"] for t in doc["tensors"]}
    assert planned["model.layers.0.mlp.weight"]["refused"]
    assert planned["model.layers.0.mlp.weight"]["reason"] == "refused: bitsandbytes NF4 is a codebook"
    assert not planned["model.layers.0.mlp.weight.absmax"]["refused"]


def test_a_state_that_does_not_describe_its_codes_is_an_input_error(tmp_path):
    tensors = {"w": torch.zeros(3, dtype=torch.uint8), "w.absmax": torch.ones(1), "w.quant_map": torch.zeros(16),
               "w.quant_state.bitsandbytes__nf4": torch.tensor(list(json.dumps(
                   {"quant_type": "nf4", "blocksize": 64, "dtype": "bfloat16", "shape": [4, 4]}).encode()),
                   dtype=torch.uint8)}
    save_file(tensors, str(tmp_path / "m.safetensors"))
    lines = assert_user_error(cli("quantize", tmp_path / "m.safetensors", "--requantize", "q4f-b32"),
                              InputError.exit_code)
    assert lines[0].startswith("error: tensor 'w.quant_state.bitsandbytes__nf4' does not describe w (3 bytes")




def test_requantize_decodes_within_the_bound_of_the_dequantized_source(checkpoint, tmp_path):
    path, want = checkpoint
    out = tmp_path / "model.bpk"
    result = cli("quantize", path, "-o", out, "--requantize", "q4f-b32", "--json")
    assert result.code == 0, result.err
    doc = json.loads(result.out)
    validate_json(doc)
    rows = {t["name"]: t for t in doc["tensors"]}
    assert sorted(rows) == sorted([*LAYOUTS, "model.norm.weight"])  # the companions are consumed
    assert rows["model.layers.0.mlp.weight"]["reason"] == "requantize bitsandbytes NF4 -> q4f-b32"
    assert rows["model.layers.1.mlp.weight"]["reason"].startswith("requantize bitsandbytes FP4 -> q4f-b32 → block [8]")
    assert rows["model.layers.0.mlp.weight"]["shape"] == [64, 96]
    assert all(rows[n]["sqnr_db"] is not None for n in LAYOUTS)
    assert sorted(e.name for e in BurnpackReader.open(out).entries()) == sorted(rows)
    schemes = {e.name: e.dtype.scheme for e in BurnpackReader.open(out).entries() if e.name in LAYOUTS}
    for name, values in decoded(out, LAYOUTS).items():
        x, scheme = want[name].to(torch.float32), schemes[name]
        assert scheme.value is PRESETS["q4f-b32"].scheme.value
        grid = BlockGrid.of(scheme, x.shape)
        worst = to_blocks((values - x).abs().to(torch.float64), grid).amax(dim=grid.block_axes)
        assert bool((worst <= error_bound(x, scheme, PRESETS["q4f-b32"].calibration)).all()), name


def test_the_requantized_file_loads_in_burn(checkpoint, tmp_path):
    require(BurnBackend.flex)
    path, _ = checkpoint
    out = tmp_path / "model.bpk"
    assert cli("quantize", path, "-o", out, "--requantize", "q4f-b32").code == 0
    burn, mine = burn_dequantize(BurnBackend.flex, out, tmp_path / "burn.safetensors"), decoded(out, LAYOUTS)
    assert sorted(burn) == sorted([*LAYOUTS, "model.norm.weight"])
    for name, values in mine.items():
        assert same_bits(burn[name], values), name
