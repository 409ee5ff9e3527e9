"""Burn 0.23.0-pre.1's wgpu with the tile kernels, held to a recorded run (CI does not build that harness).

tests/burn-0.23 built with its `tile-kernels` feature (burn-cubecl's `tile-kernels-only`) ran on lavapipe
(tests/data/burn/wgpu-0.23-tile/run.json): `probe` on bench.burn_sweep's 0.23 sweep, `compute` on its wgpu
compute cases and both on tests/burn-0.23/packed_dim1.py's PackedU32(1) cases, with autotune's decisions
written out. The directory keeps Burn's decode, its verdicts and each decision's key and winner. The inputs
written here must be the bytes that ran there; the plain build's table (`qcli.burn_backends`, which CI holds
to the plain build) must say what decoded there, both ways, and what computed there but for E4M3 and E5M2,
which compute only with the tile kernels; and the decisions must show which forms Burn took packed
(docs/output.md).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path

from safetensors.torch import load_file

from bench import burn_sweep
from bench.burn_sweep import COMPUTED, QUANTIZED, computed
from qcli.burn_backends import LAVAPIPE, BurnBackend, compute_failures, decode_problem, kept_problem
from qcli.io.dtypes import Plain
from qcli.presets import PRESETS
from qcli.scheme import QuantValue
from tests.burn_harness import FIXTURES, HARNESSES, same_bits

RECORD = FIXTURES / "wgpu-0.23-tile"
VERSION = "0.23.0-pre.1"
WGPU = BurnBackend.wgpu


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def written(tmp_path: Path) -> Path:
    """The sweep, the compute cases and the PackedU32(1) cases as written today, checked to be what ran."""
    burn_sweep.write(tmp_path, VERSION)
    burn_sweep.write_computed(tmp_path, WGPU, VERSION)
    spec = importlib.util.spec_from_file_location("packed_dim1", HARNESSES[VERSION][0] / "packed_dim1.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    (tmp_path / "packed1").mkdir()
    module.main(tmp_path / "packed1")  # packed1/packed1.bpk and its own expected.safetensors
    ran = json.loads((RECORD / "run.json").read_text())["inputs_sha256"]
    assert set(ran) == {"sweep.bpk", "compute.bpk", "packed1.bpk"}
    for name, digest in ran.items():
        path = tmp_path / "packed1" / name if name == "packed1.bpk" else tmp_path / name
        assert hashlib.sha256(path.read_bytes()).hexdigest() == digest, name
    return tmp_path


def test_the_tile_kernels_decode_what_the_0_23_wgpu_table_says(tmp_path: Path) -> None:
    expected = load_file(written(tmp_path) / "expected.safetensors")
    decoded = load_file(RECORD / "burn.safetensors")
    verdicts = lines(RECORD / "verdicts.jsonl")
    assert {v["name"] for v in verdicts} == set(expected)
    wrong = []
    for verdict in verdicts:
        name = verdict["name"]
        loads = verdict["ok"] and name in decoded and same_bits(decoded[name], expected[name])
        table = (kept_problem(WGPU, Plain(name.removeprefix("kept ")), VERSION) if name.startswith("kept ")
                 else decode_problem(WGPU, *QUANTIZED[name], VERSION))
        if loads != (table is None):
            wrong.append(f"{name}: Burn {'decoded it' if loads else verdict.get('error', 'decoded it wrongly')}; "
                         f"the table says {table or 'it decodes'}")
    assert not wrong, "\n".join(wrong)
    assert sum(v["ok"] for v in verdicts) > 80


def test_the_tile_kernels_compute_what_plain_wgpu_does_and_e4m3_and_e5m2_too(tmp_path: Path) -> None:
    """Every case the table accepts computes; of what it refuses, N-d blocks fail as without the tile kernels,
    and E4M3 and E5M2 (which fail without them) compute."""
    written(tmp_path)
    outcome = computed(lines(RECORD / "computes.jsonl"))
    assert set(outcome) == set(burn_sweep.computed_cases(WGPU, VERSION))
    for name, failure in outcome.items():
        scheme = COMPUTED[name][0]
        table = [f for f in compute_failures(WGPU, scheme, VERSION) if LAVAPIPE in f.devices]
        minifloat8 = scheme.value in (QuantValue.E4M3, QuantValue.E5M2) and all("E4M3" in f.why for f in table)
        assert (failure is None) == (not table or minifloat8), f"{name}: Burn: {failure or 'computes'}; {table}"
    assert outcome["preset e4m3"] is None and outcome["preset e4m3-b32"] is None


# The presets whose weight Burn's tile kernels take packed (the key of an autotune decision names the
# scheme): one-axis blocks along the output axis of a value cubek streams; the rest are dequantized first.
TAKEN_PACKED = {"q8s-b32", "q4s-b32", "q4s-b64", "q4s-b128", "q4f-b32", "e4m3-b32", "fp4-b32"}


def test_burns_own_choice_of_the_forms_its_tile_kernels_take_packed(tmp_path: Path) -> None:
    """Of the presets, Burn keyed exactly TAKEN_PACKED as packed products, in `Linear` with a Row weight (the
    weight as rhs) and in a matmul with the weight on the left; on lavapipe each ran on cubek's floor, the unit
    routine on the weight decoded, since every routine reading it as stored declined the device."""
    written(tmp_path)
    decisions = lines(RECORD / "decisions.jsonl")
    keyed = {d["rhs"] if d["lhs"] == "Float" else d["lhs"] for d in decisions} - {"Float"}
    assert keyed == {str(PRESETS[p].scheme) for p in TAKEN_PACKED}
    for scheme in keyed:
        assert {(d["m"], d["k"], d["n"]) for d in decisions if scheme in (d["lhs"], d["rhs"])} == \
            {(4, 256, 128), (256, 128, 4)}  # Linear Row ([4, 256] x [256, 128]) and the weight on the left
    assert all(d["fastest"].startswith("unit-registers-matmul") for d in decisions
               if "Float" in (d["lhs"], d["rhs"]) and d["lhs"] != d["rhs"])


def test_packed_u32_1_with_the_tile_kernels(tmp_path: Path) -> None:
    """The PackedU32(1) cases decode as without the tile kernels (tests/io/test_burn_023.py runs those), and
    every one wgpu decodes computes, E4M3 included; as `Linear` Col transposes a [32, 1] weight, Burn takes it
    packed as the PackedU32(0) [32] weight it then is."""
    from tests.io.test_burn_023 import PACKED_DIM1_WGPU_REFUSES

    expected = load_file(written(tmp_path) / "packed1" / "expected.safetensors")
    decoded = load_file(RECORD / "packed1.safetensors")
    verdicts = lines(RECORD / "packed1-verdicts.jsonl")
    exact = {v["name"] for v in verdicts if v["ok"] and v["name"] in decoded and
             same_bits(decoded[v["name"]], expected[v["name"]])}
    assert exact == set(expected) - PACKED_DIM1_WGPU_REFUSES
    outcome = computed(lines(RECORD / "packed1-computes.jsonl"))
    assert {name for name, failure in outcome.items() if failure is None} == exact
    keyed = {d["rhs"] for d in lines(RECORD / "packed1-decisions.jsonl") if d["rhs"] != "Float"}
    assert "Q4S PackedU32(0) block [32] F16" in keyed
