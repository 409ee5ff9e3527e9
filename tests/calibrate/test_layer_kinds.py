"""Calibration of decoders whose layers are of two kinds (Gemma 2 and 3, a Qwen2 with sliding-window layers:
each kind its own attention mask, and in Gemma 3 its own rotary embeddings) and of MoE decoders (Mixtral,
Qwen2-MoE, Qwen3-MoE: experts transformers fuses from the checkpoint's tensors), each a tiny model transformers
builds from a config. Each block's output as the runner replays it is held to the model's own forward
(from_pretrained, output_hidden_states, no qcli code); GPTQ and `qcli imatrix` run end to end, the
imatrix's sums held to the model's own activations, and every Linear's llama.cpp name maps back to it."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from qcli.calibrate import runner
from qcli.calibrate.data import CalibrationSet, CalibrationText, calibration_tokens
from qcli.calibrate.model import CalibrationModel, load_tokenizer, open_model
from qcli.calibrate.runner import block_linears, layer_kinds, run_blocks
from qcli.io.imatrix import gguf_to_hf_names, hf_to_gguf_names
from qcli.io.readers import open_source
from tests.calibrate.test_calibrated_quantize import SEQ_LEN as IMATRIX_SEQ_LEN
from tests.calibrate.test_calibrated_quantize import TEXT as IMATRIX_TEXT
from tests.calibrate.test_imatrix_command import squares_by_input
from tests.calibrate_support import KINDS, SLIDING, TEXT, tiny_decoder
from tests.cli_support import cli

SAMPLES, SEQ_LEN = 3, 32  # windows four times the sliding window
TWO_KINDS = ("gemma2", "gemma3", "qwen2-sliding")
MOE = ("mixtral", "qwen2-moe", "qwen3-moe")


@pytest.fixture(scope="module")
def decoders(tmp_path_factory) -> dict[str, Path]:
    built = {kind: tiny_decoder(tmp_path_factory.mktemp(kind), kind) for kind in KINDS}
    for folder in built.values():
        (folder / "calibration.txt").write_text(IMATRIX_TEXT)
    return built


def opened(folder: Path) -> CalibrationModel:
    source = open_source(folder)
    return open_model(folder, source.infos(), source.load)


def windows(folder: Path) -> CalibrationSet:
    text = CalibrationText(TEXT.split("\n\n"), "text", "")
    return calibration_tokens(text, load_tokenizer(folder), samples=SAMPLES, seq_len=SEQ_LEN, seed=0)


def replayed(folder: Path) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Each block's output over the windows as the runner's pass gives it (every Linear's weight given back,
    so each block runs twice: the second pass's), and the windows."""
    model = opened(folder)
    blocks = model.module.model.layers
    outputs: list[list[torch.Tensor]] = [[] for _ in blocks]
    for index, block in enumerate(blocks):
        block.register_forward_hook(
            lambda _m, _args, out, index=index: outputs[index].append(out if torch.is_tensor(out) else out[0]))
    tokens = windows(folder)
    assembled = {name for assembly in model.assembled.values() for name in assembly.names}
    run_blocks(model, tokens, set(model.names.values()) | assembled, lambda name, weight, stats: weight.clone())
    return [torch.cat(found)[-SAMPLES:] for found in outputs], tokens.tokens  # windows may run several a call


