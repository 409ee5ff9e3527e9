"""`qcli quantize` through the real entry point: outputs, refusals, exit codes, and the bytes written.

Expectations come from qfloat-spec (serde form, payload lengths, the PackedU32 layout decoded by hand in
cli_support) and from the sample weights read independently; never from qcli's own output.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from qcli import BURN_VERSION, __version__
from qcli.io.dtypes import QFloat
from qcli.scheme import QuantValue
from tests.cli_support import (
    DRY_RUN_TARGET,
    SAMPLES,
    SHARDED,
    SINGLE,
    assert_user_error,
    child_env,
    cli,
    cli_subprocess,
    decode_packed,
    half_step_bound,
    packed_len,
    q_serde,
    source_bytes,
    source_tensors,
    table_rows,
    unwrapped,
    validate_json,
)

NORMS = ("input_layernorm", "post_attention_layernorm", "model.norm")
# The default policy writes the token embedding and the output head in 8 bits (q8s-b32) under a 4-bit preset.
WIDE = ("model.embed_tokens.weight", "lm_head.weight")


def default_bits(name: str) -> int:
    """Bits per value the default policy (q4s-b32) gives a matrix of the sample."""
    return 8 if name in WIDE else 4


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
        bits = default_bits(name)
        assert e.dtype.to_serde() == {"QFloat": q_serde(f"Q{bits}S", 32)}
        assert e.nbytes == len(payload) == packed_len(x.shape, bits, 32)
        decoded, _ = decode_packed(payload, x.shape, bits=bits, block=32)
        assert np.all(np.abs(decoded - x) <= half_step_bound(x, 2.0 ** (bits - 1) - 1, 32)), name


def test_metadata_map_records_producer_sources_and_layout(written):
    out, _ = written
    meta = read_bpk(out).metadata
    assert meta["producer"] == "qcli"
    assert meta["producer_version"] == __version__
    assert meta["burn_version"] == BURN_VERSION
    assert json.loads(meta["source_files"]) == [{"name": SINGLE.name, "bytes": SINGLE.stat().st_size}]
    assert meta["preset"] == "q4s-b32"
    assert json.loads(meta["transposed"]) == []
    assert "recipe_sha256" not in meta and "calibration" not in meta


def test_the_calibration_asked_for_is_recorded_without_calibration_data(tmp_path):
    out = tmp_path / "mse.bpk"
    assert cli("quantize", SINGLE, "-o", out, "--calibration", "mse", "--device", "cpu", "--no-verify").code == 0
    assert json.loads(read_bpk(out).metadata["calibration"]) == {
        "method": "mse", "file": None, "sha256": None, "samples": None, "seq_len": None, "seed": None}


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
        bits = default_bits(t["name"])
        assert t["scheme"] == q_serde(f"Q{bits}S", 32)
        decoded, _ = decode_packed(bytes(reader.read(t["name"])), x.shape, bits, 32)
        diff = (decoded - x).astype(np.float64)
        rel = math.sqrt((diff**2).sum() / (x.astype(np.float64) ** 2).sum())
        assert t["rel_rms"] == pytest.approx(rel, rel=1e-4)
        assert t["sqnr_db"] == pytest.approx(-20 * math.log10(rel), rel=1e-4)
        assert t["max_abs"] == pytest.approx(np.abs(diff).max(), rel=1e-4)


def test_summary_table_on_stdout(tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")  # room for every name whole
    # For flex, which runs the default preset: without it, stderr has wgpu's warning (docs/output.md).
    result = cli("quantize", SINGLE, "-o", tmp_path / "t.bpk", "--device", "cpu", "--burn-backend", "flex")
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
    assert "dry run" in result.out and "the tensors need" in result.out and "of memory at most" in result.out
    assert f"would write {tmp_path / 'm.bpk'}" in result.out
    rows = {row[0]: row for row in table_rows(result.out)}
    reasons = dict(table_rows(result.out.split("\nwhy ")[1]))  # the numbered reasons beneath the table
    assert rows["model.norm.weight"][2] == "keep" and "1-D" in reasons[rows["model.norm.weight"][3]]
    assert rows["lm_head.weight"][1:3] == ["1000×128", "Q8S [32] F16"]  # 8 bits by default
    assert rows["model.layers.0.mlp.up_proj.weight"][2] == "Q4S [32] F16"
    doc = cli("quantize", src, "--dry-run", "--json").json
    validate_json(doc)
    assert doc["dry_run"] and doc["timings"] is None
    # 1000×128 Q8S block [32] F16: 1000 rows of 32 words, plus 1000×4 f16 scales
    lm_head = next(t for t in doc["tensors"] if t["name"] == "lm_head.weight")
    assert lm_head["bytes_out"] == 1000 * 32 * 4 + 1000 * 4 * 2
    assert lm_head["bits_per_weight"] == pytest.approx(8.5)
    no_leftovers(tmp_path, {"m.safetensors"})


def test_existing_output_is_refused_without_force(tmp_path):
    out = tmp_path / "t.bpk"
    out.write_bytes(b"old")
    lines = assert_user_error(cli("quantize", SINGLE, "-o", out), 2)
    assert "already exists" in lines[0] and "--force" in lines[-1]
    assert out.read_bytes() == b"old"
    assert cli("quantize", SINGLE, "-o", out, "--force", "--device", "cpu").code == 0
    assert out.read_bytes()[:4] == b"NRUB"


@pytest.mark.parametrize("shards", [[], ["--max-shard-size", "300KB"]], ids=["file", "shards"])
def test_a_dry_run_refuses_an_existing_output_as_the_run_does(tmp_path, shards):
    """A dry run predicts its run (what CI runs it for): an output already there without --force is exit 2 in
    both, with the same error, and the file is as it was."""
    out = tmp_path / "t.bpk"
    first = Path(cli("quantize", SINGLE, "-o", out, *shards, "--dry-run", "--json").json["outputs"][0])
    first.write_bytes(b"old")
    dry = assert_user_error(cli("quantize", SINGLE, "-o", out, *shards, "--dry-run"), 2)
    run = assert_user_error(cli("quantize", SINGLE, "-o", out, *shards, "--device", "cpu"), 2)
    assert dry == run and f"{first} already exists" in dry[0] and "--force" in dry[-1]
    flex = ("--burn-backend", "flex")  # where the default preset computes: no backend warning beside
    doc = cli("quantize", SINGLE, "-o", out, *shards, *flex, "--dry-run", "--force", "--json").json
    assert doc["warnings"] == []
    validate_json(doc)
    assert first.read_bytes() == b"old"


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
    result = cli("quantize", SINGLE, "-o", DRY_RUN_TARGET, "--dry-run", "--recipe", recipe)
    lines = assert_user_error(result, 2)
    # one Lookup rule, and 8 attention projections whose last dim (128) block [48] cannot split
    assert "9 problems" in lines[0]
    problems = lines[1:-1]
    assert len(problems) == 9
    assert sum("lookup quantization does not travel" in p for p in problems) == 1
    assert sum("not a multiple of 48" in p and "bad.toml:" in p for p in problems) == 8


def test_unknown_and_codebook_presets_are_usage_errors():
    lines = assert_user_error(cli("quantize", SINGLE, "-o", DRY_RUN_TARGET, "--dry-run", "--scheme", "q4s-b23"), 2)
    assert "q4s-b23" in lines[0] and "q4s-b32" in "\n".join(lines)
    lines = assert_user_error(cli("quantize", SINGLE, "-o", DRY_RUN_TARGET, "--dry-run", "--scheme", "nf4"), 2)
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
        if not is_norm(e.name) and e.name not in WIDE:
            rows, cols = e.shape
            assert e.dtype.to_serde() == {"QFloat": fp4}
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
    assert "352×128 (T)" in dry.out
    assert "352×128 → 128×352 (T)" in cli("quantize", SINGLE, "-o", out, "--recipe", recipe, "--dry-run", "-v").out
    assert cli("quantize", SINGLE, "-o", out, "--recipe", recipe, "--device", "cpu").code == 0
    reader, sources = read_bpk(out), source_tensors()
    gates = [f"model.layers.{i}.mlp.gate_proj.weight" for i in range(2)]
    assert sorted(json.loads(reader.metadata["transposed"])) == gates
    assert reader.metadata["recipe_sha256"] == __import__("hashlib").sha256(recipe.read_bytes()).hexdigest()
    for name in gates:
        e = next(e for e in reader.entries() if e.name == name)
        xt = np.ascontiguousarray(sources[name].T)
        assert tuple(e.shape) == xt.shape == (128, 352)
        assert e.dtype.to_serde() == {"QFloat": q_serde("Q8S", 32)}
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
    from qcli.pipeline import cpu

    real = cpu.run

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
    from qcli.pipeline import cpu

    monkeypatch.setattr(cpu, "run", _interrupting_run(interrupt))
    out = tmp_path / "t.bpk"
    out.write_bytes(b"old")
    lines = assert_user_error(cli("quantize", SINGLE, "-o", out, "--force", "--device", "cpu"), 130)
    assert lines[0] == "error: interrupted"
    assert out.read_bytes() == b"old"
    no_leftovers(tmp_path, {"t.bpk"})
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handler is removed afterwards


def test_unexpected_errors_exit_70_and_qcli_debug_reraises(monkeypatch):
    from qcli.commands import quantize

    def boom(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(quantize, "quantize", boom)
    lines = assert_user_error(cli("quantize", SINGLE), 70)
    assert lines[0] == "error: internal error: RuntimeError: boom"
    assert "QCLI_DEBUG=1" in lines[-1]
    monkeypatch.setenv("QCLI_DEBUG", "1")
    with pytest.raises(RuntimeError, match="boom"):
        cli("quantize", SINGLE)


def test_console_entry_point_in_a_fresh_interpreter(tmp_path):
    """`python -m qcli` goes through `main()`: JSON alone on stdout, errors as two lines and an exit code."""
    out = tmp_path / "t.bpk"
    result = cli_subprocess("quantize", SINGLE, "-o", out, "--device", "cpu", "--json", "--burn-backend", "flex")
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
    from qcli.commands.quantize import quantize_file

    calls = []
    hook = lambda *args: calls.append(args)  # noqa: E731
    quantize_file(SINGLE, tmp_path / "p.bpk", device="cpu", stats=False, progress=hook)
    names = sorted(source_bytes())
    total = sum(len(b) for b in source_bytes().values())
    assert calls[0] == (names[0], 0, total)
    assert [c[0] for c in calls[1:]] == names[1:] + [None]
    assert [c[1] for c in calls] == sorted(c[1] for c in calls) and calls[-1][1:] == (total, total)


@pytest.mark.parametrize(
    ("env", "options", "tty", "enabled"),
    [
        ({}, {}, True, True),
        ({}, {"json": True}, True, False),  # a document for a program: no run of it is watched
        ({}, {"quiet": True}, True, False),
        ({}, {}, False, False),
        ({"NO_COLOR": "1"}, {}, True, False),
        ({"QCLI_NO_PROGRESS": "1"}, {}, True, False),
    ],
)
def test_progress_draws_only_for_a_person(monkeypatch, env, options, tty, enabled):
    import sys

    from qcli.cli import _output

    for key in ("NO_COLOR", "QCLI_NO_PROGRESS"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: tty, raising=False)
    assert _output.progress_enabled(**options) is enabled


def test_the_input_is_never_the_output(tmp_path):
    src = tmp_path / "m.safetensors"
    shutil.copy(SINGLE, src)
    lines = assert_user_error(cli("quantize", src, "-o", src, "--force"), 2)
    assert "is the input" in lines[0]
    assert src.read_bytes() == SINGLE.read_bytes()


def test_a_burnpack_given_as_a_checkpoint_is_refused_as_qcli_output(tmp_path):
    """By its suffix, or (renamed) by burnpack's magic number, burn-store's u32 0x4255524E little-endian, for
    every command that reads a checkpoint: before the output beside it (the input itself) is looked at."""
    named = tmp_path / "m.bpk"
    named.write_bytes(b"NRUB" + bytes(60))
    renamed = tmp_path / "weights"
    renamed.write_bytes(named.read_bytes())
    recipe = SINGLE.with_name("tiny-llama.toml")
    for command in (["quantize", named], ["quantize", renamed, "-o", tmp_path / "x.bpk", "--force"],
                    ["validate-scheme", recipe, "--model", named], ["imatrix", named, "--calibration-data", recipe]):
        lines = assert_user_error(cli(*command), 2)
        assert "is a burnpack (.bpk) file, which qcli writes" in lines[0], lines
        assert lines[-1].startswith("hint: `qcli inspect ") and "give the checkpoint it was written from" in lines[-1]
    assert named.read_bytes() == b"NRUB" + bytes(60) and not (tmp_path / "x.bpk").exists()


def test_an_output_named_without_a_suffix_or_slash_is_refused_not_guessed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    lines = assert_user_error(cli("quantize", SINGLE, "-o", "mydir", "--dry-run"), 2)
    assert lines == ["error: -o mydir names neither a .bpk file nor a folder",
                     "hint: write -o mydir/ for a model folder, or -o mydir.bpk for a file"]
    assert os.listdir(tmp_path) == []
    (tmp_path / "mine").write_bytes(b"x")  # an existing file is the file named, replaced under --force
    assert cli("quantize", SINGLE, "-o", "mine", "--dry-run", "--force").code == 0


def test_a_refusals_requantize_hint_names_the_users_own_preset(tmp_path):
    """GGUF Q4_1 (a minimum per block: no Burn scheme) is refused with `--requantize`: into q4s-b32 by
    default, into the user's own preset where one was asked for, and the run that takes the hint plans."""
    import numpy as np
    from gguf import GGMLQuantizationType

    from tests.gguf_support import write_gguf

    source = tmp_path / "m.gguf"
    write_gguf(source, {"blk.0.ffn_up.weight": (np.linspace(-1, 1, 64 * 128, dtype=np.float32).reshape(64, 128),
                                                GGMLQuantizationType.Q4_1)})
    for scheme, offered in ((), "q4s-b32"), (("--scheme", "q8s-b32"), "q8s-b32"):
        lines = assert_user_error(cli("quantize", source, "--dry-run", *scheme), 2)
        assert f"--requantize {offered} (" in lines[-1], lines
        assert cli("quantize", source, "--dry-run", *scheme, "--requantize", offered).code == 0


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
    result = cli("quantize", SINGLE, "-o", DRY_RUN_TARGET, "--dry-run", "--recipe", recipe)
    assert result.code == 0
    assert result.err.startswith("warning:") and "matches no tensor" in result.warnings[0]
    assert "vision[in, out]" in result.warnings[0]


