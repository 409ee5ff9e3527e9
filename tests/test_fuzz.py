"""Fuzz targets: hostile bytes into the safetensors header parser, the burnpack reader, the recipe parser.

Each target states a property that must hold for every input: the reader either accepts the file or
raises its own error (`InputError`, or a recipe fault with a line); nothing else may escape. Where it
accepts, its view must agree with an independent reader (the `safetensors` library) or with what was
written. CI runs a bounded number of
examples (QCLI_FUZZ_EXAMPLES, default 200); `bench/fuzz_long.py` runs the same targets for 100,000+.
"""

from __future__ import annotations

import json
import os
import struct
import tempfile
from collections import Counter
from pathlib import Path

import cbor2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import safe_open

from qcli.errors import InputError, RecipeError
from qcli.io.burnpack import BurnpackReader, BurnpackWriter, TensorEntry
from qcli.io.dtypes import SAFETENSORS_BITS
from qcli.io.safetensors import SafetensorsSource
from qcli.recipe import RULE_KEYS, TOP_KEYS, load_recipe, parse_recipe

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
        entries.append(TensorEntry(name, dtype, shape, numel * SIZES[dtype], param_id))
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
    recipe, faults = parse_recipe(content, "r.toml")
    lines = content.count(b"\n") + 1
    for fault in faults:
        assert fault.message and fault.hint and 1 <= fault.line <= lines, fault
    path = scratch("r.toml", content)
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
