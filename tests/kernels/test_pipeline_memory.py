"""The GPU pipeline's host buffers: page-locked at the size asked for (torch's pinned allocator rounds every
buffer up to a power of two, which took a 558 MB payload buffer to 1 GiB), and where CUDA refuses to
register them, torch's pinned allocator gives them still."""

from __future__ import annotations

import pytest
import torch

from qcli.resident import resident_bytes

MB = 1 << 20
OUT = 600 * MB + 5  # past 512 MiB: torch's pinned allocator would take 1 GiB for it


@pytest.mark.gpu
def test_the_stages_buffers_are_page_locked_at_their_exact_size():
    from qcli.pipeline import gpu

    before = resident_bytes()
    stage = gpu._Stage(torch.device("cuda"), 3 * MB, OUT)
    try:
        grown = resident_bytes() - before
        assert [b.numel() for b in stage.outputs] == [OUT, OUT]
        assert all(b.is_pinned() for b in (*stage.staging, *stage.outputs))
        assert len(stage.registered) == 4
        assert grown < 1.25 * (2 * OUT + 6 * MB), grown  # 2 GiB and more where rounded up
    finally:
        stage.close()
    assert not any(b.is_pinned() for b in stage.outputs)


@pytest.mark.gpu
def test_where_cuda_refuses_to_register_them_torch_pins_them(monkeypatch):
    from qcli.pipeline import gpu

    monkeypatch.setattr(gpu, "_registered", lambda buffer: False)
    stage = gpu._Stage(torch.device("cuda"), 3 * MB, 5 * MB)
    try:
        assert stage.registered == []
        assert all(b.is_pinned() for b in (*stage.staging, *stage.outputs))
    finally:
        stage.close()


@pytest.mark.gpu
def test_a_refused_registration_leaves_no_error_for_torchs_next_launch():
    """A refusal (here: a buffer registered twice) stays on the thread that asked, so torch's check of the
    last CUDA error after its next kernel finds nothing."""
    from qcli.pipeline import gpu

    buffer = torch.empty(MB, dtype=torch.uint8)
    assert gpu._registered(buffer)
    try:
        assert not gpu._registered(buffer)
        assert torch.ones(4, device="cuda").sum().item() == 4.0
    finally:
        assert gpu._unregistered(buffer)
