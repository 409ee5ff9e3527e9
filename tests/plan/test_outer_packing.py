"""PackedU32(1), the store Burn 0.23 packs a Row-layout Linear's weight in along its input axis: written for
Burn 0.23 only, as the same bytes as the inner-packed scheme on the other orientation (Burn's layout, held
to its recorded decode in tests/io/test_burn_023_recorded.py), and refused elsewhere with what to do."""

from __future__ import annotations

from pathlib import Path

import pytest
from safetensors.torch import save_file

from qcli.io.burnpack import BurnpackReader
from tests.cli_support import SAMPLES, SINGLE, assert_user_error, cli

# Every Linear weight of the sample's blocks in Burn's Row layout, packed along its input axis in blocks of 32
# inputs: the form Burn 0.23's packed-weight matmul reads (docs/output.md).
ROW_PACKED = SAMPLES / "tiny-llama-row-packed.toml"


def quantized(out: Path, *options: str | Path) -> BurnpackReader:
    result = cli("quantize", SINGLE, "-o", out, "--burn-version", "0.23", "--quiet", *options)
    assert result.code == 0, result.err
    return BurnpackReader.open(out)


@pytest.mark.parametrize("calibration", ["minmax", "mse"])
def test_a_row_weight_packed_along_its_inputs_holds_the_usual_bytes_under_burns_header(
        tmp_path: Path, calibration: str) -> None:
    """Burn 0.23 stores a PackedU32(1) tensor with its two axes swapped, so a Row weight `[in, out]` with
    blocks `[32, 1]` is, byte for byte, the `[out, in]` weight in blocks of 32 along its rows: qcli writes
    those bytes (the scale search included) under the header Burn reads, `[in, out]` and PackedU32(1)."""
    row = quantized(tmp_path / "row.bpk", "--recipe", ROW_PACKED, "--calibration", calibration)
    usual = quantized(tmp_path / "usual.bpk", "--scheme", "q4s-b32", "--calibration", calibration)
    usual_entries = {e.name: e for e in usual.entries()}
    projections = [e for e in row.entries() if e.name.endswith("_proj.weight")]
    assert len(projections) == 14
    for entry in projections:
        plain = usual_entries[entry.name]
        assert tuple(entry.shape) == tuple(plain.shape)[::-1]
        assert entry.dtype.scheme.to_serde() == {"value": "Q4S", "store": {"PackedU32": 1}, "mode": "Symmetric",
                                                 "tensor": None,
                                                 "block": {"size": {"storage": [32, 1, 1, 1, 1], "len": 2},
                                                           "dtype": "F16"}}
        assert bytes(row.read(entry.name)) == bytes(usual.read(entry.name)), entry.name
    assert cli("inspect", tmp_path / "row.bpk", "--compare", SINGLE).code == 0


@pytest.mark.parametrize("version", ["0.22.1", "0.21"])
def test_other_burn_releases_refuse_it_saying_which_reads_it(tmp_path: Path, version: str) -> None:
    result = cli("quantize", SINGLE, "-o", tmp_path / "out.bpk", "--recipe", ROW_PACKED, "--burn-version", version)
    lines = assert_user_error(result, 2)
    text = " ".join(lines)
    assert "cannot split values packed along an outer axis (PackedU32(1))" in text
    assert 'store = "PackedU32(0)"' in text and "--burn-version 0.23" in text
    assert not (tmp_path / "out.bpk").exists()


def test_it_packs_two_axis_tensors_only(tmp_path: Path) -> None:
    """A tensor of other than two axes has no "first of two" axis: the rule cannot take it (kept, as any
    indivisible tensor by default, and said so)."""
    import torch

    save_file({"cube": torch.ones(4, 32, 32), "flat": torch.ones(64)}, str(tmp_path / "t.safetensors"))
    (tmp_path / "r.toml").write_text('version = 1\n\n[[rule]]\nmatch = "*"\nvalue = "Q8S"\nstore = "PackedU32(1)"\n'
                                     'block = [32, 1]\nblock_scale = "F16"\n')
    result = cli("quantize", tmp_path / "t.safetensors", "-o", tmp_path / "o.bpk", "--recipe", tmp_path / "r.toml",
                 "--burn-version", "0.23", "--dry-run", "--json")
    assert result.code == 0, result.err
    import json

    reasons = {t["name"]: t["reason"] for t in json.loads(result.out)["tensors"]}
    assert "PackedU32(1) packs a 2-D tensor along its first axis; the tensor has 3 axes" in reasons["cube"]
    assert "the tensor has 1 axes" in reasons["flat"]
