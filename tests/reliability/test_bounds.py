"""Bounded by construction (docs/reliability.md, "Bounds"): every file qcli parses is read as a regular file
within a size and a depth, numeric options are range-checked before anything is read (a dry run refuses what
the run would), config.json is checked against the checkpoint before a model is built, and each of these
ends with its documented exit code, an `error:` and a `hint:`, never exit 70 or a hang."""

from __future__ import annotations

import json
import os
import resource
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from tests.calibrate_support import TEXT, tiny_llama
from tests.cli_support import ROOT, SINGLE, Result, assert_user_error, child_env, cli
from tests.gguf_support import gstr, header, tensor
from tests.hang_support import never_hangs

DEEP = "[" * 100_000 + "]" * 100_000
WINDOWS = ("--samples", "2", "--seq-len", "16", "--device", "cpu")


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    folder = tiny_llama(tmp_path_factory.mktemp("llama"))
    (folder / "calibration.txt").write_text(TEXT * 4)
    return folder


def copy(llama: Path, tmp_path: Path, **config: object) -> Path:
    folder = tmp_path / "model"
    shutil.copytree(llama, folder)
    if config:
        document = json.loads((folder / "config.json").read_text()) | config
        (folder / "config.json").write_text(json.dumps(document))
    return folder


def gptq(folder: Path, out: Path, data: Path, *more: str):
    return cli("quantize", folder, "-o", out, "--calibration", "gptq", "--calibration-data", data, *WINDOWS, *more)


def refused(result, code: int, *needles: str) -> str:
    line = assert_user_error(result, code)[0]
    assert all(needle in line for needle in needles), line
    return line


# -- calibration text ------------------------------------------------------------------------------


@pytest.mark.parametrize(("content", "needle"), [
    ('{"text": ' + DEEP + "}\n", "nested too deeply"),
    ('{"text": "a ' + "[" * 70 + "]" * 70 + '"}\n{"text": ' + "[" * 70 + "1" + "]" * 70 + "}\n", "more than 64 deep"),
    ('{"text": "the mill \\ud800 and the river"}\n', "lone surrogate ('\\ud800'"),
])
@pytest.mark.parametrize("dry_run", [(), ("--dry-run",)])
def test_a_hostile_calibration_json_is_refused(llama, tmp_path, content, needle, dry_run):
    data = tmp_path / "data.jsonl"
    data.write_text(content)
    refused(gptq(llama, tmp_path / "out.bpk", data, *dry_run), 3, "data.jsonl", needle)
    assert not (tmp_path / "out.bpk").exists()


def test_a_calibration_text_past_the_limit_is_refused_unread(llama, tmp_path):
    data = tmp_path / "huge.txt"
    with data.open("wb") as f:
        f.truncate(1 << 40)  # sparse: a terabyte that takes no disk, and that reading whole would never end
    with never_hangs():
        refused(gptq(llama, tmp_path / "out.bpk", data), 3, "huge.txt", "1,099,511,627,776 bytes", "67,108,864")


# -- config.json and tokenizer files ---------------------------------------------------------------


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json", "tokenizer_config.json"])
def test_a_config_or_tokenizer_nested_deep_is_refused(llama, tmp_path, name):
    folder = copy(llama, tmp_path)
    document = json.loads((folder / name).read_text())
    (folder / name).write_text(json.dumps(document)[:-1] + ', "x": ' + DEEP + "}")
    refused(gptq(folder, tmp_path / "out.bpk", llama / "calibration.txt"), 3, f"{name}: the JSON is nested too deeply")


@pytest.mark.parametrize(("change", "needle"), [
    ({"num_hidden_layers": 1}, "gives num_hidden_layers 1, but the checkpoint holds 2 blocks (model.layers.0 to .1)"),
    ({"num_hidden_layers": 3}, "gives num_hidden_layers 3, but the checkpoint holds 2 blocks"),
    ({"num_hidden_layers": 10**9}, "gives num_hidden_layers 1000000000, larger than any axis or count"),
    ({"intermediate_size": 10**12}, "gives intermediate_size 1000000000000, larger than any axis or count"),
    ({"vocab_size": 10},
     "gives vocab_size 10, but the token embedding 'model.embed_tokens.weight' has shape [300, 64]"),
    ({"max_position_embeddings": 10**15}, "gives max_position_embeddings 1000000000000000, but qcli reads at most"),
])
@pytest.mark.parametrize("dry_run", [(), ("--dry-run",)])
def test_a_config_that_does_not_describe_the_checkpoint_is_refused_before_a_model_is_built(
        llama, tmp_path, change, needle, dry_run):
    folder = copy(llama, tmp_path, **change)
    with never_hangs():
        refused(gptq(folder, tmp_path / "out.bpk", llama / "calibration.txt", *dry_run), 3, "config.json", needle)


