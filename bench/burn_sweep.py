"""The capability sweep: every scheme qcli writes and every kept dtype, in one burnpack, with qcli's decode.

tests/io/test_burn_backends.py runs it through the Burn harness on every backend and holds
`qcli.burn_backends` to the result; this module also runs it on another machine:

    python3 -m bench.burn_sweep write DIR [VERSION]             # DIR/sweep.bpk and qcli's decode of it
    burn-harness probe --backend wgpu DIR/sweep.bpk DIR/burn.safetensors > DIR/verdicts.jsonl
    python3 -m bench.burn_sweep compare DIR [BACKEND [VERSION]] # Burn against qcli and the table

docs/output.md records the run on an NVIDIA H200 (wgpu through the NVIDIA Vulkan driver).
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from qcli import BURN_VERSION
from qcli.burn_backends import BurnBackend, hold_problem, kept_problem, load_problem, qfloat
from qcli.codec import decode, encode
from qcli.io.burnpack import BurnpackWriter, TensorEntry
from qcli.io.dtypes import Plain
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
    for value, store, dtype, (level, make) in itertools.product(
        QuantValue, (Native(), PackedU32(0), PackedNative(0)), ScaleDtype, LEVELS.items()
    ):
        scheme = make(QuantScheme().with_value(value).with_store(store), dtype)
        if not accept_problems(scheme):
            cases[f"{scheme} {level}"] = (scheme, WHOLE)
    for value, shape in itertools.product(QuantValue, RAGGED):
        scheme = QuantScheme().with_value(value).with_store(PackedU32(0)).per_tensor(ScaleDtype.F32)
        cases[f"{scheme} ragged {list(shape)}"] = (scheme, shape)
    return cases


QUANTIZED = quantized_cases()


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
                 else load_problem(backend, *QUANTIZED[name], version))
        if loads != (table is None):
            disagree += 1
            print(f"{name}: Burn {'loads it' if loads else verdict.get('error', 'decodes it wrongly')}; "
                  f"the table says {table or 'it loads'}")
    print(f"{len(lines)} cases, {disagree} disagree with the Burn {version} {backend} table")
    return disagree


if __name__ == "__main__":
    command, folder, *rest = sys.argv[1:]
    if command == "write":
        write(folder, *rest)
    else:
        backend, *version = rest or ["wgpu"]
        sys.exit(1 if compare(folder, BurnBackend(backend), *version) else 0)
