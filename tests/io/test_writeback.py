"""Early writeback: the file's data is synced every STEP bytes written, and a failed sync is not lost."""

from __future__ import annotations

import errno
import os
import threading
from functools import partial
from pathlib import Path

import pytest

from qcli.errors import OutputError
from qcli.io import burnpack, writeback
from qcli.io.burnpack import BurnpackWriter, TensorEntry
from qcli.io.dtypes import Plain
from qcli.io.writeback import Writeback


def recording_sync(monkeypatch: pytest.MonkeyPatch, error: int | None = None) -> tuple[list[int], threading.Event]:
    """Replace the sync by one that records its calls, sets an event, and raises `error` if given."""
    calls, synced = [], threading.Event()

    def sync(fd: int) -> None:
        calls.append(fd)
        synced.set()
        if error is not None:
            raise OSError(error, os.strerror(error))

    monkeypatch.setattr(writeback, "_sync", sync)
    return calls, synced


@pytest.mark.parametrize(("reports", "synced_once"), [((60, 39), False), ((60, 40), True)],
                         ids=["short-of-a-step", "a-step"])
def test_a_step_written_is_synced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reports, synced_once) -> None:
    calls, synced = recording_sync(monkeypatch)
    with open(tmp_path / "f", "wb") as f:
        w = Writeback(f.fileno(), step=100)
        for n in reports:
            w.wrote(n)
        if synced_once:
            assert synced.wait(10)
        w.close()  # stops the thread: no sync can follow
        assert calls == ([f.fileno()] if synced_once else [])


def test_a_failed_sync_is_raised_at_close(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, synced = recording_sync(monkeypatch, errno.EIO)
    with open(tmp_path / "f", "wb") as f:
        w = Writeback(f.fileno(), step=1)
        w.wrote(1)
        assert synced.wait(10)
        with pytest.raises(OSError) as info:
            w.close()
    assert info.value.errno == errno.EIO


def test_real_syncs_of_a_file_being_written(tmp_path: Path) -> None:
    with open(tmp_path / "f", "wb") as f:
        w = Writeback(f.fileno(), step=4096)
        for _ in range(64):
            f.write(bytes(1024))
            f.flush()
            w.wrote(1024)
        w.close()
    assert (tmp_path / "f").stat().st_size == 64 * 1024


def test_writer_reports_a_failed_early_sync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A writeback error met by the early sync is an output error, and the target keeps its old bytes,
    although the closing fsync succeeds (Linux reports such an error once per open file)."""
    _, synced = recording_sync(monkeypatch, errno.EIO)
    monkeypatch.setattr(burnpack, "Writeback", partial(Writeback, step=1))
    target = tmp_path / "x.bpk"
    target.write_bytes(b"old")
    with pytest.raises(OutputError, match="cannot write .*x.bpk: Input/output error"):
        with BurnpackWriter(target, [TensorEntry("a", Plain.U8, (2,), 2)]) as writer:
            writer.write("a", b"\x01\x02")
            assert synced.wait(10)
            writer.commit()
    assert target.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["x.bpk"]
