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
from qcli.calibrate.checkpoint import Checkpoint, load_tokenizer
from qcli.calibrate.data import CalibrationSet, CalibrationText, calibration_tokens
from qcli.calibrate.model import CalibrationModel, open_model
from qcli.calibrate.runner import block_linears, layer_kinds, run_blocks, shapes_of
from qcli.io.imatrix import expert_stem, gguf_to_hf_names, hf_to_gguf_names
from qcli.io.readers import open_source
from tests.calibrate.test_calibrated_quantize import SEQ_LEN as IMATRIX_SEQ_LEN
from tests.calibrate.test_calibrated_quantize import TEXT as IMATRIX_TEXT
from tests.calibrate.test_calibrated_quantize import windows as imatrix_windows
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
    return open_model(Checkpoint(folder, source.infos(), source.load))


def linears(folder: Path) -> list[str]:
    """What the runner calibrates: the blocks' Linears and their fused experts' checkpoint tensors."""
    return block_linears(opened(folder), shapes_of(open_source(folder).infos()))


def windows(folder: Path) -> CalibrationSet:
    text = CalibrationText(TEXT.split("\n\n"), "text", "")
    return calibration_tokens(text, load_tokenizer(folder), samples=SAMPLES, seq_len=SEQ_LEN, seed=0)


