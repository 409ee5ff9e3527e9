"""Where output goes: data (tables, JSON) on stdout; progress, warnings, errors and hints on stderr."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.text import Text

from qcli.io.safetensors import printable

if TYPE_CHECKING:
    from qcli.commands.quantize import ProgressHook

# Piped output is data: wide enough that tensor names are not folded (unless COLUMNS says otherwise).
PIPE_WIDTH = 200


def stdout() -> Console:
    console = Console(highlight=False, markup=False)
    if not console.is_terminal and not os.environ.get("COLUMNS", "").isdigit():
        console = Console(highlight=False, markup=False, width=PIPE_WIDTH)
    return console


def stderr() -> Console:
    return Console(stderr=True, highlight=False, markup=False)


def print_json(doc: dict) -> None:
    """One JSON document on stdout (no NaN or infinity: those are written as null by the reports)."""
    sys.stdout.write(json.dumps(doc, indent=2, allow_nan=False) + "\n")
    sys.stdout.flush()


def warn(message: str) -> None:
    """`warning: …` on stderr; the message is printed as it is (no markup)."""
    stderr().print(Text.assemble(("warning", "yellow"), f": {printable(message)}"), soft_wrap=True)


def progress_enabled() -> bool:
    """Progress draws only for a person watching stderr: not with NO_COLOR, QCLI_NO_PROGRESS, or a piped
    stderr. --json does not turn it off: the document goes to stdout, the bar to stderr."""
    return not (os.environ.get("NO_COLOR") or os.environ.get("QCLI_NO_PROGRESS") or not sys.stderr.isatty())


@contextmanager
def progress_bar(enabled: bool) -> Iterator[ProgressHook | None]:
    """A `ProgressHook` drawing bytes, rate, ETA and the current tensor on stderr, or None."""
    if not enabled:
        yield None
        return
    columns = (
        TextColumn("{task.description}", style="cyan", markup=False),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=stderr(), transient=True) as progress:
        task = progress.add_task("planning", total=None)

        def hook(current: str | None, done: int, total: int) -> None:
            progress.update(task, description=current or "committing", completed=done, total=total)

        yield hook


def human_bytes(n: float) -> str:
    """Binary units, three significant digits: `1.50 MiB`, `1020 KiB`."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" or abs(n) >= 100 else f"{n:.3g} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def shape_text(shape: Sequence[int]) -> str:
    return "×".join(map(str, shape)) if len(shape) else "scalar"


def number(x: float | None, fmt: str) -> str:
    """A float for a table cell; None (no value, or an exact result's infinite SQNR) as `-` or `inf`."""
    if x is None:
        return "-"
    return "inf" if x == float("inf") else format(x, fmt)
