"""`qcli quantize --transpose` and the run's closing lines on loading the file in Burn.

Expectations are worked out by hand: the recipe that says `transpose = true` on the same tensors, the
Linear layout each orientation needs (docs/output.md), and which backend computes which preset (the
README's table, itself measured by the Burn harness in tests/io/test_burn_backends.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from qcli import BURN_VERSION
from qcli.io.burnpack import BurnpackReader
from tests.burn_harness import save_f32
from tests.cli_support import ROOT, SINGLE, assert_user_error, cli, validate_json
from tests.gguf_support import T, write_gguf

EMBEDDING, HEAD = "model.embed_tokens.weight", "lm_head.weight"
SQUARE, UP, DOWN = (f"model.layers.0.{m}.weight" for m in ("self_attn.o_proj", "mlp.up_proj", "mlp.down_proj"))
NORM = "model.layers.0.input_layernorm.weight"
LINEAR = (HEAD, DOWN, UP, SQUARE)  # in name order, as the plan has them
RUST = "  the Rust: README.md#load-it-in-burn, tests/burn/examples/load_qcli.rs"
HEADER = f"load it in Burn {BURN_VERSION} (BurnpackStore, Module::load_from):"


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    """An F32 Llama-shaped layer in PyTorch's orientation: an embedding, a square and two non-square Linear
    weights, an output head and a norm."""
    generator = torch.Generator().manual_seed(11)
    shapes = {EMBEDDING: (96, 64), SQUARE: (64, 64), UP: (128, 64), DOWN: (64, 128), HEAD: (96, 64), NORM: (64,)}
    tensors = {name: torch.randn(shape, generator=generator) * 0.1 for name, shape in shapes.items()}
    return save_f32(tmp_path_factory.mktemp("model") / "model.safetensors", tensors)


# What --transpose does under the default policy (q4s-b32), said rule by rule: the embedding and the head at
# 8 bits, only the Linear weights (the head among them) transposed, the norm kept.
EQUIVALENT_RECIPE = """
version = 1

[[rule]]
match = "model.embed_tokens.weight"
preset = "q8s-b32"

[[rule]]
match = "lm_head.weight"
preset = "q8s-b32"
transpose = true

[[rule]]
match = "*_proj.weight"
preset = "q4s-b32"
transpose = true

[[rule]]
match = "*norm.weight"
keep = true
"""


def tensors_of(path: Path) -> dict[str, tuple[object, tuple[int, ...], bytes]]:
    reader = BurnpackReader.open(path)
    return {e.name: (e.dtype.to_serde(), tuple(e.shape), bytes(reader.read(e.name))) for e in reader.entries()}


def closing_lines(out: str) -> list[str]:
    lines = out.splitlines()
    return lines[lines.index(HEADER):]


def test_transpose_writes_the_bytes_of_the_recipe_that_transposes_the_linear_weights(model, tmp_path):
    recipe = tmp_path / "row.toml"
    recipe.write_text(EQUIVALENT_RECIPE)
    flag, ruled = tmp_path / "flag.bpk", tmp_path / "recipe.bpk"
    assert cli("quantize", model, "-o", flag, "--transpose", "--device", "cpu").code == 0
    assert cli("quantize", model, "-o", ruled, "--recipe", recipe, "--device", "cpu").code == 0
    assert tensors_of(flag) == tensors_of(ruled)
    written = tensors_of(flag)
    assert written[UP][1] == (64, 128) and written[SQUARE][1] == (64, 64) and written[EMBEDDING][1] == (96, 64)
    for path in (flag, ruled):
        assert sorted(json.loads(BurnpackReader.open(path).metadata["transposed"])) == sorted(LINEAR)


def test_transpose_is_recorded_in_the_model_folder_and_the_json_document(model, tmp_path):
    result = cli("quantize", model, "-o", f"{tmp_path / 'out'}/", "--transpose", "--device", "cpu", "--json")
    assert result.code == 0, result.err
    validate_json(result.json)
    record = json.loads((tmp_path / "out" / "qcli.json").read_text())
    assert record["options"]["transpose"] is True and record["tensors"]["transposed"] == len(LINEAR)
    assert {t["name"] for t in result.json["tensors"] if t["transposed"]} == set(LINEAR)


@pytest.mark.parametrize(("args", "layout", "written", "computes", "backends"), [
    # q8s-b32 decodes and computes on all three backends, F32 norms load everywhere
    (["--scheme", "q8s-b32"], "Col", "[out, in]", ["flex", "ndarray", "wgpu"],
     ["  computes as written on flex, ndarray, wgpu"]),
    (["--scheme", "q8s-b32", "--transpose"], "Row", "[in, out]", ["flex", "ndarray", "wgpu"],
     ["  computes as written on flex, ndarray, wgpu"]),
    # the default: the three 4-bit projections are no ndarray tensor and panic in wgpu's matmul on an NVIDIA
    # GPU; the 8-bit embedding and head compute there
    ([], "Col", "[out, in]", ["flex"],
     ["  computes as written on flex", "  not on ndarray (3 tensors), wgpu (3 tensors)"]),
    # E4M3 computes nowhere: flex and ndarray build no minifloat, wgpu's matmul fails on it
    (["--scheme", "e4m3", "--transpose"], "Row", "[in, out]", [],
     ["  computes as written on no backend", "  not on flex (5 tensors), ndarray (5 tensors), wgpu (5 tensors)"]),
], ids=["col", "row", "default", "e4m3"])
def test_the_closing_lines_name_the_layout_the_backends_and_the_rust(model, tmp_path, args, layout, written,
                                                                     computes, backends):
    out = tmp_path / "m.bpk"
    result = cli("quantize", model, "-o", out, "--device", "cpu", *args)
    assert result.code == 0, result.err
    expected = [HEADER, f"  LinearLayout::{layout}: 4 Linear weights {written}", *backends, RUST]
    assert closing_lines(result.out) == expected
    assert all(len(line) <= 80 for line in expected)
    dry = cli("quantize", model, "-o", out, "--device", "cpu", "--dry-run", "--force", *args)
    assert closing_lines(dry.out) == expected
    assert cli("quantize", model, "-o", out, "--force", "--quiet", *args).out.strip() == f"wrote {out}"
    document = cli("quantize", model, "-o", out, "--force", "--json", *args).json
    validate_json(document)
    load = document["load"]
    assert load["linear_layouts"] == {layout: list(LINEAR), ("Col" if layout == "Row" else "Row"): []}
    assert load["computes_on"] == computes
    assert load["rust"] == ["README.md#load-it-in-burn", "tests/burn/examples/load_qcli.rs"]


def test_the_rust_the_closing_lines_name_is_there():
    assert (ROOT / "tests" / "burn" / "examples" / "load_qcli.rs").is_file()
    assert "\n## Load it in Burn\n" in (ROOT / "README.md").read_text()


@pytest.mark.parametrize(("doc", "flags"), [("README.md", ["--transpose"]), ("docs/cli.md", [])])
def test_the_docs_show_the_closing_lines_the_sample_gives(doc, flags, tmp_path):
    text = (ROOT / doc).read_text()
    start = text.index(HEADER)
    shown = text[start:text.index("```", start)].splitlines()
    result = cli("quantize", SINGLE, "-o", tmp_path / "tiny.bpk", "--dry-run", *flags)
    assert closing_lines(result.out) == shown


TRANSPOSE_FALSE = """
version = 1

