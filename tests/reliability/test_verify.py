"""Verified output: the error bound, and the checks on a written file, alone and through the CLI.

The bounds are worked by hand from docs/arithmetic.md; the corrupted outputs are made by rewriting a
good file's bytes, and the CLI runs are real runs with one payload damaged on its way to the writer.
"""

from __future__ import annotations

import hashlib
import importlib
import itertools
import json
import math
import time
from pathlib import Path

import pytest
import torch

from qcli.codec import decode, encode, search_loop
from qcli.codec.quantize import CHUNK_ELEMENTS
from qcli.errors import OutputError
from qcli.io.burnpack import BurnpackReader, BurnpackWriter, TensorEntry
from qcli.io.dtypes import Plain, QFloat
from qcli.io.safetensors import SafetensorsSource
from qcli.measure import Measurement, block_errors, error_bound
from qcli.plan.decisions import plan_by_name
from qcli.presets import DEFAULT_PRESET, PRESETS
from qcli.scheme import (
    WEIGHT_CALIBRATIONS,
    Calibration,
    Native,
    PackedNative,
    PackedU32,
    QuantScheme,
    QuantValue,
    ScaleDtype,
    accept_problems,
)
from qcli.verify import out_of_bound, read_back
from tests.cli_support import SINGLE, assert_user_error, cli

# -- The bound -------------------------------------------------------------------------------------


def test_bound_of_an_exact_scale_is_half_a_step() -> None:
    # max |x| = 127 under Q8S with an f32 scale: s = 127 / 127 = 1, so at most 0.5 off.
    scheme = QuantScheme().with_value(QuantValue.Q8S).per_tensor(ScaleDtype.F32)
    bound = float(error_bound(torch.tensor([[127.0, 0.5, -3.25, 64.0]]), scheme, Calibration.MinMax).max())
    assert 0.5 <= bound < 0.5 + 1e-3


def test_bound_of_a_minifloat_is_half_its_widest_gap() -> None:
    # E2M1 values 4 and 6 are 2 apart; max |x| = 6 gives s = 1 rounded up onto f16 (exact): at most 1 off.
    scheme = QuantScheme().with_value(QuantValue.E2M1).with_store(PackedNative(0))
    scheme = scheme.per_block([16], ScaleDtype.F16)
    bound = float(error_bound(torch.linspace(-6, 6, 16).reshape(1, 16), scheme, Calibration.MinMax).max())
    assert 1.0 <= bound < 1.01


def test_bound_of_absmean_includes_what_clamping_cuts() -> None:
    # mean |x| = 3 under Q4S: s = 3 / 7, so 9 clamps to 7 * s = 3 and is 6 off.
    scheme = QuantScheme().with_value(QuantValue.Q4S).per_tensor(ScaleDtype.F32)
    x = torch.tensor([[1.0, 1.0, 1.0, 9.0]])
    bound = float(error_bound(x, scheme, Calibration.AbsMean).max())
    assert 6.0 <= bound < 6.0 + 0.5 * 9 / 7 + 1e-3
    decoded = decode(encode(x, scheme, Calibration.AbsMean), scheme, x.shape)
    assert float(block_errors(x, decoded, scheme).max()) == pytest.approx(6.0)


def accepted_schemes():
    for value, store, levels, dtype in itertools.product(
        QuantValue, (Native(), PackedU32(0), PackedNative(0)), ("tensor", "block", "two"), ScaleDtype
    ):
        scheme = QuantScheme().with_value(value).with_store(store)
        if levels == "tensor":
            scheme = scheme.per_tensor(dtype)
        elif levels == "block":
            scheme = scheme.per_block([32], dtype)
        else:
            scheme = scheme.per_block([16], dtype).per_tensor(ScaleDtype.F32)
        for calibration in WEIGHT_CALIBRATIONS:
            if not accept_problems(scheme, calibration):
                yield scheme, calibration


