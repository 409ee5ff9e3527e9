"""The catalogue of broken inputs, each run through the real CLI (docs/reliability.md lists it).

Every case must end with its exit code (3 input, 2 recipe), one `error:` line naming the file, the
tensor where there is one, and the problem, a `hint:` line, no traceback, and nothing written: the
output path does not exist and no temporary file is left beside it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import cbor2
import pytest
import torch
from safetensors.torch import save_file

from qcli.io.burnpack import data_section_start
from tests.cli_support import DRY_RUN_TARGET, SAMPLES, SINGLE, Result, assert_user_error, cli, cli_subprocess
from tests.gguf_support import gstr, header, tensor
from tests.hang_support import never_hangs


@dataclass(frozen=True)
class Case:
    id: str
    make: Callable[[Path], list[str | Path]]  # builds the input in a folder, returns the CLI arguments
    code: int
    needles: tuple[str, ...]  # what the error line must say, the file's name included


# -- safetensors -----------------------------------------------------------------------------------


def st_file(folder: Path, header: object, data: bytes = b"", *, raw: bytes | None = None) -> Path:
    blob = raw if raw is not None else json.dumps(header).encode()
    path = folder / "in.safetensors"
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + data)
    return path


def quantize(path: Path) -> list[str | Path]:
    return ["quantize", path, "-o", path.parent / "out.bpk", "--device", "cpu"]


def f32(begin: int, end: int, shape: list[int]) -> dict:
    return {"dtype": "F32", "shape": shape, "data_offsets": [begin, end]}


def empty_file(folder: Path) -> list[str | Path]:
    (folder / "in.safetensors").write_bytes(b"")
    return quantize(folder / "in.safetensors")


def short_prefix(folder: Path) -> list[str | Path]:
    (folder / "in.safetensors").write_bytes(b"\x10\x00\x00")
    return quantize(folder / "in.safetensors")


def cut_header(folder: Path) -> list[str | Path]:
    blob = json.dumps({"w": f32(0, 16, [2, 2])}).encode()
    (folder / "in.safetensors").write_bytes(struct.pack("<Q", len(blob)) + blob[:20])
    return quantize(folder / "in.safetensors")


def length_past_end(folder: Path) -> Path:
    path = folder / "in.safetensors"
    path.write_bytes(struct.pack("<Q", 1_000_000) + b"{}")
    return path


def nan_weights(folder: Path) -> list[str | Path]:
    weight = torch.randn(64, 64)
    weight[3, 5] = float("nan")
    save_file({"layer.weight": weight}, folder / "in.safetensors")
    return quantize(folder / "in.safetensors")


def inf_weights(folder: Path) -> list[str | Path]:
    weight = torch.randn(64, 64)
    weight[0, 0] = float("-inf")
    save_file({"layer.weight": weight}, folder / "in.safetensors")
    return quantize(folder / "in.safetensors")


def sharded(folder: Path, change: Callable[[Path, dict], None]) -> list[str | Path]:
    save_file({"a.weight": torch.zeros(2, 2)}, folder / "s1.safetensors")
    save_file({"b.weight": torch.zeros(2, 2)}, folder / "s2.safetensors")
    weight_map = {"a.weight": "s1.safetensors", "b.weight": "s2.safetensors"}
    change(folder, weight_map)
    index = folder / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": weight_map}))
    return ["quantize", index, "-o", folder / "out.bpk", "--device", "cpu"]


def missing_shard(folder: Path, weight_map: dict) -> None:
    (folder / "s2.safetensors").unlink()


def tensor_in_two_shards(folder: Path, weight_map: dict) -> None:
    save_file({"a.weight": torch.zeros(2, 2), "b.weight": torch.zeros(2, 2)}, folder / "s2.safetensors")


SAFETENSORS = [
    Case("st-empty-file", empty_file, 3, ("in.safetensors", "not a safetensors file: 0 bytes")),
    Case("st-truncated-length", short_prefix, 3, ("in.safetensors", "shorter than the 8-byte length")),
    Case(
        "st-truncated-header",
        cut_header,
        3,
        ("in.safetensors", "header length 65 is larger than the file (28 bytes)"),
    ),
    Case(
        "st-header-length-past-the-end",
        lambda f: quantize(length_past_end(f)),
        3,
        ("in.safetensors", "header length 1000000 is larger than the file"),
    ),
    Case(
        "st-invalid-json",
        lambda f: quantize(st_file(f, None, raw=b'{"w": ')),
        3,
        ("in.safetensors", "the JSON header does not parse"),
    ),
    Case(
        "st-offsets-out-of-range",
        lambda f: quantize(st_file(f, {"w": f32(0, 16, [2, 2])}, bytes(8))),
        3,
        ("in.safetensors", "truncated: tensor 'w' ends at byte"),
    ),
    Case(
        "st-offsets-overlap",
        lambda f: quantize(st_file(f, {"a": f32(0, 16, [2, 2]), "b": f32(8, 24, [2, 2])}, bytes(24))),
        3,
        ("in.safetensors", "tensor 'b' at data bytes 8..24 overlaps the tensor before it"),
    ),
    Case(
        "st-offsets-disagree-with-shape",
        lambda f: quantize(st_file(f, {"w": f32(0, 12, [2, 2])}, bytes(12))),
        3,
        ("in.safetensors", "tensor 'w' spans 12 bytes but its shape [2, 2] and dtype F32 need 16"),
    ),
    Case(
        "st-unknown-dtype",
        lambda f: quantize(
            st_file(f, {"w": {"dtype": "F12", "shape": [1], "data_offsets": [0, 4]}}, bytes(4))
        ),
        3,
        ("in.safetensors", "tensor 'w' has the unknown dtype 'F12'"),
    ),
    Case(
        "st-duplicate-names",
        lambda f: quantize(
            st_file(
                f,
                None,
                bytes(8),
                raw=b'{"w": {"dtype": "F32", "shape": [1], "data_offsets": '
                b'[0, 4]}, "w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}',
            )
        ),
        3,
        ("in.safetensors", "'w' appears twice"),
    ),
    Case(
        "st-non-utf8-name",
        lambda f: quantize(
            st_file(
                f, None, bytes(4), raw=b'{"w\xff": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}'
            )
        ),
        3,
        ("in.safetensors", "not UTF-8"),
    ),
    Case(
        "st-surrogate-name",
        lambda f: quantize(
            st_file(
                f, None, bytes(4), raw=b'{"\\udc80": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}'
            )
        ),
        3,
        ("in.safetensors", "is not valid UTF-8"),
    ),
    Case(
        "st-empty-name",
        lambda f: quantize(st_file(f, {"": f32(0, 4, [1])}, bytes(4))),
        3,
        ("in.safetensors", "a tensor has an empty name"),
    ),
    Case(
        "st-index-missing-shard",
        lambda f: sharded(f, missing_shard),
        3,
        ("model.safetensors.index.json", "shard 's2.safetensors' is missing"),
    ),
    Case(
        "st-index-tensor-in-two-shards",
        lambda f: sharded(f, tensor_in_two_shards),
        3,
        ("model.safetensors.index.json", "tensor 'a.weight' is in both s1.safetensors and s2.safetensors"),
    ),
    Case("st-nan-values", nan_weights, 3, ("in.safetensors: tensor 'layer.weight'", "NaN or Inf")),
    Case("st-inf-values", inf_weights, 3, ("in.safetensors: tensor 'layer.weight'", "NaN or Inf")),
]


# -- burnpack --------------------------------------------------------------------------------------


def bpk(
    folder: Path,
    metadata: object = None,
    data: bytes = b"",
    *,
    blob: bytes | None = None,
    version: int = 1,
    size: int | None = None,
) -> list[str | Path]:
    blob = blob if blob is not None else cbor2.dumps(metadata)
    head = struct.pack("<IHI", 0x4255524E, version, len(blob)) + blob
    path = folder / "in.bpk"
    path.write_bytes(head + bytes(data_section_start(len(blob)) - len(head)) + data)
    if size is not None:
        with open(path, "r+b") as file:  # sparse: the bytes are never written
            file.truncate(size)
    return ["inspect", path]


def descriptor(start: int, end: int, shape: list[int], dtype: object = "F32") -> dict:
    return {"dtype": dtype, "shape": shape, "data_offsets": [start, end]}


def gguf_file(content: bytes) -> Callable[[Path], list[str | Path]]:
    def make(folder: Path) -> list[str | Path]:
        (folder / "in.gguf").write_bytes(content)
        return quantize(folder / "in.gguf")

    return make


GGUF = [
    Case("gguf-empty-file", gguf_file(b""), 3, ("in.gguf", "truncated: the magic at byte 0 needs 4 bytes")),
    Case("gguf-bad-magic", gguf_file(b"GGML" + bytes(20)), 3, ("in.gguf", "not a GGUF file: it starts with b'GGML'")),
    Case("gguf-version-1", gguf_file(b"GGUF" + struct.pack("<I", 1) + bytes(16)), 3, ("in.gguf", "GGUF version 1")),
    Case("gguf-big-endian", gguf_file(b"GGUF" + struct.pack(">I", 3) + bytes(16)), 3, ("in.gguf", "big-endian")),
    Case("gguf-truncated-metadata", gguf_file(header(kv_count=1, kv=gstr("general.name") + struct.pack("<IQ", 8, 40))),
         3, ("in.gguf", "truncated: the value of 'general.name'")),
    Case("gguf-unknown-type", gguf_file(header(tensor_count=1, tensors=tensor("w", (4,), 99))), 3,
         ("in.gguf", "tensor 'w' has the unknown ggml type 99")),
    Case("gguf-partial-block", gguf_file(header(tensor_count=1, tensors=tensor("w", (48, 2), 8))), 3,
         ("in.gguf", "tensor 'w' (Q8_0) has rows of 48 values")),
    Case("gguf-tensor-past-the-end", gguf_file(header(tensor_count=1, tensors=tensor("w", (4,)), data=bytes(8))), 3,
         ("in.gguf", "truncated: tensor 'w' ends at byte 80 but the file has 72 bytes")),
    Case("gguf-split", gguf_file(header(kv_count=1, kv=gstr("split.count") + struct.pack("<IH", 2, 3))), 3,
         ("in.gguf", "one of 3 split GGUF files")),
]


Q4S_B4 = {
    "QFloat": {
        "value": "Q4S",
        "store": {"PackedU32": 0},
        "mode": "Symmetric",
        "tensor": None,
        "block": {"size": {"storage": [4, 1, 1, 1, 1], "len": 1}, "dtype": "F16"},
    }
}
TEN_GIB = 10 * 1024**3

BURNPACK = [
    Case(
        "bpk-bad-magic",
        lambda f: (f.joinpath("in.bpk").write_bytes(b"PK\x03\x04" + bytes(300)), ["inspect", f / "in.bpk"])[
            1
        ],
        3,
        ("in.bpk", "not a burnpack file: it starts with 504b0304"),
    ),
    Case(
        "bpk-short",
        lambda f: (f.joinpath("in.bpk").write_bytes(b"NRUB"), ["inspect", f / "in.bpk"])[1],
        3,
        ("in.bpk", "shorter than the 10-byte header"),
    ),
    Case(
        "bpk-version-2",
        lambda f: bpk(f, {"tensors": {}}, version=2),
        3,
        ("in.bpk", "burnpack version 2 is newer than the supported version 1"),
    ),
    Case(
        "bpk-metadata-too-large",
        lambda f: (
            f.joinpath("in.bpk").write_bytes(struct.pack("<IHI", 0x4255524E, 1, 200 * 1024**2)),
            ["inspect", f / "in.bpk"],
        )[1],
        3,
        ("in.bpk", "metadata size 209715200 bytes exceeds the maximum of 104857600"),
    ),
    Case(
        "bpk-metadata-truncated",
        lambda f: (
            f.joinpath("in.bpk").write_bytes(struct.pack("<IHI", 0x4255524E, 1, 500) + b"\xa1"),
            ["inspect", f / "in.bpk"],
        )[1],
        3,
        ("in.bpk", "the header announces 500 bytes of metadata"),
    ),
    Case(
        "bpk-metadata-not-cbor",
        lambda f: bpk(f, blob=b"\xff\xfe"),
        3,
        ("in.bpk", "metadata is not valid CBOR"),
    ),
    Case(
        "bpk-recursion-too-deep",
        lambda f: bpk(f, blob=b"\xa1\x67tensors" + b"\x81" * 128 + b"\x00"),
        3,
        ("in.bpk", "maximum container nesting depth (128) exceeded"),
    ),
    Case(
        "bpk-too-many-tensors",
        lambda f: bpk(f, {"tensors": {f"t{i}": descriptor(0, 0, [0]) for i in range(100_001)}}),
        3,
        ("in.bpk", "file contains 100001 tensors, exceeding the maximum of 100000"),
    ),
    Case(
        "bpk-truncated-data",
        lambda f: bpk(f, {"tensors": {"w": descriptor(0, 16, [4])}}, bytes(10)),
        3,
        ("in.bpk", "truncated: tensor 'w' ends at byte 272 but the file has 266 bytes"),
    ),
    Case(
        "bpk-end-before-start",
        lambda f: bpk(f, {"tensors": {"w": descriptor(16, 8, [2])}}, bytes(16)),
        3,
        ("in.bpk", "tensor 'w' has corrupted offset data: end 8 < start 16"),
    ),
    Case(
        "bpk-tensor-over-10-gib",
        lambda f: bpk(
            f, {"tensors": {"w": descriptor(0, TEN_GIB + 4, [TEN_GIB // 4 + 1])}}, size=256 + TEN_GIB + 4
        ),
        3,
        ("in.bpk", "tensor 'w' has 10737418244 bytes, exceeding the maximum of 10737418240"),
    ),
    Case(
        "bpk-file-over-100-gib",
        lambda f: bpk(f, {"tensors": {}}, size=100 * 1024**3 + 1),
        3,
        ("in.bpk", "file size 107374182401 bytes exceeds the maximum of 107374182400"),
    ),
    Case(
        "bpk-qfloat-wrong-length",
        lambda f: bpk(f, {"tensors": {"layer.weight": descriptor(0, 12, [2, 8], Q4S_B4)}}, bytes(12)),
        3,
        (
            "in.bpk",
            "tensor 'layer.weight' spans 12 bytes but its shape [2, 8] and dtype QFloat(Q4S",
            "need 16",
        ),
    ),
]


# -- recipes ---------------------------------------------------------------------------------------


def recipe(text: str) -> Callable[[Path], list[str | Path]]:
    def make(folder: Path) -> list[str | Path]:
        (folder / "r.toml").write_text(text)
        return [
            "quantize",
            SINGLE,
            "--recipe",
            folder / "r.toml",
            "-o",
            folder / "out.bpk",
            "--device",
            "cpu",
        ]

    return make


RULE = 'version = 1\n[[rule]]\nmatch = "*.weight"\n'
RECIPES = [
    Case(
        "recipe-toml-syntax", recipe('version = 1\n[[rule]]\nmatch = "*\n'), 2, ("r.toml:3:", "invalid TOML")
    ),
    Case(
        "recipe-unknown-key",
        recipe(RULE + 'value = "Q4S"\nblok = [32]\nblock_scale = "F16"\n'),
        2,
        ("r.toml:5:", "unknown key 'blok'"),
    ),
    Case("recipe-wrong-type", recipe(RULE + "value = 4\n"), 2, ("r.toml:4:", "value")),
    Case("recipe-unknown-value", recipe(RULE + 'value = "Q3S"\n'), 2, ("r.toml:4:", "Q3S")),
    Case(
        "recipe-unknown-store", recipe(RULE + 'value = "Q4S"\nstore = "Packed"\n'), 2, ("r.toml:5:", "Packed")
    ),
    Case(
        "recipe-unknown-scale",
        recipe(RULE + 'value = "Q4S"\nblock = [32]\nblock_scale = "FP16"\n'),
        2,
        ("r.toml:6:", "FP16"),
    ),
    Case(
        "recipe-block-rank-6",
        recipe(RULE + 'value = "Q8S"\nblock = [2, 2, 2, 2, 2, 2]\nblock_scale = "F16"\n'),
        2,
        ("r.toml:5:", "block"),
    ),
    Case(
        "recipe-block-extent-0",
        recipe(RULE + 'value = "Q8S"\nblock = [0]\nblock_scale = "F16"\n'),
        2,
        ("r.toml:5:", "block"),
    ),
]


@pytest.mark.parametrize("case", SAFETENSORS + GGUF + BURNPACK + RECIPES, ids=lambda c: c.id)
def test_catalogue(case: Case, tmp_path: Path) -> None:
    args = case.make(tmp_path)
    before = {p.name for p in tmp_path.iterdir()}
    lines = assert_user_error(cli(*args), case.code)
    for needle in case.needles:
        assert needle in lines[0], (needle, lines)
    assert len(lines) == 2, lines  # one error line, one hint line
    assert {p.name for p in tmp_path.iterdir()} == before  # no output, no temporary file
    for path in tmp_path.iterdir():
        if path.stat().st_size > 1024**3:
            path.unlink()  # a sparse giant: leave nothing large behind


def test_keep_is_the_documented_way_past_nan(tmp_path: Path) -> None:
    args = nan_weights(tmp_path)
    lines = assert_user_error(cli(*args), 3)
    assert "keep = true" in lines[-1]
    (tmp_path / "keep.toml").write_text('version = 1\n[[rule]]\nmatch = "layer.weight"\nkeep = true\n')
    assert cli(*args, "--recipe", tmp_path / "keep.toml").code == 0
    assert (tmp_path / "out.bpk").exists()


@pytest.mark.parametrize("case", [SAFETENSORS[0], BURNPACK[0], RECIPES[0]], ids=lambda c: c.id)
def test_catalogue_from_a_fresh_interpreter(case: Case, tmp_path: Path) -> None:
    """The same answers from `python -m qcli`, as a user's shell runs it."""
    args = case.make(tmp_path)
    before = {p.name for p in tmp_path.iterdir()}
    lines = assert_user_error(cli_subprocess(*args), case.code)
    assert all(needle in lines[0] for needle in case.needles) and len(lines) == 2
    assert {p.name for p in tmp_path.iterdir()} == before


