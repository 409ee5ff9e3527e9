"""llama.cpp's importance matrix (imatrix): the sum of each weight's squared input activations over a
calibration text, per input column, which llama-quantize weights its rounding error with.

llama-imatrix (tools/imatrix/imatrix.cpp) writes two forms. The GGUF form (`save_imatrix`) holds no
`general.architecture`; its metadata is `general.type` = "imatrix", `imatrix.datasets` (an array of
strings: the calibration files), `imatrix.chunk_count` and `imatrix.chunk_size` (u32: chunks of that many
tokens each). Each weight `W` (llama.cpp's name, `blk.0.attn_q.weight`) has, all F32:

```
W.in_sum2   ne = [n_in] (a dense weight)  or  [n_in, n_expert] (a MoE weight of n_expert experts)
W.counts    ne = [1]                      or  [1, n_expert]   tokens seen (by each expert), as floats
W.in_sum    optional, like in_sum2: the plain sums of the activations, which newer versions add
```

in the names' sorted order, a trailing axis of 1 dropped as ggml writes every tensor (`ggml_n_dims`). The
legacy `.dat` form (`save_imatrix_legacy`) is little-endian with no magic:

```
i32 n_entries, then n_entries times:
    i32 name length, the name's bytes, i32 ncall (chunks), i32 nval, f32 values[nval]
optional trailer: i32 chunk count, i32 dataset length, the dataset's bytes
```

where each value is the mean squared activation times ncall, every expert's columns one after another
under the one ncall. Both say the same per column: llama-quantize's importance is the mean of the squared
activations, in_sum2 / counts (values / ncall in the legacy form), and 1 for an expert no token reached.
A legacy file is read as llama-imatrix itself reads one to merge it, each chunk taken as `chunk_size`
tokens (its default context, 512): sums values * chunk_size over counts ncall * chunk_size, the same
importance. Its MoE entries stay flat, [n_expert * n_in] under one count, as the file has them.

Names map between llama.cpp's and Hugging Face's with the gguf package's tables (`qcli.io.gguf_names`), the
table of the architecture config.json's `model_type` names (`gemma3_text` -> gemma3, `qwen2_moe` ->
qwen2moe: the package's names, `_` and `-` aside), for any architecture the package knows. An imatrix is
per input column, and llama.cpp's converter permutes only the output rows of Q and K, so the columns are
the same on both sides, whatever the architecture.
"""

from __future__ import annotations

import re
import struct
from collections import Counter
from collections.abc import Callable, Iterable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

import numpy as np

from qcli.errors import InputError, OutputError, UsageError
from qcli.io.files import open_regular, read_bounded, unreadable
from qcli.io.gguf import ARRAY, UINT32, GgufSource
from qcli.io.gguf_names import architectures, gguf_architecture, hf_bases, name_table, split_suffix
from qcli.io.temporary import TemporaryFile, sync
from qcli.text import clipped, printable, quoted, shown

if TYPE_CHECKING:
    import gguf
    import torch

    from qcli.io.source import TensorInfo

MAGIC = b"GGUF"
IMATRIX_TYPE = "imatrix"  # general.type
DATASETS, CHUNK_COUNT, CHUNK_SIZE = "imatrix.datasets", "imatrix.chunk_count", "imatrix.chunk_size"
SUM2, SUM, COUNTS = ".in_sum2", ".in_sum", ".counts"
LEGACY_CHUNK_SIZE = 512  # llama-imatrix's default context, the tokens a legacy file's chunk is taken as
MAX_U32 = (1 << 32) - 1
# Bytes of a legacy `.dat` file read at most (it is read whole): a 256-expert MoE's matrix is about 1.3 GB.
MAX_LEGACY_BYTES = 2 << 30
MAX_BLOCKS = 1024  # blocks the name tables are built for at most (their cost grows with the count)
_HINT = "the file is damaged or is not an importance matrix; compute it again with llama-imatrix"
_BLOCK = re.compile(r"(?:^|\.)(\d{1,9})\.")  # a block's number: the first of a name's parts that is one, both sides


