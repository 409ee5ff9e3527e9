"""The lazy safetensors source: one file, a directory, or a sharded checkpoint behind its index.

Every header is read and checked by qcli itself first, so a corrupt or inconsistent checkpoint is
refused, with the file and tensor named, before any weight is read. Tensors are then read one at a
time from their offsets into memory of their own (`load`).

```
[ u64 LE header length n ][ n bytes of JSON: name -> {dtype, shape, data_offsets}, "__metadata__" ][ data ]
```

`data_offsets` are relative to the data section; the `safetensors` library requires the tensors to tile
it exactly, in offset order, with nothing left over, so qcli refuses gaps and trailing bytes as it would.
"""

from __future__ import annotations

import math
import os
import struct
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from qcli.errors import InputError
from qcli.io.dtypes import SAFETENSORS_BITS, SAFETENSORS_TORCH_NAMES, torch_dtype
from qcli.io.files import FileState, open_regular, read_into, read_json, unreadable
from qcli.io.hf_index import CORRUPT_HINT, check_weight_map, read_weight_map
from qcli.io.source import TensorInfo
from qcli.text import printable, quoted, shown

if TYPE_CHECKING:
    import torch

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
MAX_HEADER_SIZE = 100_000_000  # the safetensors library refuses larger headers


class SafetensorsSource:
    """A checkpoint's headers, checked on `open`, and its tensors, loaded one at a time by `load`."""

    format: ClassVar[str] = "safetensors"

    def __init__(self, files: list[Path], infos: list[TensorInfo], index: Path | None = None,
                 opened: dict[Path, FileState] | None = None) -> None:
        self.files = files
        self.index = index  # the index file of a sharded checkpoint
        self.opened = opened or {}  # each file's state when its header was read
        self._infos = infos
        self._by_name = {info.name: info for info in infos}
        self._fds: dict[Path, int] = {}

    @staticmethod
    def open(path: Path | str) -> SafetensorsSource:
        """A `.safetensors` file, a directory with `model.safetensors` or its index, or the index itself."""
        path = Path(path)
        if path.is_dir():
            # exists(), not is_file(): a FIFO or device under the name is refused as such when read
            single, index = path / SINGLE_FILE, path / INDEX_FILE
            if single.exists() and index.exists():
                raise InputError(printable(f"{path} holds both {SINGLE_FILE} and {INDEX_FILE}"),
                                 hint="give the path of the one to read")
            if index.exists():
                return _open_index(index)
            if single.exists():
                return _open_files([single])
            found = ", ".join(sorted(p.name for p in path.glob("*.safetensors")))
            raise InputError(printable(f"{path} holds neither {SINGLE_FILE} nor {INDEX_FILE}"),
                             hint=printable(f"give the .safetensors file itself (found here: {found})") if found
                             else "give a .safetensors file or a directory that holds one")
        if path.name.endswith(".index.json"):
            return _open_index(path)
        return _open_files([path])

    def __enter__(self) -> SafetensorsSource:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the open files."""
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def infos(self) -> list[TensorInfo]:
        """Every tensor, file by file in data order; no weight is read."""
        return list(self._infos)

    def load(self, name: str) -> torch.Tensor:
        """One tensor in its own dtype, on the CPU, read into memory of its own: nothing of the file stays
        mapped, so memory holds the tensors being worked on, never the model (the page cache keeps the
        file's pages for the next read)."""
        import torch

        info = self._by_name[name]
        if info.dtype not in SAFETENSORS_TORCH_NAMES:
            raise InputError(printable(f"{info.file}: cannot load tensor {quoted(name)} ({info.dtype} "
                                       f"{list(info.shape)}): torch has no type for {info.dtype}"),
                             hint="keep the tensor out of the recipe or export it in another dtype")
        data = torch.empty(info.nbytes, dtype=torch.uint8)
        try:
            read_into(self._fd(info.file), data.numpy().data, info.offset)
        except OSError as exc:
            raise InputError(
                printable(f"{info.file}: cannot load tensor {quoted(name)} ({info.dtype} {list(info.shape)}): {exc}"),
                hint="the file changed since it was opened; run again on the complete file",
            ) from exc
        return data.view(torch_dtype(info.dtype)).reshape(info.shape)

    def _fd(self, path: Path) -> int:
        if path not in self._fds:
            with open_regular(path) as file:
                self._fds[path] = os.dup(file.fileno())
        return self._fds[path]


def _open_files(files: list[Path]) -> SafetensorsSource:
    opened: dict[Path, FileState] = {}
    infos = [info for file in files for info in read_header(file, opened)]
    return SafetensorsSource(files, infos, opened=opened)


def _fail(path: Path, message: str, hint: str = CORRUPT_HINT) -> InputError:
    return InputError(printable(f"{path}: {message}"), hint=hint)


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def read_header(path: Path, opened: dict[Path, FileState] | None = None) -> list[TensorInfo]:
    """The tensors of one safetensors file in data order, after checking the header against the file; the
    file's state when it was opened recorded in `opened`."""
    try:
        with open_regular(path) as file:
            state = FileState.of(file.fileno())
            if opened is not None:
                opened[path] = state
            size = state.size
            prefix = file.read(8)
            if len(prefix) < 8:
                raise _fail(path, f"not a safetensors file: {size} bytes, shorter than the 8-byte length")
            (header_size,) = struct.unpack("<Q", prefix)
            if header_size > size - 8:
                raise _fail(path, f"the header length {header_size} is larger than the file ({size} bytes)",
                            hint="the file is cut short or is not safetensors; download or export it again")
            if header_size > MAX_HEADER_SIZE:
                raise _fail(path, f"the header length {header_size} exceeds the maximum of {MAX_HEADER_SIZE}")
            header = read_json(path, file.read(header_size), CORRUPT_HINT)
    except OSError as exc:
        raise unreadable(path, exc) from exc
    if not isinstance(header, dict):
        raise _fail(path, "the JSON header is not an object")
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise _fail(path, "__metadata__ is not a map of strings")
    data_size = size - 8 - header_size
    placed = []
    for name, descriptor in header.items():
        info, (begin, end) = _tensor_info(path, name, descriptor, 8 + header_size)
        if end > data_size:
            raise _fail(path, f"truncated: tensor {quoted(name)} ends at byte {8 + header_size + end} but the file "
                        f"has {size} bytes", hint="the file is cut short; download or export it again")
        placed.append((begin, end, info))
    placed.sort(key=lambda item: (item[0], item[1]))
    expected = 0
    for begin, end, info in placed:
        if begin != expected:
            gap = begin - expected
            what = "overlaps the tensor before it" if gap < 0 else f"follows a gap of {gap} bytes"
            raise _fail(path, f"tensor {quoted(info.name)} at data bytes {begin}..{end} {what}")
        expected = end
    if expected != data_size:
        raise _fail(path, f"{data_size - expected} bytes follow the last tensor")
    return [info for _, _, info in placed]


def _tensor_info(path: Path, name: str, descriptor: object, data_start: int) -> tuple[TensorInfo, tuple[int, int]]:
    if not name:
        raise _fail(path, "a tensor has an empty name")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise _fail(path, f"tensor name {shown(name)} is not valid UTF-8") from None
    if not isinstance(descriptor, dict) or not {"dtype", "shape", "data_offsets"} <= descriptor.keys():
        raise _fail(path, f"tensor {quoted(name)} lacks dtype, shape or data_offsets")
    dtype, shape, offsets = descriptor["dtype"], descriptor["shape"], descriptor["data_offsets"]
    if not isinstance(dtype, str) or dtype not in SAFETENSORS_BITS:
        raise _fail(path, f"tensor {quoted(name)} has the unknown dtype {shown(dtype)}",
                    hint=f"safetensors dtypes are {', '.join(SAFETENSORS_BITS)}")
    if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
        raise _fail(path, f"tensor {quoted(name)}: shape {shown(shape)} is not a list of sizes")
    pair = isinstance(offsets, list) and len(offsets) == 2 and all(_is_count(o) for o in offsets)
    if not pair or offsets[1] < offsets[0]:
        raise _fail(path, f"tensor {quoted(name)}: data_offsets {shown(offsets)} is not [begin, end] with "
                    "begin <= end")
    bits = math.prod(shape) * SAFETENSORS_BITS[dtype]
    if bits % 8 or offsets[1] - offsets[0] != bits // 8:
        raise _fail(path, f"tensor {quoted(name)} spans {shown(offsets[1] - offsets[0])} bytes but its shape "
                    f"{shown(shape)} and dtype {dtype} need {_byte_count(bits)}")
    info = TensorInfo(name, dtype, tuple(shape), bits // 8, path, data_start + offsets[0])
    return info, (offsets[0], offsets[1])


def _byte_count(bits: int) -> str:
    """`bits` as bytes, exactly: `16`, `1.5` (no float, which a huge shape would overflow)."""
    whole, rest = divmod(bits, 8)
    return shown(whole) + (f".{rest * 125:03d}".rstrip("0") if rest else "")


def _open_index(index: Path) -> SafetensorsSource:
    """A sharded checkpoint: every tensor the index names must be in exactly its shard, and nothing else."""
    weight_map = read_weight_map(index, "safetensors")
    source = _open_files(sorted(set(weight_map.values())))
    source.index = index
    check_weight_map(index, weight_map, [(info.name, info.file) for info in source.infos()])
    return source
