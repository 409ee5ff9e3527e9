"""The burnpack container against files Burn wrote, the spec's worked examples and Burn's reader limits.

Expected bytes come from burn-vectors.json (Burn literals and the spec's computed examples), the packs
Burn 0.22.1 wrote in tests/data/burn, and RFC 8949's examples for CBOR floats; never from the code under
test.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import cbor2
import pytest
import torch
from safetensors.numpy import load_file

from qcli.errors import InputError, OutputError
from qcli.io.burnpack import (
    BurnpackReader,
    BurnpackWriter,
    TensorEntry,
    data_section_start,
    header_bytes,
    max_file_size,
    metadata_json,
    size_bound,
)
from qcli.io.dtypes import Bool, BoolStore, Plain, QFloat, dtype_from_serde
from qcli.layout import quantized_data_len
from qcli.output.shards import split
from qcli.scheme import QuantScheme
from tests.burn_facts import BURN_FIXTURES, VECTORS
from tests.cli_support import ROOT
from tests.hang_support import ends

BURNS_FILE = BURN_FIXTURES / "linear-f32.bpk"
# What Burn saved it from, read with the safetensors library rather than qcli.
SOURCE = load_file(BURN_FIXTURES / "linear.safetensors")
# Facts read from Burn's file: its metadata, where its data section starts, and where each tensor lies in
# it, in the order Burn wrote them (module order, the param ids counting up).
BURNS_METADATA = {"format": "burnpack", "producer": "burn", "version": "0.22.1"}
BURNS_DATA_START = 512
BURNS_OFFSETS = {
    "layers.0.weight": (0, 32768), "layers.0.bias": (32768, 33024),
    "layers.1.weight": (33024, 41216), "layers.1.bias": (41216, 41344),
}
BURNS_FILE_LEN = BURNS_DATA_START + BURNS_OFFSETS["layers.1.bias"][1]


def write_pack(path: Path, entries: list[TensorEntry], payloads: list[object], **kwargs: object) -> bytes:
    with BurnpackWriter(path, entries, **kwargs) as writer:
        for entry, payload in zip(entries, payloads, strict=True):
            writer.write(entry.name, payload)
        writer.commit()
    return path.read_bytes()


def raw_pack(metadata: object, data: bytes = b"", *, encoded: bytes | None = None) -> bytes:
    """A pack assembled by hand from the spec's layout, to feed the reader files no writer would make."""
    blob = encoded if encoded is not None else cbor2.dumps(metadata)
    head = struct.pack("<IHI", 0x4255524E, 1, len(blob)) + blob
    return head + bytes(data_section_start(len(blob)) - len(head)) + data


def f32_descriptor(start: int, end: int, shape: list[int]) -> dict:
    return {"dtype": "F32", "shape": shape, "data_offsets": [start, end]}


# -- Files Burn wrote -------------------------------------------------------------------------------


def test_burns_file_reads_as_burn_wrote_it() -> None:
    reader = BurnpackReader.open(BURNS_FILE)
    entries = reader.entries()
    assert [e.name for e in entries] == list(BURNS_OFFSETS)
    assert {e.name: e.shape for e in entries} == {name: array.shape for name, array in SOURCE.items()}
    assert {e.name: e.nbytes for e in entries} == {name: array.nbytes for name, array in SOURCE.items()}
    assert all(e.dtype == "F32" for e in entries)
    assert [e.param_id for e in entries] == list(range(len(entries)))
    assert reader.version == 1
    assert reader.metadata == BURNS_METADATA and reader.scalars == {}
    assert reader.data_start == BURNS_DATA_START
    assert {e.name: reader.data_offsets(e.name) for e in entries} == BURNS_OFFSETS
    assert BURNS_FILE.stat().st_size == BURNS_FILE_LEN


def test_burns_file_tensor_bytes_are_the_file_slices() -> None:
    """Burn stores f32 verbatim, so each tensor is the source's little-endian bytes at its offsets."""
    raw = BURNS_FILE.read_bytes()
    reader = BurnpackReader.open(BURNS_FILE)
    for name, (start, end) in BURNS_OFFSETS.items():
        got = bytes(reader.read(name))
        assert got == raw[BURNS_DATA_START + start : BURNS_DATA_START + end], name
        assert SOURCE[name].dtype == "<f4" and got == SOURCE[name].tobytes(), name


