"""Inputs for the tests that run the kernels and the pipelines: values over many binary orders of
magnitude, and a checkpoint with the plan both pipelines run."""

from __future__ import annotations

from pathlib import Path

import torch

from qcli.scheme import Calibration, QuantScheme, QuantValue, ScaleDtype


def wide(shape, seed: int) -> torch.Tensor:
    """Random values over many binary orders of magnitude, signs mixed, never zero."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.exp(torch.randn(shape, generator=g) * 3)
    return torch.where(x == 0, 1.0, x)


def fixed_plan(path: Path, decisions: dict):
    """The plan of the checkpoint at `path` that takes each tensor's decision from `decisions`, and the
    open source."""
    from qcli.io.safetensors import SafetensorsSource
    from qcli.plan.entries import Decision, Plan, PlanEntry

    source = SafetensorsSource.open(path)
    entries = [PlanEntry(info, Decision(*decisions[info.name], reason="test", rule=None))
               for info in source.infos()]
    return Plan(entries, []), source


def checkpoint(tmp_path: Path) -> tuple[Path, dict]:
    """Two shards' worth of tensors in one file: bf16, f32 and f16 weights, a 3-D one, kept norms and ints."""
    from safetensors.torch import save_file

    tensors = {
        "embed.weight": wide((67, 96), 1).to(torch.bfloat16),
        "layers.0.attn.q.weight": wide((64, 96), 2),
        "layers.0.mlp.up.weight": wide((40, 33), 3).to(torch.float16),
        "layers.0.conv.weight": wide((6, 4, 32), 4).to(torch.bfloat16),
        "layers.0.norm.weight": wide((96,), 5),
        "position_ids": torch.arange(12, dtype=torch.int64).reshape(3, 4),
        "lm_head.weight": wide((96, 64), 6).to(torch.bfloat16),
    }
    path = tmp_path / "model.safetensors"
    save_file(tensors, str(path))
    q4 = QuantScheme().with_value(QuantValue.Q4S).per_block([32], ScaleDtype.F16)
    q2 = QuantScheme().with_value(QuantValue.Q2F).per_block([3, 1, 16], ScaleDtype.BF16)
    decisions = {
        "embed.weight": (QuantScheme.nvfp4(), Calibration.MinMax, False),
        "layers.0.attn.q.weight": (q4, Calibration.MinMax, False),
        "layers.0.mlp.up.weight": (QuantScheme().with_value(QuantValue.Q8S), Calibration.AbsMean, False),
        "layers.0.conv.weight": (q2, Calibration.MinMax, False),
        "layers.0.norm.weight": (None, Calibration.MinMax, False),
        "position_ids": (None, Calibration.MinMax, True),
        "lm_head.weight": (q4, Calibration.MinMax, True),
    }
    return path, decisions
