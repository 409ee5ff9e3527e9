"""`import qcli`, `qcli --help` and `qcli validate-scheme RECIPE` (no --model) load neither torch nor triton;
a file an option names that is not there is refused before torch or transformers is loaded.

Each case runs in a fresh interpreter, so nothing imported by other tests can hide an import.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.cli_support import ROOT

RECIPE = """version = 1
[[rule]]
match = "*norm*"
keep = true
[[rule]]
match = "*"
preset = "q4s-b32"
"""

PROBE = """
import json, sys
{body}
print(json.dumps({{"code": code, "heavy": sorted(m for m in ("torch", "triton", "transformers") if m in sys.modules)}}))
"""


def probe(body: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE.format(body=body)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_cli(args: list[str]) -> str:
    return (
        "import io, contextlib\nfrom qcli.cli import run\n"
        f"with contextlib.redirect_stdout(io.StringIO()):\n    code = run({args!r})"
    )


def test_import_qcli_is_lean():
    assert probe("import qcli, qcli.cli, qcli.commands.quantize, qcli.commands.inspect, qcli.commands.validate_scheme, "
                 "qcli.pipeline.device, qcli.report.quantize\ncode = 0") == {"code": 0, "heavy": []}


@pytest.mark.parametrize("args", [["--help"], ["quantize", "--help"], ["inspect", "--help"], ["eval", "--help"],
                                  ["--version"]])
def test_help_is_lean(args):
    assert probe(run_cli(args)) == {"code": 0, "heavy": []}


def test_validate_scheme_without_model_is_lean(tmp_path):
    recipe = tmp_path / "r.toml"
    recipe.write_text(RECIPE)
    for fmt in ("text", "json", "github"):
        assert probe(run_cli(["validate-scheme", str(recipe), "--format", fmt])) == {"code": 0, "heavy": []}


def test_the_probe_sees_torch_when_it_is_imported():
    assert probe("import torch\ncode = 0")["heavy"] == ["torch"]


@pytest.mark.parametrize("args", [
    ["quantize", "sample_weights/tiny-llama-sharded", "--calibration", "gptq", "--calibration-data", "missing.txt"],
    ["quantize", "sample_weights/tiny-llama-sharded", "--calibration", "mse", "--calibration-data", "missing.txt"],
    ["quantize", "sample_weights/tiny-llama-sharded", "--calibration", "mse", "--imatrix", "missing.gguf"],
    ["quantize", "sample_weights/tiny-llama.safetensors", "--recipe", "missing.toml"],
    ["imatrix", "sample_weights/tiny-llama-sharded", "--calibration-data", "missing.txt"],
    ["eval", "sample_weights/tiny.bpk", "--against", "sample_weights/tiny-llama-sharded", "--text", "missing.txt"],
], ids=["gptq-text", "mse-text", "imatrix", "recipe", "imatrix-command", "eval-command"])
def test_a_missing_file_is_found_as_the_options_are_parsed(args):
    assert probe(run_cli(args)) == {"code": 2, "heavy": []}


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> str:
    """The sample model quantized with the defaults (in a process of its own: this one stays torch-free)."""
    target = tmp_path_factory.mktemp("lean") / "tiny.bpk"
    done = subprocess.run([sys.executable, "-m", "qcli", "quantize", "sample_weights/tiny-llama.safetensors",
                           "-o", str(target), "--device", "cpu", "--quiet"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return str(target)


# Header-only commands and refusals answer before torch is imported (its import alone takes seconds).
@pytest.mark.parametrize(("args", "code"), [
    (["inspect", "{bpk}"], 0),
    (["inspect", "{bpk}", "--json"], 0),
    (["inspect", "missing.bpk"], 3),
    (["inspect", "{bpk}", "--tensor", "missing"], 2),
    (["inspect", "{bpk}", "--compare", "missing.safetensors"], 3),
    (["inspect", "sample_weights/tiny-llama.safetensors"], 0),
    (["inspect", "sample_weights/tiny-llama-sharded", "--json"], 0),
    (["inspect", "missing.safetensors"], 3),
    (["quantize", "sample_weights/tiny-llama.safetensors", "-o", "{bpk}.new", "--dry-run"], 0),
    (["quantize", "sample_weights/tiny-llama.safetensors", "-o", "{bpk}"], 2),
    (["quantize", "sample_weights/tiny-llama.safetensors", "-o", "{bpk}.new", "--scheme", "missing"], 2),
    (["quantize", "missing.safetensors", "-o", "{bpk}.new"], 3),
], ids=["inspect-bpk", "inspect-bpk-json", "inspect-missing-bpk", "inspect-missing-tensor", "compare-missing",
        "inspect-safetensors", "inspect-sharded-json", "inspect-missing", "dry-run", "target-exists",
        "unknown-preset", "missing-input"])
def test_header_only_commands_and_refusals_do_not_import_torch(written, args, code):
    assert probe(run_cli([a.format(bpk=written) for a in args])) == {"code": code, "heavy": []}