@pytest.mark.parametrize("name", ["linear-f32.bpk", "linear-q8s-b32.bpk", "linear-q4s-b32.bpk"])
def test_burns_file_read_then_written_back_is_identical(tmp_path: Path, name: str) -> None:
    """qcli's writer lays out Burn's container (header, CBOR, alignment padding) exactly as Burn does."""
    burns = BURN_FIXTURES / name
    reader = BurnpackReader.open(burns)
    entries = reader.entries()
    out = write_pack(tmp_path / name, entries, [reader.read(e.name) for e in entries], metadata=reader.metadata)
    assert out == burns.read_bytes()


def test_reader_appends_the_extension_when_the_path_has_none(tmp_path: Path) -> None:
    (tmp_path / "linear.bpk").write_bytes(BURNS_FILE.read_bytes())
    assert [e.name for e in BurnpackReader.open(tmp_path / "linear").entries()] == list(BURNS_OFFSETS)


# -- The spec's vectors ----------------------------------------------------------------------------


def test_header_constants_and_bytes() -> None:
    assert header_bytes(0)[:4].hex() == VECTORS[52]["expected"]["magic_le_bytes"].split()[0]
    vector = VECTORS[53]
    assert header_bytes(vector["input"]["metadata_size"]).hex() == vector["expected"]["header_bytes"]


def test_data_section_start_is_the_next_256_boundary() -> None:
    vector = VECTORS[54]
    got = [data_section_start(size) for size in vector["input"]]
    assert got == vector["expected"]["aligned_data_section_start"]


def test_tensors_start_on_256_boundaries_without_trailing_padding(tmp_path: Path) -> None:
    vector = VECTORS[55]
    entries = [TensorEntry(n, dtype_from_serde(d), tuple(s), 4 * s[0])
               for n, d, s in vector["input"]["tensors_in_write_order"]]
    payloads = [bytes([i + 1]) * e.nbytes for i, e in enumerate(entries)]
    out = write_pack(tmp_path / "abc.bpk", entries, payloads)
    reader = BurnpackReader.open(tmp_path / "abc.bpk")
    assert {e.name: list(reader.data_offsets(e.name)) for e in entries} == vector["expected"]["data_offsets"]
    assert len(out) == vector["expected"]["file_len"]
    assert out[256 + 12 : 256 + 256] == bytes(244)  # zero gap after a
    assert bytes(reader.read("b")) == b"\x02" * 4


def test_single_tensor_round_trip_is_byte_identical(tmp_path: Path) -> None:
    vector = VECTORS[56]
    spec = vector["input"]
    entry = TensorEntry(spec["name"], dtype_from_serde(spec["dtype"]), tuple(vector["shape"]), 16,
                        param_id=spec["param_id"])
    out = write_pack(tmp_path / "w.bpk", [entry], [struct.pack("<4f", *spec["values"])])
    expected = vector["expected"]
    metadata = bytes.fromhex(expected["metadata_cbor_hex"])
    assert out[:10].hex() == expected["header_hex"]
    assert out[10 : 10 + len(metadata)] == metadata
    assert out[10 + len(metadata) : 256] == bytes(256 - 10 - len(metadata))
    assert out[256:].hex() == expected["tensor_bytes_hex"]
    assert len(out) == expected["file_len"]
    back = BurnpackReader.open(tmp_path / "w.bpk")
    assert back.entries() == [entry]


def test_empty_pack(tmp_path: Path) -> None:
    out = write_pack(tmp_path / "empty.bpk", [], [])
    assert len(out) == VECTORS[57]["expected"]["file_len"]
    assert out[:20].hex() == VECTORS[57]["expected"]["first_20_bytes_hex"]
    assert BurnpackReader.open(tmp_path / "empty.bpk").entries() == []


def test_scalars_are_externally_tagged_and_sorted(tmp_path: Path) -> None:
    scalars = {"step": {"UInt": 42}, "flag": {"Bool": True}, "offset": {"Int": -3}}
    out = write_pack(tmp_path / "s.bpk", [TensorEntry("w", Plain.F32, (1,), 4)], [bytes(4)], scalars=scalars)
    expected = bytes.fromhex(VECTORS[58]["expected"]["metadata_cbor_hex"])
    assert out[10 : 10 + len(expected)] == expected
    assert BurnpackReader.open(tmp_path / "s.bpk").scalars == scalars