def test_a_tensor_whose_scales_f16_cannot_hold_is_a_warning(tmp_path):
    """Values near 1e-9 need block scales near 1e-10, below F16's smallest (2^-24): the decode is all zeros,
    so its SQNR is exactly 0 dB; values near 1e8 need scales above F16's largest and are clipped."""
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(5)
    src = tmp_path / "range.safetensors"
    save_file({"tiny.weight": torch.randn(64, 64, generator=g) * 1e-9,
               "huge.weight": torch.randn(64, 64, generator=g) * 1e8,
               "fine.weight": torch.randn(64, 64, generator=g)}, str(src))
    out = tmp_path / "range.bpk"
    result = cli("quantize", src, "-o", out, "--scheme", "q4s-b32", "--device", "cpu")
    assert result.code == 0, result.err
    lines = result.warnings
    tiny = next(line for line in lines if "'tiny.weight'" in line)
    assert tiny.startswith("warning: tensor 'tiny.weight': 128 of 128 blocks need a scale below F16's smallest")
    assert "SQNR 0.0 dB" in tiny and "BF16 or F32 scales, which hold them (a recipe rule's block_scale)" in tiny
    huge = next(line for line in lines if "'huge.weight'" in line)
    assert "128 of 128 blocks need a scale above F16's largest, 65504" in huge and "clipped" in huge
    assert not any("'fine.weight'" in line for line in lines)
    from qcli.io.burnpack import BurnpackReader

    values, scales = decode_packed(bytes(BurnpackReader.open(out).read("tiny.weight")), (64, 64), 4, 32)
    assert not values.any() and (scales == 2.0**-24).all()  # every scale rounded up to F16's smallest
    doc = cli("quantize", src, "-o", out, "--force", "--scheme", "q4s-b32", "--device", "cpu", "--json").json
    validate_json(doc)
    warned = {w["tensors"][0]: w for w in doc["warnings"] if w["kind"] == "scale-range"}
    assert sorted(warned) == ["huge.weight", "tiny.weight"]
    assert all(w["severity"] == "warning" and w["hint"] for w in warned.values())
    sqnr = {t["name"]: t["sqnr_db"] for t in doc["tensors"]}
    assert sqnr["tiny.weight"] == 0.0 and f"SQNR {sqnr['huge.weight']:.1f} dB" in warned["huge.weight"]["message"]


