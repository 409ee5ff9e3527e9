"""The Burn harness (tests/burn): built once per test run with cargo, run as a child process.

Tests that use it carry the `burn` marker. Where cargo is missing they run a harness already in the target
directory (one copied to a machine without Rust: only as current as the sources it was built from), else
they skip; where no Vulkan driver is installed the wgpu backend's tests skip, each with the reason; under
CI=true both fail instead, so a CI machine cannot pass without Burn.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from qcli import BURN_VERSION
from qcli.burn_backends import BURN_VERSIONS, BurnBackend
from qcli.scheme import PackedU32, QuantScheme, QuantValue, ScaleDtype

CRATE = Path(__file__).parent / "burn"
FIXTURES = Path(__file__).parent / "data" / "burn"
# The harness of each Burn release qcli writes for: its crate and binary.
HARNESSES = {"0.22.1": (CRATE, "burn-harness"), "0.21.0": (Path(__file__).parent / "burn-0.21", "burn-harness-021"),
             "0.23.0-pre.1": (Path(__file__).parent / "burn-0.23", "burn-harness-023")}
assert tuple(HARNESSES) == BURN_VERSIONS
# The releases whose harness the tests do not build or run: each is held to recorded runs of it instead
# (Burn 0.23.0-pre.1: tests/data/burn/flex-0.23, wgpu-0.23 and wgpu-0.23-tile, by
# tests/io/test_burn_023_recorded.py; docs/output.md has the commands that rebuild and rerun it), as CI has
# no time for a third build. LIVE_HARNESSES are the rest, which the tests build and run.
RECORDED = ("0.23.0-pre.1",)
LIVE_HARNESSES = {version: harness for version, harness in HARNESSES.items() if version not in RECORDED}
assert set(RECORDED) <= set(HARNESSES) and LIVE_HARNESSES and next(iter(LIVE_HARNESSES)) == BURN_VERSION
# Burn 0.23's harness built with burn-cubecl's `tile-kernels-only` (its `tile-kernels` feature): wgpu's matmul
# runs cubek's tile kernels alone, which read a quantized weight packed where its form allows.
TILE_VERSION, TILE_FEATURE = "0.23.0-pre.1", "tile-kernels"
# Outside the clone, so a fresh clone reuses an earlier build (.ci/run builds the same directories).
TARGET_ROOT = Path(os.environ.get("QCLI_BURN_TARGET_DIR", Path.home() / ".cache" / "qcli"))
VULKAN_ICDS = (Path("/usr/share/vulkan/icd.d"), Path("/etc/vulkan/icd.d"))
# The backends the harness runs here; cuda needs an NVIDIA GPU, and its table is held to a run recorded on one
# (tests/io/test_burn_cuda.py).
BACKENDS = tuple(b for b in BurnBackend if b is not BurnBackend.cuda)


def _unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason}, and CI needs it (.ci/run installs it)")
    pytest.skip(reason)


def target_dir(version: str, tile: bool = False) -> Path:
    """Where cargo builds the harness of Burn `version` (.ci/run builds there too), with `tile`: its build with
    the tile kernels (burn-harness-0.23-tile)."""
    name = HARNESSES[version][0].name.replace("burn", "burn-harness")  # burn-harness-0.21
    return TARGET_ROOT / (f"{name}-tile" if tile else name)


@functools.cache
def _build(version: str, tile: bool = False) -> Path | str:
    """The harness binary for Burn `version` (`tile`: built with the tile kernels), or why it could not be
    built."""
    crate, binary = HARNESSES[version]
    cargo = shutil.which("cargo")
    if cargo is None:
        built = target_dir(version, tile) / "debug" / binary
        return built if built.is_file() else "cargo is not installed: the Burn harness cannot be built"
    features = ["--features", TILE_FEATURE] if tile else []
    done = subprocess.run([cargo, "build", "--quiet", "--bins", "--examples", *features, "--manifest-path",
                           str(crate / "Cargo.toml"), "--target-dir", str(target_dir(version, tile))],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.fail(f"the Burn {version} harness{' (tile kernels)' if tile else ''} did not build:\n"
                    f"{done.stderr[-4000:]}")
    return target_dir(version, tile) / "debug" / binary


def build_before_tests(say) -> None:
    """Build every harness before the first test, saying so (`say`: a line on the terminal): a first
    build on a fresh machine downloads the crates and compiles Burn, which no test output would explain."""
    for version, (crate, binary) in LIVE_HARNESSES.items():
        fresh = not (target_dir(version) / "debug" / binary).exists()
        say(f"building the Burn {version} harness ({crate.relative_to(CRATE.parent.parent)}) with cargo into "
            f"{target_dir(version)}" + (": the first build downloads about 80 MB of crates (0.7 GB unpacked in "
                                        "~/.cargo/registry), takes about 15 minutes on two cores and 3.1 GB in "
                                        "~/.cache/qcli; later runs reuse it" if fresh else ""))
        started = time.monotonic()
        try:
            built = _build(version)
        except pytest.fail.Exception:
            say(f"the Burn {version} harness did not build: its tests say why")
            continue
        say(built if isinstance(built, str) else f"  done in {time.monotonic() - started:.0f} s")


def harness(version: str = BURN_VERSION) -> Path:
    """The built harness of Burn `version`; skips (or fails under CI) where cargo is missing. No test runs
    a RECORDED release's harness (its record is rerun by hand, docs/output.md)."""
    assert version in LIVE_HARNESSES, f"Burn {version}'s harness is not run by the tests: see RECORDED"
    built = _build(version)
    if isinstance(built, str):
        _unavailable(built)
    return built


