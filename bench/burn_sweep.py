"""The capability sweep: every scheme qcli writes and every kept dtype, in one burnpack, with qcli's decode.

tests/io/test_burn_backends.py runs it through the Burn harness on every backend and holds
`qcli.burn_backends` to the result; this module also runs it on another machine:

    python3 -m bench.burn_sweep write DIR [VERSION]             # DIR/sweep.bpk, qcli's decode, compute.bpk
    python3 -m bench.burn_sweep write-computed DIR BACKEND [VERSION]  # DIR/compute.bpk: BACKEND's cases
    burn-harness probe --backend wgpu DIR/sweep.bpk DIR/burn.safetensors > DIR/verdicts.jsonl
    python3 -m bench.burn_sweep compare DIR [BACKEND [VERSION]] # Burn against qcli and the table
    burn-harness compute --backend wgpu DIR/compute.bpk > DIR/computes.jsonl
    python3 -m bench.burn_sweep computes DIR [BACKEND DEVICE [VERSION]]  # what a model runs, against the table

`compute.bpk` holds every preset on a Llama-shaped weight and every whole-row case: the harness runs a
model's ops on each (`Embedding`, `Linear` in Row and Col layout, a matmul) on the quantized tensor and on
its `dequantize()`. docs/output.md records both runs on an NVIDIA H200 (wgpu through the NVIDIA Vulkan
driver).
"""

from __future__ import annotations

import itertools
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from qcli import BURN_VERSION
from qcli.burn_backends import (
    NVIDIA,
    BurnBackend,
    compute_failures,
    decode_problem,
    hold_problem,
    kept_problem,
    level,
    qfloat,
)
from qcli.codec import decode, encode
from qcli.io.burnpack import BurnpackWriter, TensorEntry
from qcli.io.dtypes import Plain
from qcli.presets import PRESETS
from qcli.scheme import Native, PackedNative, PackedU32, QuantScheme, QuantValue, ScaleDtype, accept_problems

WHOLE = (16, 64)
RAGGED = ((36,), (6, 36), (2, 3, 36))  # 36 values fill no whole u32 word of 8-, 4- or 2-bit values
LEVELS = {
    "tensor": lambda scheme, dtype: scheme.per_tensor(dtype),
    "block[32]": lambda scheme, dtype: scheme.per_block([32], dtype),
    "block[4,16]": lambda scheme, dtype: scheme.per_block([4, 16], dtype),
    "two-level[16]": lambda scheme, dtype: scheme.per_block([16], dtype).per_tensor(ScaleDtype.F32),
}
KEPT = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
        "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8}


def sample(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=generator) * 0.05
    x.view(-1)[seed % x.numel()] = 1.5  # an outlier, so blocks get different scales
    return x


def quantized_cases() -> dict[str, tuple[QuantScheme, tuple[int, ...]]]:
    """Every value x store x scale dtype x level qcli writes, on whole rows; and every packed value on
    ragged rows of each rank."""
    cases = {}
    for value, store, dtype, (level_name, make) in itertools.product(
        QuantValue, (Native(), PackedU32(0), PackedNative(0)), ScaleDtype, LEVELS.items()
    ):
        scheme = make(QuantScheme().with_value(value).with_store(store), dtype)
        if not accept_problems(scheme):
            cases[f"{scheme} {level_name}"] = (scheme, WHOLE)
    for value, shape in itertools.product(QuantValue, RAGGED):
        scheme = QuantScheme().with_value(value).with_store(PackedU32(0)).per_tensor(ScaleDtype.F32)
        cases[f"{scheme} ragged {list(shape)}"] = (scheme, shape)
    return cases


QUANTIZED = quantized_cases()
# A weight of a small Llama-shaped model ([d_ff, d_model] of a 128-wide one), each preset on it.
PRESET_SHAPE = (256, 128)
COMPUTED = {f"preset {name}": (preset.scheme, PRESET_SHAPE) for name, preset in PRESETS.items()} | {
    name: case for name, case in QUANTIZED.items() if case[1] == WHOLE}
