"""`--names hf`: llama.cpp's names back to Hugging Face's, held to the gguf package's own tables and to the
names transformers gives LlamaForCausalLM, and the Q and K rows back in Hugging Face's order, held to
llama.cpp's converter's permutation worked by hand on a small tensor."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from qcli.errors import UsageError
from qcli.io.burnpack import BurnpackReader
from qcli.io.readers import open_source
from tests.burn_harness import same_bits
from tests.cli_support import assert_user_error, cli
from tests.gguf_support import T, dequantized, gguf, write_gguf

# A llama block's tensors as llama.cpp names them, and as transformers' LlamaForCausalLM does.
LLAMA = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "blk.{b}.attn_norm.weight": "model.layers.{b}.input_layernorm.weight",
    "blk.{b}.attn_q.weight": "model.layers.{b}.self_attn.q_proj.weight",
    "blk.{b}.attn_k.weight": "model.layers.{b}.self_attn.k_proj.weight",
    "blk.{b}.attn_v.weight": "model.layers.{b}.self_attn.v_proj.weight",
    "blk.{b}.attn_output.weight": "model.layers.{b}.self_attn.o_proj.weight",
    "blk.{b}.ffn_norm.weight": "model.layers.{b}.post_attention_layernorm.weight",
    "blk.{b}.ffn_gate.weight": "model.layers.{b}.mlp.gate_proj.weight",
    "blk.{b}.ffn_up.weight": "model.layers.{b}.mlp.up_proj.weight",
    "blk.{b}.ffn_down.weight": "model.layers.{b}.mlp.down_proj.weight",
}
HEADS, KV_HEADS, HEAD_DIM, COLS = 2, 1, 4, 32
# llama.cpp's converter (LlamaModel.permute) writes GGUF row h*d + 2i + j from Hugging Face's row
# h*d + j*d/2 + i: for 2 heads of 4 rows, the file holds HF rows 0, 2, 1, 3 | 4, 6, 5, 7 in that order.
Q_FILE_ROWS = [0, 2, 1, 3, 4, 6, 5, 7]
K_FILE_ROWS = [0, 2, 1, 3]  # one KV head of 4 rows


def hf_weight(rows: int, seed: int) -> np.ndarray:
    """Rows told apart by their values: row r holds r + small noise."""
    noise = np.random.default_rng(seed).standard_normal((rows, COLS), dtype=np.float32) / 64
    return (np.arange(rows, dtype=np.float32)[:, None] + noise).astype(np.float32)


def converter_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """The permutation as convert_hf_to_gguf.py's LlamaModel.permute documents it."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def test_the_rows_worked_by_hand_are_the_converters():
    q, k = hf_weight(8, 1), hf_weight(4, 2)
    assert np.array_equal(converter_permute(q, HEADS), q[Q_FILE_ROWS])
    assert np.array_equal(converter_permute(k, KV_HEADS), k[K_FILE_ROWS])


def llama_file(path: Path, blocks: int = 2, metadata: dict | None = None) -> dict[str, np.ndarray]:
    """A llama GGUF of every tensor LLAMA names (F32, tiny), an extra tensor the tables do not name, and
    Q and K of layer 0 as the converter writes them: permuted, Q8_0 and F32."""
    names = [n.format(b=b) for n in LLAMA for b in range(blocks if "{b}" in n else 1)]
    tensors = {n: (np.full((8, COLS), i, dtype=np.float32), T.F32) for i, n in enumerate(names)}
    tensors["rope_freqs.weight"] = (np.ones(COLS, dtype=np.float32), T.F32)
    hf = {"q": hf_weight(8, 1), "k": hf_weight(4, 2), "q_bias": np.arange(8, dtype=np.float32)}
    tensors["blk.0.attn_q.weight"] = (hf["q"][Q_FILE_ROWS], T.Q8_0)
    tensors["blk.0.attn_k.weight"] = (hf["k"][K_FILE_ROWS], T.F32)
    tensors["blk.0.attn_q.bias"] = (hf["q_bias"][Q_FILE_ROWS], T.F32)
    tensors["blk.1.attn_q.weight"] = (hf_weight(8, 3)[Q_FILE_ROWS], T.F32)  # quantized by the default policy
    meta = {"llama.block_count": blocks, "llama.attention.head_count": HEADS, "llama.attention.head_count_kv": KV_HEADS}
    stored = write_gguf(path, tensors, metadata={**meta, **(metadata or {})})
    return {**hf, "q_stored": stored["blk.0.attn_q.weight"]}


def test_the_names_are_the_gguf_tables_and_transformers(tmp_path):
    path = tmp_path / "m.gguf"
    llama_file(path)
    with open_source(path) as plain, open_source(path, "hf") as mapped:
        renamed = dict(zip((i.name for i in plain.infos()), (i.name for i in mapped.infos()), strict=True))
    want = {n.format(b=b): h.format(b=b) for n, h in LLAMA.items() for b in range(2)}
    want |= {"blk.0.attn_q.bias": "model.layers.0.self_attn.q_proj.bias", "rope_freqs.weight": "rope_freqs.weight"}
    assert renamed == want
    table = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2)
    for name, hf in renamed.items():
        if name != hf:  # gguf's own table takes each Hugging Face name back to the file's
            assert table.get_name(hf, try_suffixes=(".weight", ".bias")) == name


