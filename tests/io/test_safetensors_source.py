"""The safetensors source: layouts it opens, headers it refuses, tensors it loads one at a time.

Expectations come from the files the tests write with `safetensors.torch.save_file`, from hand-built
headers, and from the `safetensors` library's own view of a checkpoint it wrote (tests/conftest.py).
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from qcli.errors import InputError
from qcli.io.dtypes import burn_dtype
from qcli.io.safetensors import SafetensorsSource
from qcli.io.source import TensorInfo
from tests.cli_support import ROOT


def raw_file(path: Path, header: object, data: bytes = b"", *, header_bytes: bytes | None = None) -> Path:
    """A safetensors file built by hand: u64 LE header length, the JSON header, the data."""
    blob = header_bytes if header_bytes is not None else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + data)
    return path


def open_error(path: Path) -> InputError:
    with pytest.raises(InputError) as info:
        SafetensorsSource.open(path)
    assert info.value.hint and info.value.exit_code == 3
    return info.value


def f32(begin: int, end: int, shape: list[int]) -> dict:
    return {"dtype": "F32", "shape": shape, "data_offsets": [begin, end]}


# -- Layouts ---------------------------------------------------------------------------------------


def test_a_checkpoint_matches_the_library_view(small_checkpoint: Path) -> None:
    with (
        SafetensorsSource.open(small_checkpoint) as source,
        safe_open(str(small_checkpoint), framework="pt") as reference,
    ):
        infos = source.infos()
        assert sorted(info.name for info in infos) == sorted(reference.keys())
        for info in infos:
            view = reference.get_slice(info.name)
            assert (info.dtype, list(info.shape), info.file) == (view.get_dtype(), view.get_shape(), small_checkpoint)
            tensor = source.load(info.name)
            assert torch.equal(tensor, reference.get_tensor(info.name)) and tensor.device.type == "cpu"
            assert info.nbytes == tensor.numel() * tensor.element_size()
    assert source.files == [small_checkpoint]
    (header_size,) = struct.unpack("<Q", small_checkpoint.read_bytes()[:8])
    assert sum(info.nbytes for info in infos) == small_checkpoint.stat().st_size - 8 - header_size
    header = json.loads(small_checkpoint.read_bytes()[8 : 8 + header_size])
    fc1 = next(info for info in infos if info.name == "fc1.weight")
    offset = 8 + header_size + header["fc1.weight"]["data_offsets"][0]
    assert fc1 == TensorInfo("fc1.weight", "F32", (64, 32), 64 * 32 * 4, small_checkpoint, offset)


def tensors() -> dict[str, torch.Tensor]:
    return {
        "a.weight": torch.arange(12, dtype=torch.float32).reshape(3, 4),
        "a.bias": torch.tensor([1.5, -2.0], dtype=torch.bfloat16),
        "b.weight": torch.arange(6, dtype=torch.float16).reshape(2, 3),
        "steps": torch.tensor(7, dtype=torch.int64),
    }


def test_single_file_with_metadata(tmp_path: Path) -> None:
    save_file(tensors(), tmp_path / "x.safetensors", metadata={"format": "pt"})
    with SafetensorsSource.open(tmp_path / "x.safetensors") as source:
        infos = {info.name: info for info in source.infos()}
        assert set(infos) == set(tensors())  # __metadata__ is not a tensor
        assert (infos["a.bias"].dtype, infos["a.bias"].shape, infos["a.bias"].nbytes) == ("BF16", (2,), 4)
        assert (infos["steps"].dtype, infos["steps"].shape, infos["steps"].nbytes) == ("I64", (), 8)
        for name, tensor in tensors().items():
            loaded = source.load(name)
            assert loaded.dtype == tensor.dtype and torch.equal(loaded, tensor)


def test_directory_with_model_safetensors(tmp_path: Path) -> None:
    save_file(tensors(), tmp_path / "model.safetensors")
    source = SafetensorsSource.open(tmp_path)
    assert source.files == [tmp_path / "model.safetensors"]
    assert len(source.infos()) == 4


def write_sharded(directory: Path) -> Path:
    everything = tensors()
    shards = {"model-00001-of-00002.safetensors": ["a.weight", "a.bias"],
              "model-00002-of-00002.safetensors": ["b.weight", "steps"]}
    for shard, names in shards.items():
        save_file({name: everything[name] for name in names}, directory / shard)
    index = directory / "model.safetensors.index.json"
    weight_map = {name: shard for shard, names in shards.items() for name in names}
    index.write_text(json.dumps({"metadata": {"total_size": 64}, "weight_map": weight_map}))
    return index


@pytest.mark.parametrize("through", ["directory", "index"])
def test_sharded_checkpoint(tmp_path: Path, through: str) -> None:
    index = write_sharded(tmp_path)
    with SafetensorsSource.open(tmp_path if through == "directory" else index) as source:
        first = tmp_path / "model-00001-of-00002.safetensors"
        second = tmp_path / "model-00002-of-00002.safetensors"
        assert source.files == [first, second]
        assert {info.name: info.file for info in source.infos()} == {
            "a.weight": first, "a.bias": first, "b.weight": second, "steps": second}
        assert torch.equal(source.load("b.weight"), tensors()["b.weight"])
        assert torch.equal(source.load("a.weight"), tensors()["a.weight"])


def test_dtypes_burn_has_none_for_still_read(tmp_path: Path) -> None:
    save_file({"f8": torch.tensor([1.0, -2.0], dtype=torch.float8_e4m3fn)}, tmp_path / "f8.safetensors")
    source = SafetensorsSource.open(tmp_path / "f8.safetensors")
    assert source.infos()[0].dtype == "F8_E4M3" and source.infos()[0].nbytes == 2
    assert burn_dtype("F8_E4M3") is None
    assert source.load("f8").float().tolist() == [1.0, -2.0]


def test_headers_are_read_without_torch(tmp_path: Path) -> None:
    save_file(tensors(), tmp_path / "x.safetensors")
    script = ("import sys; from qcli.io.safetensors import SafetensorsSource; "
              f"s = SafetensorsSource.open({str(tmp_path / 'x.safetensors')!r}); s.infos(); "
              "print('torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True,
                            timeout=60)
    assert result.stdout.strip() == "False", result.stderr


@pytest.mark.parametrize(
    ("dtype", "expected"),
    [("F64", "F64"), ("F32", "F32"), ("F16", "F16"), ("BF16", "BF16"), ("I64", "I64"), ("I32", "I32"),
     ("I16", "I16"), ("I8", "I8"), ("U64", "U64"), ("U32", "U32"), ("U16", "U16"), ("U8", "U8"),
     ("BOOL", {"Bool": "Native"}), ("F8_E4M3", None), ("F8_E5M2", None), ("F4", None), ("C64", None)],
)
def test_burn_dtype(dtype: str, expected: object) -> None:
    got = burn_dtype(dtype)
    assert (None if got is None else got.to_serde()) == expected


# -- Refusals --------------------------------------------------------------------------------------


def test_shorter_than_the_length_prefix(tmp_path: Path) -> None:
    (tmp_path / "x.safetensors").write_bytes(b"\x01\x00")
    assert "shorter than the 8-byte length" in open_error(tmp_path / "x.safetensors").message


def test_header_length_larger_than_the_file(tmp_path: Path) -> None:
    (tmp_path / "x.safetensors").write_bytes(struct.pack("<Q", 1000) + b"{}")
    error = open_error(tmp_path / "x.safetensors")
    assert "header length 1000 is larger than the file (10 bytes)" in error.message
    assert str(tmp_path / "x.safetensors") in error.message


@pytest.mark.parametrize(
    ("header_bytes", "message"),
    [
        (b"{not json", "does not parse"),
        (b'{"a": \xff}', "not UTF-8"),
        (b"[1, 2]", "not an object"),
        (b'{"__metadata__": {"k": 1}}', "__metadata__ is not a map of strings"),
        (b'{"w": {"dtype":"F32","shape":[1],"data_offsets":[0,4]}, "w": {"dtype":"F32","shape":[1],'
         b'"data_offsets":[4,8]}}', "'w' appears twice"),
        (b'{"": {"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', "empty name"),
        (b'{"\\ud800": {"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', "is not valid UTF-8"),
        (b'{"w": {"dtype":"F7","shape":[1],"data_offsets":[0,4]}}', "tensor 'w' has the unknown dtype 'F7'"),
        (b'{"w": {"dtype":["F32"],"shape":[1],"data_offsets":[0,4]}}', "unknown dtype ['F32']"),
        (b'{"w": {"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}', "shape [-1] is not a list of sizes"),
        (b'{"w": {"dtype":"F32","shape":[1]}}', "tensor 'w' lacks"),
        (b'{"w": {"dtype":"F32","shape":[1],"data_offsets":[4,0]}}', "is not [begin, end]"),
        (b'{"w": {"dtype":"F32","shape":[2],"data_offsets":[0,4]}}',
         "spans 4 bytes but its shape [2] and dtype F32 need 8"),
        (b'{"w": {"dtype":"F4","shape":[3],"data_offsets":[0,2]}}', "need 1.5"),
    ],
)
def test_malformed_headers(tmp_path: Path, header_bytes: bytes, message: str) -> None:
    path = raw_file(tmp_path / "x.safetensors", None, bytes(8), header_bytes=header_bytes)
    error = open_error(path)
    assert message in error.message and str(path) in error.message


def test_offsets_out_of_range(tmp_path: Path) -> None:
    path = raw_file(tmp_path / "x.safetensors", {"w": f32(0, 8, [2])}, bytes(4))
    assert "truncated: tensor 'w' ends at byte" in open_error(path).message


def test_overlapping_tensors(tmp_path: Path) -> None:
    path = raw_file(tmp_path / "x.safetensors", {"a": f32(0, 8, [2]), "b": f32(4, 8, [1])}, bytes(8))
    assert "tensor 'b' at data bytes 4..8 overlaps" in open_error(path).message


def test_gap_between_tensors(tmp_path: Path) -> None:
    path = raw_file(tmp_path / "x.safetensors", {"a": f32(0, 4, [1]), "b": f32(8, 12, [1])}, bytes(12))
    assert "tensor 'b' at data bytes 8..12 follows a gap of 4 bytes" in open_error(path).message


def test_bytes_after_the_last_tensor(tmp_path: Path) -> None:
    path = raw_file(tmp_path / "x.safetensors", {"a": f32(0, 4, [1])}, bytes(6))
    assert "2 bytes follow the last tensor" in open_error(path).message


def test_missing_path_and_empty_directory(tmp_path: Path) -> None:
    assert "cannot read" in open_error(tmp_path / "nothing.safetensors").message
    (tmp_path / "other.safetensors").write_bytes(b"")
    error = open_error(tmp_path)
    assert "holds neither model.safetensors nor model.safetensors.index.json" in error.message
    assert "other.safetensors" in error.hint


def test_directory_with_both_layouts(tmp_path: Path) -> None:
    write_sharded(tmp_path)
    save_file(tensors(), tmp_path / "model.safetensors")
    assert "holds both" in open_error(tmp_path).message


def edit_index(index: Path, change) -> None:
    document = json.loads(index.read_text())
    change(document["weight_map"])
    index.write_text(json.dumps(document))


def test_index_with_a_missing_shard(tmp_path: Path) -> None:
    index = write_sharded(tmp_path)
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    error = open_error(index)
    assert "shard 'model-00002-of-00002.safetensors' is missing" in error.message
    assert str(index) in error.message


def test_index_naming_a_tensor_its_shard_lacks(tmp_path: Path) -> None:
    index = write_sharded(tmp_path)
    edit_index(index, lambda wm: wm.update({"c.weight": "model-00001-of-00002.safetensors"}))
    assert "tensor 'c.weight' is listed in model-00001-of-00002.safetensors but that file does not hold it" \
        in open_error(index).message


def test_tensor_in_two_shards(tmp_path: Path) -> None:
    index = write_sharded(tmp_path)
    first = tmp_path / "model-00001-of-00002.safetensors"
    save_file({"b.weight": torch.zeros(1), "x": torch.zeros(1)}, first)
    edit_index(index, lambda wm: wm.update({"x": "model-00001-of-00002.safetensors"}))
    assert "tensor 'b.weight' is in both" in open_error(index).message


def test_tensor_missing_from_the_index(tmp_path: Path) -> None:
    index = write_sharded(tmp_path)
    edit_index(index, lambda wm: wm.pop("steps"))
    assert "tensor 'steps' in model-00002-of-00002.safetensors is not listed in the index" \
        in open_error(index).message


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"metadata": {}}, "no 'weight_map'"),
        ({"weight_map": {"a": "../model.safetensors"}}, "not a file name"),
        ({"weight_map": {"a": 1}}, "no 'weight_map'"),
    ],
)
def test_malformed_index(tmp_path: Path, document: dict, message: str) -> None:
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps(document))
    assert message in open_error(index).message


def test_a_file_changed_after_opening_fails_on_load(tmp_path: Path) -> None:
    save_file(tensors(), tmp_path / "x.safetensors")
    source = SafetensorsSource.open(tmp_path / "x.safetensors")
    (tmp_path / "x.safetensors").write_bytes(b"gone")
    with pytest.raises(InputError, match="cannot load tensor 'a.weight'"):
        source.load("a.weight")


# -- hostile files and text ---------------------------------------------------------------------------


def _kinds(folder: Path) -> dict[str, Path]:
    """A FIFO, a socket, a character device and a directory, each where a file is expected."""
    import os
    import socket

    os.mkfifo(folder / "fifo")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(folder / "sock"))
    sock.close()
    (folder / "dir").mkdir()
    (folder / "zero").symlink_to("/dev/zero")
    return {"a FIFO": folder / "fifo", "a socket": folder / "sock", "a character device": folder / "zero",
            "a directory": folder / "dir"}


def test_open_regular_refuses_every_other_kind_without_blocking(tmp_path: Path) -> None:
    from qcli.io.files import NotRegularFile, open_regular

    for kind, path in _kinds(tmp_path).items():
        with pytest.raises(NotRegularFile, match=f"not a regular file \\({kind}\\)"):
            open_regular(path)
    (tmp_path / "f").write_bytes(b"abc")
    with open_regular(tmp_path / "f") as file:
        assert file.read() == b"abc"
    with pytest.raises(FileNotFoundError):
        open_regular(tmp_path / "missing")


def test_read_header_refuses_non_regular_files(tmp_path: Path) -> None:
    from qcli.io.safetensors import read_header

    for kind, path in _kinds(tmp_path).items():
        if kind == "a directory":
            continue  # a directory is a checkpoint folder to SafetensorsSource.open
        with pytest.raises(InputError, match=f"not a regular file \\({kind}\\)") as info:
            SafetensorsSource.open(path)
        assert info.value.exit_code == 3 and "regular files" in info.value.hint
        with pytest.raises(InputError, match="not a regular file"):
            read_header(path)


def test_a_directory_whose_model_is_a_fifo(tmp_path: Path) -> None:
    import os

    os.mkfifo(tmp_path / "model.safetensors")
    with pytest.raises(InputError, match="model.safetensors: not a regular file \\(a FIFO\\)"):
        SafetensorsSource.open(tmp_path)


def test_the_source_knows_its_index(tmp_path: Path) -> None:
    save_file({"a": torch.zeros(1)}, tmp_path / "s1.safetensors")
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"a": "s1.safetensors"}}))
    with SafetensorsSource.open(tmp_path) as source:
        assert source.index == index and source.files == [tmp_path / "s1.safetensors"]
    with SafetensorsSource.open(tmp_path / "s1.safetensors") as source:
        assert source.index is None


@pytest.mark.parametrize(
    ("blob", "message"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b'{"w": ' + b"{\"a\": " * 50_000 + b"1" + b"}" * 50_001, "nested too deeply"),
        (b'{"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, ' + b"9" * 4301 + b"]}}", "4300 digits"),
        (b'{"w": {"dtype": "F32", "shape": [' + b"1, " * 10_000 + b'1], "data_offsets": [0, 3]}}', "need 4"),
        (b'{"w": {"dtype": "F4", "shape": [3], "data_offsets": [0, 1]}}', "need 1.5"),
        (b'{"w": {"dtype": "F32", "shape": [' + b"9" * 1000 + b'], "data_offsets": [0, 4]}}', "need 3999"),
        (b'{"w": {"dtype": ' + b"[" * 500 + b"]" * 500 + b', "shape": [1], "data_offsets": [0, 4]}}', "[[[[...]]]]"),
        (b'{"w": {"dtype": "' + b"x" * 100_000 + b'", "shape": [1], "data_offsets": [0, 4]}}', "xxx...xxx"),
        (b'{"\\u001b[2J\\u001b[31m": {"dtype": "F12", "shape": [1], "data_offsets": [0, 4]}}', "'\\x1b[2J\\x1b[31m'"),
        (b'{"' + b"n" * 100_000 + b'": {"dtype": "F12", "shape": [1], "data_offsets": [0, 4]}}', "(100000 characters)"),
    ],
)
def test_hostile_headers_give_one_short_line(tmp_path: Path, blob: bytes, message: str) -> None:
    path = tmp_path / "x.safetensors"
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + bytes(4))
    with pytest.raises(InputError) as info:
        SafetensorsSource.open(path)
    text = info.value.message
    assert message in text and len(text) < 600 and text.isprintable(), text[:300]


def test_printable_escapes_what_breaks_a_line_or_drives_a_terminal() -> None:
    from qcli.text import printable

    assert printable("model.layers.0.weight é ü 中") == "model.layers.0.weight é ü 中"
    assert printable("a\x1b[31mb\nc\td\re\x7f\x85\u2028\u202e\x00") == (
        "a\\x1b[31mb\\nc\\td\\re\\x7f\\x85\\u2028\\u202e\\x00")
    assert printable("a\u00a0b") == "a\u00a0b"  # a no-break space is shown as it is
    assert len(printable("\x1b\n").splitlines()) == 1


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs Linux's /proc/self/maps")
def test_loading_keeps_nothing_of_the_file_mapped(small_checkpoint: Path) -> None:
    # Each tensor is read into memory of its own: a model larger than memory is never resident through a
    # mapping of its file while tensors are loaded one after another.
    with SafetensorsSource.open(small_checkpoint) as source:
        loaded = [source.load(info.name) for info in source.infos()]
        maps = Path("/proc/self/maps").read_text()
    assert loaded and str(small_checkpoint.resolve()) not in maps