@dataclass(frozen=True, eq=False)  # arrays have no one truth value to compare by
class ImatrixEntry:
    """One weight's statistics: `sum_of_squares` [n_in] for a dense weight or [n_expert, n_in] for a MoE
    one (float64), `counts` the tokens seen, [1] or [n_expert] (int64), and `sums` the plain sums of the
    activations where the file has them (newer llama-imatrix), of sum_of_squares' shape. Arrays or CPU torch
    tensors are taken and kept as numpy arrays."""

    sum_of_squares: np.ndarray
    counts: np.ndarray
    sums: np.ndarray | None = None

    def __post_init__(self) -> None:
        squares = np.asarray(self.sum_of_squares, dtype=np.float64)
        counts = np.asarray(self.counts)
        rows = 1 if squares.ndim == 1 else squares.shape[0]
        if squares.ndim not in (1, 2) or squares.size == 0 or counts.shape != (rows,):
            raise ValueError(f"sum_of_squares {squares.shape} needs counts of shape ({rows},), not {counts.shape}")
        if not np.all(np.isfinite(squares)) or np.any(squares < 0):
            raise ValueError("sum_of_squares holds negative or non-finite values")
        if not np.array_equal(counts, np.round(counts)) or np.any(counts < 0) or not np.any(counts > 0):
            raise ValueError(f"counts must be whole token counts, not all zero: {counts}")
        object.__setattr__(self, "sum_of_squares", squares)
        object.__setattr__(self, "counts", counts.astype(np.int64))
        if self.sums is not None:
            sums = np.asarray(self.sums, dtype=np.float64)
            if sums.shape != squares.shape or not np.all(np.isfinite(sums)):
                raise ValueError(f"sums {sums.shape} must be finite, of sum_of_squares' shape {squares.shape}")
            object.__setattr__(self, "sums", sums)

    @property
    def importance(self) -> np.ndarray:
        """The mean squared activation per input column, of sum_of_squares' shape (float64); 1 in every column
        of an expert no token reached, as llama-quantize takes it (no column preferred)."""
        counts = self.counts[:, None] if self.sum_of_squares.ndim == 2 else self.counts
        return np.where(counts > 0, self.sum_of_squares / np.maximum(counts, 1), 1.0)


@dataclass(frozen=True)
class Imatrix:
    """An importance matrix: its entries by llama.cpp's tensor name, the calibration files it was computed
    on, and how many chunks of how many tokens (0: not recorded)."""

    entries: dict[str, ImatrixEntry]
    datasets: tuple[str, ...]
    chunk_count: int
    chunk_size: int


def read_imatrix(path: Path | str, legacy_chunk_size: int = LEGACY_CHUNK_SIZE) -> Imatrix:
    """The imatrix at `path`, GGUF (by its magic) or legacy `.dat`; InputError for a file that cannot be read,
    is not an imatrix, is cut short or holds counts of zero, NaN or negative sums of squares."""
    if legacy_chunk_size < 1:
        raise ValueError(f"legacy_chunk_size must be positive, not {legacy_chunk_size}")
    path = Path(path)
    try:
        with open_regular(path) as file:
            head = file.read(len(MAGIC))
    except OSError as exc:
        raise unreadable(path, exc) from exc
    if head == MAGIC:
        return _read_gguf(path)
    data = read_bounded(path, MAX_LEGACY_BYTES, "a legacy importance matrix", _HINT)
    return _Legacy(path, data).read(legacy_chunk_size)


def _fail(path: Path, message: str, hint: str = _HINT) -> InputError:
    return InputError(printable(f"{path}: {message}"), hint=hint)


def _checked(path: Path, name: str, squares: np.ndarray, counts: np.ndarray,
             sums: np.ndarray | None = None) -> ImatrixEntry:
    """An entry of values read from the file, after the checks that make them a user's error, not qcli's."""
    if not np.all(np.isfinite(squares)) or np.any(squares < 0):
        raise _fail(path, f"the sums of squares of {quoted(name)} hold NaN, Inf or negative values")
    if sums is not None and not np.all(np.isfinite(sums)):
        raise _fail(path, f"the sums of {quoted(name)} hold NaN or Inf")
    if not np.all(np.isfinite(counts)) or np.any(counts < 0):
        raise _fail(path, f"the counts of {quoted(name)} hold NaN, Inf or negative values")
    counts = np.round(counts)  # llama.cpp stores them as floats and rounds them back (lround)
    if not np.any(counts > 0):
        raise _fail(path, f"{quoted(name)} has a count of zero: no calibration token reached it",
                    hint="compute the imatrix again on a calibration text that reaches every layer")
    return ImatrixEntry(squares, counts, sums)


