"""`qcli quantize --target-bpw / --target-size`: the budget honoured on the sample model and a synthetic one,
only forms the chosen backend computes with, the written recipe reproducing the same bytes, and the
refusals."""

from __future__ import annotations

import math
import re

import pytest
import torch
from safetensors.torch import save_file

from qcli.burn_backends import load_problem
from qcli.presets import PRESETS
from tests.cli_support import ROOT, SINGLE, cli, validate_json


def _ticked(backend: str) -> set[str]:
    """The presets docs/presets.md's table (Burn 0.22.1) marks ✓ for `backend`: loads and computes."""
    text = (ROOT / "docs" / "presets.md").read_text().split("<!-- burn 0.21 -->")[0]
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("| preset | Burn scheme"))
    column = [c.strip() for c in header.strip("|").split("|")].index(backend)
    ticked = set()
    for line in lines:
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) > column and re.fullmatch(r"`[a-z0-9-]+`", cells[0]) and cells[column] == "✓":
            ticked.add(cells[0].strip("`"))
    return ticked


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    torch.manual_seed(0)
    tensors = {"model.embed_tokens.weight": torch.randn(300, 256), "lm_head.weight": torch.randn(300, 256),
               "model.norm.weight": torch.ones(256)}
    for i in range(3):
        for name, shape in (("self_attn.q_proj", (256, 256)), ("self_attn.k_proj", (128, 256)),
                            ("mlp.up_proj", (512, 256)), ("mlp.down_proj", (256, 512))):
            tensors[f"model.layers.{i}.{name}.weight"] = torch.randn(*shape) * (1 + i)
    path = tmp_path_factory.mktemp("synthetic") / "model.safetensors"
    save_file(tensors, str(path))
    return path


def _run(*args):
    result = cli("quantize", *args, "--json")
    assert result.code == 0, result.out + result.err
    doc = result.json
    validate_json(doc)
    return doc


@pytest.mark.parametrize("bpw", [5.0, 5.6, 6.5, 8.5, 12.0])
def test_the_bits_per_weight_stay_within_the_target(tmp_path, bpw):
    doc = _run(SINGLE, "-o", tmp_path / "a.bpk", "--target-bpw", bpw, "--dry-run")
    target = doc["target"]
    achieved = target["achieved_bits_per_weight"]
    assert achieved <= bpw + 0.05
    assert achieved >= min(bpw, 8.5) - 0.05
    quantized = [t for t in doc["tensors"] if t["scheme"] is not None]
    bits = 8 * sum(t["bytes_out"] for t in quantized) / sum(math.prod(t["shape"]) for t in quantized)
    assert achieved == pytest.approx(bits)
    assert target["choices"]["lm_head.weight"] == target["choices"]["model.embed_tokens.weight"] == "q8s-b32"
    assert not (tmp_path / "a.bpk").exists()


@pytest.mark.parametrize("bpw", [3.5, 4.2, 6.0])
def test_a_synthetic_model_takes_its_budget_and_writes_what_it_planned(tmp_path, synthetic, bpw):
    out = tmp_path / "s.bpk"
    doc = _run(synthetic, "-o", out, "--target-bpw", bpw)
    achieved = doc["target"]["achieved_bits_per_weight"]
    assert bpw - 0.05 <= achieved <= bpw + 0.05
    assert out.stat().st_size <= doc["target"]["file_bytes_bound"]


def test_a_size_target_bounds_the_file(tmp_path, synthetic):
    out = tmp_path / "s.bpk"
    size = 1_000_000
    doc = _run(synthetic, "-o", out, "--target-size", str(size))
    assert out.stat().st_size <= size
    assert doc["target"]["file_bytes_bound"] <= size
    assert out.stat().st_size >= size * 0.9


@pytest.mark.parametrize("backend", ["flex", "wgpu", "ndarray"])
def test_every_chosen_form_computes_on_the_backend(tmp_path, synthetic, backend):
    doc = _run(synthetic, "-o", tmp_path / "s.bpk", "--target-bpw", 8.2 if backend == "ndarray" else 5.5,
               "--burn-backend", backend, "--dry-run")
    target = doc["target"]
    shapes = {t["name"]: t["out_shape"] for t in doc["tensors"]}
    ticked = _ticked(backend)
    for name, preset in target["choices"].items():
        assert preset in ticked, (name, preset)
        assert load_problem(backend, PRESETS[preset].scheme, shapes[name]) is None
    assert set(target["forms"]) <= ticked
    assert backend in doc["load"]["computes_on"]


@pytest.mark.parametrize("extra", [(), ("--burn-backend", "wgpu"), ("--transpose",)])
def test_the_written_recipe_reproduces_the_same_bytes(tmp_path, synthetic, extra):
    recipe = tmp_path / "chosen.toml"
    _run(synthetic, "-o", tmp_path / "a.bpk", "--target-bpw", "5.5", "--write-recipe", recipe, *extra)
    doc = _run(synthetic, "-o", tmp_path / "b.bpk", "--recipe", recipe, *extra)
    assert (tmp_path / "a.bpk").read_bytes() == (tmp_path / "b.bpk").read_bytes()
    assert doc["target"] is None
    checked = cli("validate-scheme", recipe, "--model", synthetic, *extra[:2] if extra[:1] != ("--transpose",) else ())
    assert checked.code == 0, checked.out + checked.err


