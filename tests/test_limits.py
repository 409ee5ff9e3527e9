"""Burn's size limits caught in the plan, and --max-shard-size splitting the output into whole tensors.

The huge inputs are sparse files: their headers describe tens of GiB that are never written or read.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from cli_support import SINGLE, assert_user_error, cli

from qcli import api
from qcli.errors import UsageError
from qcli.io.burnpack import BurnpackReader

GIB = 1024**3


def sparse_checkpoint(path: Path, sizes: list[int]) -> Path:
    """A safetensors file of 1-D F32 tensors of the given element counts, its data never written."""
    header, offset = {}, 0
    for i, n in enumerate(sizes):
        header[f"t{i}"] = {"dtype": "F32", "shape": [n], "data_offsets": [offset, offset + 4 * n]}
        offset += 4 * n
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob)
    with open(path, "r+b") as file:
        file.truncate(8 + len(blob) + offset)
    return path


def test_a_tensor_over_10_gib_is_a_plan_error(tmp_path: Path) -> None:
    source = sparse_checkpoint(tmp_path / "in.safetensors", [3 * GIB])  # 12 GiB, 1-D: kept
    lines = assert_user_error(cli("quantize", source, "--dry-run"), 2)
    assert "t0 is 12.0 GiB, over Burn's 10 GiB tensor limit" in "\n".join(lines)


def test_an_output_over_100_gib_is_a_plan_error_until_it_is_split(tmp_path: Path) -> None:
    source = sparse_checkpoint(tmp_path / "in.safetensors", [2 * GIB + GIB // 4] * 12)  # 12 x 9 GiB, kept
    lines = assert_user_error(cli("quantize", source, "--dry-run"), 2)
    assert "the output would take at least 108.0 GiB; Burn's reader refuses a file over 100 GiB" in lines[1]
    assert "--max-shard-size" in lines[-1]
    result = cli("quantize", source, "--dry-run", "--json", "--max-shard-size", "50GB")
    assert result.code == 0, result.err
    assert [Path(p).name for p in result.json["outputs"]] == [f"in-0000{i}-of-00003.bpk" for i in (1, 2, 3)]
    assert_user_error(cli("quantize", source, "--dry-run", "--max-shard-size", "101GiB"), 2)


def test_shards_hold_every_tensor_whole_and_once(tmp_path: Path) -> None:
    whole = tmp_path / "whole.bpk"
    assert cli("quantize", SINGLE, "-o", whole, "--device", "cpu").code == 0
    result = cli(
        "quantize",
        SINGLE,
        "-o",
        tmp_path / "model.bpk",
        "--device",
        "cpu",
        "--json",
        "--max-shard-size",
        "300KB",
    )
    assert result.code == 0, result.err
    shards = [Path(p) for p in result.json["outputs"]]
    count = len(shards)
    assert count >= 2 and [p.name for p in shards] == [
        f"model-{i:05d}-of-{count:05d}.bpk" for i in range(1, count + 1)
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["whole.bpk", *(p.name for p in shards)])
    reference = BurnpackReader.open(whole)
    seen = []
    for shard in shards:
        assert shard.stat().st_size <= 300_000
        reader = BurnpackReader.open(shard)
        for entry in reader.entries():
            seen.append(entry.name)
            assert bytes(reader.read(entry.name)) == bytes(reference.read(entry.name))
    assert sorted(seen) == sorted(e.name for e in reference.entries())  # every tensor exactly once


def test_existing_shards_are_refused_without_force(tmp_path: Path) -> None:
    args = ["quantize", SINGLE, "-o", tmp_path / "model.bpk", "--device", "cpu", "--max-shard-size", "300KB"]
    assert cli(*args).code == 0
    lines = assert_user_error(cli(*args), 2)
    assert "model-00001-of-" in lines[0] and "already exists" in lines[0]
    assert cli(*args, "--force").code == 0


def test_a_tensor_larger_than_a_shard(tmp_path: Path) -> None:
    lines = assert_user_error(
        cli("quantize", SINGLE, "-o", tmp_path / "m.bpk", "--max-shard-size", "10KB"), 2
    )
    assert (
        "--max-shard-size 10000: tensor '" in lines[0] and "more than fits a file of 10000 bytes" in lines[0]
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("50GB", 50 * 10**9),
        ("500MiB", 500 * 1024**2),
        ("1.5TB", 1_500 * 10**9),
        ("2e9", 2 * 10**9),
        ("4096", 4096),
        ("64kib", 64 * 1024),
    ],
)
def test_parse_size(text: str, size: int) -> None:
    assert api.parse_size(text) == size


@pytest.mark.parametrize("text", ["", "GB", "-5GB", "ten", "0"])
def test_parse_size_refuses(text: str) -> None:
    with pytest.raises(UsageError, match="is not a size"):
        api.parse_size(text)