@pytest.mark.parametrize(
    ("value", "cbor_hex"),
    # RFC 8949 Appendix A: the shortest float that holds the value exactly.
    [(1.5, "f93e00"), (-4.0, "f9c400"), (65504.0, "f97bff"), (100000.0, "fa47c35000"),
     (3.4028234663852886e38, "fa7f7fffff"), (1.1, "fb3ff199999999999a"), (float("inf"), "f97c00")],
)
def test_float_scalars_take_the_shortest_lossless_width(tmp_path: Path, value: float, cbor_hex: str) -> None:
    out = write_pack(tmp_path / "f.bpk", [], [], scalars={"x": {"Float": value}})
    # a2 "tensors" {} "scalars" {"x": {"Float": <float>}}
    expected = bytes.fromhex("a26774656e736f7273a0677363616c617273a16178a165466c6f6174" + cbor_hex)
    assert out[10 : 10 + len(expected)] == expected
    assert BurnpackReader.open(tmp_path / "f.bpk").scalars == {"x": {"Float": value}}


def test_metadata_map_is_stored_sorted_and_read_back(tmp_path: Path) -> None:
    metadata = {"producer": "qcli", "format": "burnpack"}
    out = write_pack(tmp_path / "m.bpk", [], [], metadata=metadata)
    blob = out[10 : 10 + struct.unpack("<I", out[6:10])[0]]
    # a2 tensors {} metadata {format, producer}: keys in declaration order, the map sorted bytewise
    assert blob.hex().startswith("a26774656e736f7273a0686d65746164617461a266666f726d6174")
    assert BurnpackReader.open(tmp_path / "m.bpk").metadata == metadata


def test_qfloat_tensor_is_byte_identical(tmp_path: Path) -> None:
    vector = VECTORS[62]
    scheme = QuantScheme.from_serde(vector["scheme"])
    nbytes = quantized_data_len(scheme, vector["shape"])
    entry = TensorEntry(vector["input"]["name"], QFloat(scheme), tuple(vector["shape"]),
                        nbytes, param_id=vector["input"]["param_id"])
    out = write_pack(tmp_path / "q.bpk", [entry], [bytes.fromhex(vector["input"]["tensor_bytes_hex"])])
    assert out.hex() == vector["expected"]["file_hex"]
    back = BurnpackReader.open(tmp_path / "q.bpk").entries()
    assert back == [entry]
    assert back[0].dtype.scheme == scheme


@pytest.mark.parametrize("case", sorted(VECTORS[61]["expected"]))
def test_dtype_serde_encodes_as_ciborium_does(case: str) -> None:
    vector = VECTORS[61]["expected"][case]
    assert cbor2.dumps(dtype_from_serde(vector["serde"]).to_serde()).hex() == vector["cbor_hex"]


def test_torch_tensors_are_written_as_their_raw_bytes(tmp_path: Path) -> None:
    bf16 = torch.tensor([[1.0, 2.0], [-2.0, 0.5]], dtype=torch.bfloat16)
    flags = torch.tensor([True, False, True])
    entries = [TensorEntry("h", Plain.BF16, (2, 2), 8), TensorEntry("b", Bool(BoolStore.Native), (3,), 3)]
    write_pack(tmp_path / "t.bpk", entries, [bf16, flags])
    reader = BurnpackReader.open(tmp_path / "t.bpk")
    assert bytes(reader.read("h")).hex() == "803f0040" + "00c0003f"  # bf16 bits, little-endian
    assert bytes(reader.read("b")) == b"\x01\x00\x01"


# -- Writer contract -------------------------------------------------------------------------------


def test_writer_refuses_a_length_other_than_declared(tmp_path: Path) -> None:
    with BurnpackWriter(tmp_path / "x.bpk", [TensorEntry("w", Plain.F32, (2,), 8)]) as writer:
        with pytest.raises(ValueError, match="expected 8, got 4"):
            writer.write("w", bytes(4))
    assert list(tmp_path.iterdir()) == []


def test_writer_refuses_tensors_out_of_order(tmp_path: Path) -> None:
    entries = [TensorEntry("a", Plain.U8, (1,), 1), TensorEntry("b", Plain.U8, (1,), 1)]
    with BurnpackWriter(tmp_path / "x.bpk", entries) as writer:
        with pytest.raises(ValueError, match="expects 'a'"):
            writer.write("b", b"\x00")


def test_writer_checks_byte_len_except_for_qfloat(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"declares 12 bytes but its shape \[2, 2\] and dtype F32 need 16"):
        BurnpackWriter(tmp_path / "x.bpk", [TensorEntry("w", Plain.F32, (2, 2), 12)])
    # the producer's length is trusted for QFloat
    BurnpackWriter(tmp_path / "x.bpk", [TensorEntry("q", QFloat(QuantScheme()), (2, 2), 3)])


