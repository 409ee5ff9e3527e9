"""Burn 0.23.0-pre.1, the pre-release: `--burn-version 0.23` held to its harness (tests/burn-0.23) both ways.

tests/io/test_burn_023_recorded.py holds the 0.23 table to recorded runs of that harness (decode and compute,
flex and wgpu on lavapipe, and wgpu with the tile kernels; CI does not build it), the PackedU32(1) cases of
tests/burn-0.23/packed_dim1.py included, which qcli itself does not write yet (its `accept_problems` refuses
an outer packing axis). Here: the options accept what that table accepts and refuse what it refuses, as
0.22.1's table does not, in both directions; 0.23 is never the default; its files carry 0.22's serde keys
and 0.23's file limit (tests/reliability/test_limits.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from qcli import BURN_VERSION
from qcli.burn_backends import BURN_VERSIONS, PRE_RELEASES, BurnBackend, load_problem, resolve_version
from qcli.io.burnpack import BurnpackReader
from qcli.presets import PRESETS
from tests.burn_harness import HARNESSES, RECORDED
from tests.cli_support import SAMPLES, cli

VERSION = "0.23.0-pre.1"
SOURCE = SAMPLES / "tiny-llama.safetensors"


def quantize(tmp_path: Path, *args: str):
    return cli("quantize", SOURCE, "-o", tmp_path / "out.bpk", "--device", "cpu", *args)


def test_0_23_is_named_by_its_minor_version_and_never_the_default() -> None:
    assert resolve_version("0.23") == resolve_version("0.23.0-pre.1") == VERSION
    assert resolve_version(None) == BURN_VERSION != VERSION and BURN_VERSIONS[0] == BURN_VERSION
    assert VERSION in PRE_RELEASES and VERSION in HARNESSES and VERSION in RECORDED
    lines = cli("quantize", SOURCE, "-o", "x.bpk", "--burn-version", "0.23.0", "--dry-run").err.splitlines()
    assert "is not a release qcli writes for" in lines[0] and "0.23.0-pre.1 (pre-release)" in lines[-1]


def test_help_marks_0_23_as_a_pre_release() -> None:
    help_text = " ".join(cli("quantize", "--help").out.split())
    assert "0.23.0-pre.1 (pre-release)" in help_text and "never the default" in help_text


def test_a_file_for_0_23_names_it_and_keeps_0_22s_serde_keys(tmp_path: Path) -> None:
    """cubecl-common 0.12.0-pre.1 (Burn 0.23's QuantScheme) has 0.11's fields: value, store, mode, tensor,
    block; no `param` or `level` as for 0.21."""
    result = quantize(tmp_path, "--scheme", "q4s-b32", "--burn-version", "0.23")
    assert result.code == 0, result.err
    reader = BurnpackReader.open(tmp_path / "out.bpk")
    assert reader.metadata["burn_version"] == VERSION
    serde = next(e for e in reader.entries() if e.name == "lm_head.weight").dtype.to_serde()["QFloat"]
    assert set(serde) == {"value", "store", "mode", "tensor", "block"}


# (backend, preset): Burn 0.23 computes it where 0.22.1's table refuses it, and the reverse.
ACCEPTED_BY_0_23_ONLY = [
    (BurnBackend.flex, "fp4-b32"),  # 0.23's flex decodes minifloats
    (BurnBackend.flex, "e4m3-b32"),
    (BurnBackend.wgpu, "q2s-b32"),  # 0.23's wgpu matmul fits lavapipe's shared memory
    (BurnBackend.wgpu, "q4s-b32"),  # 0.22.1's fails on an NVIDIA GPU; 0.23 measured on lavapipe only
]
REFUSED_BY_BOTH = [(BurnBackend.flex, "q4f-b32"), (BurnBackend.wgpu, "e4m3"), (BurnBackend.wgpu, "q8s-native")]


@pytest.mark.parametrize(("backend", "preset"), ACCEPTED_BY_0_23_ONLY, ids=str)
def test_burn_backend_follows_the_0_23_table_where_it_accepts_more(backend, preset, tmp_path: Path) -> None:
    scheme = PRESETS[preset].scheme
    assert load_problem(backend, scheme, (), VERSION) is None
    assert load_problem(backend, scheme, (), BURN_VERSION) is not None
    target = ["--scheme", preset, "--burn-backend", backend.value, "--transpose", "--dry-run"]
    assert quantize(tmp_path, *target, "--burn-version", "0.23").code == 0
    refused = quantize(tmp_path, *target)
    assert refused.code == 2 and f"{backend} backend cannot" in refused.err


@pytest.mark.parametrize(("backend", "preset"), REFUSED_BY_BOTH, ids=str)
def test_burn_backend_follows_the_0_23_table_where_it_refuses(backend, preset, tmp_path: Path) -> None:
    why = load_problem(backend, PRESETS[preset].scheme, (), VERSION)
    assert why is not None
    result = quantize(tmp_path, "--scheme", preset, "--burn-backend", backend.value, "--burn-version", "0.23",
                      "--transpose", "--dry-run")
    assert result.code == 2 and f"{backend} backend cannot" in result.err
    assert " ".join(why.split()[:6]) in " ".join(result.err.split())


@pytest.mark.parametrize("backend", ["ndarray", "cuda"])
def test_a_backend_0_23_has_no_table_for_is_refused_with_the_reason(backend, tmp_path: Path) -> None:
    result = quantize(tmp_path, "--burn-backend", backend, "--burn-version", "0.23", "--dry-run")
    assert result.code == 2
    err = " ".join(result.err.split())
    assert ("Burn 0.23 has no ndarray backend" if backend == "ndarray" else
            "Burn 0.23.0-pre.1's cuda backend is not measured") in err


def test_without_a_scheme_burn_backend_writes_0_23s_best_form(tmp_path: Path) -> None:
    result = quantize(tmp_path, "--burn-backend", "flex", "--burn-version", "0.23", "--transpose")
    assert result.code == 0, result.err
    assert BurnpackReader.open(tmp_path / "out.bpk").metadata["preset"] == "q4s-b32"
