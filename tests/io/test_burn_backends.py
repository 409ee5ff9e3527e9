"""The capability table of qcli.burn_backends held to Burn itself: every scheme qcli writes, on every backend.

Decoding: each case is encoded by qcli's codec and written with qcli's writer; the harness builds it on the backend
with `Tensor::from_data` and dequantizes it. A case "loads" when Burn returns qcli's decode bit for bit.
The table must say exactly which cases load: a case it accepts must load, and a case it refuses must
really fail (a panic or a wrong decode), so the table can neither let a bad file through nor refuse a
good one. Computing: a model's ops on each decoded case (the harness's `compute`) must give what they give
on its `dequantize()` wherever the table accepts it, and every failure the table names must show.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from bench import burn_sweep
from bench.burn_sweep import COMPUTED, PRESET_SHAPE, QUANTIZED, WHOLE, computed, computed_cases, disagreements, sample
from qcli import BURN_VERSION
from qcli.burn_backends import (
    BURN_VERSIONS,
    CPU,
    LAVAPIPE,
    BurnBackend,
    backends,
    decode_problem,
    kept_problem,
    release_problem,
)
from qcli.codec import decode
from qcli.io.burnpack import BurnpackReader
from qcli.io.dtypes import Plain
from qcli.presets import PRESETS
from qcli.scheme import Native, PackedNative, PackedU32, QuantScheme, QuantValue, ScaleDtype
from tests.burn_harness import BACKENDS, LIVE_HARNESSES, RECORDED, compute, probe, same_bits, save_f32
from tests.cli_support import cli

pytestmark = pytest.mark.burn


# The releases whose harness the tests run; a RECORDED release's table is held to its recorded runs of the
# same sweeps instead (tests/io/test_burn_023_recorded.py).
LIVE_VERSIONS = tuple(LIVE_HARNESSES)
assert set(LIVE_VERSIONS) | set(RECORDED) == set(BURN_VERSIONS)


@pytest.fixture(scope="module", params=LIVE_VERSIONS)
def sweep(request, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, dict[str, torch.Tensor]]:
    """For each Burn release the tests run, one burnpack holding every case it has a form for (qcli's payloads, in its
    serde) and every kept dtype; the expected f32 values."""
    folder = tmp_path_factory.mktemp("sweep")
    burn_sweep.write(folder, request.param)
    return request.param, folder / "sweep.bpk", load_file(folder / "expected.safetensors")


def test_the_sweep_covers_every_value_store_scale_dtype_and_level() -> None:
    schemes = [scheme for scheme, _ in QUANTIZED.values()]
    assert {s.value for s in schemes} == set(QuantValue)
    assert {type(s.store) for s in schemes} == {Native, PackedU32, PackedNative}
    assert {s.scale_dtype() for s in schemes} == set(ScaleDtype)
    assert any(s.is_two_level() for s in schemes) and any(s.block and s.block.size.len == 2 for s in schemes)


@pytest.mark.parametrize("backend", BACKENDS, ids=str)
def test_the_table_says_exactly_what_burn_loads(backend: BurnBackend, sweep, tmp_path: Path) -> None:
    version, path, expected = sweep
    skip_unmeasured(backend, version)
    decoded = probe(backend, path, tmp_path / "decoded.safetensors", version)
    wrong = []
    for name, want in expected.items():
        got = decoded[name]
        loads = isinstance(got, torch.Tensor) and same_bits(got, want)
        if name.startswith("kept "):
            table = kept_problem(backend, Plain(name.removeprefix("kept ")), version)
        else:
            scheme, shape = QUANTIZED[name]
            table = decode_problem(backend, scheme, shape, version)
        if loads != (table is None):
            burn = "decodes it exactly" if loads else (got if isinstance(got, str) else "decodes it wrongly")
            wrong.append(f"{name}: the table says {table or 'it loads'}, but Burn {burn}")
    assert not wrong, f"{len(wrong)} of {len(expected)} cases disagree on Burn {version} {backend}:\n" + \
        "\n".join(wrong)


def test_the_compute_sweep_covers_every_preset_value_and_level() -> None:
    schemes = [scheme for scheme, _ in COMPUTED.values()]
    assert {name for name in COMPUTED if name.startswith("preset ")} == {f"preset {p}" for p in PRESETS}
    assert {s.value for s in schemes} == set(QuantValue)
    assert any(s.is_two_level() for s in schemes) and any(s.block and s.block.size.len == 2 for s in schemes)
    assert all(shape == PRESET_SHAPE for name, (_, shape) in COMPUTED.items() if name.startswith("preset "))


def skip_unmeasured(backend: BurnBackend, version: str) -> None:
    """Skip a backend Burn `version` has no table for (0.23 has no ndarray), with the reason qcli gives."""
    if backend not in backends(version):
        pytest.skip(release_problem(backend, version) or f"no {backend} table for Burn {version}")


# The releases whose computing was measured (Burn 0.21's was not, but on its cuda: tests/io/test_burn_cuda.py;
# 0.23.0-pre.1's is held to its record).
COMPUTE_VERSIONS = ("0.22.1",)
assert set(COMPUTE_VERSIONS) <= set(LIVE_VERSIONS)


@pytest.mark.parametrize("version", COMPUTE_VERSIONS)
@pytest.mark.parametrize("backend", BACKENDS, ids=str)
def test_the_table_says_what_a_model_computes(backend: BurnBackend, version: str, tmp_path: Path) -> None:
    """Every case `backend` decodes, run through a model's ops in Burn: what the table accepts computes as
    on its dequantized copy, each preset it refuses fails, and each failure it names is seen (wgpu here
    is lavapipe; the NVIDIA figures are docs/output.md's)."""
    skip_unmeasured(backend, version)
    burn_sweep.write_computed(tmp_path, backend, version)
    outcome = computed(compute(backend, tmp_path / "compute.bpk", version))
    assert set(outcome) == set(computed_cases(backend, version))
    wrong = disagreements(outcome, backend, LAVAPIPE if backend is BurnBackend.wgpu else CPU, version)
    assert not wrong, "\n".join(wrong)


def recipe_rule(name: str, scheme: QuantScheme) -> str:
    """A recipe rule giving tensor `name` exactly `scheme`, in the recipe's keys (docs/recipes.md)."""
    lines = ["[[rule]]", f"match = {name!r}".replace("'", '"'), f'value = "{scheme.value}"',
             f'store = "{type(scheme.store).__name__}"']
    if scheme.block is not None:
        lines += [f"block = {scheme.block.size.dims()}", f'block_scale = "{scheme.block.dtype}"']
    if scheme.tensor is not None:
        lines.append(f'tensor_scale = "{scheme.tensor}"')
    return "\n".join(lines) + "\n"


def quantize_every_case(folder: Path, version: str) -> Path:
    """Every whole-row case Burn `version` has a form for quantized by `qcli quantize --burn-version` itself:
    one tensor per case, one recipe rule each."""
    cases = {name: scheme for name, (scheme, shape) in burn_sweep.cases_for(version).items() if shape == WHOLE}
    names = {name: f"case{i}.weight" for i, name in enumerate(cases)}
    source = save_f32(folder / "cases.safetensors", {names[n]: sample(WHOLE, i) for i, n in enumerate(cases)})
    recipe = folder / "cases.toml"
    recipe.write_text("version = 1\n\n" + "\n".join(recipe_rule(names[n], s) for n, s in cases.items()))
    out = folder / "cases.bpk"
    result = cli("quantize", source, "-o", out, "--recipe", recipe, "--device", "cpu", "--burn-version", version)
    assert result.code == 0, result.err
    return out


@pytest.fixture(scope="module", params=LIVE_VERSIONS)
def through_the_cli(request, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """For each Burn release the tests run, every case it has a form for, through the CLI."""
    return request.param, quantize_every_case(tmp_path_factory.mktemp("recipe"), request.param)


@pytest.mark.parametrize("backend", BACKENDS, ids=str)
def test_a_recipe_of_every_scheme_decodes_in_burn_wherever_the_table_accepts_it(backend, through_the_cli, tmp_path):
    """The whole CLI path (plan, pipeline, writer, verify): every tensor the table says `backend` loads,
    Burn decodes bit for bit as qcli does."""
    version, out = through_the_cli
    skip_unmeasured(backend, version)
    reader = BurnpackReader.open(out)
    decoded = probe(backend, out, tmp_path / "decoded.safetensors", version)
    accepted = 0
    for entry in reader.entries():
        scheme = entry.dtype.scheme
        if decode_problem(backend, scheme, entry.shape, version) is None:
            accepted += 1
            want = decode(bytes(reader.read(entry.name)), scheme, entry.shape)
            got = decoded[entry.name]
            assert isinstance(got, torch.Tensor) and same_bits(got, want), f"{entry.name} ({scheme}): {got}"
    assert accepted > 0


@pytest.mark.parametrize("version", RECORDED)
def test_the_cli_writes_for_a_recorded_release_the_tensors_it_writes_for_the_default(version, tmp_path):
    """Every case through the CLI for a RECORDED release is, tensor for tensor, the scheme and the bytes the CLI
    writes for the default release (which the test above runs in Burn), the file naming `version`: its
    decode in Burn is the sweep's, which its record holds the table to."""
    assert burn_sweep.cases_for(version) == burn_sweep.cases_for(BURN_VERSION)
    (tmp_path / "recorded").mkdir(), (tmp_path / "default").mkdir()
    recorded = BurnpackReader.open(quantize_every_case(tmp_path / "recorded", version))
    default = BurnpackReader.open(quantize_every_case(tmp_path / "default", BURN_VERSION))
    assert recorded.metadata["burn_version"] == version
    assert [(e.name, e.shape, e.dtype.scheme) for e in recorded.entries()] == \
        [(e.name, e.shape, e.dtype.scheme) for e in default.entries()]
    for entry in recorded.entries():
        assert bytes(recorded.read(entry.name)) == bytes(default.read(entry.name)), entry.name