# ----------------------------------------------------------------------------- daily use, round two


def test_larger_blocks_never_give_a_larger_file_than_q4s_b32(tmp_path):
    """down_proj's rows of 352 take no block of 64 or 128: the default policy falls back to blocks of 32."""
    sizes, docs = {}, {}
    for preset in ("q4s-b32", "q4s-b64", "q4s-b128"):
        out = tmp_path / f"{preset}.bpk"
        result = cli("quantize", SINGLE, "-o", out, "--scheme", preset, "--device", "cpu", "--json")
        assert result.code == 0, result.err
        sizes[preset], docs[preset] = out.stat().st_size, result.json
    assert sizes["q4s-b64"] <= sizes["q4s-b32"] and sizes["q4s-b128"] <= sizes["q4s-b32"]
    for preset in ("q4s-b64", "q4s-b128"):
        down = next(t for t in docs[preset]["tensors"] if t["name"] == "model.layers.0.mlp.down_proj.weight")
        assert down["scheme"] == q_serde("Q4S", 32)
        assert down["reason"] == (f"default: BF16 tensor of rank 2 -> {preset} → block [32]: 352 is not a multiple "
                                  f"of {preset[5:]}")
        assert docs[preset]["totals"]["kept"] == 5  # the norms only


CAST_RECIPE = """version = 1

[[rule]]
match = "*norm*"
keep = true
cast = "F32"
"""


