"""The block-by-block run held to transformers' own model: each Linear's Hessian against X^T X of the inputs a
plain forward of the whole model (from_pretrained, forward hooks, no qcli code) gives it, each block's output
against that model's, and a quantized block's effect on the next against the same model with those weights;
for a Llama and a BERT. Then the model's building: names mapped, tied heads, and the errors."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from qcli.calibrate.checkpoint import CALIBRATE_HINT, Checkpoint, load_tokenizer
from qcli.calibrate.data import CalibrationSet, CalibrationText, calibration_tokens
from qcli.calibrate.model import CalibrationModel, open_model
from qcli.calibrate.runner import SLACK, block_linears, estimate_memory, run_blocks, shapes_of
from qcli.errors import InputError, UsageError
from qcli.io.readers import open_source
from tests.calibrate_support import TEXT, VOCAB, llama_tokenizer, tiny_bert, tiny_llama

SAMPLES, SEQ_LEN = 4, 32
STEP = 0.02  # the "quantizer": weights rounded to multiples of this (the weights are drawn with std 0.02)
BLOCKS = {"llama": "model.layers", "bert": "encoder.layer"}


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    return {"llama": tiny_llama(tmp_path_factory.mktemp("llama")),
            "bert": tiny_bert(tmp_path_factory.mktemp("bert")),
            "bert-head": tiny_bert(tmp_path_factory.mktemp("bert-head"), seed=1, head=True)}


def windows(folder: Path) -> CalibrationSet:
    text = CalibrationText(TEXT.split("\n\n"), "text", "")
    return calibration_tokens(text, load_tokenizer(folder), samples=SAMPLES, seq_len=SEQ_LEN, seed=0)


def opened(folder: Path, tensor=None) -> CalibrationModel:
    source = open_source(folder)
    return open_model(Checkpoint(folder, source.infos(), tensor or source.load))


def run(folder: Path, on_linear, device: str = "cpu", linears=None, **options):
    """The run on `folder`'s checkpoint and windows, every tensor of the checkpoint asked for unless `linears`."""
    model = opened(folder)
    asked = linears if linears is not None else set(model.names.values())
    return run_blocks(model, windows(folder), asked, on_linear, device=device, **options), model


def rounded(weight: torch.Tensor) -> torch.Tensor:
    return torch.round(weight / STEP) * STEP


def reference(folder: Path, tokens: torch.Tensor, cls_name: str = "AutoModel", quantized_block: int | None = None
              ) -> tuple[dict[str, torch.Tensor], list[torch.Tensor]]:
    """X^T X (float64) of every Linear's input by its weight's checkpoint name, and each repeated block's
    output, from transformers' model of `folder` run whole on `tokens`; with `quantized_block`, that block's
    Linear weights rounded first."""
    import transformers

    config = json.loads((folder / "config.json").read_text())
    causal = any(a.endswith("ForCausalLM") for a in config["architectures"])
    cls = transformers.AutoModelForCausalLM if causal else getattr(transformers, cls_name)
    model = cls.from_pretrained(folder, local_files_only=True).eval()
    layers = next(m for name, m in model.named_modules() if name.endswith(("model.layers", "encoder.layer")))
    inputs: dict[str, list[torch.Tensor]] = {}
    outputs: list[list[torch.Tensor]] = [[] for _ in layers]
    hooks = []
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            hooks.append(module.register_forward_hook(
                lambda _m, args, _out, name=name: inputs.setdefault(f"{name}.weight", []).append(args[0])))
    for index, layer in enumerate(layers):
        hooks.append(layer.register_forward_hook(
            lambda _m, _args, out, index=index: outputs[index].append(out if torch.is_tensor(out) else out[0])))
    with torch.no_grad():
        if quantized_block is not None:
            for module in layers[quantized_block].modules():
                if isinstance(module, nn.Linear):
                    module.weight.copy_(rounded(module.weight))
        model(input_ids=tokens)
    for hook in hooks:
        hook.remove()
    hessians = {}
    for name, seen in inputs.items():
        x = torch.cat(seen).reshape(-1, seen[0].shape[-1]).double()
        hessians[name] = x.T @ x
    return hessians, [torch.cat(out) for out in outputs]


def recording(answer):
    """An on_linear that keeps each call's name, Hessian (a copy) and tokens, and answers `answer(weight)`."""
    calls: dict[str, tuple[torch.Tensor, int]] = {}

    def on_linear(name, weight, stats):
        assert stats.name == name and stats.hessian.dtype == torch.float64
        calls[name] = (stats.hessian.cpu().clone(), stats.tokens)
        return answer(weight)

    return calls, on_linear


