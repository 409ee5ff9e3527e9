"""Where output goes: data (tables, JSON) on stdout; progress, warnings, errors and hints on stderr."""

from __future__ import annotations

import json
import os
import re
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from rich import box
from rich.console import Console
from rich.progress import BarColumn, Progress, Task, TaskID, TextColumn, TimeRemainingColumn
from rich.segment import Segment
from rich.table import Column, Table
from rich.text import Text

from qcli.text import printable

if TYPE_CHECKING:
    from qcli.calibrate.runner import BlockDone

# The width of output that goes to no terminal, and of a COLUMNS that is no usable width (0, 1, garbage):
# the default summary fits it, every tensor name whole on its line.
DEFAULT_WIDTH = 80
MIN_WIDTH = 40
# The least room a tensor name is elided to, however many columns the others take.
MIN_NAME = 24
# The least of a long name's end that stays beside its start when the middle is elided.
TAIL = 13
# Holds a figure to its unit where `fill` wraps a line: a no-break space, which textwrap does not break at.
GLUE = "\u00a0"


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


def fit_names(names: Sequence[str], room: int) -> list[str]:
    """Each name whole where it fits `room` columns, else shortened to fit (`_shortenings`), no two rows
    alike: names whose shortenings meet keep the parts that tell them apart (`encoder.…0.…q_proj.weight`
    beside `decoder.…0.…q_proj.weight`), and a name that cannot be told apart within `room` is shown whole."""
    shown = [name if len(name) <= room else _fitted(name.split("."), room) for name in names]
    groups: dict[str, list[int]] = {}
    for i, text in enumerate(shown):
        groups.setdefault(text, []).append(i)
    for same in (rows for rows in groups.values() if len(rows) > 1):
        split = [names[i].split(".") for i in same]
        differ = frozenset(k for k in range(len(split[0])) if len({len(p) for p in split}) == 1
                           and len({p[k] for p in split}) > 1)
        for i, parts in zip(same, split, strict=True):
            fits = [s for s in _shortenings(parts, differ) if len(s) <= room] if differ else []
            shown[i] = fits[0] if fits else names[i]
    counts = Counter(shown)
    return [names[i] if counts[text] > 1 else text for i, text in enumerate(shown)]