def test_writer_refuses_duplicates_and_unknown_dtypes(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="Duplicate tensor name 'a'"):
        BurnpackWriter(tmp_path / "x.bpk", [TensorEntry("a", Plain.U8, (1,), 1)] * 2)
    with pytest.raises(ValueError, match="not a Burn DType"):
        dtype_from_serde("F8_E4M3")


def test_commit_refuses_unwritten_tensors(tmp_path: Path) -> None:
    with BurnpackWriter(tmp_path / "x.bpk", [TensorEntry("a", Plain.U8, (1,), 1)]) as writer:
        with pytest.raises(ValueError, match="1 tensors unwritten"):
            writer.commit()
    assert list(tmp_path.iterdir()) == []


def test_exception_mid_write_leaves_the_target_untouched(tmp_path: Path) -> None:
    target = tmp_path / "model.bpk"
    target.write_bytes(b"previous contents")
    entries = [TensorEntry("a", Plain.U8, (4,), 4), TensorEntry("b", Plain.U8, (4,), 4)]
    with pytest.raises(RuntimeError, match="producer failed"):
        with BurnpackWriter(target, entries) as writer:
            writer.write("a", b"\x01\x02\x03\x04")
            assert any(p.name.endswith(".tmp") for p in tmp_path.iterdir())
            raise RuntimeError("producer failed")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.bpk"]
    assert target.read_bytes() == b"previous contents"


def test_leaving_without_commit_leaves_nothing(tmp_path: Path) -> None:
    with BurnpackWriter(tmp_path / "x.bpk", [TensorEntry("a", Plain.U8, (1,), 1)]) as writer:
        writer.write("a", b"\x00")
    assert list(tmp_path.iterdir()) == []


def test_finish_completes_the_file_without_touching_the_target(tmp_path: Path) -> None:
    target = tmp_path / "x.bpk"
    target.write_bytes(b"old")
    with BurnpackWriter(target, [TensorEntry("a", Plain.U8, (2,), 2)]) as writer:
        writer.write("a", b"\x05\x06")
        done = writer.finish()
        assert done.parent == tmp_path and done != target and target.read_bytes() == b"old"
        assert bytes(BurnpackReader.open(done).read("a")) == b"\x05\x06"
        writer.commit()
        with pytest.raises(ValueError, match="twice"):
            writer.commit()
    assert bytes(BurnpackReader.open(target).read("a")) == b"\x05\x06"
    assert [p.name for p in tmp_path.iterdir()] == ["x.bpk"]


def test_commit_replaces_an_existing_target(tmp_path: Path) -> None:
    target = tmp_path / "x.bpk"
    target.write_bytes(b"old")
    out = write_pack(target, [TensorEntry("a", Plain.U8, (1,), 1)], [b"\x07"])
    assert out[-1:] == b"\x07" and len(out) == 257
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.bpk"]


def test_missing_directory_is_an_output_error(tmp_path: Path) -> None:
    target = tmp_path / "no" / "such" / "x.bpk"
    with pytest.raises(OutputError, match="cannot write .*x.bpk: No such file or directory") as info:
        with BurnpackWriter(target, []):
            pass
    assert info.value.hint and info.value.exit_code == 4


def test_a_directory_in_the_way_is_an_output_error(tmp_path: Path) -> None:
    (tmp_path / "x.bpk").mkdir()
    with pytest.raises(OutputError, match="cannot write"):
        write_pack(tmp_path / "x.bpk", [], [])
    assert [p.name for p in tmp_path.iterdir()] == ["x.bpk"]


