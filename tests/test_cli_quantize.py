"""`qcli quantize` through the real entry point: outputs, refusals, exit codes, and the bytes written.

Expectations come from qfloat-spec (serde form, payload lengths, the PackedU32 layout decoded by hand in
cli_support) and from the sample weights read independently; never from qcli's own output.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest
from cli_support import (
    SHARDED,
    SINGLE,
    assert_user_error,
    cli,
    cli_subprocess,
    decode_packed,
    half_step_bound,
    packed_len,
    q_serde,
    source_bytes,
    source_tensors,
    validate_json,
)

from qcli import BURN_VERSION, __version__

NORMS = ("input_layernorm", "post_attention_layernorm", "model.norm")


def is_norm(name: str) -> bool:
    return any(n in name for n in NORMS)


def read_bpk(path: Path):
    from qcli.io.burnpack import BurnpackReader

    return BurnpackReader.open(path)


def no_leftovers(folder: Path, expected: set[str]) -> None:
    """Nothing but `expected` in `folder`: no output, no temporary file."""
    assert {p.name for p in folder.iterdir()} == expected


@pytest.fixture
def no_weight_reads(monkeypatch):
    """Fail the test if any tensor's data is loaded."""
    from qcli.io.safetensors import SafetensorsSource

    def refuse(self, name):
        raise AssertionError(f"{name} was read")

    monkeypatch.setattr(SafetensorsSource, "load", refuse)


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> tuple[Path, dict]:
    """The sample quantized once with the default policy, with its --json document."""
    out = tmp_path_factory.mktemp("q") / "tiny.bpk"
    result = cli("quantize", SINGLE, "-o", out, "--device", "cpu", "--json")
    assert result.code == 0, result.err
    return out, result.json


def test_default_policy_quantizes_matrices_and_keeps_norms(written):
    out, _ = written
    reader = read_bpk(out)
    sources, raw = source_tensors(), source_bytes()
    entries = {e.name: e for e in reader.entries()}
    assert sorted(entries) == sorted(sources)
    for name, x in sources.items():
        e = entries[name]
        assert tuple(e.shape) == x.shape
        payload = bytes(reader.read(name))
        if is_norm(name):
            assert e.dtype == "BF16"
            assert payload == raw[name]  # kept: the source bytes, unchanged
            continue
        assert e.dtype == {"QFloat": q_serde("Q4S", 32)}
        assert e.nbytes == len(payload) == packed_len(x.shape, 4, 32)
        decoded, _ = decode_packed(payload, x.shape, bits=4, block=32)
        assert np.all(np.abs(decoded - x) <= half_step_bound(x, 7.0, 32)), name


def test_metadata_map_records_producer_sources_and_layout(written):
    out, _ = written
    meta = read_bpk(out).metadata
    assert meta["producer"] == "qcli"
    assert meta["producer_version"] == __version__
    assert meta["burn_version"] == BURN_VERSION
    assert json.loads(meta["source_files"]) == [{"name": SINGLE.name, "bytes": SINGLE.stat().st_size}]
    assert meta["preset"] == "q4s-b32"
    assert json.loads(meta["transposed"]) == []
    assert "recipe_sha256" not in meta


def test_json_document_validates_and_its_errors_are_the_decoded_ones(written):
    out, doc = written
    validate_json(doc)
    sources, reader = source_tensors(), read_bpk(out)
    assert doc["output"] == str(out) and doc["device"] == "cpu" and not doc["dry_run"]
    assert doc["totals"]["tensors"] == 21 and doc["totals"]["kept"] == 5 and doc["totals"]["quantized"] == 16
    assert doc["totals"]["bytes_in"] == sum(len(b) for b in source_bytes().values())
    assert doc["totals"]["bytes_out"] == sum(e.nbytes for e in reader.entries())
    for phase in ("read", "quantize", "write"):
        assert doc["timings"][phase]["seconds"] >= 0
    for t in doc["tensors"]:
        x = sources[t["name"]]
        if t["decision"] == "keep":
            assert t["rel_rms"] is None and t["scheme"] is None
            continue
        assert t["scheme"] == q_serde("Q4S", 32)
        decoded, _ = decode_packed(bytes(reader.read(t["name"])), x.shape, 4, 32)
        diff = (decoded - x).astype(np.float64)
        rel = math.sqrt((diff**2).sum() / (x.astype(np.float64) ** 2).sum())
        assert t["rel_rms"] == pytest.approx(rel, rel=1e-4)
        assert t["sqnr_db"] == pytest.approx(-20 * math.log10(rel), rel=1e-4)
        assert t["max_abs"] == pytest.approx(np.abs(diff).max(), rel=1e-4)


