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

import json
import math
import os
import stat
import struct
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from qcli.errors import InputError
from qcli.io.dtypes import SAFETENSORS_BITS, SAFETENSORS_TORCH_NAMES, torch_dtype
from qcli.io.source import TensorInfo
from qcli.text import printable, quoted, shown

if TYPE_CHECKING:
    import torch

__all__ = ["NotRegularFile", "SafetensorsSource", "open_regular"]

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
READ_MAX = 1 << 30  # bytes per read call (Linux reads at most 2 GiB - 4 KiB at once)
MAX_HEADER_SIZE = 100_000_000  # the safetensors library refuses larger headers
_CORRUPT_HINT = "the file is damaged or was not written as safetensors; download or export it again"
_INDEX_HINT = "the index and its shards do not belong together; download or export the checkpoint again"
NOT_REGULAR_HINT = "qcli reads regular files only, not pipes, devices or sockets; save the data to a file first"


# -- hostile files ---------------------------------------------------------------------------------

class NotRegularFile(OSError):
    """The path names a FIFO, a device, a socket or a directory where a regular file is read."""

    def __init__(self, kind: str) -> None:
        super().__init__(f"not a regular file ({kind})")
        self.kind = kind


def file_kind(mode: int) -> str:
    """What a non-regular `st_mode` is, in words."""
    for test, kind in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISDIR, "a directory")):
        if test(mode):
            return kind
    return "not a file"


def open_regular(path: Path | str) -> BinaryIO:
    """`path` opened for reading, only if it is a regular file (after symbolic links).

    A FIFO, a device or a socket raises `NotRegularFile` (an `OSError`) without being opened: opening a
    FIFO blocks until a writer comes, and a device like /dev/zero never ends. The check is made again on
    the open descriptor (opened non-blocking), so a FIFO swapped in between cannot block either.
    """
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        raise NotRegularFile(file_kind(mode))
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFile(file_kind(mode))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def not_regular_problem(path: Path) -> str | None:
    """None when `path` is missing or a regular file (after links), else what it is (`a FIFO`, ...)."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    return None if stat.S_ISREG(mode) else file_kind(mode)


class SafetensorsSource:
    """A checkpoint's headers, checked on `open`, and its tensors, loaded one at a time by `load`."""

    def __init__(self, files: list[Path], infos: list[TensorInfo], index: Path | None = None) -> None:
        self.files = files
        self.index = index  # the index file of a sharded checkpoint
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
            read_into(self._fd(info.file), memoryview(data.numpy()), info.offset)
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


def read_into(fd: int, into: memoryview, offset: int) -> None:
    """Fill `into` from `fd` at `offset`; OSError when the file ends first."""
    done = 0
    while done < into.nbytes:
        count = os.preadv(fd, [into[done : done + READ_MAX]], offset + done)
        if count == 0:
            raise OSError(f"the file ends {into.nbytes - done} bytes before the tensor does")
        done += count


def _open_files(files: list[Path]) -> SafetensorsSource:
    return SafetensorsSource(files, [info for file in files for info in read_header(file)])


def _fail(path: Path, message: str, hint: str = _CORRUPT_HINT) -> InputError:
    return InputError(printable(f"{path}: {message}"), hint=hint)


def _unreadable(path: Path, exc: OSError) -> InputError:
    if isinstance(exc, NotRegularFile):
        return InputError(printable(f"cannot read {path}: {exc}"), hint=NOT_REGULAR_HINT)
    return InputError(printable(f"cannot read {path}: {exc.strerror or exc}"),
                      hint="check the path and its permissions")


def _unique_keys(path: Path) -> Callable[[list[tuple[str, object]]], dict[str, object]]:
    """A JSON `object_pairs_hook` that refuses a key given twice (json keeps the last silently)."""

    def hook(pairs: list[tuple[str, object]]) -> dict[str, object]:
        result = dict(pairs)  # built in C: a header's 200k objects are checked in a blink
        if len(result) != len(pairs):
            seen: set[str] = set()
            twice = next(key for key, _ in pairs if key in seen or seen.add(key))
            raise _fail(path, f"{quoted(twice)} appears twice in the JSON")
        return result

    return hook


