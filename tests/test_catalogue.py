"""The catalogue of broken inputs, each run through the real CLI (docs/reliability.md lists it).

Every case must end with its exit code (3 input, 2 recipe), one `error:` line naming the file, the
tensor where there is one, and the problem, a `hint:` line, no traceback, and nothing written: the
output path does not exist and no temporary file is left beside it.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import cbor2
import pytest
import torch
from cli_support import SINGLE, assert_user_error, cli, cli_subprocess
from safetensors.torch import save_file

from qcli.io.burnpack import data_section_start


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


@pytest.mark.parametrize("case", SAFETENSORS + BURNPACK + RECIPES, ids=lambda c: c.id)
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