def test_a_long_model_type_is_cut_in_the_message(llama, tmp_path):
    folder = copy(llama, tmp_path, model_type="x" * 1_000_000)
    line = refused(gptq(folder, tmp_path / "out.bpk", llama / "calibration.txt"), 2, "config.json")
    assert len(line) < 600 and "(1000" in line


def test_token_ids_past_the_embedding_are_refused(llama, tmp_path):
    folder = copy(llama, tmp_path)
    document = json.loads((folder / "tokenizer.json").read_text())
    vocab = document["model"]["vocab"]
    vocab[max(vocab, key=vocab.get)] = 5000  # the last merge the text makes, renumbered past the embedding
    (folder / "tokenizer.json").write_text(json.dumps(document))
    refused(gptq(folder, tmp_path / "out.bpk", llama / "calibration.txt"), 3, "token id 5000", "past the 300 rows")


# -- options ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("option", "value", "needle"), [
    ("--seed", str(1 << 64), "--seed 18446744073709551616 is not between 0 and 2^64 - 1"),
    ("--seed", "-1", "--seed -1 is not between"),
    ("--samples", str(10**20), "--samples must be between 1 and 16,777,216"),
    ("--seq-len", str(10**20), "--seq-len must be between 1 and 16,777,216"),
    ("--samples", str(1 << 21), "tokens, more than the 16,777,216 a calibration holds"),
])
@pytest.mark.parametrize("dry_run", [(), ("--dry-run",)])
def test_numeric_options_out_of_range_are_usage_errors(llama, tmp_path, option, value, needle, dry_run):
    result = gptq(llama, tmp_path / "out.bpk", llama / "calibration.txt", option, value, *dry_run)
    refused(result, 2, needle)


@pytest.mark.parametrize("dry_run", [(), ("--dry-run",)])
def test_a_seq_len_past_the_positions_is_a_usage_error(llama, tmp_path, dry_run):
    result = gptq(llama, tmp_path / "out.bpk", llama / "calibration.txt", "--seq-len", "300", *dry_run)
    refused(result, 2, "--seq-len 300 is longer than the model's 256 positions")


def test_imatrix_options_are_checked_alike(llama, tmp_path):
    result = cli("imatrix", llama, "--calibration-data", llama / "calibration.txt", "-o", tmp_path / "m.gguf",
                 "--seed", str(1 << 64))
    refused(result, 2, "--seed")


# -- a dry run exits as its run would --------------------------------------------------------------


def test_a_dry_run_onto_an_existing_output_without_force_exits_2(tmp_path):
    out = tmp_path / "out.bpk"
    out.write_bytes(b"kept")
    refused(cli("quantize", SINGLE, "-o", out, "--dry-run"), 2, "out.bpk already exists")
    assert cli("quantize", SINGLE, "-o", out, "--dry-run", "--force").code == 0
    assert out.read_bytes() == b"kept"


def test_a_dry_run_into_a_folder_that_has_files_exits_2(tmp_path):
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "notes.txt").write_text("mine")
    refused(cli("quantize", SINGLE, "-o", f"{tmp_path / 'folder'}/", "--dry-run"), 2, "already exists and is not empty")


