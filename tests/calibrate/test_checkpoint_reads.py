"""A calibrated run resolves its checkpoint once (`qcli.calibrate.checkpoint`): each reader of config.json
opens it as often as it does alone, however many steps need the model (the plan, the estimate, a target's
sensitivity pass, the calibration). The opens are counted by the interpreter's `open` audit event, which
every way of opening a file raises, transformers' reads included."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.cli_support import cli

pytest.importorskip("transformers")

SAMPLES, SEQ_LEN = "2", "32"
_opened: list[str] | None = None  # the paths opened, while `opens` counts


def _on_audit(event: str, args: tuple) -> None:
    if event == "open" and _opened is not None and isinstance(args[0], str | bytes | os.PathLike):
        _opened.append(os.fsdecode(args[0]))


@functools.cache
def _hooked() -> None:
    sys.addaudithook(_on_audit)  # once: a hook cannot be removed, and records only inside `opens`


@contextmanager
def opens(path: Path) -> Iterator[list[str]]:
    """The opens of `path` while the block runs (one entry each)."""
    global _opened
    _hooked()
    _opened, found = [], []
    try:
        yield found
    finally:
        found.extend(p for p in _opened if Path(p).resolve() == path.resolve())
        _opened = None


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    from tests.calibrate_support import TEXT, tiny_llama

    folder = tiny_llama(tmp_path_factory.mktemp("reads") / "llama", seed=5, intermediate_size=256)
    (folder.parent / "text.txt").write_text(TEXT)
    return folder


@pytest.fixture(scope="module")
def once(llama) -> dict[str, int]:
    """The opens of config.json that each of its readers takes once: the format declaration's reading
    (`detect`), the config's loading, the tokenizer's."""
    from qcli.calibrate.checkpoint import load_config, load_tokenizer
    from qcli.formats import detect
    from qcli.io.readers import open_source

    counts = {}
    with open_source(llama) as source:
        for reader, read in (("declaration", lambda: detect(source.infos())),
                             ("config", lambda: load_config(llama, source.infos())),
                             ("tokenizer", lambda: load_tokenizer(llama))):
            with opens(llama / "config.json") as found:
                read()
            counts[reader] = len(found)
    assert counts["config"] > 0, "loading the config opens config.json"
    return counts


@pytest.mark.parametrize(("options", "readers"), [
    (("--calibration", "gptq"), ("declaration", "config", "tokenizer")),
    (("--calibration", "gptq", "--dry-run"), ("declaration", "config")),  # the plan and the estimate
    (("--calibration", "mse", "--target-bpw", "6"), ("declaration", "config", "tokenizer")),
], ids=["gptq", "gptq-dry-run", "target"])
def test_a_calibrated_quantize_opens_config_json_once_for_each_reader(llama, once, tmp_path, options, readers):
    with opens(llama / "config.json") as found:
        done = cli("quantize", llama, "-o", tmp_path / "a.bpk", "--calibration-data", llama.parent / "text.txt",
                   "--samples", SAMPLES, "--seq-len", SEQ_LEN, "--device", "cpu", *options)
    assert done.code == 0, done.err
    assert len(found) == sum(once[r] for r in readers), once


def test_imatrix_opens_config_json_once_for_each_reader(llama, once, tmp_path):
    with opens(llama / "config.json") as found:
        done = cli("imatrix", llama, "--calibration-data", llama.parent / "text.txt", "-o", tmp_path / "m.gguf",
                   "--samples", SAMPLES, "--seq-len", SEQ_LEN, "--device", "cpu")
    assert done.code == 0, done.err
    assert len(found) == once["config"] + once["tokenizer"], once
