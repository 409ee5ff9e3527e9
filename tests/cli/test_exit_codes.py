"""The exit codes are the error classes' own: README.md and docs/cli.md show the table `exit_codes()`
renders, and `qcli --help` lists the same codes and meanings.

Regenerate the tables after changing a class: `python3 -m tests.cli.test_exit_codes`.
"""

from __future__ import annotations

import re

import pytest

from qcli.errors import exit_codes
from tests.cli_support import ROOT, cli

DOCS = ["README.md", "docs/cli.md"]
TABLE = re.compile(r"(?<=## Exit codes\n\n)\| code \| meaning \|\n\|---\|---\|\n(?:\|.*\|\n)*")


def render_table() -> str:
    return "| code | meaning |\n|---|---|\n" + "".join(f"| {code} | {meaning} |\n" for code, meaning in exit_codes())


@pytest.mark.parametrize("doc", DOCS)
def test_the_docs_show_the_table_the_classes_render(doc):
    tables = TABLE.findall((ROOT / doc).read_text())
    assert tables == [render_table()], "run `python3 -m tests.cli.test_exit_codes` to regenerate"


def test_help_lists_every_code_with_its_meaning():
    result = cli("--help")
    assert result.code == 0
    shown = " ".join(result.out.split())
    for code, meaning in exit_codes():
        assert f" {code} {meaning.replace('`', '')}" in shown


if __name__ == "__main__":
    for doc in DOCS:
        path = ROOT / doc
        path.write_text(TABLE.sub(lambda _: render_table(), path.read_text()))
