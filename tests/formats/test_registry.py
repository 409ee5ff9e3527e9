"""Each format is named once and the help is built from the registries. An already-quantized format's name is
in its module (`NAME`, `REQUANTIZED`, listed in `qcli.formats.FORMATS`): one whose weights can be `Encoded`
cannot be left out of `--requantize`'s help. A checkpoint format's name is in its reader's row
(`qcli.io.readers.READERS`): one cannot be left out of the help of a command that reads checkpoints."""

from __future__ import annotations

import re

import pytest

from qcli.formats import FORMATS
from qcli.formats.found import Encoded
from tests.cli_support import cli


def encoded_classes(module) -> list[type]:
    """The `Encoded` kinds a format module defines: the weights of its that `--requantize` takes."""
    return [c for c in vars(module).values()
            if isinstance(c, type) and issubclass(c, Encoded) and c.__module__ == module.__name__]


def flat(text: str) -> str:
    """`text` as one line, as the help wraps it or not (at spaces, and after a hyphen)."""
    return re.sub(r"-\s+", "-", " ".join(text.split()))


@pytest.mark.parametrize("command", ["quantize", "validate-scheme"])
def test_requantize_help_names_every_format_with_encoded_weights(command, monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")
    done = cli(command, "--help")
    assert done.code == 0
    help = flat(done.out)
    for module in FORMATS:
        if encoded_classes(module):
            assert module.REQUANTIZED is not None, module.__name__
            assert flat(f"{module.NAME} {module.REQUANTIZED}") in help, module.__name__
        else:
            assert module.REQUANTIZED is None, f"{module.__name__} has no Encoded weights to requantize"


def test_each_format_has_its_own_name():
    names = [module.NAME for module in FORMATS]
    assert len(set(names)) == len(names) and all(names)
    assert {m.__name__.rsplit(".", 1)[1] for m in FORMATS if encoded_classes(m)} == {
        "gptq", "awq", "hqq", "bitsandbytes", "quanto", "compressed_tensors", "gguf"}


@pytest.mark.parametrize("command", ["", "quantize", "inspect", "eval"], ids=lambda c: c or "qcli")
def test_the_help_names_every_format_read(command, monkeypatch):
    """The formats a command reads are listed from the readers' registry: a reader added to it shows in the
    help of `qcli` (its title) and of each command that reads a checkpoint (how one of it is given)."""
    from qcli.io.readers import READERS

    monkeypatch.setenv("COLUMNS", "1000")
    done = cli(*([command] if command else []), "--help")
    assert done.code == 0
    help = flat(done.out)
    for reader in READERS:
        assert flat(reader.given if command else reader.title) in help, reader.name
        assert any(suffix in reader.given for suffix in reader.suffixes), reader.name
