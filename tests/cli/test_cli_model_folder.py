"""`qcli quantize -o DIR/`, a Burn user's model folder, and `qcli quantize ORG/NAME` from the local Hugging
Face cache, through the real entry point.

Expectations: the folder's weights are byte for byte what the same run writes as one file, its side files
byte for byte the source's, its record valid against docs/json-schema.json's `model_folder`; the cache is
laid out as huggingface_hub lays it out (tests/hf_cache_support.py), never reached over a network.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from qcli.io.burnpack import BurnpackReader
from tests.cli.test_cli_quantize import _interrupting_run
from tests.cli_support import SCHEMA, SHARDED, SINGLE, assert_user_error, cli, unwrapped, validate_json
from tests.hf_cache_support import cached_model

SIDE = {"config.json": b'{"model_type": "llama", "hidden_size": 128}\n', "tokenizer.json": b'{"version": "1.0"}',
        "tokenizer.model": bytes(range(256)), "generation_config.json": b"{}",
        "chat_template.jinja": b"{% for message in messages %}{{ message['content'] }}{% endfor %}"}
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def validate_record(doc: dict) -> None:
    import jsonschema

    jsonschema.validate(doc, {**SCHEMA, "oneOf": [{"$ref": "#/$defs/model_folder"}]})


@pytest.fixture
def source(tmp_path):
    """The sharded sample's weights in a folder with a config, a tokenizer and a file qcli does not copy."""
    folder = tmp_path / "src"
    folder.mkdir()
    for path in [*SHARDED.glob("*.safetensors"), SHARDED / "model.safetensors.index.json"]:
        (folder / path.name).write_bytes(path.read_bytes())
    for name, data in SIDE.items():
        (folder / name).write_bytes(data)
    (folder / "README.md").write_text("not copied")
    return folder


