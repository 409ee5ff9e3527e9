"""What the tests of already-quantized formats share: qcli's decode of a written file held to the format's
own dequantization and to Burn's, both pipelines' payloads for one checkpoint, and `validate-scheme
--model`'s problems for a recipe, and a refusal made from the headers alone."""

from __future__ import annotations

import json
from collections.abc import Collection
from pathlib import Path

import pytest
import torch

from qcli.burn_backends import BurnBackend
from qcli.codec import decode
from qcli.errors import PlanError
from qcli.io.burnpack import BurnpackReader
from qcli.io.dtypes import QFloat
from qcli.io.gguf import GgufSource
from qcli.io.readers import open_source
from qcli.io.safetensors import SafetensorsSource
from qcli.pipeline import GpuSettings
from qcli.plan.decisions import make_plan
from qcli.plan.entries import Plan
from qcli.problem import Problem
from tests.burn_harness import dequantize, same_bits
from tests.cli_support import cli


def refused_from_headers(monkeypatch: pytest.MonkeyPatch, source: Path, target: Path, **options: object
                         ) -> list[Problem]:
    """The problems of the plan `quantize_file(source, target, **options)` refuses, made with no tensor
    read: every source's `load` fails the test while it plans."""
    from qcli.commands.quantize import quantize_file

    def no_read(self: object, name: str) -> None:
        raise AssertionError(f"read {name}")

    with monkeypatch.context() as patched:
        for reader in (SafetensorsSource, GgufSource):
            patched.setattr(reader, "load", no_read)
        with pytest.raises(PlanError) as raised:
            quantize_file(source, target, **options)
    return raised.value.problems


def decoded(bpk: Path, names: Collection[str] | None = None) -> dict[str, torch.Tensor]:
    """qcli's decode (`qcli.codec.decode`) of every quantized tensor of `bpk`, or of those in `names`."""
    reader = BurnpackReader.open(bpk)
    return {e.name: decode(bytes(reader.read(e.name)), e.dtype.scheme, e.shape) for e in reader.entries()
            if isinstance(e.dtype, QFloat) and (names is None or e.name in names)}


def model_problems(recipe: str, model: Path, scratch: Path, *flags: str, code: int = 0) -> list[dict]:
    """The problems `validate-scheme --json` reports for the recipe text `recipe` on `model` (with `flags`),
    after asserting it exits with `code`."""
    path = scratch / "recipe.toml"
    path.write_text(recipe)
    result = cli("validate-scheme", path, "--model", model, *flags, "--json")
    assert result.code == code, result.out + result.err
    return json.loads(result.out)["problems"]


def pipeline_payloads(path: Path) -> tuple[Plan, list[bytes], list[bytes]]:
    """The default plan of the checkpoint at `path`, and the CPU and GPU pipelines' payloads for it in plan
    order (the GPU one under TRITON_INTERPRET on the CPU, read in pieces of 1000 bytes)."""
    from qcli.pipeline import cpu, gpu

    with open_source(path) as source:
        plan = make_plan(source.infos())
        want = [bytes(p.data.numpy()) for p in cpu.run(plan, source)]
        got = [bytes(p.data.numpy()) for p in gpu.run(plan, source, settings=GpuSettings(piece_bytes=1000))]
    return plan, want, got


def assert_burn_decodes_as_qcli(bpk: Path, want: dict[str, torch.Tensor], backend: BurnBackend, scratch: Path) -> None:
    """qcli's decode of `bpk` is `want` (the format's own dequantization) bit for bit, and Burn's `backend`
    decodes the file to the same bits (`scratch`: a folder for the harness's output)."""
    burn, mine = dequantize(backend, bpk, scratch / "burn.safetensors"), decoded(bpk)
    for name, values in want.items():
        assert same_bits(mine[name], values), name
        assert same_bits(burn[name], mine[name]), f"{name}: Burn ({backend}) decodes other values than qcli"
