"""Burn 0.23.0-pre.1 held to recorded runs of its harness (CI does not build tests/burn-0.23).

Four records, each a run of tests/burn-0.23, in tests/data/burn/: flex-0.23 and wgpu-0.23 (the harness as it
builds by default; wgpu on lavapipe) and wgpu-0.23-tile (built with its `tile-kernels` feature,
burn-cubecl's `tile-kernels-only`, under autotune with its decisions written out), on the project's CI-like
machine; and wgpu-0.23-nvidia, the default build's binary carried to an NVIDIA H100 and run through its
Vulkan driver. Each ran `probe` on bench.burn_sweep's 0.23 sweep, `compute` on its compute cases for that backend and
both on tests/burn-0.23/packed_dim1.py's PackedU32(1) cases; its run.json names the machine, the driver, the
versions, the date, the commands (docs/output.md has them too) and the sha256 of each input. The inputs
written here must be the bytes that ran there, so a change to the writer that needs a new run fails here.

qcli's 0.23 table (`qcli.burn_backends`) must say exactly what Burn decoded (bit for bit against qcli's
decode, both ways) and what computed (every failure it names seen, every preset it refuses failing) in the
plain records; the tile record must decode as plain wgpu and compute what plain wgpu computes and E4M3 and
E5M2 too, and its decisions must show the forms Burn took packed (docs/output.md).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import lzma
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import pytest
import torch
from safetensors.torch import load, load_file

from bench import burn_sweep
from bench.burn_sweep import COMPUTED, QUANTIZED, computed, computed_cases, disagreements
from qcli.burn_backends import (
    CPU,
    LAVAPIPE,
    NVIDIA,
    BurnBackend,
    compute_failures,
    compute_problem,
    decode_problem,
    kept_problem,
    load_problem,
)
from qcli.io.dtypes import Plain
from qcli.plan.decisions import shape_problem
from qcli.presets import PRESETS
from qcli.scheme import QuantValue, accept_problems
from tests.burn_harness import FIXTURES, HARNESSES, RECORDED, same_bits
from tests.cli_support import SAMPLES, cli
from tests.plan.test_presets import TILE_COMPUTES

VERSION = "0.23.0-pre.1"
assert VERSION in RECORDED
FLEX, WGPU = BurnBackend.flex, BurnBackend.wgpu


@dataclass(frozen=True)
class Record:
    """One recorded run: its backend, whether the harness had the tile kernels, whether wgpu ran on an NVIDIA
    GPU (else on lavapipe), and its directory."""

    backend: BurnBackend
    tile: bool = False
    nvidia: bool = False

    def __str__(self) -> str:
        return self.path.name

    @property
    def path(self) -> Path:
        return FIXTURES / f"{self.backend}-0.23{'-tile' if self.tile else ''}{'-nvidia' if self.nvidia else ''}"

    @property
    def device(self) -> str:
        return CPU if self.backend is FLEX else NVIDIA if self.nvidia else LAVAPIPE

    @cached_property
    def run(self) -> dict:
        return json.loads((self.path / "run.json").read_text())

    def read(self, name: str) -> bytes:
        """A file of the record; the largest are kept xz-compressed (NAME.xz)."""
        path = self.path / name
        return path.read_bytes() if path.is_file() else lzma.decompress((self.path / f"{name}.xz").read_bytes())

    def lines(self, name: str) -> list[dict]:
        return [json.loads(line) for line in self.read(name).decode().splitlines()]

    def decoded(self, name: str) -> dict[str, torch.Tensor]:
        return load(self.read(name))


PLAIN = [Record(FLEX), Record(WGPU), Record(WGPU, nvidia=True)]
TILE = Record(WGPU, tile=True)
RECORDS = [*PLAIN, TILE]


def packed_dim1():
    """tests/burn-0.23/packed_dim1.py, which writes PackedU32(1) cases by hand from the PackedU32(0) codec."""
    spec = importlib.util.spec_from_file_location("packed_dim1", HARNESSES[VERSION][0] / "packed_dim1.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory):
    """The inputs of a record as written today (the sweep, its backend's compute cases, the PackedU32(1)
    cases), checked to be the bytes that ran; written once per backend."""
    folders: dict[BurnBackend, Path] = {}

    def written(record: Record) -> Path:
        if record.backend not in folders:
            folder = tmp_path_factory.mktemp(f"inputs-{record.backend}")
            burn_sweep.write(folder, VERSION)
            burn_sweep.write_computed(folder, record.backend, VERSION)
            (folder / "packed1").mkdir()
            packed_dim1().main(folder / "packed1")  # packed1/packed1.bpk and its own expected.safetensors
            folders[record.backend] = folder
        folder = folders[record.backend]
        ran = record.run["inputs_sha256"]
        assert set(ran) == {"sweep.bpk", "compute.bpk", "packed1.bpk"}
        for name, digest in ran.items():
            path = folder / "packed1" / name if name == "packed1.bpk" else folder / name
            assert hashlib.sha256(path.read_bytes()).hexdigest() == digest, \
                f"{name} is not the file {record} ran on: rerun it (docs/output.md)"
        return folder

    return written


@pytest.mark.parametrize("record", RECORDS, ids=str)
def test_each_record_says_how_it_was_made_and_ran_on_todays_inputs(record: Record, inputs) -> None:
    """run.json names the machine, the driver, the versions, the date and the commands; the harness that ran
    reported the Burn release it links, the one tests/burn-0.23 pins."""
    inputs(record)
    run = record.run
    assert {"what", "device", "cpu", "burn", "cubecl", "cubek", "rustc", "date", "commands"} <= set(run)
    assert run["burn"] == run["harness_version"] == VERSION
    assert f'version = "={VERSION}"' in (HARNESSES[VERSION][0] / "Cargo.toml").read_text()
    assert ("lavapipe" in run["device"]) == (record.device == LAVAPIPE)
    assert ("NVIDIA" in run["device"]) == (record.device == NVIDIA)
    commands = "\n".join(run["commands"])
    assert ("--features tile-kernels" in commands) == record.tile
    for command in (f"probe --backend {record.backend}", f"compute --backend {record.backend}"):
        assert command in commands


@pytest.mark.parametrize("record", RECORDS, ids=str)
def test_burn_decoded_exactly_what_the_0_23_table_says(record: Record, inputs) -> None:
    """Every case of the sweep: Burn's decode is qcli's bit for bit exactly where the table says it loads
    (the tile record against wgpu's table: the tile kernels are a matmul, not a decoder)."""
    expected = load_file(inputs(record) / "expected.safetensors")
    decoded = record.decoded("burn.safetensors")
    verdicts = record.lines("verdicts.jsonl")
    assert len(verdicts) == len(expected) and {v["name"] for v in verdicts} == set(expected)
    wrong = []
    for verdict in verdicts:
        name = verdict["name"]
        loads = verdict["ok"] and name in decoded and same_bits(decoded[name], expected[name])
        table = (kept_problem(record.backend, Plain(name.removeprefix("kept ")), VERSION) if name.startswith("kept ")
                 else decode_problem(record.backend, *QUANTIZED[name], VERSION))
        if loads != (table is None):
            wrong.append(f"{name}: Burn {'decoded it' if loads else verdict.get('error', 'decoded it wrongly')}; "
                         f"the table says {table or 'it decodes'}")
    assert not wrong, f"{len(wrong)} of {len(verdicts)} cases disagree with {record}:\n" + "\n".join(wrong)
    ok = sum(v["ok"] for v in verdicts)
    assert ok == len(verdicts) if record.backend is FLEX else ok > 80  # flex decodes every case


@pytest.mark.parametrize("record", PLAIN, ids=str)
def test_burn_computed_what_the_0_23_table_says(record: Record, inputs) -> None:
    """Every case the backend decodes, through a model's ops: what the table accepts computed as on its
    dequantized copy, each preset it refuses failed, each failure it names on that device showed."""
    inputs(record)
    outcome = computed(record.lines("computes.jsonl"))
    assert set(outcome) == set(computed_cases(record.backend, VERSION))
    wrong = disagreements(outcome, record.backend, record.device, VERSION)
    assert not wrong, "\n".join(wrong)


def test_the_tile_kernels_compute_what_plain_wgpu_does_and_e4m3_and_e5m2_too(inputs) -> None:
    """Every case the table accepts computes; of what it refuses, N-d blocks fail as without the tile kernels,
    and E4M3 and E5M2 (which fail without them) compute."""
    inputs(TILE)
    outcome = computed(TILE.lines("computes.jsonl"))
    assert set(outcome) == set(computed_cases(WGPU, VERSION))
    for name, failure in outcome.items():
        scheme = COMPUTED[name][0]
        table = [f for f in compute_failures(WGPU, scheme, VERSION) if LAVAPIPE in f.devices]
        minifloat8 = scheme.value in (QuantValue.E4M3, QuantValue.E5M2) and all("E4M3" in f.why for f in table)
        assert (failure is None) == (not table or minifloat8), f"{name}: Burn: {failure or 'computes'}; {table}"
    assert outcome["preset e4m3"] is None and outcome["preset e4m3-b32"] is None
    # docs/presets.md's and the README's last column (tests/plan/test_presets.py)
    assert {name.removeprefix("preset ") for name, failure in outcome.items()
            if name.startswith("preset ") and failure is None} == TILE_COMPUTES


@pytest.mark.parametrize("record", PLAIN, ids=str)
@pytest.mark.parametrize("preset", PRESETS, ids=str)
def test_burn_backend_with_0_23_writes_a_preset_exactly_where_it_decoded_and_computed(record, preset, inputs,
                                                                                       tmp_path: Path) -> None:
    """`--burn-backend B --burn-version 0.23` writes a preset where the record shows Burn decoding and
    computing it (its case in the compute cases, on the [256, 128] weight), and refuses it otherwise, for
    the table's reason."""
    inputs(record)
    outcome = computed(record.lines("computes.jsonl"))
    scheme = PRESETS[preset].scheme
    result = cli("quantize", SAMPLES / "tiny-llama.safetensors", "-o", tmp_path / "out.bpk", "--device", "cpu",
                 "--scheme", preset, "--burn-version", "0.23", "--burn-backend", record.backend.value,
                 "--transpose", "--dry-run")
    why = load_problem(record.backend, scheme, (), VERSION)
    if f"preset {preset}" in outcome and outcome[f"preset {preset}"] is None:
        assert why is None and result.code == 0, result.err
    else:
        assert why is not None and result.code == 2 and f"{record.backend} backend cannot" in result.err
        assert " ".join(why.split()[:6]) in " ".join(result.err.split())


# Tile kernels: the presets whose weight Burn took packed (the key of an autotune decision names the scheme):
# one-axis blocks along the output axis of a value cubek streams; the rest are dequantized first.
TAKEN_PACKED = {"q8s-b32", "q4s-b32", "q4s-b64", "q4s-b128", "q4f-b32", "e4m3-b32", "fp4-b32"}


def test_burns_own_choice_of_the_forms_its_tile_kernels_take_packed(inputs) -> None:
    """Of the presets, Burn keyed exactly TAKEN_PACKED as packed products, in `Linear` with a Row weight (the
    weight as rhs) and in a matmul with the weight on the left; on lavapipe each ran on cubek's floor, the unit
    routine on the weight decoded, since every routine reading it as stored declined the device."""
    inputs(TILE)
    decisions = TILE.lines("decisions.jsonl")
    keyed = {d["rhs"] if d["lhs"] == "Float" else d["lhs"] for d in decisions} - {"Float"}
    assert keyed == {str(PRESETS[p].scheme) for p in TAKEN_PACKED}
    for scheme in keyed:
        assert {(d["m"], d["k"], d["n"]) for d in decisions if scheme in (d["lhs"], d["rhs"])} == \
            {(4, 256, 128), (256, 128, 4)}  # Linear Row ([4, 256] x [256, 128]) and the weight on the left
    assert all(d["fastest"].startswith("unit-registers-matmul") for d in decisions
               if "Float" in (d["lhs"], d["rhs"]) and d["lhs"] != d["rhs"])


# PackedU32(1) (packed_dim1.py): the cases each backend does not decode bit for bit (wgpu reads the store as
# PackedU32(0): blocks across the words decode wrongly, UE8M0 scales fail, padded rows panic), and of those it
# decodes, the ones a model does not compute right with.
PACKED_DIM1_REFUSES = {FLEX: set(), WGPU: {"E2M1 block[32,1] UE8M0", "Q4S block[1,16] F16 (scales across the words)",
                                           "Q4S tensor ragged [36,16]"}}
PACKED_DIM1_COMPUTE_FAILS = {
    Record(FLEX): {"Q4F block[32,1] F16"},  # flex requantizes full-range blocks
    Record(WGPU): {"E4M3 block[32,1] F32"},  # E4M3 fails without the tile kernels
    Record(WGPU, nvidia=True): {"E4M3 block[32,1] F32"},
    TILE: set(),
}


@pytest.mark.parametrize("record", RECORDS, ids=str)
def test_packed_u32_1_decodes_in_burn_0_23_bit_for_bit_and_computes(record: Record, inputs) -> None:
    """The payload of X under PackedU32(1) with blocks [Br, Bc] is qcli's PackedU32(0) payload of X.T under
    blocks [Bc, Br]: Burn 0.23 decoded it to X's values, bit for bit, wherever it reads the store (flex every
    case, wgpu with or without the tile kernels the same), and computed with every case it decoded but those
    the table names a compute failure for (the tile kernels compute E4M3)."""
    expected = load_file(inputs(record) / "packed1" / "expected.safetensors")
    decoded = record.decoded("packed1.safetensors")
    verdicts = record.lines("packed1-verdicts.jsonl")
    assert {v["name"] for v in verdicts} == set(expected)
    exact = {v["name"] for v in verdicts if v["ok"] and v["name"] in decoded and
             same_bits(decoded[v["name"]], expected[v["name"]])}
    assert exact == set(expected) - PACKED_DIM1_REFUSES[record.backend], sorted(set(expected) - exact)
    outcome = computed(record.lines("packed1-computes.jsonl"))
    fails = PACKED_DIM1_COMPUTE_FAILS[record]
    assert {name for name, failure in outcome.items() if failure is None} == exact - fails
    cases = {name: (value, block, dtype) for name, value, block, dtype, _ in packed_dim1().CASES}
    for name in fails:
        scheme = packed_dim1().scheme_of(*cases[name], 1)
        assert any(record.device in f.devices for f in compute_failures(record.backend, scheme, VERSION)), name
    if record.tile:  # as `Linear` Col transposes a [32, 1] weight, Burn takes it packed as PackedU32(0) [32]
        keyed = {d["rhs"] for d in record.lines("packed1-decisions.jsonl") if d["rhs"] != "Float"}
        assert "Q4S PackedU32(0) block [32] F16" in keyed


def written_by_qcli(case: tuple) -> bool:
    """Whether qcli's plan writes a packed_dim1.py case: Burn's quantizer rule (a block's extent along the
    packed axis a whole number of words) and its shape rules (rows of whole words) hold."""
    name, value, block, dtype, shape = case
    scheme = packed_dim1().scheme_of(value, block, dtype, 1)
    return not accept_problems(scheme) and shape_problem(scheme, shape) is None


# Where qcli's table refuses a PackedU32(1) case Burn computed right: flex's rule for block scales other than
# F32 and F16 (requantized by its layout ops) was measured on PackedU32(0) weights, and is kept for these.
PACKED_DIM1_TABLE_REFUSES_BUT_COMPUTES = {Record(FLEX): {"E2M1 block[32,1] UE8M0"}, Record(WGPU): set(),
                                          Record(WGPU, nvidia=True): set()}


@pytest.mark.parametrize("record", PLAIN, ids=str)
def test_the_0_23_table_says_what_burn_did_with_the_packed_u32_1_cases_qcli_writes(record: Record, inputs) -> None:
    """Of the PackedU32(1) cases qcli writes, the 0.23 table (`decode_problem`, `compute_problem`) decodes
    exactly those Burn decoded bit for bit, and computes those Burn computed with, but the one refusal
    named above."""
    cases = [case for case in packed_dim1().CASES if written_by_qcli(case)]
    names = {case[0] for case in cases}
    assert set(case[0] for case in packed_dim1().CASES) - names == {
        "Q4S block[1,16] F16 (scales across the words)", "Q4S tensor ragged [36,16]"}
    expected = load_file(inputs(record) / "packed1" / "expected.safetensors")
    decoded = record.decoded("packed1.safetensors")
    burn_decodes = {v["name"] for v in record.lines("packed1-verdicts.jsonl") if v["ok"] and v["name"] in names
                    and same_bits(decoded[v["name"]], expected[v["name"]])}
    schemes = {name: packed_dim1().scheme_of(value, block, dtype, 1) for name, value, block, dtype, _ in cases}
    shapes = {case[0]: case[4] for case in cases}
    table_decodes = {n for n in names if decode_problem(record.backend, schemes[n], shapes[n], VERSION) is None}
    assert table_decodes == burn_decodes
    outcome = computed(record.lines("packed1-computes.jsonl"))
    burn_computes = {n for n in burn_decodes if outcome.get(n, "not run") is None}
    table_computes = {n for n in table_decodes if compute_problem(record.backend, schemes[n], VERSION) is None}
    assert table_computes == burn_computes - PACKED_DIM1_TABLE_REFUSES_BUT_COMPUTES[record]


def test_qcli_writes_the_packed_u32_1_cases_as_burn_decoded_them(tmp_path: Path, inputs) -> None:
    """`qcli quantize --burn-version 0.23` with recipe rules asking for PackedU32(1) writes each case that
    packed_dim1.py wrote by hand, and Burn 0.23 decoded (above), byte for byte, its header included: from the
    tensor as it is, and from its transpose under `transpose = true` (a PyTorch Linear weight `[out, in]`
    written in Burn's Row layout, `[in, out]`, packed along its input axis)."""
    from safetensors.torch import save_file

    from bench.burn_sweep import sample
    from qcli.io.burnpack import BurnpackReader

    cases = [(i, case) for i, case in enumerate(packed_dim1().CASES) if written_by_qcli(case)]
    tensors, rules = {}, ["version = 1\n"]
    for i, (_, value, block, dtype, shape) in cases:
        x = sample(shape, i + 100)  # packed_dim1.py's seed for case i
        tensors[f"c{i}"], tensors[f"c{i}_t"] = x, x.t().contiguous()
        scales = f'block = {block}\nblock_scale = "{dtype}"' if block else f'tensor_scale = "{dtype}"'
        for name, transpose in ((f"c{i}", "false"), (f"c{i}_t", "true")):
            rules.append(f'[[rule]]\nmatch = "{name}"\nvalue = "{value}"\nstore = "PackedU32(1)"\n{scales}\n'
                         f"transpose = {transpose}\n")
    save_file(tensors, str(tmp_path / "cases.safetensors"))
    (tmp_path / "recipe.toml").write_text("\n".join(rules))
    result = cli("quantize", tmp_path / "cases.safetensors", "-o", tmp_path / "out.bpk", "--burn-version", "0.23",
                 "--recipe", tmp_path / "recipe.toml", "--quiet")
    assert result.code == 0, result.err
    ours, hand = BurnpackReader.open(tmp_path / "out.bpk"), BurnpackReader.open(inputs(Record(FLEX)) / "packed1" /
                                                                               "packed1.bpk")
    by_name = {e.name: e for e in ours.entries()}
    for i, (name, *_) in cases:
        theirs = next(e for e in hand.entries() if e.name == name)
        for ours_name in (f"c{i}", f"c{i}_t"):
            entry = by_name[ours_name]
            assert (entry.dtype, tuple(entry.shape)) == (theirs.dtype, tuple(theirs.shape)), ours_name
            assert bytes(ours.read(ours_name)) == bytes(hand.read(name)), ours_name
