"""Shared helpers for the CLI tests: run the real entry point, and read QFloat bytes by hand.

The hand decoder is written from qfloat-spec (PackedU32: first value in the least significant bits,
rows padded on their own, then row-major F16 or UE8M0 block scales), with numpy only, so the tests do
not check qcli's codec against itself.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import subprocess
import sys
import tempfile
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_weights"
SINGLE = SAMPLES / "tiny-llama.safetensors"
# Where a dry run of SINGLE names its output: a folder of its own, empty, so that a .bpk the README's set-up
# left beside the sample (sample_weights/tiny-llama.bpk) never turns a dry run into "already exists".
DRY_RUN_TARGET = Path(tempfile.mkdtemp(prefix="qcli-dry-run-")) / "never-written.bpk"
SHARDED = SAMPLES / "tiny-llama-sharded"
SCHEMA = json.loads((ROOT / "docs" / "json-schema.json").read_text())


@dataclass
class Result:
    code: int
    out: str
    err: str

    @property
    def json(self) -> dict:
        return json.loads(self.out)

    @property
    def warnings(self) -> list[str]:
        """Each `warning:` on stderr as one line (`unwrapped`)."""
        return [line for line in unwrapped(self.err).splitlines() if line.startswith("warning:")]


def unwrapped(text: str) -> str:
    """`text` with each line qcli wrapped (`fill`: the later lines indented by two spaces) joined again by
    a space; table rows, which are indented too, are joined to the line above them as well."""
    return re.sub(r"\n  +(?=\S)", " ", text)


def cli(*args: str | Path) -> Result:
    """Run `qcli ARGS` in this process through `qcli.cli.run` (what the console script calls)."""
    from qcli.cli import run

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = run([str(a) for a in args])
    return Result(code, out.getvalue(), err.getvalue())


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment for a child interpreter, with the repository first on its path and
    whatever path this one was given (installed wheels, say) still after it."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, **extra}


def cli_subprocess(*args: str | Path, env: dict[str, str] | None = None) -> Result:
    """Run `python -m qcli ARGS` in a fresh interpreter from the repository root."""
    proc = subprocess.run(
        [sys.executable, "-m", "qcli", *map(str, args)],
        cwd=ROOT,
        env=child_env(**(env or {})),
        capture_output=True,
        text=True,
        timeout=300,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


def table_rows(out: str) -> list[list[str]]:
    """The cells of the first table in `out` (a header line, a rule of `─`, then a row a line, its cells
    apart by two spaces or more), up to the first line that is no row: the totals, or the next table."""
    lines = out.splitlines()
    rules = [i for i, line in enumerate(lines) if line and set(line) == {"─"}]
    if not rules:
        return []
    rows = []
    for i in range(rules[0] + 1, len(lines)):
        if "  " not in lines[i].strip() or i + 1 in rules:
            break
        rows.append(re.split(r"\s{2,}", lines[i].strip()))
    return rows


def validate_json(doc: dict) -> None:
    import jsonschema

    jsonschema.validate(doc, SCHEMA)


def assert_user_error(result: Result, code: int) -> list[str]:
    """Exit `code`, `error:` first and `hint:` last on stderr, no traceback; returns the lines."""
    assert result.code == code, (result.code, result.err)
    lines = result.err.strip().splitlines()
    assert lines[0].startswith("error: "), result.err
    assert lines[-1].startswith("hint: "), result.err
    assert "Traceback" not in result.err
    return lines


def source_tensors(path: Path = SINGLE) -> dict[str, np.ndarray]:
    """The sample's tensors as float32 numpy arrays (bf16 widens exactly)."""
    from safetensors.torch import load_file

    return {k: v.float().numpy() for k, v in load_file(path).items()}


def source_bytes(path: Path = SINGLE) -> dict[str, bytes]:
    """Each tensor's raw bytes, read from the safetensors header and data section by hand."""
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n])
    header.pop("__metadata__", None)
    return {k: data[8 + n + v["data_offsets"][0] : 8 + n + v["data_offsets"][1]] for k, v in header.items()}


def q_serde(value: str, block: int) -> dict:
    """Burn's serde form of `value` in PackedU32(0), one F16 scale per `block` values (qfloat-spec §1.8)."""
    return {
        "value": value,
        "store": {"PackedU32": 0},
        "mode": "Symmetric",
        "tensor": None,
        "block": {"size": {"storage": [block, 1, 1, 1, 1], "len": 1}, "dtype": "F16"},
    }


# Bytes of one block scale, per scale dtype the hand decoder reads.
SCALE_WIDTH = {"F16": 2, "UE8M0": 1}


def packed_len(shape: tuple[int, int], bits: int, block: int, scale_dtype: str = "F16") -> int:
    rows, cols = shape
    return rows * math.ceil(cols * bits / 32) * 4 + rows * math.ceil(cols / block) * SCALE_WIDTH[scale_dtype]


def ue8m0_scales(codes: np.ndarray) -> np.ndarray:
    """UE8M0 bytes as f32 (Burn 0.22.1 `ue8m0_to_f32`): a code c is 2^(c - 127), code 0 is 2^-127, 0xFF NaN."""
    exponents = codes.astype(np.float64) - 127
    return np.where(codes == 0xFF, np.nan, np.exp2(exponents)).astype(np.float32)


def decode_packed(
    payload: bytes, shape: tuple[int, int], bits: int, block: int, scale_dtype: str = "F16"
) -> tuple[np.ndarray, np.ndarray]:
    """(values, scales) of a 2-D symmetric-integer PackedU32(0) tensor with block scales [block], F16 (two
    little-endian bytes each) or UE8M0 (one biased-exponent byte each)."""
    rows, cols = shape
    per_word = 32 // bits
    words_per_row = math.ceil(cols / per_word)
    value_bytes = rows * words_per_row * 4
    blocks = math.ceil(cols / block)
    assert len(payload) == value_bytes + rows * blocks * SCALE_WIDTH[scale_dtype]
    words = np.frombuffer(payload[:value_bytes], dtype="<u4").reshape(rows, words_per_row)
    shifts = (np.arange(per_word) * bits).astype(np.uint32)
    fields = ((words[:, :, None] >> shifts) & ((1 << bits) - 1)).reshape(rows, -1)[:, :cols].astype(np.int64)
    q = np.where(fields >= 1 << (bits - 1), fields - (1 << bits), fields)
    if scale_dtype == "UE8M0":
        scales = ue8m0_scales(np.frombuffer(payload[value_bytes:], dtype=np.uint8)).reshape(rows, blocks)
    else:
        scales = np.frombuffer(payload[value_bytes:], dtype="<f2").astype(np.float32).reshape(rows, blocks)
    return (q * np.repeat(scales, block, axis=1)[:, :cols]).astype(np.float32), scales


def half_step_bound(x: np.ndarray, half_range: float, block: int) -> np.ndarray:
    """Per element, half the quantization step of its block: max|x| / h / 2, with room for the scale's
    rounding up onto f16 (a relative 2^-10 at most for normal f16 scales)."""
    rows, cols = x.shape
    blocks = math.ceil(cols / block)
    padded = np.zeros((rows, blocks * block), dtype=np.float64)
    padded[:, :cols] = np.abs(x)
    alpha = padded.reshape(rows, blocks, block).max(axis=2)
    return np.repeat(alpha / half_range * (1 + 2.0**-10) / 2, block, axis=1)[:, :cols] + 1e-12