@pytest.mark.parametrize("n", [1 << 20, 4000], ids=["fails-in-write", "fails-in-commit-flush"])
def test_file_too_large_is_an_output_error_and_leaves_nothing(tmp_path: Path, n: int) -> None:
    # RLIMIT_FSIZE makes the kernel answer EFBIG, as a full or size-limited filesystem would.
    script = f"""
import resource, signal, sys
sys.path.insert(0, {str(ROOT)!r})
from qcli.errors import OutputError
from qcli.io.burnpack import BurnpackWriter, TensorEntry
from qcli.io.dtypes import Plain
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))
try:
    with BurnpackWriter({str(tmp_path / "big.bpk")!r}, [TensorEntry("w", Plain.U8, ({n},), {n})]) as w:
        w.write("w", bytes({n}))
        w.commit()
except OutputError as exc:
    print(exc.message)
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert "cannot write" in result.stdout and "File too large" in result.stdout, result.stderr
    assert list(tmp_path.iterdir()) == []


def test_non_contiguous_tensor_is_refused(tmp_path: Path) -> None:
    data = torch.zeros(4, 2, dtype=torch.uint8).t()
    with BurnpackWriter(tmp_path / "x.bpk", [TensorEntry("a", Plain.U8, (2, 4), 8)]) as writer:
        with pytest.raises(ValueError, match="contiguous"):
            writer.write("a", data)


# -- Reader limits and refusals --------------------------------------------------------------------


def read_error(path: Path, content: bytes) -> InputError:
    path.write_bytes(content)
    with pytest.raises(InputError) as info:
        BurnpackReader.open(path)
    error = info.value
    assert str(path) in error.message and error.hint and error.exit_code == 3
    return error


def test_short_file(tmp_path: Path) -> None:
    assert "shorter than the 10-byte header" in read_error(tmp_path / "a.bpk", b"NRUB\x01").message


def test_bad_magic(tmp_path: Path) -> None:
    assert "not a burnpack file" in read_error(tmp_path / "a.bpk", b"\x00" * 300).message


def test_newer_version(tmp_path: Path) -> None:
    content = bytearray(raw_pack({"tensors": {}}))
    content[4:6] = (2).to_bytes(2, "little")
    assert "version 2" in read_error(tmp_path / "a.bpk", bytes(content)).message


def test_version_zero_is_accepted(tmp_path: Path) -> None:
    content = bytearray(raw_pack({"tensors": {}}))
    content[4:6] = bytes(2)
    (tmp_path / "a.bpk").write_bytes(bytes(content))
    assert BurnpackReader.open(tmp_path / "a.bpk").version == 0


def test_metadata_over_the_limit(tmp_path: Path) -> None:
    content = struct.pack("<IHI", 0x4255524E, 1, 100 * 1024 * 1024 + 1)
    assert "exceeds the maximum of 104857600" in read_error(tmp_path / "a.bpk", content).message


def test_truncated_metadata(tmp_path: Path) -> None:
    content = struct.pack("<IHI", 0x4255524E, 1, 5000) + b"\xa1"
    assert "announces 5000 bytes of metadata" in read_error(tmp_path / "a.bpk", content).message


def test_invalid_cbor(tmp_path: Path) -> None:
    assert "not valid CBOR" in read_error(tmp_path / "a.bpk", raw_pack(None, encoded=b"\xff\xff\xff")).message


def test_cbor_nesting_limit_is_128(tmp_path: Path) -> None:
    too_deep = read_error(tmp_path / "a.bpk", raw_pack(None, encoded=b"\x81" * 129 + b"\x00"))
    assert "not valid CBOR" in too_deep.message
    deep = read_error(tmp_path / "b.bpk", raw_pack(None, encoded=b"\x81" * 128 + b"\x00"))
    assert "no 'tensors' map" in deep.message  # decodes, then fails as a Metadata


@pytest.mark.parametrize("text, expected", [
    ('["a[[[[", "b]]", "c\\"[{"]', ["a[[[[", "b]]", 'c"[{']),  # brackets inside strings do not nest
    ("[" * 32 + "]" * 32, eval("[" * 32 + "]" * 32)),  # noqa: S307 (Python's own parser as the oracle)
    ("[]", []),
])
def test_metadata_json_within_its_limits(text: str, expected: object) -> None:
    assert metadata_json(Path("a.bpk"), "k", text) == expected


@pytest.mark.parametrize("text, message", [
    ("[" * 33 + "]" * 33, "metadata 'k' holds JSON nested 33 deep, past the 32 qcli reads"),
    ('[{"a": ' * 20 + "1" + "}]" * 20, "nested 40 deep"),
    ("[" * 100_000, "nested 100000 deep"),  # unclosed: still measured, not parsed
    ('"' + "a" * (16 * 1024**2 - 1) + '"', "holds 16777217 characters, more than the 16777216"),
    ("[1,", "metadata 'k' is not valid JSON"),
])
def test_metadata_json_past_its_limits(text: str, message: str) -> None:
    with pytest.raises(InputError) as caught:
        metadata_json(Path("a.bpk"), "k", text)
    assert message in caught.value.message and caught.value.hint


@pytest.mark.parametrize("n", [0, 23, 24, 255, 256, 65535, 65536])
@pytest.mark.parametrize("char", ["a", "é"])
def test_a_name_bound_is_its_cbor_size(n: int, char: str) -> None:
    from qcli.io.burnpack import _text_size

    assert _text_size(char * n) == len(cbor2.dumps(char * n))


def test_too_many_tensors(tmp_path: Path) -> None:
    tensors = {f"t{i}": f32_descriptor(0, 0, [0]) for i in range(100_001)}
    assert "100001 tensors" in read_error(tmp_path / "a.bpk", raw_pack({"tensors": tensors})).message


def test_truncated_data_names_the_last_tensor(tmp_path: Path) -> None:
    error = read_error(tmp_path / "a.bpk", BURNS_FILE.read_bytes()[:-1])
    expected = f"truncated: tensor 'layers.1.bias' ends at byte {BURNS_FILE_LEN} but the file has {BURNS_FILE_LEN - 1}"
    assert expected in error.message


def test_truncation_counts_the_padding_before_the_data_section(tmp_path: Path) -> None:
    # Burn's own check (10 + metadata_size + max end) passes here; the data section really starts at 256.
    metadata = {"tensors": {"w": f32_descriptor(0, 4, [1])}}
    content = raw_pack(metadata)[: 10 + len(cbor2.dumps(metadata)) + 4]
    assert "truncated: tensor 'w' ends at byte 260" in read_error(tmp_path / "a.bpk", content).message


def test_end_before_start(tmp_path: Path) -> None:
    content = raw_pack({"tensors": {"w": f32_descriptor(8, 4, [1])}}, bytes(8))
    error = read_error(tmp_path / "a.bpk", content)
    assert "tensor 'w' has corrupted offset data: end 4 < start 8" in error.message


def test_tensor_over_10_gib(tmp_path: Path) -> None:
    n = 10 * 1024**3 + 4
    path = tmp_path / "a.bpk"
    path.write_bytes(raw_pack({"tensors": {"w": f32_descriptor(0, n, [n // 4])}}))
    with open(path, "r+b") as file:  # sparse: the bytes are never written
        file.truncate(256 + n)
    with pytest.raises(InputError, match="tensor 'w' has 10737418244 bytes, exceeding the maximum"):
        BurnpackReader.open(path)


def test_file_over_100_gib(tmp_path: Path) -> None:
    path = tmp_path / "a.bpk"
    path.write_bytes(raw_pack({"tensors": {}}))
    with open(path, "r+b") as file:
        file.truncate(100 * 1024**3 + 1)
    with pytest.raises(InputError, match="file size 107374182401 bytes exceeds the maximum"):
        BurnpackReader.open(path)
    os.truncate(path, 0)


def test_the_file_limit_is_the_release_the_file_names(tmp_path: Path) -> None:
    """Burn 0.23.0-pre.1's reader opens files up to 500 GiB (burn-pack 0.23.0-pre.1 base.rs), 0.22.1's and
    0.21.0's up to 100 GiB: a file over 100 GiB reads when its metadata names 0.23, and is refused, naming
    the release, when it names an older one or none; nothing reads past 500 GiB."""
    path = tmp_path / "a.bpk"
    for version, size, limit in [("0.23.0-pre.1", 100 * 1024**3 + 1, None), ("0.22.1", 100 * 1024**3 + 1, "0.22.1"),
                                 (None, 100 * 1024**3 + 1, "0.22.1"), ("0.23.0-pre.1", 500 * 1024**3 + 1, "")]:
        top = {"tensors": {}} | ({} if version is None else {"metadata": {"burn_version": version}})
        path.write_bytes(raw_pack(top))
        os.truncate(path, size)
        if limit is None:
            assert BurnpackReader.open(path).metadata["burn_version"] == version
        else:
            with pytest.raises(InputError, match=f"file size {size} bytes exceeds the maximum") as caught:
                BurnpackReader.open(path)
            assert f"Burn {limit}".strip() + " refuses burnpack files over" in caught.value.hint
        os.truncate(path, 0)
    assert max_file_size("0.23.0-pre.1") == 500 * 1024**3 and max_file_size("0.21.0") == max_file_size(None) \
        == 100 * 1024**3


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        ({"tensors": []}, "no 'tensors' map"),
        ({"tensors": {}, "metadata": {"a": 1}}, "'metadata' is not a map of strings"),
        ({"tensors": {}, "scalars": {"a": {"Int": "x"}}}, "scalar 'a'"),
        ({"tensors": {"w": {"dtype": "F32", "shape": [1]}}}, "tensor 'w' lacks"),
        ({"tensors": {"w": f32_descriptor(0, 4, [1]) | {"dtype": "F12"}}}, "tensor 'w': not a Burn DType"),
        ({"tensors": {"w": f32_descriptor(0, 4, [1]) | {"dtype": {"QFloat": {"value": "Q9"}}}}}, "Q9"),
        ({"tensors": {"w": f32_descriptor(0, 4, [-1])}}, "shape [-1] is not a list of u64"),
        ({"tensors": {"w": f32_descriptor(0, 4, [1]) | {"data_offsets": [0]}}}, "not a [start, end] pair"),
        ({"tensors": {"w": f32_descriptor(0, 4, [1]) | {"param_id": -1}}}, "param_id -1"),
        ({"tensors": {"w": f32_descriptor(0, 4, [2])}}, "spans 4 bytes but its shape [2] and dtype F32 need"),
    ],
)
def test_malformed_descriptors(tmp_path: Path, metadata: dict, message: str) -> None:
    error = read_error(tmp_path / "a.bpk", raw_pack(metadata, bytes(8)))
    assert message in error.message


def test_qfloat_payload_of_the_wrong_length(tmp_path: Path) -> None:
    # vector 62's scheme over [2, 8] takes 16 bytes (qfloat-spec §6); 12 are declared
    descriptor = {"dtype": {"QFloat": VECTORS[62]["scheme"]}, "shape": [2, 8], "data_offsets": [0, 12]}
    error = read_error(tmp_path / "a.bpk", raw_pack({"tensors": {"layer.weight": descriptor}}, bytes(12)))
    assert "tensor 'layer.weight' spans 12 bytes but its shape [2, 8] and dtype QFloat(" in error.message
    assert error.message.endswith("need 16")


def test_duplicate_tensor_names_in_cbor(tmp_path: Path) -> None:
    one = cbor2.dumps(f32_descriptor(0, 4, [1]))
    blob = b"\xa1\x67tensors\xa2\x61w" + one + b"\x61w" + one
    assert "not valid CBOR" in read_error(tmp_path / "a.bpk", raw_pack(None, bytes(4), encoded=blob)).message


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="cannot read .*nothing.bpk"):
        BurnpackReader.open(tmp_path / "nothing.bpk")
    with pytest.raises(InputError, match="is a directory"):
        BurnpackReader.open(tmp_path)


# -- Splitting into several files (qcli.output.shards.split, on the container's size bounds) --------------


def test_size_bound_covers_the_written_size(tmp_path: Path) -> None:
    reader = BurnpackReader.open(BURNS_FILE)
    entries = reader.entries()
    # at least what Burn wrote, and at most 255 bytes of padding and 20 of CBOR per tensor more
    bound = size_bound(entries, BURNS_METADATA)
    assert BURNS_FILE_LEN <= bound <= BURNS_FILE_LEN + len(entries) * (255 + 20) + 300
    metadata = {"producer": "qcli", "format": "burnpack"}
    out = write_pack(tmp_path / "m.bpk", entries[:3], [reader.read(e.name) for e in entries[:3]],
                     metadata=metadata)
    assert len(out) <= size_bound(entries[:3], metadata)


def test_split_keeps_order_and_every_file_under_the_limit(tmp_path: Path) -> None:
    reader = BurnpackReader.open(BURNS_FILE)
    entries = reader.entries()
    limit = 36_000  # above layers.0.weight's 32768 bytes, below the whole file
    packs = split(entries, limit)
    assert len(packs) >= 2
    assert [e for pack in packs for e in pack] == entries  # every tensor whole, once, in order
    for i, pack in enumerate(packs):
        out = write_pack(tmp_path / f"{i}.bpk", pack, [reader.read(e.name) for e in pack])
        assert len(out) <= limit


def test_split_refuses_a_tensor_larger_than_a_file() -> None:
    entries = BurnpackReader.open(BURNS_FILE).entries()
    with pytest.raises(ValueError, match="tensor 'layers.0.weight' takes 32768 bytes"):
        split(entries, 20_000)


def test_split_keeps_burns_tensor_count_per_file() -> None:
    entries = [TensorEntry(f"t{i}", Plain.U8, (0,), 0) for i in range(100_001)]
    assert [len(pack) for pack in split(entries, 10**12)] == [100_000, 1]


# -- hostile files: non-regular, CBOR tags and colliding keys; long target names ------------------------


def test_the_reader_refuses_a_fifo_and_a_device_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "a.bpk")
    (tmp_path / "z.bpk").symlink_to("/dev/zero")
    for path, kind in ((tmp_path / "a.bpk", "a FIFO"), (tmp_path / "z.bpk", "a character device")):
        with pytest.raises(InputError, match=f"not a regular file \\({kind}\\)"):
            BurnpackReader.open(path)


# cbor2's built-in tags, as of cbor2 6.3: every one must be refused (Burn and qcli write no tag)
CBOR2_TAGS = [0, 1, 2, 3, 4, 5, 25, 28, 29, 30, 35, 36, 37, 52, 54, 100, 256, 258, 260, 261, 1004, 43000, 55799]


@pytest.mark.parametrize("tag", [*CBOR2_TAGS, 6, 24, 27, 65535, 2**32, 2**63])
def test_every_cbor_tag_is_refused(tmp_path: Path, tag: int) -> None:
    blob = cbor2.dumps({"tensors": cbor2.CBORTag(tag, {})})
    message = read_error(tmp_path / "a.bpk", raw_pack(None, encoded=blob)).message
    assert f"metadata holds CBOR tag {tag}" in message


def shared_reference_blobs() -> list[bytes]:
    """Metadata holding 2**60 leaves in 300 bytes (tag 28 [1, 1], then 59 levels of tag 28 [ref i-1, ref i-1]):
    in a descriptor's shape, as a map key, and as the tensors map."""
    parts = [b"\xd8\x1c\x82\x01\x01"]
    parts += [b"\xd8\x1c\x82" + (b"\xd8\x1d\x18" + bytes([i - 1])) * 2 for i in range(1, 60)]
    dag = bytes([0x98, 60]) + b"".join(parts)
    return [b"\xa1\x67tensors\xa1\x61w\xa3\x65dtype\x63F32\x65shape" + dag + b"\x6cdata_offsets\x82\x00\x00",
            b"\xa1" + dag + b"\x00", b"\xa1\x67tensors" + dag]