def test_a_dry_run_on_cuda_without_cuda_exits_2(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: --device cuda is honoured")
    refused(cli("quantize", SINGLE, "-o", tmp_path / "out.bpk", "--dry-run", "--device", "cuda"), 2, "--device cuda")


# -- importance matrices ---------------------------------------------------------------------------


def test_an_imatrix_gguf_claiming_a_huge_array_ends(llama, tmp_path):
    path = tmp_path / "m.imatrix.gguf"
    claimed = gstr("imatrix.datasets") + struct.pack("<IIQ", 9, 8, 1 << 60)  # an array of 2^60 strings
    path.write_bytes(header(kv_count=1, kv=claimed))
    with never_hangs():
        result = cli("quantize", llama, "-o", tmp_path / "out.bpk", "--calibration", "mse", "--imatrix", path,
                     "--device", "cpu")
    refused(result, 3, "m.imatrix.gguf", "claims 1152921504606846976 items")


def test_an_imatrix_gguf_with_a_0d_tensor_is_an_input_error(llama, tmp_path):
    path = tmp_path / "m.imatrix.gguf"
    kvs = (gstr("imatrix.datasets") + struct.pack("<IIQ", 9, 8, 1) + gstr("calib.txt")
           + gstr("imatrix.chunk_count") + struct.pack("<II", 4, 1)
           + gstr("imatrix.chunk_size") + struct.pack("<II", 4, 16))
    tensors = tensor("blk.0.attn_q.weight.in_sum2", (), 0) + tensor("blk.0.attn_q.weight.counts", (), 0, offset=32)
    path.write_bytes(header(tensor_count=2, kv_count=3, kv=kvs, tensors=tensors,
                            data=bytes(32) + struct.pack("<f", 1.0) + bytes(28)))  # a sum of 0 over 1 token
    result = cli("quantize", llama, "-o", tmp_path / "out.bpk", "--calibration", "mse", "--imatrix", path,
                 "--device", "cpu")
    refused(result, 3, "m.imatrix.gguf", "the importance of 'model.layers.0.self_attn.q_proj.weight' has 1 input "
            "channels; the tensor has 64")


def test_a_legacy_imatrix_past_the_limit_is_refused_unread(llama, tmp_path):
    path = tmp_path / "m.dat"
    with path.open("wb") as f:
        f.write(struct.pack("<i", 1))
        f.truncate(1 << 40)
    with never_hangs():
        result = cli("quantize", llama, "-o", tmp_path / "out.bpk", "--calibration", "mse", "--imatrix", path,
                     "--device", "cpu")
    refused(result, 3, "m.dat", "a legacy importance matrix of 1,099,511,627,776 bytes")


def test_imatrix_on_a_full_disk_exits_4_and_leaves_nothing(llama, tmp_path):
    out = tmp_path / "out" / "m.imatrix.gguf"
    out.parent.mkdir()

    def small_files() -> None:  # Python ignores SIGXFSZ, so a write past 2 KiB gets EFBIG, as a full disk fails
        resource.setrlimit(resource.RLIMIT_FSIZE, (2048, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    proc = subprocess.run([sys.executable, "-m", "qcli", "imatrix", llama, "--calibration-data",
                           llama / "calibration.txt", "-o", out, *WINDOWS], cwd=ROOT, env=child_env(),
                          capture_output=True, text=True, timeout=300, preexec_fn=small_files)
    refused(Result(proc.returncode, proc.stdout, proc.stderr), 4, "cannot write", "m.imatrix.gguf")
    assert os.listdir(out.parent) == []


# -- the Hugging Face cache ------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_a_cache_ref_that_is_no_regular_file_is_refused_without_blocking(tmp_path, monkeypatch, kind):
    ref = tmp_path / "hub" / "models--org--name" / "refs" / "main"
    ref.parent.mkdir(parents=True)
    if kind == "fifo":
        os.mkfifo(ref)
    else:
        ref.symlink_to("/dev/zero")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.chdir(tmp_path)
    with never_hangs():
        refused(cli("quantize", "org/name", "--dry-run"), 3, "refs/main", "not a regular file")


# -- declarations ----------------------------------------------------------------------------------


def test_a_list_where_a_declaration_holds_a_string_is_refused(tmp_path):
    import torch
    from safetensors.torch import save_file

    save_file({"m.qweight": torch.zeros(8, 64, dtype=torch.int32), "m.qzeros": torch.zeros(1, 8, dtype=torch.int32),
               "m.scales": torch.ones(1, 64, dtype=torch.float16), "m.g_idx": torch.zeros(64, dtype=torch.int32)},
              tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": {
        "quant_method": "gptq", "bits": 4, "group_size": 64, "checkpoint_format": ["gptq"]}}))
    result = cli("quantize", tmp_path, "-o", tmp_path / "out.bpk", "--device", "cpu")
    assert_user_error(result, 2)
    assert "checkpoint format ['gptq']" in result.err
