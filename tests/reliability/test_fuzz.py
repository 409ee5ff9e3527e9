"""Fuzz targets: hostile bytes into the safetensors and GGUF header parsers, the burnpack reader, the recipe
parser.

Each target states a property that must hold for every input: the reader either accepts the file or
raises its own error (`InputError`, or a recipe fault with a line); nothing else may escape. Where it
accepts, its view must agree with an independent reader (the `safetensors` library, the `gguf` package's
GGUFReader) or with what was
written. CI runs a bounded number of
examples (QCLI_FUZZ_EXAMPLES, default 200); `bench/fuzz_long.py` runs the same targets for 100,000+.
"""

from __future__ import annotations

import functools
import json
import os
import socket
import struct
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import cbor2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import safe_open

from qcli.errors import InputError, RecipeError
from qcli.io.burnpack import BurnpackReader, BurnpackWriter, TensorEntry
from qcli.io.dtypes import SAFETENSORS_BITS, Plain
from qcli.io.gguf import GgufSource
from qcli.io.safetensors import SafetensorsSource
from qcli.recipe import RULE_KEYS, TOP_KEYS, load_recipe, parse_recipe
from tests.hang_support import never_hangs

EXAMPLES = int(os.environ.get("QCLI_FUZZ_EXAMPLES", "200"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
CALLS: Counter[str] = Counter()  # examples run per target, read by bench/fuzz_long.py
_SCRATCH = Path(tempfile.mkdtemp(prefix="qcli-fuzz-"))

NAMES = st.one_of(st.text(max_size=6), st.sampled_from(["", "w", "a.weight", "__metadata__", "\ud800"]))


def scratch(name: str, content: bytes) -> Path:
    path = _SCRATCH / name
    path.write_bytes(content)
    return path


# -- safetensors ------------------------------------------------------------------------------------


@st.composite
def safetensors_files(draw: st.DrawFn) -> bytes:
    """A well-formed file, then (usually) one mutation of its header, its offsets or its length."""
    header: dict[str, object] = {}
    if draw(st.booleans()):
        header["__metadata__"] = draw(st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=2))
    offset = 0
    for name in draw(st.lists(st.text(min_size=1, max_size=5), max_size=4, unique=True)):
        dtype = draw(st.sampled_from(sorted(SAFETENSORS_BITS)))
        shape = draw(st.lists(st.integers(0, 4), max_size=3))
        bits = SAFETENSORS_BITS[dtype]
        numel = 1
        for d in shape:
            numel *= d
        if numel * bits % 8:
            shape, numel = [8], 8
        size = numel * bits // 8
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    data_len = offset
    mutation = draw(st.sampled_from(["none", "field", "tensor", "length", "data", "raw", "duplicate"]))
    if mutation == "field" and len(header) > ("__metadata__" in header):
        name = draw(st.sampled_from([n for n in header if n != "__metadata__"]))
        key = draw(st.sampled_from(["dtype", "shape", "data_offsets"]))
        header[name][key] = draw(st.one_of(  # type: ignore[index]
            st.none(), st.booleans(), st.integers(-2, 2**65), st.text(max_size=4),
            st.lists(st.integers(-3, 70), max_size=3), st.sampled_from(sorted(SAFETENSORS_BITS)),
        ))
    elif mutation == "tensor":
        junk = st.dictionaries(st.text(max_size=3), st.integers(), max_size=3)
        header[draw(NAMES)] = draw(st.one_of(st.none(), st.integers(), junk))
    elif mutation == "data":
        data_len = draw(st.integers(0, offset + 8))
    blob = json.dumps(header).encode()
    if mutation == "raw":
        blob = draw(st.binary(max_size=64))
    elif mutation == "duplicate" and header:
        blob = blob[:-1] + b", " + json.dumps(header)[1:].encode()
    length = len(blob)
    if mutation == "length":
        length = draw(st.integers(0, 2**64 - 1))
    return struct.pack("<Q", length) + blob + bytes(data_len)


def check_safetensors(content: bytes) -> None:
    CALLS["safetensors"] += 1
    path = scratch("x.safetensors", content)
    try:
        infos = SafetensorsSource.open(path).infos()
    except InputError as error:
        assert error.hint and str(path) in error.message
        return
    # Accepted: the safetensors library must accept the same file and see the same tensors.
    with safe_open(str(path), framework="pt") as reference:
        assert sorted(reference.keys()) == sorted(info.name for info in infos)
        for info in infos:
            view = reference.get_slice(info.name)
            assert (view.get_dtype(), view.get_shape()) == (info.dtype, list(info.shape))


@FUZZ
@given(safetensors_files())
def test_fuzz_safetensors_header(content: bytes) -> None:
    check_safetensors(content)


@FUZZ
@given(st.binary(max_size=96))
def test_fuzz_safetensors_random_bytes(content: bytes) -> None:
    check_safetensors(content)


# -- GGUF -------------------------------------------------------------------------------------------


@functools.cache
def gguf_base() -> bytes:
    """A small file the gguf package wrote: metadata of every kind, plain and quantized tensors."""
    import numpy as np

    from tests.gguf_support import T, write_gguf

    path = _SCRATCH / "base.gguf"
    values = np.linspace(-1, 1, 64, dtype=np.float32)
    write_gguf(path, {"a": (values.reshape(2, 32), T.Q8_0), "b": (values[:6].reshape(2, 3), T.F32),
                      "c": (values.reshape(1, 64), T.Q4_0)},
               metadata={"llama.block_count": 1, "general.name": "m", "tokens": ["x", "yz"], "ids": [1, 2, 3]})
    return path.read_bytes()


@st.composite
def gguf_files(draw: st.DrawFn) -> bytes:
    """The base file, then (usually) one mutation of its header: a byte, a u64, or where the file ends."""
    content = bytearray(gguf_base())
    header_end = len(content) - 256  # the data is the last 256 bytes or less; mutate before it
    mutation = draw(st.sampled_from(["none", "byte", "u64", "cut"]))
    where = draw(st.integers(0, header_end))
    if mutation == "byte":
        content[where] = draw(st.integers(0, 255))
    elif mutation == "u64":
        content[where : where + 8] = struct.pack("<Q", draw(st.one_of(st.integers(0, 300), st.integers(0, 2**64 - 1))))
    elif mutation == "cut":
        del content[draw(st.integers(0, len(content))) :]
    return bytes(content)


def check_gguf(content: bytes) -> None:
    CALLS["gguf"] += 1
    path = scratch("x.gguf", content)
    try:
        infos = GgufSource.open(path).infos()
    except InputError as error:
        assert error.hint and str(path) in error.message and "\n" not in error.message
        return
    # Accepted: the gguf package's reader must see the same tensors where it sees them.
    from gguf import GGUFReader

    theirs = {t.name: t for t in GGUFReader(str(path)).tensors}
    assert sorted(theirs) == sorted(i.name for i in infos)
    for info in infos:
        t = theirs[info.name]
        assert (t.tensor_type.name, tuple(int(d) for d in t.shape[::-1]), t.data_offset, t.n_bytes) == (
            info.dtype, info.shape, info.offset, info.nbytes)


@FUZZ
@given(gguf_files())
def test_fuzz_gguf_header(content: bytes) -> None:
    ended(check_gguf, content)


@FUZZ
@given(st.binary(max_size=96).map(lambda tail: b"GGUF" + tail))
def test_fuzz_gguf_random_bytes(content: bytes) -> None:
    ended(check_gguf, content)


# -- burnpack -----------------------------------------------------------------------------------------

PLAIN = ["F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U64", "U32", "U16", "U8"]
SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
         "U64": 8, "U32": 4, "U16": 2, "U8": 1}