# How far a model's op on the quantized weight may stray from the same op on its `dequantize()`, relative
# to the largest value of the result: what the table accepts differs by at most 5e-7 (flex), 0 elsewhere;
# flex's requantized two-level weights stray by up to 0.1 %, and the failures the issue found by 6 % and more.
TOLERANCE = 1e-3


def cases_for(version: str) -> dict[str, tuple[QuantScheme, tuple[int, ...]]]:
    """The cases Burn `version` has a form for (0.21 has no two-level scheme)."""
    return {name: case for name, case in QUANTIZED.items() if hold_problem(case[0], version) is None}


def write(folder: Path, version: str = BURN_VERSION) -> None:
    """`folder/sweep.bpk` (qcli's payloads in Burn `version`'s serde, kept tensors as they are) and
    `folder/expected.safetensors` (qcli's decode of each, as f32)."""
    entries, payloads, expected = [], [], {}
    for seed, (name, (scheme, shape)) in enumerate(cases_for(version).items()):
        payload = encode(sample(shape, seed), scheme)
        entries.append(TensorEntry(name, qfloat(scheme, version), shape, payload.numel()))
        payloads.append(payload)
        expected[name] = decode(payload, scheme, shape)
    for name, dtype in KEPT.items():
        x = (sample(WHOLE, 0) * 1000).to(dtype)
        entries.append(TensorEntry(f"kept {name}", Plain(name), WHOLE, x.numel() * x.element_size()))
        payloads.append(x)
        expected[f"kept {name}"] = x.to(torch.float32)
    with BurnpackWriter(folder / "sweep.bpk", entries) as writer:
        for entry, payload in zip(entries, payloads, strict=True):
            writer.write(entry.name, payload)
        writer.commit()
    save_file({name: t.contiguous() for name, t in expected.items()}, str(folder / "expected.safetensors"))


def compare(folder: Path, backend: BurnBackend, version: str = BURN_VERSION) -> int:
    """Prints each case whose outcome the table does not predict; returns how many."""
    expected, decoded = load_file(folder / "expected.safetensors"), load_file(folder / "burn.safetensors")
    disagree = 0
    lines = (folder / "verdicts.jsonl").read_text().splitlines()
    for verdict in map(json.loads, lines):
        name = verdict["name"]
        want, got = expected[name].contiguous(), decoded.get(name)
        loads = verdict["ok"] and got is not None and torch.equal(got.contiguous().view(torch.int32),
                                                                  want.view(torch.int32))
        table = (kept_problem(backend, Plain(name.removeprefix("kept ")), version) if name.startswith("kept ")
                 else decode_problem(backend, *QUANTIZED[name], version))
        if loads != (table is None):
            disagree += 1
            print(f"{name}: Burn {'loads it' if loads else verdict.get('error', 'decodes it wrongly')}; "
                  f"the table says {table or 'it loads'}")
    print(f"{len(lines)} cases, {disagree} disagree with the Burn {version} {backend} table")
    return disagree


def computed_cases(backend: BurnBackend, version: str = BURN_VERSION) -> dict[str, tuple[QuantScheme, tuple[int, ...]]]:
    """The cases of COMPUTED that `backend` of Burn `version` decodes; on wgpu, whose shaders lavapipe compiles
    for each case in seconds, only the presets (per-tensor and one-axis blocks) and the other levels with F16
    scales."""
    return {name: (scheme, shape) for name, (scheme, shape) in COMPUTED.items()
            if decode_problem(backend, scheme, shape, version) is None and
            (backend is not BurnBackend.wgpu or name.startswith("preset ") or
             (scheme.scale_dtype() is ScaleDtype.F16 and level(scheme) in ("nd-block", "two-level")))}


