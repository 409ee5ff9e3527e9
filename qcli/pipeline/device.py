"""Which pipeline a run takes, from `--device` and the environment, read here once for the run."""

from __future__ import annotations

import os
from collections.abc import Mapping
from functools import partial

from qcli.errors import UsageError
from qcli.pipeline import GpuSettings, Pipeline

DEVICES = ("auto", "cpu", "cuda")


def select_pipeline(device: str, environ: Mapping[str, str] = os.environ) -> tuple[str, Pipeline]:
    """`(device, run)`: auto is cuda when torch sees a GPU; QCLI_KERNELS=triton forces the GPU pipeline,
    which takes its `GpuSettings` from `environ`."""
    if device not in DEVICES:
        raise UsageError(f"unknown device {device!r}", hint="use --device auto, cpu or cuda")
    if environ.get("QCLI_KERNELS") == "triton":
        device = "triton"
    else:
        import torch

        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        elif device == "cuda" and not torch.cuda.is_available():
            raise UsageError(
                "--device cuda: torch sees no CUDA device",
                hint="use --device cpu (or auto), or install a CUDA build of torch before qcli",
            )
    if device == "cpu":
        from qcli.pipeline import cpu

        return device, cpu.run
    try:
        from qcli.pipeline import gpu
    except ImportError as exc:
        raise UsageError(
            f"the GPU pipeline is unavailable: {exc}", hint="use --device cpu, or install qcli with triton"
        ) from None
    return device, partial(gpu.run, settings=GpuSettings.from_env(environ))
