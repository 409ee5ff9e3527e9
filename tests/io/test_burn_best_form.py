"""The form `--burn-backend B` writes without `--scheme` is one a Burn model computes with on B, through the
whole CLI: Burn decodes the file bit for bit as qcli does, and `Embedding`, `Linear` (Row and Col) and a matmul
on each weight give what they give on its `dequantize()` (the harness's `compute`). The other direction: the
other backend's form, which the table refuses on B, is refused by `--burn-backend B`, and where that failure
was measured on this machine's device, Burn shows it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.burn_sweep import computed, sample
from qcli.burn_backends import CPU, LAVAPIPE, BurnBackend, compute_failures, default_preset
from qcli.codec import decode
from qcli.io.burnpack import BurnpackReader
from qcli.io.dtypes import QFloat
from qcli.presets import PRESETS
from tests.burn_harness import compute, probe, same_bits, save_f32
from tests.cli_support import cli

pytestmark = pytest.mark.burn

MEASURED = (BurnBackend.flex, BurnBackend.wgpu)
DEVICE = {BurnBackend.flex: CPU, BurnBackend.wgpu: LAVAPIPE}  # where this machine runs each
# A Llama-shaped MLP's weights, [out, in] as PyTorch writes them.
WEIGHTS = {"model.layers.0.mlp.up_proj.weight": (256, 128), "model.layers.0.mlp.down_proj.weight": (128, 256)}


def source(folder: Path) -> Path:
    weights = {name: sample(shape, i) for i, (name, shape) in enumerate(WEIGHTS.items())}
    return save_f32(folder / "mlp.safetensors", weights)


@pytest.mark.parametrize("backend", MEASURED, ids=str)
def test_the_default_form_of_a_backend_computes_there(backend: BurnBackend, tmp_path: Path) -> None:
    out = tmp_path / "mlp.bpk"
    result = cli("quantize", source(tmp_path), "-o", out, "--device", "cpu", "--burn-backend", backend.value)
    assert result.code == 0, result.err
    reader = BurnpackReader.open(out)
    entries = list(reader.entries())
    assert {e.name for e in entries} == set(WEIGHTS)
    assert all(isinstance(e.dtype, QFloat) and e.dtype.scheme == PRESETS[default_preset(backend)].scheme
               for e in entries)
    decoded = probe(backend, out, tmp_path / "burn.safetensors")
    for entry in entries:
        mine = decode(bytes(reader.read(entry.name)), entry.dtype.scheme, entry.shape)
        assert same_bits(decoded[entry.name], mine), entry.name
    outcome = computed(compute(backend, out))
    assert set(outcome) == set(WEIGHTS) and not any(outcome.values()), outcome


@pytest.mark.parametrize("backend", MEASURED, ids=str)
def test_the_other_backends_default_form_is_refused_where_the_table_says(backend: BurnBackend, tmp_path: Path) -> None:
    (other,) = (b for b in MEASURED if b is not backend)
    name = default_preset(other)
    failures = compute_failures(backend, PRESETS[name].scheme)
    assert failures, f"{name} computes on {backend} too: nothing to refuse"
    folder = source(tmp_path)
    refused = cli("quantize", folder, "-o", tmp_path / "refused.bpk", "--device", "cpu", "--burn-backend",
                  backend.value, "--scheme", name)
    assert refused.code == 2 and failures[0].why in refused.err
    if DEVICE[backend] not in failures[0].devices:
        return  # measured on another device (an NVIDIA GPU): this machine's cannot show it
    out = tmp_path / "written.bpk"
    assert cli("quantize", folder, "-o", out, "--device", "cpu", "--scheme", name).code == 0
    outcome = computed(compute(backend, out))
    assert all(outcome[weight] for weight in WEIGHTS), outcome
