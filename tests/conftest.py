"""Fixtures used by several test modules."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file


@pytest.fixture(scope="session")
def small_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real checkpoint written by `safetensors` itself, holding what a PyTorch model saves: F32 conv,
    bias and linear weights, a BF16 matrix, and I64 tensors, a scalar (num_batches_tracked) among them."""
    generator = torch.Generator().manual_seed(0)
    tensors = {
        "conv1.weight": torch.randn(8, 1, 3, 3, generator=generator),
        "conv1.bias": torch.randn(8, generator=generator),
        "fc1.weight": torch.randn(64, 32, generator=generator),
        "embed.weight": torch.randn(16, 32, generator=generator).to(torch.bfloat16),
        "positions": torch.arange(4),
        "norm1.num_batches_tracked": torch.tensor(938),
    }
    path = tmp_path_factory.mktemp("checkpoint") / "model.safetensors"
    save_file(tensors, path)
    return path
