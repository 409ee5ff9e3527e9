"""llama.cpp's newer GGUF types, NVFP4 (ggml type 40), Q1_0 (41), Q2_0 (42), and the ternary TQ2_0 (35):
blocks made by hand, written into GGUF files whose header is laid out field by field, transcoded by qcli and
held to a decoder written here from llama.cpp's published layouts (ggml-common.h's `block_*` structs,
ggml-quants.c's `dequantize_row_*`, ggml-impl.h's `ggml_ue4m3_to_fp32`), independent of qcli's parsing; and
to the gguf package's own dequantization where it has one (NVFP4, TQ2_0), and to Burn's decode."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from qcli.burn_backends import BurnBackend
from qcli.errors import PlanError
from qcli.io.burnpack import BurnpackReader
from tests.burn_harness import probe, same_bits
from tests.cli_support import assert_user_error, cli
from tests.format_support import decoded
from tests.gguf_support import T, dequantized, gstr, header, tensor

RNG = np.random.default_rng(11)
TYPE_IDS = {"TQ2_0": 35, "NVFP4": 40, "Q1_0": 41, "Q2_0": 42}  # ggml.h `enum ggml_type`
BLOCKS = {"TQ2_0": (256, 66), "NVFP4": (64, 36), "Q1_0": (128, 18), "Q2_0": (64, 18)}  # values, bytes
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)  # ggml's: 8 is +0


def f16(data: bytes) -> float:
    return float(np.frombuffer(data[:2], dtype=np.float16)[0])


def ue4m3(x: int) -> float:
    """ggml_ue4m3_to_fp32 without its halving (ggml doubles its E2M1 table instead): bit 7 unread, 0x7F zero."""
    if x in (0, 0x7F):
        return 0.0
    exponent, mantissa = (x >> 3) & 0xF, x & 0x7
    return mantissa * 2.0**-9 if exponent == 0 else (1 + mantissa / 8) * 2.0 ** (exponent - 7)


def reference(kind: str, block: bytes) -> list[float]:
    """One block's values, read from the published layout one value at a time."""
    if kind == "Q1_0":  # f16 d, then a bit a value: 1 is +d, 0 is -d
        d = f16(block)
        return [d if block[2 + j // 8] >> (j % 8) & 1 else -d for j in range(128)]
    if kind == "Q2_0":  # f16 d, then 2 bits a value, four to a byte from the low bits: (q - 1) d
        d = f16(block)
        return [((block[2 + j // 4] >> 2 * (j % 4) & 3) - 1) * d for j in range(64)]
    if kind == "TQ2_0":  # 64 bytes, then f16 d; each 32 bytes hold 128 values, value 32k + i at bits 2k of byte i
        d = f16(block[64:])
        return [((block[j // 128 * 32 + j % 32] >> 2 * (j % 128 // 32) & 3) - 1) * d for j in range(256)]
    # NVFP4: four UE4M3 bytes, then 8 bytes for each 16 values: low nibbles values 0..7, high ones 8..15
    return [E2M1[block[4 + s * 8 + j % 8] >> 4 * (j // 8) & 0xF] * ue4m3(block[s]) for s in range(4)
            for j in range(16)]


def gguf_file(path: Path, tensors: dict[str, tuple[str, np.ndarray]]) -> None:
    """A GGUF v3 file holding each `name: (type, blocks' bytes [rows, bytes per row])`, laid out field by
    field (the gguf package knows no Q2_0)."""
    infos, data = b"", b""
    for name, (kind, raw) in tensors.items():
        values, size = BLOCKS[kind]
        data += bytes(-len(data) % 32)
        infos += tensor(name, (raw.shape[1] // size * values, raw.shape[0]), TYPE_IDS[kind], len(data))
        data += raw.tobytes()
    kv = gstr("general.architecture") + struct.pack("<I", 8) + gstr("llama")
    path.write_bytes(header(kv=kv, kv_count=1, tensors=infos, tensor_count=len(tensors), data=data))


def want(kind: str, raw: np.ndarray) -> torch.Tensor:
    size = BLOCKS[kind][1]
    rows = [[v for b in range(0, len(row), size) for v in reference(kind, bytes(row[b:b + size]))] for row in raw]
    return torch.tensor(rows, dtype=torch.float32)


def crumbs(rows: int, nbytes: int, with_three: bool) -> np.ndarray:
    """Bytes of four 2-bit codes each, the first in the low bits: codes 0..2 (the ternary values ggml's
    quantizers write), or 0..3."""
    codes = RNG.integers(0, 4 if with_three else 3, (rows, nbytes, 4), dtype=np.uint8)
    return (codes[..., 0] | codes[..., 1] << 2 | codes[..., 2] << 4 | codes[..., 3] << 6).astype(np.uint8)


def scales(n: int) -> np.ndarray:
    """f16 scales of both signs, a subnormal and a zero among them."""
    d = (RNG.standard_normal(n) * 0.01).astype(np.float16)
    d[:3] = [np.float16(6e-8), np.float16(-0.0), np.float16(0.0)][: min(3, n)]
    return d


def q2_0(rows: int, blocks: int, with_three: bool = False) -> np.ndarray:
    d = scales(rows * blocks).view(np.uint8).reshape(rows, blocks, 2)
    qs = crumbs(rows, blocks * 16, with_three).reshape(rows, blocks, 16)
    return np.concatenate([d, qs], axis=2).reshape(rows, blocks * 18)


def tq2_0(rows: int, blocks: int, with_three: bool = False) -> np.ndarray:
    d = scales(rows * blocks).view(np.uint8).reshape(rows, blocks, 2)
    qs = crumbs(rows, blocks * 64, with_three).reshape(rows, blocks, 64)
    return np.concatenate([qs, d], axis=2).reshape(rows, blocks * 66)


def q1_0(rows: int, blocks: int) -> np.ndarray:
    d = scales(rows * blocks).view(np.uint8).reshape(rows, blocks, 2)
    bits = RNG.integers(0, 256, (rows, blocks, 16), dtype=np.uint8)
    return np.concatenate([d, bits], axis=2).reshape(rows, blocks * 18)


def nvfp4(rows: int, blocks: int) -> np.ndarray:
    """Every scale byte (0x7F and bit 7 set among them) and every code."""
    d = RNG.integers(0, 256, (rows, blocks, 4), dtype=np.uint8)
    d.reshape(-1)[:256] = np.arange(256, dtype=np.uint8)[: d.size]
    qs = RNG.integers(0, 256, (rows, blocks, 32), dtype=np.uint8)
    return np.concatenate([d, qs], axis=2).reshape(rows, blocks * 36)


TENSORS = {  # name -> (type, bytes); the scheme each is written in
    "blk.0.ffn_up.weight": ("NVFP4", nvfp4(8, 8)),
    "blk.0.ffn_down.weight": ("Q1_0", q1_0(4, 2)),
    "blk.0.ffn_gate.weight": ("Q2_0", q2_0(4, 4)),
    "blk.0.attn_q.weight": ("TQ2_0", tq2_0(4, 2)),
}
SCHEMES = {
    "NVFP4": "E2M1 PackedU32(0) block [16] F16",
    "Q1_0": "Q2S PackedU32(0) block [128] F16",
    "Q2_0": "Q2S PackedU32(0) block [64] F16",
    "TQ2_0": "Q2S PackedU32(0) block [128] F16",
}


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> tuple[Path, Path, dict]:
    folder = tmp_path_factory.mktemp("types")
    path, out = folder / "m.gguf", folder / "m.bpk"
    gguf_file(path, TENSORS)
    result = cli("quantize", path, "-o", out, "--device", "cpu", "--json")
    assert result.code == 0, result.err
    return path, out, {t["name"]: t for t in json.loads(result.out)["tensors"]}


def test_the_published_decoder_reads_blocks_worked_by_hand():
    """One block of each, worked out by hand, so the decoder above is right before it judges qcli."""
    d = np.float16(0.25).tobytes()
    assert reference("Q1_0", d + bytes([0b00000101]) + bytes(15))[:4] == [0.25, -0.25, 0.25, -0.25]
    assert reference("Q2_0", d + bytes([0b11100100]) + bytes(15))[:5] == [-0.25, 0.0, 0.25, 0.5, -0.25]
    tq = bytearray(66)
    tq[64:] = d
    tq[0], tq[33] = 0b00000110, 0b00100000  # values 0 (q 2) and 32 (q 1); value 128 + 32*2 + 1 (q 2)
    values = reference("TQ2_0", bytes(tq))
    assert (values[0], values[32], values[128 + 64 + 1], values[1]) == (0.25, 0.0, 0.25, -0.25)
    qs = bytearray(32)
    qs[0], qs[8], qs[16], qs[24] = 0x9F, 0x03, 0x02, 0x87  # codes 15 and 9; 3; 2; 7 and 8 (-0)
    values = reference("NVFP4", bytes([0x38, 0x7F, 0xB8, 0x01]) + qs)  # 1.0, 0 (NaN), 1.0 (bit 7 unread), 2^-9
    assert values[:9] == [-6.0, *[0.0] * 7, -0.5]
    assert (values[16], values[32], values[48], values[56]) == (0.0, 1.0, 6 * 2.0**-9, 0.0)


def test_each_type_decodes_as_published_bit_for_bit(written):
    _, out, rows = written
    got = decoded(out)
    for name, (kind, raw) in TENSORS.items():
        assert rows[name]["decision"] == "transcode", name
        assert same_bits(got[name], want(kind, raw)), f"{name} ({kind})"


def test_the_gguf_package_agrees_where_it_decodes(written):
    """gguf 0.19 decodes NVFP4 and TQ2_0 (not Q1_0, Q2_0): its values are the published decoder's too."""
    _, out, _ = written
    got = decoded(out)
    for name, (kind, raw) in TENSORS.items():
        if kind in ("NVFP4", "TQ2_0"):
            package = torch.from_numpy(dequantized(raw, T[kind]))
            assert same_bits(got[name], package), name


def test_the_schemes_and_sizes_written(written):
    _, out, rows = written
    entries = {e.name: e for e in BurnpackReader.open(out).entries()}
    for name, (kind, _) in TENSORS.items():
        assert str(entries[name].dtype.scheme) == SCHEMES[kind], name
    numel = 8 * 8 * 64
    assert entries["blk.0.ffn_up.weight"].nbytes == numel // 2 + numel // 16 * 2  # 5 bits a weight
    assert rows["blk.0.attn_q.weight"]["reason"] == ("default: transcode GGUF TQ2_0 -> Q2S PackedU32(0) block "
                                                    "[128] F16, exact")


def test_burn_decodes_them_as_published(written, tmp_path):
    """wgpu decodes all four; flex the Q2S ones (it decodes no E2M1)."""
    _, out, _ = written
    wgpu = probe(BurnBackend.wgpu, out, tmp_path / "wgpu.safetensors")
    flex = probe(BurnBackend.flex, out, tmp_path / "flex.safetensors")
    for name, (kind, raw) in TENSORS.items():
        assert same_bits(wgpu[name], want(kind, raw)), f"{name}: wgpu"
        if kind != "NVFP4":
            assert same_bits(flex[name], want(kind, raw)), f"{name}: flex"


@pytest.mark.parametrize("kind", ["Q2_0", "TQ2_0"])
def test_the_value_2d_is_refused_then_requantized_by_block(kind, tmp_path):
    """q = 3 (the value 2d, which Q2S lacks and ggml's quantizers never write) in a block: exit 2 naming
    the tensor and its blocks, nothing written; under --requantize those blocks alone change."""
    clean = q2_0(2, 4) if kind == "Q2_0" else tq2_0(2, 2)
    raw = clean.copy()
    if kind == "Q2_0":
        raw[1, 18 + 2] |= 0b11  # row 1, block 1: its first value q = 3
    else:
        raw[1, 66] |= 0b11  # row 1, block 1: its first value
    path, out = tmp_path / "m.gguf", tmp_path / "m.bpk"
    gguf_file(path, {"w": (kind, raw)})
    lines = assert_user_error(cli("quantize", path, "-o", out, "--device", "cpu"), PlanError.exit_code)
    values = 64 if kind == "Q2_0" else 128  # a Burn block: TQ2_0's is half a ggml block
    assert f"tensor 'w' (GGUF {kind}) holds the code 2 in 1 of its 8 blocks of {values} values" in lines[0]
    assert "--requantize q4s-b32" in lines[-1] and not out.exists()
    assert cli("quantize", path, "-o", out, "--device", "cpu", "--requantize", "q4s-b32").code == 0
    got, exact = decoded(out)["w"], want(kind, raw)
    changed = (got.reshape(-1, values) != exact.reshape(-1, values)).any(dim=1)
    assert changed.tolist() == [i == (5 if kind == "Q2_0" else 6) for i in range(8)]
    worst = (got - exact).abs().reshape(-1, values)[changed].max()
    assert float(worst) <= float(exact.reshape(-1, values)[changed].abs().max()) / 2  # half a step of max/1