# Relative tolerances against the float32 reference on the CPU: on CUDA the run's matrix products are TF32
# (10 mantissa bits, relative rounding 2^-11), which two blocks compound to about 1e-3.
RTOL = {"cpu": 1e-4, "cuda": 1e-2}


def assert_hessians(found: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], device: str) -> None:
    for name, hessian in found.items():
        scale = expected[name].abs().max()
        torch.testing.assert_close(hessian, expected[name], rtol=RTOL[device], atol=RTOL[device] / 10 * scale,
                                   msg=name)


@pytest.mark.parametrize("arch", ["llama", "bert"])
def test_hessians_are_x_transpose_x_of_the_whole_models_activations(folders, arch, device):
    calls, on_linear = recording(lambda weight: None)
    result, _ = run(folders[arch], on_linear, device)
    hessians, _ = reference(folders[arch], windows(folders[arch]).tokens)
    blocks = {name for name in hessians if name.startswith(BLOCKS[arch])}
    assert set(calls) == blocks == set(result.stats)
    assert_hessians({name: h for name, (h, _) in calls.items()}, hessians, device)
    for name, stats in result.stats.items():
        assert stats.tokens == SAMPLES * SEQ_LEN and stats.hessian is None
        torch.testing.assert_close(stats.importance, hessians[name].diagonal() / (SAMPLES * SEQ_LEN),
                                   rtol=RTOL[device], atol=0)


@pytest.mark.parametrize("arch", ["llama", "bert"])
def test_without_hessians_the_importance_is_the_whole_models_mean_square_and_no_matrix_is_handed_on(folders, arch,
                                                                                                     device):
    seen = {}

    def on_linear(name, weight, stats):
        seen[name] = stats.hessian
        return None

    result, _ = run(folders[arch], on_linear, device, hessians=False)
    hessians, _ = reference(folders[arch], windows(folders[arch]).tokens)
    blocks = {name for name in hessians if name.startswith(BLOCKS[arch])}
    assert set(seen) == blocks == set(result.stats)
    assert all(hessian is None for hessian in seen.values())
    for name, stats in result.stats.items():
        assert stats.tokens == SAMPLES * SEQ_LEN and stats.importance.dtype == torch.float64
        torch.testing.assert_close(stats.importance, hessians[name].diagonal() / (SAMPLES * SEQ_LEN),
                                   rtol=RTOL[device], atol=0)


