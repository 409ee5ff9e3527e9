"""sample_weights/: regenerating gives the committed bytes; the checkpoint is Llama-shaped, bf16 and small,
and the sharded folder's config.json is one transformers builds exactly that model from."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.cli_support import SAMPLES, SHARDED, SINGLE, source_bytes

FILES = [
    "tiny-llama.safetensors",
    "tiny-llama-sharded/model-00001-of-00002.safetensors",
    "tiny-llama-sharded/model-00002-of-00002.safetensors",
    "tiny-llama-sharded/model.safetensors.index.json",
    "tiny-llama-sharded/config.json",
]


def test_regenerating_gives_identical_bytes(tmp_path):
    subprocess.run([sys.executable, str(SAMPLES / "make_samples.py"), str(tmp_path)], check=True, timeout=120)
    for f in FILES:
        assert (tmp_path / f).read_bytes() == (SAMPLES / f).read_bytes(), f


def test_committed_samples_are_small():
    assert sum((SAMPLES / f).stat().st_size for f in FILES) < 5 * 1024 * 1024


def test_llama_names_and_bf16():
    header_len = int.from_bytes(SINGLE.read_bytes()[:8], "little")
    header = json.loads(SINGLE.read_bytes()[8 : 8 + header_len])
    assert header.pop("__metadata__") == {"format": "pt"}
    expected = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
    for i in range(2):
        p = f"model.layers.{i}."
        expected |= {p + f"self_attn.{x}_proj.weight" for x in "qkvo"}
        expected |= {p + f"mlp.{x}_proj.weight" for x in ("gate", "up", "down")}
        expected |= {p + "input_layernorm.weight", p + "post_attention_layernorm.weight"}
    assert set(header) == expected
    assert {v["dtype"] for v in header.values()} == {"BF16"}
    assert header["model.layers.0.mlp.down_proj.weight"]["shape"] == [128, 352]


def test_shards_hold_the_same_tensors_as_the_single_file():
    index = json.loads((SHARDED / "model.safetensors.index.json").read_text())
    single = source_bytes(SINGLE)
    shards = {}
    for shard in sorted(set(index["weight_map"].values())):
        shards |= source_bytes(SHARDED / shard)
    assert shards == single
    assert index["metadata"]["total_size"] == sum(len(b) for b in single.values())
    assert set(index["weight_map"]) == set(single)


def test_the_config_is_a_llama_transformers_builds_with_the_samples_names_and_shapes():
    import torch
    from safetensors import safe_open
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(SHARDED, local_files_only=True)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    with safe_open(SINGLE, "pt") as f:
        shapes = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
    assert {name: tuple(t.shape) for name, t in model.state_dict().items()} == shapes
    assert config.torch_dtype == torch.bfloat16
