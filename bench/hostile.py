"""How long qcli takes to refuse (or read) hostile input: the timings the tests no longer assert.

Run from the repository root:

    python3 -m bench.hostile [--runs 3] [--doc docs/benchmarks.md]

The tests hold that each of these ends (tests/hang_support.py), and where a count says it, that the work
grows linearly; a limit in seconds would fail on a busy machine. This times the same inputs, taken from the
tests themselves, in this process: the catalogue's hostile cases through the CLI (`HOSTILE`), hostile
recipes, table-header lines of 100 kB and 1 MB, a recipe of 20,000 rules, the catastrophic `re:` patterns
on names of up to 100,000 characters, and burnpack metadata of CBOR shared references. Each input runs
`--runs` times; a group's row gives the median and the slowest input's median, as wall time and as the CPU
time this process used (which the machine's other work does not stretch). Prints a markdown section;
`--doc` also replaces that section in the given file.
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path

from bench.markdown import replace_section

SECTION = "## Hostile input: how long each refusal takes (this 2-core machine)"


def timed(work: Callable[[], object], runs: int) -> tuple[float, float]:
    """(median wall seconds, median CPU seconds) of `runs` calls of `work`."""
    walls, cpus = [], []
    for _ in range(runs):
        wall, cpu = time.perf_counter(), time.process_time()
        work()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls), statistics.median(cpus)


def catalogue(scratch: Path) -> Iterator[tuple[str, Callable[[], object]]]:
    """Each case of the catalogue's `HOSTILE`, built once in a folder of its own, run through the CLI."""
    from tests.cli_support import cli
    from tests.reliability.test_catalogue import HOSTILE

    for case in HOSTILE:
        folder = scratch / case.id
        folder.mkdir()
        args = case.make(folder)
        yield case.id, functools.partial(cli, *args)


def recipes(_: Path) -> Iterator[tuple[str, Callable[[], object]]]:
    from qcli.recipe import parse_recipe
    from tests.plan.test_recipe import HOSTILE_RECIPES

    for i, (text, line, message) in enumerate(HOSTILE_RECIPES):
        yield f"{i}: line {line}, {message}", functools.partial(parse_recipe, text.encode(), "r.toml")


def long_lines(_: Path) -> Iterator[tuple[str, Callable[[], object]]]:
    from qcli.recipe import RecipeLines
    from tests.plan.test_recipe import long_lines

    for length in (100_000, 1_000_000):
        for i, line in enumerate(long_lines(length)):
            text = f"version = 1\n{line}\n[[rule]]\nmatch = 'x'\n"
            yield f"{length:,} spaces, line {i}", functools.partial(RecipeLines, text)


def rules(_: Path) -> Iterator[tuple[str, Callable[[], object]]]:
    from qcli.recipe import parse_recipe
    from tests.plan.test_recipe import with_rules

    yield "20,000 rules", functools.partial(parse_recipe, with_rules(20_000))


def patterns(_: Path) -> Iterator[tuple[str, Callable[[], object]]]:
    from qcli.patterns import regex_matcher
    from tests.plan.test_recipe import CATASTROPHIC_NAMES, CATASTROPHIC_PATTERNS

    for pattern in CATASTROPHIC_PATTERNS:
        matcher = regex_matcher(pattern)
        yield pattern, lambda matcher=matcher: [matcher(name) for name in CATASTROPHIC_NAMES]


def shared_references(scratch: Path) -> Iterator[tuple[str, Callable[[], object]]]:
    from qcli.errors import InputError
    from qcli.io.burnpack import BurnpackReader
    from tests.io.test_burnpack import raw_pack, shared_reference_blobs

    def refused(path: Path) -> None:
        try:
            BurnpackReader.open(path)
        except InputError:
            return
        raise AssertionError(f"{path} read")

    for i, blob in enumerate(shared_reference_blobs()):
        path = scratch / f"shared-references-{i}.bpk"
        path.write_bytes(raw_pack(None, encoded=blob))
        yield f"2**60 leaves, place {i}", functools.partial(refused, path)


GROUPS = {
    "catalogue `HOSTILE`, through the CLI (tests/reliability/test_catalogue.py)": catalogue,
    "hostile recipes, `parse_recipe` (tests/plan/test_recipe.py `HOSTILE_RECIPES`)": recipes,
    "table-header lines of 100 kB and 1 MB, the recipe's line scanner": long_lines,
    "a recipe of 20,000 rules, `parse_recipe`": rules,
    "catastrophic `re:` patterns, each on the five names of up to 100,000 characters": patterns,
    "burnpack metadata of CBOR shared references, `BurnpackReader.open`": shared_references,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--doc", type=Path)
    args = parser.parse_args()
    load_before = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory(prefix="qcli-hostile-") as scratch:
        for label, inputs in GROUPS.items():
            times = {name: timed(work, args.runs) for name, work in inputs(Path(scratch))}
            slowest = max(times, key=lambda name: times[name][0])
            rows.append((label, len(times), statistics.median(w for w, _ in times.values()),
                         statistics.median(c for _, c in times.values()), slowest, *times[slowest]))
            print(*rows[-1], flush=True)
    section = _markdown(rows, args, load_before, os.getloadavg())
    print(section)
    if args.doc:
        replace_section(args.doc, section)


def _markdown(rows, args, load_before, load_after) -> str:  # type: ignore[no-untyped-def]
    lines = [
        SECTION, "",
        f"{datetime.now(UTC):%Y-%m-%d}, {platform.node()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, cbor2 {version('cbor2')}, google-re2 {version('google-re2')}. "
        f"`python3 -m bench.hostile --runs {args.runs}`: each input {args.runs} time(s) in one process, the "
        f"median of its runs; load average {load_before[0]:.2f} before, {load_after[0]:.2f} after (other work "
        "shared the cores: the CPU columns are what this process itself used). The tests hold only that each "
        "ends, within tests/hang_support.py's HANG_SECONDS, and count the work where a count says it grows "
        "linearly.",
        "",
        "| inputs | count | median wall ms | median CPU ms | slowest | its wall ms | its CPU ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, count, wall, cpu, slowest, slowest_wall, slowest_cpu in rows:
        name = slowest.replace("|", "\\|")
        lines.append(f"| {label} | {count} | {wall * 1e3:.2f} | {cpu * 1e3:.2f} | `{name}` | "
                     f"{slowest_wall * 1e3:.2f} | {slowest_cpu * 1e3:.2f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
