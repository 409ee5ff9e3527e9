"""Burn's burnpack container (`.bpk`): a streaming atomic writer and a bounded reader.

```
[ header: magic "NRUB", u16 version, u32 metadata_size ][ CBOR metadata ][ zeros up to D ][ tensors ]
```

D is the first multiple of 256 after the metadata; each tensor starts at a multiple of 256 relative to D,
the gaps are zeros, and nothing follows the last tensor (burnpack-spec §1). The metadata is encoded as
Burn's ciborium writes it: struct fields in declaration order, maps sorted bytewise by key, the shortest
integers and floats (§3). The container never interprets a payload: a QFloat tensor's length comes from
`qcli.layout` through its `TensorEntry`.
"""

from __future__ import annotations

import functools
import json
import os
import re
import struct
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import BinaryIO, NoReturn, TypeVar, cast

import cbor2

from qcli import BURN_VERSION
from qcli.errors import InputError, OutputError
from qcli.io.digest import digest
from qcli.io.dtypes import DType, QFloat, dtype_from_serde
from qcli.io.files import NOT_REGULAR_HINT, NotRegularFile, open_regular
from qcli.io.temporary import TemporaryFile, sync
from qcli.io.writeback import Writeback
from qcli.text import printable, shown

__all__ = ["BurnpackReader", "BurnpackWriter", "TensorEntry"]

_V = TypeVar("_V")

MAGIC_NUMBER = 0x4255524E  # "NRUB" on disk
FORMAT_VERSION = 1
HEADER_SIZE = 10
ALIGNMENT = 256
EXTENSION = ".bpk"
GIB = 1024**3
# Burn's reader limits (burn-pack `base.rs`): it refuses anything larger, as a defence against hostile files.
# Named here alone: the plan, the output and the reader take them, and their words, from here (`gib`).
# MAX_FILE_SIZE is Burn 0.22.1's and 0.21.0's; Burn 0.23.0-pre.1 raised its reader's default to 500 GiB
# (burn-pack 0.23.0-pre.1 `base.rs`), the only limit that differs by release (`max_file_size`).
MAX_FILE_SIZE = 100 * GIB
MAX_FILE_SIZES = {"0.23.0-pre.1": 500 * GIB}
MAX_METADATA_SIZE = 100 * 1024**2
MAX_CBOR_RECURSION_DEPTH = 128
MAX_TENSOR_COUNT = 100_000
MAX_TENSOR_SIZE = 10 * GIB
U64_MAX = 2**64 - 1
# qcli's own limits on JSON that a metadata value holds (`metadata_json`): what qcli writes there (a list of
# names) nests 1 deep; json recurses once a level, and a long value is read whole.
MAX_METADATA_JSON_DEPTH = 32
MAX_METADATA_JSON_SIZE = 16 * 1024**2

_HEADER = struct.Struct("<IHI")


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a pack: its name, Burn DType, logical shape and payload length in bytes."""

    name: str
    dtype: DType
    shape: tuple[int, ...]
    nbytes: int
    param_id: int | None = None


def max_file_size(burn_version: str | None) -> int:
    """The largest file Burn `burn_version`'s reader opens (None or a release not listed: MAX_FILE_SIZE)."""
    return MAX_FILE_SIZES.get(burn_version or "", MAX_FILE_SIZE)


def gib(limit: int) -> str:
    """A size limit as messages name it: `10 GiB` for MAX_TENSOR_SIZE."""
    return f"{limit // GIB} GiB"


