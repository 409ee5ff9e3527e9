"""Presets: each is the Burn scheme its name promises, written out here in Burn's serde form."""

from __future__ import annotations

import re

import pytest

from qcli import BURN_VERSION, layout
from qcli.burn_backends import LAVAPIPE, BurnBackend, backends, compute_failures, decode_problem, default_preset
from qcli.commands.options import QuantizeOptions
from qcli.errors import SchemeError, UsageError
from qcli.plan.decisions import make_plan
from qcli.presets import DEFAULT_PRESET, PRESETS, get_preset
from qcli.scheme import Calibration, QuantScheme, accept_problems
from tests.cli_support import ROOT, cli
from tests.plan.test_plan import info


def _block(n: int, dtype: str) -> dict:
    return {"size": {"storage": [n, 1, 1, 1, 1], "len": 1}, "dtype": dtype}


def _serde(value: str, store: object, tensor: str | None, block: dict | None) -> dict:
    return {"value": value, "store": store, "mode": "Symmetric", "tensor": tensor, "block": block}


U32 = {"PackedU32": 0}
EXPECTED = {
    "q8s": _serde("Q8S", U32, "F32", None),
    "q8s-native": _serde("Q8S", "Native", "F32", None),
    "q8s-b32": _serde("Q8S", U32, None, _block(32, "F16")),
    "q4s-b32": _serde("Q4S", U32, None, _block(32, "F16")),
    "q4s-b64": _serde("Q4S", U32, None, _block(64, "F16")),
    "q4s-b128": _serde("Q4S", U32, None, _block(128, "F16")),
    "q4f-b32": _serde("Q4F", U32, None, _block(32, "F16")),
    "q4f-b32-global": _serde("Q4F", U32, "F32", _block(32, "F16")),
    "q2s-b32": _serde("Q2S", U32, None, _block(32, "F16")),
    "e4m3": _serde("E4M3", U32, "F32", None),
    "e5m2": _serde("E5M2", U32, "F32", None),
    "e4m3-b32": _serde("E4M3", U32, None, _block(32, "F16")),
    "fp4-b32": _serde("E2M1", U32, None, _block(32, "F16")),
}


def test_the_presets_are_exactly_these() -> None:
    assert set(PRESETS) == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_preset_is_the_scheme_its_name_promises(name: str) -> None:
    preset = PRESETS[name]
    assert preset.name == name
    assert preset.scheme.to_serde() == EXPECTED[name]
    assert preset.calibration is Calibration.MinMax
    assert preset.description


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_is_accepted_by_burn(name: str) -> None:
    assert accept_problems(PRESETS[name].scheme, PRESETS[name].calibration) == []


def test_the_docs_and_quantize_help_name_the_default_preset() -> None:
    assert DEFAULT_PRESET in PRESETS
    readme = (ROOT / "README.md").read_text()
    named = re.findall(r"\(default policy, ([\w-]+)\)|default `([\w-]+)`", readme)
    assert named and {a or b for a, b in named} == {DEFAULT_PRESET}
    presets = (ROOT / "docs" / "presets.md").read_text()
    assert re.findall(r"The default is \*\*`([\w-]+)`\*\*", presets) == [DEFAULT_PRESET]
    assert re.findall(r"^\| `([\w-]+)` \|.*\*\*default\*\*", presets, re.M) == [DEFAULT_PRESET]
    shown = " ".join(cli("quantize", "--help").out.split())
    assert re.findall(r"the default scheme \(([\w-]+)[,)]", shown) == [DEFAULT_PRESET]


# What `--burn-backend` writes without `--scheme`: the form bench/best_form.py measured best there
# (docs/benchmarks.md), in Burn's serde form.
BEST = {"flex": EXPECTED["q4s-b32"], "wgpu": EXPECTED["q4f-b32-global"], "ndarray": EXPECTED["q8s-b32"]}


@pytest.mark.parametrize("backend", sorted(BEST))
def test_burn_backend_without_scheme_plans_that_backends_best_form(backend: str) -> None:
    layer = [info("model.layers.0.mlp.up_proj.weight", "F32", [256, 128])]
    options = QuantizeOptions.parse(burn_backend=backend)
    plan = make_plan(layer, options=options.plan)
    assert plan.entries[0].decision.scheme.to_serde() == BEST[backend]
    assert not [p for p in plan.problems if p.severity == "error"]
    assert QuantizeOptions.parse(burn_backend=backend, scheme="q8s").plan.preset.name == "q8s"  # --scheme still wins


