"""The GGUF reader against files the `gguf` package wrote, its own reader (GGUFReader) as the reference, and
broken headers: each an InputError with a hint, refused before a weight is read."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from qcli.errors import InputError
from qcli.io import gguf as reader
from qcli.io.gguf import BY_NAME, GGML_TYPES, GgufSource
from qcli.io.readers import open_source
from qcli.io.safetensors import SafetensorsSource
from tests.gguf_support import T, gguf, gstr, header, tensor, write_gguf

RNG = np.random.default_rng(0)
TENSORS = {
    "token_embd.weight": (RNG.standard_normal((8, 64), dtype=np.float32), T.Q8_0),
    "blk.0.attn_q.weight": (RNG.standard_normal((2, 4, 64), dtype=np.float32), T.Q4_0),
    "blk.0.ffn_up.weight": (RNG.standard_normal((4, 32), dtype=np.float32), T.MXFP4),
    "blk.0.attn_norm.weight": (RNG.standard_normal(64, dtype=np.float32), T.F32),
    "blk.0.ffn_down.weight": (RNG.standard_normal((3, 5), dtype=np.float32), T.F16),
    "blk.0.ffn_gate.weight": (RNG.standard_normal((2, 6), dtype=np.float32), T.BF16),
}


@pytest.fixture
def model(tmp_path) -> tuple[Path, dict[str, np.ndarray]]:
    path = tmp_path / "model.gguf"
    return path, write_gguf(path, TENSORS, metadata={"llama.block_count": 1}, alignment=64)


def test_every_type_qcli_reads_is_ggml_s_by_id_name_and_layout():
    """qcli's own table (its header checks need no gguf import) agrees with the gguf package on each type it
    knows, and with llama.cpp's gguf-py ahead of its release (`GGMLQuantizationType`, `GGML_QUANT_SIZES` at
    ggml-org/llama.cpp 01243c5) on those the installed one does not; a type a later release adds is one qcli
    refuses as unknown until it is added here."""
    ggml = {int(q): (q.name, *gguf.GGML_QUANT_SIZES[q]) for q in T} | {42: ("Q2_0", 64, 2 + 16)}
    assert {i: (t.name, t.block, t.nbytes) for i, t in GGML_TYPES.items()}.items() <= ggml.items()
    assert {"F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q6_K", "MXFP4"} <= set(BY_NAME)


def test_infos_agree_with_the_gguf_reader(model):
    path, _ = model
    with GgufSource.open(path) as source:
        infos = {i.name: i for i in source.infos()}
        assert source.metadata["general.alignment"] == 64 and source.metadata["general.architecture"] == "llama"
        assert source.version == 3 and source.files == [path] and source.index is None
    offsets = [i.offset for i in source.infos()]
    assert offsets == sorted(offsets)  # data order
    theirs = gguf.GGUFReader(str(path)).tensors
    assert sorted(infos) == sorted(t.name for t in theirs)
    for t in theirs:
        info = infos[t.name]
        assert info.dtype == t.tensor_type.name
        assert info.shape == tuple(int(d) for d in t.shape[::-1]) == TENSORS[t.name][0].shape
        assert (info.offset, info.nbytes, info.file) == (t.data_offset, t.n_bytes, path)
        assert info.offset % 64 == 0


def test_load_gives_what_was_stored(model):
    path, stored = model
    with GgufSource.open(path) as source:
        for name, data in stored.items():
            got = source.load(name)
            if TENSORS[name][1] in (T.F32, T.F16):
                assert got.dtype == torch.from_numpy(data).dtype and tuple(got.shape) == data.shape
                assert torch.equal(got, torch.from_numpy(data)), name
            elif TENSORS[name][1] is T.BF16:
                assert got.dtype == torch.bfloat16
                assert torch.equal(got.view(torch.uint8).reshape(data.shape), torch.from_numpy(data))
            else:  # quantized: the bytes, shaped as gguf's quants take them
                assert got.dtype == torch.uint8 and tuple(got.shape) == data.shape, name
                assert torch.equal(got, torch.from_numpy(data)), name


def test_open_reads_the_header_only(model, monkeypatch):
    path, _ = model
    data_start = min(i.offset for i in GgufSource.open(path).infos())
    read = []
    real = reader.open_regular

    def counting(p):
        file = real(p)
        original = file.read

        def tracked(n=-1):
            out = original(n)
            read.append(file.tell())
            return out

        file.read = tracked
        return file

    monkeypatch.setattr(reader, "open_regular", counting)
    GgufSource.open(path)
    assert max(read) <= data_start


def test_open_source_picks_the_reader(model, tmp_path):
    path, _ = model
    assert isinstance(open_source(path), GgufSource)
    renamed = tmp_path / "model.bin"
    renamed.write_bytes(path.read_bytes())
    assert isinstance(open_source(renamed), GgufSource)  # by its magic
    st = tmp_path / "m.safetensors"
    st.write_bytes(struct.pack("<Q", 2) + b"{}")
    assert isinstance(open_source(st), SafetensorsSource)


# -- broken headers ---------------------------------------------------------------------------------


BROKEN = {
    "empty": (b"", "truncated: the magic"),
    "not-gguf": (b"PK\x03\x04" + bytes(40), "not a GGUF file"),
    "version-1": (b"GGUF" + struct.pack("<I", 1) + bytes(16), "GGUF version 1"),
    "version-9": (b"GGUF" + struct.pack("<I", 9) + bytes(16), "unknown GGUF version 9"),
    "big-endian": (b"GGUF" + struct.pack(">I", 3) + bytes(16), "big-endian"),
    "huge-counts": (b"GGUF" + struct.pack("<IQQ", 3, 2**63, 2**63), "more than a file of"),
    "cut-key": (header(kv_count=1, kv=struct.pack("<Q", 100) + b"abc"), "truncated: a metadata key"),
    "huge-string": (header(kv_count=1, kv=gstr("k") + struct.pack("<IQ", 8, 2**62)), "truncated: the value of 'k'"),
    "bad-utf8-key": (header(kv_count=1, kv=gstr(b"\xff\xfe") + struct.pack("<IB", 0, 1)), "is not UTF-8"),
    "unknown-value-type": (header(kv_count=1, kv=gstr("k") + struct.pack("<I", 77)), "unknown value type 77"),
    "huge-array": (header(kv_count=1, kv=gstr("k") + struct.pack("<IIQ", 9, 8, 2**60)), "claims"),
    "deep-array": (header(kv_count=1, kv=gstr("k") + struct.pack("<I", 9) + struct.pack("<IQ", 9, 1) * 5),
                   "nests arrays"),
    "twice": (header(kv_count=2, kv=(gstr("k") + struct.pack("<IB", 0, 1)) * 2), "'k' appears twice"),
    "alignment": (header(kv_count=1, kv=gstr("general.alignment") + struct.pack("<II", 4, 48)), "not a power of two"),
    "split": (header(kv_count=1, kv=gstr("split.count") + struct.pack("<IH", 2, 3)), "one of 3 split GGUF files"),
    "rank": (header(tensor_count=1, tensors=tensor("w", (1, 1, 1, 1, 1))), "has 5 axes"),
    "overflow": (header(tensor_count=1, tensors=tensor("w", (0, 2**63))), "overflows ggml's 64-bit counts"),
    "unknown-type": (header(tensor_count=1, tensors=tensor("w", (4,), 5)), "unknown ggml type 5"),
    "partial-block": (header(tensor_count=1, tensors=tensor("w", (48, 2), 8)), "not a whole number of its 32-value"),
    "empty-name": (header(tensor_count=1, tensors=tensor("", (4,))), "empty name"),
    "unaligned": (header(tensor_count=1, tensors=tensor("w", (4,), 0, 8), data=bytes(64)), "not a multiple of the"),
    "past-the-end": (header(tensor_count=1, tensors=tensor("w", (4,)), data=bytes(8)), "truncated: tensor 'w'"),
    "duplicate": (header(tensor_count=2, tensors=tensor("w", (4,)) * 2, data=bytes(32)), "'w' appears twice"),
    "overlap": (header(tensor_count=2, tensors=tensor("a", (16,)) + tensor("b", (4,), 0, 32), data=bytes(96)),
                "overlaps tensor 'a'"),
}


@pytest.mark.parametrize("content, needle", BROKEN.values(), ids=BROKEN)
def test_a_broken_header_is_an_input_error(tmp_path, content, needle):
    path = tmp_path / "bad.gguf"
    path.write_bytes(content)
    with pytest.raises(InputError) as raised:
        GgufSource.open(path)
    assert raised.value.message.startswith(f"{path}: ") and needle in raised.value.message, raised.value.message
    assert raised.value.hint


def test_a_well_formed_handmade_header_opens(tmp_path):
    """The helpers above make headers the reader accepts, so each broken case breaks one thing."""
    path = tmp_path / "ok.gguf"
    path.write_bytes(header(tensor_count=2, tensors=tensor("a", (4,)) + tensor("b", (2, 2), 0, 32), data=bytes(64)))
    assert [(i.name, i.shape) for i in GgufSource.open(path).infos()] == [("a", (4,)), ("b", (2, 2))]


def test_every_prefix_of_a_real_header_is_refused(model, tmp_path):
    path, _ = model
    content = path.read_bytes()
    data_start = min(i.offset for i in GgufSource.open(path).infos())
    cut = tmp_path / "cut.gguf"
    for end in sorted({*range(0, 64), *range(64, data_start, 97)}):
        cut.write_bytes(content[:end])
        with pytest.raises(InputError):
            GgufSource.open(cut)


def test_a_big_endian_file_is_refused_with_the_converter(tmp_path):
    path = tmp_path / "be.gguf"
    write_gguf(path, {"w": (np.ones((2, 32), dtype=np.float32), T.F32)}, endianess=gguf.GGUFEndian.BIG)
    with pytest.raises(InputError) as raised:
        GgufSource.open(path)
    assert "big-endian" in raised.value.message and "gguf_convert_endian.py" in raised.value.hint
