"""Never a non-finite or torn model (docs/reliability.md, "Non-finite scales" and "An input changed while it is
read"): a transcoded checkpoint whose scales are NaN or infinite is refused naming the tensor (exit 3),
`inspect --compare` fails a file whose decode holds NaN or Inf where it must not, `inspect --tensor --json`
describes such a file in valid JSON, and an input rewritten while the run reads it fails the run (exit 3)
with the target as it was.

The checkpoints are written by hand from their published layouts (GGUF's Q8_0 and Q4_0 blocks: an f16 d,
then the codes; GPTQ's tensors as tests/formats/test_gptq.py packs them), the damaged scale set by hand.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.cli_support import SCHEMA, SINGLE, assert_user_error, cli
from tests.gguf_support import T, write_gguf

NAME = "blk.0.ffn_down.weight"
NON_FINITE = {"nan": np.float16("nan"), "inf": np.float16("inf"), "-inf": np.float16("-inf")}


def nothing_written(folder: Path, out: Path, before: bytes | None = None) -> None:
    assert (out.read_bytes() == before) if before is not None else not out.exists()
    assert not list(folder.glob(".*.tmp"))


def gguf_blocks(qtype: object, damaged: np.float16) -> np.ndarray:
    """4 rows of 2 blocks each (Q8_0: f16 d and 32 int8 codes; Q4_0: f16 d and 16 bytes of nibbles), every d
    0.5 and the codes small, but block 1 of row 2, whose d is `damaged`."""
    rows = []
    for row in range(4):
        blocks = []
        for block in range(2):
            d = damaged if (row, block) == (2, 1) else np.float16(0.5)
            codes = (np.arange(32, dtype=np.int8) % 7 - 3).view(np.uint8) if qtype is T.Q8_0 else \
                np.full(16, 0x59, dtype=np.uint8)
            blocks.append(np.concatenate([np.array([d], np.float16).view(np.uint8), codes]))
        rows.append(np.concatenate(blocks))
    return np.stack(rows)


@pytest.mark.parametrize("pipeline", ["cpu", pytest.param("triton", marks=pytest.mark.interpreter)])
@pytest.mark.parametrize("scale", sorted(NON_FINITE))
@pytest.mark.parametrize("qtype", [T.Q8_0, T.Q4_0], ids=["Q8_0", "Q4_0"])
def test_a_gguf_block_scale_that_is_not_finite_is_refused(tmp_path, monkeypatch, qtype, scale, pipeline):
    if pipeline == "triton":
        monkeypatch.setenv("QCLI_KERNELS", "triton")
    path = tmp_path / "m.gguf"
    write_gguf(path, {NAME: (gguf_blocks(qtype, NON_FINITE[scale]), qtype)})
    out = tmp_path / "m.bpk"
    device = ["--device", "cpu"] if pipeline == "cpu" else []
    lines = assert_user_error(cli("quantize", path, "-o", out, *device), 3)
    assert lines[0] == (f"error: {path}: tensor '{NAME}' (GGUF {qtype.name}) has scales that are NaN or infinite "
                        "in 1 of its 8 blocks, so it would decode to NaN or Inf")
    nothing_written(tmp_path, out)


def test_finite_gguf_blocks_are_written(tmp_path):
    """The same file with every d finite: the check refuses only what it must."""
    path = tmp_path / "m.gguf"
    write_gguf(path, {NAME: (gguf_blocks(T.Q8_0, np.float16(0.25)), T.Q8_0)})
    assert cli("quantize", path, "-o", tmp_path / "m.bpk", "--device", "cpu").code == 0


@pytest.mark.parametrize("scale", ["nan", "inf"])
def test_a_gptq_scale_that_is_not_finite_is_refused(tmp_path, scale):
    from tests.formats.test_gptq import write

    folder = tmp_path / "gptq"
    write(folder, 4, 32)
    tensors = load_file(folder / "model.safetensors")
    tensors["model.layers.0.mlp.down_proj.scales"][1, 5] = float(scale)
    save_file(tensors, folder / "model.safetensors")
    out = tmp_path / "m.bpk"
    lines = assert_user_error(cli("quantize", folder, "-o", out, "--device", "cpu"), 3)
    assert "tensor 'model.layers.0.mlp.down_proj.qweight' (GPTQ" in lines[0]
    assert "scales that are NaN or infinite in 1 of its" in lines[0]
    nothing_written(tmp_path, out)


# -- a written file damaged afterwards: inspect ---------------------------------------------------------

Q8_RECIPE = 'version = 1\n[[rule]]\nmatch = "w"\nvalue = "Q8S"\nblock = [32]\nblock_scale = "F16"\n'
TWO_LEVEL = Q8_RECIPE + 'tensor_scale = "F32"\n'


def damaged_bpk(tmp_path: Path, recipe: str, at: int, value: bytes) -> tuple[Path, Path]:
    """A finite [4, 64] source quantized as Q8S block [32] F16 (by `recipe`), then `value` written at byte `at`
    of the tensor's payload: the values are 4 × 64 int8 codes in PackedU32 words (256 bytes), then the 8
    blocks' f16 scales (16 bytes), then a two-level scheme's f32 global."""
    from qcli.io.burnpack import BurnpackReader

    source = tmp_path / "src.safetensors"
    save_file({"w": 2 * torch.sin(torch.arange(256.0)).reshape(4, 64)}, source)  # both signs in every block
    (tmp_path / "r.toml").write_text(recipe)
    out = tmp_path / "out.bpk"
    assert cli("quantize", source, "--recipe", tmp_path / "r.toml", "-o", out, "--device", "cpu").code == 0
    reader = BurnpackReader.open(out)
    start, end = reader.data_offsets("w")  # within the data section
    assert end - start == 256 + 16 + (4 if "tensor_scale" in recipe else 0)
    with open(out, "r+b") as f:
        f.seek(reader.data_start + start + at)
        f.write(value)
    return out, source


NAN_F16, INF_F16 = np.array([np.nan], np.float16).tobytes(), np.array([np.inf], np.float16).tobytes()


@pytest.mark.parametrize(("recipe", "at", "value", "blocks"), [
    (Q8_RECIPE, 256 + 2 * 3, NAN_F16, 1),  # block 3's scale
    (Q8_RECIPE, 256 + 2 * 7, INF_F16, 1),
    (TWO_LEVEL, 256 + 16, np.array([np.nan], np.float32).tobytes(), 8),  # the global: every block
], ids=["nan-scale", "inf-scale", "nan-global"])
def test_inspect_compare_fails_a_file_whose_scales_are_not_finite(tmp_path, recipe, at, value, blocks):
    out, source = damaged_bpk(tmp_path, recipe, at, value)
    result = cli("inspect", out, "--compare", source, "--json")
    assert result.code == 1, result.err
    compare = json.loads(result.out)["compare"]
    assert not compare["ok"] and compare["mismatched"] == ["w"]
    assert compare["tensors"][0]["problem"] == (f"its scales are NaN or infinite in {blocks} of its 8 blocks, so "
                                                "it decodes to NaN or Inf")


@pytest.mark.parametrize(("recipe", "at", "value"), [
    (Q8_RECIPE, 256 + 2 * 3, NAN_F16), (Q8_RECIPE, 256 + 2 * 7, INF_F16),
    (TWO_LEVEL, 256 + 16, np.array([np.inf], np.float32).tobytes())], ids=["nan-scale", "inf-scale", "inf-global"])
def test_inspect_tensor_json_describes_non_finite_values(tmp_path, recipe, at, value):
    import jsonschema

    out, _ = damaged_bpk(tmp_path, recipe, at, value)
    result = cli("inspect", out, "--tensor", "w", "--json")
    assert result.code == 0, result.err
    doc = json.loads(result.out)
    jsonschema.validate(doc, SCHEMA)
    stats = doc["tensor_stats"]
    values, scales = stats["values"], stats["scales"]
    if "tensor_scale" in recipe:  # an infinite global: every value inf, -inf or (a zero code) NaN
        assert stats["global_scale"] == "inf" and scales["nan"] + scales["inf"] == 0
        assert values["nan"] + values["inf"] + values["neg_inf"] == 256 and values["min"] is None
    else:  # one block of 32 values: a NaN scale makes them all NaN; an infinite one each code's sign (0: NaN)
        assert scales["nan" if value == NAN_F16 else "inf"] == 1
        assert values["nan"] + values["inf"] + values["neg_inf"] == 32
        assert values["nan"] == 32 if value == NAN_F16 else values["inf"] > 0 and values["neg_inf"] > 0
        assert values["min"] is not None and values["min"] < 0 < values["max"]
    text = cli("inspect", out, "--tensor", "w")
    assert text.code == 0 and "values not finite (left out of the statistics)" in text.out


# -- an input changed while it is read ------------------------------------------------------------------


def rewrite_in_place(path: Path) -> None:
    """One byte near the end of the data (the last tensor's) changed, the file's size and header the same."""
    with open(path, "r+b") as f:
        f.seek(-3, os.SEEK_END)
        byte = f.read(1)
        f.seek(-3, os.SEEK_END)
        f.write(bytes([byte[0] ^ 0x40]))


def rewrite_keeping_the_time(path: Path) -> None:
    """The same, then the modification time set back to what it was (the change time still moves)."""
    st = path.stat()
    rewrite_in_place(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_mtime_ns == st.st_mtime_ns


def replace_by_rename(path: Path) -> None:
    """A copy with the changed byte renamed over it: another file under the same name."""
    copy = path.with_name("copy")
    shutil.copy(path, copy)
    rewrite_in_place(copy)
    os.replace(copy, path)


@pytest.mark.parametrize("change", [rewrite_in_place, rewrite_keeping_the_time, replace_by_rename],
                         ids=lambda f: f.__name__)
def test_an_input_changed_while_it_is_read_fails_the_run(tmp_path, monkeypatch, change):
    from qcli.io.safetensors import SafetensorsSource

    source = tmp_path / "in.safetensors"
    shutil.copy(SINGLE, source)
    out = tmp_path / "out.bpk"
    out.write_bytes(b"the user's file")
    load, loads = SafetensorsSource.load, []

    def load_then_change(self, name):  # the change lands while the run reads: after its first tensor
        loads.append(name)
        if len(loads) == 1:
            change(source)
        return load(self, name)

    monkeypatch.setattr(SafetensorsSource, "load", load_then_change)
    lines = assert_user_error(cli("quantize", source, "-o", out, "--force", "--device", "cpu"), 3)
    assert lines[0].startswith(f"error: {source} (the input) changed while qcli read it: ")
    assert len(loads) > 1
    nothing_written(tmp_path, out, b"the user's file")


def test_an_unchanged_input_passes(tmp_path, monkeypatch):
    """Reading (and the page cache's own access-time updates) is no change."""
    source = tmp_path / "in.safetensors"
    shutil.copy(SINGLE, source)
    os.utime(source, ns=(0, source.stat().st_mtime_ns))
    assert cli("quantize", source, "-o", tmp_path / "out.bpk", "--device", "cpu").code == 0


def test_the_calibration_text_changed_during_imatrix_fails_it(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    import qcli.calibrate.importance as importance
    from tests.cli_support import SHARDED

    text = tmp_path / "calibration.txt"
    shutil.copy(SHARDED.parent / "calibration.txt", text)
    measure = importance.measure_importance

    def measure_then_change(*args, **kwargs):
        measured = measure(*args, **kwargs)
        text.write_text(text.read_text().upper())
        return measured

    monkeypatch.setattr(importance, "measure_importance", measure_then_change)
    out = tmp_path / "m.imatrix.gguf"
    lines = assert_user_error(cli("imatrix", SHARDED, "--calibration-data", text, "-o", out, "--samples", "2",
                                  "--seq-len", "8", "--device", "cpu"), 3)
    assert lines[0].startswith(f"error: {text} (the calibration text) changed while qcli read it: ")
    nothing_written(tmp_path, out)