def test_cast_writes_kept_norms_as_f32_and_inspect_compares_with_the_cast(tmp_path):
    import torch
    from safetensors.torch import load_file

    recipe = tmp_path / "cast.toml"
    recipe.write_text(CAST_RECIPE)
    out = tmp_path / "cast.bpk"
    result = cli("quantize", SINGLE, "-o", out, "--recipe", recipe, "--device", "cpu", "--json")
    assert result.code == 0, result.err
    reader, sources = read_bpk(out), load_file(SINGLE)
    norms = [e for e in reader.entries() if is_norm(e.name)]
    assert len(norms) == 5
    for e in norms:
        assert (e.dtype, e.nbytes) == ("F32", 128 * 4)
        assert bytes(reader.read(e.name)) == sources[e.name].to(torch.float32).numpy().tobytes()
    row = next(t for t in result.json["tensors"] if t["name"] == "model.norm.weight")
    assert (row["bytes_out"], row["bits_per_weight"]) == (512, 32.0)
    assert row["reason"] == f"rule {recipe}:3: keep, cast BF16 to F32"
    compare = cli("inspect", out, "--compare", SINGLE, "--json")
    assert compare.code == 0, compare.out
    assert all(r["problem"] is None for r in compare.json["compare"]["tensors"])


def test_ndarray_loads_a_bf16_model_with_its_kept_norms_cast_to_f32(tmp_path):
    dry_run = ("quantize", SINGLE, "-o", DRY_RUN_TARGET, "--dry-run", "--burn-backend", "ndarray",
               "--scheme", "q8s-b32")
    lines = assert_user_error(cli(*dry_run), 2)
    assert "ndarray has no F16 or BF16 tensors" in "\n".join(lines) and 'cast = "F32"' in lines[-1]
    recipe = tmp_path / "ndarray.toml"
    recipe.write_text('version = 1\n[defaults]\ncast_kept = "F32"\n')
    result = cli(*dry_run, "--recipe", recipe)
    assert result.code == 0, result.err


def _cast_checkpoint(folder: Path) -> Path:
    """F32 tensors whose values sit on F16 and BF16 rounding ties, one 2-D to be transposed."""
    import torch
    from safetensors.torch import save_file

    ties = torch.tensor([1 + 2**-11, 1 + 3 * 2**-11, 1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-11), 0.1, 3e-8, 65504.0],
                        dtype=torch.float32)
    generator = torch.Generator().manual_seed(1)
    tensors = {
        "a.norm": ties,
        "b.table": (torch.randn(6, 8, generator=generator) * 100).to(torch.float32),
        "c.weight": torch.randn(16, 64, generator=generator),
        "d.bias": torch.randn(64, generator=generator).to(torch.float64),
        "e.table": torch.randn(32, 8, generator=generator),
    }
    path = folder / "cast.safetensors"
    save_file(tensors, path)
    return path