# -- hostile input, round two: non-regular files, nesting, shared references, huge numbers --------------
#
# Each case must also end: before these were fixed, several blocked forever (a FIFO, /dev/zero), recursed
# out of the interpreter's stack, or ran for hours (CBOR shared references, colliding map keys, a
# backtracking line scanner). `never_hangs` turns a hang in Python code (a blocked open or read) into a
# failure; one inside C (sre backtracking, cbor2 hashing a key) cannot be interrupted, and needs the runner's
# own timeout. How long each refusal takes is bench/hostile.py's (docs/benchmarks.md).


def ended_cli(*args: str | Path) -> Result:
    with never_hangs():
        return cli(*args)


def fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def char_device(path: Path) -> Path:
    """A copy of /dev/null's device node at `path`: an output test must never risk the real one."""
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except (PermissionError, AttributeError):
        pytest.skip("creating a device node needs CAP_MKNOD")
    return path


def shards_with(folder: Path, second: Callable[[Path], object]) -> Path:
    """An index naming s1 (a real shard) and s2, which `second` makes."""
    save_file({"a.weight": torch.zeros(2, 2)}, folder / "s1.safetensors")
    second(folder / "s2.safetensors")
    index = folder / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"a.weight": "s1.safetensors", "b.weight": "s2.safetensors"}}))
    return index