def files(folder) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def test_a_folder_output_holds_the_weights_the_side_files_unchanged_and_the_record(source, tmp_path):
    single = tmp_path / "single.bpk"
    assert cli("quantize", source, "-o", single, "--device", "cpu").code == 0
    out = tmp_path / "out"
    done = cli("quantize", source, "-o", f"{out}/", "--device", "cpu")
    assert done.code == 0, done.err
    written = files(out)
    assert sorted(written) == sorted(["model.bpk", "qcli.json", *SIDE])
    assert written["model.bpk"] == single.read_bytes()
    for name, data in SIDE.items():
        assert written[name] == data
        assert not (out / name).is_symlink()
    record = json.loads(written["qcli.json"])
    validate_record(record)
    assert record["weights"] == ["model.bpk"] and sorted(record["copied"]) == sorted(SIDE)
    assert record["source"]["path"] == str(source.resolve()) and record["source"]["input"] == str(source)
    assert [f["bytes"] for f in record["source"]["files"]] == [
        (source / n).stat().st_size for n in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")]
    assert record["tensors"] == {"total": 21, "quantized": 16, "kept": 5, "transposed": 0}
    assert record["options"]["scheme"] == "q4s-b32"


def test_the_side_files_are_the_ones_transformers_reads_beside_a_model():
    """Every file name transformers gives a config, a generation config, a tokenizer's files, its vocabulary
    (for the families qcli calibrates and their kin) or a chat template is copied."""
    import importlib

    from transformers import tokenization_utils_base as base
    from transformers.utils import CONFIG_NAME, GENERATION_CONFIG_NAME
    from transformers.utils.hub import CHAT_TEMPLATE_FILE, LEGACY_PROCESSOR_CHAT_TEMPLATE_FILE

    from qcli.output.folder import SIDE_FILES

    names = {CONFIG_NAME, GENERATION_CONFIG_NAME, CHAT_TEMPLATE_FILE, LEGACY_PROCESSOR_CHAT_TEMPLATE_FILE,
             base.SPECIAL_TOKENS_MAP_FILE, base.ADDED_TOKENS_FILE, base.TOKENIZER_CONFIG_FILE, base.FULL_TOKENIZER_FILE}
    for family in ("llama", "gpt2", "bert", "t5", "qwen2"):
        names |= set(importlib.import_module(f"transformers.models.{family}.tokenization_{family}")
                     .VOCAB_FILES_NAMES.values())
    assert names == set(SIDE_FILES)


def test_an_existing_empty_folder_is_a_folder_output_without_the_slash(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    assert cli("quantize", SINGLE, "-o", out, "--scheme", "q8s", "--device", "cpu").code == 0
    assert sorted(files(out)) == ["model.bpk", "qcli.json"]  # the sample's folder has no config
    record = json.loads((out / "qcli.json").read_text())
    assert record["copied"] == [] and record["options"]["scheme"] == "q8s"


def test_a_sharded_folder_output_and_a_stale_layout_replaced(source, tmp_path):
    out = tmp_path / "out"
    assert cli("quantize", source, "-o", f"{out}/", "--device", "cpu").code == 0
    assert cli("quantize", source, "-o", f"{out}/", "--device", "cpu", "--force", "--max-shard-size", "300KB").code == 0
    shards = ["model-00001-of-00002.bpk", "model-00002-of-00002.bpk", "model.bpk.index.json"]
    assert sorted(files(out)) == sorted([*shards, "qcli.json", *SIDE])  # the one file of the first run is gone
    assert json.loads((out / "qcli.json").read_text())["weights"] == shards
    index = json.loads((out / "model.bpk.index.json").read_text())
    assert set(index["weight_map"].values()) == set(shards[:2])
    (source / "tokenizer.model").unlink()
    assert cli("quantize", source, "-o", out, "--device", "cpu", "--force").code == 0
    assert sorted(files(out)) == sorted(["model.bpk", "qcli.json", *(n for n in SIDE if n != "tokenizer.model")])


def test_a_folder_with_files_needs_force_and_keeps_what_qcli_does_not_write(source, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (out / "config.json").write_text("old")
    lines = assert_user_error(cli("quantize", source, "-o", f"{out}/", "--device", "cpu"), 2)
    assert lines[0] == f"error: {out} already exists and is not empty"
    assert "--force" in lines[-1]
    assert files(out) == {"notes.txt": b"mine", "config.json": b"old"}
    dry = cli("quantize", source, "-o", f"{out}/", "--dry-run")  # a dry run refuses it as the run does
    assert assert_user_error(dry, 2) == lines
    assert files(out) == {"notes.txt": b"mine", "config.json": b"old"}
    assert cli("quantize", source, "-o", f"{out}/", "--device", "cpu", "--force").code == 0
    assert files(out)["notes.txt"] == b"mine" and files(out)["config.json"] == SIDE["config.json"]


def test_a_folder_a_killed_run_left_its_temporaries_in_needs_no_force_and_is_cleaned(source, tmp_path):
    """SIGKILL runs no handler: a new folder keeps the killed run's temporary files, which are no files of
    the user's, so the next run goes ahead and removes them, naming each."""
    out = tmp_path / "out"
    out.mkdir()
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # a process id that no longer runs
    left = [out / f".model.bpk.{child.pid}-0.tmp", out / f".config.json.{child.pid}-0.tmp"]
    for path in left:
        path.write_bytes(b"partial")
    done = cli("quantize", source, "-o", f"{out}/", "--device", "cpu")
    assert done.code == 0, done.err
    assert all(f"removed {path.name}" in done.err for path in left)
    assert sorted(files(out)) == sorted(["model.bpk", "qcli.json", *SIDE])


def test_a_folder_output_onto_a_file_or_onto_the_source_itself_is_refused(source, tmp_path):
    taken = tmp_path / "taken"
    taken.write_bytes(b"x")
    lines = assert_user_error(cli("quantize", source, "-o", f"{taken}/", "--force"), 2)
    assert "is not a folder" in lines[0] and taken.read_bytes() == b"x"
    before = files(source)
    lines = assert_user_error(cli("quantize", source, "-o", f"{source}/", "--force", "--device", "cpu"), 2)
    assert "config.json" in lines[0]
    assert files(source) == before


def test_a_dry_run_into_a_folder_writes_nothing_and_says_what_it_would_write(source, tmp_path):
    out = tmp_path / "out"
    done = cli("quantize", source, "-o", f"{out}/", "--dry-run")
    assert done.code == 0 and not out.exists()
    assert f"would write {out}/model.bpk" in unwrapped(done.out)
    assert f"{out}/config.json" in done.out and f"{out}/qcli.json" in done.out
    doc = cli("quantize", source, "-o", f"{out}/", "--dry-run", "--json").json
    validate_json(doc)
    assert doc["outputs"][0] == f"{out}/model.bpk" and doc["outputs"][-1] == f"{out}/qcli.json"


def test_a_gguf_file_into_a_folder_copies_nothing_beside_it(tmp_path):
    """A GGUF file keeps its config and tokenizer in its own metadata: a config.json beside it may be
    another model's."""
    import numpy as np
    from gguf import GGMLQuantizationType

    from tests.gguf_support import write_gguf

    write_gguf(tmp_path / "m.gguf", {"blk.0.ffn_up.weight": (np.ones((64, 128), np.float32), GGMLQuantizationType.F32)})
    (tmp_path / "config.json").write_text("{}")
    out = tmp_path / "out"
    assert cli("quantize", tmp_path / "m.gguf", "-o", f"{out}/", "--device", "cpu").code == 0
    assert sorted(files(out)) == ["model.bpk", "qcli.json"]


@pytest.mark.parametrize("existing", [False, True], ids=["new", "existing"])
def test_an_interrupted_folder_run_leaves_no_folder_or_the_old_one_untouched(source, tmp_path, monkeypatch,
                                                                            existing):
    from qcli.pipeline import cpu

    out = tmp_path / "out"
    if existing:
        out.mkdir()
        (out / "config.json").write_text("old")
    monkeypatch.setattr(cpu, "run", _interrupting_run(lambda: os.kill(os.getpid(), signal.SIGTERM)))
    lines = assert_user_error(cli("quantize", source, "-o", f"{out}/", "--force", "--device", "cpu"), 130)
    assert lines[0] == "error: interrupted"
    if existing:
        assert files(out) == {"config.json": b"old"}
    else:
        assert not out.exists()


def test_an_interrupt_at_the_commit_leaves_the_new_folder_complete(source, tmp_path, monkeypatch):
    """SIGTERM during the renames takes effect after them: the folder the run created stays, whole."""
    import time

    from qcli.io.staged import StagedFile

    real = StagedFile.commit

    def commit(self) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)  # time for the handler to run, were it to raise
        real(self)

    monkeypatch.setattr(StagedFile, "commit", commit)
    out = tmp_path / "out"
    lines = assert_user_error(cli("quantize", source, "-o", f"{out}/", "--device", "cpu"), 130)
    assert lines[0].startswith("error: interrupted after the output was written:")
    assert sorted(files(out)) == sorted(["model.bpk", "qcli.json", *SIDE])
    assert files(out)["config.json"] == SIDE["config.json"]


def test_a_failed_write_into_a_new_folder_leaves_no_folder(source, tmp_path, monkeypatch):
    from qcli.io import staged

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(staged.shutil, "copyfileobj", full)
    out = tmp_path / "out"
    lines = assert_user_error(cli("quantize", source, "-o", f"{out}/", "--device", "cpu"), 4)
    assert "No space left on device" in lines[0]
    assert not out.exists()


# -- ORG/NAME from the local Hugging Face cache ----------------------------------------------------


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """The sample cached as `tiny/llama` with a config, HF_HUB_CACHE pointing there, and an empty working
    folder."""
    cache = tmp_path / "hub"
    data = {"model.safetensors": SINGLE.read_bytes(), "config.json": SIDE["config.json"]}
    snapshot = cached_model(cache, "tiny/llama", data, COMMIT)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return snapshot


def test_a_cached_model_name_writes_the_folder_name_here(hub, tmp_path):
    done = cli("quantize", "tiny/llama", "--device", "cpu")
    assert done.code == 0, done.err
    out = tmp_path / "work" / "llama"
    assert sorted(files(out)) == ["config.json", "model.bpk", "qcli.json"]
    assert (out / "config.json").read_bytes() == SIDE["config.json"] and not (out / "config.json").is_symlink()
    single = tmp_path / "single.bpk"
    assert cli("quantize", SINGLE, "-o", single, "--device", "cpu").code == 0
    mine, theirs = BurnpackReader.open(out / "model.bpk"), BurnpackReader.open(single)
    assert mine.entries() == theirs.entries()  # the metadata differs: the cached file's name
    assert all(bytes(mine.read(e.name)) == bytes(theirs.read(e.name)) for e in theirs.entries())
    record = json.loads((out / "qcli.json").read_text())
    validate_record(record)
    assert record["source"]["input"] == "tiny/llama" and record["source"]["path"] == str(hub)
    assert not [p for p in hub.parent.parent.rglob("*") if p.name.endswith(".bpk")]  # nothing in the cache


def test_a_cached_model_at_a_revision_and_into_a_file(hub, tmp_path):
    assert cli("quantize", "tiny/llama", "--revision", COMMIT, "-o", "x.bpk", "--device", "cpu").code == 0
    assert (tmp_path / "work" / "x.bpk").is_file() and not (tmp_path / "work" / "llama").exists()
    lines = assert_user_error(cli("quantize", "tiny/llama", "--revision", "v9", "--dry-run"), 3)
    assert "revision v9" in lines[0] and "refs/v9" in lines[0]


def test_a_model_not_in_the_cache_says_where_it_looked_and_how_to_get_it(hub, tmp_path):
    lines = assert_user_error(cli("quantize", "tiny/other", "--dry-run"), 3)
    assert str(tmp_path / "hub" / "models--tiny--other") in lines[0]
    assert lines[-1].startswith("hint: download it first with `hf download tiny/other`")
    assert os.listdir(tmp_path / "work") == []


def test_a_path_that_exists_wins_over_a_cache_name(hub, tmp_path):
    local = tmp_path / "work" / "tiny" / "llama"
    local.mkdir(parents=True)
    (local / "model.safetensors").write_bytes(SINGLE.read_bytes())
    done = cli("quantize", "tiny/llama", "--dry-run")
    assert done.code == 0 and f"would write {tmp_path / 'work' / 'tiny' / 'llama.bpk'}" not in done.out
    assert "would write tiny/llama.bpk" in done.out
    lines = assert_user_error(cli("quantize", "tiny/llama", "--revision", "main", "--dry-run"), 2)
    assert "--revision" in lines[0]


def test_every_command_that_reads_a_checkpoint_takes_a_cached_model_name(hub, tmp_path):
    """inspect, its --compare, validate-scheme --model and imatrix find ORG/NAME as quantize does: the same
    report as for the file the cache holds, and the same cache miss."""
    recipe = SINGLE.with_name("tiny-llama.toml")
    by_name = cli("inspect", "tiny/llama", "--json")
    by_path = cli("inspect", hub / "model.safetensors", "--json")
    assert by_name.code == 0, by_name.err
    assert by_name.json["path"] == "tiny/llama" and by_name.json["tensors"] == by_path.json["tensors"]
    checked = cli("validate-scheme", recipe, "--model", "tiny/llama", "--json")
    assert checked.code == 0, checked.err
    assert checked.json["problems"] == cli("validate-scheme", recipe, "--model", SINGLE, "--json").json["problems"]
    out = tmp_path / "x.bpk"
    assert cli("quantize", "tiny/llama", "-o", out, "--device", "cpu").code == 0
    compared = cli("inspect", out, "--compare", "tiny/llama")
    assert compared.code == 0 and "all tensors match" in compared.out
    for command in (["inspect", "tiny/other"], ["validate-scheme", recipe, "--model", "tiny/other"],
                    ["imatrix", "tiny/other", "--calibration-data", recipe]):
        lines = assert_user_error(cli(*command), 3)
        assert "models--tiny--other" in lines[0] and "`hf download tiny/other`" in lines[-1], command


def test_imatrix_of_a_cached_model_writes_here_not_into_the_cache():
    from pathlib import Path

    from qcli.commands.imatrix import default_output

    assert default_output(Path("/cache/snapshots/abc"), "tiny/llama") == Path("llama.imatrix.gguf")