def replayed(folder: Path, given=lambda name, weight: weight.clone()) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Each block's output over the windows as the runner's pass gives it (every Linear's weight given back
    as `given(name, weight)` makes it, so each block runs twice: the second pass's), and the windows."""
    model = opened(folder)
    blocks = model.module.model.layers
    outputs: list[list[torch.Tensor]] = [[] for _ in blocks]
    for index, block in enumerate(blocks):
        block.register_forward_hook(
            lambda _m, _args, out, index=index: outputs[index].append(out if torch.is_tensor(out) else out[0]))
    tokens = windows(folder)
    assembled = {name for assembly in model.assembled.values() for name in assembly.names}
    run_blocks(model, tokens, set(model.names.values()) | assembled, lambda name, weight, stats: given(name, weight))
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


@pytest.mark.parametrize("kind", MOE)
def test_the_weights_given_back_for_experts_take_their_tensors_place(decoders, kind, tmp_path):
    """Each expert tensor's weight given back reversed in its rows: the blocks then give what transformers'
    own model gives from a checkpoint holding those reversed tensors, so each lands in its own expert's rows
    of the fused parameter, in its own row order."""
    import shutil

    from safetensors.torch import load_file, save_file

    folder = decoders[kind]
    changed = shutil.copytree(folder, tmp_path / "changed")
    tensors = load_file(folder / "model.safetensors")
    reversed_ = {name: value.flip(0).contiguous() for name, value in tensors.items() if ".experts." in name}
    assert reversed_
    save_file(tensors | reversed_, changed / "model.safetensors", metadata={"format": "pt"})
    found, tokens = replayed(folder, lambda name, weight: weight.flip(0) if name in reversed_ else weight.clone())
    expected, model = own_forward(changed, tokens)
    assert_blocks(found, expected, model)
    unchanged, _ = own_forward(folder, tokens)
    assert (unchanged[-1] - expected[-1]).abs().max() > 1e-3  # the reversed experts change what the model gives


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
    calibrated = set(linears(folder))
    assert measured == calibrated and len(calibrated) >= 4 * 4
    assert all(0 < t["output_error"] < 1 for t in report["tensors"] if t["name"] in calibrated)
    assert not [w for w in report["warnings"] if "not calibrated" in w["message"] and "experts" in w["message"]]


@pytest.mark.parametrize("kind", KINDS)
def test_the_imatrix_names_every_linear_as_llama_cpp_and_holds_the_models_activations(decoders, kind, tmp_path):
    folder = decoders[kind]
    out = tmp_path / "imatrix.gguf"
    result = cli("imatrix", folder, "--calibration-data", folder / "calibration.txt", "-o", out, "--device", "cpu",
                 "--samples", "1000", "--seq-len", str(IMATRIX_SEQ_LEN))
    assert result.code == 0, result.err
    tensors = {t.name: t for t in gguf.GGUFReader(out).tensors}
    model_type = opened(folder).module.config.model_type
    stems = {expert_stem(name)[0] for name in linears(folder)}  # every expert's tensors as llama.cpp merges them
    names = hf_to_gguf_names(stems, model_type)
    assert set(names) == stems and all(name.startswith("blk.") for name in names.values())
    assert set(tensors) == {f"{name}{part}" for name in names.values() for part in (".in_sum2", ".counts")}
    assert gguf_to_hf_names(names.values(), model_type, hf=stems) == {cpp: hf for hf, cpp in names.items()}
    for name, (sums, tokens) in squares_by_input(folder).items():  # the Linears transformers' model runs
        stem = names[f"{name}.weight"]
        assert tensors[f"{stem}.counts"].data.tolist() == [tokens]
        np.testing.assert_allclose(tensors[f"{stem}.in_sum2"].data, sums, rtol=1e-5)
    if kind in MOE:  # each expert's row: the squares of the tokens routed to it, found without qcli
        routed = routed_inputs(folder, imatrix_windows(folder))
        for name, x in routed.items():
            stem, expert = expert_stem(name)
            cpp = names[stem]
            assert tensors[f"{cpp}.counts"].data.reshape(-1)[expert] == x.shape[0]
            np.testing.assert_allclose(tensors[f"{cpp}.in_sum2"].data[expert], (x * x).sum(0).numpy(), rtol=1e-4,
                                       atol=1e-6 * float((x * x).sum(0).max()) if len(x) else 0.0)
    weighed = cli("quantize", folder, "-o", tmp_path / "out.bpk", "--scheme", "q4s-b32", "--calibration", "mse",
                  "--imatrix", out, "--json")
    assert weighed.code == 0, weighed.err
    warnings = [w["message"] for w in json.loads(weighed.out)["warnings"]]
    assert not [w for w in warnings if "holds no importance" in w], warnings


def routed_inputs(folder: Path, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each expert tensor's input over the windows, found without qcli: transformers' own model run on
    `tokens`, each MoE block's input caught, the router run by hand (the top-k of its logits: the experts
    softmax and any renormalization keep), and the expert's gate and up projections (from the checkpoint's
    own tensors, SiLU) giving its down projection's input. By checkpoint name (float64 [tokens, in])."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, local_files_only=True).eval()
    config = model.config
    assert config.hidden_act == "silu"
    experts = getattr(config, "num_local_experts", None) or config.num_experts
    tensors = {k: v.double() for k, v in load_file(folder / "model.safetensors").items()}
    mixtral = config.model_type == "mixtral"
    caught: dict[int, list[torch.Tensor]] = {}
    for index, layer in enumerate(model.model.layers):
        layer.mlp.register_forward_pre_hook(
            lambda _m, args, index=index: caught.setdefault(index, []).append(args[0].reshape(-1, args[0].shape[-1])))
    with torch.no_grad():
        for window in tokens:
            model(input_ids=window[None])
    found = {}
    for index, inputs in caught.items():
        x = torch.cat(inputs).double()
        stem = f"model.layers.{index}.block_sparse_moe" if mixtral else f"model.layers.{index}.mlp"
        chosen = (x @ tensors[f"{stem}.gate.weight"].T).topk(config.num_experts_per_tok, dim=-1).indices
        for e in range(experts):
            mine = x[(chosen == e).any(-1)]
            gate, up, down = (("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj"))
            weight = {w: tensors[f"{stem}.experts.{e}.{w}.weight"] for w in (gate, up)}
            between = torch.nn.functional.silu(mine @ weight[gate].T) * (mine @ weight[up].T)
            found |= {f"{stem}.experts.{e}.{w}.weight": mine for w in (gate, up)}
            found[f"{stem}.experts.{e}.{down}.weight"] = between
    return found