def _read_gguf(path: Path) -> Imatrix:
    """The GGUF form, read by qcli's own GGUF reader (`GgufSource`), which checks every count and length
    against the file before it reads or allocates (the gguf package's reader loops on a huge claimed array)."""
    with GgufSource.open(path) as source:
        metadata = source.metadata
        kind = metadata.get("general.type")
        if kind is not None and kind != IMATRIX_TYPE:
            raise _fail(path, f"a GGUF file of general.type {shown(kind)}, not an importance matrix",
                        hint="give the imatrix file llama-imatrix wrote (imatrix.gguf), not a model")
        # `_field` checked each's GGUF value type: an array the reader kept as a tuple (its items checked
        # below), a u32 the reader gave as an int.
        datasets = cast("tuple[str, ...]", _field(path, source, DATASETS, ARRAY))
        if not all(isinstance(name, str) for name in datasets):
            raise _fail(path, f"{DATASETS} is not an array of strings")
        chunk_count = cast(int, _field(path, source, CHUNK_COUNT, UINT32))
        chunk_size = cast(int, _field(path, source, CHUNK_SIZE, UINT32))
        parts: dict[str, dict[str, TensorInfo]] = {}
        for info in source.infos():
            for suffix in (SUM2, SUM, COUNTS):
                if info.name.endswith(suffix):
                    parts.setdefault(info.name[: -len(suffix)], {})[suffix] = info
        if not parts:
            raise _fail(path, f"holds no {SUM2} and {COUNTS} tensors, so no importance")
        entries = {name: _gguf_entry(path, name, parts[name], source.load) for name in sorted(parts)}
    return Imatrix(entries, datasets, chunk_count, chunk_size)


def _field(path: Path, source: GgufSource, key: str, kind: int) -> object:
    """A metadata value llama-quantize needs, of the GGUF value type llama.cpp writes it in (it reads no
    other): a u32, or an array (of strings, a short one, which the reader keeps)."""
    value = source.metadata.get(key)
    if value is None:
        raise _fail(path, f"lacks {key}, which llama-quantize needs of an imatrix")
    if source.value_types.get(key) != kind or (kind == ARRAY and not isinstance(value, tuple)):
        raise _fail(path, f"{key} is {shown(value)} of GGUF value type {source.value_types.get(key)}, not "
                    f"{'a u32' if kind == UINT32 else 'an array of strings'}")
    return value


def _gguf_entry(path: Path, name: str, parts: dict[str, TensorInfo], load: Callable[[str], torch.Tensor]
                ) -> ImatrixEntry:
    if SUM2 not in parts or COUNTS not in parts:
        missing = SUM2 if SUM2 not in parts else COUNTS
        raise _fail(path, f"{quoted(name)} has no {missing} tensor beside its {' and '.join(parts)}")
    for info in parts.values():
        if info.dtype != "F32":
            raise _fail(path, f"{quoted(info.name)} is {info.dtype}, not F32")

    def values(suffix: str) -> np.ndarray:
        return load(parts[suffix].name).numpy().astype(np.float64).reshape(-1)

    counts, squares = values(COUNTS), values(SUM2)
    if counts.size == 0 or squares.size == 0 or squares.size % counts.size:
        raise _fail(path, f"{quoted(name)} has {squares.size} sums of squares, not a whole number of columns for "
                    f"each of its {counts.size} counts")
    shape = (counts.size, -1) if counts.size > 1 else (-1,)
    sums = None
    if SUM in parts:
        sums = values(SUM)
        if sums.size != squares.size:
            raise _fail(path, f"{quoted(name)} has {sums.size} sums but {squares.size} sums of squares")
        sums = sums.reshape(shape)
    return _checked(path, name, squares.reshape(shape), counts, sums)