def example(name: str) -> Path:
    """An example program of the harness crate (tests/burn/examples), built with it."""
    return harness().parent / "examples" / name


def require(backend: BurnBackend, version: str = BURN_VERSION) -> None:
    """Skip (or fail under CI) when `backend` cannot run here: wgpu needs a Vulkan driver."""
    harness(version)
    if backend is BurnBackend.wgpu and not any(any(d.glob("*.json")) for d in VULKAN_ICDS if d.is_dir()):
        _unavailable("no Vulkan driver is installed (Debian: mesa-vulkan-drivers), so wgpu has no device")


@dataclass
class Run:
    code: int
    out: str
    err: str


def run(*args: str | Path, version: str = BURN_VERSION) -> Run:
    """The harness of Burn `version` with `args`."""
    return run_program(harness(version), *args)


def run_program(program: Path, *args: str | Path) -> Run:
    """A program of the harness crate (the harness, an example) with `args`; wgpu gets a runtime directory
    of its own so it does not warn about one."""
    env = dict(os.environ)
    env.setdefault("XDG_RUNTIME_DIR", tempfile.gettempdir())
    done = subprocess.run([str(program), *map(str, args)], capture_output=True, text=True, env=env, timeout=600)
    return Run(done.returncode, done.stdout, done.stderr)