CBOR_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**64), 2**64), st.text(max_size=4),
              st.floats(allow_nan=False), st.binary(max_size=4)),
    lambda children: st.one_of(st.lists(children, max_size=3),
                               st.dictionaries(st.text(max_size=4), children, max_size=3)),
    max_leaves=12,
)


@st.composite
def packs(draw: st.DrawFn) -> tuple[list[TensorEntry], list[bytes], dict[str, str]]:
    entries, payloads = [], []
    for name in draw(st.lists(st.text(max_size=5), max_size=4, unique=True)):
        dtype = draw(st.sampled_from(PLAIN))
        shape = tuple(draw(st.lists(st.integers(0, 3), max_size=3)))
        numel = 1
        for d in shape:
            numel *= d
        param_id = draw(st.none() | st.integers(0, 2**64 - 1))
        entries.append(TensorEntry(name, Plain(dtype), shape, numel * SIZES[dtype], param_id))
        payloads.append(draw(st.binary(min_size=numel * SIZES[dtype], max_size=numel * SIZES[dtype])))
    metadata = draw(st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=2))
    return entries, payloads, metadata


def write(entries: list[TensorEntry], payloads: list[bytes], metadata: dict[str, str]) -> bytes:
    path = _SCRATCH / "w.bpk"
    with BurnpackWriter(path, entries, metadata) as writer:
        for entry, payload in zip(entries, payloads, strict=True):
            writer.write(entry.name, payload)
        writer.commit()
    return path.read_bytes()