def test_summary_table_on_stdout(tmp_path):
    result = cli("quantize", SINGLE, "-o", tmp_path / "t.bpk", "--device", "cpu")
    assert result.code == 0, result.err
    for name in source_tensors():
        assert name in result.out
    assert "21 tensors: 16 quantized, 5 kept, 0 transposed" in result.out
    assert f"wrote {tmp_path / 't.bpk'}" in result.out
    assert result.err == ""  # progress is off when stderr is not a terminal


def test_dry_run_prints_the_plan_and_writes_nothing(tmp_path, no_weight_reads):
    src = tmp_path / "m.safetensors"
    shutil.copy(SINGLE, src)
    result = cli("quantize", src, "--dry-run")
    assert result.code == 0, result.err
    no_leftovers(tmp_path, {"m.safetensors"})
    assert "dry run" in result.out and "expected peak memory" in result.out
    assert f"would write {tmp_path / 'm.bpk'}" in result.out
    lines = {line.split()[1]: line for line in result.out.splitlines() if line.startswith("│")}
    assert "keep" in lines["model.norm.weight"] and "1-D" in lines["model.norm.weight"]
    assert "Q4S" in lines["lm_head.weight"] and "1000×128" in lines["lm_head.weight"]
    doc = cli("quantize", src, "--dry-run", "--json").json
    validate_json(doc)
    assert doc["dry_run"] and doc["timings"] is None
    # 1000×128 Q4S block [32] F16: 1000 rows of 16 words, plus 1000×4 f16 scales
    lm_head = next(t for t in doc["tensors"] if t["name"] == "lm_head.weight")
    assert lm_head["bytes_out"] == 1000 * 16 * 4 + 1000 * 4 * 2
    assert lm_head["bits_per_weight"] == pytest.approx(4.5)
    no_leftovers(tmp_path, {"m.safetensors"})


def test_existing_output_is_refused_without_force(tmp_path):
    out = tmp_path / "t.bpk"
    out.write_bytes(b"old")
    lines = assert_user_error(cli("quantize", SINGLE, "-o", out), 2)
    assert "already exists" in lines[0] and "--force" in lines[-1]
    assert out.read_bytes() == b"old"
    assert cli("quantize", SINGLE, "-o", out, "--force", "--device", "cpu").code == 0
    assert out.read_bytes()[:4] == b"NRUB"


def test_default_output_sits_beside_the_input(tmp_path):
    shutil.copy(SINGLE, tmp_path / "m.safetensors")
    assert cli("quantize", tmp_path / "m.safetensors", "--device", "cpu").code == 0
    assert (tmp_path / "m.bpk").is_file()

    shutil.copytree(SHARDED, tmp_path / "d")
    assert cli("quantize", tmp_path / "d", "--device", "cpu").code == 0
    assert (tmp_path / "d.bpk").is_file()
    (tmp_path / "d.bpk").unlink()
    assert cli("quantize", tmp_path / "d" / "model.safetensors.index.json", "--device", "cpu").code == 0
    assert (tmp_path / "d.bpk").is_file()