@pytest.mark.parametrize(("arch", "together"), [
    ("llama", [("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), ("self_attn.o_proj",),
               ("mlp.gate_proj", "mlp.up_proj"), ("mlp.down_proj",)]),
    ("bert", [("attention.self.query", "attention.self.key", "attention.self.value"),
              ("attention.output.dense",), ("intermediate.dense",), ("output.dense",)]),
])
def test_linears_fed_the_same_input_read_one_hessian(folders, arch, together, device):
    """q, k and v (and a Llama's gate and up) take the very tensor the Linear before them took: one sum
    serves them, as many float64 sums as distinct inputs a block has."""
    matrices = {}

    def on_linear(name, weight, stats):
        matrices[name] = stats.hessian.data_ptr()

    run(folders[arch], on_linear, device)
    for block in range(2):
        groups = [{matrices[f"{BLOCKS[arch]}.{block}.{linear}.weight"] for linear in group} for group in together]
        assert all(len(group) == 1 for group in groups), groups
        assert len(set().union(*groups)) == len(together)


@pytest.mark.parametrize("arch", ["llama", "bert"])
def test_each_blocks_output_is_the_whole_models(folders, arch, device):
    _, on_linear = recording(lambda weight: weight.clone())  # a weight given back: the block runs again
    model = opened(folders[arch])
    blocks = model.module.get_submodule(BLOCKS[arch])
    outputs: list[list[torch.Tensor]] = [[] for _ in blocks]
    for index, block in enumerate(blocks):
        block.register_forward_hook(
            lambda _m, _args, out, index=index: outputs[index].append(out if torch.is_tensor(out) else out[0]))
    tokens = windows(folders[arch])
    run_blocks(model, tokens, set(model.names.values()), on_linear, device=device)
    _, expected = reference(folders[arch], tokens.tokens)
    for index, found in enumerate(outputs):
        windows_run = torch.cat(found)  # the windows may run one at a time or several in a call
        assert windows_run.shape[0] == 2 * SAMPLES  # the float pass and the pass with the weights given back
        torch.testing.assert_close(windows_run[SAMPLES:].cpu(), expected[index], rtol=RTOL[device],
                                   atol=RTOL[device] / 10)


@pytest.mark.parametrize("arch", ["llama", "bert"])
def test_a_quantized_block_changes_the_next_blocks_hessians_as_the_whole_model_with_those_weights(folders, arch,
                                                                                                device):
    first = f"{BLOCKS[arch]}.0."
    calls, on_linear = recording(lambda weight: None)

    def quantize_first_block(name, weight, stats):
        on_linear(name, weight, stats)
        return rounded(weight) if name.startswith(first) else None

    run(folders[arch], quantize_first_block, device)
    tokens = windows(folders[arch]).tokens
    float_hessians, _ = reference(folders[arch], tokens)
    quantized_hessians, _ = reference(folders[arch], tokens, quantized_block=0)
    found = {name: h for name, (h, _) in calls.items()}
    assert_hessians({n: h for n, h in found.items() if n.startswith(first)}, float_hessians, device)  # float
    second = {n: h for n, h in found.items() if n.startswith(f"{BLOCKS[arch]}.1.")}
    assert_hessians(second, quantized_hessians, device)
    for name, hessian in second.items():  # apart by ten times the tolerance of the equalities (BERT's LayerNorm
        # after each block narrows the difference to about 1 %)
        assert (hessian - float_hessians[name]).abs().max() > 1e-3 * float_hessians[name].abs().max(), name


def test_on_linear_is_called_in_the_blocks_order_for_the_linears_asked_for(folders):
    order = []
    asked = {"model.layers.1.mlp.down_proj.weight", "model.layers.0.self_attn.v_proj.weight",
             "model.layers.0.mlp.gate_proj.weight", "model.layers.0.self_attn.q_proj.weight", "lm_head.weight",
             "model.norm.weight", "model.embed_tokens.weight", "no.such.tensor"}
    result, _ = run(folders["llama"], lambda name, weight, stats: order.append(name), linears=asked)
    assert order == ["model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.v_proj.weight",
                     "model.layers.0.mlp.gate_proj.weight", "model.layers.1.mlp.down_proj.weight"]
    assert list(result.stats) == order
    assert result.outside == ["lm_head.weight"]
    assert result.not_linear == ["model.embed_tokens.weight", "model.norm.weight", "no.such.tensor"]


def test_block_linears_are_the_linears_of_the_layers_in_the_order_they_run(folders):
    llama = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
             "mlp.up_proj", "mlp.down_proj"]
    bert = ["attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense",
            "intermediate.dense", "output.dense"]
    for folder, layers, linears in (("llama", "model.layers", llama), ("bert-head", "bert.encoder.layer", bert)):
        expected = [f"{layers}.{index}.{linear}.weight" for index in range(2) for linear in linears]
        assert block_linears(opened(folders[folder]), shapes_of(open_source(folders[folder]).infos())) == expected


def test_berts_pooler_is_outside_the_blocks(folders):
    result, _ = run(folders["bert"], lambda name, weight, stats: None)
    assert result.outside == ["pooler.dense.weight"]
    assert len(result.stats) == 2 * 6  # query, key, value, attention output, intermediate, output


def test_progress_hears_of_every_block(folders):
    heard = []
    result, _ = run(folders["llama"], lambda name, weight, stats: None, progress=heard.append)
    assert result.blocks == 2
    assert [(done.done, done.count, done.tokens) for done in heard] == [(0, 2, 128), (1, 2, 128), (2, 2, 128)]
    assert heard[0].seconds == 0 and 0 < heard[1].seconds <= heard[2].seconds
    assert all(done.tokens_per_s == done.done * 128 / done.seconds for done in heard[1:])


def test_a_head_checkpoint_with_legacy_names_runs_under_the_base_model(folders, tmp_path):
    """A BertForMaskedLM checkpoint (names under `bert.`) with LayerNorm.gamma and .beta, as old BERT
    checkpoints have them: built as a BertModel, its parameters found under the checkpoint's names."""
    folder = folders["bert-head"]
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (legacy / name).write_bytes((folder / name).read_bytes())
    tensors = load_file(folder / "model.safetensors")
    renamed = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
               for k, v in tensors.items()}
    assert renamed.keys() != tensors.keys()
    save_file(renamed, legacy / "model.safetensors", metadata={"format": "pt"})
    calls, on_linear = recording(lambda weight: None)
    result, model = run(legacy, on_linear)
    assert type(model.module).__name__ == "BertModel"
    assert model.names["embeddings.LayerNorm.weight"] == "bert.embeddings.LayerNorm.gamma"
    hessians, _ = reference(folder, windows(folder).tokens, cls_name="BertForMaskedLM")
    assert set(calls) == {name for name in hessians if name.startswith("bert.encoder.layer.")}
    assert_hessians({name: h for name, (h, _) in calls.items()}, hessians, "cpu")


