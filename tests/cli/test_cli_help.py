"""docs/cli.md shows each command's `--help` exactly as the CLI prints it (100 columns).

Regenerate the blocks after changing an option: `python3 -m tests.cli.test_cli_help`.
"""

from __future__ import annotations

import os
import re

import pytest

from tests.cli_support import ROOT, cli

DOC = ROOT / "docs" / "cli.md"
COMMANDS = ["", "quantize", "inspect", "validate-scheme", "imatrix", "eval"]
BLOCK = re.compile(r"<!-- help: (?P<cmd>[a-z-]*) -->\n```text\n(?P<body>.*?)```\n<!-- /help -->", re.S)


def render_help(command: str) -> str:
    result = cli(*([command] if command else []), "--help")
    assert result.code == 0, result.err
    return result.out


def documented() -> dict[str, str]:
    return {m["cmd"]: m["body"] for m in BLOCK.finditer(DOC.read_text())}


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c or "qcli")
def test_usage_block_matches_help(command, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    assert documented()[command] == render_help(command), "run `python3 -m tests.cli.test_cli_help` to regenerate"


def write_docs() -> None:
    text = DOC.read_text()
    for command in COMMANDS:
        text = re.sub(
            rf"<!-- help: {re.escape(command)} -->\n```text\n.*?```\n<!-- /help -->",
            lambda _, c=command: f"<!-- help: {c} -->\n```text\n{render_help(c)}```\n<!-- /help -->",
            text,
            flags=re.S,
        )
    DOC.write_text(text)


if __name__ == "__main__":
    os.environ["COLUMNS"] = "100"
    write_docs()