def test_without_burn_backend_or_for_burn_0_21_the_default_preset_stays() -> None:
    assert QuantizeOptions.parse().plan.preset.name == DEFAULT_PRESET
    assert QuantizeOptions.parse(burn_backend="wgpu", burn_version="0.21").plan.preset.name == DEFAULT_PRESET


def test_the_readme_says_what_burn_backend_writes_by_default() -> None:
    readme = (ROOT / "README.md").read_text()
    [row] = [line for line in readme.splitlines() if line.startswith("| best 4-bit here |")]
    *cells, on_lavapipe = backend_marks(row, len(backends()) + 1)  # wgpu writes one form on every driver
    assert on_lavapipe == cells[-1] and backends()[-1] is BurnBackend.wgpu
    assert cells == [
        f"`{default_preset(b)}`" if PRESETS[default_preset(b)].scheme.value.size_bits() == 4 else "none"
        for b in backends()]


def test_get_preset_is_case_insensitive() -> None:
    assert get_preset("FP4-B32") is PRESETS["fp4-b32"]
    assert get_preset(" Q4S-B32 ") is PRESETS["q4s-b32"]


def test_unknown_preset_suggests_the_closest_name() -> None:
    with pytest.raises(UsageError) as info:
        get_preset("q4s-b23")
    assert "unknown preset 'q4s-b23'" in info.value.message
    assert "did you mean 'q4s-b32'" in info.value.hint


def test_codebook_preset_names_get_the_lookup_refusal() -> None:
    with pytest.raises(SchemeError) as info:
        get_preset("nf4")
    assert "Lookup" in info.value.message
    assert "lookup quantization does not travel as a QFloat tensor" in info.value.message
    assert "Symmetric" in info.value.hint


@pytest.mark.parametrize("name", ["nvfp4", "MXFP4"])
def test_formats_no_burn_backend_loads_are_refused_with_what_loads_instead(name: str) -> None:
    with pytest.raises(SchemeError) as info:
        get_preset(name)
    assert "loads on no backend of Burn" in info.value.message
    assert "fp4-b32" in info.value.hint


def test_zero_point_preset_names_are_refused() -> None:
    with pytest.raises(SchemeError) as info:
        get_preset("q4_1")
    assert "zero point" in info.value.message


def test_docs_presets_lists_every_preset_with_its_scheme() -> None:
    docs = (ROOT / "docs" / "presets.md").read_text().split("<!-- burn 0.21 -->")[0]
    rows = {row.split("|")[1].strip(" `"): row for row in docs.splitlines() if row.startswith("| `")}
    assert set(rows) == set(PRESETS)
    for name, preset in PRESETS.items():
        bits = layout.bits_per_weight(layout.quantized_data_len(preset.scheme, (4096, 4096)), 4096 * 4096)
        assert f"| {bits:.4g} |" in rows[name].replace(".0 |", " |"), name
        # The scheme column spells the scheme the way `str(QuantScheme)` does (nvfp4 after Burn's name).
        assert str(preset.scheme) in rows[name], name


def backend_marks(row: str, columns: int) -> list[str]:
    """The last `columns` cells of a markdown table row."""
    return [cell.strip() for cell in row.strip().strip("|").split("|")][-columns:]


# The marker each other release's preset table follows; the default release's comes before any of them.
MARKERS = {"0.21.0": "<!-- burn 0.21 -->", "0.23.0-pre.1": "<!-- burn 0.23 -->"}


def release_section(text: str, version: str) -> str:
    """The part of a document that holds Burn `version`'s preset table."""
    if version in MARKERS:
        text = text.split(MARKERS[version])[1]
    for marker in MARKERS.values():
        text = text.split(marker)[0]
    return text


@pytest.mark.parametrize(("doc", "version"), [("docs/presets.md", "0.22.1"), ("README.md", "0.22.1"),
                                              ("docs/presets.md", "0.21.0"), ("README.md", "0.21.0"),
                                              ("docs/presets.md", "0.23.0-pre.1"),
                                              ("README.md", "0.23.0-pre.1")])