def test_a_tied_head_reads_the_embeddings_and_is_never_loaded(tmp_path):
    folder = tiny_llama(tmp_path, tie=True)
    model = opened(folder)
    assert model.names["lm_head.weight"] == model.names["model.embed_tokens.weight"] == "model.embed_tokens.weight"
    read = []

    def tensor(name):
        read.append(name)
        return open_source(folder).load(name)

    model = opened(folder, tensor)
    run_blocks(model, windows(folder), set(), lambda name, weight, stats: None)
    assert read.count("model.embed_tokens.weight") == 1 and "model.norm.weight" not in read


def test_experts_are_calibrated_on_their_routed_tokens_as_linears_or_fused(tmp_path):
    """A Mixtral of 4 experts, 2 a token: transformers 4 builds each expert of nn.Linear layers, transformers 5
    fuses the experts' checkpoint tensors into one parameter, which the run makes as transformers does
    (expert 0 first); either way each expert's tensors take only the tokens routed to it (twice the windows'
    tokens over the 4; tests/calibrate/test_layer_kinds.py holds them to the router run by hand)."""
    from transformers import MixtralConfig, MixtralForCausalLM

    config = MixtralConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, vocab_size=VOCAB, num_local_experts=4, num_experts_per_tok=2)
    torch.manual_seed(0)
    MixtralForCausalLM(config).save_pretrained(tmp_path)
    llama_tokenizer(tmp_path)
    model = opened(tmp_path)
    names = [info.name for info in open_source(tmp_path).infos()]
    if model.assembled:
        fused = "model.layers.0.mlp.experts.gate_up_proj"
        expected = [f"model.layers.0.block_sparse_moe.experts.{e}.{w}.weight" for w in ("w1", "w3") for e in range(4)]
        assert sorted(model.assembled[fused].names) == sorted(expected)
        tensors = load_file(tmp_path / "model.safetensors")
        made = model.parameter(fused, model.module.get_parameter(fused))
        for e in range(4):  # each expert's gate rows, then its up rows, as transformers' loading makes them
            torch.testing.assert_close(made[e], torch.cat([tensors[expected[e]], tensors[expected[4 + e]]]))
    result = run_blocks(model, windows(tmp_path), names, lambda name, weight, stats: None)
    assert list(result.stats) == block_linears(model, shapes_of(open_source(tmp_path).infos()))
    assert len(result.stats) == 2 * (4 + 4 * 3)  # q, k, v and o, and 4 experts' w1, w2 and w3, of both blocks
    assert not [name for name in result.not_linear + result.outside if ".experts." in name]
    for layer in range(2):
        experts = [result.stats[f"model.layers.{layer}.block_sparse_moe.experts.{e}.w1.weight"].tokens
                   for e in range(4)]
        assert sum(experts) == 2 * SAMPLES * SEQ_LEN and all(0 < n < SAMPLES * SEQ_LEN for n in experts)