def nested_json(depth: int) -> bytes:
    return b'{"w": ' + b"[" * depth + b"]" * depth + b"}"


def shared_cbor(levels: int = 60) -> bytes:
    """Tag 28 marks a value shareable, tag 29 n refers to the n-th: each level is a pair of references
    to the level before, so `levels` levels of a few bytes each describe 2**levels leaves."""
    parts = [b"\xd8\x1c\x82\x01\x01"]
    for i in range(1, levels):
        ref = b"\xd8\x1d\x18" + bytes([i - 1])
        parts.append(b"\xd8\x1c\x82" + ref + ref)
    return bytes([0x98, levels]) + b"".join(parts)


def cbor_text(text: str) -> bytes:
    return cbor2.dumps(text)


def bpk_shared_shape(folder: Path) -> list[str | Path]:
    blob = (b"\xa1" + cbor_text("tensors") + b"\xa1" + cbor_text("w") + b"\xa3" + cbor_text("dtype")
            + cbor_text("F32") + cbor_text("shape") + shared_cbor() + cbor_text("data_offsets") + b"\x82\x00\x00")
    return bpk(folder, blob=blob)


def bpk_shared_key(folder: Path) -> list[str | Path]:
    # a map key: cbor2 hashes the 2**60-leaf tuple while decoding
    return bpk(folder, blob=b"\xa1" + shared_cbor() + b"\x00")


