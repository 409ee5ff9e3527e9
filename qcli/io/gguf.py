"""The GGUF source: a llama.cpp model file, its header read and checked by qcli itself before any weight.

```
[ "GGUF" ][ u32 version (2, 3) ][ u64 tensor count ][ u64 metadata count ]
[ metadata: (string key, u32 value type, value) ... ]
[ tensor infos: (string name, u32 n_dims, u64 ne[n_dims], u32 ggml type, u64 offset) ... ]
[ padding to `general.alignment` (32 by default) ][ data: each tensor at its offset, aligned ]
```

Everything is little-endian; a string is a u64 byte length and UTF-8 bytes; an array value is a u32 item
type, a u64 count and the items. `ne[0]` is the fastest-varying axis, so the row-major shape is `ne`
reversed. A quantized type stores each row of `ne[0]` values as whole blocks (`GgmlType`), so a tensor's
bytes are its rows one after another and a row of its first axis is a whole number of blocks.

Tensors are loaded as stored: a plain type (F32, F16, BF16, F64, I8..I64, spelled as safetensors spells
them) as its elements, a quantized one as its raw bytes, shaped `(*shape[:-1], bytes per row)` as the
`gguf` package's `quants.dequantize` takes them.
"""

from __future__ import annotations

import math
import os
import struct
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, ClassVar

from qcli.errors import InputError
from qcli.io.dtypes import element_traits, torch_dtype
from qcli.io.files import FileState, open_regular, read_into, unreadable
from qcli.io.source import TensorInfo, in_row_order
from qcli.text import printable, quoted, shown

if TYPE_CHECKING:
    import torch

MAGIC = b"GGUF"
SUFFIX = ".gguf"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_ITEMS = 1 << 24  # metadata array items walked in all: a tokenizer has a few hundred thousand
SHORT_ARRAY = 1024  # an array of numbers or strings up to this long is kept as a tuple (per-layer head
# counts, an importance matrix's datasets)
_CORRUPT_HINT = "the file is damaged or was not written as GGUF; download or convert it again"


@dataclass(frozen=True)
class GgmlType:
    """One ggml tensor type: `block` values stored in `nbytes` bytes (1 value for a plain type)."""

    name: str
    block: int
    nbytes: int

    @property
    def quantized(self) -> bool:
        return self.name not in PLAIN_TYPES


# ggml's type ids (ggml.h `enum ggml_type`, mirrored by gguf-py's `GGMLQuantizationType`) and their block
# layouts (ggml.c `type_traits`, gguf-py's `GGML_QUANT_SIZES`).
GGML_TYPES = {
    0: GgmlType("F32", 1, 4), 1: GgmlType("F16", 1, 2), 2: GgmlType("Q4_0", 32, 18), 3: GgmlType("Q4_1", 32, 20),
    6: GgmlType("Q5_0", 32, 22), 7: GgmlType("Q5_1", 32, 24), 8: GgmlType("Q8_0", 32, 34),
    9: GgmlType("Q8_1", 32, 40), 10: GgmlType("Q2_K", 256, 84), 11: GgmlType("Q3_K", 256, 110),
    12: GgmlType("Q4_K", 256, 144), 13: GgmlType("Q5_K", 256, 176), 14: GgmlType("Q6_K", 256, 210),
    15: GgmlType("Q8_K", 256, 292), 16: GgmlType("IQ2_XXS", 256, 66), 17: GgmlType("IQ2_XS", 256, 74),
    18: GgmlType("IQ3_XXS", 256, 98), 19: GgmlType("IQ1_S", 256, 50), 20: GgmlType("IQ4_NL", 32, 18),
    21: GgmlType("IQ3_S", 256, 110), 22: GgmlType("IQ2_S", 256, 82), 23: GgmlType("IQ4_XS", 256, 136),
    24: GgmlType("I8", 1, 1), 25: GgmlType("I16", 1, 2), 26: GgmlType("I32", 1, 4), 27: GgmlType("I64", 1, 8),
    28: GgmlType("F64", 1, 8), 29: GgmlType("IQ1_M", 256, 56), 30: GgmlType("BF16", 1, 2),
    34: GgmlType("TQ1_0", 256, 54), 35: GgmlType("TQ2_0", 256, 66), 39: GgmlType("MXFP4", 32, 17),
    40: GgmlType("NVFP4", 64, 36), 41: GgmlType("Q1_0", 128, 18), 42: GgmlType("Q2_0", 64, 18),
}
# The plain ggml types, which safetensors spells the same: F32, F16, I8, I16, I32, I64, F64, BF16
PLAIN_TYPES = tuple(t.name for t in GGML_TYPES.values() if element_traits(t.name) is not None)
BY_NAME = {t.name: t for t in GGML_TYPES.values()}