def write_computed(folder: Path, backend: BurnBackend, version: str = BURN_VERSION) -> None:
    """`folder/compute.bpk`: every case of `computed_cases(backend, version)`, in Burn `version`'s serde."""
    entries, payloads = [], []
    for seed, (name, (scheme, shape)) in enumerate(computed_cases(backend, version).items()):
        payloads.append(encode(sample(shape, seed), scheme))
        entries.append(TensorEntry(name, qfloat(scheme, version), shape, payloads[-1].numel()))
    with BurnpackWriter(folder / "compute.bpk", entries) as writer:
        for entry, payload in zip(entries, payloads, strict=True):
            writer.write(entry.name, payload)
        writer.commit()


def computed(verdicts: Sequence[dict]) -> dict[str, str | None]:
    """Per tensor, the first op of the harness's `compute` verdicts that panicked or strayed past
    TOLERANCE, as "op: what happened", or None where every op computed right."""
    outcome: dict[str, str | None] = {}
    for verdict in verdicts:
        name, op = verdict["name"], verdict["op"]
        if not verdict["ok"]:
            failure = f"{op} panics ({verdict['error'].splitlines()[0][:200]})"
        elif verdict["max_abs"] is None:  # the harness's JSON writes a NaN as null
            failure = f"{op} gives NaN"
        elif not verdict["max_abs"] <= TOLERANCE * verdict["max_ref"]:
            failure = f"{op} is wrong by {verdict['max_abs'] / max(verdict['max_ref'], 1e-30):.1%} of its largest value"
        else:
            failure = None
        if outcome.get(name) is None:
            outcome[name] = failure
    return outcome


def disagreements(outcome: dict[str, str | None], backend: BurnBackend, device: str,
                  version: str = BURN_VERSION) -> list[str]:
    """Where Burn `version`'s compute failures for `backend` on `device` disagree with `outcome` (`computed`'s):
    a case it accepts must compute right; a preset it refuses must fail; and every failure it names must
    be seen in a case it covers (flex's requantizing keeps some values by chance)."""
    wrong, seen = [], {}
    for name, failure in outcome.items():
        scheme, _ = COMPUTED[name]
        table = [f for f in compute_failures(backend, scheme, version) if device in f.devices]
        for known in table:
            seen[known.why] = seen.get(known.why, False) or failure is not None
        if failure is not None and not table:
            wrong.append(f"{name}: {failure}, but the table says it computes")
        if failure is None and table and name.startswith("preset "):
            wrong.append(f"{name} computes right, but the table says {table[0].why}")
    wrong += [f"the table says {why}, but no case shows it" for why, shown in seen.items() if not shown]
    return wrong


def compare_computed(folder: Path, backend: BurnBackend, device: str, version: str = BURN_VERSION) -> int:
    """Prints each case a model on `device` computes otherwise than the table says; returns how many."""
    outcome = computed([json.loads(line) for line in (folder / "computes.jsonl").read_text().splitlines()])
    wrong = disagreements(outcome, backend, device, version)
    print("\n".join(wrong + [f"{len(outcome)} cases, {len(wrong)} disagreements with the Burn {version} "
                              f"{backend} table on {device}"]))
    return len(wrong)


if __name__ == "__main__":
    command, folder, *rest = sys.argv[1:]
    if command == "write":
        write(Path(folder), *rest)
        write_computed(Path(folder), BurnBackend.wgpu, *rest)
    elif command == "write-computed":
        backend, *version = rest
        write_computed(Path(folder), BurnBackend(backend), *version)
    elif command == "computes":
        backend, device, *version = rest or ["wgpu", NVIDIA]
        sys.exit(1 if compare_computed(Path(folder), BurnBackend(backend), device, *version) else 0)
    else:
        backend, *version = rest or ["wgpu"]
        sys.exit(1 if compare(Path(folder), BurnBackend(backend), *version) else 0)