def own_forward(folder: Path, tokens: torch.Tensor) -> tuple[list[torch.Tensor], torch.nn.Module]:
    """The hidden state after each block of transformers' own model of `folder` on `tokens` (the last one
    after the final norm, as transformers gives it), and the model."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).eval()
    with torch.no_grad():
        hidden = model(input_ids=tokens, output_hidden_states=True).hidden_states
    return list(hidden[1:]), model


def assert_blocks(found: list[torch.Tensor], expected: list[torch.Tensor], model: torch.nn.Module) -> None:
    with torch.no_grad():
        found = [*found[:-1], model.model.norm(found[-1])]
    for index, (ours, theirs) in enumerate(zip(found, expected, strict=True)):
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5, msg=f"block {index}")


@pytest.mark.parametrize("kind", KINDS)
def test_each_blocks_output_is_the_models_own_hidden_state(decoders, kind):
    found, tokens = replayed(decoders[kind])
    expected, model = own_forward(decoders[kind], tokens)
    assert_blocks(found, expected, model)


@pytest.mark.parametrize("kind", TWO_KINDS)
def test_the_layers_are_of_two_kinds_and_the_first_blocks_inputs_would_not_do(decoders, kind, monkeypatch):
    """Run with the first block's inputs for every block (as before layers of several kinds were run), the
    full-attention blocks give other outputs: the windows are longer than the sliding window, so the kinds'
    masks differ, and what the check above holds is each kind's own inputs."""
    folder = decoders[kind]
    assert layer_kinds(opened(folder).module) == ["sliding_attention", "full_attention"]
    monkeypatch.setattr(runner, "layer_kinds", lambda module: [])
    found, tokens = replayed(folder)
    expected, _ = own_forward(folder, tokens)
    assert SEQ_LEN > SLIDING
    torch.testing.assert_close(found[0], expected[0], rtol=1e-4, atol=1e-5)  # sliding, with its own mask
    assert (found[1] - expected[1]).abs().max() > 1e-2 * expected[1].abs().max()


@pytest.mark.parametrize("kind", KINDS)
def test_gptq_calibrates_every_linear_of_the_blocks(decoders, kind, tmp_path):
    folder = decoders[kind]
    result = cli("quantize", folder, "-o", tmp_path / "out.bpk", "--scheme", "q4s-b32", "--device", "cpu",
                 "--json", "--samples", "1000", "--seq-len", str(SEQ_LEN), "--calibration", "gptq",
                 "--calibration-data", folder / "calibration.txt")
    assert result.code == 0, result.err
    report = json.loads(result.out)
    assert report["calibration"]["method"] == "gptq" and report["calibration"]["blocks"] == 4
    measured = {t["name"] for t in report["tensors"] if t["output_error"] is not None}
    linears = set(block_linears(opened(folder)))
    assert measured == linears and len(linears) >= 4 * 4
    assert all(0 < t["output_error"] < 1 for t in report["tensors"] if t["name"] in linears)


@pytest.mark.parametrize("kind", KINDS)
def test_the_imatrix_names_every_linear_as_llama_cpp_and_holds_the_models_activations(decoders, kind, tmp_path):
    folder = decoders[kind]
    out = tmp_path / "imatrix.gguf"
    result = cli("imatrix", folder, "--calibration-data", folder / "calibration.txt", "-o", out, "--device", "cpu",
                 "--samples", "1000", "--seq-len", str(IMATRIX_SEQ_LEN))
    assert result.code == 0, result.err
    tensors = {t.name: t for t in gguf.GGUFReader(out).tensors}
    model = opened(folder)
    linears = block_linears(model)
    model_type = model.module.config.model_type
    names = hf_to_gguf_names(linears, model_type)
    assert set(names) == set(linears) and all(name.startswith("blk.") for name in names.values())
    assert set(tensors) == {f"{name}{part}" for name in names.values() for part in (".in_sum2", ".counts")}
    assert gguf_to_hf_names(names.values(), model_type, hf=linears) == {cpp: hf for hf, cpp in names.items()}
    for name, (sums, tokens) in squares_by_input(folder).items():  # the Linears transformers' model runs
        stem = names[f"{name}.weight"]
        assert tensors[f"{stem}.counts"].data.tolist() == [tokens]
        np.testing.assert_allclose(tensors[f"{stem}.in_sum2"].data, sums, rtol=1e-5)
    if kind in ("gemma2", "gemma3", "qwen2-sliding", "qwen2-moe"):
        weighed = cli("quantize", folder, "-o", tmp_path / "out.bpk", "--scheme", "q4s-b32", "--calibration", "mse",
                      "--imatrix", out, "--json")
        assert weighed.code == 0, weighed.err
        warnings = [w["message"] for w in json.loads(weighed.out)["warnings"]]
        assert not [w for w in warnings if "holds no importance" in w], warnings