def test_fused_experts_made_of_tensors_of_unlike_shapes_are_an_input_error(tmp_path):
    from transformers import MixtralConfig, MixtralForCausalLM

    config = MixtralConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, vocab_size=VOCAB, num_local_experts=4, num_experts_per_tok=2)
    torch.manual_seed(0)
    MixtralForCausalLM(config).save_pretrained(tmp_path)
    llama_tokenizer(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    bad = "model.layers.0.block_sparse_moe.experts.2.w1.weight"
    if not opened(tmp_path).assembled:
        pytest.skip("transformers 4 builds each expert of nn.Linear layers: nothing is assembled")
    tensors[bad] = tensors[bad][:-1]
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(InputError, match="cannot make the model's parameter 'model.layers.0.mlp.experts.gate_up_proj'"
                       ) as caught:
        run_blocks(opened(tmp_path), windows(tmp_path), set(), lambda name, weight, stats: None)
    assert "\n" not in str(caught.value) and caught.value.hint


def test_nan_activations_are_an_input_error_naming_the_linear(folders):
    folder = folders["llama"]
    source = open_source(folder)

    def tensor(name):
        value = source.load(name)
        return value.fill_(float("nan")) if name == "model.layers.1.input_layernorm.weight" else value

    model = opened(folder, tensor)
    with pytest.raises(InputError, match="into 'model.layers.1.self_attn.q_proj.weight' hold NaN or Inf"):
        run_blocks(model, windows(folder), set(model.names.values()), lambda name, weight, stats: None)


def test_a_tensor_missing_or_of_another_shape_is_an_input_error(folders):
    folder = folders["llama"]
    source = open_source(folder)
    names = [info.name for info in source.infos()]
    kept = [i for i in source.infos() if i.name != "model.layers.1.mlp.up_proj.weight"]
    missing = open_model(Checkpoint(folder, kept, source.load))
    with pytest.raises(InputError, match="no tensor for the model's parameter 'model.layers.1.mlp.up_proj.weight'"):
        run_blocks(missing, windows(folder), names, lambda name, weight, stats: None)

    def tensor(name):
        return source.load(name)[:, :-1] if name == "model.layers.0.mlp.down_proj.weight" else source.load(name)

    with pytest.raises(InputError, match=r"'model.layers.0.mlp.down_proj.weight' has shape \[64, 127\]; the model"):
        run_blocks(open_model(Checkpoint(folder, source.infos(), tensor)), windows(folder), names,
                   lambda name, weight, stats: None)


def test_a_folder_without_config_or_tokenizer_is_a_usage_error(folders, tmp_path):
    with pytest.raises(UsageError, match="has no config.json"):
        open_model(Checkpoint(tmp_path, [], lambda name: None))
    (tmp_path / "config.json").write_bytes((folders["llama"] / "config.json").read_bytes())
    with pytest.raises(UsageError, match=r"has no tokenizer \(tokenizer.json, "):
        load_tokenizer(tmp_path)


def test_a_corrupt_config_or_tokenizer_is_an_input_error(folders, tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(InputError, match="config.json: the JSON does not parse"):
        open_model(Checkpoint(tmp_path, [], lambda name: None))
    (tmp_path / "config.json").write_bytes((folders["llama"] / "config.json").read_bytes())
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(InputError, match="tokenizer.json: the JSON does not parse"):
        load_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text('{"version": "1.0"}')  # JSON, but no tokenizer
    with pytest.raises(InputError, match="cannot load the tokenizer of"):
        load_tokenizer(tmp_path)


def test_a_model_type_transformers_does_not_know_is_a_usage_error(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "no-such-model", "architectures": ["X"]}))
    with pytest.raises(UsageError, match="cannot build the model of") as caught:
        open_model(Checkpoint(tmp_path, [], lambda name: None))
    assert "upgrade transformers" in caught.value.hint


def test_without_transformers_the_hint_says_how_to_install_it(folders, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` raises ImportError
    with pytest.raises(UsageError, match="transformers, which is not installed") as caught:
        open_model(Checkpoint(folders["llama"], [], lambda name: None))
    assert caught.value.hint == CALIBRATE_HINT == "pip install 'qcli[calibrate]'"


@pytest.mark.gpu
def test_the_memory_estimate_bounds_what_the_run_takes_on_the_gpu(tmp_path):
    """The allocator's peak over a run (every Linear given back: both passes, with an on_linear that
    allocates nothing, as the estimate leaves that out) is within the estimate, which is not wasteful
    either; the sizes large enough that the allocator's rounding is small beside them."""
    folder = tiny_llama(tmp_path, hidden_size=512, intermediate_size=1536, num_attention_heads=8,
                        num_key_value_heads=8)
    samples, seq_len = 8, 128
    tokens = calibration_tokens(CalibrationText([TEXT] * 4, "text", ""), load_tokenizer(folder), samples, seq_len)
    assert tokens.shortfall is None
    model = opened(folder)
    torch.ones(8, 8, device="cuda") @ torch.ones(8, 8, device="cuda")  # cuBLAS's workspace taken before
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    linears = block_linears(model, shapes_of(open_source(folder).infos()))
    run_blocks(model, tokens, linears, lambda name, weight, stats: weight, device="cuda")
    peak = torch.cuda.max_memory_allocated() - before
    estimate = estimate_memory(model.module.config, samples, seq_len)
    assert peak <= estimate <= 1.25 * peak + SLACK, (peak, estimate)


def test_without_transformers_renaming_api_the_checkpoints_names_are_the_models(folders, monkeypatch):
    """The names transformers renames on loading come from its loader's internals (5.x: its conversion
    mapping; 4.x: a method of the model); where neither is there, a checkpoint whose names are the model's
    own still maps every parameter."""
    import builtins

    real_import = builtins.__import__

    def without_conversions(name, *args, **kwargs):
        if name in ("transformers.conversion_mapping", "transformers.core_model_loading"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    expected = opened(folders["llama"]).names
    monkeypatch.setattr(builtins, "__import__", without_conversions)
    monkeypatch.delattr("transformers.PreTrainedModel._fix_state_dict_key_on_load", raising=False)
    assert opened(folders["llama"]).names == expected
