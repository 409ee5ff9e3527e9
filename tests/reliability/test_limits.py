"""Burn's size limits caught in the plan, and --max-shard-size splitting the output into whole tensors.

The huge inputs are sparse files: their headers describe tens of GiB that are never written or read.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from safetensors import safe_open

from qcli.errors import UsageError
from qcli.io.burnpack import BurnpackReader
from qcli.io.dtypes import QFloat
from qcli.sizes import parse_size
from tests.cli_support import SINGLE, assert_user_error, cli

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
    assert [Path(p).name for p in result.json["outputs"]] == [
        *(f"in-0000{i}-of-00003.bpk" for i in (1, 2, 3)), "in.bpk.index.json"]
    assert_user_error(cli("quantize", source, "--dry-run", "--max-shard-size", "101GiB"), 2)


def test_burn_0_23_reads_files_up_to_500_gib(tmp_path: Path) -> None:
    """Burn 0.23.0-pre.1 raised its reader's file limit to 500 GiB: the 108 GiB output 0.22.1 refuses is one
    file for --burn-version 0.23, and a shard may be up to 500 GiB."""
    source = sparse_checkpoint(tmp_path / "in.safetensors", [2 * GIB + GIB // 4] * 12)  # 12 x 9 GiB, kept
    newer = ["--dry-run", "--json", "--burn-version", "0.23"]
    result = cli("quantize", source, *newer)
    assert result.code == 0, result.err
    assert [Path(p).name for p in result.json["outputs"]] == ["in.bpk"]
    assert cli("quantize", source, *newer, "--max-shard-size", "101GiB").code == 0
    lines = assert_user_error(cli("quantize", source, *newer, "--max-shard-size", "501GiB"), 2)
    assert "over Burn's 500 GiB file limit" in lines[0]


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
    *shards, index = [Path(p) for p in result.json["outputs"]]
    count = len(shards)
    assert count >= 2 and [p.name for p in shards] == [
        f"model-{i:05d}-of-{count:05d}.bpk" for i in range(1, count + 1)
    ]
    assert index.name == "model.bpk.index.json"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["whole.bpk", index.name, *(p.name for p in shards)])
    reference = BurnpackReader.open(whole)
    seen, weight_map, total = [], {}, 0
    for shard in shards:
        assert shard.stat().st_size <= 300_000
        reader = BurnpackReader.open(shard)
        for entry in reader.entries():
            seen.append(entry.name)
            weight_map[entry.name] = shard.name
            total += entry.nbytes
            assert bytes(reader.read(entry.name)) == bytes(reference.read(entry.name))
    assert sorted(seen) == sorted(e.name for e in reference.entries())  # every tensor exactly once
    # The index in Hugging Face's form: each tensor's shard, and the payload bytes in all.
    document = json.loads(index.read_text())
    assert document["weight_map"] == weight_map and document["metadata"]["total_size"] == total


def sharded(tmp_path: Path) -> Path:
    result = cli("quantize", SINGLE, "-o", tmp_path / "model.bpk", "--device", "cpu", "--max-shard-size", "300KB")
    assert result.code == 0, result.err
    return tmp_path / "model.bpk.index.json"


@pytest.mark.parametrize("given", ["model.bpk.index.json", "model.bpk"])
def test_inspect_reads_every_shard_through_the_index(tmp_path: Path, given: str) -> None:
    sharded(tmp_path)
    doc = cli("inspect", tmp_path / given, "--json").json
    with safe_open(str(SINGLE), framework="pt") as source:
        assert sorted(t["name"] for t in doc["tensors"]) == sorted(source.keys())
    assert [f["name"] for f in doc["files"]] == sorted(p.name for p in tmp_path.glob("model-*.bpk"))
    compare = cli("inspect", tmp_path / given, "--compare", SINGLE, "--json")
    assert compare.code == 0 and len(compare.json["compare"]["tensors"]) == len(doc["tensors"])
    assert compare.json["compare"]["missing"] == []


def test_compare_through_the_index_finds_a_damaged_shard(tmp_path: Path) -> None:
    index = sharded(tmp_path)
    last = sorted(tmp_path.glob("model-*.bpk"))[-1]
    reader = BurnpackReader.open(last)
    name = next(e.name for e in reader.entries() if isinstance(e.dtype, QFloat))
    start, _ = reader.data_offsets(name)
    data = bytearray(last.read_bytes())
    data[reader.data_start + start] ^= 0x88  # a value of the tensor's first block, 8 steps or more away
    last.write_bytes(bytes(data))
    result = cli("inspect", index, "--compare", SINGLE)
    assert result.code == 1 and name in result.out


def test_an_index_that_does_not_match_its_shards_is_refused(tmp_path: Path) -> None:
    index = sharded(tmp_path)
    document = json.loads(index.read_text())
    name = next(iter(document["weight_map"]))
    other = next(s for s in document["weight_map"].values() if s != document["weight_map"][name])
    document["weight_map"][name] = other
    index.write_text(json.dumps(document))
    lines = assert_user_error(cli("inspect", index), 3)
    assert name in lines[0] and f"listed in {other} but that file does not hold it" in lines[0]


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
    assert parse_size(text, "--max-shard-size") == size


@pytest.mark.parametrize("text", ["", "GB", "-5GB", "ten", "0"])
def test_parse_size_refuses(text: str) -> None:
    with pytest.raises(UsageError, match="is not a size"):
        parse_size(text, "--max-shard-size")
