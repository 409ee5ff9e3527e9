"""Faults mid-run: the file-size limit, a full disk, SIGINT and SIGTERM.

In each case the target path keeps its old bytes, no temporary file is left beside it, and the exit
code says what happened (4: the output could not be written; 130: interrupted).
"""

from __future__ import annotations

import errno
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from tests.cli_support import ROOT, SINGLE, assert_user_error, child_env, cli

OLD = b"the previous output, which must survive"


SIGNALS = (signal.SIGINT, signal.SIGTERM)


def default_dispositions() -> None:
    """SIGINT and SIGTERM as a terminal gives them, whatever this run inherited: under `nohup` or in a
    background job SIGINT is ignored, and qcli (rightly) keeps ignoring what it was started ignoring."""
    for signum in SIGNALS:
        signal.signal(signum, signal.SIG_DFL)


def run_qcli(args: list[str | Path], preexec_fn=None, **kwargs) -> subprocess.Popen:
    """`python -m qcli ARGS`, started with the default disposition of the signals the tests send it."""

    def start() -> None:
        default_dispositions()
        if preexec_fn is not None:
            preexec_fn()

    return subprocess.Popen(
        [sys.executable, "-m", "qcli", *map(str, args)],
        cwd=ROOT,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=start,
        **kwargs,
    )


@pytest.fixture
def signals_delivered():
    """This process's SIGINT and SIGTERM as Python sets them up in a terminal (SIGINT raises
    KeyboardInterrupt), for the tests that signal it; put back afterwards."""
    previous = {signum: signal.getsignal(signum) for signum in SIGNALS}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    yield
    for signum, handler in previous.items():
        signal.signal(signum, handler)


def assert_untouched(folder: Path, target: Path) -> None:
    assert target.read_bytes() == OLD
    assert [p.name for p in folder.iterdir() if p.name.endswith(".tmp")] == []


def test_file_size_limit_mid_write(tmp_path: Path) -> None:
    """`ulimit -f`: the kernel answers EFBIG past 64 KiB of temporary file (Python ignores SIGXFSZ)."""
    target = tmp_path / "out.bpk"
    target.write_bytes(OLD)

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))

    proc = run_qcli(["quantize", SINGLE, "-o", target, "--device", "cpu", "--force"], preexec_fn=limit)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 4, err
    lines = err.strip().splitlines()
    assert lines[0] == f"error: cannot write {target}: File too large", err
    assert lines[-1].startswith("hint: ") and "Traceback" not in err
    assert_untouched(tmp_path, target)


def test_disk_full_at_fsync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ENOSPC reported late, by fsync, as delayed allocation and network filesystems do."""
    target = tmp_path / "out.bpk"
    target.write_bytes(OLD)

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    lines = assert_user_error(cli("quantize", SINGLE, "-o", target, "--device", "cpu", "--force"), 4)
    assert lines[0] == f"error: cannot write {target}: No space left on device"
    assert_untouched(tmp_path, target)


@pytest.fixture(scope="module")
def big_input(tmp_path_factory) -> Path:
    """64 MiB of weights: seconds of quantizing, time enough to be interrupted mid-write."""
    path = tmp_path_factory.mktemp("big") / "big.safetensors"
    g = torch.Generator().manual_seed(0)
    save_file({f"layers.{i}.weight": torch.randn(256, 1024, generator=g) for i in range(64)}, path)
    return path


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_mid_write(tmp_path: Path, big_input: Path, signum: int) -> None:
    target = tmp_path / "out.bpk"
    target.write_bytes(OLD)
    proc = run_qcli(["quantize", big_input, "-o", target, "--device", "cpu", "--force"])
    deadline = time.monotonic() + 120
    while not any(p.name.endswith(".tmp") for p in tmp_path.iterdir()):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.01)
    time.sleep(0.05)  # into the tensors (the CPU path quantizes all of them in well under a second)
    # Freeze the run, so that however late this process got to look, the signal lands while the
    # temporary file is still there: the target is not replaced yet.
    os.kill(proc.pid, signal.SIGSTOP)
    assert any(p.name.endswith(".tmp") for p in tmp_path.iterdir()), "finished before the signal"
    proc.send_signal(signum)
    os.kill(proc.pid, signal.SIGCONT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    lines = err.strip().splitlines()
    assert lines[0] == "error: interrupted" and lines[-1].startswith("hint: ") and "Traceback" not in err
    assert_untouched(tmp_path, target)


def test_interrupt_during_verification(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every tensor written, the file complete but not yet read back: an interrupt still leaves the target."""
    from qcli import output

    target = tmp_path / "out.bpk"
    target.write_bytes(OLD)

    def interrupted(*args, **kwargs):
        assert any(p.name.endswith(".tmp") for p in tmp_path.iterdir())  # complete, not yet renamed
        raise KeyboardInterrupt

    monkeypatch.setattr(output, "read_back", interrupted)
    lines = assert_user_error(cli("quantize", SINGLE, "-o", target, "--device", "cpu", "--force"), 130)
    assert lines[0] == "error: interrupted"
    assert_untouched(tmp_path, target)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupt_at_the_rename_is_held_until_the_output_is_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, signum: int, signals_delivered: None
) -> None:
    """A signal that arrives during the rename takes effect after it: exit 130, saying the output was written."""
    from qcli.io.burnpack import BurnpackWriter

    target = tmp_path / "out.bpk"
    target.write_bytes(OLD)
    real = BurnpackWriter.commit

    def commit(self) -> None:
        os.kill(os.getpid(), signum)
        time.sleep(0.05)  # time for the handler to run, were it to raise
        real(self)

    monkeypatch.setattr(BurnpackWriter, "commit", commit)
    lines = assert_user_error(cli("quantize", SINGLE, "-o", target, "--device", "cpu", "--force"), 130)
    assert lines[0] == f"error: interrupted after the output was written: {target} is complete"
    assert target.read_bytes()[:4] == b"NRUB"
    assert [p.name for p in tmp_path.iterdir()] == ["out.bpk"]