def test_sharded_input_gives_the_same_output_as_one_file(tmp_path, written):
    one, _ = written
    sharded = tmp_path / "sharded.bpk"
    assert cli("quantize", SHARDED, "-o", sharded, "--device", "cpu").code == 0
    a, b = read_bpk(one), read_bpk(sharded)
    assert a.entries() == b.entries()
    for e in a.entries():
        assert bytes(a.read(e.name)) == bytes(b.read(e.name))
    meta_a, meta_b = dict(a.metadata), dict(b.metadata)
    assert [f["name"] for f in json.loads(meta_b.pop("source_files"))] == [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ]
    meta_a.pop("source_files")
    assert meta_a == meta_b

    # the data sections, from the 256-aligned start D (burnpack-spec §1) to the end, are byte-identical
    def data_section(path: Path) -> bytes:
        raw = path.read_bytes()
        d = math.ceil((10 + int.from_bytes(raw[6:10], "little")) / 256) * 256
        return raw[d:]

    assert data_section(one) == data_section(sharded)


LOOKUP_RECIPE = """version = 1

[[rule]]
match = "*norm*"
keep = true

[[rule]]
match = "*.mlp.*"
value = "Q4S"
mode = "Lookup"
block = [32]
block_scale = "F16"
"""


def test_lookup_recipe_is_refused_before_anything_is_read(tmp_path, no_weight_reads):
    recipe = tmp_path / "lookup.toml"
    recipe.write_text(LOOKUP_RECIPE)
    lines = assert_user_error(cli("quantize", SINGLE, "-o", tmp_path / "out.bpk", "--recipe", recipe), 2)
    text = "\n".join(lines)
    assert "Lookup" in text
    assert "lookup quantization does not travel as a QFloat tensor" in text
    assert "lookup.toml:" in text  # the rule's file and line
    assert "6 tensors" in text  # gate/up/down of two layers
    assert "Q4S" in lines[-1] and "keep" in lines[-1]  # what to do instead
    no_leftovers(tmp_path, {"lookup.toml"})


def test_every_plan_error_is_reported_together(tmp_path, no_weight_reads):
    recipe = tmp_path / "bad.toml"
    recipe.write_text(
        LOOKUP_RECIPE
        + """
[defaults]
on_indivisible = "error"

[[rule]]
match = "*.self_attn.*"
value = "Q8S"
block = [48]
block_scale = "F16"
"""
    )
    result = cli("quantize", SINGLE, "--dry-run", "--recipe", recipe)
    lines = assert_user_error(result, 2)
    # one Lookup rule, and 8 attention projections whose last dim (128) block [48] cannot split
    assert "9 problems" in lines[0]
    problems = lines[1:-1]
    assert len(problems) == 9
    assert sum("lookup quantization does not travel" in p for p in problems) == 1
    assert sum("not a multiple of 48" in p and "bad.toml:" in p for p in problems) == 8


def test_unknown_and_codebook_presets_are_usage_errors():
    lines = assert_user_error(cli("quantize", SINGLE, "--dry-run", "--scheme", "q4s-b23"), 2)
    assert "q4s-b23" in lines[0] and "q4s-b32" in "\n".join(lines)
    lines = assert_user_error(cli("quantize", SINGLE, "--dry-run", "--scheme", "nf4"), 2)
    assert "lookup quantization does not travel as a QFloat tensor" in lines[0]


def test_fp4_preset_writes_e2m1_in_u32_words_with_f16_block_scales(tmp_path):
    out = tmp_path / "f.bpk"
    assert cli("quantize", SINGLE, "-o", out, "--scheme", "FP4-B32", "--device", "cpu").code == 0
    fp4 = {
        "value": "E2M1",
        "store": {"PackedU32": 0},
        "mode": "Symmetric",
        "tensor": None,
        "block": {"size": {"storage": [32, 1, 1, 1, 1], "len": 1}, "dtype": "F16"},
    }
    for e in read_bpk(out).entries():
        if not is_norm(e.name):
            rows, cols = e.shape
            assert e.dtype == {"QFloat": fp4}
            assert e.nbytes == rows * cols // 2 + rows * cols // 32 * 2  # 8 codes per word, F16 scales


def test_nvfp4_is_refused_with_what_loads_instead(tmp_path):
    lines = assert_user_error(cli("quantize", SINGLE, "-o", tmp_path / "n.bpk", "--scheme", "nvfp4"), 2)
    assert "loads on no backend of Burn 0.22.1" in lines[0] and "fp4-b32" in lines[-1]
    assert not (tmp_path / "n.bpk").exists()