def data(kind: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(7)
    x = torch.randn(4, 64, generator=g)
    return {
        "normal": x,
        "outliers": x * torch.where(torch.rand(4, 64, generator=g) < 0.02, 1000.0, 1.0),
        "tiny": x * 1e-30,
        "huge": x * 1e9,  # saturates f16 and ue4m3 one-level scales
        "zero-rows": torch.cat([torch.zeros(2, 64), x[:2] * 1e-6]),
    }[kind]


@pytest.mark.parametrize("kind", ["normal", "outliers", "tiny", "huge", "zero-rows"])
def test_every_accepted_scheme_decodes_within_its_bound(kind: str) -> None:
    x = data(kind)
    checked = 0
    for scheme, calibration in accepted_schemes():
        decoded = decode(encode(x, scheme, calibration), scheme, x.shape)
        errors, bounds = block_errors(x, decoded, scheme), error_bound(x, scheme, calibration)
        assert bool((errors <= bounds).all()), (str(scheme), calibration, float((errors - bounds).max()))
        checked += 1
    assert checked > 100


def test_a_damaged_value_is_outside_the_bound() -> None:
    scheme = PRESETS[DEFAULT_PRESET].scheme
    x = data("normal")
    payload = encode(x, scheme)
    payload[5] ^= 0x88  # the top bit of two 4-bit fields, or of one 8-bit field: at least 8 steps
    decoded = decode(payload, scheme, x.shape)
    assert not bool((block_errors(x, decoded, scheme) <= error_bound(x, scheme, Calibration.MinMax)).all())


# -- The bound check and the read-back on files ----------------------------------------------------


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("verify") / "good.bpk"
    assert cli("quantize", SINGLE, "-o", out, "--device", "cpu", "--no-verify").code == 0
    return out


def rewrite(good: Path, target: Path, change) -> Path:
    """A copy of `good` whose entries and payloads went through `change(entries, payloads)`."""
    reader = BurnpackReader.open(good)
    entries = reader.entries()
    payloads = [bytearray(reader.read(e.name)) for e in entries]
    entries, payloads = change(entries, payloads)
    with BurnpackWriter(target, entries, reader.metadata) as writer:
        for entry, payload in zip(entries, payloads, strict=True):
            writer.write(entry.name, payload)
        writer.commit()
    return target


def written_digests(good: Path) -> dict[str, bytes]:
    """What the writer records for the good file: for each payload it was handed, the sha256 of the
    sha256s of its 16 MiB pieces (these payloads are one piece each)."""
    reader = BurnpackReader.open(good)
    return {e.name: hashlib.sha256(hashlib.sha256(reader.read(e.name)).digest()).digest()
            for e in reader.entries()}


def check(path: Path, good: Path) -> None:
    with SafetensorsSource.open(SINGLE) as source:
        plan = plan_by_name(source.infos())  # quantize's default plan, in its order
        verified = read_back([path], plan, [i.name for i in source.infos()], written_digests(good))
    assert verified.tensors == len(plan.entries)
    assert verified.bytes == sum(e.nbytes for e in BurnpackReader.open(path).entries())


def check_decoded(path: Path, name: str) -> None:
    """The bound check on `name` as written in `path`, against its source, as `qcli quantize` raises it."""
    entry = next(e for e in BurnpackReader.open(path).entries() if e.name == name)
    scheme = entry.dtype.scheme
    payload = torch.frombuffer(bytearray(BurnpackReader.open(path).read(name)), dtype=torch.uint8)
    with SafetensorsSource.open(SINGLE) as source:
        x = source.load(name)
    measured = Measurement.on("cpu")
    measured.add(x, payload, scheme, Calibration.MinMax)
    failure = measured.failure()
    if failure is not None:
        raise out_of_bound(failure, scheme, name, path)


def first_quantized(entries: list[TensorEntry]) -> int:
    return next(i for i, e in enumerate(entries) if isinstance(e.dtype, QFloat))


def test_a_good_file_reads_back_and_decodes_within_its_bound(good: Path) -> None:
    check(good, good)
    for entry in BurnpackReader.open(good).entries():
        if isinstance(entry.dtype, QFloat):
            check_decoded(good, entry.name)


def test_a_damaged_payload_fails_the_bound_check(good: Path, tmp_path: Path) -> None:
    def damage(entries, payloads):
        payloads[first_quantized(entries)][0] ^= 0x88
        return entries, payloads

    entries = BurnpackReader.open(good).entries()
    name = entries[first_quantized(entries)].name
    with pytest.raises(OutputError, match=r"verification of .* failed: tensor '.*' decodes .* over its"):
        check_decoded(rewrite(good, tmp_path / "bad.bpk", damage), name)


def test_a_nan_scale_fails_the_bound_check(good: Path, tmp_path: Path) -> None:
    def damage(entries, payloads):
        i = first_quantized(entries)
        payloads[i][-2:] = b"\x00\x7e"  # the last f16 block scale becomes NaN
        return entries, payloads

    entries = BurnpackReader.open(good).entries()
    name = entries[first_quantized(entries)].name
    with pytest.raises(OutputError, match="over its scheme's bound nan|decodes nan"):
        check_decoded(rewrite(good, tmp_path / "bad.bpk", damage), name)


def test_a_payload_other_than_written_fails_the_read_back(good: Path, tmp_path: Path) -> None:
    def damage(entries, payloads):
        payloads[first_quantized(entries)][0] ^= 0x88
        return entries, payloads

    with pytest.raises(OutputError, match="tensor '.*' reads back other bytes than were written"):
        check(rewrite(good, tmp_path / "bad.bpk", damage), good)


def test_a_missing_tensor_fails(good: Path, tmp_path: Path) -> None:
    def drop(entries, payloads):
        return entries[1:], payloads[1:]

    name = BurnpackReader.open(good).entries()[0].name
    with pytest.raises(OutputError, match=f"input tensor '{name}' is missing from the output"):
        check(rewrite(good, tmp_path / "bad.bpk", drop), good)


def test_a_changed_kept_tensor_fails(good: Path, tmp_path: Path) -> None:
    def damage(entries, payloads):
        i = next(i for i, e in enumerate(entries) if isinstance(e.dtype, Plain))
        payloads[i][0] ^= 1
        return entries, payloads

    with pytest.raises(OutputError, match="tensor '.*' reads back other bytes than were written"):
        check(rewrite(good, tmp_path / "bad.bpk", damage), good)


def test_a_tensor_written_with_another_scheme_fails(good: Path, tmp_path: Path) -> None:
    same_size = {"BF16": "F16", "F16": "BF16", "F32": "I32"}
    kept = next(e for e in BurnpackReader.open(good).entries() if isinstance(e.dtype, Plain))

    def relabel(entries, payloads):
        i = entries.index(kept)
        entries[i] = TensorEntry(kept.name, Plain(same_size[kept.dtype]), kept.shape, kept.nbytes)
        return entries, payloads

    other = same_size[kept.dtype]
    with pytest.raises(OutputError, match=f"is written as {other} .* the plan says {kept.dtype}"):
        check(rewrite(good, tmp_path / "bad.bpk", relabel), good)


# -- Through the CLI -------------------------------------------------------------------------------


def corrupt_pipeline(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU codec with the first packed byte of every quantized tensor damaged as it is packed, as a
    faulty kernel or memory would."""
    import qcli.codec.quantize

    real = qcli.codec.quantize.pack_fields

    def pack_fields(fields, scheme, out=None):
        packed = real(fields, scheme, out)
        if not getattr(pack_fields, "damaged", False):
            packed.view(-1)[0] ^= 0x88
        pack_fields.damaged = True
        return packed

    real_encode = qcli.codec.quantize.encode

    def encode(*args, **kwargs):  # damage the first chunk of each tensor
        pack_fields.damaged = False
        return real_encode(*args, **kwargs)

    monkeypatch.setattr(qcli.codec.quantize, "pack_fields", pack_fields)
    monkeypatch.setattr(qcli.codec, "encode", encode)


def test_cli_never_puts_an_output_that_fails_verification_in_place(tmp_path: Path, monkeypatch) -> None:
    corrupt_pipeline(monkeypatch)
    out = tmp_path / "out.bpk"
    lines = assert_user_error(cli("quantize", SINGLE, "-o", out, "--device", "cpu"), 4)
    assert lines[0].startswith(f"error: verification of {out} failed: tensor '")
    assert list(tmp_path.iterdir()) == []
    out.write_bytes(b"the previous output")
    assert_user_error(cli("quantize", SINGLE, "-o", out, "--device", "cpu", "--force"), 4)
    assert out.read_bytes() == b"the previous output"
    assert [p.name for p in tmp_path.iterdir()] == ["out.bpk"]


def test_no_verify_skips_the_check(tmp_path: Path, monkeypatch) -> None:
    corrupt_pipeline(monkeypatch)
    result = cli("quantize", SINGLE, "-o", tmp_path / "out.bpk", "--device", "cpu", "--no-verify", "--json")
    assert result.code == 0 and result.json["timings"]["verify"] is None
    assert (tmp_path / "out.bpk").exists()


def corrupt_writer(monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer that flips a bit of the first quantized payload in the file after it was handed over (and
    hashed, and bound-checked), as a faulty disk or page cache would."""
    real = BurnpackWriter.finish

    def finish(self):
        quantized = next(i for i, e in enumerate(self._entries) if isinstance(e.dtype, QFloat))
        self._file.flush()
        position = self.data_start + self._offsets[quantized][0]
        with open(self._temporary.path, "r+b") as file:
            file.seek(position)
            flipped = file.read(1)[0] ^ 1
            file.seek(position)
            file.write(bytes([flipped]))
        return real(self)

    monkeypatch.setattr(BurnpackWriter, "finish", finish)


def test_cli_read_back_catches_bytes_changed_after_the_bound_check(tmp_path: Path, monkeypatch) -> None:
    corrupt_writer(monkeypatch)
    out = tmp_path / "out.bpk"
    lines = assert_user_error(cli("quantize", SINGLE, "-o", out, "--device", "cpu"), 4)
    assert lines[0].startswith(f"error: verification of {out} failed: tensor '")
    assert lines[0].endswith("reads back other bytes than were written")
    assert list(tmp_path.iterdir()) == []


def counted_decodes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, ...]]:
    """The shapes the payload decoder is called with, in order."""
    decoding = importlib.import_module("qcli.codec.decode")  # the module, which `qcli.codec.decode` is not
    decoded: list[tuple[int, ...]] = []
    real = decoding.decode_values
    monkeypatch.setattr(decoding, "decode_values",
                        lambda values, scales, scheme, shape: decoded.append(tuple(shape))
                        or real(values, scales, scheme, shape))
    return decoded