def test_the_preset_by_backend_tables_say_what_the_capability_table_says(doc: str, version: str) -> None:
    """✓ exactly where `qcli.burn_backends` (held to Burn by tests/io/test_burn_backends.py) loads the preset
    on a [4096, 4096] weight, and the pair count below the table adds up. Burn 0.21's table follows the
    marker `<!-- burn 0.21 -->`, 0.23's `<!-- burn 0.23 -->`; the default release's comes first. 0.23's
    table has a last column for wgpu with the tile kernels, held to their record (TILE_COMPUTES)."""
    text = release_section((ROOT / doc).read_text(), version)
    rows = {row.split("|")[1].strip(" `"): row for row in text.splitlines() if row.startswith("| `")}
    tile, lavapipe = version == "0.23.0-pre.1", version == BURN_VERSION
    marks = []
    for name, preset in PRESETS.items():
        want = [mark(b, preset.scheme, version) for b in backends(version)]
        cells = backend_marks(rows[name], len(backends(version)) + (tile or lavapipe))
        assert cells[: len(want)] == want, name
        if tile:
            assert cells[-1] == ("✓" if name in TILE_COMPUTES else "—"), name
        if lavapipe:
            assert cells[-1] == mark(BurnBackend.wgpu, preset.scheme, version, LAVAPIPE), name
        marks += want
    pairs, loads, decodes = len(marks), marks.count("✓"), marks.count("decodes")
    count = (f"Of the {pairs} preset × backend pairs, {loads} decode and compute, {decodes} decode only and "
             f"{pairs - loads - decodes} neither; `--burn-backend`\nrefuses the last {pairs - loads}"
             if version == BURN_VERSION else
             f"Of the {pairs} preset × backend pairs (flex and wgpu), {loads} decode and compute, {decodes} decode "
             f"only and {pairs - loads - decodes} neither" if tile else
             f"Of the {pairs} preset × backend pairs, {loads} load bit-identically and {pairs - loads} are refused")
    assert count in text or count in " ".join(text.split())


# The presets Burn 0.23's wgpu with the tile kernels computed on lavapipe (tests/data/burn/wgpu-0.23-tile,
# held to Burn's record by tests/io/test_burn_023_recorded.py): all but q8s-native, which wgpu does not decode.
TILE_COMPUTES = set(PRESETS) - {"q8s-native"}


def mark(backend: BurnBackend, scheme: QuantScheme, version: str, device: str | None = None) -> str:
    """A preset table's cell: ✓ where a model computes with the preset, "decodes" where Burn only decodes it
    (Burn 0.21's compute was not measured), — where it does neither; on `device` (a driver the backend was
    measured on), or wherever it was measured (what `--burn-backend` follows)."""
    if decode_problem(backend, scheme, (4096, 4096), version) is not None:
        return "—"
    failures = [f for f in compute_failures(backend, scheme, version) if device is None or device in f.devices]
    return "decodes" if failures else "✓"


@pytest.mark.parametrize(
    ("name", "preset", "phrase"),
    [
        ("q8_0", "q8s-b32", "8-bit, blocks of 32 with F16 scales, as Q8_0"),
        ("Q8_0", "q8s-b32", "the same [-127, 127] grid"),
        ("q4_0", "q4f-b32", "max|x| / 7.5 where Q4_0 divides the signed max by -8"),
        ("fp8", "e4m3", "FP8 E4M3"),
        ("f8", "e4m3", "FP8 E4M3"),
        ("fp8_e4m3", "e4m3", "FP8 E4M3"),
        ("FP8-E4M3", "e4m3", "FP8 E4M3"),
        ("fp8_e5m2", "e5m2", "FP8 E5M2"),
    ],
)
def test_llama_cpp_and_fp8_names_are_refused_naming_the_nearest_preset(name: str, preset: str, phrase: str) -> None:
    with pytest.raises(UsageError) as info:
        get_preset(name)
    assert info.value.exit_code == 2
    origin = "llama.cpp's" if name.lower().startswith("q") else "an FP8 format's"
    assert info.value.message == f"{name!r} is {origin} name, not a qcli preset"
    assert info.value.hint.startswith(f"use {preset}: ") and phrase in info.value.hint
    assert "nvfp4" not in info.value.hint and "did you mean" not in info.value.hint


@pytest.mark.parametrize(("name", "preset"), [("q4_k_m", "q4s-b32"), ("q4_k", "q4s-b32"), ("Q4_K_S", "q4s-b32"),
                                              ("q6_k", "q8s-b32"), ("q2_k", "q4s-b32")])
def test_k_quants_are_refused_with_why_and_a_symmetric_preset(name: str, preset: str) -> None:
    with pytest.raises(SchemeError) as info:
        get_preset(name)
    assert info.value.message.startswith(f"{name} is a llama.cpp K-quant")
    assert "super-blocks of 256 values with integer sub-block scales" in info.value.message
    assert info.value.hint.startswith(f"use {preset} (")


def test_typos_still_get_did_you_mean() -> None:
    with pytest.raises(UsageError) as info:
        get_preset("q8s-b23")
    assert "did you mean 'q8s-b32'" in info.value.hint
