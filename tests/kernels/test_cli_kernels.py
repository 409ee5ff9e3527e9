"""`QCLI_KERNELS=triton` routes `qcli quantize` through the GPU pipeline; under TRITON_INTERPRET=1 it runs
on the CPU and must write the very bytes the CPU pipeline writes."""

from __future__ import annotations

import pytest

from tests.cli_support import SINGLE, cli, cli_subprocess


@pytest.mark.interpreter
def test_triton_pipeline_writes_the_cpu_pipelines_bytes(tmp_path):
    cpu, triton = tmp_path / "cpu.bpk", tmp_path / "triton.bpk"
    assert cli("quantize", SINGLE, "-o", cpu, "--device", "cpu", "--no-stats").code == 0
    env = {"QCLI_KERNELS": "triton", "TRITON_INTERPRET": "1"}
    result = cli_subprocess("quantize", SINGLE, "-o", triton, "--no-stats", "--json", env=env)
    assert result.code == 0, result.err
    assert '"device": "triton"' in result.out
    assert triton.read_bytes() == cpu.read_bytes()