def _read_json(path: Path, data: bytes) -> object:
    try:
        return json.loads(data.decode("utf-8"), object_pairs_hook=_unique_keys(path))
    except UnicodeDecodeError as exc:
        raise _fail(path, f"the JSON header is not UTF-8 ({exc.reason} at byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise _fail(path, f"the JSON header does not parse: {exc}") from None
    except RecursionError:  # `[[[[...` deeper than the interpreter's stack; a real header nests 3 deep
        raise _fail(path, "the JSON header is nested too deeply (arrays or objects inside each other "
                    "past Python's recursion limit)") from None
    except ValueError:  # json's only other ValueError: an integer past int's digit limit
        raise _fail(path, f"the JSON header holds an integer of more than {sys.get_int_max_str_digits()} "
                    "digits") from None


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def read_header(path: Path) -> list[TensorInfo]:
    """The tensors of one safetensors file in data order, after checking the header against the file."""
    try:
        with open_regular(path) as file:
            size = os.fstat(file.fileno()).st_size
            prefix = file.read(8)
            if len(prefix) < 8:
                raise _fail(path, f"not a safetensors file: {size} bytes, shorter than the 8-byte length")
            (header_size,) = struct.unpack("<Q", prefix)
            if header_size > size - 8:
                raise _fail(path, f"the header length {header_size} is larger than the file ({size} bytes)",
                            hint="the file is cut short or is not safetensors; download or export it again")
            if header_size > MAX_HEADER_SIZE:
                raise _fail(path, f"the header length {header_size} exceeds the maximum of {MAX_HEADER_SIZE}")
            header = _read_json(path, file.read(header_size))
    except OSError as exc:
        raise _unreadable(path, exc) from exc
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


def read_weight_map(index: Path, format: str) -> dict[str, Path]:
    """The tensor-to-shard map of a sharded checkpoint's index (Hugging Face's `weight_map`, which qcli
    writes for sharded burnpack output too), each shard a regular file beside the index."""
    try:
        with open_regular(index) as file:
            if os.fstat(file.fileno()).st_size > MAX_HEADER_SIZE:
                raise _fail(index, f"the index is larger than {MAX_HEADER_SIZE} bytes")
            data = file.read(MAX_HEADER_SIZE + 1)
        document = _read_json(index, data)
    except OSError as exc:
        raise _unreadable(index, exc) from exc
    weight_map = document.get("weight_map") if isinstance(document, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise _fail(index, "no 'weight_map' of tensor names to shard files",
                    hint=f"a sharded checkpoint's index maps each tensor name to its .{format} shard")
    for shard in sorted(set(weight_map.values())):
        if Path(shard).name != shard or shard in ("", ".", ".."):
            raise _fail(index, f"shard {quoted(shard)} is not a file name beside the index", _INDEX_HINT)
        kind = not_regular_problem(index.parent / shard)
        if kind is not None:
            raise _fail(index, f"shard {quoted(shard)} is not a regular file ({kind})", NOT_REGULAR_HINT)
        if not (index.parent / shard).is_file():
            raise _fail(index, f"shard {quoted(shard)} is missing", hint="download every shard the index lists")
    return {name: index.parent / shard for name, shard in weight_map.items()}


def check_weight_map(index: Path, weight_map: dict[str, Path], held: list[tuple[str, Path]]) -> None:
    """Every tensor the shards hold (`held`: name and shard) is in exactly the shard the index names."""
    where: dict[str, Path] = {}
    for name, file in held:
        if name in where:
            raise _fail(index, f"tensor {quoted(name)} is in both {where[name].name} and {file.name}", _INDEX_HINT)
        where[name] = file
    for name, shard in weight_map.items():
        if where.get(name) != shard:
            raise _fail(index, f"tensor {quoted(name)} is listed in {shard.name} but that file does not hold it",
                        _INDEX_HINT)
    for name, file in where.items():
        if name not in weight_map:
            raise _fail(index, f"tensor {quoted(name)} in {file.name} is not listed in the index", _INDEX_HINT)