CAST_EVERY = """version = 1

[[rule]]
match = "a.*"
keep = true
cast = "F16"

[[rule]]
match = "b.*"
keep = true
cast = "BF16"
transpose = true

[[rule]]
match = "d.*"
keep = true
cast = "F32"

[[rule]]
match = "e.*"
keep = true
cast = "F16"
"""


def test_cast_rounds_to_nearest_even_as_torch_does(tmp_path):
    import torch
    from safetensors.torch import load_file

    source = _cast_checkpoint(tmp_path)
    recipe = tmp_path / "every.toml"
    recipe.write_text(CAST_EVERY)
    out = tmp_path / "cpu.bpk"
    assert cli("quantize", source, "-o", out, "--recipe", recipe, "--device", "cpu").code == 0
    reader, x = read_bpk(out), load_file(source)
    entries = {e.name: e for e in reader.entries()}
    f16 = np.frombuffer(bytes(reader.read("a.norm")), dtype="<f2")
    assert f16[:5].tolist() == [1.0, 1 + 2**-9, 1 + 2**-8, 1 + 3 * 2**-8, -1.0]  # ties go to the even mantissa
    assert bytes(reader.read("a.norm")) == x["a.norm"].to(torch.float16).numpy().tobytes()
    assert (entries["b.table"].dtype, tuple(entries["b.table"].shape)) == ("BF16", (8, 6))
    assert bytes(reader.read("b.table")) == x["b.table"].t().contiguous().to(torch.bfloat16).view(torch.uint16) \
        .numpy().tobytes()
    assert bytes(reader.read("d.bias")) == x["d.bias"].to(torch.float32).numpy().tobytes()
    assert bytes(reader.read("e.table")) == x["e.table"].to(torch.float16).numpy().tobytes()
    assert cli("inspect", out, "--compare", source).code == 0


@pytest.mark.interpreter
def test_the_gpu_pipeline_casts_as_the_cpu_pipeline_does(tmp_path):
    source = _cast_checkpoint(tmp_path)
    recipe = tmp_path / "every.toml"
    recipe.write_text(CAST_EVERY)
    cpu, triton = tmp_path / "cpu.bpk", tmp_path / "triton.bpk"
    assert cli("quantize", source, "-o", cpu, "--recipe", recipe, "--device", "cpu", "--no-stats").code == 0
    # Pieces of 64 bytes: e.table's rows of 32 bytes are read (and cast) two at a time.
    env = {"QCLI_KERNELS": "triton", "TRITON_INTERPRET": "1", "QCLI_PIECE_BYTES": "64"}
    result = cli_subprocess("quantize", source, "-o", triton, "--recipe", recipe, "--no-stats", "--json", env=env)
    assert result.code == 0, result.err
    assert '"device": "triton"' in result.out
    assert triton.read_bytes() == cpu.read_bytes()


def test_a_cast_that_overflows_is_an_input_error(tmp_path):
    import torch
    from safetensors.torch import save_file

    source = tmp_path / "big.safetensors"
    save_file({"n.norm": torch.tensor([1.0, 70000.0])}, source)
    recipe = tmp_path / "f16.toml"
    recipe.write_text('version = 1\n[[rule]]\nmatch = "*"\nkeep = true\ncast = "F16"\n')
    lines = assert_user_error(cli("quantize", source, "-o", tmp_path / "o.bpk", "--recipe", recipe, "--device", "cpu"),
                              3)
    assert "70000" in lines[0] and "F16" in lines[0] and "wider dtype" in lines[-1]
    no_leftovers(tmp_path, {"big.safetensors", "f16.toml"})


def test_cast_of_an_integer_tensor_is_refused_before_anything_is_read(tmp_path, small_checkpoint, no_weight_reads):
    recipe = tmp_path / "ints.toml"
    recipe.write_text('version = 1\n[[rule]]\nmatch = "*"\nkeep = true\ncast = "F32"\n')
    lines = assert_user_error(cli("quantize", small_checkpoint, "-o", tmp_path / "o.bpk", "--recipe", recipe), 2)
    assert lines[0] == "error: the plan has 1 problem; no weight was read and nothing was written"
    assert lines[1].strip() == (f"{recipe}:2: rule (match '*') asks to cast 2 tensors (norm1.num_batches_tracked, "
                                "positions) to F32, which are not floating (I64); cast converts F64, F32, F16 and "
                                "BF16 tensors only")
    assert "drop cast" in lines[-1]


def test_cast_with_a_scheme_is_a_recipe_error(tmp_path):
    recipe = tmp_path / "bad.toml"
    recipe.write_text('version = 1\n[[rule]]\nmatch = "*"\npreset = "q8s-b32"\ncast = "F32"\n')
    lines = assert_user_error(cli("quantize", SINGLE, "-o", DRY_RUN_TARGET, "--dry-run", "--recipe", recipe), 2)
    assert lines[0] == f"error: {recipe}:5: cast needs keep = true: it sets the dtype a kept tensor is written in"