[[rule]]
match = "*.mlp.*"
preset = "q4s-b32"
transpose = false
"""


def test_a_rule_that_says_transpose_wins_and_the_closing_lines_say_per_group(model, tmp_path):
    recipe = tmp_path / "col-mlp.toml"
    recipe.write_text(TRANSPOSE_FALSE)
    out = tmp_path / "m.bpk"
    result = cli("quantize", model, "-o", out, "--recipe", recipe, "--transpose", "--device", "cpu", "--json")
    assert result.code == 0, result.err
    assert json.loads(BurnpackReader.open(out).metadata["transposed"]) == [HEAD, SQUARE]
    assert result.json["load"]["linear_layouts"] == {"Row": [HEAD, SQUARE], "Col": [DOWN, UP]}
    lines = closing_lines(cli("quantize", model, "-o", out, "--recipe", recipe, "--transpose", "--force").out)
    assert lines[1] == "  LinearLayout::Row: 2 Linear weights [in, out] (lm_head.weight, …)"
    # the name elided by whole parts, keeping its layer number and projection
    assert lines[2].startswith("  LinearLayout::Col: 2 Linear weights [out, in] (…")
    assert lines[2].endswith("(…0.mlp.down_proj.weight, …)") and len(lines[2]) <= 80


def test_a_name_that_cannot_tell_a_linear_from_gpt2s_conv1d_is_refused_unless_a_rule_says(tmp_path):
    generator = torch.Generator().manual_seed(12)
    source = save_f32(tmp_path / "gpt2.safetensors", {
        "transformer.h.0.attn.c_attn.weight": torch.randn(64, 192, generator=generator),  # Conv1D: [in, out]
        "transformer.h.0.mlp.fc_in.weight": torch.randn(128, 64, generator=generator),
        "transformer.wpe.weight": torch.randn(32, 64, generator=generator),
    })
    lines = assert_user_error(cli("quantize", source, "--transpose", "--dry-run"), 2)
    assert any("transformer.h.0.attn.c_attn.weight" in line and "Conv1D" in line for line in lines)
    recipe = tmp_path / "conv1d.toml"
    recipe.write_text('version = 1\n\n[[rule]]\nmatch = "*.c_attn.weight"\npreset = "q8s-b32"\ntranspose = false\n')
    result = cli("quantize", source, "--transpose", "--recipe", recipe, "--dry-run", "--json")
    assert result.code == 0, result.err
    rows = {t["name"]: t["transposed"] for t in result.json["tensors"]}
    assert rows == {"transformer.h.0.attn.c_attn.weight": False, "transformer.h.0.mlp.fc_in.weight": True,
                    "transformer.wpe.weight": False}
    assert result.json["load"]["unsure"] == ["transformer.h.0.attn.c_attn.weight"]


def test_a_transcoded_weight_keeps_its_orientation_with_a_warning_and_its_own_group(tmp_path):
    rng = np.random.default_rng(13)
    path = tmp_path / "model.gguf"
    write_gguf(path, {
        "token_embd.weight": (rng.standard_normal((96, 64), dtype=np.float32), T.F32),
        "blk.0.attn_q.weight": (rng.standard_normal((64, 64), dtype=np.float32), T.Q8_0),
        "blk.0.ffn_up.weight": (rng.standard_normal((128, 64), dtype=np.float32), T.F32),
    })
    out = tmp_path / "m.bpk"
    result = cli("quantize", path, "-o", out, "--transpose", "--device", "cpu")
    assert result.code == 0, result.err
    assert "--transpose leaves 1 tensor (blk.0.attn_q.weight) [out, in]" in result.err
    assert json.loads(BurnpackReader.open(out).metadata["transposed"]) == ["blk.0.ffn_up.weight"]
    lines = closing_lines(result.out)
    assert lines[1:3] == ["  LinearLayout::Row: 1 Linear weight [in, out] (blk.0.ffn_up.weight)",
                          "  LinearLayout::Col: 1 Linear weight [out, in] (blk.0.attn_q.weight)"]
