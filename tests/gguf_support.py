"""GGUF files written by the `gguf` package itself (its GGUFWriter and its quantizer), for the tests."""

from __future__ import annotations

import struct
from pathlib import Path

import gguf
import numpy as np

T = gguf.GGMLQuantizationType


def write_gguf(path: Path, tensors: dict[str, tuple[np.ndarray, object]], *, arch: str = "llama",
               metadata: dict[str, object] | None = None, alignment: int | None = None,
               endianess: object = None) -> dict[str, np.ndarray]:
    """A GGUF file holding each `name: (values, ggml type)`, the values quantized by `gguf.quants.quantize`
    (F32, F16 and BF16 stored by the package as it stores them), or, given as uint8 for a quantized type, the
    blocks' bytes themselves (shaped as gguf stores them); returns the bytes or elements written."""
    writer = gguf.GGUFWriter(str(path), arch, endianess=endianess or gguf.GGUFEndian.LITTLE)
    if alignment is not None:
        writer.add_custom_alignment(alignment)
    for key, value in (metadata or {}).items():
        if isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        elif isinstance(value, str):
            writer.add_string(key, value)
        else:
            writer.add_array(key, value)
    stored = {}
    for name, (values, qtype) in tensors.items():
        raw = values.dtype == np.uint8 and qtype not in (T.F32, T.F16)
        data = values if raw else gguf.quants.quantize(values, qtype)
        stored[name] = data
        writer.add_tensor(name, data, raw_dtype=qtype if qtype not in (T.F32, T.F16) else None)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return stored


def dequantized(data: np.ndarray, qtype: object) -> np.ndarray:
    """The gguf package's own dequantization of stored bytes (or elements), in f32."""
    return gguf.quants.dequantize(data, qtype).astype(np.float32, copy=False)


# -- headers by hand, each field as the format lays it out, for broken inputs -------------------------


def header(*, version: int = 3, kv: bytes = b"", kv_count: int = 0, tensors: bytes = b"", tensor_count: int = 0,
           data: bytes = b"") -> bytes:
    body = b"GGUF" + struct.pack("<IQQ", version, tensor_count, kv_count) + kv + tensors
    return body + bytes(-len(body) % 32) + data


def gstr(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def tensor(name: str, ne: tuple[int, ...], type_id: int = 0, offset: int = 0) -> bytes:
    dims = struct.pack(f"<I{len(ne)}Q", len(ne), *ne)
    return gstr(name) + dims + struct.pack("<IQ", type_id, offset)