def bpk_colliding_keys(folder: Path, n: int = 40_000) -> list[str | Path]:
    # integers k * (2**61 - 1) all hash to 0 in Python: inserting n of them takes n**2 / 2 probes
    keys = b"".join(cbor2.dumps(k * (2**61 - 1)) + b"\x00" for k in range(1, n + 1))
    return bpk(folder, blob=b"\xa1" + cbor_text("tensors") + b"\xb9" + n.to_bytes(2, "big") + keys)


def recipe_file(folder: Path, text: str | bytes) -> Path:
    path = folder / "r.toml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def quantize_with_recipe(path: Path) -> list[str | Path]:
    return ["quantize", SINGLE, "--recipe", path, "-o", path.parent / "out.bpk", "--device", "cpu"]


HEADER_100K = '["' + " " * 100_000 + '!"]'  # valid TOML: a table named by a quoted key

HOSTILE = [
    # non-regular files where a file is read (exit 3 for inputs, 2 for a recipe)
    Case("st-input-fifo", lambda f: quantize(fifo(f / "in.safetensors")), 3,
         ("in.safetensors", "not a regular file (a FIFO)")),
    Case("st-input-dev-zero", lambda f: ["quantize", "/dev/zero", "-o", f / "out.bpk", "--device", "cpu"], 3,
         ("/dev/zero", "not a regular file (a character device)")),
    Case("st-input-dev-null", lambda f: ["quantize", "/dev/null", "-o", f / "out.bpk", "--device", "cpu"], 3,
         ("/dev/null", "not a regular file (a character device)")),
    Case("st-index-fifo", lambda f: ["quantize", fifo(f / "model.safetensors.index.json"), "-o", f / "out.bpk"], 3,
         ("model.safetensors.index.json", "not a regular file (a FIFO)")),
    Case("st-index-shard-fifo", lambda f: ["quantize", shards_with(f, fifo), "-o", f / "out.bpk"], 3,
         ("model.safetensors.index.json", "shard 's2.safetensors' is not a regular file (a FIFO)")),
    Case("st-index-shard-dev-zero",
         lambda f: ["quantize", shards_with(f, lambda p: p.symlink_to("/dev/zero")), "-o", f / "out.bpk"], 3,
         ("model.safetensors.index.json", "shard 's2.safetensors' is not a regular file (a character device)")),
    Case("inspect-fifo-bpk", lambda f: ["inspect", fifo(f / "in.bpk")], 3, ("in.bpk", "not a regular file (a FIFO)")),
    Case("inspect-fifo-safetensors", lambda f: ["inspect", fifo(f / "in.safetensors")], 3,
         ("in.safetensors", "not a regular file (a FIFO)")),
    Case("inspect-dev-zero", lambda f: ["inspect", "/dev/zero"], 3,
         ("/dev/zero", "not a regular file (a character device)")),
    Case("inspect-compare-fifo", lambda f: (
        cli("quantize", SINGLE, "-o", f / "m.bpk", "--device", "cpu", "--no-verify", "--no-stats"),
        ["inspect", f / "m.bpk", "--compare", fifo(f / "src.safetensors")])[1], 3,
         ("src.safetensors", "not a regular file (a FIFO)")),
    Case("recipe-fifo", lambda f: quantize_with_recipe(fifo(f / "r.toml")), 2,
         ("r.toml", "not a regular file (a FIFO)")),
    Case("recipe-fifo-validate", lambda f: ["validate-scheme", fifo(f / "r.toml")], 2,
         ("r.toml", "not a regular file (a FIFO)")),
    Case("recipe-dev-zero", lambda f: ["quantize", SINGLE, "--recipe", "/dev/zero", "-o", f / "out.bpk"], 2,
         ("/dev/zero", "not a regular file (a character device)")),
    Case("recipe-dev-zero-validate", lambda f: ["validate-scheme", "/dev/zero"], 2,
         ("/dev/zero", "not a regular file (a character device)")),
    # outputs: never over a device, never over an input (exit 2, before anything is written)
    Case("out-device-force", lambda f: ["quantize", SINGLE, "-o", char_device(f / "out.bpk"), "--force", "--device",
                                        "cpu"], 2, ("out.bpk", "is not a regular file (a character device)")),
    Case("out-fifo-force", lambda f: ["quantize", SINGLE, "-o", fifo(f / "out.bpk"), "--force", "--device", "cpu"], 2,
         ("out.bpk", "is not a regular file (a FIFO)")),
    Case("out-is-the-index", lambda f: (
        shards_with(f, lambda p: save_file({"b.weight": torch.zeros(2, 2)}, p)),
        ["quantize", f, "-o", f / "model.safetensors.index.json", "--force", "--device", "cpu"])[1], 2,
         ("model.safetensors.index.json is the input's index",)),
    Case("out-is-the-recipe", lambda f: [
        "quantize", SINGLE, "--recipe", recipe_file(f, RULE + "keep = true\n"), "-o", f / "r.toml", "--force",
        "--device", "cpu"], 2, ("r.toml is the recipe",)),
    # nesting and numbers past what a parser's stack or int can take (exit 3 / 2)
    Case("st-json-nested-100k", lambda f: quantize(st_file(f, None, raw=nested_json(100_000))), 3,
         ("in.safetensors", "the JSON header is nested too deeply")),
    Case("st-index-nested-100k", lambda f: (
        (f / "model.safetensors.index.json").write_bytes(nested_json(100_000)),
        ["quantize", f / "model.safetensors.index.json", "-o", f / "out.bpk"])[1], 3,
         ("model.safetensors.index.json", "the index is nested too deeply")),
    Case("st-json-integer-5000-digits", lambda f: quantize(st_file(
        f, None, bytes(4), raw=b'{"w": {"dtype": "F32", "shape": [' + b"7" * 5000 + b'], "data_offsets": [0, 4]}}')),
         3, ("in.safetensors", "the JSON header holds an integer of more than 4300 digits")),
    Case("st-json-integer-400-digits", lambda f: quantize(st_file(
        f, None, bytes(4), raw=b'{"w": {"dtype": "F32", "shape": [' + b"7" * 400 + b'], "data_offsets": [0, 4]}}')),
         3, ("in.safetensors", "tensor 'w' spans 4 bytes but its shape [777", "need 3111")),
    Case("bpk-cbor-shared-references", bpk_shared_shape, 3,
         ("in.bpk", "metadata holds CBOR tag 28 (a shared value), which burnpack metadata never uses")),
    Case("bpk-cbor-shared-map-key", bpk_shared_key, 3, ("in.bpk", "metadata holds CBOR tag 28")),
    Case("bpk-cbor-colliding-keys", bpk_colliding_keys, 3, ("in.bpk", "metadata is not valid CBOR", "map key")),
    # JSON inside burnpack metadata (`inspect --compare` reads 'transposed'): bounded before json recurses
    *(Case(f"bpk-metadata-json-{name}", lambda f, text=text: [
        *bpk(f, {"tensors": {}, "metadata": {"transposed": text}}), "--compare", SINGLE], 3, ("in.bpk", *needles))
      for name, text, needles in (
          ("nested-100k", "[" * 100_000 + "]" * 100_000, ("'transposed' holds JSON nested 100000 deep, past the 32",)),
          ("nested-33", "[" * 33 + "]" * 33, ("nested 33 deep",)),
          ("17-mib", '["' + "a" * 17 * 1024**2 + '"]', ("'transposed' holds 17825796 characters, more than",)),
          ("integer-5000-digits", "[" + "7" * 5000 + "]", ("'transposed' is not valid JSON", "4300 digits")),
          ("not-json", "[x", ("'transposed' is not valid JSON",)),
          ("not-a-list", '{"a": "b"}', ("'transposed' is not a JSON list of tensor names",)))),
    Case("recipe-toml-nested-100k", lambda f: quantize_with_recipe(
        recipe_file(f, "version = 1\nx = " + "[" * 100_000 + "]" * 100_000 + "\n")), 2,
         ("r.toml:2:", "nested too deeply")),
    Case("recipe-toml-integer-5000-digits", lambda f: quantize_with_recipe(
        recipe_file(f, RULE + "value = \"Q4S\"\nblock = [" + "3" * 5000 + "]\n")), 2,
         ("r.toml:5:", "an integer of more than 4300 digits")),
    Case("recipe-store-5000-digits", lambda f: quantize_with_recipe(
        recipe_file(f, RULE + f'value = "Q4S"\nstore = "PackedU32({"9" * 5000})"\n')), 2,
         ("r.toml:5:", "unknown store 'PackedU32(9999")),
    Case("recipe-line-100kb", lambda f: quantize_with_recipe(recipe_file(f, "version = 1\n" + HEADER_100K + "\n")), 2,
         ("r.toml:2:", "unknown key")),
    Case("recipe-regex-too-complex", lambda f: quantize_with_recipe(
        recipe_file(f, 'version = 1\n[[rule]]\nmatch = "re:(a{100}){100}"\nkeep = true\n')), 2,
         ("r.toml:3:", "invalid regular expression 're:(a{100}){100}': invalid repetition size")),
    Case("recipe-regex-lookahead", lambda f: quantize_with_recipe(
        recipe_file(f, 'version = 1\n[[rule]]\nkeep = true\nmatch = "re:(?!.*norm).*"\n')), 2,
         ("r.toml:4:", "invalid regular expression 're:(?!.*norm).*': invalid perl operator: (?!")),
    # numbers on the command line
    *(Case(f"max-shard-size-{text}", lambda f, text=text: [*quantize(SINGLE), "--max-shard-size", text], 2,
           (f"--max-shard-size '{text}' is not a size",)) for text in ("inf", "1e400", "nan", "-inf", "1e400GB")),
    # control characters: escaped, so the error stays one line and the terminal is not driven
    Case("st-escape-in-name", lambda f: quantize(st_file(f, {"\x1b[31mw": {"dtype": "F12", "shape": [1],
                                                                            "data_offsets": [0, 4]}}, bytes(4))), 3,
         ("in.safetensors", "tensor '\\x1b[31mw' has the unknown dtype 'F12'")),
    Case("path-with-newline", lambda f: quantize(st_file(f, None, raw=b"{").rename(f / "a\nb.safetensors")), 3,
         ("a\\nb.safetensors", "the JSON header does not parse")),
    Case("bpk-escape-in-tensor-name", lambda f: bpk(f, {"tensors": {"\x1b]0;owned\x07": descriptor(0, 4, [9])}},
                                                       bytes(4)), 3,
         ("in.bpk", "tensor '\\x1b]0;owned\\x07' spans 4 bytes")),
]