def test_a_recipe_rule_pins_its_tensors_and_the_recipe_keeps_it(tmp_path):
    given = tmp_path / "pin.toml"
    given.write_text('version = 1\n\n[[rule]]\nmatch = "*.mlp.*"\nkeep = true\n')
    recipe = tmp_path / "chosen.toml"
    doc = _run(SINGLE, "-o", tmp_path / "a.bpk", "--recipe", given, "--target-bpw", "7.5", "--write-recipe", recipe)
    assert not any(".mlp." in name for name in doc["target"]["choices"])
    assert all(t["scheme"] is None for t in doc["tensors"] if ".mlp." in t["name"])
    assert recipe.read_text().startswith(given.read_text())
    _run(SINGLE, "-o", tmp_path / "b.bpk", "--recipe", recipe)
    assert (tmp_path / "a.bpk").read_bytes() == (tmp_path / "b.bpk").read_bytes()


def test_a_dry_run_prints_the_choice_and_writes_only_the_recipe(tmp_path):
    recipe = tmp_path / "chosen.toml"
    result = cli("quantize", SINGLE, "-o", tmp_path / "a.bpk", "--target-bpw", "6", "--dry-run",
                 "--write-recipe", recipe)
    assert result.code == 0, result.err
    assert "--target-bpw 6: " in result.out and "bits per quantized weight" in result.out
    assert "layer 0:" in result.out and "token embedding: 1 × q8s-b32" in result.out
    assert recipe.exists() and not (tmp_path / "a.bpk").exists()


@pytest.mark.parametrize(("args", "message"), [
    (("--target-bpw", "3"), "--target-bpw 3 is below the 4.959 bits per weight of the smallest forms"),
    (("--target-size", "100KB"), "--target-size 100KB is below the"),
    (("--target-bpw", "5", "--target-size", "1MB"), "cannot be used together"),
    (("--target-bpw", "5", "--scheme", "q4s-b32"), "--scheme and --target-bpw cannot be used together"),
    (("--target-bpw", "0"), "is not a number of bits per weight"),
    (("--write-recipe", "r.toml"), "--write-recipe writes the forms"),
])
def test_refusals_are_usage_errors(tmp_path, args, message):
    result = cli("quantize", SINGLE, "-o", tmp_path / "a.bpk", *args)
    assert result.code == 2, result.err
    assert message in " ".join(result.err.split())
    assert "hint:" in result.err
    assert not (tmp_path / "a.bpk").exists()


def test_a_backend_with_only_eight_bit_forms_refuses_a_narrower_target(tmp_path, synthetic):
    result = cli("quantize", synthetic, "-o", tmp_path / "a.bpk", "--target-bpw", "6", "--burn-backend", "ndarray")
    assert result.code == 2
    assert re.search(r"--target-bpw 6 is below the 8\.\d+ bits per weight .* ndarray", " ".join(result.err.split()))


def test_the_recipe_is_refused_over_a_file_without_force_and_over_an_input(tmp_path):
    existing = tmp_path / "r.toml"
    existing.write_text("x")
    result = cli("quantize", SINGLE, "-o", tmp_path / "a.bpk", "--target-bpw", "6", "--write-recipe", existing)
    assert result.code == 2 and "already exists" in result.err and existing.read_text() == "x"
    result = cli("quantize", SINGLE, "-o", tmp_path / "a.bpk", "--target-bpw", "6", "--write-recipe", SINGLE)
    assert result.code == 2 and "never writes over a file it reads" in " ".join(result.err.split())
    result = cli("quantize", SINGLE, "-o", tmp_path / "a.bpk", "--target-bpw", "6", "--write-recipe", existing,
                 "--force")
    assert result.code == 0 and existing.read_text().startswith("version = 1")


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """A tiny Llama with its tokenizer and config, the calibration text beside it, and its importance matrix
    as `qcli imatrix` writes it."""
    from tests.calibrate_support import TEXT, tiny_llama

    folder = tiny_llama(tmp_path_factory.mktemp("target-llama") / "llama", seed=5, intermediate_size=256)
    (folder.parent / "text.txt").write_text(TEXT)
    done = cli("imatrix", folder, "--calibration-data", folder.parent / "text.txt", "-o", folder.parent / "m.gguf",
               "--samples", "2", "--seq-len", "32", "--device", "cpu")
    assert done.code == 0, done.err
    return folder


@pytest.mark.parametrize("weighed_by", ["imatrix", "calibration-data"])
def test_a_target_weighs_the_error_by_the_activations_given(llama, tmp_path, weighed_by):
    """The sensitivity pass reads an importance matrix, or measures one on calibration text as `qcli imatrix`
    does; the budget holds either way, and a budget between two forms mixes them."""
    given = (["--imatrix", llama.parent / "m.gguf"] if weighed_by == "imatrix"
             else ["--calibration-data", llama.parent / "text.txt", "--samples", "2", "--seq-len", "32"])
    doc = _run(llama, "-o", tmp_path / "a.bpk", "--target-bpw", "6", "--calibration", "mse", *given,
               "--device", "cpu", "--dry-run")
    target = doc["target"]
    assert target["sensitivity"] == weighed_by
    assert target["achieved_bits_per_weight"] <= 6.05
    assert len(set(target["choices"].values())) > 1, "a budget between two forms mixes them"