def check_burnpack(content: bytes) -> BurnpackReader | None:
    CALLS["burnpack"] += 1
    path = scratch("x.bpk", content)
    try:
        reader = BurnpackReader.open(path)
    except InputError as error:
        assert error.hint and str(path) in error.message
        return None
    for entry in reader.entries():
        start, end = reader.data_offsets(entry.name)
        assert reader.data_start + end <= len(content)
        assert len(reader.read(entry.name)) == entry.nbytes == end - start
    return reader


@FUZZ
@given(packs())
def test_fuzz_burnpack_round_trip(pack: tuple[list[TensorEntry], list[bytes], dict[str, str]]) -> None:
    entries, payloads, metadata = pack
    reader = check_burnpack(write(entries, payloads, metadata))
    assert reader is not None and reader.metadata == metadata
    back = {e.name: e for e in reader.entries()}
    assert back == {e.name: e for e in entries}
    assert all(bytes(reader.read(e.name)) == p for e, p in zip(entries, payloads, strict=True))


@FUZZ
@given(packs(), st.data())
def test_fuzz_burnpack_mutated(pack: tuple[list[TensorEntry], list[bytes], dict[str, str]],
                               data: st.DataObject) -> None:
    content = bytearray(write(*pack))
    metadata_end = 10 + struct.unpack_from("<I", content, 6)[0]
    mutation = data.draw(st.sampled_from(["flip", "truncate", "metadata", "header"]))
    if mutation == "flip":
        at = data.draw(st.integers(0, len(content) - 1))
        content[at] ^= data.draw(st.integers(1, 255))
    elif mutation == "truncate":
        del content[data.draw(st.integers(0, len(content))):]
    elif mutation == "metadata":
        blob = cbor2.dumps(data.draw(st.one_of(CBOR_VALUES, st.fixed_dictionaries({"tensors": CBOR_VALUES}))))
        content[6:10] = struct.pack("<I", len(blob))
        content[10:metadata_end] = blob
    else:
        content[4:10] = data.draw(st.binary(min_size=6, max_size=6))
    check_burnpack(bytes(content))


@FUZZ
@given(st.binary(max_size=96))
def test_fuzz_burnpack_random_bytes(content: bytes) -> None:
    check_burnpack(b"NRUB" + content)


# -- recipes --------------------------------------------------------------------------------------------

WORDS = ["Q4S", "Q8S", "Q2F", "E2M1", "E4M3", "PackedU32", "Native", "PackedNative", "F16", "BF16", "F32",
         "UE4M3", "UE8M0", "Symmetric", "Lookup", "MinMax", "AbsMean", "nvfp4", "q4s-b32", "keep", "error",
         "*.weight", "re:.*", "re:(", "[", "*"]
TOML_SCALARS = st.one_of(
    st.sampled_from(WORDS), st.text(max_size=5), st.integers(-3, 300), st.booleans(),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
)
TOML_VALUES = st.one_of(
    TOML_SCALARS, st.lists(st.one_of(st.integers(-2, 300), st.sampled_from(WORDS)), max_size=7)
)


def toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a TOML basic string
    return repr(value)