@pytest.mark.parametrize("kind", MOE)
def test_each_experts_tensor_is_calibrated_on_the_tokens_routed_to_it(decoders, kind):
    """The Hessian and token count the runner hands on for each checkpoint tensor of the fused experts, and the
    weight it hands, are those of the expert's own rows on the tokens the router sends it (`routed_inputs`);
    the weight given back lands in those rows of the fused parameter, as the next pass shows."""
    from safetensors.torch import load_file

    folder = decoders[kind]
    model, tokens = opened(folder), windows(folder)
    tensors = load_file(folder / "model.safetensors")
    expected = routed_inputs(folder, tokens.tokens)
    seen: dict[str, tuple[torch.Tensor, int]] = {}

    def on_linear(name, weight, stats):
        if name in expected:
            torch.testing.assert_close(weight, tensors[name])  # its own rows, in its own order
            seen[name] = (stats.hessian.clone(), stats.tokens)
        return None

    result = run_blocks(model, tokens, set(expected), on_linear)
    assert set(seen) == set(expected) and not result.not_linear and not result.outside
    reached = 0
    for name, x in expected.items():
        hessian, count = seen[name]
        assert count == x.shape[0]
        reached += count > 0
        want = x.T @ x
        torch.testing.assert_close(hessian, want, rtol=1e-4, atol=1e-5 * float(want.abs().max()) if count else 0.0)
    assert reached >= len(expected) // 2  # most experts took tokens: the check is not of empty sums


def test_an_expert_no_token_reaches_takes_the_unweighted_search(tmp_path):
    """A Mixtral routing each token to one expert, its router's rows of experts 2 and 3 zero and that of
    expert 1 expert 0's negated: logits (a, -a, 0, 0) send every token to expert 0 or 1, and experts 2 and 3
    take none. GPTQ gives their tensors the bytes the data-free mse search writes (not GPTQ's zeroed columns
    of inputs that never fire), and a warning names them."""
    import transformers as t
    from safetensors.torch import load_file, save_file

    from qcli.io.burnpack import BurnpackReader
    from tests.calibrate_support import VOCAB, llama_tokenizer

    config = t.MixtralConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, vocab_size=VOCAB, num_local_experts=4, num_experts_per_tok=1)
    torch.manual_seed(0)
    t.MixtralForCausalLM(config).save_pretrained(tmp_path)
    llama_tokenizer(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    for layer in range(2):
        gate = tensors[f"model.layers.{layer}.block_sparse_moe.gate.weight"]
        gate[1], gate[2:] = -gate[0], 0
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    (tmp_path / "calibration.txt").write_text(IMATRIX_TEXT)
    common = ("--scheme", "q4s-b32", "--device", "cpu", "--json")
    gptq = cli("quantize", tmp_path, "-o", tmp_path / "gptq.bpk", *common, "--calibration", "gptq",
               "--calibration-data", tmp_path / "calibration.txt", "--samples", "1000", "--seq-len", str(SEQ_LEN))
    assert gptq.code == 0, gptq.err
    searched = cli("quantize", tmp_path, "-o", tmp_path / "mse.bpk", *common, "--calibration", "mse")
    assert searched.code == 0, searched.err
    unreached = [f"model.layers.{layer}.block_sparse_moe.experts.{e}.{w}.weight"
                 for layer in range(2) for e in (2, 3) for w in ("w1", "w2", "w3")]
    warned = [w for w in json.loads(gptq.out)["warnings"] if "no calibration token" in w["message"]]
    assert len(warned) == 1 and sorted(warned[0]["tensors"]) == sorted(unreached)
    ours, theirs = BurnpackReader.open(tmp_path / "gptq.bpk"), BurnpackReader.open(tmp_path / "mse.bpk")
    for name in unreached:
        assert bytes(ours.read(name)) == bytes(theirs.read(name)), name
    reached = "model.layers.0.block_sparse_moe.experts.0.w1.weight"
    assert bytes(ours.read(reached)) != bytes(theirs.read(reached))  # GPTQ's own, on its tokens
