"""Every `qcli` command line the docs give on the sample weights runs as its text says.

The lines are found in the README, docs/*.md and sample_weights/README.md: in ```bash and ```console
blocks (`$ qcli ...`, or a `qcli ...` step of a `&&` chain) and in inline `code`. Those that name only
the sample weights (every file argument under sample_weights/) are run, each in a temporary copy of
them, so the checkout is never written: an output beside the input lands in the copy, a relative `-o`
in the temporary folder, and an absolute one (or a `>` redirect) is moved there under its own name; the
README's run one after another in one copy, in the order it gives them. Each must exit 0 unless
the text beside it says otherwise (`exit 2`, in the line's comment or the inline code's sentence).
"""

from __future__ import annotations

import functools
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.cli_support import ROOT, SAMPLES, child_env

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), SAMPLES / "README.md"]
BLOCK = re.compile(r"^```(?:bash|console)\n(.*?)^```", re.M | re.S)
INLINE = re.compile(r"`(qcli [^`\n]+)`")
EXIT = re.compile(r"\bexits? (?:with )?(?:code )?(\d+)\b|\(exit (\d+)\)|\bexit code (\d+)\b")
FILE_ARG = re.compile(r"[/\\]|\.(?:safetensors|bpk|gguf|toml|json)$")
OUTPUT_OPTIONS = ("-o", "--output")


@dataclass(frozen=True)
class DocCommand:
    doc: str
    line: int
    words: tuple[str, ...]
    redirect: str | None  # `> FILE`: stdout written there
    exit_code: int

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}: {shlex.join(self.words)}"


def _expected_exit(text: str) -> int:
    found = EXIT.search(text)
    return 0 if found is None else int(next(g for g in found.groups() if g is not None))


def _parse(doc: str, line: int, command: str, context: str) -> DocCommand | None:
    """The command if it names only the sample weights, else None."""
    words = shlex.split(command, comments=True)
    redirect = None
    if ">" in words:
        at = words.index(">")
        words, redirect = words[:at], words[at + 1]
    files = [w for w in words[2:] if not w.startswith("-") and FILE_ARG.search(w)]
    outputs = {words[i + 1] for i, w in enumerate(words[:-1]) if w in OUTPUT_OPTIONS}
    inputs = [f for f in files if f not in outputs]
    if not inputs or not all(f.startswith("sample_weights/") for f in inputs):
        return None
    return DocCommand(doc, line, tuple(words), redirect, _expected_exit(context))


def doc_commands() -> list[DocCommand]:
    found = []
    for path in DOCS:
        text, doc = path.read_text(), str(path.relative_to(ROOT))
        for block in BLOCK.finditer(text):
            first = text.count("\n", 0, block.start(1)) + 1
            for offset, raw in enumerate(block.group(1).splitlines()):
                for step in re.split(r"\s*(?:&&|\|\||;)\s*", raw.removeprefix("$ ").strip()):
                    if step.startswith("qcli "):
                        comment = step.partition(" #")[2]
                        parsed = _parse(doc, first + offset, step, comment)
                        found += [parsed] if parsed else []
        for code in INLINE.finditer(text):
            sentence = re.split(r"(?<=[.;])\s|\n\n", text[code.end():], maxsplit=1)[0]
            parsed = _parse(doc, text.count("\n", 0, code.start()) + 1, code.group(1), sentence)
            found += [parsed] if parsed else []
    return found


COMMANDS = doc_commands()


def test_the_docs_give_commands_on_the_sample():
    """The finder finds what the README shows a newcomer: the set-up command and the recipe try."""
    shown = {" ".join(c.words) for c in COMMANDS if c.doc == "README.md"}
    assert "qcli quantize sample_weights/tiny-llama.safetensors --force" in shown
    assert ("qcli quantize sample_weights/tiny-llama.safetensors --recipe sample_weights/tiny-llama.toml "
            "--dry-run --force") in shown


def test_the_expected_exit_is_read_from_the_text():
    refused = _parse("d.md", 1, "qcli quantize sample_weights/m.safetensors --scheme nf4", "is refused (exit 2).")
    assert refused is not None and refused.exit_code == 2
    assert _parse("d.md", 1, "qcli inspect sample_weights/m.bpk", "lists it.").exit_code == 0
    assert _parse("d.md", 1, "qcli quantize model.safetensors -o sample_weights/m.bpk", "") is None


def sample_copy(folder: Path) -> Path:
    shutil.copytree(SAMPLES, folder / "sample_weights", ignore=shutil.ignore_patterns("*.bpk", "__pycache__"))
    return folder


def run_in(folder: Path, command: DocCommand) -> subprocess.CompletedProcess:
    """Run `command` in `folder` (which holds a copy of sample_weights/) and check its exit code."""
    words = list(command.words)
    for i, word in enumerate(words[:-1]):
        if word in OUTPUT_OPTIONS and Path(words[i + 1]).is_absolute():
            words[i + 1] = str(folder / Path(words[i + 1]).name) + ("/" if words[i + 1].endswith("/") else "")
    run = functools.partial(subprocess.run, [sys.executable, "-m", "qcli", *words[1:]], cwd=folder,
                            stderr=subprocess.PIPE, text=True, timeout=300,
                            env={k: v for k, v in child_env().items() if k != "COLUMNS"})
    if command.redirect is None:
        done = run(stdout=subprocess.PIPE)
    else:
        with open(folder / Path(command.redirect).name, "w") as stdout:
            done = run(stdout=stdout)
    assert done.returncode == command.exit_code, f"{command}\n{done.stderr}"
    return done


@pytest.mark.parametrize("command", [c for c in COMMANDS if c.doc != "README.md"], ids=str)
def test_a_documented_command_runs_as_its_text_says(command: DocCommand, tmp_path: Path):
    run_in(sample_copy(tmp_path), command)


def test_the_readmes_commands_run_in_the_order_it_gives_them(tmp_path: Path):
    """A newcomer runs the set-up command, then the examples, as the README gives them: what one leaves
    beside the sample (the set-up writes tiny-llama.bpk) must not change how the next exits, and a line may
    read what an earlier one wrote (inspect --compare the recipe's output)."""
    folder = sample_copy(tmp_path)
    for command in (c for c in COMMANDS if c.doc == "README.md"):
        run_in(folder, command)
