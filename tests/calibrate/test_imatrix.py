"""llama.cpp's importance-matrix files, held to the layouts llama.cpp's source gives them: the GGUF form as
`save_imatrix` (tools/imatrix/imatrix.cpp) writes it through ggml's GGUF writer (read back here with the gguf
package's own GGUFReader, and built here byte by byte), and the legacy `.dat` form of `save_imatrix_legacy`
(built here with struct). The importance expected is llama-quantize's (tools/quantize/quantize.cpp
`load_imatrix`): in_sum2 / counts, 1 for an expert without tokens, values / ncall for a legacy file."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import gguf
import numpy as np
import pytest

from qcli.errors import InputError, OutputError, UsageError
from qcli.io.gguf_names import gguf_architecture
from qcli.io.imatrix import (
    Imatrix,
    ImatrixEntry,
    gguf_to_hf_names,
    hf_to_gguf_names,
    read_imatrix,
    write_imatrix,
)

RNG = np.random.default_rng(25)
F32, F16 = 0, 1  # ggml types
U32, I32, STRING, ARRAY = 4, 5, 8, 9  # GGUF metadata value types


def activations(tokens: int, columns: int) -> np.ndarray:
    """Float32 inputs whose squares and sums are exact in float32 (multiples of 1/4, small)."""
    return (RNG.integers(-8, 9, (tokens, columns)) / 4).astype(np.float32)


# -- the GGUF form built by hand, as ggml's gguf.cpp writes it -----------------------------------------

def string(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def kv_string(key: str, value: str | bytes) -> bytes:
    return string(key) + struct.pack("<I", STRING) + string(value)


def kv_u32(key: str, value: int) -> bytes:
    return string(key) + struct.pack("<II", U32, value)


def kv_strings(key: str, values: list[str]) -> bytes:
    return string(key) + struct.pack("<IIQ", ARRAY, STRING, len(values)) + b"".join(map(string, values))


IMATRIX_KVS = [kv_string("general.type", "imatrix"), kv_strings("imatrix.datasets", ["wiki.train.raw"]),
               kv_u32("imatrix.chunk_count", 3), kv_u32("imatrix.chunk_size", 512)]


def gguf_file(kvs: list[bytes], tensors: list[tuple[str, list[int], int, bytes]]) -> bytes:
    """GGUF version 3: header, metadata, tensor infos (name, n_dims, ne, type, offset), data aligned to 32."""
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)) + b"".join(kvs)
    offset, data = 0, b""
    for name, ne, kind, raw in tensors:
        out += string(name) + struct.pack("<I", len(ne)) + struct.pack(f"<{len(ne)}Q", *ne)
        out += struct.pack("<IQ", kind, offset)
        padded = raw + b"\0" * (-len(raw) % 32)
        data += padded
        offset += len(padded)
    return out + b"\0" * (-len(out) % 32) + data


def f32(values: object) -> bytes:
    return np.asarray(values, dtype="<f4").tobytes()


# Two weights as llama-imatrix saves them: a dense one (ne [n_in] and [1]) and a MoE one of 3 experts of
# 4 columns (ne [4, 3] and [1, 3]) whose second expert no token reached, with its optional in_sum.
DENSE_X = activations(20, 6)
EXPERT_X = [activations(5, 4), activations(0, 4), activations(7, 4)]
EXPERT_SQUARES = np.stack([(x.astype(np.float64) ** 2).sum(0) for x in EXPERT_X])
EXPERT_SUMS = np.stack([x.astype(np.float64).sum(0) for x in EXPERT_X])
LLAMA_CPP_TENSORS = [
    ("blk.0.attn_q.weight.counts", [1], F32, f32([20])),
    ("blk.0.attn_q.weight.in_sum2", [6], F32, f32((DENSE_X.astype(np.float64) ** 2).sum(0))),
    ("blk.1.ffn_up_exps.weight.in_sum2", [4, 3], F32, f32(EXPERT_SQUARES)),
    ("blk.1.ffn_up_exps.weight.counts", [1, 3], F32, f32([5, 0, 7])),
    ("blk.1.ffn_up_exps.weight.in_sum", [4, 3], F32, f32(EXPERT_SUMS)),
    ("some.other.tensor", [2], F32, f32([1, 2])),  # llama.cpp's reader passes over other tensors
]


def write(tmp_path: Path, data: bytes, name: str = "imatrix.gguf") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_a_file_laid_out_as_llama_cpp_writes_it_gives_llama_quantizes_importance(tmp_path):
    im = read_imatrix(write(tmp_path, gguf_file(IMATRIX_KVS, LLAMA_CPP_TENSORS)))
    assert (im.datasets, im.chunk_count, im.chunk_size) == (("wiki.train.raw",), 3, 512)
    assert sorted(im.entries) == ["blk.0.attn_q.weight", "blk.1.ffn_up_exps.weight"]
    dense, experts = im.entries["blk.0.attn_q.weight"], im.entries["blk.1.ffn_up_exps.weight"]
    assert dense.counts.tolist() == [20] and dense.sums is None
    np.testing.assert_array_equal(dense.importance, (DENSE_X.astype(np.float64) ** 2).mean(0))
    assert experts.counts.tolist() == [5, 0, 7] and experts.importance.shape == (3, 4)
    np.testing.assert_array_equal(experts.importance[0], (EXPERT_X[0].astype(np.float64) ** 2).mean(0))
    np.testing.assert_array_equal(experts.importance[1], np.ones(4))  # no token: no column preferred
    np.testing.assert_allclose(experts.importance[2], (EXPERT_X[2].astype(np.float64) ** 2).mean(0), rtol=1e-15)
    np.testing.assert_array_equal(experts.sums, EXPERT_SUMS)


# -- qcli's GGUF form, read with the gguf package's own reader ----------------------------------------

def sample() -> Imatrix:
    dense = DENSE_X.astype(np.float64)
    return Imatrix({
        "blk.1.ffn_up_exps.weight": ImatrixEntry(EXPERT_SQUARES, [5, 0, 7], EXPERT_SUMS),
        "blk.0.attn_q.weight": ImatrixEntry((dense ** 2).sum(0), np.array([20])),
        "output.weight": ImatrixEntry(np.array([1.5, 0.25]), [3]),
    }, ("wiki.train.raw", "code.txt"), 3, 512)


def test_the_written_file_is_llama_cpps_layout_read_by_the_gguf_packages_reader(tmp_path):
    write_imatrix(sample(), tmp_path / "imatrix.gguf")
    reader = gguf.GGUFReader(tmp_path / "imatrix.gguf")
    fields = {name: field for name, field in reader.fields.items() if not name.startswith("GGUF.")}
    assert list(fields) == ["general.type", "imatrix.datasets", "imatrix.chunk_count", "imatrix.chunk_size"]
    assert fields["general.type"].types == [gguf.GGUFValueType.STRING]
    assert fields["general.type"].contents() == "imatrix"
    assert fields["imatrix.datasets"].types == [gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.STRING]
    assert fields["imatrix.datasets"].contents() == ["wiki.train.raw", "code.txt"]
    for key, value in (("imatrix.chunk_count", 3), ("imatrix.chunk_size", 512)):
        assert fields[key].types == [gguf.GGUFValueType.UINT32] and fields[key].contents() == value
    # sorted by weight name; each weight's in_sum2, then counts, then in_sum; ne as ggml_n_dims leaves it
    layout = [(t.name, t.shape.tolist(), t.tensor_type) for t in reader.tensors]
    assert layout == [
        ("blk.0.attn_q.weight.in_sum2", [6], gguf.GGMLQuantizationType.F32),
        ("blk.0.attn_q.weight.counts", [1], gguf.GGMLQuantizationType.F32),
        ("blk.1.ffn_up_exps.weight.in_sum2", [4, 3], gguf.GGMLQuantizationType.F32),
        ("blk.1.ffn_up_exps.weight.counts", [1, 3], gguf.GGMLQuantizationType.F32),
        ("blk.1.ffn_up_exps.weight.in_sum", [4, 3], gguf.GGMLQuantizationType.F32),
        ("output.weight.in_sum2", [2], gguf.GGMLQuantizationType.F32),
        ("output.weight.counts", [1], gguf.GGMLQuantizationType.F32),
    ]
    data = {t.name: np.asarray(t.data) for t in reader.tensors}
    np.testing.assert_array_equal(data["blk.0.attn_q.weight.in_sum2"], (DENSE_X.astype(np.float64) ** 2).sum(0))
    np.testing.assert_array_equal(data["blk.0.attn_q.weight.counts"], [20])
    np.testing.assert_array_equal(data["blk.1.ffn_up_exps.weight.in_sum2"], EXPERT_SQUARES)  # row e: expert e
    np.testing.assert_array_equal(data["blk.1.ffn_up_exps.weight.counts"], [[5], [0], [7]])
    np.testing.assert_array_equal(data["blk.1.ffn_up_exps.weight.in_sum"], EXPERT_SUMS)
    assert all(array.dtype == np.float32 for array in data.values())


def test_the_gguf_form_round_trips(tmp_path):
    original = sample()
    write_imatrix(original, tmp_path / "imatrix.gguf")
    back = read_imatrix(tmp_path / "imatrix.gguf")
    assert (back.datasets, back.chunk_count, back.chunk_size) == (original.datasets, 3, 512)
    assert sorted(back.entries) == sorted(original.entries)
    for name, entry in original.entries.items():
        np.testing.assert_array_equal(back.entries[name].sum_of_squares, entry.sum_of_squares)
        np.testing.assert_array_equal(back.entries[name].counts, entry.counts)
        np.testing.assert_array_equal(back.entries[name].importance, entry.importance)
        assert (back.entries[name].sums is None) == (entry.sums is None)


def test_counts_stored_as_floats_are_rounded_as_llama_cpp_rounds_them(tmp_path):
    im = read_imatrix(write(tmp_path, replaced(DENSE_COUNTS, raw=f32([19.75]))))
    assert im.entries["blk.0.attn_q.weight"].counts.tolist() == [20]


def test_torch_tensors_are_taken_as_the_statistics():
    import torch

    entry = ImatrixEntry(torch.tensor([[2.0, 4.0], [6.0, 8.0]]), torch.tensor([2, 4]))
    np.testing.assert_array_equal(entry.importance, [[1.0, 2.0], [1.5, 2.0]])
    assert entry.counts.dtype == np.int64 and entry.sum_of_squares.dtype == np.float64


# -- the legacy .dat form, built with struct from save_imatrix_legacy's layout ------------------------

def legacy_entry(name: str, ncall: int, values: list[float]) -> bytes:
    raw = name.encode()
    return struct.pack("<i", len(raw)) + raw + struct.pack("<ii", ncall, len(values)) + f32(values)


LEGACY_ENTRIES = [("blk.0.ffn_down.weight", 4, [8.0, 2.0, 0.5]),
                  ("blk.0.ffn_gate_exps.weight", 2, [1.0, 3.0, 2.0, 2.0])]  # 2 experts of 2 columns, flat


def legacy_file(entries=LEGACY_ENTRIES, trailer: bytes | None = None) -> bytes:
    if trailer is None:
        trailer = struct.pack("<ii", 5, len(b"calibration.txt")) + b"calibration.txt"
    return struct.pack("<i", len(entries)) + b"".join(legacy_entry(*e) for e in entries) + trailer


def test_a_legacy_file_gives_values_over_ncall(tmp_path):
    im = read_imatrix(write(tmp_path, legacy_file(), "imatrix.dat"))
    assert (im.datasets, im.chunk_count, im.chunk_size) == (("calibration.txt",), 5, 512)
    for name, ncall, values in LEGACY_ENTRIES:
        entry = im.entries[name]
        np.testing.assert_array_equal(entry.importance, np.array(values) / ncall)
        # as llama-imatrix loads one to merge it: chunks of its default 512 tokens
        np.testing.assert_array_equal(entry.sum_of_squares, np.array(values) * 512)
        assert entry.counts.tolist() == [ncall * 512]


def test_a_legacy_file_without_its_trailer_and_another_chunk_size(tmp_path):
    im = read_imatrix(write(tmp_path, legacy_file(trailer=b""), "imatrix.dat"), legacy_chunk_size=100)
    assert (im.datasets, im.chunk_count, im.chunk_size) == ((), 4, 100)  # the most chunks an entry saw
    assert im.entries["blk.0.ffn_down.weight"].counts.tolist() == [400]
    np.testing.assert_allclose(im.entries["blk.0.ffn_down.weight"].importance, [2.0, 0.5, 0.125], rtol=1e-15)


def test_a_legacy_file_converts_to_what_llama_imatrix_would_save(tmp_path):
    """llama-imatrix --in-file x.dat saves in_sum2 = values * chunk_size and counts = ncall * chunk_size."""
    write_imatrix(read_imatrix(write(tmp_path, legacy_file(), "imatrix.dat")), tmp_path / "imatrix.gguf")
    tensors = {t.name: np.asarray(t.data) for t in gguf.GGUFReader(tmp_path / "imatrix.gguf").tensors}
    np.testing.assert_array_equal(tensors["blk.0.ffn_down.weight.in_sum2"], [4096.0, 1024.0, 256.0])
    np.testing.assert_array_equal(tensors["blk.0.ffn_down.weight.counts"], [2048.0])
    np.testing.assert_array_equal(tensors["blk.0.ffn_gate_exps.weight.counts"], [1024.0])


# -- names -------------------------------------------------------------------------------------------

LLAMA_PAIRS = {  # llama.cpp's names of a llama model, and transformers' LlamaForCausalLM's
    "blk.3.attn_q.weight": "model.layers.3.self_attn.q_proj.weight",
    "blk.3.attn_k.weight": "model.layers.3.self_attn.k_proj.weight",
    "blk.3.attn_v.weight": "model.layers.3.self_attn.v_proj.weight",
    "blk.3.attn_output.weight": "model.layers.3.self_attn.o_proj.weight",
    "blk.3.ffn_gate.weight": "model.layers.3.mlp.gate_proj.weight",
    "blk.3.ffn_up.weight": "model.layers.3.mlp.up_proj.weight",
    "blk.3.ffn_down.weight": "model.layers.3.mlp.down_proj.weight",
    "blk.0.ffn_down.weight": "model.layers.0.mlp.down_proj.weight",
    "output.weight": "lm_head.weight",
    "token_embd.weight": "model.embed_tokens.weight",
}


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_names_map_both_ways(arch):
    assert gguf_to_hf_names(LLAMA_PAIRS, arch) == LLAMA_PAIRS
    assert hf_to_gguf_names(LLAMA_PAIRS.values(), arch) == {hf: cpp for cpp, hf in LLAMA_PAIRS.items()}


def test_names_the_tables_do_not_know_are_left_out():
    assert gguf_to_hf_names(["blk.3.attn_q.weight", "blk.3.no_such.weight", "x"], "llama") == {
        "blk.3.attn_q.weight": "model.layers.3.self_attn.q_proj.weight"}
    assert hf_to_gguf_names(["model.layers.3.mlp.down_proj.weight", "model.layers.3.nothing.weight"], "llama") == {
        "model.layers.3.mlp.down_proj.weight": "blk.3.ffn_down.weight"}


def test_an_imatrix_read_from_a_file_maps_to_hugging_face_names(tmp_path):
    im = read_imatrix(write(tmp_path, gguf_file(IMATRIX_KVS, LLAMA_CPP_TENSORS)))
    assert gguf_to_hf_names(im.entries, "llama")["blk.0.attn_q.weight"] == "model.layers.0.self_attn.q_proj.weight"


@pytest.mark.parametrize(("model_type", "arch"), [("llama", "llama"), ("gemma3_text", "gemma3"), ("gemma2", "gemma2"),
                                                  ("qwen2_moe", "qwen2moe"), ("qwen3_moe", "qwen3moe"),
                                                  ("gpt_neox", "gptneox"), ("mistral", None)])
def test_a_model_type_names_the_architecture_of_the_same_name_in_the_gguf_package(model_type, arch):
    assert gguf_architecture(model_type) == arch


def test_a_model_type_the_gguf_package_does_not_name_takes_the_names_every_table_gives_alike():
    """Mistral's model type is no gguf architecture; every table that names its Linears names them as llama's."""
    assert hf_to_gguf_names(LLAMA_PAIRS.values(), "mistral") == hf_to_gguf_names(LLAMA_PAIRS.values(), "llama")


def test_names_that_cannot_be_mapped_are_refused():
    with pytest.raises(UsageError, match="'no_such_model'") as raised:
        gguf_to_hf_names(["blk.0.attn_q.weight"], "no_such_model")
    assert raised.value.hint
    with pytest.raises(UsageError, match="'no_such_model', and its tables name none of the model's tensors"):
        hf_to_gguf_names(["some.thing.weight"], "no_such_model")
    with pytest.raises(InputError, match="both map to the one name blk.0.ffn_down.weight"):
        hf_to_gguf_names(["model.layers.0.mlp.down_proj.weight", "model.layers.0.mlp.fc2.weight"], "llama")
    with pytest.raises(InputError, match="block 5000"):
        gguf_to_hf_names(["blk.5000.attn_q.weight"], "llama")


# -- writing -----------------------------------------------------------------------------------------

def test_a_failed_write_leaves_the_target_as_it_was(tmp_path, monkeypatch):
    target = tmp_path / "imatrix.gguf"
    target.write_bytes(b"old")

    def full(self, **_):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(gguf.GGUFWriter, "write_tensors_to_file", full)
    with pytest.raises(OutputError, match="No space left") as raised:
        write_imatrix(sample(), target)
    assert raised.value.hint
    assert target.read_bytes() == b"old" and os.listdir(tmp_path) == ["imatrix.gguf"]

    def interrupted(self, **_):
        raise KeyboardInterrupt

    monkeypatch.setattr(gguf.GGUFWriter, "write_tensors_to_file", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_imatrix(sample(), target)
    assert target.read_bytes() == b"old" and os.listdir(tmp_path) == ["imatrix.gguf"]


def test_a_write_replaces_the_target_whole(tmp_path):
    target = tmp_path / "imatrix.gguf"
    target.write_bytes(b"old")
    write_imatrix(sample(), target)
    assert read_imatrix(target).chunk_count == 3 and os.listdir(tmp_path) == ["imatrix.gguf"]


def test_what_cannot_be_written_is_refused(tmp_path):
    entries = sample().entries
    with pytest.raises(OutputError, match="No such file"):
        write_imatrix(sample(), tmp_path / "missing" / "imatrix.gguf")
    for imatrix in (Imatrix(entries, (), 3, 512), Imatrix({}, ("a",), 3, 512), Imatrix(entries, ("a",), 1 << 32, 512),
                    Imatrix({"w": ImatrixEntry(np.array([1e39]), [1])}, ("a",), 1, 512)):
        with pytest.raises(UsageError):
            write_imatrix(imatrix, tmp_path / "imatrix.gguf")
    assert os.listdir(tmp_path) == []
    for squares, counts in (([1.0, 2.0], [1, 2]), ([[1.0], [2.0]], [1]), ([float("nan")], [1]), ([1.0], [0]),
                            ([1.0], [1.5]), ([-1.0], [1])):
        with pytest.raises(ValueError):
            ImatrixEntry(np.array(squares), np.array(counts))


# -- bad input ---------------------------------------------------------------------------------------

def replaced(name: str, ne: list[int] | None = None, kind: int = F32, raw: bytes | None = None):
    """LLAMA_CPP_TENSORS with the tensor `name` changed (or dropped, with raw=b"" and ne=[])."""
    out = []
    for t_name, t_ne, t_kind, t_raw in LLAMA_CPP_TENSORS:
        if t_name == name:
            if ne == []:
                continue
            t_ne, t_kind, t_raw = ne or t_ne, kind, t_raw if raw is None else raw
        out.append((t_name, t_ne, t_kind, t_raw))
    return gguf_file(IMATRIX_KVS, out)


DENSE_SUM2 = "blk.0.attn_q.weight.in_sum2"
DENSE_COUNTS = "blk.0.attn_q.weight.counts"
BAD_GGUF = {
    "a model, not an imatrix": gguf_file([kv_string("general.type", "model")] + IMATRIX_KVS[1:], LLAMA_CPP_TENSORS),
    "no chunk size": gguf_file(IMATRIX_KVS[:3], LLAMA_CPP_TENSORS),
    "a chunk count of another type": gguf_file(
        IMATRIX_KVS[:2] + [string("imatrix.chunk_count") + struct.pack("<Ii", I32, 3), IMATRIX_KVS[3]],
        LLAMA_CPP_TENSORS),
    "a dataset that is not an array": gguf_file(
        [IMATRIX_KVS[0], kv_string("imatrix.datasets", "x")] + IMATRIX_KVS[2:], LLAMA_CPP_TENSORS),
    "a dataset name not UTF-8": gguf_file(
        [IMATRIX_KVS[0], string("imatrix.datasets") + struct.pack("<IIQ", ARRAY, STRING, 1) + string(b"\xff")]
        + IMATRIX_KVS[2:], LLAMA_CPP_TENSORS),
    "no entries": gguf_file(IMATRIX_KVS, [LLAMA_CPP_TENSORS[-1]]),
    "sums of squares without counts": replaced(DENSE_COUNTS, []),
    "counts without sums of squares": replaced(DENSE_SUM2, []),
    "F16 sums of squares": replaced(DENSE_SUM2, kind=F16, raw=np.ones(6, "<f2").tobytes()),
    "columns not a multiple of the counts": replaced("blk.1.ffn_up_exps.weight.in_sum2", [11], raw=f32(range(11))),
    "sums not as many as the squares": replaced("blk.1.ffn_up_exps.weight.in_sum", [4, 2], raw=f32(range(8))),
    "NaN sums of squares": replaced(DENSE_SUM2, raw=f32([1, 2, float("nan"), 4, 5, 6])),
    "negative sums of squares": replaced(DENSE_SUM2, raw=f32([1, 2, -3, 4, 5, 6])),
    "Inf sums": replaced("blk.1.ffn_up_exps.weight.in_sum", raw=f32(np.full(12, np.inf))),
    "a count of zero": replaced(DENSE_COUNTS, raw=f32([0])),
    "every expert's count zero": replaced("blk.1.ffn_up_exps.weight.counts", raw=f32([0, 0, 0])),
    "a negative count": replaced(DENSE_COUNTS, raw=f32([-20])),
    "a NaN count": replaced(DENSE_COUNTS, raw=f32([float("nan")])),
    "a wrong version": b"GGUF" + struct.pack("<IQQ", 99, 0, 0),
    "the magic alone": b"GGUF",
}
GOOD_LEGACY = legacy_file()
BAD_LEGACY = {
    "empty": b"",
    "three bytes": b"\1\0\0",
    "no entries": struct.pack("<i", 0),
    "a negative entry count": struct.pack("<i", -1) + GOOD_LEGACY[4:],
    "more entries than there are": struct.pack("<i", 1 << 30) + GOOD_LEGACY[4:],
    "an empty name": struct.pack("<ii", 1, 0) + struct.pack("<ii", 1, 1) + f32([1]),
    "a name past the end": struct.pack("<ii", 1, 1 << 30) + b"blk",
    "a name not UTF-8": struct.pack("<ii", 1, 2) + b"\xff\xfe" + struct.pack("<ii", 1, 1) + f32([1]),
    "no values": legacy_file([("w", 1, [])]),
    "values past the end": struct.pack("<ii", 1, 1) + b"w" + struct.pack("<ii", 1, (1 << 31) - 1) + f32([1]),
    "ncall zero": legacy_file([("w", 0, [1.0])]),
    "ncall negative": legacy_file([("w", -2, [1.0])]),
    "a NaN value": legacy_file([("w", 1, [float("nan")])]),
    "a negative value": legacy_file([("w", 1, [-1.0])]),
    "a name twice": legacy_file([("w", 1, [1.0]), ("w", 1, [2.0])]),
    "bytes after the trailer": GOOD_LEGACY + b"\0",
    "a negative dataset length": legacy_file(trailer=struct.pack("<ii", 5, -1)),
    "a short dataset name": legacy_file(trailer=struct.pack("<ii", 5, 20) + b"calib"),
    "half a trailer": legacy_file(trailer=struct.pack("<i", 5)),
}


def assert_input_error(path: Path) -> InputError:
    with pytest.raises(InputError) as raised:
        read_imatrix(path)
    error = raised.value
    assert error.hint and "\n" not in error.message and str(path) in error.message
    return error


@pytest.mark.parametrize("case", BAD_GGUF)
def test_a_bad_gguf_imatrix_is_an_input_error(tmp_path, case):
    assert_input_error(write(tmp_path, BAD_GGUF[case]))


@pytest.mark.parametrize("case", BAD_LEGACY)
def test_a_bad_legacy_imatrix_is_an_input_error(tmp_path, case):
    assert_input_error(write(tmp_path, BAD_LEGACY[case], "imatrix.dat"))


def test_the_named_faults_say_what_they_are(tmp_path):
    for data, said in ((BAD_GGUF["a count of zero"], "count of zero"), (BAD_LEGACY["ncall zero"], "count of zero"),
                       (BAD_GGUF["NaN sums of squares"], "NaN"),
                       (BAD_GGUF["a model, not an imatrix"], "not an importance matrix"),
                       (BAD_GGUF["no chunk size"], "lacks imatrix.chunk_size")):
        assert said in assert_input_error(write(tmp_path, data)).message


def test_a_gguf_imatrix_cut_short_anywhere_before_its_last_value_is_an_input_error(tmp_path):
    data = gguf_file(IMATRIX_KVS, LLAMA_CPP_TENSORS)
    # the last tensor ("some.other.tensor", 8 bytes) starts 8 bytes before the padding of 24 that ends the file
    for size in range(len(data) - 24):
        assert_input_error(write(tmp_path, data[:size]))


def test_a_legacy_imatrix_cut_short_anywhere_is_an_input_error_but_at_its_optional_trailer(tmp_path):
    data = GOOD_LEGACY
    without_trailer = len(legacy_file(trailer=b""))
    for size in range(len(data)):
        path = write(tmp_path, data[:size], "imatrix.dat")
        if size == without_trailer:
            assert read_imatrix(path).datasets == ()
        else:
            assert_input_error(path)


def test_what_is_not_a_file_is_an_input_error(tmp_path):
    assert "No such file" in assert_input_error(tmp_path / "missing.gguf").message
    assert_input_error(tmp_path)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert "not a regular file" in assert_input_error(fifo).message