def _fitted(parts: list[str], room: int) -> str:
    """The first of a name's `_shortenings` that fits `room`, else the shortest cut in its middle after
    its first number (its layer), so that its end stays."""
    shortest = ".".join(parts)
    for shortest in _shortenings(parts):
        if len(shortest) <= room:
            return shortest
    head = shortest[: shortest.find(".", next((i for i, c in enumerate(shortest) if c.isdigit()), 0)) + 1]
    if len(head) > room - TAIL:
        head = shortest[: (room - 1) // 2]
    return head + "…" + shortest[len(shortest) - (room - 1 - len(head)):]


def _shortenings(parts: list[str], keep: frozenset[int] = frozenset()) -> Iterator[str]:
    """A dotted name with more and more of its parts left out, each run of them shown as `…`: first those
    before its first number (`…layers.12.self_attn.q_proj.weight`, `…12.self_attn.q_proj.weight`), then
    the words between that number and its last two parts (`…12.…q_proj.weight`); a name without a number
    loses its start up to its last two parts. Never a number, the last two parts or a part in `keep`:
    what tells rows apart (the layer, the expert, the projection, weight or bias)."""
    last = len(parts) - 2
    first = next((i for i, part in enumerate(parts[:last]) if part.isdigit()), last)
    order = [*range(first), *(i for i in range(first + 1, last) if not parts[i].isdigit())]
    left: set[int] = set()
    for i in order:
        if i in keep:
            continue
        left.add(i)
        yield _joined(parts, left)


def _joined(parts: list[str], left: set[int]) -> str:
    """`parts` joined by dots, each run of the indices in `left` as one `…` standing for those parts."""
    text = ""
    for i, part in enumerate(parts):
        if i in left:
            if i - 1 not in left:
                text += "…"
            continue
        text += part if i + 1 == len(parts) else part + "."
    return text


def tensor_table(columns: Sequence[tuple[str, str]], rows: Sequence[Sequence[str]], width: int | None,
                 droppable: Sequence[str] = ()) -> Lines:
    """Rows of one tensor each, the name first, every cell on one line and none cut.

    A name stays whole, or is shortened where the other columns leave too little room in `width`
    (`fit_names`). Where they leave less than MIN_NAME, the columns named in `droppable` are left out in that
    order until they do (`Lines.dropped`). With no `width` (--verbose: every column) names stay whole too:
    print it with `wide()`.

    The table is laid out here (a header, a rule, a line a row, two spaces between columns) because a rich
    Table measures every cell again: half a millisecond a row, minutes for a header of 200,000 tensors."""
    dropped: list[str] = []
    for header in (None, *droppable) if width is not None else (None,):
        if header is not None:
            index = [h for h, _ in columns].index(header)
            columns = [c for i, c in enumerate(columns) if i != index]
            rows = [[c for i, c in enumerate(row) if i != index] for row in rows]
            dropped.append(header)
        room = None if width is None else width - natural_width(columns[1:], [r[1:] for r in rows]) - 2
        if room is None or room >= MIN_NAME:
            break
    names = [r[0] for r in rows] if room is None else fit_names([r[0] for r in rows], max(room, MIN_NAME))
    cells = [[h for h, _ in columns], *([name, *r[1:]] for name, r in zip(names, rows, strict=True))]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    justify = [str.rjust if j == "right" else str.ljust for _, j in columns]
    lines = ["  ".join(pad(cell, w) for pad, cell, w in zip(justify, row, widths, strict=True)).rstrip()
             for row in cells]
    lines.insert(1, "─" * (sum(widths) + 2 * (len(widths) - 1)))
    return Lines(lines, dropped)


class Lines:
    """Lines laid out already, printed as they are: neither measured, wrapped nor cut by the console;
    `dropped`, the columns of a `tensor_table` left out for its width."""

    def __init__(self, lines: list[str], dropped: Sequence[str] = ()) -> None:
        self.lines = lines
        self.dropped = list(dropped)

    def note(self, every: str) -> str | None:
        """What a table that left columns out says beneath it (`every`: the option that shows them), else None."""
        if not self.dropped:
            return None
        return f"({', '.join(self.dropped)} left out at this width; {every} shows every column)"

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


def fill(text: str, width: int) -> str:
    """`text` wrapped at its spaces into lines of at most `width` columns, the later ones indented: never
    inside a word (a path or a name longer than a line stays whole on a line of its own), nor at a GLUE,
    which holds a figure to its unit (`glued`) and is printed as a space."""
    wrapper = textwrap.TextWrapper(width, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False)
    return "\n".join(wrapper.wrap(text)).replace(GLUE, " ")


def glued(text: str) -> str:
    """`text` (a figure and its unit, `12.3 GB/s`) that `fill` keeps on one line."""
    return text.replace(" ", GLUE)


def warn(message: str) -> None:
    """`warning: …` on stderr, wrapped at word boundaries to its width; printed as it is (no markup)."""
    console = stderr()
    lines = fill(f"warning: {printable(message)}", console.width).split("\n")
    console.print(Text.assemble(("warning", "yellow"), lines[0][len("warning"):]), soft_wrap=True)
    for line in lines[1:]:
        console.print(line, soft_wrap=True)


def progress_enabled(*, quiet: bool = False, json: bool = False) -> bool:
    """Progress draws only for a person watching stderr: not with NO_COLOR, QCLI_NO_PROGRESS, a piped
    stderr, --quiet or --json (a document for a program, whose runs are not watched)."""
    return not (quiet or json or os.environ.get("NO_COLOR") or os.environ.get("QCLI_NO_PROGRESS")
                or not sys.stderr.isatty())


class RunProgress:
    """A command's one live display on stderr (rich's `Progress`), each phase a task on its own row, so that no two
    displays take turns on one line.

    The phases are `preparing` (the headers, the plan, the model and its text), `calibrating` (blocks done, tokens
    a second, the time left), `evaluating` (windows scored) and the tensor being written (bytes done, the rate, the
    time left). Every row fits the console's width: the label (a tensor's name, shortened as in the tables) takes
    what the others leave."""

    def __init__(self, progress: Progress) -> None:
        self._progress = progress
        self._room = max(progress.console.width - PROGRESS_FIXED, 12)
        self._preparing: TaskID | None = progress.add_task("preparing", total=None, amount="", left=None)
        self._calibrating: TaskID | None = None
        self._evaluating: TaskID | None = None
        self._writing: TaskID | None = None
        self._write_started = 0.0

    def _started(self) -> None:
        if self._preparing is not None:
            self._progress.remove_task(self._preparing)
            self._preparing = None

    def blocks(self, done: BlockDone) -> None:
        """A calibration run's progress (`qcli.calibrate.runner.run_blocks`)."""
        self._started()
        if self._calibrating is None:
            self._calibrating = self._progress.add_task("calibrating", total=done.count, amount="", left=None)
        rate = f", {done.tokens_per_s:,.0f} tok/s" if done.done else ""
        left = done.seconds / done.done * (done.count - done.done) if done.done else None
        self._progress.update(self._calibrating, completed=done.done, amount=f"{done.done}/{done.count} blocks{rate}",
                              left=left)

    def windows(self, done: int, count: int, seconds: float) -> None:
        """An evaluation's progress (`qcli.calibrate.evaluate.Evaluator`): windows scored of all, the time left
        from their own pace."""
        self._started()
        if self._evaluating is None:
            self._evaluating = self._progress.add_task("evaluating", total=count, amount="", left=None)
        left = seconds / done * (count - done) if done else None
        self._progress.update(self._evaluating, completed=done, amount=f"{done}/{count} windows", left=left)

    def tensors(self, current: str | None, done: int, total: int) -> None:
        """The write's progress (`qcli.commands.quantize.ProgressHook`): the tensor next, bytes read of all."""
        self._started()
        if self._writing is None:
            self._writing = self._progress.add_task("", total=total, amount="", left=None)
            self._write_started = time.perf_counter()
        elapsed = time.perf_counter() - self._write_started
        rate = done / elapsed if done and elapsed > 0 else None
        label = "finishing" if current is None else fit_names([printable(current)], self._room)[0]
        amount = _bytes_of(done, total) + ("" if rate is None else f", {human_bytes(rate)}/s")
        self._progress.update(self._writing, description=label, completed=done, total=total, amount=amount)


# What a progress row takes beside its label: the bar, the amount (`12/30 blocks, 1,234 tok/s`,
# `1.20/3.40 GiB, 512 MiB/s`), the time left and the gaps between them.
PROGRESS_BAR = 10
PROGRESS_FIXED = PROGRESS_BAR + 26 + 7 + 4


class _TimeLeft(TimeRemainingColumn):
    """The time left: a task's own estimate where it gives one (`left`, seconds), else rich's from its speed."""

    def render(self, task: Task) -> Text:
        left = task.fields.get("left")
        if left is None or task.finished:
            return super().render(task)
        minutes, seconds = divmod(int(left), 60)
        hours, minutes = divmod(minutes, 60)
        return Text(f"{hours:d}:{minutes:02d}:{seconds:02d}", style="progress.remaining")


def _bytes_of(done: int, total: int) -> str:
    """`1.20/3.40 GiB`: both in the total's unit."""
    unit = human_bytes(total).split()[-1]
    scale = 1024 ** ("B", "KiB", "MiB", "GiB", "TiB").index(unit)
    return f"{done / scale:.3g}/{total / scale:.3g} {unit}"


@contextmanager
def run_progress(enabled: bool) -> Iterator[RunProgress | None]:
    """The command's `RunProgress` on stderr, or None; its rows are cleared when the block ends."""
    if not enabled:
        yield None
        return
    fixed = Column(no_wrap=True)
    columns = (TextColumn("{task.description}", style="cyan", markup=False,
                          table_column=Column(no_wrap=True, overflow="ellipsis")),
               BarColumn(bar_width=PROGRESS_BAR),
               TextColumn("{task.fields[amount]}", markup=False, table_column=fixed), _TimeLeft())
    with Progress(*columns, console=stderr(), transient=True) as progress:
        yield RunProgress(progress)


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