@st.composite
def recipe_texts(draw: st.DrawFn) -> bytes:
    """Recipe-shaped TOML from the real vocabulary and near misses, sometimes damaged at the byte level."""
    keys = st.one_of(st.sampled_from(RULE_KEYS), st.sampled_from(["valeu", "blok", "stor", "x"]))
    lines = []
    if draw(st.booleans()):
        lines.append(f"version = {toml_value(draw(st.one_of(st.just(1), TOML_SCALARS)))}")
    if draw(st.booleans()):
        lines.append("[defaults]")
        lines.append(f"{draw(st.sampled_from(['on_indivisible', 'on_indivisble']))} = "
                     f"{toml_value(draw(TOML_SCALARS))}")
    for _ in range(draw(st.integers(0, 3))):
        lines.append(draw(st.sampled_from(["[[rule]]", "[rule]", "[[rules]]"])))
        for key in draw(st.lists(keys, max_size=6, unique=True)):
            lines.append(f"{key} = {toml_value(draw(TOML_VALUES))}")
    if draw(st.booleans()):
        lines.append(f"{draw(st.sampled_from(TOP_KEYS))} = {toml_value(draw(TOML_VALUES))}")
    text = "\n".join(lines).encode()
    damage = draw(st.sampled_from(["none", "none", "cut", "byte", "raw"]))
    if damage == "cut":
        text = text[: draw(st.integers(0, len(text)))]
    elif damage == "byte" and text:
        at = draw(st.integers(0, len(text) - 1))
        text = text[:at] + draw(st.binary(min_size=1, max_size=2)) + text[at + 1 :]
    elif damage == "raw":
        text = draw(st.binary(max_size=80))
    return text


def check_recipe(content: bytes) -> None:
    CALLS["recipe"] += 1
    path = scratch("r.toml", content)
    recipe, faults = parse_recipe(content, str(path))  # the same file name as load_recipe's rules carry
    lines = content.count(b"\n") + 1
    for fault in faults:
        assert fault.message and fault.hint and 1 <= fault.line <= lines, fault
        assert "\n" not in fault.message and len(fault.message) < 1_000, fault
    try:
        loaded = load_recipe(path)
    except RecipeError as error:
        assert faults and error.hint and error.message.startswith(f"{path}:{faults[0].line}: ")
        return
    assert not faults and loaded.rules == recipe.rules


@FUZZ
@given(recipe_texts())
def test_fuzz_recipe(content: bytes) -> None:
    check_recipe(content)


# -- hostile structures: nesting depth, huge integers, CBOR tags and shared references, special files ----
#
# The same properties, on the inputs that once hung or escaped: each example must also end
# (tests/hang_support.py; before the fixes, a deep header raised RecursionError, a 5000-digit integer
# ValueError, CBOR shared references and colliding integer keys ran for hours, and a FIFO blocked forever).

DEPTHS = st.sampled_from([1, 3, 64, 128, 129, 500, 990, 1010, 5_000, 100_000])
DIGITS = st.sampled_from([1, 19, 20, 21, 400, 4_300, 4_301, 10_000])


def ended(check: Callable[[bytes], object], content: bytes) -> None:
    with never_hangs():
        check(content)


@st.composite
def json_nestings(draw: st.DrawFn) -> bytes:
    depth = draw(DEPTHS)
    if draw(st.booleans()):
        return b"[" * depth + b"]" * depth
    return b'{"a": ' * depth + b"1" + b"}" * depth


@st.composite
def json_integers(draw: st.DrawFn) -> bytes:
    digits = draw(DIGITS)
    return (b"-" if draw(st.booleans()) else b"") + draw(st.sampled_from([b"1", b"9"])) * digits


@st.composite
def hostile_safetensors(draw: st.DrawFn) -> bytes:
    """A one-tensor header with a deep structure or a huge integer where a field, the descriptor, the
    metadata or the whole header belongs."""
    pairs = st.tuples(json_integers(), json_integers()).map(lambda p: b"[" + p[0] + b", " + p[1] + b"]")
    value = draw(st.one_of(json_nestings(), json_integers(), pairs))
    fields = {b"dtype": b'"F32"', b"shape": b"[1]", b"data_offsets": b"[0, 4]"}
    where = draw(st.sampled_from([b"dtype", b"shape", b"data_offsets", b"tensor", b"metadata", b"header", b"inside"]))
    if where in fields:
        fields[where] = value
    elif where == b"inside":
        fields[b"shape"] = b"[" + value + b"]"
    descriptor = b"{" + b", ".join(b'"' + k + b'": ' + v for k, v in fields.items()) + b"}"
    blob = {b"tensor": b'{"w": ' + value + b"}", b"metadata": b'{"__metadata__": ' + value + b', "w": ' + descriptor +
            b"}", b"header": value}.get(where, b'{"w": ' + descriptor + b"}")
    return struct.pack("<Q", len(blob)) + blob + bytes(4)