@pytest.mark.parametrize("case", HOSTILE, ids=lambda c: c.id)
def test_hostile(case: Case, tmp_path: Path) -> None:
    args = case.make(tmp_path)
    before = {p.name for p in tmp_path.iterdir()}
    result = ended_cli(*args)
    lines = assert_user_error(result, case.code)
    for needle in case.needles:
        assert needle in lines[0], (needle, lines)
    assert len(lines) == 2, lines
    assert "\x1b" not in result.err and "\x07" not in result.err
    assert {p.name for p in tmp_path.iterdir()} == before


def test_a_device_is_still_a_device_after_force(tmp_path: Path) -> None:
    device = char_device(tmp_path / "null")
    assert_user_error(ended_cli("quantize", SINGLE, "-o", device, "--force", "--device", "cpu"), 2)
    assert stat.S_ISCHR(os.stat(device).st_mode)
    assert_user_error(ended_cli("quantize", SINGLE, "-o", device, "--force", "--max-shard-size", "300KB"), 2)
    assert stat.S_ISCHR(os.stat(device).st_mode)


def test_validate_scheme_model_fifo(tmp_path: Path) -> None:
    (tmp_path / "r.toml").write_text(RULE + "keep = true\n")
    result = ended_cli("validate-scheme", tmp_path / "r.toml", "--model", fifo(tmp_path / "m.safetensors"))
    assert "not a regular file (a FIFO)" in assert_user_error(result, 3)[0]