def align(offset: int) -> int:
    """The first multiple of 256 at or after `offset`."""
    return -(-offset // ALIGNMENT) * ALIGNMENT


def data_section_start(metadata_size: int) -> int:
    """D: where the data section starts for a metadata blob of `metadata_size` bytes."""
    return align(HEADER_SIZE + metadata_size)


def header_bytes(metadata_size: int) -> bytes:
    return _HEADER.pack(MAGIC_NUMBER, FORMAT_VERSION, metadata_size)


def place(entries: Sequence[TensorEntry]) -> list[tuple[int, int]]:
    """`[start, end)` of each entry relative to D, in the given order: every start aligned to 256."""
    offsets: list[tuple[int, int]] = []
    end = 0
    for entry in entries:
        start = align(end) if offsets else 0
        end = start + entry.nbytes
        offsets.append((start, end))
    return offsets


@dataclass(frozen=True)
class _ShortestFloat:
    """A float that CBOR-encodes in the narrowest width that holds it exactly, as ciborium does.

    cbor2 writes every Python float as f64 outside canonical mode, and canonical mode would also re-sort
    the maps, so the float travels wrapped to the encoder's `default` hook.
    """

    value: float


def _encode_shortest_float(encoder: cbor2.CBOREncoder, value: object) -> None:
    if not isinstance(value, _ShortestFloat):
        raise cbor2.CBOREncodeTypeError(f"cannot encode {type(value).__name__}")
    for head, fmt in ((0xF9, ">e"), (0xFA, ">f")):
        try:
            packed = struct.pack(fmt, value.value)
        except OverflowError:
            continue
        if struct.unpack(fmt, packed)[0] == value.value:
            encoder.write(bytes([head]) + packed)
            return
    encoder.write(b"\xfb" + struct.pack(">d", value.value))


def _bytewise(mapping: Mapping[str, _V]) -> dict[str, _V]:
    """The map in Rust's `BTreeMap<String, _>` order: bytewise on UTF-8."""
    return {key: mapping[key] for key in sorted(mapping, key=lambda k: k.encode("utf-8"))}


def _descriptor(entry: TensorEntry, span: tuple[int, int]) -> dict[str, object]:
    """A `TensorDescriptor`: dtype, shape, data_offsets and, when set, param_id, in that order."""
    descriptor: dict[str, object] = {
        "dtype": entry.dtype.to_serde(), "shape": list(entry.shape), "data_offsets": list(span)
    }
    if entry.param_id is not None:
        descriptor["param_id"] = entry.param_id
    return descriptor


def size_bound(entries: Sequence[TensorEntry], metadata: Mapping[str, str] | None = None) -> int:
    """An upper bound on the size of the pack of `entries`, without encoding it: `fixed_bound` and each
    entry's `entry_bound` (which the output sums to cut shards, `qcli.output.shards.split`)."""
    return fixed_bound(metadata) + sum(entry_bound(entry) for entry in entries)


def entry_bound(entry: TensorEntry) -> int:
    """Its bytes rounded up to the alignment, its name, and its descriptor with the widest possible offsets."""
    descriptor = _descriptor_bound(entry.dtype, tuple(entry.shape), entry.param_id)
    return align(entry.nbytes) + _text_size(entry.name) + descriptor


def _text_size(text: str) -> int:
    """The bytes of `text` as a CBOR text string (RFC 8949 §3: its head, 1 to 9 bytes, then its UTF-8)."""
    n = len(text.encode("utf-8"))
    return n + (1 if n < 24 else 2 if n < 1 << 8 else 3 if n < 1 << 16 else 5 if n < 1 << 32 else 9)


@functools.lru_cache(maxsize=1 << 12)  # a model's tensors share a few dtypes and shapes
def _descriptor_bound(dtype: DType, shape: tuple[int, ...], param_id: int | None) -> int:
    return len(cbor2.dumps(_descriptor(TensorEntry("", dtype, shape, 0, param_id), (U64_MAX, U64_MAX))))


def fixed_bound(metadata: Mapping[str, str] | None) -> int:
    """Header, the top-level map and its longest possible headers, user metadata, the padding to D."""
    user = len(cbor2.dumps({"metadata": _bytewise(metadata)})) if metadata else 0
    return HEADER_SIZE + len(cbor2.dumps({"tensors": None})) + 9 + user + ALIGNMENT - 1


def encode_metadata(
    entries: Sequence[TensorEntry],
    offsets: Sequence[tuple[int, int]],
    metadata: Mapping[str, str] | None = None,
    scalars: Mapping[str, Mapping[str, object]] | None = None,
) -> bytes:
    """The CBOR metadata blob: `tensors`, then `metadata` and `scalars` when not empty."""
    tensors = {entry.name: _descriptor(entry, span) for entry, span in zip(entries, offsets, strict=True)}
    top: dict[str, object] = {"tensors": _bytewise(tensors)}
    if metadata:
        top["metadata"] = _bytewise(metadata)
    if scalars:
        top["scalars"] = {
            # a "Float" value is a float (`_check_scalar`)
            name: {kind: _ShortestFloat(cast(float, v)) if kind == "Float" else v for kind, v in scalar.items()}
            for name, scalar in _bytewise(scalars).items()
        }
    return cbor2.dumps(top, default=_encode_shortest_float)


def _checked_entry(entry: TensorEntry) -> TensorEntry:
    """The entry with its shape as a tuple; ValueError where the producer is wrong."""
    if not isinstance(entry.name, str):
        raise ValueError(f"tensor name {entry.name!r} is not a string")
    entry.name.encode("utf-8")  # a lone surrogate cannot be stored
    shape = tuple(entry.shape)
    if not all(_is_u64(d) for d in shape):
        raise ValueError(f"tensor {entry.name!r}: shape {shape} is not a list of u64")
    if entry.param_id is not None and not _is_u64(entry.param_id):
        raise ValueError(f"tensor {entry.name!r}: param_id {entry.param_id!r} is not a u64")
    if isinstance(entry.nbytes, bool) or not isinstance(entry.nbytes, int) or entry.nbytes < 0:
        raise ValueError(f"tensor {entry.name!r}: nbytes {entry.nbytes!r} is not a length")
    # Burn's check_byte_len; QFloat is exempt, its length belongs to the quantization layout.
    if not isinstance(entry.dtype, QFloat) and entry.nbytes != entry.dtype.nbytes(shape):
        raise ValueError(
            f"tensor {entry.name!r} declares {entry.nbytes} bytes but its shape {list(shape)} and dtype "
            f"{entry.dtype} need {entry.dtype.nbytes(shape)}"
        )
    return replace(entry, shape=shape)


def _check_scalar(name: str, scalar: object) -> None:
    ranges = {"Int": (-(2**63), 2**63 - 1), "UInt": (0, U64_MAX)}
    if isinstance(scalar, Mapping) and len(scalar) == 1:
        ((kind, value),) = scalar.items()
        if kind in ranges and isinstance(value, int) and not isinstance(value, bool):
            low, high = ranges[kind]
            if low <= value <= high:
                return
        if (kind, type(value)) in (("Float", float), ("Bool", bool)):
            return
    raise ValueError(f"scalar {name!r}: {scalar!r} is not one of {{'Int': i64}}, {{'UInt': u64}}, "
                     "{'Float': float}, {'Bool': bool}")


def _byte_view(data: object) -> memoryview:
    """The raw bytes of a bytes-like object or a contiguous CPU tensor, without copying them."""
    torch = sys.modules.get("torch")  # a tensor can only exist once torch is loaded
    if torch is not None and isinstance(data, torch.Tensor):
        if data.device.type != "cpu" or not data.is_contiguous():
            raise ValueError(f"tensor data must be contiguous and on the CPU, got {data.device} "
                             f"contiguous={data.is_contiguous()}")
        return memoryview(data.detach().reshape(-1).view(torch.uint8).numpy())
    view = memoryview(data)  # type: ignore[arg-type]  # by design: TypeError for anything not bytes-like
    if not view.c_contiguous:
        raise ValueError("tensor data must be a contiguous buffer")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


class BurnpackWriter:
    """Streams a burnpack to a temporary file beside `target` and renames it into place on `commit()`.

    All lengths are known up front, so the header and metadata are written first and each tensor is
    written as it is handed over, in the entries' order: only one tensor is ever held. Leaving the
    context without `commit()`, on an exception or an interrupt, removes the temporary file; the target
    is replaced only by the rename, so it is either untouched or complete. `finish()` completes the
    file without renaming it, so that it can be checked first; with `digests`, `self.digests` maps each
    written tensor to the digest of the bytes handed over (`qcli.io.digest`), for that check. The data
    goes to disk while tensors are still being written (`qcli.io.writeback`).
    """

    def __init__(
        self,
        target: Path | str,
        entries: Sequence[TensorEntry],
        metadata: Mapping[str, str] | None = None,
        scalars: Mapping[str, Mapping[str, object]] | None = None,
        *,
        digests: bool = False,
    ) -> None:
        self.target = Path(target)
        self.digests: dict[str, bytes] | None = {} if digests else None
        self._entries = [_checked_entry(entry) for entry in entries]
        names = [entry.name for entry in self._entries]
        if len(set(names)) != len(names):
            duplicate = next(name for name in names if names.count(name) > 1)
            raise ValueError(f"Duplicate tensor name '{duplicate}'")
        for key, value in (metadata or {}).items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise ValueError(f"metadata {key!r}: {value!r} is not a string pair")
        for name, scalar in (scalars or {}).items():
            _check_scalar(name, scalar)
        self._offsets = place(self._entries)
        self._metadata_blob = encode_metadata(self._entries, self._offsets, metadata, scalars)
        if len(self._metadata_blob) > 0xFFFF_FFFF:
            raise ValueError(f"{len(self._metadata_blob)} bytes of metadata do not fit the u32 header field")
        self.data_start = data_section_start(len(self._metadata_blob))
        self.file_size = self.data_start + max((end for _, end in self._offsets), default=0)
        self._temporary = TemporaryFile(self.target)
        self._file: BinaryIO | None = None
        self._writeback: Writeback | None = None
        self._next = 0
        self._position = 0
        self._finished = False

    def __enter__(self) -> BurnpackWriter:
        try:
            with self._output_errors():
                self._file = self._temporary.create()
                prefix = header_bytes(len(self._metadata_blob)) + self._metadata_blob
                self._file.write(prefix + bytes(self.data_start - len(prefix)))
                self._writeback = Writeback(self._file.fileno())
        except BaseException:
            self.__exit__()  # a failed __enter__ gets no __exit__ from the with statement
            raise
        self._position = self.data_start
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            if self._writeback is not None:
                writeback, self._writeback = self._writeback, None
                writeback.close()
        except OSError:
            pass  # the file is discarded
        try:
            if self._file is not None:
                file, self._file = self._file, None
                file.close()
        except OSError:
            pass  # closing flushes the buffer, which fails again after a write error; the file is discarded
        finally:
            self._temporary.discard()

    def write(self, name: str, data: object) -> None:
        """Append the next tensor's bytes; `name` must be the next entry and `data` exactly its `nbytes`."""
        if self._file is None or self._writeback is None:  # both are set together by __enter__
            raise ValueError("BurnpackWriter.write() outside its context or after commit()")
        if self._next == len(self._entries):
            raise ValueError(f"tensor {name!r} written after every entry was written")
        entry = self._entries[self._next]
        if name != entry.name:
            raise ValueError(f"tensor {name!r} written where the entries' order expects {entry.name!r}")
        view = _byte_view(data)
        if view.nbytes != entry.nbytes:
            raise ValueError(f"tensor '{name}': deferred source has inconsistent length "
                             f"(expected {entry.nbytes}, got {view.nbytes})")
        if self.digests is not None:
            self.digests[name] = digest(view)
        start = self.data_start + self._offsets[self._next][0]
        with self._output_errors():
            self._file.write(bytes(start - self._position))
            self._file.write(view)
        self._writeback.wrote(start + entry.nbytes - self._position)
        self._position = start + entry.nbytes
        self._next += 1

    def finish(self) -> Path:
        """Flush, fsync and close the complete temporary file, and return its path, still beside the target.

        What `finish` returns can be read back and checked before `commit` puts it in place.
        """
        if self._file is None or self._writeback is None:
            raise ValueError("BurnpackWriter.finish() outside its context or twice")
        if self._next != len(self._entries):
            missing = len(self._entries) - self._next
            first = self._entries[self._next].name
            raise ValueError(f"{missing} tensors unwritten, from {first!r}")
        file, self._file = self._file, None
        writeback, self._writeback = self._writeback, None
        with self._output_errors():
            try:
                writeback.close()
                sync(file)
            finally:
                file.close()
        self._finished = True
        return self._temporary.path

    def commit(self) -> None:
        """`finish()` if not done yet, rename the file onto the target, fsync the directory."""
        if not self._finished:
            self.finish()
        elif self._temporary.committed:
            raise ValueError("BurnpackWriter.commit() twice")
        with self._output_errors():
            self._temporary.commit()

    @contextmanager
    def _output_errors(self) -> Iterator[None]:
        try:
            yield
        except OSError as exc:
            raise OutputError(
                f"cannot write {self.target}: {exc.strerror or exc}",
                hint=f"check that {self.target.parent} exists, is writable and has {self.file_size} bytes "
                "free; the target was left untouched",
            ) from exc


class BurnpackReader:
    """A burnpack opened under Burn's limits (burnpack-spec §5); every refusal is an `InputError`.

    The header and metadata are read and checked on `open`; tensor bytes are read one at a time by
    `read`. Sizes the file claims are checked against the file's real size before anything is allocated.
    """

    def __init__(
        self,
        path: Path,
        version: int,
        metadata: dict[str, str],
        scalars: dict[str, dict[str, object]],
        data_start: int,
        entries: list[TensorEntry],
        offsets: dict[str, tuple[int, int]],
    ) -> None:
        self.path = path
        self.version = version
        self.metadata = metadata
        self.scalars = scalars
        self.data_start = data_start
        self._entries = entries
        self._offsets = offsets

    @staticmethod
    def open(path: Path | str) -> BurnpackReader:
        path = Path(path)
        if not path.exists() and path.suffix == "":
            path = path.with_suffix(EXTENSION)  # as Burn's reader does
        if path.is_dir():
            raise InputError(printable(f"cannot read {path}: it is a directory"),
                             hint="give the path of a .bpk file")
        try:
            with open_regular(path) as file:
                return _open(path, file, os.fstat(file.fileno()).st_size)
        except NotRegularFile as exc:
            raise InputError(printable(f"cannot read {path}: {exc}"), hint=NOT_REGULAR_HINT) from None
        except OSError as exc:
            raise InputError(printable(f"cannot read {path}: {exc.strerror or exc}"),
                             hint="check the path and its permissions") from exc

    def entries(self) -> list[TensorEntry]:
        """Every tensor, in data order."""
        return list(self._entries)

    def data_offsets(self, name: str) -> tuple[int, int]:
        """`[start, end)` of a tensor relative to the data section."""
        return self._offsets[name]

    def read(self, name: str) -> memoryview:
        """One tensor's bytes."""
        start, end = self._offsets[name]
        buffer = bytearray(end - start)
        try:
            with open_regular(self.path) as file:  # not a FIFO swapped in since open()
                file.seek(self.data_start + start)
                got = file.readinto(buffer)
        except OSError as exc:
            raise InputError(printable(f"cannot read {self.path}: tensor '{name}': {exc.strerror or exc}"),
                             hint="check the file and its permissions") from exc
        if got != len(buffer):
            raise InputError(printable(f"{self.path}: tensor '{name}' is cut short ({got} of {len(buffer)} "
                                       "bytes)"),
                             hint="the file changed or was truncated after it was opened; copy it again")
        return memoryview(buffer)


MAX_MESSAGE = 500  # characters of a message about the metadata (a value's repr can be any size)


def _fail(path: Path, message: str, hint: str) -> InputError:
    if len(message) > MAX_MESSAGE:
        message = message[:MAX_MESSAGE] + f"... ({len(message)} characters)"
    return InputError(printable(f"{path}: {message}"), hint=hint)


class _TagRefused(Exception):
    """Raised inside cbor2 for a tagged item (see `_NO_TAGS`)."""


def _refuse_tag(*_: object) -> None:
    raise _TagRefused


class _NoTags(dict):
    """cbor2's `semantic_decoders`: every tag, the built-in ones too, is refused.

    Burn (ciborium) and qcli never write a tag, and cbor2's built-in ones are hostile input's tools:
    shared references (28/29) make a few hundred bytes a structure of 2^60 items that any walk, repr
    or hash of a map key never finishes; a rational (30) of two huge bignums spends hours in gcd.
    """

    def __missing__(self, tag: object) -> object:
        return _refuse_tag

    def __contains__(self, tag: object) -> bool:
        return True

    def get(self, tag: object, default: object = None) -> object:
        return _refuse_tag


_NO_TAGS = _NoTags()
_TAG_NAMES = {2: "a bignum", 3: "a bignum", 28: "a shared value", 29: "a shared reference", 30: "a rational",
              258: "a set"}


def _cbor_problem(exc: Exception) -> str:
    """The decoder's error in words; a refused tag by its number."""
    found = re.search(r"semantic tag (\d+)", str(exc))
    if found or any(isinstance(e, _TagRefused) for e in (exc, exc.__cause__, exc.__context__)):
        tag = int(found.group(1)) if found else None
        what = "a tag" if tag is None else f"tag {tag}" + (f" ({_TAG_NAMES[tag]})" if tag in _TAG_NAMES else "")
        return f"metadata holds CBOR {what}, which burnpack metadata never uses"
    return f"metadata is not valid CBOR: {exc}"


_JSON_STRING = re.compile(r'"(?:[^"\\\n]|\\.)*"')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


def _json_depth(text: str) -> int:
    """How deep `text`'s arrays and objects nest, brackets inside strings not counted; linear, no recursion."""
    import numpy as np

    brackets = _NOT_BRACKET.sub("", _JSON_STRING.sub("", text)).encode("ascii")
    if not brackets:
        return 0
    codes = np.frombuffer(brackets, np.uint8)
    return int(np.cumsum(np.where((codes == ord("[")) | (codes == ord("{")), 1, -1)).max())


def metadata_json(path: Path, key: str, text: str) -> object:
    """The JSON that metadata value `key` holds, parsed under a size and a depth limit: hostile text is an
    `InputError`, never a `RecursionError` or a parse that runs for minutes."""
    if len(text) > MAX_METADATA_JSON_SIZE:
        raise _fail(path, f"metadata '{key}' holds {len(text)} characters, more than the "
                    f"{MAX_METADATA_JSON_SIZE} of JSON qcli reads", _CORRUPT_HINT)
    depth = _json_depth(text)
    if depth > MAX_METADATA_JSON_DEPTH:
        raise _fail(path, f"metadata '{key}' holds JSON nested {depth} deep, past the "
                    f"{MAX_METADATA_JSON_DEPTH} qcli reads", _CORRUPT_HINT)
    try:
        return json.loads(text)
    except ValueError as exc:  # a JSONDecodeError, or an integer past int's digit limit
        raise _fail(path, f"metadata '{key}' is not valid JSON: {exc}", _CORRUPT_HINT) from None


_CORRUPT_HINT = "the file is damaged or was not written by Burn or qcli; write it again from its source"
_TRUNCATED_HINT = "the file was cut short (an interrupted copy or write?); copy or write it again"


def _open(path: Path, file: BinaryIO, size: int) -> BurnpackReader:
    """Burn's checks in Burn's order (`Reader::from_file`), then qcli's stricter ones. The file size is held
    to the largest limit of any release first, and, once the metadata is read, to that of the release the
    file names (`burn_version`; Burn 0.22.1's where it names none)."""
    if size > max(MAX_FILE_SIZE, *MAX_FILE_SIZES.values()):
        _too_large(path, size, max(MAX_FILE_SIZE, *MAX_FILE_SIZES.values()), "Burn")
    head = file.read(HEADER_SIZE)
    if len(head) < HEADER_SIZE:
        raise _fail(path, f"not a burnpack file: {size} bytes, shorter than the {HEADER_SIZE}-byte header",
                    "the file is empty or cut short; write it again")
    magic, version, metadata_size = _HEADER.unpack(head)
    if magic != MAGIC_NUMBER:
        raise _fail(path, f"not a burnpack file: it starts with {head[:4].hex()}, not 4e525542 ('NRUB')",
                    "qcli reads Burn's .bpk files; a .safetensors checkpoint is the input of quantize")
    if version > FORMAT_VERSION:
        raise _fail(path, f"burnpack version {version} is newer than the supported version {FORMAT_VERSION}",
                    "the file was written by a newer Burn; upgrade qcli")
    if metadata_size > MAX_METADATA_SIZE:
        raise _fail(path, f"metadata size {metadata_size} bytes exceeds the maximum of "
                    f"{MAX_METADATA_SIZE} bytes", _CORRUPT_HINT)
    if size < HEADER_SIZE + metadata_size:
        raise _fail(path, f"truncated: the header announces {metadata_size} bytes of metadata but the file "
                    f"has {size - HEADER_SIZE} after the header", _TRUNCATED_HINT)
    blob = file.read(metadata_size)
    try:
        # Untrusted bytes: any failure of the decoder is a corrupt file, whatever exception it takes.
        # No tags (see `_NoTags`), and map keys only strings: an attacker's integer keys can all share
        # one hash, and inserting n of them takes n^2 steps.
        top = cbor2.loads(blob, max_depth=MAX_CBOR_RECURSION_DEPTH, allow_duplicate_keys=False,
                          semantic_decoders=_NO_TAGS, tag_hook=_refuse_tag, strict_hashable_types=True)
    except Exception as exc:  # noqa: BLE001
        raise _fail(path, _cbor_problem(exc), _CORRUPT_HINT) from None
    tensors, metadata, scalars = _parse_metadata(path, top)
    if size > max_file_size(metadata.get("burn_version")):
        _too_large(path, size, max_file_size(metadata.get("burn_version")),
                   f"Burn {metadata.get('burn_version', BURN_VERSION)}")
    if len(tensors) > MAX_TENSOR_COUNT:
        raise _fail(path, f"file contains {len(tensors)} tensors, exceeding the maximum of "
                    f"{MAX_TENSOR_COUNT}", _CORRUPT_HINT)
    data_start = data_section_start(metadata_size)
    # Burn checks only 10 + metadata_size + max(end); the real requirement counts the padding up to D.
    if tensors:
        last = max(tensors, key=lambda name: tensors[name][2][1])
        required = data_start + tensors[last][2][1]
        if size < required:
            raise _fail(path, f"truncated: tensor '{last}' ends at byte {required} but the file has "
                        f"{size} bytes", _TRUNCATED_HINT)
    entries, offsets = [], {}
    for name, (dtype, shape, (start, end), param_id) in tensors.items():
        if end < start:
            raise _fail(path, f"tensor '{name}' has corrupted offset data: end {end} < start {start}",
                        _CORRUPT_HINT)
        if end - start > MAX_TENSOR_SIZE:
            raise _fail(path, f"tensor '{name}' has {end - start} bytes, exceeding the maximum of "
                        f"{MAX_TENSOR_SIZE} bytes", f"Burn refuses tensors over {gib(MAX_TENSOR_SIZE)}")
        # Burn checks neither length on read; its backends fail later, on load, without naming the file.
        need = dtype.nbytes(shape)
        if end - start != need:
            raise _fail(path, f"tensor '{name}' spans {end - start} bytes but its shape {list(shape)} and "
                        f"dtype {dtype} need {need}", _CORRUPT_HINT)
        entries.append(TensorEntry(name, dtype, shape, end - start, param_id))
        offsets[name] = (start, end)
    entries.sort(key=lambda entry: (offsets[entry.name][0], offsets[entry.name][1]))
    return BurnpackReader(path, version, metadata, scalars, data_start, entries, offsets)


def _too_large(path: Path, size: int, limit: int, release: str) -> NoReturn:
    raise _fail(path, f"file size {size} bytes exceeds the maximum of {limit} bytes",
                f"{release} refuses burnpack files over {gib(limit)}; split the model into several files")


def _is_u64(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= U64_MAX


_Descriptor = tuple[DType, tuple[int, ...], tuple[int, int], "int | None"]


def _parse_metadata(
    path: Path, top: object
) -> tuple[dict[str, _Descriptor], dict[str, str], dict[str, dict[str, object]]]:
    """Check the decoded metadata's structure as serde would; returns tensors, metadata and scalars."""

    def bad(what: str) -> InputError:
        return _fail(path, f"metadata does not describe a burnpack: {what}", _CORRUPT_HINT)

    if not isinstance(top, dict) or "tensors" not in top or not isinstance(top["tensors"], dict):
        raise bad("no 'tensors' map")
    metadata = top.get("metadata", {})
    if not isinstance(metadata, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                 for k, v in metadata.items()):
        raise bad("'metadata' is not a map of strings")
    scalars = top.get("scalars", {})
    if not isinstance(scalars, dict):
        raise bad("'scalars' is not a map")
    for name, scalar in scalars.items():
        try:
            _check_scalar(name, scalar)
        except ValueError as exc:
            raise bad(str(exc)) from None
    tensors = {}
    for name, descriptor in top["tensors"].items():
        if not isinstance(name, str):
            raise bad(f"tensor name {shown(name)} is not a string")
        if not isinstance(descriptor, dict) or not {"dtype", "shape", "data_offsets"} <= descriptor.keys():
            raise bad(f"tensor '{name}' lacks dtype, shape or data_offsets")
        try:
            dtype = dtype_from_serde(descriptor["dtype"])
        except ValueError as exc:
            raise bad(f"tensor '{name}': {exc}") from None
        shape, offsets = descriptor["shape"], descriptor["data_offsets"]
        if not isinstance(shape, list) or not all(_is_u64(d) for d in shape):
            raise bad(f"tensor '{name}': shape {shown(shape)} is not a list of u64")
        if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_u64(o) for o in offsets):
            raise bad(f"tensor '{name}': data_offsets {shown(offsets)} is not a [start, end] pair of u64")
        param_id = descriptor.get("param_id")
        if param_id is not None and not _is_u64(param_id):
            raise bad(f"tensor '{name}': param_id {shown(param_id)} is not a u64")
        tensors[name] = (dtype, tuple(shape), tuple(offsets), param_id)
    return tensors, metadata, scalars