KEPT_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def qcli_decodes(bpk: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a qcli file as qcli decodes it, kept float tensors widened to f32."""
    from qcli.codec import decode
    from qcli.io.burnpack import BurnpackReader
    from qcli.io.dtypes import QFloat

    reader = BurnpackReader.open(bpk)
    decoded = {}
    for entry in reader.entries():
        data = bytearray(reader.read(entry.name))
        if isinstance(entry.dtype, QFloat):
            decoded[entry.name] = decode(bytes(data), entry.dtype.scheme, entry.shape)
        else:
            decoded[entry.name] = torch.frombuffer(data, dtype=KEPT_DTYPES[entry.dtype]).reshape(entry.shape).float()
    return decoded


# Figures the tests measured in Burn, one line each, for the terminal summary (tests/conftest.py).
FIGURES: list[str] = []


def dequantize(backend: BurnBackend, bpk: Path, out: Path, version: str = BURN_VERSION) -> dict[str, torch.Tensor]:
    """What Burn decodes every tensor of `bpk` to on `backend`, as f32; fails the test on a Burn error."""
    require(backend, version)
    done = run("dequantize", "--backend", backend.value, bpk, out, version=version)
    assert done.code == 0, f"Burn ({backend}) could not decode {bpk.name}:\n{done.err[-4000:]}"
    return load_file(out)


def probe(backend: BurnBackend, bpk: Path, out: Path, version: str = BURN_VERSION) -> dict[str, torch.Tensor | str]:
    """Each tensor of `bpk` decoded by Burn `version` on `backend` (f32), or Burn's error message for it."""
    require(backend, version)
    done = run("probe", "--backend", backend.value, bpk, out, version=version)
    assert done.code == 0, f"the harness failed on {bpk.name}:\n{done.err[-4000:]}"
    decoded = load_file(out)
    verdicts = [json.loads(line) for line in done.out.splitlines()]
    return {v["name"]: decoded[v["name"]] if v["ok"] else v["error"] for v in verdicts}


def compute(backend: BurnBackend, bpk: Path, version: str = BURN_VERSION) -> list[dict]:
    """The `compute` verdicts of Burn `version`'s harness for `bpk` on `backend`: each op a model runs on each
    2-D quantized tensor, against the same op on its `dequantize()`."""
    require(backend, version)
    done = run("compute", "--backend", backend.value, bpk, version=version)
    assert done.code == 0, f"the harness failed on {bpk.name}:\n{done.err[-4000:]}"
    return [json.loads(line) for line in done.out.splitlines()]


def save_f32(path: Path, tensors: dict[str, torch.Tensor]) -> Path:
    save_file({name: t.to(torch.float32).contiguous() for name, t in tensors.items()}, str(path))
    return path


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-identical f32 tensors of the same shape (NaNs and signed zeros included)."""
    a, b = a.to(torch.float32).contiguous(), b.to(torch.float32).contiguous()
    return a.shape == b.shape and torch.equal(a.view(torch.int32), b.view(torch.int32))


# Files Burn wrote, for the tests to read: a Linear stack saved by `BurnpackStore`, as f32 and with its
# weights quantized by Burn's own quantizer on flex and on wgpu. Regenerate with `python3 tests/burn_harness.py`.
FIXTURE_SOURCE = "linear.safetensors"
FIXTURE_SCHEMES: dict[str, tuple[BurnBackend, QuantScheme | None]] = {
    "linear-f32.bpk": (BurnBackend.flex, None),
    "linear-q8s-b32.bpk": (
        BurnBackend.flex,
        QuantScheme().with_value(QuantValue.Q8S).with_store(PackedU32(0)).per_block([32], ScaleDtype.F32),
    ),
    "linear-q4s-b32.bpk": (
        BurnBackend.wgpu,
        QuantScheme().with_value(QuantValue.Q4S).with_store(PackedU32(0)).per_block([32], ScaleDtype.F16),
    ),
}


def write_fixtures(directory: Path) -> None:
    """FIXTURE_SOURCE (seeded weights, [d_input, d_output] as Burn's Row layout keeps them) and each of
    FIXTURE_SCHEMES written from it by the harness, into `directory`."""
    generator = torch.Generator().manual_seed(0)
    weights = {
        "layers.0.weight": torch.randn(128, 64, generator=generator) * 0.05,
        "layers.0.bias": torch.randn(64, generator=generator) * 0.1,
        "layers.1.weight": torch.randn(64, 32, generator=generator) * 0.05,
        "layers.1.bias": torch.randn(32, generator=generator) * 0.1,
    }
    weights["layers.0.weight"][5, 7] = 1.25  # an outlier, so blocks get different scales
    save_f32(directory / FIXTURE_SOURCE, weights)
    for name, (backend, scheme) in FIXTURE_SCHEMES.items():
        require(backend)
        scheme_args = [] if scheme is None else ["--scheme", json.dumps(scheme.to_serde())]
        done = run("write-fixture", "--backend", backend.value, *scheme_args, directory / FIXTURE_SOURCE,
                   directory / name)
        assert done.code == 0, f"the harness could not write {name}:\n{done.err[-4000:]}"


if __name__ == "__main__":
    write_fixtures(FIXTURES)