def test_long_output_name_gets_a_short_temporary_name(tmp_path: Path) -> None:
    """254 bytes is a legal name; `.NAME.PID-N.tmp` would be 270, so the writer shortens it."""
    target = tmp_path / ("m" * 250 + ".bpk")
    result = ended_cli("quantize", SINGLE, "-o", target, "--device", "cpu", "--no-stats")
    assert result.code == 0, result.err
    assert [p.name for p in tmp_path.iterdir()] == [target.name]


def test_recipe_with_a_byte_order_mark(tmp_path: Path) -> None:
    path = recipe_file(tmp_path, b"\xef\xbb\xbf" + (SAMPLES / "tiny-llama.toml").read_bytes())
    result = ended_cli("quantize", SINGLE, "-o", DRY_RUN_TARGET, "--recipe", path, "--dry-run", "--json")
    assert result.code == 0, result.err
    assert result.json["recipe_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()


def catastrophic_names(folder: Path) -> Path:
    names = ["model.layers.10.mlp.down_proj.weight", "model.layers.10.self_attn.q_proj.weight",
             "model." * 40 + "norm", "a" * 5000 + "!", "a." * 20_000 + "x", "x" * 200]
    save_file({name: torch.zeros(2) for name in names}, folder / "m.safetensors")
    return folder / "m.safetensors"


@pytest.mark.parametrize("pattern", [r"(a+)+$", r"(.*\\.)*mlp\\..*", r"(a|a)*$", r"(\\w+\\.?)*$",
                                     r".*\\.mlp\\..*weight", r"(.*a){20}", r"(x+x+)+y"])
def test_catastrophic_patterns_match_and_end(tmp_path: Path, pattern: str) -> None:
    """Patterns that make a backtracking engine take exponential (or quadratic) time on these names: the
    short names match as `re` says (that RE2 runs in linear time is tests/plan/test_recipe.py's)."""
    model = catastrophic_names(tmp_path)
    recipe = recipe_file(tmp_path, f'version = 1\n[[rule]]\nmatch = "re:{pattern}"\nkeep = true\n'
                         '[[rule]]\nmatch = "*"\nkeep = true\n')
    result = ended_cli("quantize", model, "--recipe", recipe, "--dry-run", "--json")
    assert result.code == 0, result.err
    regex = pattern.replace("\\\\", "\\")  # the TOML string's escapes undone
    expected = {t["name"] for t in result.json["tensors"] if len(t["name"]) < 100 and re.fullmatch(regex, t["name"])}
    matched = {t["name"] for t in result.json["tensors"] if "r.toml:2" in t["reason"]}
    assert {n for n in matched if len(n) < 100} == expected


def test_bool_tensors_of_every_store_inspect(tmp_path: Path) -> None:
    from qcli.io.burnpack import BurnpackWriter, TensorEntry
    from qcli.io.dtypes import Bool, BoolStore

    for store, payload in (("U32", struct.pack("<4I", 1, 0, 7, 1)), ("U8", bytes([1, 0, 2, 1])),
                           ("Native", bytes([1, 0, 1, 1]))):
        path = tmp_path / f"{store}.bpk"
        with BurnpackWriter(path, [TensorEntry("mask", Bool(BoolStore(store)), (2, 2), len(payload))]) as writer:
            writer.write("mask", payload)
            writer.commit()
        result = ended_cli("inspect", path, "--tensor", "mask", "--json")
        assert result.code == 0, (store, result.err)
        values = result.json["tensor_stats"]["values"]
        assert (values["min"], values["max"], values["mean"]) == (0.0, 1.0, 0.75), store


def test_escape_sequences_in_tables(tmp_path: Path) -> None:
    save_file({"\x1b[31mred": torch.zeros(2)}, tmp_path / "m.safetensors")
    for args in (("inspect", tmp_path / "m.safetensors"), ("quantize", tmp_path / "m.safetensors", "--dry-run")):
        result = cli(*args)
        assert result.code == 0 and "\x1b" not in result.out and "\\x1b[31mred" in result.out


def test_f64_beyond_the_float32_range(tmp_path: Path) -> None:
    weight = torch.randn(64, 64, dtype=torch.float64)
    weight[1, 1] = 1e300
    save_file({"layer.weight": weight}, tmp_path / "in.safetensors")
    lines = assert_user_error(cli(*quantize(tmp_path / "in.safetensors")), 3)
    assert "beyond the float32 range" in lines[0] and "NaN" not in lines[0]


def test_an_output_shard_that_is_an_input(tmp_path: Path) -> None:
    """`-o model.bpk --max-shard-size` writes model-00001-of-0000N.bpk: that name may be an input too."""
    import shutil

    probe = cli("quantize", SINGLE, "-o", tmp_path / "model.bpk", "--max-shard-size", "300KB", "--dry-run", "--json")
    first = Path(probe.json["outputs"][0])
    assert len(probe.json["outputs"]) > 1
    shutil.copy(SINGLE, first)  # the checkpoint, saved under the name of the first output shard
    given = tmp_path / "checkpoint.safetensors"  # and given by another name (a .bpk input is refused outright)
    given.hardlink_to(first)
    result = ended_cli("quantize", given, "-o", tmp_path / "model.bpk", "--max-shard-size", "300KB",
                                "--force", "--device", "cpu")
    assert f"{first.name} is the input" in assert_user_error(result, 2)[0]
    assert first.read_bytes() == SINGLE.read_bytes()