def test_shared_references_are_refused_before_they_are_walked(tmp_path: Path) -> None:
    """A walk of the 2**60 leaves never ends; the reader must refuse the tag first. In a child process, since
    a walk inside cbor2's C code holds the interpreter where no alarm reaches."""
    paths = []
    for i, blob in enumerate(shared_reference_blobs()):
        paths.append(tmp_path / f"{i}.bpk")
        paths[-1].write_bytes(raw_pack(None, encoded=blob))
    script = """
import sys
from qcli.errors import InputError
from qcli.io.burnpack import BurnpackReader
for path in sys.argv[1:]:
    try:
        BurnpackReader.open(path)
    except InputError as error:
        print(error.message)
    else:
        raise AssertionError(f"{path} read")
"""
    messages = ends(script, *paths).stdout.splitlines()
    assert len(messages) == 3 and all("metadata holds CBOR tag 28" in m for m in messages), messages


def test_map_keys_must_be_strings(tmp_path: Path) -> None:
    """Integer keys k * (2**61 - 1) all hash alike: 40,000 of them took about 10 s to decode."""
    keys = b"".join(cbor2.dumps(k * (2**61 - 1)) + b"\x00" for k in range(1, 40_001))
    blob = b"\xa1\x67tensors\xb9" + (40_000).to_bytes(2, "big") + keys
    assert "map key" in read_error(tmp_path / "a.bpk", raw_pack(None, encoded=blob)).message