def test_quantize_warns_about_a_rule_that_quantizes_nothing_and_a_plan_that_quantizes_nothing(tmp_path):
    recipe = tmp_path / "w.toml"
    recipe.write_text('version = 1\n[[rule]]\nmatch = "*.mlp.*"\nvalue = "Q8S"\nblock = [48]\nblock_scale = "F16"\n')
    result = cli("quantize", SINGLE, "-o", DRY_RUN_TARGET, "--dry-run", "--recipe", recipe)
    assert result.code == 0
    assert any(w.startswith(f"warning: {recipe}:2: rule (match '*.mlp.*') matches 6 tensors") for w in result.warnings)
    assert "but quantizes none of them with Q8S PackedU32(0) block [48] F16: model.layers.0.mlp.down_proj.weight " \
        "[128, 352]: last dim 352 is not a multiple of 48 (block [48])" in unwrapped(result.err)
    recipe.write_text('version = 1\n[[rule]]\nmatch = "*"\nkeep = true\n')
    result = cli("quantize", SINGLE, "-o", DRY_RUN_TARGET, "--dry-run", "--recipe", recipe)
    assert result.code == 0
    assert result.warnings[-1].startswith("warning: nothing is quantized: all 21 tensors (lm_head.weight, ")


def test_a_llama_cpp_scheme_name_is_refused_naming_the_burn_preset():
    lines = assert_user_error(cli("quantize", SINGLE, "-o", DRY_RUN_TARGET, "--dry-run", "--scheme", "Q4_K_M"), 2)
    assert lines[0].startswith("error: Q4_K_M is a llama.cpp K-quant mix, refused: ")
    assert lines[-1].startswith("hint: use q4s-b32 (")
    lines = assert_user_error(cli("quantize", SINGLE, "-o", DRY_RUN_TARGET, "--dry-run", "--scheme", "fp8"), 2)
    assert lines[-1].startswith("hint: use e4m3: ") and "nvfp4" not in lines[-1]


TWO_LEVEL_RECIPE = """version = 1

[[rule]]
match = "*.mlp.*_proj.weight"
value = "E2M1"
block = [16]
block_scale = "UE4M3"
tensor_scale = "F32"
"""


def test_burn_0_21_gets_both_key_sets_and_its_version_in_the_metadata(tmp_path):
    """Burn 0.21 reads `param` and `level` (cubecl-common 0.10 scheme.rs), 0.22 `tensor` and `block`."""
    out = tmp_path / "old.bpk"
    assert cli("quantize", SINGLE, "-o", out, "--scheme", "q8s", "--burn-version", "0.21", "--device", "cpu").code == 0
    reader = read_bpk(out)
    assert reader.metadata["burn_version"] == "0.21.0"
    weight = next(e for e in reader.entries() if e.name == "lm_head.weight").dtype.to_serde()["QFloat"]
    assert weight["param"] == "F32" and weight["level"] == "Tensor"
    assert weight["tensor"] == "F32" and weight["block"] is None


def test_burn_0_21_has_no_two_level_scheme(tmp_path):
    recipe = tmp_path / "two.toml"
    recipe.write_text(TWO_LEVEL_RECIPE)
    args = ["quantize", SINGLE, "-o", tmp_path / "o.bpk", "--recipe", recipe, "--burn-version", "0.21.0"]
    lines = assert_user_error(cli(*args), 2)
    assert "Burn 0.21.0 has no two-level scheme" in "\n".join(lines)
    assert not (tmp_path / "o.bpk").exists()
    assert cli(*args[:-2], "--dry-run").code == 0  # the default release holds it


def test_an_unknown_burn_version_is_a_usage_error(tmp_path):
    lines = assert_user_error(cli("quantize", SINGLE, "-o", tmp_path / "o.bpk", "--burn-version", "0.19"), 2)
    assert "0.22.1" in lines[-1] and "0.21.0" in lines[-1]


def test_a_killed_runs_temporary_file_is_reported_and_removed_by_the_next_run(tmp_path):
    """SIGKILL leaves `.NAME.PID-N.tmp` behind (no handler runs): the next run to the same target names
    it and removes it; a dry run only names it; a running writer's file is left alone."""
    target = tmp_path / "model.bpk"
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # a process id that no longer runs
    leftover = tmp_path / f".model.bpk.{child.pid}-0.tmp"
    leftover.write_bytes(bytes(1000))
    live = tmp_path / f".model.bpk.{os.getpid()}-7.tmp"
    live.write_bytes(b"being written")
    dry = cli("quantize", SINGLE, "-o", target, "--dry-run")
    assert dry.code == 0 and f"would remove {leftover.name}" in dry.err and leftover.exists()
    done = cli("quantize", SINGLE, "-o", target, "--device", "cpu")
    assert done.code == 0 and f"removed {leftover.name}" in done.err
    assert not leftover.exists() and live.exists() and target.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([target.name, live.name])


# --- Daily use and hostile input, round two ---


@pytest.mark.parametrize(
    "args",
    [
        ("quantize", SINGLE, "--frobnicate"),
        ("quantize",),
        ("quantize", SINGLE, "--burn-backend", "foo"),
        ("quantize", SINGLE, "--device", "gpu"),
        ("frobnicate",),
    ],
    ids=["unknown-option", "missing-argument", "bad-backend", "bad-device", "unknown-command"],
)
def test_click_parse_errors_are_one_error_and_one_hint_line(args):
    result = cli(*args)
    lines = assert_user_error(result, 2)
    assert len(lines) == 2, result.err
    assert "--help" in lines[1]


