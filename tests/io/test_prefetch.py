"""The input read into the page cache while the runtime loads: in plan order, up to its limit."""

from __future__ import annotations

import pytest

from qcli.pipeline import prefetch
from qcli.pipeline.prefetch import SLICE, Prefetch
from tests.kernel_support import checkpoint, fixed_plan


@pytest.mark.parametrize("sendfile", [True, False], ids=["sendfile", "scratch-buffer"])
def test_prefetch_reads_the_plans_tensors_up_to_its_limit(tmp_path, monkeypatch, sendfile):
    monkeypatch.setattr(prefetch, "SENDFILE", sendfile)
    path, decisions = checkpoint(tmp_path)
    plan, source = fixed_plan(path, decisions)
    source.close()
    total = sum(e.info.nbytes for e in plan.entries)
    whole = Prefetch(plan, 1 << 40)
    whole._thread.join()  # let it finish before stopping it
    assert whole.stop() == total
    first = plan.entries[0].info.nbytes
    part = Prefetch(plan, 1)
    part._thread.join()
    assert part.stop() == min(first, SLICE)  # the slice that reaches the limit is read whole
    assert Prefetch(plan, 0).stop() == 0