def test_metadata_messages_stay_short(tmp_path: Path) -> None:
    huge = {"tensors": {"w": {"dtype": ["F32"] * 200_000, "shape": [1], "data_offsets": [0, 4]}}}
    message = read_error(tmp_path / "a.bpk", raw_pack(huge, bytes(4))).message
    assert len(message) < 700 and "not a Burn DType" in message
    deep = {"tensors": {"w": f32_descriptor(0, 4, [1]) | {"shape": [[[[[[[1]]]]]]] * 1000}}}
    message = read_error(tmp_path / "b.bpk", raw_pack(deep, bytes(4))).message
    assert len(message) < 300 and "[[[...]]], ...]" in message


@pytest.mark.parametrize("name", ["m" * 250 + ".bpk", "é" * 125 + ".bpk", "中" * 83 + ".bpk", "x.bpk"])
def test_temporary_names_fit_the_name_limit(tmp_path: Path, name: str) -> None:
    from qcli.io.temporary import temporary_name

    temporary = temporary_name(name, 12345)
    assert len(os.fsencode(temporary)) <= 255 and temporary.startswith(".") and temporary.endswith("-12345.tmp")
    assert temporary_name(name, 1) != temporary_name(name + "x", 1)
    if len(os.fsencode(name)) < 230:
        assert temporary == f".{name}.{os.getpid()}-12345.tmp"  # short names as before
    target = tmp_path / name
    with BurnpackWriter(target, [TensorEntry("w", Plain.F32, (1,), 4)]) as writer:
        writer.write("w", b"\x00" * 4)
        writer.commit()
    assert [p.name for p in tmp_path.iterdir()] == [name]