# Metadata value types (gguf.h `enum gguf_type`): the fixed-size ones by their struct format.
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY, UINT32 = 8, 9, 4


@dataclass(frozen=True)
class Array:
    """A metadata array too long to keep (a tokenizer's vocabulary): its item type and length."""

    item_type: int
    count: int


def is_gguf(path: Path) -> bool:
    """Whether `path` names a GGUF file: by its suffix, or by the magic at its start."""
    if path.suffix.lower() == SUFFIX:
        return True
    try:
        with open_regular(path) as file:
            return file.read(4) == MAGIC
    except OSError:
        return False


class GgufSource:
    """A GGUF file's header, checked on `open`, and its tensors, loaded one at a time by `load`."""

    format: ClassVar[str] = "gguf"

    def __init__(self, path: Path, infos: list[TensorInfo], metadata: dict[str, object], version: int,
                 opened: FileState, value_types: dict[str, int] | None = None) -> None:
        self.files = [path]
        self.index: Path | None = None  # a GGUF model is one file
        self.opened = {path: opened}  # its state when its header was read
        self.metadata = metadata
        self.value_types = value_types or {}  # each metadata key's GGUF value type (UINT32, ...)
        self.version = version
        self._infos = infos
        self._by_name = {info.name: info for info in infos}
        self._fd: int | None = None

    @staticmethod
    def open(path: Path | str) -> GgufSource:
        path = Path(path)
        try:
            with open_regular(path) as file:
                opened = FileState.of(file.fileno())
                header = _Header(path, file, opened.size)
                version, metadata, infos = header.read()
        except OSError as exc:
            raise unreadable(path, exc) from exc
        return GgufSource(path, infos, metadata, version, opened, header.types)

    def __enter__(self) -> GgufSource:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def infos(self) -> list[TensorInfo]:
        """Every tensor in data order; no weight is read."""
        return list(self._infos)

    def renamed(self, names: dict[str, str], rows: dict[str, tuple[int, ...]]) -> GgufSource:
        """This file with its tensors under other `names` (old -> new), the rows of those in `rows` (by old
        name) read in that order: what `load` and `infos` give from then on."""
        infos = [replace(i, name=names.get(i.name, i.name), rows=rows.get(i.name)) for i in self._infos]
        return GgufSource(self.files[0], infos, self.metadata, self.version, self.opened[self.files[0]],
                          self.value_types)

    def load(self, name: str) -> torch.Tensor:
        """One tensor as stored, on the CPU, in memory of its own: a plain type's elements of `shape`, a
        quantized type's bytes shaped `(*shape[:-1], bytes per row)`; its rows reordered where its info
        says so."""
        import torch

        info = self._by_name[name]
        data = torch.empty(info.nbytes, dtype=torch.uint8)
        try:
            if self._fd is None:
                with open_regular(info.file) as file:
                    self._fd = os.dup(file.fileno())
            read_into(self._fd, data.numpy().data, info.offset)
        except OSError as exc:
            raise InputError(printable(f"{info.file}: cannot load tensor {quoted(name)} ({info.dtype} "
                                       f"{list(info.shape)}): {exc}"),
                             hint="the file changed since it was opened; run again on the complete file") from exc
        data = in_row_order(data, info)
        if info.dtype in PLAIN_TYPES:
            return data.view(torch_dtype(info.dtype)).reshape(info.shape)
        return data.reshape(*info.shape[:-1], -1) if info.shape else data