@pytest.mark.parametrize("flags", [[], ["--no-stats"], ["--no-verify"]], ids=["both", "verify", "stats"])
def test_without_the_compiled_loop_each_quantized_tensor_is_decoded_once(tmp_path: Path, monkeypatch,
                                                                         flags: list[str]) -> None:
    # The CPU pipeline then decodes each chunk's payload bytes as it packs them: every value once.
    monkeypatch.setattr(search_loop, "BUILT", False)
    decoded = counted_decodes(monkeypatch)
    doc = cli("quantize", SINGLE, "-o", tmp_path / "o.bpk", "--device", "cpu", "--json", *flags).json
    quantized = [t for t in doc["tensors"] if t["decision"] == "quantize"]
    assert sum(map(math.prod, decoded)) == sum(math.prod(t["shape"]) for t in quantized) > 0


@pytest.mark.skipif(not search_loop.BUILT, reason="the compiled loop is not built (no C compiler)")
@pytest.mark.parametrize("flags", [[], ["--no-stats"], ["--no-verify"]], ids=["both", "verify", "stats"])
def test_the_compiled_loop_unpacks_a_sixteenth_of_each_quantized_tensor(tmp_path: Path, monkeypatch,
                                                                        flags: list[str]) -> None:
    # The loop measures every value from its code; the packed bytes of each chunk's first sixteenth of
    # rows (rounded up) are unpacked and match those codes, so nothing is decoded. The sample's tensors
    # are one chunk each, their blocks one row high.
    decoded = counted_decodes(monkeypatch)
    packing = importlib.import_module("qcli.codec.pack")
    unpacked: list[tuple[int, ...]] = []
    real = packing.unpack_fields
    monkeypatch.setattr(packing, "unpack_fields",
                        lambda region, scheme, shape: unpacked.append(tuple(shape)) or real(region, scheme, shape))
    doc = cli("quantize", SINGLE, "-o", tmp_path / "o.bpk", "--device", "cpu", "--json", *flags).json
    quantized = [t["shape"] for t in doc["tensors"] if t["decision"] == "quantize"]
    assert all(math.prod(shape) <= CHUNK_ELEMENTS for shape in quantized) and quantized
    assert unpacked == [(math.ceil(rows / 16), *rest) for rows, *rest in quantized] and decoded == []