class _Legacy:
    """The legacy `.dat` form, read by hand: no library reads it (the gguf package reads only GGUF, and
    llama.cpp's own reader is C++), and every length in it is checked against the bytes that are left, so
    a damaged or foreign file is an InputError, never a huge allocation or a read past the end."""

    def __init__(self, path: Path, data: bytes) -> None:
        self.path, self.data, self.at = path, data, 0

    def take(self, size: int, what: str) -> bytes:
        if size > len(self.data) - self.at:
            raise _fail(self.path, f"cut short while reading {what} (byte {self.at} of {len(self.data)})")
        self.at += size
        return self.data[self.at - size : self.at]

    def i32(self, what: str) -> int:
        return struct.unpack("<i", self.take(4, what))[0]

    def text(self, size: int, what: str) -> str:
        try:
            return self.take(size, what).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _fail(self.path, f"{what} is not UTF-8 text") from exc

    def read(self, chunk_size: int) -> Imatrix:
        n_entries = self.i32("the entry count")
        if n_entries < 1:
            raise _fail(self.path, f"neither GGUF nor a legacy imatrix: its entry count is {n_entries}")
        raw: dict[str, tuple[int, np.ndarray]] = {}
        for index in range(n_entries):  # each entry takes at least 13 bytes, so a false count soon runs out
            length = self.i32(f"the name length of entry {index}")
            if length < 1:
                raise _fail(self.path, f"entry {index} has a name of {length} bytes")
            name = self.text(length, f"the name of entry {index}")
            ncall, nval = self.i32(f"the chunk count of {quoted(name)}"), self.i32(f"the size of {quoted(name)}")
            if nval < 1:
                raise _fail(self.path, f"{quoted(name)} has {nval} values")
            values = np.frombuffer(self.take(4 * nval, f"the values of {quoted(name)}"), dtype="<f4")
            if name in raw:
                raise _fail(self.path, f"{quoted(name)} is there twice")
            raw[name] = ncall, values.astype(np.float64)
        datasets: tuple[str, ...] = ()
        chunk_count = max(ncall for ncall, _ in raw.values())
        if self.at < len(self.data):  # the trailer that later versions write
            chunk_count = self.i32("the chunk count")
            length = self.i32("the dataset name's length")
            if chunk_count < 0 or length < 0:
                raise _fail(self.path, f"its trailer holds a chunk count of {chunk_count} and a dataset name of "
                            f"{length} bytes")
            datasets = (self.text(length, "the dataset name"),) if length else ()
            if self.at != len(self.data):
                raise _fail(self.path, f"{len(self.data) - self.at} bytes follow the last record")
        entries = {name: _checked(self.path, name, values * chunk_size, np.array([float(ncall) * chunk_size]))
                   for name, (ncall, values) in sorted(raw.items())}
        return Imatrix(entries, datasets, chunk_count, chunk_size)


def write_imatrix(imatrix: Imatrix, path: Path | str, before_commit: Callable[[], None] | None = None) -> None:
    """`imatrix` as llama-imatrix writes its GGUF form (the module's docstring), with the gguf package's
    GGUFWriter, under a temporary name beside `path` renamed onto it when complete: `path` is replaced whole
    or left as it was. `before_commit` is called before the rename and may raise to leave `path` as it was.
    OutputError when it cannot be written."""
    import gguf

    path = Path(path)
    if not imatrix.entries:
        raise UsageError("an importance matrix needs at least one entry", hint="collect the statistics first")
    if not imatrix.datasets:  # the GGUF writer writes no empty array, and llama-quantize needs the key
        raise UsageError("an importance matrix needs the name of the calibration text it was computed on",
                         hint="name the dataset the statistics came from")
    if not (0 <= imatrix.chunk_count <= MAX_U32 and 0 <= imatrix.chunk_size <= MAX_U32):
        raise UsageError(f"the chunk count {imatrix.chunk_count} and size {imatrix.chunk_size} must fit in 32 bits",
                         hint="count chunks of a few hundred or thousand tokens")

    temporary = TemporaryFile(path)
    # GGUFWriter writes no empty string, so an empty arch leaves out general.architecture, as llama.cpp does
    writer = gguf.GGUFWriter(temporary.path, arch="")
    writer.add_type(IMATRIX_TYPE)
    writer.add_array(DATASETS, list(imatrix.datasets))
    writer.add_uint32(CHUNK_COUNT, imatrix.chunk_count)
    writer.add_uint32(CHUNK_SIZE, imatrix.chunk_size)
    for name in sorted(imatrix.entries):
        entry = imatrix.entries[name]
        experts = entry.counts.size
        shape = (experts, -1) if experts > 1 else (-1,)  # ggml's dimensions: no trailing axis of 1
        writer.add_tensor(name + SUM2, _float32(name, entry.sum_of_squares).reshape(shape))
        counts = entry.counts.astype(np.float32)
        writer.add_tensor(name + COUNTS, counts.reshape(experts, 1) if experts > 1 else counts)
        if entry.sums is not None:
            writer.add_tensor(name + SUM, _float32(name, entry.sums).reshape(shape))
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        with open(temporary.path, "rb") as file:  # the writer opens and closes its own
            sync(file)
        if before_commit is not None:
            before_commit()
        temporary.commit()
    except BaseException as exc:
        with suppress(OSError):  # closing flushes what is buffered, onto the disk that just failed
            writer.close()
        temporary.discard()
        if isinstance(exc, OSError):
            raise OutputError(printable(f"cannot write {path}: {exc.strerror or exc}"),
                              hint=f"check that {path.parent} is writable and has room; nothing was written") from None
        raise


def _float32(name: str, values: np.ndarray) -> np.ndarray:
    if np.any(np.abs(values) > np.finfo(np.float32).max):
        raise UsageError(printable(f"the statistics of {quoted(name)} pass float32's range, which the file keeps"),
                         hint="collect them over fewer tokens")
    return values.astype(np.float32)


