"""Where output goes: data (tables, JSON) on stdout; progress, warnings, errors and hints on stderr."""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from rich import box
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.segment import Segment
from rich.table import Table
from rich.text import Text

from qcli.text import printable

if TYPE_CHECKING:
    from qcli.calibrate.runner import BlockDone
    from qcli.commands.quantize import ProgressHook

# The width of output that goes to no terminal, and of a COLUMNS that is no usable width (0, 1, garbage):
# the default summary fits it, every tensor name whole on its line.
DEFAULT_WIDTH = 80
MIN_WIDTH = 40
# The least room a tensor name is elided to, however many columns the others take.
MIN_NAME = 24
# The least of a long name's end that stays beside its start when the middle is elided.
TAIL = 13


def width(stream=None) -> int:
    """The columns output is laid out in: COLUMNS where it is a usable width, else the terminal's own
    width, else DEFAULT_WIDTH (piped output, a COLUMNS below MIN_WIDTH or not a number)."""
    columns = os.environ.get("COLUMNS")
    if columns is not None:
        return int(columns) if re.fullmatch(r"[0-9]{1,5}", columns) and int(columns) >= MIN_WIDTH else DEFAULT_WIDTH
    stream = stream or sys.stdout
    try:
        return max(os.get_terminal_size(stream.fileno()).columns, MIN_WIDTH) if stream.isatty() else DEFAULT_WIDTH
    except (OSError, ValueError, AttributeError):
        return DEFAULT_WIDTH


def stdout() -> Console:
    return Console(highlight=False, markup=False, width=width(sys.stdout))


def stderr() -> Console:
    return Console(stderr=True, highlight=False, markup=False, width=width(sys.stderr))


def fit_name(name: str, room: int) -> str:
    """`name` whole if it fits `room` columns, else its middle elided after its first number, so that what
    tells a model's rows apart stays: the layer (`model.layers.12.`) and the end (`….down_proj.weight`).
    A name without a number early in it keeps as much of its start as of its end."""
    if len(name) <= room:
        return name
    parts, head = name.split("."), ""
    for part in parts[:-1]:
        head += part + "."
        if part.isdigit():
            break
    if not any(p.isdigit() for p in parts[:-1]) or len(head) > room - TAIL:
        head = name[: (room - 1) // 2]
    return head + "…" + name[len(name) - (room - 1 - len(head)):]


def tensor_table(columns: Sequence[tuple[str, str]], rows: Sequence[Sequence[str]], width: int | None) -> Lines:
    """Rows of one tensor each, the name first: every cell on one line and none cut, each name whole or,
    where the other columns leave too little room in `width`, elided in its middle (`fit_name`). With no
    `width` (--verbose: every column) names stay whole too: print it with `wide()`. Laid out here, a
    header, a rule and a line a row, two spaces between columns: a rich Table measures every cell of
    every row again and takes half a millisecond a row, minutes for a header of 200,000 tensors."""
    room = None if width is None else max(width - natural_width(columns[1:], [r[1:] for r in rows]) - 2, MIN_NAME)
    cells = [[h for h, _ in columns], *([r[0] if room is None else fit_name(r[0], room), *r[1:]] for r in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    justify = [str.rjust if j == "right" else str.ljust for _, j in columns]
    lines = ["  ".join(pad(cell, w) for pad, cell, w in zip(justify, row, widths, strict=True)).rstrip()
             for row in cells]
    lines.insert(1, "─" * (sum(widths) + 2 * (len(widths) - 1)))
    return Lines(lines)


class Lines:
    """Lines laid out already, printed as they are: neither measured, wrapped nor cut by the console."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines

    def __rich_console__(self, console: Console, options: object) -> Iterator[Segment]:
        for line in self.lines:
            yield Segment(line)
            yield Segment.line()


def natural_width(columns: Sequence[tuple[str, str]], rows: Sequence[Sequence[str]]) -> int:
    """The columns a `tensor_table` of these cells takes with none of them cut."""
    widths = [max([len(header), *(len(row[i]) for row in rows)]) for i, (header, _) in enumerate(columns)]
    return sum(widths) + 2 * (len(columns) - 1)


def wide(columns: Sequence[tuple[str, str]], rows: Sequence[Sequence[str]]) -> Console:
    """A stdout console as wide as a `tensor_table` of these cells needs, and no narrower than `stdout()`:
    a long line wraps in the terminal rather than a cell in the table (--verbose)."""
    return Console(highlight=False, markup=False, width=max(width(sys.stdout), natural_width(columns, rows)))


class Footnotes:
    """Long texts shared by many rows (a decision's reason), each numbered once: a row shows the number,
    and `table` lists every text in full beneath."""

    def __init__(self, header: str) -> None:
        self.header = header
        self.texts: dict[str, str] = {}

    def key(self, text: str) -> str:
        return self.texts.setdefault(text, str(len(self.texts) + 1))

    def table(self, label: str) -> Table:
        table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1, 0, 0))
        table.add_column(self.header, justify="right", no_wrap=True)
        table.add_column(label, overflow="fold")
        for text, key in self.texts.items():
            table.add_row(key, text)
        return table


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


@contextmanager
def blocks_bar(enabled: bool) -> Iterator[Callable[[BlockDone], None] | None]:
    """A hook drawing a calibration run's blocks done, tokens per second and ETA on stderr, or None."""
    if not enabled:
        yield None
        return
    columns = (TextColumn("{task.description}", style="cyan", markup=False), BarColumn(),
               MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, console=stderr(), transient=True) as progress:
        task = progress.add_task("calibrating", total=None)

        def hook(done: BlockDone) -> None:
            progress.update(task, description=f"calibrating, {done.tokens_per_s:,.0f} tokens/s",
                            completed=done.index + 1, total=done.count)

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