@FUZZ
@given(hostile_safetensors())
def test_fuzz_safetensors_hostile_structures(content: bytes) -> None:
    ended(check_safetensors, content)


def check_index(content: bytes) -> None:
    CALLS["index"] += 1
    folder = _SCRATCH / "index"
    folder.mkdir(exist_ok=True)
    if not (folder / "s.safetensors").exists():
        (folder / "s.safetensors").write_bytes(struct.pack("<Q", 2) + b"{}")
    index = folder / "model.safetensors.index.json"
    index.write_bytes(content)
    try:
        SafetensorsSource.open(index).close()
    except InputError as error:
        assert error.hint and str(index) in error.message and "\n" not in error.message


@FUZZ
@given(st.one_of(json_nestings(), json_integers()).flatmap(lambda v: st.sampled_from([
    v, b'{"weight_map": ' + v + b"}", b'{"metadata": ' + v + b', "weight_map": {}}',
    b'{"weight_map": {"w": ' + v + b"}}"])))
def test_fuzz_index_hostile_structures(content: bytes) -> None:
    ended(check_index, content)


def shared_references(levels: int, tag_bytes: bytes = b"\xd8\x1c") -> bytes:
    """`levels` levels of a pair of references to the level before: 2**levels leaves in a few bytes."""
    parts = [tag_bytes + b"\x82\x01\x01"]
    parts += [tag_bytes + b"\x82" + (b"\xd8\x1d\x18" + bytes([i - 1])) * 2 for i in range(1, levels)]
    return bytes([0x98, levels]) + b"".join(parts)


@st.composite
def hostile_cbor_values(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["shared", "tag", "colliding", "bignum", "deep", "strings"]))
    if kind == "shared":
        # tag 28 written minimally, or in a longer form cbor2 also reads
        return shared_references(draw(st.integers(1, 64)), draw(st.sampled_from([b"\xd8\x1c", b"\xd9\x00\x1c"])))
    if kind == "tag":
        tag = draw(st.one_of(st.sampled_from([0, 1, 2, 3, 4, 5, 25, 28, 29, 30, 35, 36, 37, 52, 54, 100, 256, 258, 260,
                                              261, 1004, 43000, 55799]), st.integers(0, 2**64 - 1)))
        return cbor2.dumps(cbor2.CBORTag(tag, draw(CBOR_VALUES)))
    if kind == "colliding":  # integer keys that all hash to 0, and float keys
        n = draw(st.integers(1, 3_000))
        keys = [k * (2**61 - 1) for k in range(1, n + 1)] if draw(st.booleans()) else [float(k) for k in range(n)]
        return cbor2.dumps(dict.fromkeys(keys, 0))
    if kind == "bignum":
        return cbor2.dumps(draw(st.sampled_from([1, -1])) * 10 ** draw(DIGITS))
    if kind == "deep":
        depth = draw(DEPTHS)
        return b"\x81" * min(depth, 10_000) + b"\x00"
    return cbor2.dumps(draw(st.text(alphabet="\x1b\n\u2028a[", max_size=50)))


@st.composite
def hostile_packs(draw: st.DrawFn) -> bytes:
    value = draw(hostile_cbor_values())
    t, s = cbor2.dumps("tensors"), cbor2.dumps
    where = draw(st.sampled_from(["top", "tensors", "descriptor", "dtype", "shape", "offsets", "metadata", "name"]))
    descriptor = {"dtype": s("F32"), "shape": s([1]), "data_offsets": s([0, 4])}
    if where in ("dtype", "shape"):
        descriptor[where] = value
    elif where == "offsets":
        descriptor["data_offsets"] = value
    body = b"\xa3" + b"".join(s(k) + v for k, v in descriptor.items())
    blob = {
        "top": value,
        "tensors": b"\xa1" + t + value,
        "metadata": b"\xa2" + t + b"\xa1" + s("w") + body + s("metadata") + value,
        "name": b"\xa1" + t + b"\xa1" + value + body,
    }.get(where, b"\xa1" + t + b"\xa1" + s("w") + (value if where == "descriptor" else body))
    head = struct.pack("<IHI", 0x4255524E, 1, len(blob)) + blob
    return head + bytes(-len(head) % 256) + bytes(4)