def gguf_to_hf_names(names: Iterable[str], model_type: str, hf: Iterable[str] | None = None) -> dict[str, str]:
    """Each of `names` in llama.cpp's naming (`blk.3.ffn_down.weight`) that the gguf package's table of the
    architecture of `model_type` (`gguf_names.gguf_architecture`) knows -> its Hugging Face name: among `hf` (the
    model's names) where given, the one that maps to it; else the first `model.` or `lm_head` name the table
    gives it (`model.layers.3.mlp.down_proj.weight`). The others are left out."""
    names = list(names)
    if hf is not None:
        back = {cpp: name for name, cpp in hf_to_gguf_names(hf, model_type).items()}
        return {name: back[name] for name in names if name in back}
    bases = hf_bases(_table(names, model_type))
    return _one_to_one({name: bases[base] + suffix for name in names
                        for base, suffix in [split_suffix(name)] if base in bases})


_EXPERT = re.compile(r"\.experts\.(\d{1,9})\.")  # a per-expert tensor's expert: `mlp.experts.3.w1.weight`


def expert_stem(name: str) -> tuple[str, int | None]:
    """A per-expert tensor's name as llama.cpp's converter merges every expert's into one (`...experts.3.w1.weight`
    -> `...experts.w1.weight`, which the gguf package's tables name `blk.N.ffn_gate_exps.weight`) and its
    expert; another name as it is, and None."""
    found = _EXPERT.search(name)
    if found is None:
        return name, None
    return name[: found.start()] + ".experts." + name[found.end():], int(found.group(1))


def hf_to_gguf_names(names: Iterable[str], model_type: str) -> dict[str, str]:
    """Each of `names` in Hugging Face's naming mapped to llama.cpp's (`model.layers.3.mlp.down_proj.weight` ->
    `blk.3.ffn_down.weight`); a name no table gives is left out.

    The table is that of `model_type`'s architecture (`gguf_names.gguf_architecture`). For a model type the gguf
    package names no architecture of, it is the naming most tables agree on among those that name the most of
    `names` (a Mistral's is the llama table's and 56 others'). Two namings that tie, or none, are a usage error."""
    names = list(names)
    arch = gguf_architecture(model_type)
    if arch is not None:
        return _one_to_one(_mapped(names, _table(names, arch)))
    _table(names, "llama")  # the block count checked before every table is built
    found = [_mapped(names, _table(names, other)) for other in architectures()]
    most = max(len(mapped) for mapped in found)
    votes = Counter(tuple(sorted(mapped.items())) for mapped in found if len(mapped) == most)
    ranked = votes.most_common(2)
    if most == 0 or len(ranked) > 1 and ranked[0][1] == ranked[1][1]:
        raise UsageError(printable(f"the gguf package names no architecture {clipped(model_type)!r}, and its "
                                   "tables " + ("name none of the model's tensors" if most == 0 else
                                                "name the model's tensors in different ways, as many each")),
                         hint="upgrade the gguf package (pip install -U gguf), or keep llama.cpp's names")
    return _one_to_one(dict(ranked[0][0]))


def _mapped(names: list[str], table: gguf.TensorNameMap) -> dict[str, str]:
    mapped = {}
    for name in names:
        base, suffix = split_suffix(name)
        found = table.get_name(base)
        if found is not None:
            mapped[name] = found + suffix
    return mapped


def _table(names: list[str], model_type: str) -> gguf.TensorNameMap:
    """The gguf package's name table of `model_type`'s architecture, for as many blocks as `names` give."""
    arch = gguf_architecture(model_type)
    if arch is None:
        raise UsageError(printable(f"the gguf package names no architecture {clipped(model_type)!r}, so qcli "
                                   "cannot map its tensors' llama.cpp names"),
                         hint="upgrade the gguf package (pip install -U gguf), or keep llama.cpp's names")
    numbers = [int(found[1]) for name in names if (found := _BLOCK.search(name))]
    blocks = max(numbers, default=-1) + 1
    if blocks > MAX_BLOCKS:
        raise InputError(f"a tensor name gives block {blocks - 1}, past the {MAX_BLOCKS} blocks qcli maps names of",
                         hint="check the names: no model has that many blocks")
    return name_table(arch, blocks)


def _one_to_one(mapped: dict[str, str]) -> dict[str, str]:
    taken: dict[str, str] = {}
    for old, new in mapped.items():
        if new in taken:
            raise InputError(printable(f"{taken[new]} and {old} both map to the one name {new}"),
                             hint="give the tensors of one model, named in one family's way")
        taken[new] = old
    return mapped
