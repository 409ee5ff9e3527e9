"""A sharded output loads into one Burn module: tests/burn/examples/load_sharded.rs (docs/output.md's
Rust) loads each shard with `allow_partial` and checks every parameter was filled, then runs the model;
its output is held to torch run on the weights Burn itself decodes from the same shards."""

from __future__ import annotations

import json
import subprocess

import pytest
import torch

from qcli.burn_backends import BurnBackend
from tests.burn_harness import CRATE, dequantize, example, require, save_f32
from tests.cli_support import ROOT, cli
from tests.io.test_burn import ROW_RECIPE

pytestmark = pytest.mark.burn


def docs_rust_example() -> str:
    text = (ROOT / "docs" / "output.md").read_text()
    start = text.index("```rust\n") + len("```rust\n")
    return text[start : text.index("```", start)]


def run_example(index):
    return subprocess.run([example("load_sharded"), index], capture_output=True, text=True, timeout=300)


@pytest.fixture
def sharded(tmp_path):
    """The example's Mlp written by qcli as a model folder of shards, `up` and `down` in different ones."""
    generator = torch.Generator().manual_seed(7)
    source = save_f32(tmp_path / "model.safetensors", {
        "up.weight": torch.randn(128, 256, generator=generator), "up.bias": torch.randn(128, generator=generator),
        "down.weight": torch.randn(64, 128, generator=generator), "down.bias": torch.randn(64, generator=generator),
    })
    (tmp_path / "row.toml").write_text(ROW_RECIPE)
    out = tmp_path / "out"
    done = cli("quantize", source, "-o", f"{out}/", "--recipe", tmp_path / "row.toml", "--burn-backend", "flex",
               "--max-shard-size", "40KB")
    assert done.code == 0, done.err
    return out / "model.bpk.index.json"


def test_the_docs_rust_is_the_example_the_tests_run():
    assert docs_rust_example() in (CRATE / "examples" / "load_sharded.rs").read_text()


def test_a_sharded_output_loads_into_one_module_and_runs(sharded, tmp_path):
    require(BurnBackend.flex)
    weight_map = json.loads(sharded.read_text())["weight_map"]
    assert weight_map["up.weight"] != weight_map["down.weight"]  # the module spans shards
    done = run_example(sharded)
    assert done.returncode == 0, done.stderr
    got = torch.tensor(json.loads(done.stdout))
    burn = {}
    for i, shard in enumerate(sorted(set(weight_map.values()))):
        burn |= dequantize(BurnBackend.flex, sharded.parent / shard, tmp_path / f"burn{i}.safetensors")
    x = torch.ones(1, 256, dtype=torch.float64)
    hidden = x @ burn["up.weight"].double() + burn["up.bias"].double()  # [in, out]: LinearLayout::Row
    want = (hidden @ burn["down.weight"].double() + burn["down.bias"].double()).flatten()
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-4)


def test_a_parameter_no_shard_holds_fails_the_check(sharded):
    require(BurnBackend.flex)
    index = json.loads(sharded.read_text())
    dropped = index["weight_map"]["down.weight"]
    index["weight_map"] = {name: shard for name, shard in index["weight_map"].items() if shard != dropped}
    sharded.write_text(json.dumps(index))
    done = run_example(sharded)
    assert done.returncode != 0
    assert "no shard filled" in done.stderr and "down.weight" in done.stderr
