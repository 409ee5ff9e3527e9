"""Every bad input of a calibrated run: one `error:` line, a `hint:`, its documented exit code, and nothing at the
output path (docs/reliability.md, "Calibration")."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.calibrate_support import TEXT, tiny_llama
from tests.cli_support import assert_user_error, cli

WINDOWS = ("--samples", "4", "--seq-len", "16")


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    folder = tiny_llama(tmp_path_factory.mktemp("llama"))
    (folder / "calibration.txt").write_text(TEXT)
    return folder


def gptq(folder: Path, out: Path, data: Path, *more: str):
    return cli("quantize", folder, "-o", out, "--calibration", "gptq", "--calibration-data", data, "--device", "cpu",
               *WINDOWS, *more)


@pytest.mark.parametrize(("content", "code", "message"), [
    (None, 2, "cannot read calibration text"),
    (b"", 3, "is empty"),
    (b"one\x00two", 3, "is binary"),
    (b"\xff\xfe not utf-8", 3, "not UTF-8"),
    (b'{"text": "a"}\n{"body": "b"}\n', 3, "text"),
    (b"too short", 3, "fewer than 2 windows of 16"),
])
def test_a_bad_calibration_text_is_refused_before_anything_is_written(llama, tmp_path, content, code, message):
    data = tmp_path / "calibration.txt"
    if content is not None:
        data.write_bytes(content)
    lines = assert_user_error(gptq(llama, tmp_path / "out.bpk", data), code)
    assert message in lines[0], lines
    assert list(tmp_path.iterdir()) == ([data] if content is not None else [])


def test_fewer_tokens_than_asked_is_a_warning_with_the_count_used(llama, tmp_path):
    result = gptq(llama, tmp_path / "out.bpk", llama / "calibration.txt", "--samples", "1000")
    assert result.code == 0, result.err
    warning = next(line for line in result.warnings if "fewer than 1000 windows" in line)
    assert warning.startswith("warning: ") and "calibrating on" in warning and (tmp_path / "out.bpk").exists()


@pytest.mark.parametrize(("remove", "message"), [("config.json", "no config.json"),
                                                  ("tokenizer.json", "no tokenizer")])
def test_a_checkpoint_without_its_config_or_tokenizer_is_refused_naming_it(llama, tmp_path, remove, message):
    folder = tmp_path / "model"
    shutil.copytree(llama, folder)
    for name in [remove] + (["tokenizer_config.json"] if remove == "tokenizer.json" else []):
        (folder / name).unlink()
    lines = assert_user_error(gptq(folder, tmp_path / "out.bpk", llama / "calibration.txt"), 2)
    assert message in lines[0] and not (tmp_path / "out.bpk").exists()


def test_nan_activations_are_an_input_error_naming_the_layer(llama, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(llama, folder)
    tensors = load_file(folder / "model.safetensors")
    tensors["model.layers.0.self_attn.o_proj.weight"][0, 0] = float("inf")  # its output, block 0's MLP input
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    recipe = tmp_path / "keep.toml"  # the inf weight kept, so that only the activations it makes are judged
    recipe.write_text('version = 1\n[[rule]]\nmatch = "model.layers.0.self_attn.o_proj.weight"\nkeep = true\n')
    lines = assert_user_error(gptq(folder, tmp_path / "out.bpk", llama / "calibration.txt", "--recipe", recipe), 3)
    assert "NaN or Inf" in lines[0] and "model.layers.0.mlp" in lines[0], lines
    assert not (tmp_path / "out.bpk").exists()


def test_a_device_out_of_memory_gives_the_estimate_and_windows_that_fit(llama, tmp_path, monkeypatch):
    from qcli.calibrate import session

    def short_of_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(session, "run_blocks", short_of_memory)
    lines = assert_user_error(gptq(llama, tmp_path / "out.bpk", llama / "calibration.txt"), 5)
    assert "ran out of memory calibrating 4 windows of 16 tokens (estimated" in lines[0]
    assert "--samples" in lines[-1] and not (tmp_path / "out.bpk").exists()


def test_an_interrupt_during_calibration_leaves_nothing(llama, tmp_path, monkeypatch):
    from qcli.calibrate import session

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(session, "gptq", interrupted)
    result = gptq(llama, tmp_path / "out.bpk", llama / "calibration.txt")
    assert result.code == 130 and "interrupted" in result.err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(("options", "message"), [
    (("--calibration", "gptq"), "--calibration gptq needs calibration text"),
    (("--calibration", "minmax", "--imatrix", "x.gguf"), "--imatrix weighs the scale search"),
    (("--calibration", "gptq", "--imatrix", "x.gguf"), "--calibration gptq needs calibration text"),
    (("--calibration", "mse", "--imatrix", "x.gguf", "--calibration-data", "x.txt"), "both give"),
    (("--calibration", "gptq", "--calibration-data", "x.txt", "--samples", "0"),
     "--samples must be between 1 and 16,777,216"),
])
def test_options_that_cannot_work_together_are_usage_errors(llama, tmp_path, options, message):
    lines = assert_user_error(cli("quantize", llama, "-o", tmp_path / "out.bpk", *options), 2)
    assert message in lines[0], lines
