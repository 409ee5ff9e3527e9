"""Make the tiny Llama-shaped sample checkpoint: one file and the same tensors in two shards with an index,
beside a Hugging Face `config.json` that describes those shapes and a tokenizer (as a model folder on the
Hub has them): a word-level one over the words of `calibration.txt`, written as the tokenizers package's
JSON, so that calibration (`--calibration gptq`) runs on the sample.

Deterministic (fixed seed, fixed order), so running it again gives byte-identical files; a test checks that.
Usage: `python3 sample_weights/make_samples.py [OUT_DIR]` (default: this folder).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

SEED = 0
HIDDEN = 128
INTERMEDIATE = 352
VOCAB = 1000
LAYERS = 2
HEADS = 4
KV_HEADS = 2
HEAD_DIM = HIDDEN // HEADS
INIT_STD = 0.02
METADATA = {"format": "pt"}
SINGLE = "tiny-llama.safetensors"
TEXT = Path(__file__).with_name("calibration.txt")
SPECIAL = ("<unk>", "<s>", "</s>")
SHARDED = "tiny-llama-sharded"


def config() -> dict:
    """The shapes above as transformers' LlamaConfig reads them (its `config.json`)."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "vocab_size": VOCAB,
        "hidden_act": "silu",
        "max_position_embeddings": 256,
        "rms_norm_eps": 1e-06,
        "rope_theta": 10000.0,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }


def layer_shapes(i: int) -> dict[str, tuple[int, ...]]:
    """One decoder layer in Hugging Face names; Linear weights are PyTorch's [out, in]."""
    p = f"model.layers.{i}."
    return {
        p + "input_layernorm.weight": (HIDDEN,),
        p + "self_attn.q_proj.weight": (HEADS * HEAD_DIM, HIDDEN),
        p + "self_attn.k_proj.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
        p + "self_attn.v_proj.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
        p + "self_attn.o_proj.weight": (HIDDEN, HEADS * HEAD_DIM),
        p + "post_attention_layernorm.weight": (HIDDEN,),
        p + "mlp.gate_proj.weight": (INTERMEDIATE, HIDDEN),
        p + "mlp.up_proj.weight": (INTERMEDIATE, HIDDEN),
        p + "mlp.down_proj.weight": (HIDDEN, INTERMEDIATE),
    }


def make_tensors() -> dict[str, torch.Tensor]:
    """bf16 weights: N(0, 0.02) for matrices, 1 + N(0, 0.02) for norms (so they are not all ones)."""
    shapes = {"model.embed_tokens.weight": (VOCAB, HIDDEN)}
    for i in range(LAYERS):
        shapes |= layer_shapes(i)
    shapes |= {"model.norm.weight": (HIDDEN,), "lm_head.weight": (VOCAB, HIDDEN)}
    generator = torch.Generator().manual_seed(SEED)
    tensors = {}
    for name, shape in shapes.items():
        x = torch.randn(shape, generator=generator, dtype=torch.float32) * INIT_STD
        tensors[name] = (x + 1 if len(shape) == 1 else x).to(torch.bfloat16)
    return tensors


def tokenizer() -> dict:
    """A word-level tokenizer (lowercased, split on whitespace and punctuation) over TEXT's words, in order
    of first appearance after the special tokens, as `tokenizer.json`."""
    words = re.findall(r"\w+|[^\w\s]+", TEXT.read_text().lower())
    vocab = {token: i for i, token in enumerate(dict.fromkeys([*SPECIAL, *words]))}
    assert len(vocab) <= VOCAB, len(vocab)
    added = [{"id": vocab[t], "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for t in SPECIAL]
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
            "normalizer": {"type": "Lowercase"}, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": None,
            "decoder": None, "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}}


def tokenizer_config() -> dict:
    return {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "<unk>", "bos_token": "<s>",
            "eos_token": "</s>", "model_max_length": 256}


def write(out: Path) -> None:
    tensors = make_tensors()
    save_file(tensors, out / SINGLE, metadata=METADATA)

    names = list(tensors)
    cut = names.index("model.layers.1.input_layernorm.weight")
    shards = [names[:cut], names[cut:]]
    folder = out / SHARDED
    folder.mkdir(exist_ok=True)
    weight_map = {}
    for k, shard in enumerate(shards, start=1):
        file = f"model-{k:05d}-of-{len(shards):05d}.safetensors"
        save_file({n: tensors[n] for n in shard}, folder / file, metadata=METADATA)
        weight_map |= dict.fromkeys(shard, file)
    index = {
        "metadata": {"total_size": sum(t.numel() * t.element_size() for t in tensors.values())},
        "weight_map": dict(sorted(weight_map.items())),
    }
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    (folder / "config.json").write_text(json.dumps(config(), indent=2) + "\n")
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer(), indent=2) + "\n")
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(), indent=2) + "\n")


if __name__ == "__main__":
    write(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent)
