"""Hostile input must be refused, never hang: what its tests share.

A test holds that the refusal ends, not how fast: a limit in seconds fails on a busy machine as surely as on
a regression. HANG_SECONDS is far above what any refusal takes on a loaded machine, and far below what the
hangs these tests were written against took (a FIFO or /dev/zero read forever, CBOR shared references and
colliding map keys for hours). The times themselves are bench/hostile.py's (docs/benchmarks.md).
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from tests.cli_support import ROOT, child_env

HANG_SECONDS = 60


class Hang(BaseException):  # not an Exception: no handler in qcli may swallow it
    pass


@contextmanager
def never_hangs(seconds: float = HANG_SECONDS) -> Iterator[None]:
    """Raise `Hang` in the block once it has run `seconds`: a blocked open or read, or a loop in Python.

    A loop inside C (a backtracking `re`, cbor2 building a map) holds the interpreter until it returns;
    `ends` runs such a case in a child process, which can be stopped whatever it does.
    """

    def on_alarm(*_: object) -> None:
        raise Hang(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def ends(script: str, *args: object, seconds: float = HANG_SECONDS) -> subprocess.CompletedProcess[str]:
    """`script` run with `args` (its `sys.argv[1:]`) by a new interpreter with the repository on its path; it
    must exit 0 within `seconds` (its assertions fail it, and a hang is killed as one)."""
    try:
        result = subprocess.run([sys.executable, "-c", script, *map(str, args)], cwd=ROOT, capture_output=True,
                                text=True, timeout=seconds, env=child_env())
    except subprocess.TimeoutExpired:
        raise Hang(f"still running after {seconds} s") from None
    assert result.returncode == 0, result.stderr
    return result