@FUZZ
@given(hostile_packs())
def test_fuzz_burnpack_hostile_metadata(content: bytes) -> None:
    def check(data: bytes) -> None:
        CALLS["burnpack"] += 1
        path = scratch("h.bpk", data)
        try:
            BurnpackReader.open(path)
        except InputError as error:
            assert error.hint and str(path) in error.message and error.message.isprintable()
            assert len(error.message) < 1_000

    ended(check, content)


CATASTROPHIC = [r"(a+)+$", r"(.*\.)*mlp\..*", r"(a|aa)*b", r"(\w+\s?)*$", r".*\.mlp\..*weight", r"(.*a){12}",
                r"(x+x+)+y", r"(a{100}){100}", r"((a{10}){10}){10}", r"(?=a)a", r"(a)\1", r"a*+", r"(?>a)"]


@st.composite
def hostile_recipes(draw: st.DrawFn) -> bytes:
    """Recipes with deep arrays or inline tables, huge integers, a byte order mark, 100 kB lines, control
    characters and catastrophic patterns."""
    kind = draw(st.sampled_from(["nesting", "table", "integer", "line", "header", "pattern", "control", "store"]))
    depth = draw(DEPTHS)
    rule = '[[rule]]\nmatch = "x"\n'
    body = {
        "nesting": f"x = {'[' * depth}{']' * depth}\n",
        "table": f"x = {'{a = ' * min(depth, 20_000)}1{'}' * min(depth, 20_000)}\n",
        "integer": f"{rule}value = \"Q4S\"\nblock = [{'7' * draw(DIGITS)}]\nblock_scale = \"F16\"\n",
        "line": f"{rule}keep = true\n# {' ' * 100_000}\nx = \"{' ' * 100_000}\"\n",
        "header": f"[\"{' ' * 100_000}{draw(st.sampled_from(['', '!', ']', '#']))}\"]\n",
        "pattern": f"[[rule]]\nmatch = {json.dumps('re:' + draw(st.sampled_from(CATASTROPHIC)))}\nkeep = true\n",
        "control": f"{rule}{json.dumps(draw(st.text(alphabet=chr(27) + chr(10) + chr(0x2028) + 'ab[', min_size=1)))}"
                   " = 1\n",
        "store": f"{rule}value = \"Q4S\"\nstore = \"PackedU32({'9' * draw(DIGITS)})\"\n",
    }[kind]
    text = ("version = 1\n" + body).encode()
    return (b"\xef\xbb\xbf" if draw(st.booleans()) else b"") + text


@FUZZ
@given(hostile_recipes())
def test_fuzz_recipe_hostile_structures(content: bytes) -> None:
    ended(check_recipe, content)


# -- files that are not regular files --------------------------------------------------------------------


def _special(kind: str, path: Path) -> None:
    if path.is_symlink() or path.exists():
        path.unlink() if not path.is_dir() or path.is_symlink() else path.rmdir()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind(str(path))
    elif kind == "directory":
        path.mkdir()
    else:  # a character device, through a link
        path.symlink_to(kind)


@FUZZ
@given(st.sampled_from(["fifo", "socket", "directory", "/dev/zero", "/dev/null", "/dev/urandom"]),
       st.sampled_from(["safetensors", "shard", "index", "burnpack", "recipe"]))
def test_fuzz_non_regular_files(kind: str, reader: str) -> None:
    """Every reader refuses a FIFO, a socket, a device or a directory as `not a regular file`, at once."""
    CALLS["special"] += 1
    folder = _SCRATCH / "special"
    folder.mkdir(exist_ok=True)
    name = {"safetensors": "m.safetensors", "shard": "s.safetensors", "index": "model.safetensors.index.json",
            "burnpack": "m.bpk", "recipe": "r.toml"}[reader]
    _special(kind, folder / name)
    try:
        with never_hangs():
            if reader in ("safetensors", "shard"):
                if reader == "shard":
                    (folder / "i.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": name}}))
                SafetensorsSource.open(folder / ("i.safetensors.index.json" if reader == "shard" else name))
            elif reader == "index":
                SafetensorsSource.open(folder / name)
            elif reader == "burnpack":
                BurnpackReader.open(folder / name)
            else:
                load_recipe(folder / name)
    except (InputError, RecipeError) as error:
        directory = kind == "directory" and ("holds neither" in error.message or "is a directory" in error.message)
        assert "not a regular file" in error.message or directory, error.message
        assert error.hint
    else:
        raise AssertionError(f"{reader} read {kind}")