def test_no_verify_no_stats_decodes_nothing(tmp_path: Path, monkeypatch) -> None:
    def decode(*args, **kwargs):
        raise AssertionError("decoded")

    monkeypatch.setattr(importlib.import_module("qcli.codec.decode"), "decode_values", decode)
    out = tmp_path / "o.bpk"
    doc = cli("quantize", SINGLE, "-o", out, "--device", "cpu", "--json", "--no-verify", "--no-stats").json
    assert doc["timings"]["stats"]["bytes"] == 0 and doc["timings"]["verify"] is None and out.exists()


def test_verification_cost_is_reported(tmp_path: Path) -> None:
    result = cli("quantize", SINGLE, "-o", tmp_path / "out.bpk", "--device", "cpu", "--json")
    assert result.code == 0
    verify = result.json["timings"]["verify"]
    assert verify["seconds"] > 0 and verify["bytes"] == sum(t["bytes_out"] for t in result.json["tensors"])
    table = cli("quantize", SINGLE, "-o", tmp_path / "o2.bpk", "--device", "cpu")
    assert "verify " in table.out
    json.dumps(verify)


def test_each_source_tensor_is_read_once(tmp_path: Path, monkeypatch) -> None:
    """The pipeline measures the tensor it loaded for its payload; the read-back reads none."""
    loads: list[str] = []
    real = SafetensorsSource.load
    monkeypatch.setattr(SafetensorsSource, "load", lambda self, name: loads.append(name) or real(self, name))
    doc = cli("quantize", SINGLE, "-o", tmp_path / "o.bpk", "--device", "cpu", "--json").json
    assert sorted(loads) == sorted(t["name"] for t in doc["tensors"])


@pytest.mark.parametrize("loop", [True, False], ids=["loop", "decode"])
def test_the_decode_and_its_measuring_are_timed_as_stats(tmp_path: Path, monkeypatch, loop: bool) -> None:
    # The measuring (the compiled loop's, or the decode without it) made slow on purpose shows in the stats
    # phase, not in quantize.
    if loop and not search_loop.BUILT:
        pytest.skip("the compiled loop is not built (no C compiler)")
    monkeypatch.setattr(search_loop, "BUILT", loop)
    module, name = (search_loop, "measured") if loop else (importlib.import_module("qcli.codec.decode"),
                                                           "decode_values")
    real, calls = getattr(module, name), []

    def slow(*args):
        calls.append(1)
        time.sleep(0.1)  # one per chunk: over a second in all, beyond the quantizing of the tiny sample
        return real(*args)

    monkeypatch.setattr(module, name, slow)
    timings = cli("quantize", SINGLE, "-o", tmp_path / "o.bpk", "--device", "cpu", "--json").json["timings"]
    assert calls and timings["stats"]["seconds"] >= 0.1 * len(calls)
    assert timings["quantize"]["seconds"] < timings["stats"]["seconds"]