TRANSPOSE_RECIPE = """version = 1

[[rule]]
match = "*.mlp.gate_proj.weight"
value = "Q8S"
block = [32]
block_scale = "F16"
transpose = true
"""


def test_transpose_rule_writes_in_out_and_records_it(tmp_path):
    recipe = tmp_path / "t.toml"
    recipe.write_text(TRANSPOSE_RECIPE)
    out = tmp_path / "t.bpk"
    dry = cli("quantize", SINGLE, "-o", out, "--recipe", recipe, "--dry-run")
    assert "352×128 → 128×352 (T)" in dry.out
    assert cli("quantize", SINGLE, "-o", out, "--recipe", recipe, "--device", "cpu").code == 0
    reader, sources = read_bpk(out), source_tensors()
    gates = [f"model.layers.{i}.mlp.gate_proj.weight" for i in range(2)]
    assert sorted(json.loads(reader.metadata["transposed"])) == gates
    assert reader.metadata["recipe_sha256"] == __import__("hashlib").sha256(recipe.read_bytes()).hexdigest()
    for name in gates:
        e = next(e for e in reader.entries() if e.name == name)
        xt = np.ascontiguousarray(sources[name].T)
        assert tuple(e.shape) == xt.shape == (128, 352)
        assert e.dtype == {"QFloat": q_serde("Q8S", 32)}
        decoded, _ = decode_packed(bytes(reader.read(name)), xt.shape, bits=8, block=32)
        assert np.all(np.abs(decoded - xt) <= half_step_bound(xt, 127.0, 32))
    compare = cli("inspect", out, "--compare", SINGLE, "--json")
    assert compare.code == 0, compare.out
    rows = {r["name"]: r for r in compare.json["compare"]["tensors"]}
    assert rows[gates[0]]["transposed"] and rows[gates[0]]["problem"] is None


def test_missing_input_is_an_input_error(tmp_path):
    lines = assert_user_error(cli("quantize", tmp_path / "nope.safetensors"), 3)
    assert "nope.safetensors" in lines[0]


def test_click_usage_errors_keep_exit_2():
    assert cli("quantize", SINGLE, "--device", "tpu").code == 2
    assert cli("quantize").code == 2
    assert cli("frobnicate").code == 2