@pytest.mark.parametrize(("args", "error", "hint"), [
    (("quantize", SINGLE, "--calibration", "gtpq"), "--calibration: 'gtpq' is not one of minmax, absmean, mse, gptq",
     "did you mean --calibration gptq? run 'qcli quantize --help' for the usage"),
    (("quantize", SINGLE, "--burn-backend", "WGU"), "--burn-backend: 'WGU' is not one of flex, ndarray, wgpu, cuda",
     "did you mean --burn-backend wgpu? run 'qcli quantize --help' for the usage"),
    (("inspect", SINGLE, "--names", "x"), "--names: 'x' is not one of file, hf",
     "run 'qcli inspect --help' for the usage"),
    (("validate-scheme", SINGLE, "--format", "githb"), "--format: 'githb' is not one of text, json, github",
     "did you mean --format github? run 'qcli validate-scheme --help' for the usage"),
    (("imatrix", SINGLE, "--calibration-data", SINGLE, "--device", "cdua"), "--device: 'cdua' is not one of auto, cpu, "
     "cuda", "did you mean --device cuda?"),
], ids=["calibration", "backend", "names", "format", "imatrix-device"])
def test_a_bad_choice_is_said_in_qclis_words_with_the_closest_choice(args, error, hint):
    """Every enum-like option, parsed by Typer or by qcli, one wording: the choices and difflib's closest."""
    assert assert_user_error(cli(*args), 2) == [f"error: {error}", f"hint: {hint}"]


def test_an_unknown_option_hint_offers_the_close_one():
    lines = assert_user_error(cli("quantize", SINGLE, "--forse"), 2)
    assert len(lines) == 2 and "--force" in lines[1] and "--help" in lines[1]


def test_json_failure_prints_an_error_document_too(tmp_path):
    out = tmp_path / "t.bpk"
    out.write_bytes(b"old")
    result = cli("quantize", SINGLE, "-o", out, "--json")
    lines = assert_user_error(result, 2)
    assert len(lines) == 2
    doc = result.json
    validate_json(doc)
    assert doc["command"] == "quantize" and doc["error"]["exit_code"] == 2
    assert "already exists" in doc["error"]["message"] and "--force" in doc["error"]["hint"]


@pytest.fixture(scope="module")
def many_tensors(tmp_path_factory) -> Path:
    """A checkpoint of 40 matrices, layers.0 to layers.39, so the default summary is shorter than the table."""
    import torch
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(7)
    tensors = {f"model.layers.{i}.weight": torch.randn(8, 64, generator=generator) * (1 + i) for i in range(40)}
    path = tmp_path_factory.mktemp("many") / "many.safetensors"
    save_file(tensors, path)
    return path


def table_names(out: str) -> list[str]:
    return [row[0] for row in table_rows(out)]


def test_default_output_is_a_summary_with_the_worst_tensors(tmp_path, many_tensors):
    result = cli("quantize", many_tensors, "-o", tmp_path / "m.bpk", "--device", "cpu")
    assert result.code == 0, result.err
    names = table_names(result.out)
    doc = cli("quantize", many_tensors, "-o", tmp_path / "j.bpk", "--device", "cpu", "--json").json
    worst = sorted(doc["tensors"], key=lambda t: t["sqnr_db"])[:5]
    assert sorted(names) == sorted(t["name"] for t in worst)
    order = [int(n.split(".")[2]) for n in names]
    assert order == sorted(order)  # natural order: layers.2 before layers.10
    assert "40 tensors: 40 quantized" in result.out and f"wrote {tmp_path / 'm.bpk'}" in result.out


def test_verbose_prints_every_tensor_in_natural_order(tmp_path, many_tensors):
    result = cli("quantize", many_tensors, "-o", tmp_path / "m.bpk", "--device", "cpu", "--verbose")
    assert result.code == 0, result.err
    assert table_names(result.out) == [f"model.layers.{i}.weight" for i in range(40)]


def test_quiet_prints_only_the_wrote_line(tmp_path, many_tensors):
    result = cli("quantize", many_tensors, "-o", tmp_path / "m.bpk", "--device", "cpu", "--quiet")
    assert result.code == 0, result.err
    assert result.out.strip().splitlines() == [f"wrote {tmp_path / 'm.bpk'}"]


def test_default_dry_run_counts_the_decisions(many_tensors):
    result = cli("quantize", many_tensors, "--dry-run")
    assert result.code == 0, result.err
    assert table_names(result.out) == []
    assert "40 × Q4S PackedU32(0) block [32] F16" in result.out
    assert "would write" in result.out


