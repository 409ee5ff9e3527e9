"""GGUF files the `gguf` package wrote (its GGUFWriter, its quantizer, or blocks' bytes set by hand): Q8_0,
Q4_0 and MXFP4 transcode so that the `.bpk` decodes to `gguf.quants.dequantize` bit for bit, on either
pipeline and in Burn; the other quantized types are refused from the header, with `--requantize` the way
out."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from qcli.burn_backends import BurnBackend
from qcli.codec.blocks import to_blocks
from qcli.errors import InputError, PlanError
from qcli.io.burnpack import BurnpackReader
from qcli.io.gguf import GgufSource
from qcli.layout import BlockGrid
from qcli.measure import error_bound
from qcli.presets import PRESETS
from qcli.scheme import LOOKUP_PANICS_AT, LOOKUP_WHY
from tests.burn_harness import BACKENDS, probe, same_bits
from tests.burn_harness import dequantize as burn_dequantize
from tests.cli_support import assert_user_error, cli, validate_json
from tests.format_support import decoded, model_problems, pipeline_payloads, refused_from_headers
from tests.gguf_support import T, dequantized, gguf, write_gguf

RNG = np.random.default_rng(7)


def every_q8_code(low: int = -127) -> np.ndarray:
    """Q8_0 blocks holding each int8 code from `low` (-127: Q8S's range; -128: every one) to 127, under
    positive, negative and subnormal f16 scales."""
    scales = np.array([0.0123, -0.5, 6e-8, 1.0, -3.0e-5, 2.0, 65504.0, -0.0], dtype=np.float16)
    codes = np.arange(-128, 128, dtype=np.int8)
    codes[0] = low  # -127 twice, or -128
    codes = codes.reshape(8, 32)
    blocks = np.concatenate([scales.view(np.uint8).reshape(8, 2), codes.view(np.uint8)], axis=1)
    return blocks.reshape(2, 4 * 34)


def mxfp4_edges(exponents: tuple[int, ...] = (0, 1, 2, 3, 20, 30, 38, 39)) -> np.ndarray:
    """Eight MXFP4 blocks with these exponents (by default from ggml's smallest, 2^-127, over F16's 40 powers
    of two), every code 0..15 (8, E2M1's -0, among them) in each."""
    nibbles = np.tile(np.arange(16, dtype=np.uint8), (8, 2))  # values 0..15 then 16..31, each code twice
    packed = nibbles[:, :16] | nibbles[:, 16:] << 4
    return np.concatenate([np.array(exponents, dtype=np.uint8).reshape(8, 1), packed], axis=1).reshape(2, 4 * 17)


TRANSCODED = {  # name -> (values or raw bytes, type); rows of several blocks, ranks 1 to 3
    "token_embd.weight": (RNG.standard_normal((16, 96), dtype=np.float32), T.Q8_0),
    "blk.0.attn_k.weight": (every_q8_code(), T.Q8_0),
    "blk.0.attn_q.weight": (RNG.standard_normal((2, 8, 64), dtype=np.float32), T.Q4_0),
    "blk.0.attn_q.bias": (RNG.standard_normal(64, dtype=np.float32), T.Q4_0),
    "blk.0.ffn_up.weight": (RNG.standard_normal((6, 64), dtype=np.float32) * np.logspace(-5, 4, 64,
                                                                                         dtype=np.float32), T.MXFP4),
    "blk.0.ffn_gate.weight": (mxfp4_edges(), T.MXFP4),  # under a global of 2^-103
    "blk.1.ffn_gate.weight": (mxfp4_edges((211, 220, 230, 240, 247, 248, 249, 250)), T.MXFP4),  # 2^122 * 12: finite
}
PLAIN = {
    "blk.0.ffn_down.weight": (RNG.standard_normal((64, 32), dtype=np.float32), T.F16),
    "blk.0.attn_norm.weight": (RNG.standard_normal(64, dtype=np.float32), T.F32),
}


@pytest.fixture
def model(tmp_path) -> tuple[Path, dict[str, torch.Tensor]]:
    """The file and the gguf package's dequantization of each transcoded tensor."""
    path = tmp_path / "model.gguf"
    stored = write_gguf(path, {**TRANSCODED, **PLAIN})
    want = {n: torch.from_numpy(dequantized(stored[n], t)) for n, (_, t) in TRANSCODED.items()}
    return path, want




def test_the_test_files_hold_negative_scales_and_every_q8s_code(model):
    path, _ = model
    with GgufSource.open(path) as source:
        q4 = source.load("blk.0.attn_q.weight").reshape(-1, 18)[:, :2].contiguous().view(torch.float16)
        assert bool((q4 < 0).any()) and bool((q4 > 0).any())  # ggml's Q4_0 divides the signed peak by -8
        q8 = source.load("blk.0.attn_k.weight").reshape(-1, 34)[:, 2:].contiguous().view(torch.int8)
        assert set(q8.reshape(-1).tolist()) == set(range(-127, 128))


@pytest.mark.parametrize("pipeline", ["cpu", pytest.param("triton", marks=pytest.mark.interpreter)])
def test_the_decoded_bpk_is_ggufs_dequantization_bit_for_bit(model, tmp_path, pipeline, monkeypatch):
    if pipeline == "triton":
        monkeypatch.setenv("QCLI_KERNELS", "triton")  # the GPU pipeline (under TRITON_INTERPRET on the CPU)
    path, want = model
    out = tmp_path / "model.bpk"
    result = cli("quantize", path, "-o", out, "--json", *(["--device", "cpu"] if pipeline == "cpu" else []))
    assert result.code == 0, result.err
    rows = {t["name"]: t for t in json.loads(result.out)["tensors"]}
    assert rows["blk.0.ffn_down.weight"]["decision"] == "quantize"  # F16: quantized as any float
    assert rows["blk.0.attn_norm.weight"]["decision"] == "keep"
    for name, values in decoded(out, want).items():
        assert rows[name]["decision"] == "transcode", name
        assert same_bits(values, want[name]), name
    compared = cli("inspect", out, "--compare", path, "--json")
    assert compared.code == 0, compared.err
    doc = json.loads(compared.out)["compare"]
    assert doc["ok"] and all(r["exact"] for r in doc["tensors"] if r["name"] in want), doc


def test_the_schemes_written(model, tmp_path):
    path, _ = model
    out = tmp_path / "model.bpk"
    assert cli("quantize", path, "-o", out, "--device", "cpu").code == 0
    schemes = {e.name: str(e.dtype.scheme) for e in BurnpackReader.open(out).entries() if e.name in TRANSCODED}
    assert schemes["token_embd.weight"] == schemes["blk.0.attn_k.weight"] == "Q8S PackedU32(0) block [32] F16"
    assert schemes["blk.0.attn_q.weight"] == "Q4F PackedU32(0) block [32] F16"
    assert schemes["blk.0.ffn_up.weight"] == "E2M1 PackedU32(0) block [32] F16 global F32"


@pytest.mark.interpreter
def test_the_gpu_pipeline_yields_the_cpu_pipelines_bytes(model):
    path, _ = model
    _, want, got = pipeline_payloads(path)
    assert got == want


def test_burn_decodes_the_transcoded_file_as_gguf_does(model, tmp_path):
    """wgpu loads all three; flex the integer ones (Q8S, Q4F), and no minifloat."""
    path, want = model
    out = tmp_path / "model.bpk"
    assert cli("quantize", path, "-o", out, "--device", "cpu").code == 0
    wgpu = burn_dequantize(BurnBackend.wgpu, out, tmp_path / "wgpu.safetensors")
    flex = probe(BurnBackend.flex, out, tmp_path / "flex.safetensors")
    for name, values in want.items():
        assert same_bits(wgpu[name], values), f"{name}: Burn (wgpu) decodes other values than gguf"
        if TRANSCODED[name][1] is not T.MXFP4:
            assert same_bits(flex[name], values), f"{name}: Burn (flex) decodes other values than gguf"


def test_blocks_by_hand(tmp_path):
    """One block of each, worked out from the layout: Q8_0 d = -0.5, codes -127..-96 -> -0.5 * q; Q4_0
    d = 0.25, byte k = (k << 4) | k, so values 0..15 and 16..31 are both nibbles 0..15 -> (k - 8) * 0.25;
    MXFP4 e = 125 (scale 2^-2), the same bytes -> e2m1(k) / 4, code 8 (-0) decoding to +0.0."""
    q8 = np.concatenate([np.array([-0.5], np.float16).view(np.uint8),
                         np.arange(-127, -95, dtype=np.int8).view(np.uint8)])
    nibbles = np.array([k << 4 | k for k in range(16)], dtype=np.uint8)
    q4 = np.concatenate([np.array([0.25], np.float16).view(np.uint8), nibbles])
    mx = np.concatenate([np.array([125], np.uint8), nibbles])
    path = tmp_path / "m.gguf"
    write_gguf(path, {"q8": (q8.reshape(1, 34), T.Q8_0), "q4": (q4.reshape(1, 18), T.Q4_0),
                      "mx": (mx.reshape(1, 17), T.MXFP4)})
    out = tmp_path / "m.bpk"
    assert cli("quantize", path, "-o", out, "--device", "cpu").code == 0
    got = decoded(out, ("q8", "q4", "mx"))
    e2m1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
    assert same_bits(got["q8"], torch.tensor([[-0.5 * q for q in range(-127, -95)]]))
    assert same_bits(got["q4"], torch.tensor([[(k - 8) * 0.25 for k in [*range(16), *range(16)]]]))
    assert same_bits(got["mx"], torch.tensor([[v / 4 for v in e2m1 * 2]]))


def test_a_q8_0_block_holding_minus_128_is_refused_then_requantized_alone(tmp_path):
    """-128, which Q8S lacks and ggml's quantizer never writes, found on reading the tensor: exit 2 naming the
    tensor and how many blocks, nothing written; under --requantize that block alone is quantized again
    (into Q8S, from gguf's values), every other block exact, and Burn decodes the file as qcli does."""
    path, out = tmp_path / "m.gguf", tmp_path / "m.bpk"
    stored = write_gguf(path, {"w": (every_q8_code(low=-128), T.Q8_0)})
    lines = assert_user_error(cli("quantize", path, "-o", out, "--device", "cpu"), PlanError.exit_code)
    assert lines[0] == (f"error: {path}: tensor 'w' (GGUF Q8_0) holds the code -128 in 1 of its 8 blocks of 32 "
                        "values, which Q8S (-127 to 127) does not hold; ggml's quantizer never writes it")
    assert lines[-1].startswith("hint: requantize those blocks alone into Q8S with --requantize q4s-b32")
    assert not out.exists()
    assert cli("quantize", path, "-o", out, "--device", "cpu", "--requantize", "q4s-b32").code == 0
    got, want = decoded(out)["w"], torch.from_numpy(dequantized(stored["w"], T.Q8_0))
    blocks_got, blocks_want = got.reshape(8, 32), want.reshape(8, 32)
    assert same_bits(blocks_got[1:], blocks_want[1:])
    step = float(blocks_want[0].abs().max()) / 127  # the requantized block's Q8S scale
    assert 0 < float((blocks_got[0] - blocks_want[0]).abs().max()) <= step / 2 * (1 + 1e-3)
    assert same_bits(burn_dequantize(BurnBackend.flex, out, tmp_path / "flex.safetensors")["w"], got)


def test_burn_backend_requantizes_what_it_cannot_load_under_requantize(model, tmp_path):
    """flex decodes no E2M1 and computes wrong with Q4F blocks: --burn-backend flex refuses the MXFP4 and
    Q4_0 tensors, offering --requantize; with it they are requantized from gguf's values, while Q8_0 (Q8S,
    which flex computes with) stays an exact transcode, and flex decodes the file as qcli does."""
    path, want = model
    out = tmp_path / "m.bpk"
    lines = assert_user_error(cli("quantize", path, "-o", out, "--burn-backend", "flex", "--device", "cpu"),
                              PlanError.exit_code)
    text = "\n".join(lines)
    assert "flex backend cannot load 3 tensors (blk.0.ffn_gate.weight, blk.0.ffn_up.weight, blk.1.ffn_gate.weight)" \
           " as E2M1 PackedU32(0) block [32] F16 global F32" in text
    assert "requantize them into a preset flex loads (--requantize q4s-b32), or load the file" in text
    assert not out.exists()
    result = cli("quantize", path, "-o", out, "--burn-backend", "flex", "--device", "cpu", "--requantize",
                 "q4s-b32", "--json")
    assert result.code == 0, result.err
    rows = {t["name"]: t for t in json.loads(result.out)["tensors"]}
    for name, (_, qtype) in TRANSCODED.items():
        if qtype is T.Q8_0:
            assert rows[name]["decision"] == "transcode", name
        else:
            assert rows[name]["reason"] == f"requantize GGUF {qtype.name} -> q4s-b32", name
            assert rows[name]["sqnr_db"] is not None, name
    flex = burn_dequantize(BurnBackend.flex, out, tmp_path / "flex.safetensors")
    for name, values in decoded(out, want).items():
        assert same_bits(flex[name], values), name
        if TRANSCODED[name][1] is T.Q8_0:
            assert same_bits(values, want[name]), name


def test_an_mxfp4_nan_exponent_is_an_input_error(tmp_path):
    blocks = mxfp4_edges().reshape(8, 17)
    blocks[5, 0] = 0xFF
    path = tmp_path / "m.gguf"
    write_gguf(path, {"w": (blocks.reshape(2, 68), T.MXFP4)})
    lines = assert_user_error(cli("quantize", path, "--device", "cpu"), InputError.exit_code)
    assert "tensor 'w' (MXFP4) has the scale exponent 255 (E8M0's NaN) in block 5" in lines[0]


def test_mxfp4_is_written_at_4_5_bits_per_weight_with_its_global(tmp_path):
    """E2M1 with F16 block scales under one F32 global: per block of 32, 32 codes of 4 bits and a 16-bit
    scale (the source's 8-bit E8M0 is 4.25 bits a weight, which no Burn backend loads), plus 32 bits a
    tensor. The global is 1 where F16 holds every scale, and 2^k nearest 1 otherwise."""
    path = tmp_path / "m.gguf"
    moderate = mxfp4_edges((100, 110, 120, 127, 130, 135, 138, 139))  # 2^-27 is below F16's 2^-24
    write_gguf(path, {"a": (RNG.standard_normal((4, 64), dtype=np.float32), T.MXFP4), "b": (moderate, T.MXFP4),
                      "c": (mxfp4_edges(), T.MXFP4)})
    out = tmp_path / "m.bpk"
    result = cli("quantize", path, "-o", out, "--device", "cpu", "--json")
    assert result.code == 0, result.err
    rows = {t["name"]: t for t in json.loads(result.out)["tensors"]}
    reader = BurnpackReader.open(out)
    for name, numel in (("a", 256), ("b", 256), ("c", 256)):
        entry = next(e for e in reader.entries() if e.name == name)
        assert entry.nbytes == numel // 2 + numel // 32 * 2 + 4
        assert rows[name]["bits_per_weight"] == pytest.approx(4.5 + 32 / numel, abs=0.005)
    globals_ = {name: torch.frombuffer(bytearray(bytes(reader.read(name))[-4:]), dtype=torch.float32).item()
                for name in "abc"}
    assert globals_ == {"a": 1.0, "b": 2.0 ** -3, "c": 2.0 ** -103}


def test_an_mxfp4_tensor_whose_scales_span_more_than_f16_holds_is_an_input_error(tmp_path):
    """Blocks of zeros do not count (their scale is never seen); two live blocks 2^40 apart do."""
    path = tmp_path / "m.gguf"
    zeros = mxfp4_edges((0, 0, 100, 139, 0, 0, 0, 0)).reshape(8, 17)
    zeros[[0, 1, 4, 5, 6, 7], 1:] = 0  # every code 0, beside scales 2^-127
    write_gguf(path, {"w": (zeros.reshape(2, 68), T.MXFP4)})
    assert cli("quantize", path, "-o", tmp_path / "ok.bpk", "--device", "cpu").code == 0
    assert same_bits(decoded(tmp_path / "ok.bpk")["w"], torch.from_numpy(dequantized(zeros.reshape(2, 68), T.MXFP4)))
    wide = mxfp4_edges((100, 140, 120, 120, 120, 120, 120, 120))
    write_gguf(path, {"w": (wide, T.MXFP4)})
    out = tmp_path / "m.bpk"
    lines = assert_user_error(cli("quantize", path, "-o", out, "--device", "cpu"), InputError.exit_code)
    assert "tensor 'w' (MXFP4) has block scales from 2^-27 to 2^13, more powers of two than" in lines[0]
    assert not out.exists()


def test_inspect_dry_run_and_validate_scheme_report_the_decisions(model, tmp_path):
    path, _ = model
    result = cli("inspect", path, "--json")
    assert result.code == 0, result.err
    doc = json.loads(result.out)
    validate_json(doc)
    assert doc["format"] == "gguf"
    planned = {t["name"]: t["plan"] for t in doc["tensors"]}
    assert planned["token_embd.weight"]["format"] == "GGUF Q8_0"
    assert planned["token_embd.weight"]["decision"] == "transcode"
    assert planned["blk.0.ffn_up.weight"]["reason"] == ("default: transcode GGUF MXFP4 -> E2M1 PackedU32(0) block "
                                                        "[32] F16 global F32, exact")
    assert planned["blk.0.ffn_down.weight"]["format"] == "F16"
    text = cli("inspect", path)
    assert text.code == 0 and "GGUF Q4_0" in text.out
    dry = cli("quantize", path, "--dry-run", "--json")
    assert dry.code == 0, dry.err
    rows = {t["name"]: t for t in json.loads(dry.out)["tensors"]}
    assert rows["blk.0.attn_q.weight"]["reason"] == ("default: transcode GGUF Q4_0 -> Q4F PackedU32(0) block [32] "
                                                     "F16, exact")
    assert rows["blk.0.attn_q.weight"]["shape"] == [2, 8, 64]
    problems = model_problems('version = 1\n[[rule]]\nmatch = "*.weight"\npreset = "q8s-b32"\n', path, tmp_path)
    [warning] = [p for p in problems if p["kind"] == "transcoded"]
    assert "6 tensors (token_embd.weight, blk.0.attn_k.weight, blk.0.attn_q.weight, ...) are already " \
           "quantized: they are transcoded instead" in warning["message"]


# -- types no Burn scheme holds -----------------------------------------------------------------------


def raw_blocks(qtype, rows: int, blocks_per_row: int) -> np.ndarray:
    """Blocks of `qtype` whose bytes are arbitrary (the plan reads none of them)."""
    size = gguf.GGML_QUANT_SIZES[qtype][1]
    return RNG.integers(0, 256, (rows, blocks_per_row * size), dtype=np.uint8)


REFUSED = {
    "blk.0.ffn_up.weight": (RNG.standard_normal((8, 64), dtype=np.float32), T.Q4_1),
    "blk.0.ffn_down.weight": (RNG.standard_normal((8, 64), dtype=np.float32), T.Q4_1),
    "blk.0.ffn_gate.weight": (RNG.standard_normal((8, 96), dtype=np.float32), T.Q5_0),
    "blk.0.attn_v.weight": (raw_blocks(T.Q6_K, 2, 1), T.Q6_K),
    "blk.0.attn_k.weight": (raw_blocks(T.IQ4_NL, 2, 2), T.IQ4_NL),
    "blk.0.attn_q.weight": (raw_blocks(T.IQ2_XXS, 2, 1), T.IQ2_XXS),
    "blk.0.attn_norm.weight": (RNG.standard_normal(64, dtype=np.float32), T.F32),
}


@pytest.fixture
def refused(tmp_path) -> Path:
    path = tmp_path / "refused.gguf"
    write_gguf(path, REFUSED)
    return path


def test_refused_from_the_header_with_the_way_out(refused, monkeypatch):
    problems = refused_from_headers(monkeypatch, refused, refused.with_suffix(".bpk"))
    problems = {p.message.split(":")[0]: p for p in problems}
    assert len(problems) == len(problems) == 5  # one per type, none for keeping its codes
    q4_1 = problems["2 tensors (blk.0.ffn_down.weight, blk.0.ffn_up.weight) are GGUF Q4_1"]
    assert "an f16 minimum per 32 values (d * q + m): Burn has no zero point" in q4_1.message
    assert q4_1.hint.startswith("requantize them into a Burn scheme: --requantize q4s-b32 (dequantized by the gguf "
                                "package (gguf.quants.dequantize), then quantized")
    assert "5-bit codes" in problems["1 tensor (blk.0.ffn_gate.weight) is GGUF Q5_0"].message
    assert "--requantize q8s-b32" in problems["1 tensor (blk.0.attn_v.weight) is GGUF Q6_K"].hint
    for codebook in ("1 tensor (blk.0.attn_k.weight) is GGUF IQ4_NL", "1 tensor (blk.0.attn_q.weight) is GGUF IQ2_XXS"):
        assert problems[codebook].kind == "lookup"
        assert f"{LOOKUP_WHY} ({LOOKUP_PANICS_AT})" in problems[codebook].message
    assert not refused.with_suffix(".bpk").exists()


def test_inspect_and_the_cli_show_the_refusal(refused):
    lines = assert_user_error(cli("quantize", refused, "--dry-run"), PlanError.exit_code)
    assert "no weight was read" in lines[0]
    result = cli("inspect", refused, "--json")
    assert result.code == 0, result.err
    planned = {t["name"]: t["plan"] for t in json.loads(result.out)["tensors"]}
    assert planned["blk.0.ffn_up.weight"]["reason"] == "refused: GGUF Q4_1 is a format with a minimum per block"
    assert planned["blk.0.attn_k.weight"]["reason"] == "refused: GGUF IQ4_NL is a codebook"
    assert planned["blk.0.ffn_up.weight"]["refused"] and planned["blk.0.ffn_up.weight"]["format"] == "GGUF Q4_1"


def test_a_type_gguf_cannot_decode_is_an_error_without_a_way_out(tmp_path):
    path = tmp_path / "m.gguf"
    write_gguf(path, {"w": (raw_blocks(T.Q8_1, 2, 1), T.Q8_1)})
    lines = assert_user_error(cli("quantize", path, "--dry-run", "--requantize", "q4f-b32"), PlanError.exit_code)
    assert lines[1] == ("  w (Q8_1) cannot be kept: Burn has no Q8_1 dtype; nor transcoded: llama.cpp's in-memory type "
                        "for dot products, which its converter and quantizer never write; the gguf package has no "
                        "decoder for Q8_1")


def test_requantize_quantizes_ggufs_dequantization(tmp_path):
    path = tmp_path / "m.gguf"
    tensors = {n: REFUSED[n] for n in ("blk.0.ffn_up.weight", "blk.0.ffn_gate.weight", "blk.0.attn_norm.weight")}
    stored = write_gguf(path, tensors)
    out = tmp_path / "m.bpk"
    result = cli("quantize", path, "-o", out, "--requantize", "q4f-b32", "--json")
    assert result.code == 0, result.err
    rows = {t["name"]: t for t in json.loads(result.out)["tensors"]}
    assert rows["blk.0.ffn_up.weight"]["reason"] == "requantize GGUF Q4_1 -> q4f-b32"
    scheme = PRESETS["q4f-b32"]
    for name in ("blk.0.ffn_up.weight", "blk.0.ffn_gate.weight"):
        want = torch.from_numpy(dequantized(stored[name], tensors[name][1]))
        got = decoded(out, (name,))[name]
        grid = BlockGrid.of(scheme.scheme, want.shape)
        worst = to_blocks((got - want).abs().to(torch.float64), grid).amax(dim=grid.block_axes)
        assert bool((worst <= error_bound(want, scheme.scheme, scheme.calibration)).all()), name
        err = (got - want).to(torch.float64)
        sqnr = 10 * np.log10(float((want.to(torch.float64) ** 2).sum() / (err ** 2).sum()))
        assert rows[name]["sqnr_db"] == pytest.approx(sqnr, abs=0.05), name  # --stats: against gguf's values
    flex = burn_dequantize(BurnBackend.flex, out, tmp_path / "flex.safetensors")
    assert sorted(flex) == sorted(tensors)
    for name, values in decoded(out, tensors).items():
        assert same_bits(flex[name], values), name


def test_mxfp4_for_burn_0_21_is_refused_with_the_release_that_holds_it(tmp_path):
    """Burn 0.21 has no two-level scheme (and decodes no E2M1 on any backend): the transcode's scheme is the
    checkpoint's, so the hint names the release, not another scheme."""
    path = tmp_path / "m.gguf"
    write_gguf(path, {"w": (RNG.standard_normal((4, 64), dtype=np.float32), T.MXFP4)})
    lines = assert_user_error(cli("quantize", path, "--burn-version", "0.21.0", "--dry-run"), PlanError.exit_code)
    assert "1 tensor (w) cannot be written as E2M1 PackedU32(0) block [32] F16 global F32: Burn 0.21.0 has no " \
           "two-level scheme" in "\n".join(lines)
    assert lines[-1] == "hint: write it for --burn-version 0.22.1"


def test_no_burn_backend_loads_mxfp4_scales_narrower_than_f16(tmp_path):
    """Why MXFP4 is not written at its own 4.25 bits a weight: E2M1 in blocks of 32 with UE8M0 scales (the
    source's E8M0 as it is) or BF16 ones (which hold every E8M0 power of two too) fails or decodes wrongly
    on every backend of Burn 0.22.1, where F16 and F32 scales decode bit for bit on wgpu."""
    from qcli.burn_backends import qfloat
    from qcli.codec import decode, encode
    from qcli.io.burnpack import BurnpackWriter, TensorEntry
    from qcli.scheme import PackedU32, QuantScheme, QuantValue, ScaleDtype

    x = torch.from_numpy(RNG.standard_normal((4, 64), dtype=np.float32))
    entries, payloads, want = [], [], {}
    for dtype in (ScaleDtype.UE8M0, ScaleDtype.BF16, ScaleDtype.F16, ScaleDtype.F32):
        scheme = QuantScheme().with_value(QuantValue.E2M1).with_store(PackedU32(0)).per_block([32], dtype)
        payload = encode(x, scheme)
        entries.append(TensorEntry(str(dtype), qfloat(scheme), (4, 64), payload.numel()))
        payloads.append(payload)
        want[str(dtype)] = decode(payload, scheme, (4, 64))
    with BurnpackWriter(tmp_path / "scales.bpk", entries) as writer:
        for entry, payload in zip(entries, payloads, strict=True):
            writer.write(entry.name, payload)
        writer.commit()
    for backend in BACKENDS:
        got = probe(backend, tmp_path / "scales.bpk", tmp_path / f"{backend}.safetensors")
        loads = {name for name, values in want.items()
                 if isinstance(got[name], torch.Tensor) and same_bits(got[name], values)}
        assert loads == ({"F16", "F32"} if backend is BurnBackend.wgpu else set()), backend
