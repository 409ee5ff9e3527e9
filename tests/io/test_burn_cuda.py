"""Burn 0.21's cuda backend in qcli's capability table, held to what Burn did on an NVIDIA GPU (CI has none).

tests/burn-0.21, built with its `cuda` feature, ran on an NVIDIA H100 (tests/data/burn/cuda-0.21/run.json):
`probe` on bench.burn_sweep's Burn 0.21 sweep and `compute` on its compute cases (docs/output.md). The
directory keeps what Burn returned: its decode of every case and its verdicts. The sweep written here must be
the bytes that ran there, and the table must say exactly what decoded and what computed, both ways, as
tests/io/test_burn_backends.py holds the backends CI runs.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from safetensors.torch import load_file

from bench import burn_sweep
from bench.burn_sweep import COMPUTED, QUANTIZED, TOLERANCE, computed
from qcli.burn_backends import CAPABILITIES, BurnBackend, compute_failures, decode_problem, kept_problem
from qcli.io.dtypes import Plain
from tests.burn_harness import FIXTURES, same_bits
from tests.cli_support import cli
from tests.conftest import SAMPLES

RECORD = FIXTURES / "cuda-0.21"
VERSION = "0.21.0"
CUDA = BurnBackend.cuda


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def written(tmp_path: Path) -> Path:
    """The sweep and compute cases as qcli writes them today, checked to be the bytes Burn ran."""
    burn_sweep.write(tmp_path, VERSION)
    burn_sweep.write_computed(tmp_path, BurnBackend.wgpu, VERSION)
    ran = json.loads((RECORD / "run.json").read_text())["inputs_sha256"]
    for name, digest in ran.items():
        assert hashlib.sha256((tmp_path / name).read_bytes()).hexdigest() == digest, name
    return tmp_path


def test_the_cuda_table_says_exactly_what_burn_decoded_there(tmp_path: Path) -> None:
    expected = load_file(written(tmp_path) / "expected.safetensors")
    decoded = load_file(RECORD / "burn.safetensors")
    verdicts = lines(RECORD / "verdicts.jsonl")
    assert {v["name"] for v in verdicts} == set(expected)
    wrong = []
    for verdict in verdicts:
        name = verdict["name"]
        loads = verdict["ok"] and name in decoded and same_bits(decoded[name], expected[name])
        table = (kept_problem(CUDA, Plain(name.removeprefix("kept ")), VERSION) if name.startswith("kept ")
                 else decode_problem(CUDA, *QUANTIZED[name], VERSION))
        if loads != (table is None):
            wrong.append(f"{name}: Burn {'decoded it' if loads else verdict.get('error', 'decoded it wrongly')}; "
                         f"the table says {table or 'it decodes'}")
    assert not wrong, "\n".join(wrong)
    assert sum(v["ok"] for v in verdicts) > 100  # a record of a run, not of a device that failed to open


def test_the_cuda_table_says_which_ops_computed_there(tmp_path: Path) -> None:
    """Every op but a Col Linear computes wherever the table accepts the scheme, and fails where it names a
    failure; a Col Linear computes wrong on every case, which the table's `col_linear` says."""
    written(tmp_path)
    verdicts = lines(RECORD / "computes.jsonl")
    assert {v["name"] for v in verdicts} == set(burn_sweep.computed_cases(BurnBackend.wgpu, VERSION))
    col = [v for v in verdicts if v["op"] == "linear-col"]
    assert col and all(not (v["ok"] and v["max_abs"] is not None and v["max_abs"] <= TOLERANCE * v["max_ref"])
                       for v in col)
    assert CAPABILITIES[VERSION][CUDA].col_linear is not None
    outcome = computed([v for v in verdicts if v["op"] != "linear-col"])
    for name, failure in outcome.items():
        table = compute_failures(CUDA, COMPUTED[name][0], VERSION)
        assert (failure is None) == (not table), f"{name}: Burn: {failure or 'computes'}; the table: {table}"


def test_a_cuda_run_needs_burn_0_21_and_row_linear_weights(tmp_path: Path) -> None:
    source = SAMPLES / "tiny-llama.safetensors"
    newest = cli("quantize", source, "-o", tmp_path / "a.bpk", "--burn-backend", "cuda", "--dry-run")
    assert newest.code == 2 and "Burn 0.22.1's cuda backend is not measured" in newest.err
    assert "--burn-version 0.21" in newest.err
    col = cli("quantize", source, "-o", tmp_path / "b.bpk", "--burn-backend", "cuda", "--burn-version", "0.21")
    assert col.code == 2 and "LinearLayout::Col" in col.err and "--transpose" in col.err
    assert not (tmp_path / "b.bpk").exists()
    row = cli("quantize", source, "-o", tmp_path / "c.bpk", "--burn-backend", "cuda", "--burn-version", "0.21",
              "--transpose", "--device", "cpu")
    assert row.code == 0, row.err
    assert "computes as written on" in row.out + row.err and "cuda" in (row.out + row.err).split("computes as")[1]
    two_bit = cli("quantize", source, "-o", tmp_path / "d.bpk", "--burn-backend", "cuda", "--burn-version", "0.21",
                  "--transpose", "--scheme", "q2s-b32", "--dry-run")
    assert two_bit.code == 2 and "2-bit" in two_bit.err
