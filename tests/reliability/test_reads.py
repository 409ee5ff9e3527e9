"""Nothing a run reads is ever lost (docs/reliability.md, "Files a run reads"): every file `quantize` and
`imatrix` read, given as their output (by its path, through a symbolic link, or as a hard link), is
refused with exit 2 and `--force`, and keeps its bytes; a device node given as the output stays one; a model
folder removes only the files qcli wrote there, and never one the run reads.

Everything here is refused before a weight is read, so each case is a fraction of a second.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from tests.cli_support import SAMPLES, SHARDED, assert_user_error, cli
from tests.reliability.test_catalogue import char_device

CALIBRATION = SAMPLES / "calibration.txt"


@pytest.fixture
def model(tmp_path: Path) -> Path:
    """The sharded sample's folder (shards, index, config.json, tokenizer files) and a calibration text, a
    recipe and an importance matrix beside it."""
    folder = tmp_path / "model"
    shutil.copytree(SHARDED, folder)
    shutil.copy(CALIBRATION, tmp_path / "calibration.txt")
    shutil.copy(SAMPLES / "tiny-llama.toml", tmp_path / "recipe.toml")
    from qcli.io.imatrix import Imatrix, ImatrixEntry, write_imatrix

    entry = ImatrixEntry(np.ones(64), np.array([8]))
    write_imatrix(Imatrix({"blk.0.ffn_down.weight": entry}, ("calibration.txt",), 1, 8), tmp_path / "m.imatrix.gguf")
    return folder


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every regular file under `folder` (the model and what is beside it) and its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# (the input's file, the role the error names it by, the options that make the run read it)
QUANTIZE_READS = [
    ("model/model-00001-of-00002.safetensors", "the input", []),
    ("model/model-00002-of-00002.safetensors", "the input", []),
    ("model/model.safetensors.index.json", "the input's index", []),
    ("model/config.json", "a file beside the input that the run reads", []),
    ("model/tokenizer.json", "a file beside the input that the run reads", []),
    ("recipe.toml", "the recipe", ["--recipe", "{root}/recipe.toml"]),
    ("calibration.txt", "the calibration text",
     ["--calibration", "gptq", "--calibration-data", "{root}/calibration.txt", "--samples", "2", "--seq-len", "8"]),
    ("m.imatrix.gguf", "the importance matrix", ["--calibration", "mse", "--imatrix", "{root}/m.imatrix.gguf"]),
]
IMATRIX_READS = [
    ("model/model-00001-of-00002.safetensors", "the input"),
    ("model/model.safetensors.index.json", "the input's index"),
    ("model/config.json", "a file beside the input that the run reads"),
    ("model/tokenizer_config.json", "a file beside the input that the run reads"),
    ("calibration.txt", "the calibration text"),
]


def as_itself(path: Path) -> Path:
    return path


def as_symlink(path: Path) -> Path:
    link = path.parent / f"link-{path.name}"
    link.symlink_to(path)
    return link


def as_hard_link(path: Path) -> Path:
    link = path.parent / f"hard-{path.name}"
    os.link(path, link)
    return link


LINKS = [as_itself, as_symlink, as_hard_link]


def _refused(result, role: str, before: dict[str, bytes], root: Path) -> None:
    lines = assert_user_error(result, 2)
    assert f"is {role}" in lines[0] and "never writes over a file it reads" in lines[0], lines
    assert snapshot(root) == before
    assert not [p for p in root.rglob("*.tmp")]


@pytest.mark.parametrize("how", LINKS, ids=lambda f: f.__name__)
@pytest.mark.parametrize(("name", "role", "options"), QUANTIZE_READS, ids=[r[0] for r in QUANTIZE_READS])
def test_quantize_refuses_every_file_it_reads_as_its_output(model: Path, name: str, role: str, options: list[str],
                                                            how: Callable[[Path], Path]) -> None:
    root = model.parent
    target = how(root / name)
    before = snapshot(root)
    args = [a.format(root=root) for a in options]
    _refused(cli("quantize", model, "-o", target, "--force", "--device", "cpu", *args), role, before, root)


@pytest.mark.parametrize("how", LINKS, ids=lambda f: f.__name__)
@pytest.mark.parametrize(("name", "role"), IMATRIX_READS, ids=[r[0] for r in IMATRIX_READS])
def test_imatrix_refuses_every_file_it_reads_as_its_output(model: Path, name: str, role: str,
                                                           how: Callable[[Path], Path]) -> None:
    root = model.parent
    target = how(root / name)
    before = snapshot(root)
    result = cli("imatrix", model, "--calibration-data", root / "calibration.txt", "-o", target, "--force",
                 "--device", "cpu", "--samples", "2", "--seq-len", "8")
    _refused(result, role, before, root)


@pytest.mark.parametrize("command", ["quantize", "imatrix"])
def test_a_device_as_the_output_is_refused_and_stays_a_device(model: Path, command: str) -> None:
    target = char_device(model.parent / "out.bin")
    extra = ["--calibration-data", model.parent / "calibration.txt"] if command == "imatrix" else []
    lines = assert_user_error(cli(command, model, *extra, "-o", target, "--force", "--device", "cpu"), 2)
    assert "is not a regular file (a character device)" in lines[0]
    assert stat.S_ISCHR(os.lstat(target).st_mode)


def test_a_model_folder_over_its_source_folder_is_refused(model: Path) -> None:
    before = snapshot(model.parent)
    lines = assert_user_error(cli("quantize", model, "-o", f"{model}/", "--force", "--device", "cpu"), 2)
    assert "config.json is a file beside the input that the run reads" in lines[0]
    assert snapshot(model.parent) == before


def test_a_record_naming_the_sources_weights_removes_nothing_of_them(model: Path, tmp_path: Path) -> None:
    """A record in the folder (an earlier run's, edited or forged) that lists the source's weights: qcli
    removes only files by the names it gives its own (model.bpk, its shards and index, the copies), so
    the source's shards stay."""
    source = tmp_path / "flat"
    source.mkdir()
    for path in model.glob("*.safetensors"):
        shutil.copy(path, source / path.name)
    shutil.copy(model / "model.safetensors.index.json", source)
    listed = sorted(p.name for p in source.iterdir())
    (source / "qcli.json").write_text(json.dumps({"weights": listed, "copied": ["notes.txt"]}))
    (source / "notes.txt").write_text("mine")
    before = snapshot(source)
    done = cli("quantize", source, "-o", f"{source}/", "--force", "--device", "cpu", "--no-stats")
    assert done.code == 0, done.err
    after = snapshot(source)
    assert {name: after[name] for name in before if name != "qcli.json"} == \
        {name: data for name, data in before.items() if name != "qcli.json"}
    assert "model.bpk" in after


def test_a_recorded_file_the_run_reads_is_never_removed(model: Path, tmp_path: Path) -> None:
    """An earlier run's record lists a copy this source no longer has (tokenizer.model), and that name in
    the folder is a hard link to the source's config.json: the run would remove it as stale, so it is
    refused, and nothing changes."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "qcli.json").write_text(json.dumps({"weights": ["model.bpk"], "copied": ["tokenizer.model"]}))
    os.link(model / "config.json", out / "tokenizer.model")
    before = snapshot(tmp_path)
    lines = assert_user_error(cli("quantize", model, "-o", f"{out}/", "--force", "--device", "cpu"), 2)
    assert "tokenizer.model is a file beside the input that the run reads" in lines[0]
    assert "never removes a file it reads" in lines[0]
    assert snapshot(tmp_path) == before