@pytest.mark.parametrize("pipeline", ["cpu", pytest.param("triton", marks=pytest.mark.interpreter)])
def test_q_and_k_rows_are_written_in_hugging_faces_order(tmp_path, pipeline, monkeypatch):
    if pipeline == "triton":
        monkeypatch.setenv("QCLI_KERNELS", "triton")
    path = tmp_path / "m.gguf"
    hf = llama_file(path)
    recipe = tmp_path / "keep.toml"  # k_proj and the bias kept as F32: their rows compared as they are
    recipe.write_text('version = 1\n[[rule]]\nmatch = "*.k_proj.weight"\nkeep = true\n')
    out = tmp_path / "m.bpk"
    result = cli("quantize", path, "-o", out, "--names", "hf", "--recipe", recipe, "--json",
                 *(["--device", "cpu"] if pipeline == "cpu" else []))
    assert result.code == 0, result.err
    rows = {t["name"]: t for t in json.loads(result.out)["tensors"]}
    assert rows["model.layers.0.self_attn.q_proj.weight"]["decision"] == "transcode"
    reader = BurnpackReader.open(out)
    entries = {e.name: e for e in reader.entries()}
    k = torch.frombuffer(bytearray(reader.read("model.layers.0.self_attn.k_proj.weight")), dtype=torch.float32)
    assert torch.equal(k.reshape(4, COLS), torch.from_numpy(hf["k"]))
    bias = torch.frombuffer(bytearray(reader.read("model.layers.0.self_attn.q_proj.bias")), dtype=torch.float32)
    assert torch.equal(bias, torch.from_numpy(hf["q_bias"]))
    from qcli.codec import decode

    entry = entries["model.layers.0.self_attn.q_proj.weight"]
    q = decode(bytes(reader.read(entry.name)), entry.dtype.scheme, entry.shape)
    # gguf's dequantization of the file's Q8_0 rows, put in Hugging Face's order by the hand-worked rows
    file_rows = torch.from_numpy(dequantized(hf["q_stored"], T.Q8_0))
    want = torch.empty_like(file_rows)
    want[Q_FILE_ROWS] = file_rows
    assert same_bits(q, want)
    assert torch.equal(q.mean(dim=1).round(), torch.arange(8.0))  # row r holds about r, as Hugging Face's
    # a float Q quantized on the pipeline: its rows are the file's, quantized, in Hugging Face's order
    plain = tmp_path / "plain.bpk"
    assert cli("quantize", path, "-o", plain, "--recipe", recipe, "--device", "cpu").code == 0
    layer1 = entries["model.layers.1.self_attn.q_proj.weight"]
    mine = decode(bytes(reader.read(layer1.name)), layer1.dtype.scheme, layer1.shape)
    other = BurnpackReader.open(plain)
    as_stored = decode(bytes(other.read("blk.1.attn_q.weight")), layer1.dtype.scheme, layer1.shape)
    assert torch.equal(mine[Q_FILE_ROWS], as_stored) and torch.equal(mine.mean(dim=1).round(), torch.arange(8.0))


def test_inspect_names_and_compare(tmp_path):
    path = tmp_path / "m.gguf"
    llama_file(path)
    result = cli("inspect", path, "--names", "hf", "--json")
    assert result.code == 0, result.err
    assert "model.layers.1.mlp.down_proj.weight" in {t["name"] for t in json.loads(result.out)["tensors"]}
    out = tmp_path / "m.bpk"
    assert cli("quantize", path, "-o", out, "--names", "hf", "--device", "cpu").code == 0
    compared = cli("inspect", out, "--compare", path, "--names", "hf", "--json")
    assert compared.code == 0, compared.err
    assert json.loads(compared.out)["compare"]["ok"]


def test_what_names_hf_cannot_map_is_a_usage_error(tmp_path):
    other = tmp_path / "gpt2.gguf"
    write_gguf(other, {"token_embd.weight": (np.ones((2, 32), np.float32), T.F32)}, arch="gpt2",
               metadata={"gpt2.block_count": 1})
    lines = assert_user_error(cli("quantize", other, "--names", "hf", "--dry-run"), UsageError.exit_code)
    assert "--names hf maps the names of llama, qwen2 models; this file's general.architecture is 'gpt2'" in lines[0]
    odd = tmp_path / "odd.gguf"
    write_gguf(odd, {"blk.0.attn_q.weight": (np.ones((6, 32), np.float32), T.F32)},
               metadata={"llama.block_count": 1, "llama.attention.head_count": 2})
    lines = assert_user_error(cli("quantize", odd, "--names", "hf", "--dry-run"), UsageError.exit_code)
    assert "blk.0.attn_q.weight has 6 rows, not an even number per head for 2 heads" in lines[0]
    st = tmp_path / "m.safetensors"
    st.write_bytes(struct.pack("<Q", 2) + b"{}")
    lines = assert_user_error(cli("inspect", st, "--names", "hf"), UsageError.exit_code)
    assert "--names hf maps the llama.cpp names of a GGUF file; this input is safetensors" in lines[0]


def test_a_table_built_for_one_architecture_leaves_the_others_as_they_were():
    """The gguf package's constructor writes arctic's own ffn_norm names into its class-wide table; built
    through name_table, llama's table after arctic's is llama's before it."""
    from qcli.io.gguf_names import name_table

    before = dict(name_table("llama", 2).mapping)
    name_table("arctic", 2)
    assert name_table("llama", 2).mapping == before