@pytest.mark.parametrize("columns", ["80", "0", "1", "garbage", None], ids=lambda c: f"COLUMNS={c}")
@pytest.mark.parametrize("dry_run", [False, True], ids=["run", "dry-run"])
def test_default_summary_fits_80_columns_a_row_a_line(tmp_path, columns, dry_run):
    """Piped, or under a COLUMNS that is no width, the summary is 80 columns wide: every tensor a line,
    its name whole or elided in the middle but told apart from every other, no number cut."""
    env = {"COLUMNS": columns} if columns is not None else {}
    args = ("quantize", SINGLE, "-o", tmp_path / "t.bpk", "--device", "cpu") + (("--dry-run",) if dry_run else ())
    result = cli_subprocess(*args, "--recipe", SAMPLES / "tiny-llama.toml", env=env)
    assert result.code == 0, result.err
    assert max(len(line) for line in result.out.splitlines()) <= 80, result.out
    rows = table_rows(result.out)
    assert len({row[0] for row in rows}) == len(rows) == 21

    def shows(shown: str, name: str) -> bool:  # each `…` stands for what was left out
        return re.fullmatch(".+".join(map(re.escape, shown.split("…"))), name) is not None

    names = list(source_tensors())
    assert sorted(next(n for n in names if shows(row[0], n)) for row in rows) == sorted(names)
    assert all(sum(shows(row[0], n) for n in names) == 1 for row in rows), rows  # each row tells its tensor
    doc = cli(*args, "--recipe", SAMPLES / "tiny-llama.toml", "--json", "--force").json
    numbers = [f"{t['bits_per_weight']:.2f}" for t in doc["tensors"]]
    assert sorted(row[-1 if dry_run else -2] for row in rows) == sorted(numbers)
    assert "21 tensors: 16 quantized, 5 kept, 8 transposed" in result.out
    assert ("would write" if dry_run else "wrote") in result.out


def test_show_completion_prints_the_script_for_the_shell_that_runs_qcli():
    """Typer's --show-completion tells the shell from qcli's parent process: bash here (kept as the parent by
    the `exit` after the command, which bash would otherwise exec in its own place)."""
    shown = subprocess.run(["bash", "-c", f"{shlex.quote(sys.executable)} -m qcli --show-completion; exit $?"],
                           capture_output=True, text=True, env=child_env(), timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert "complete -o default -F _qcli_completion qcli" in shown.stdout
    assert "_QCLI_COMPLETE=complete_bash" in shown.stdout


def test_dry_run_refuses_a_missing_output_directory_as_the_real_run_does(tmp_path):
    out = tmp_path / "missing" / "t.bpk"
    real = assert_user_error(cli("quantize", SINGLE, "-o", out, "--device", "cpu"), 4)
    dry = assert_user_error(cli("quantize", SINGLE, "-o", out, "--dry-run"), 4)
    assert dry[0] == real[0]
    assert not (tmp_path / "missing").exists()


def test_a_safetensors_output_name_warns_that_a_burnpack_is_written(tmp_path):
    out = tmp_path / "x.safetensors"
    dry = cli("quantize", SINGLE, "-o", out, "--dry-run")
    assert dry.code == 0 and "warning:" in dry.err and "burnpack" in dry.err
    real = cli("quantize", SINGLE, "-o", out, "--device", "cpu")
    assert real.code == 0 and "warning:" in real.err and "burnpack" in real.err


def test_the_completion_script_completes_commands_and_choices():
    env = {"_QCLI_COMPLETE": "complete_bash", "COMP_WORDS": "qcli quantize --device ", "COMP_CWORD": "3"}
    result = cli_subprocess(env=env)
    assert result.code == 0, result.err
    assert result.out.split() == ["auto", "cpu", "cuda"]


def test_a_run_reports_its_peak_memory_apart_from_the_runtime(tmp_path):
    result = cli("quantize", SINGLE, "-o", tmp_path / "m.bpk", "--device", "cpu", "--json")
    memory = result.json["memory"]
    assert memory["runtime_bytes"] > 0 and memory["peak_bytes"] >= memory["runtime_bytes"]
    assert memory["tensors_bytes"] == memory["peak_bytes"] - memory["runtime_bytes"]
    printed = cli("quantize", SINGLE, "-o", tmp_path / "n.bpk", "--device", "cpu")
    assert "peak memory " in printed.out and "beside the runtime's" in printed.out
    assert cli("quantize", SINGLE, "-o", DRY_RUN_TARGET, "--dry-run", "--json").json["memory"] is None


def test_calibration_mse_lowers_the_error_an_independent_decoder_sees(tmp_path):
    """`--calibration mse` on q4f-b32: the file decoded by the tests' own numpy decoder errs less than
    MinMax's on every quantized tensor of the sample, some scales are negative (a positive amax on -8),
    and --verify passes."""
    errors = {}
    for calibration in ("minmax", "mse"):
        out = tmp_path / f"{calibration}.bpk"
        result = cli("quantize", SINGLE, "-o", out, "--device", "cpu", "--scheme", "q4f-b32",
                     "--calibration", calibration, "--json")
        assert result.code == 0, result.err
        reader = read_bpk(out)
        source = source_tensors()
        for entry in reader.entries():
            if isinstance(entry.dtype, QFloat) and entry.dtype.scheme.value is QuantValue.Q4F:
                values, scales = decode_packed(bytes(reader.read(entry.name)), tuple(entry.shape), 4, 32)
                x = source[entry.name].astype(np.float64)
                errors.setdefault(entry.name, {})[calibration] = (np.sum((x - values) ** 2), (scales < 0).any())
    assert errors
    for name, by in errors.items():
        assert by["mse"][0] < by["minmax"][0], name
        assert not by["minmax"][1]
    assert any(by["mse"][1] for by in errors.values())


def test_an_unknown_calibration_is_a_usage_error(tmp_path):
    lines = assert_user_error(cli("quantize", SINGLE, "-o", tmp_path / "o.bpk", "--calibration", "rtn"), 2)
    assert "mse" in "\n".join(lines)