class _Header:
    """The reading of one header, every count and length checked against what the file holds."""

    def __init__(self, path: Path, file: BinaryIO, size: int) -> None:
        self.path, self.file, self.size = path, file, size
        self.pos = 0
        self.items = 0  # metadata array items walked so far
        self.types: dict[str, int] = {}  # each metadata key's value type

    def fail(self, message: str, hint: str = _CORRUPT_HINT) -> InputError:
        return InputError(printable(f"{self.path}: {message}"), hint=hint)

    def take(self, n: int, what: str) -> bytes:
        if n > self.size - self.pos:
            raise self.fail(f"truncated: {what} at byte {self.pos} needs {n} bytes but the file has {self.size}",
                            hint="the file is cut short; download or convert it again")
        data = self.file.read(n)
        if len(data) != n:
            raise self.fail(f"the file ended while reading {what} at byte {self.pos}",
                            hint="the file changed while it was read; run again on the complete file")
        self.pos += n
        return data

    def skip(self, n: int, what: str) -> None:
        if n > self.size - self.pos:
            raise self.fail(f"truncated: {what} at byte {self.pos} needs {n} bytes but the file has {self.size}",
                            hint="the file is cut short; download or convert it again")
        self.file.seek(n, os.SEEK_CUR)
        self.pos += n

    def scalar(self, fmt: str, what: str) -> int | float | bool:
        value: int | float | bool = struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]
        return value

    def integer(self, fmt: str, what: str) -> int:
        """An unsigned field of the header's own (`fmt` "<I" or "<Q"): a length, a count, a type or an offset."""
        return int(self.scalar(fmt, what))

    def string(self, what: str) -> str:
        length = self.integer("<Q", f"the length of {what}")
        data = self.take(length, what)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.fail(f"{what} at byte {self.pos - length} is not UTF-8 ({exc.reason})") from None

    def value(self, kind: int, key: str, depth: int = 0) -> object:
        what = f"the value of {quoted(key)}"
        if kind in _SCALARS:
            return self.scalar(_SCALARS[kind], what)
        if kind == STRING:
            return self.string(what)
        if kind != ARRAY:
            raise self.fail(f"metadata {quoted(key)} has the unknown value type {kind}")
        if depth > 2:
            raise self.fail(f"metadata {quoted(key)} nests arrays more than 3 deep")
        item, count = self.integer("<I", what), self.integer("<Q", what)
        if item in _SCALARS:
            width = struct.calcsize(_SCALARS[item])
            if count <= SHORT_ARRAY:
                data = self.take(count * width, what)
                return tuple(struct.unpack(f"<{count}{_SCALARS[item][1]}", data))
            self.skip(count * width, what)
            return Array(item, count)
        if item not in (STRING, ARRAY):
            raise self.fail(f"metadata {quoted(key)} is an array of the unknown value type {item}")
        least = 8 if item == STRING else 12  # a string's length; an array's type and count
        if count > (self.size - self.pos) // least:
            raise self.fail(f"metadata {quoted(key)} claims {count} items, more than the file can hold")
        self.items += count
        if self.items > MAX_ITEMS:
            raise self.fail(f"the metadata holds more than {MAX_ITEMS} array items",
                            hint="qcli reads GGUF headers up to that size; no model file needs more")
        if item == STRING and count <= SHORT_ARRAY:
            return tuple(self.value(item, key, depth + 1) for _ in range(count))
        for _ in range(count):
            self.value(item, key, depth + 1)
        return Array(item, count)

    def read(self) -> tuple[int, dict[str, object], list[TensorInfo]]:
        magic = self.take(4, "the magic")
        if magic != MAGIC:
            raise self.fail(f"not a GGUF file: it starts with {shown(magic)}, not {MAGIC!r}",
                            hint="give a .gguf model file written by llama.cpp or the gguf package")
        raw = self.take(4, "the version")
        version = struct.unpack("<I", raw)[0]
        if version not in VERSIONS:
            if struct.unpack(">I", raw)[0] in VERSIONS:
                raise self.fail("a big-endian GGUF file",
                                hint="convert it to little-endian with the gguf package's gguf_convert_endian.py")
            if version == 1:
                raise self.fail("GGUF version 1 (32-bit counts), which llama.cpp no longer reads",
                                hint="convert it again with a current llama.cpp (GGUF version 3)")
            raise self.fail(f"unknown GGUF version {version}; qcli reads versions 2 and 3")
        tensor_count, kv_count = self.integer("<Q", "the tensor count"), self.integer("<Q", "the metadata count")
        if kv_count > (self.size - self.pos) // 12 or tensor_count > (self.size - self.pos) // 24:
            raise self.fail(f"the header claims {tensor_count} tensors and {kv_count} metadata entries, more "
                            f"than a file of {self.size} bytes can describe")
        metadata: dict[str, object] = {}
        for _ in range(kv_count):
            key = self.string("a metadata key")
            if key in metadata:
                raise self.fail(f"metadata {quoted(key)} appears twice")
            self.types[key] = self.integer("<I", f"the type of {quoted(key)}")
            metadata[key] = self.value(self.types[key], key)
        alignment = self.alignment(metadata)
        self.split(metadata)
        described = [self.tensor() for _ in range(tensor_count)]
        data_start = -(-self.pos // alignment) * alignment
        infos = self.placed(described, data_start, alignment)
        return version, metadata, infos

    def alignment(self, metadata: dict[str, object]) -> int:
        alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if isinstance(alignment, bool) or not isinstance(alignment, int) or alignment <= 0 or \
                alignment & (alignment - 1):
            raise self.fail(f"general.alignment is {shown(alignment)}, not a power of two")
        return alignment

    def split(self, metadata: dict[str, object]) -> None:
        count = metadata.get("split.count", 1)
        if isinstance(count, int) and count > 1:
            raise self.fail(f"one of {count} split GGUF files (split.count)",
                            hint="merge the parts into one file first: llama-gguf-split --merge FIRST-PART OUT.gguf")

    def tensor(self) -> tuple[str, tuple[int, ...], GgmlType, int]:
        name = self.string("a tensor name")
        if not name:
            raise self.fail("a tensor has an empty name")
        n_dims = self.integer("<I", f"the rank of tensor {quoted(name)}")
        if n_dims > MAX_DIMS:
            raise self.fail(f"tensor {quoted(name)} has {n_dims} axes; GGUF tensors have at most {MAX_DIMS}")
        ne = tuple(self.integer("<Q", f"the shape of tensor {quoted(name)}") for _ in range(n_dims))
        type_id = self.integer("<I", f"the type of tensor {quoted(name)}")
        offset = self.integer("<Q", f"the offset of tensor {quoted(name)}")
        ggml = GGML_TYPES.get(type_id)
        if ggml is None:
            raise self.fail(f"tensor {quoted(name)} has the unknown ggml type {type_id}",
                            hint=f"qcli knows the ggml types {', '.join(t.name for t in GGML_TYPES.values())}; "
                            "a newer llama.cpp may have written it")
        if math.prod(d for d in ne if d) >= 1 << 63:  # ggml counts elements in an int64
            raise self.fail(f"tensor {quoted(name)} has the shape {shown(list(ne[::-1]))}, whose size overflows "
                            "ggml's 64-bit counts")
        if ne and ne[0] % ggml.block:
            raise self.fail(f"tensor {quoted(name)} ({ggml.name}) has rows of {ne[0]} values, not a whole "
                            f"number of its {ggml.block}-value blocks")
        return name, ne[::-1], ggml, offset

    def placed(self, described: list[tuple[str, tuple[int, ...], GgmlType, int]], data_start: int,
               alignment: int) -> list[TensorInfo]:
        """The tensors in data order, each inside the file, aligned, and overlapping none."""
        infos, seen = [], set()
        for name, shape, ggml, offset in described:
            if name in seen:
                raise self.fail(f"tensor {quoted(name)} appears twice")
            seen.add(name)
            if offset % alignment:
                raise self.fail(f"tensor {quoted(name)} starts at data byte {offset}, not a multiple of the "
                                f"alignment {alignment}")
            nbytes = math.prod(shape) // ggml.block * ggml.nbytes
            if data_start + offset + nbytes > self.size:
                raise self.fail(f"truncated: tensor {quoted(name)} ends at byte {data_start + offset + nbytes} "
                                f"but the file has {self.size} bytes",
                                hint="the file is cut short; download or convert it again")
            infos.append(TensorInfo(name, ggml.name, shape, nbytes, self.path, data_start + offset))
        infos.sort(key=lambda i: (i.offset, i.nbytes))
        for before, after in zip(infos, infos[1:], strict=False):
            if after.offset < before.offset + before.nbytes:
                raise self.fail(f"tensor {quoted(after.name)} overlaps tensor {quoted(before.name)}")
        return infos
