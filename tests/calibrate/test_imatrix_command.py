"""`qcli imatrix` writes llama.cpp's importance matrix, read here by the gguf package's own reader and held to
the activations transformers' model gives (no qcli code); `quantize --imatrix` weighs the search with it as
the same run's activations do."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from tests.calibrate.test_calibrated_quantize import SEQ_LEN, TEXT, windows
from tests.calibrate_support import tiny_llama
from tests.cli_support import assert_user_error, cli, unwrapped

WINDOWS = ("--samples", "1000", "--seq-len", str(SEQ_LEN))
# The run's activations against transformers' float32 ones on the CPU: on CUDA the blocks run in TF32
# (qcli.calibrate.runner), 10 mantissa bits.
RTOL = {"cpu": 1e-5, "cuda": 1e-2}


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> Path:
    folder = tiny_llama(tmp_path_factory.mktemp("llama"))
    (folder / "calibration.txt").write_text(TEXT)
    return folder


def squares_by_input(folder: Path) -> dict[str, tuple[np.ndarray, int]]:
    """Σ x² per input channel and the token count of every Linear in the blocks, float model, on the windows."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()
    found: dict[str, list] = {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and name.startswith("model.layers."):
            def keep(_m, args, _out, name=name):
                x = args[0].reshape(-1, args[0].shape[-1]).double()
                sums, count = found.get(name, (0.0, 0))
                found[name] = (sums + (x * x).sum(0), count + x.shape[0])
            module.register_forward_hook(keep)
    with torch.no_grad():
        for window in windows(folder):
            model(input_ids=window[None])
    return {name: (sums.numpy(), count) for name, (sums, count) in found.items()}


def test_the_imatrix_is_llama_cpps_layout_and_the_models_activations(llama, tmp_path, device):
    out = tmp_path / "imatrix.gguf"
    result = cli("imatrix", llama, "--calibration-data", llama / "calibration.txt", "-o", out, "--device", device,
                 *WINDOWS)
    assert result.code == 0, result.err
    reader = gguf.GGUFReader(out)
    fields = {f.name: f.contents() for f in reader.fields.values() if not f.name.startswith("GGUF.")}
    count = len(windows(llama))
    assert fields == {"general.type": "imatrix", "imatrix.datasets": ["calibration.txt"],
                      "imatrix.chunk_count": count, "imatrix.chunk_size": SEQ_LEN}
    tensors = {t.name: t for t in reader.tensors}
    expected = squares_by_input(llama)
    hf_to_llama = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                   "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                   "mlp.down_proj": "ffn_down"}  # llama.cpp's names (its convert script's tensor map)
    assert len(tensors) == 2 * len(expected)
    for name, (sums, tokens) in expected.items():
        block, module = name.removeprefix("model.layers.").split(".", 1)
        stem = f"blk.{block}.{hf_to_llama[module]}.weight"
        squares, counts = tensors[f"{stem}.in_sum2"], tensors[f"{stem}.counts"]
        assert squares.tensor_type == counts.tensor_type == gguf.GGMLQuantizationType.F32
        assert counts.data.tolist() == [tokens] and tokens == count * SEQ_LEN
        np.testing.assert_allclose(squares.data, sums, rtol=RTOL[device])


def tensors(path: Path) -> dict[str, bytes]:
    from qcli.io.burnpack import BurnpackReader

    reader = BurnpackReader.open(path)
    return {entry.name: bytes(reader.read(entry.name)) for entry in reader.entries()}


def test_quantize_with_the_imatrix_searches_as_with_the_same_runs_activations(llama, tmp_path, device):
    imatrix = tmp_path / "imatrix.gguf"
    data = ("--calibration-data", llama / "calibration.txt")
    assert cli("imatrix", llama, *data, "-o", imatrix, "--device", device, *WINDOWS).code == 0
    weighed = ("quantize", llama, "--calibration", "mse", "--scheme", "q4s-b32", "--device", device)
    by_matrix = cli(*weighed, "-o", tmp_path / "file.bpk", "--imatrix", imatrix)
    assert by_matrix.code == 0, by_matrix.err
    # the embedding lies outside the blocks the matrix measures: said once, no rerun offered
    said = [line for line in by_matrix.warnings if str(imatrix) in line]
    assert len(said) == 1 and "model.embed_tokens.weight" in said[0] and "not weighed" in said[0], said
    assert "(qcli imatrix)" not in unwrapped(by_matrix.err)
    assert cli(*weighed, "-o", tmp_path / "run.bpk", *data, *WINDOWS).code == 0
    assert cli(*weighed, "-o", tmp_path / "plain.bpk").code == 0
    by_file, by_run, plain = (tensors(tmp_path / f"{n}.bpk") for n in ("file", "run", "plain"))
    assert by_file == by_run  # the metadata differ: each records what it was calibrated on
    assert by_file != plain


def test_imatrix_refuses_an_existing_output_and_a_bad_text(llama, tmp_path):
    out = tmp_path / "imatrix.gguf"
    out.write_bytes(b"keep")
    lines = assert_user_error(cli("imatrix", llama, "--calibration-data", llama / "calibration.txt", "-o", out), 2)
    assert "already exists" in lines[0] and out.read_bytes() == b"keep"
    missing = cli("imatrix", llama, "--calibration-data", tmp_path / "none.txt", "-o", tmp_path / "x")
    lines = assert_user_error(missing, 2)
    assert "cannot read calibration text" in lines[0] and not (tmp_path / "x").exists()


def test_quiet_prints_only_the_file_written(llama, tmp_path):
    out = tmp_path / "imatrix.gguf"
    result = cli("imatrix", llama, "--calibration-data", llama / "calibration.txt", "-o", out, "--device", "cpu",
                 "--quiet", *WINDOWS)
    assert result.code == 0, result.err
    assert result.out.splitlines() == [f"wrote {out}"] and out.is_file()