def test_cuda_without_cuda_is_a_usage_error(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    lines = assert_user_error(cli("quantize", SINGLE, "-o", tmp_path / "c.bpk", "--device", "cuda"), 2)
    assert "CUDA" in lines[0] and "--device cpu" in lines[-1]
    no_leftovers(tmp_path, set())


def _interrupting_run(raise_it):
    """A CPU pipeline that yields one tensor, then is interrupted."""
    from qcli import pipeline

    real = pipeline.run

    def run(plan, source, measure=False):
        for i, item in enumerate(real(plan, source, measure)):
            if i == 1:
                raise_it()
            yield item

    return run


@pytest.mark.parametrize(
    "interrupt",
    [
        pytest.param(lambda: (_ for _ in ()).throw(KeyboardInterrupt()), id="SIGINT"),
        pytest.param(lambda: os.kill(os.getpid(), signal.SIGTERM), id="SIGTERM"),
    ],
)
def test_interruption_exits_130_and_leaves_the_target_untouched(tmp_path, monkeypatch, interrupt):
    from qcli import pipeline

    monkeypatch.setattr(pipeline, "run", _interrupting_run(interrupt))
    out = tmp_path / "t.bpk"
    out.write_bytes(b"old")
    lines = assert_user_error(cli("quantize", SINGLE, "-o", out, "--force", "--device", "cpu"), 130)
    assert lines[0] == "error: interrupted"
    assert out.read_bytes() == b"old"
    no_leftovers(tmp_path, {"t.bpk"})
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler is removed afterwards


def test_unexpected_errors_exit_70_and_qcli_debug_reraises(monkeypatch):
    from qcli import api

    def boom(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(api, "quantize_file", boom)
    lines = assert_user_error(cli("quantize", SINGLE), 70)
    assert lines[0] == "error: internal error: RuntimeError: boom"
    assert "QCLI_DEBUG=1" in lines[-1]
    monkeypatch.setenv("QCLI_DEBUG", "1")
    with pytest.raises(RuntimeError, match="boom"):
        cli("quantize", SINGLE)


def test_console_entry_point_in_a_fresh_interpreter(tmp_path):
    """`python -m qcli` goes through `main()`: JSON alone on stdout, errors as two lines and an exit code."""
    out = tmp_path / "t.bpk"
    result = cli_subprocess("quantize", SINGLE, "-o", out, "--device", "cpu", "--json")
    assert result.code == 0 and result.err == ""
    validate_json(json.loads(result.out))
    again = cli_subprocess("quantize", SINGLE, "-o", out)
    assert_user_error(again, 2)
    assert len(again.err.strip().splitlines()) == 2 and again.out == ""


def test_no_stats_skips_the_error_columns_but_not_the_bytes(tmp_path, written):
    one, _ = written
    out = tmp_path / "t.bpk"
    doc = cli("quantize", SINGLE, "-o", out, "--device", "cpu", "--no-stats", "--json").json
    validate_json(doc)
    assert all(t["rel_rms"] is None and t["sqnr_db"] is None for t in doc["tensors"])
    assert doc["timings"]["verify"]["bytes"] > 0  # the decode still runs, for the bound check
    assert out.read_bytes() == one.read_bytes()


def test_progress_reports_every_tensor_in_order(tmp_path):
    from qcli import api

    calls = []
    hook = lambda *args: calls.append(args)  # noqa: E731
    api.quantize_file(SINGLE, tmp_path / "p.bpk", device="cpu", stats=False, progress=hook)
    names = sorted(source_bytes())
    total = sum(len(b) for b in source_bytes().values())
    assert calls[0] == (names[0], 0, total)
    assert [c[0] for c in calls[1:]] == names[1:] + [None]
    assert [c[1] for c in calls] == sorted(c[1] for c in calls) and calls[-1][1:] == (total, total)


@pytest.mark.parametrize(
    ("env", "json_output", "tty", "enabled"),
    [
        ({}, False, True, True),
        ({}, True, True, False),
        ({}, False, False, False),
        ({"NO_COLOR": "1"}, False, True, False),
        ({"QCLI_NO_PROGRESS": "1"}, False, True, False),
    ],
)
def test_progress_draws_only_for_a_person(monkeypatch, env, json_output, tty, enabled):
    import sys

    from qcli.cli import _output

    for key in ("NO_COLOR", "QCLI_NO_PROGRESS"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: tty, raising=False)
    assert _output.progress_enabled(json_output) is enabled


def test_the_input_is_never_the_output(tmp_path):
    src = tmp_path / "m.safetensors"
    shutil.copy(SINGLE, src)
    lines = assert_user_error(cli("quantize", src, "-o", src, "--force"), 2)
    assert "is the input" in lines[0]
    assert src.read_bytes() == SINGLE.read_bytes()


def test_a_recipe_error_names_file_line_and_suggestion(tmp_path):
    recipe = tmp_path / "typo.toml"
    recipe.write_text('version = 1\n\n[[rule]]\nmatch = "*"\nvalue = "Q4S"\nblok = [32]\n')
    lines = assert_user_error(cli("quantize", SINGLE, "-o", tmp_path / "o.bpk", "--recipe", recipe), 2)
    assert f"{recipe}:6" in lines[0] and "blok" in lines[0]
    assert "block" in "\n".join(lines)
    no_leftovers(tmp_path, {"typo.toml"})


def test_plan_warnings_go_to_stderr(tmp_path):
    recipe = tmp_path / "w.toml"
    recipe.write_text('version = 1\n\n[[rule]]\nmatch = "*.vision[in, out].*"\nkeep = true\n')
    result = cli("quantize", SINGLE, "--dry-run", "--recipe", recipe)
    assert result.code == 0
    assert result.err.startswith("warning: ") and "matches no tensor" in result.err
    assert "vision[in, out]" in result.err
