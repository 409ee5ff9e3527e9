"""qcli's output in Burn itself (the harness in tests/burn, Burn 0.22.1): decoded, loaded into a module and
run, against Burn's own quantizer, and the Lookup refusal shown to be Burn's.

Expectations come from Burn: the f32 values its backends decode, the bytes its quantizer writes, the
panic it raises; qcli's side is its own decode of the file it wrote, or the source tensor itself.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from bench.burn_sweep import computed
from qcli import BURN_VERSION
from qcli.burn_backends import (
    BURN_VERSIONS,
    CPU,
    LAVAPIPE,
    BurnBackend,
    backends,
    compute_failures,
    decode_problem,
    release_problem,
)
from qcli.codec import encode
from qcli.codec.decode import block_scales
from qcli.io.burnpack import BurnpackReader, BurnpackWriter, TensorEntry
from qcli.io.dtypes import QFloat
from qcli.presets import PRESETS
from qcli.scheme import Native, PackedU32, QuantMode, QuantScheme, QuantValue, ScaleDtype
from tests.burn_harness import (
    BACKENDS,
    CRATE,
    FIXTURE_SCHEMES,
    FIXTURE_SOURCE,
    FIXTURES,
    HARNESSES,
    LIVE_HARNESSES,
    RECORDED,
    compute,
    dequantize,
    example,
    probe,
    qcli_decodes,
    require,
    run,
    same_bits,
    save_f32,
    write_fixtures,
)
from tests.cli_support import ROOT, SINGLE, cli

pytestmark = pytest.mark.burn


def checkpoint(path: Path, seed: int = 0) -> Path:
    """An F32 stack of two Linear layers in PyTorch's [out, in] orientation, with an outlier in each
    weight so blocks get different scales."""
    generator = torch.Generator().manual_seed(seed)
    tensors = {
        "layers.0.weight": torch.randn(128, 256, generator=generator) * 0.05,
        "layers.0.bias": torch.randn(128, generator=generator) * 0.1,
        "layers.1.weight": torch.randn(64, 128, generator=generator) * 0.05,
        "layers.1.bias": torch.randn(64, generator=generator) * 0.1,
    }
    tensors["layers.0.weight"][3, 17] = 1.5
    tensors["layers.1.weight"][40, 100] = -1.2
    return save_f32(path, tensors)


@pytest.mark.parametrize("version", LIVE_HARNESSES)
@pytest.mark.parametrize("backend", BACKENDS, ids=str)
@pytest.mark.parametrize("preset", PRESETS, ids=str)
def test_every_preset_loads_in_burn_or_is_refused_for_that_backend(preset, backend, version, tmp_path):
    """With --burn-version and --burn-backend, a preset either writes a file that release's backend decodes
    exactly as qcli does, kept tensors bit-identical to the source, or is refused (exit 2) for a reason
    Burn confirms: written anyway, the backend fails on it or decodes it wrongly. A backend the release has
    no table for is refused with the reason. A RECORDED release's presets are held to its record
    (tests/io/test_burn_023_recorded.py)."""
    require(backend, version)
    source = checkpoint(tmp_path / "model.safetensors")
    out = tmp_path / "model.bpk"
    target = ["--device", "cpu", "--scheme", preset, "--burn-version", version]
    result = cli("quantize", source, "-o", out, *target, "--burn-backend", backend)
    if backend not in backends(version):
        assert result.code == 2 and release_problem(backend, version) in result.err.replace("\n", " ")
        return
    if result.code == 0:
        burn, mine, original = dequantize(backend, out, tmp_path / "burn.safetensors", version), \
            qcli_decodes(out), load_file(source)
        assert sorted(burn) == sorted(original)
        for name, got in burn.items():
            assert same_bits(got, mine[name]), f"{name}: Burn ({backend}) decodes other values than qcli"
        for name in ("layers.0.bias", "layers.1.bias"):  # kept: 1-D
            assert same_bits(burn[name], original[name])
        return
    assert result.code == 2, result.err
    if version == "0.21.0" and PRESETS[preset].scheme.is_two_level():  # Burn 0.21's QuantScheme has one level
        assert "two-level scheme" in result.err and "--burn-version 0.22.1" in result.err
        assert cli("quantize", source, "-o", out, *target, "--force").code == 2  # on every backend
        return
    assert f"{backend} backend cannot load" in result.err and "hint: " in result.err
    assert cli("quantize", source, "-o", out, *target, "--force").code == 0
    decoded, mine = probe(backend, out, tmp_path / "burn.safetensors", version), qcli_decodes(out)
    failed = [n for n, got in decoded.items() if isinstance(got, str) or not same_bits(got, mine[n])]
    if failed or decode_problem(backend, PRESETS[preset].scheme, (), version) is not None:
        assert failed, f"--burn-backend {backend} refused {preset}, but Burn decodes every tensor exactly"
        return
    # Refused for what a model computes: here, or (wgpu) on the NVIDIA GPU only, as docs/output.md records.
    device = LAVAPIPE if backend is BurnBackend.wgpu else CPU
    if any(device in f.devices for f in compute_failures(backend, PRESETS[preset].scheme, version)):
        assert any(computed(compute(backend, out, version)).values()), f"{preset} computes right on {backend}"


@pytest.mark.parametrize("preset", ["q8s", "q8s-native"])
def test_burn_0_21_computes_on_a_weight_as_on_its_dequantize(preset, tmp_path):
    """The Burn 0.21 harness's `compute` (the command its CUDA build runs on a GPU), on flex: on each weight of a
    file written for 0.21, a model's ops give what they give on Burn's own `dequantize()` of it, in the verdict
    lines of the 0.22.1 harness's `compute`."""
    out = tmp_path / "model.bpk"
    assert cli("quantize", checkpoint(tmp_path / "model.safetensors"), "-o", out, "--device", "cpu", "--scheme",
               preset, "--burn-version", "0.21.0", "--burn-backend", "flex").code == 0
    verdicts = compute(BurnBackend.flex, out, "0.21.0")
    newer = compute(BurnBackend.flex, out)  # 0.22.1 reads a file written for 0.21 too
    assert sorted((v["name"], v["op"], sorted(v)) for v in verdicts) == \
        sorted((v["name"], v["op"], sorted(v)) for v in newer)
    assert computed(verdicts) == {"layers.0.weight": None, "layers.1.weight": None}, verdicts


@pytest.mark.parametrize("backend", [BurnBackend.flex, BurnBackend.wgpu], ids=str)
def test_the_readmes_sample_run_loads_in_burn(backend, tmp_path):
    """The README's main job, defaults and all, on Burn's CPU backend and on wgpu: every tensor as qcli
    decodes it, the kept BF16 norms bit-identical to the source."""
    out = tmp_path / "tiny-llama.bpk"
    assert cli("quantize", SINGLE, "-o", out, "--device", "cpu").code == 0
    burn, mine, original = dequantize(backend, out, tmp_path / "burn.safetensors"), qcli_decodes(out), \
        load_file(SINGLE)
    assert sorted(burn) == sorted(original)
    for name, got in burn.items():
        assert same_bits(got, mine[name]), name
        if name.endswith("norm.weight") or "layernorm" in name:
            assert same_bits(got, original[name].to(torch.float32)), name


# -- A real module: nn::Linear loaded with load_from and run forward -------------------------------


ROW_RECIPE = """
version = 1

[[rule]]
match = "*.weight"
preset = "q8s-b32"
transpose = true
"""


@pytest.mark.parametrize("backend", [BurnBackend.flex, BurnBackend.ndarray, BurnBackend.wgpu], ids=str)
@pytest.mark.parametrize("layout", ["row", "col"])
def test_a_linear_stack_loads_with_load_from_and_runs_forward(layout, backend, tmp_path):
    """Burn's `LinearLayout::Row` takes `[in, out]` weights (qcli's `transpose = true`); `Col` takes
    PyTorch's `[out, in]` as written. Either way Burn's forward pass equals torch's on the weights qcli
    decodes, up to float summation order."""
    require(backend)
    source = checkpoint(tmp_path / "model.safetensors")
    out = tmp_path / "model.bpk"
    args = ["quantize", source, "-o", out, "--device", "cpu", "--scheme", "q8s-b32", "--burn-backend", backend]
    if layout == "row":
        (tmp_path / "row.toml").write_text(ROW_RECIPE)
        args += ["--recipe", tmp_path / "row.toml"]
    assert cli(*args).code == 0
    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(1))
    save_f32(tmp_path / "x.safetensors", {"x": x})
    done = run("forward", "--backend", backend, "--layout", layout, out, tmp_path / "x.safetensors",
               tmp_path / "y.safetensors")
    assert done.code == 0, done.err
    y = load_file(tmp_path / "y.safetensors")["y"]
    weights = qcli_decodes(out)
    expected = x.double()
    for i in range(2):
        w = weights[f"layers.{i}.weight"].double()
        expected = expected @ (w if layout == "row" else w.T) + weights[f"layers.{i}.bias"].double()
    assert y.shape == (5, 64)
    torch.testing.assert_close(y.double(), expected, rtol=1e-5, atol=1e-5)


VOCAB, D_MODEL, D_FF, HEADS = 96, 64, 128, 4


def block_checkpoint(path: Path) -> Path:
    """A small Llama-shaped block in PyTorch's orientation (`tests/burn/src/block.rs` names its tensors):
    embedding, RMS norms, attention projections, a gated MLP; an outlier in each matrix."""
    generator = torch.Generator().manual_seed(3)
    shapes = {"embed.weight": (VOCAB, D_MODEL), "q.weight": (D_MODEL, D_MODEL), "k.weight": (D_MODEL, D_MODEL),
              "v.weight": (D_MODEL, D_MODEL), "o.weight": (D_MODEL, D_MODEL), "gate.weight": (D_FF, D_MODEL),
              "up.weight": (D_FF, D_MODEL), "down.weight": (D_MODEL, D_FF)}
    tensors = {name: torch.randn(shape, generator=generator) * 0.1 for name, shape in shapes.items()}
    for i, t in enumerate(tensors.values()):
        t.view(-1)[i * 7] = 0.9
    for norm in ("attn_norm", "mlp_norm", "norm"):
        tensors[f"{norm}.gamma"] = 1 + 0.1 * torch.randn(D_MODEL, generator=generator)
    return save_f32(path, tensors)


def torch_block(w: dict[str, torch.Tensor], ids: torch.Tensor) -> torch.Tensor:
    """The architecture of `tests/burn/src/block.rs` in torch (float64), on weights `[out, in]`."""
    w = {name: t.double() for name, t in w.items()}

    def norm(x: torch.Tensor, name: str) -> torch.Tensor:
        return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w[f"{name}.gamma"]

    def heads(x: torch.Tensor) -> torch.Tensor:
        return x.reshape(*ids.shape, HEADS, D_MODEL // HEADS).transpose(1, 2)

    h = w["embed.weight"][ids]
    a = norm(h, "attn_norm")
    q, k, v = (heads(a @ w[f"{p}.weight"].T) for p in "qkv")
    attention = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    h = h + attention.transpose(1, 2).reshape(*ids.shape, D_MODEL) @ w["o.weight"].T
    m = norm(h, "mlp_norm")
    h = h + (torch.nn.functional.silu(m @ w["gate.weight"].T) * (m @ w["up.weight"].T)) @ w["down.weight"].T
    return norm(h, "norm")


@pytest.mark.parametrize(("backend", "preset"), [(BurnBackend.flex, "q4s-b32"), (BurnBackend.wgpu, "q8s-b32")],
                         ids=str)
def test_a_transformer_block_runs_in_burn_as_in_torch_on_qcli_s_decode(backend, preset, tmp_path):
    """A small transformer block built in Burn from a qcli file with `load_from` (Col layout, PyTorch's
    orientation), its weights quantized with a preset `--burn-backend` accepts there, gives torch's hidden
    states on the weights qcli decodes, up to float summation order."""
    require(backend)
    source = block_checkpoint(tmp_path / "block.safetensors")
    out = tmp_path / "block.bpk"
    result = cli("quantize", source, "-o", out, "--device", "cpu", "--scheme", preset, "--burn-backend", backend)
    assert result.code == 0, result.err
    weights = qcli_decodes(out)
    quantized = {e.name for e in BurnpackReader.open(out).entries() if isinstance(e.dtype, QFloat)}
    assert quantized == {n for n in weights if n.endswith(".weight")}
    ids = torch.tensor([[3, 17, 42, 95, 0, 8, 60, 33], [1, 2, 3, 4, 5, 6, 7, 91]])
    save_f32(tmp_path / "ids.safetensors", {"ids": ids})
    done = run("block", "--backend", backend, "--layout", "col", "--heads", str(HEADS), out,
               tmp_path / "ids.safetensors", tmp_path / "y.safetensors")
    assert done.code == 0, done.err
    y = load_file(tmp_path / "y.safetensors")["y"]
    assert y.shape == (2, 8, D_MODEL)
    torch.testing.assert_close(y.double(), torch_block(weights, ids), rtol=1e-4, atol=1e-4)


def test_a_square_weight_loaded_in_the_wrong_orientation_runs_silently_wrong(tmp_path):
    """Why qcli never transposes silently and Row needs `transpose = true`: a square PyTorch weight loads
    into `LinearLayout::Row` without an error and computes x @ W instead of x @ W.T."""
    w = torch.randn(32, 32, generator=torch.Generator().manual_seed(2))
    source = save_f32(tmp_path / "square.safetensors", {"layers.0.weight": w})
    out = tmp_path / "square.bpk"
    assert cli("quantize", source, "-o", out, "--device", "cpu", "--scheme", "q8s-b32").code == 0
    x = torch.randn(3, 32, generator=torch.Generator().manual_seed(3))
    save_f32(tmp_path / "x.safetensors", {"x": x})
    require(BurnBackend.flex)
    done = run("forward", "--backend", "flex", "--layout", "row", out, tmp_path / "x.safetensors",
               tmp_path / "y.safetensors")
    assert done.code == 0, done.err
    y = load_file(tmp_path / "y.safetensors")["y"].double()
    decoded = qcli_decodes(out)["layers.0.weight"].double()
    torch.testing.assert_close(y, x.double() @ decoded, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(y, x.double() @ decoded.T, atol=1e-2)


# -- Lookup: the refusal qcli makes up front is Burn's -------------------------------------------


def test_burn_panics_on_a_lookup_scheme_as_qcli_says(tmp_path):
    """A Lookup tensor written by hand (qcli refuses to) is refused by Burn's CubeCL backend with the
    words qcli quotes."""
    require(BurnBackend.wgpu)
    scheme = QuantScheme().with_value(QuantValue.Q4S).with_store(PackedU32(0)).per_block([32], ScaleDtype.F16)
    payload = encode(torch.randn(4, 64), scheme)
    lookup = scheme.with_mode(QuantMode.Lookup)
    path = tmp_path / "lookup.bpk"
    with BurnpackWriter(path, [TensorEntry("w", QFloat(lookup), (4, 64), payload.numel())]) as w:
        w.write("w", payload)
        w.commit()
    done = run("dequantize", "--backend", "wgpu", path, tmp_path / "out.safetensors")
    assert done.code != 0
    assert "lookup quantization does not travel as a QFloat tensor" in done.err
    refused = cli("validate-scheme", write_lookup_recipe(tmp_path))
    assert refused.code == 1 and "lookup quantization does not travel as a QFloat tensor" in refused.out


def write_lookup_recipe(tmp_path: Path) -> Path:
    path = tmp_path / "nf4.toml"
    path.write_text('version = 1\n\n[[rule]]\nmatch = "*"\nvalue = "Q4S"\nmode = "Lookup"\nblock = [32]\n'
                    'block_scale = "F16"\n')
    return path


# -- Against Burn's own quantizer -----------------------------------------------------------------


def burn_quantizes(backend: BurnBackend, scheme: QuantScheme, weights: dict[str, torch.Tensor], tmp_path: Path):
    """The payloads Burn's quantizer (`Tensor::quantize`, min-max calibration) writes for `weights` on
    `backend`, saved by `BurnpackStore`, with the scheme each is stored under."""
    require(backend)
    source = save_f32(tmp_path / "weights.safetensors", weights)
    out = tmp_path / "burn.bpk"
    done = run("write-fixture", "--backend", backend, "--scheme", json.dumps(scheme.to_serde()), source, out)
    assert done.code == 0, done.err
    reader = BurnpackReader.open(out)
    return {e.name: (bytes(reader.read(e.name)), e.dtype.scheme) for e in reader.entries()}


def weights_for(seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    w = {"layers.0.weight": torch.randn(32, 128, generator=generator) * 0.05,
         "layers.1.weight": torch.randn(128, 64, generator=generator) * 0.02}
    w["layers.0.weight"][1, 2] = 0.9
    return w


def _level(scheme: QuantScheme, level: str, dtype: ScaleDtype) -> QuantScheme:
    if level == "tensor":
        return scheme.per_tensor(dtype)
    if level == "block":
        return scheme.per_block([32], dtype)
    return scheme.per_block([16], dtype).per_tensor(ScaleDtype.F32)


CUBECL_CASES = [_level(QuantScheme().with_value(v).with_store(PackedU32(0)), level, dtype)
                for v in QuantValue for level in ("tensor", "block", "two-level")
                for dtype in (ScaleDtype.F32, ScaleDtype.F16) if not (level == "two-level" and dtype is ScaleDtype.F32)]


@pytest.mark.parametrize("scheme", CUBECL_CASES, ids=str)
def test_qcli_writes_the_bytes_burns_cubecl_quantizer_writes(scheme, tmp_path):
    """On wgpu (CubeCL's quantize kernel) Burn rounds as qcli does, RN(x / s) with the scale rounded up
    onto its dtype: every value type, scale level and F32/F16 scale gives byte-identical payloads."""
    weights = weights_for(4)
    for name, (burn, stored) in burn_quantizes(BurnBackend.wgpu, scheme, weights, tmp_path).items():
        assert stored == scheme
        assert burn == encode(weights[name], scheme).numpy().tobytes(), name


FLEX_CASES = [_level(QuantScheme().with_value(v).with_store(store), level, dtype)
              for v in (QuantValue.Q8S, QuantValue.Q8F) for store in (Native(), PackedU32(0))
              for level in ("tensor", "block", "two-level") for dtype in ScaleDtype
              if not (level == "two-level" and dtype not in (ScaleDtype.F16, ScaleDtype.UE4M3))]


@pytest.mark.parametrize("scheme", FLEX_CASES, ids=str)
def test_burns_flex_quantizer_differs_from_qcli_only_by_its_reciprocal_and_rounding(scheme, tmp_path):
    """flex quantizes 8-bit values as `round(x * (1 / s))`: a multiply by the rounded reciprocal and a
    round half away from zero (burn-flex ops/qtensor.rs), where qcli and CubeCL take RN(x / s), half to
    even. Its scales are byte for byte qcli's, and its values are exactly that formula applied to them,
    so the two agree wherever x / s is not within an ulp of a half."""
    weights = weights_for(5)
    native = scheme.with_store(Native())
    for name, (burn, stored) in burn_quantizes(BurnBackend.flex, scheme, weights, tmp_path).items():
        assert stored == native  # flex stores one byte per value, whatever store it was asked for
        x = weights[name].numpy()
        mine = encode(weights[name], native).numpy().tobytes()
        assert burn[x.size:] == mine[x.size:], f"{name}: the scales differ"
        y = x * (np.float32(1) / scale_per_value(burn[x.size:], native, x.shape))
        whole = np.trunc(y)
        away = np.where(np.abs(y - whole) >= 0.5, whole + np.sign(y), whole)
        lo, hi = native.value.range()
        flex = np.clip(away, lo, hi).astype(np.int8)
        assert np.frombuffer(burn[: x.size], np.int8).reshape(x.shape).tolist() == flex.tolist(), name


def scale_per_value(raw: bytes, scheme: QuantScheme, shape: tuple[int, ...]) -> np.ndarray:
    """Each value's f32 scale from a payload's scale bytes, decoded by hand from each dtype's definition:
    blocks of [32] or [16] along rows (or one per tensor), times the f32 global of a two-level scheme."""
    dtype = scheme.scale_dtype()
    body = raw[:-4] if scheme.is_two_level() else raw
    if dtype is ScaleDtype.F32:
        scales = np.frombuffer(body, "<f4")
    elif dtype is ScaleDtype.F16:
        scales = np.frombuffer(body, "<f2").astype(np.float32)
    elif dtype is ScaleDtype.BF16:
        scales = (np.frombuffer(body, "<u2").astype(np.uint32) << 16).view(np.float32)
    elif dtype is ScaleDtype.UE8M0:  # a biased exponent; code 0 is 2^-127
        scales = np.exp2(np.frombuffer(body, np.uint8).astype(np.float64) - 127).astype(np.float32)
    else:  # UE4M3: 4 exponent bits (bias 7), 3 mantissa bits, subnormals below 2^-6
        codes = np.frombuffer(body, np.uint8).astype(np.int64)
        e, m = codes >> 3, codes & 7
        scales = np.where(e == 0, m * 2.0**-9, (1 + m / 8) * np.exp2(e - 7)).astype(np.float32)
    if scheme.is_two_level():
        scales = np.frombuffer(raw[-4:], "<f4")[0] * scales
    if scheme.block is None:
        return np.full(shape, scales[0], np.float32)
    block = scheme.block.size.dims()[-1]
    return np.repeat(scales.reshape(shape[0], -1), block, axis=1)[:, : shape[1]].astype(np.float32)


# -- The release, the fixtures Burn wrote, and the README's example ------------------------------


@pytest.mark.parametrize("version", BURN_VERSIONS)
def test_each_harness_links_the_burn_release_it_stands_for(version):
    """Every release qcli writes for has a harness pinning it; the tests run it, or (RECORDED) its record
    names the release the harness reported (tests/io/test_burn_023_recorded.py)."""
    assert f'version = "={version}"' in (HARNESSES[version][0] / "Cargo.toml").read_text()
    assert f"Burn {version}" in (ROOT / "README.md").read_text()
    assert BURN_VERSIONS[0] == BURN_VERSION  # the default is the newest stable release
    assert (version in LIVE_HARNESSES) != (version in RECORDED)
    if version in RECORDED:
        return
    require(BurnBackend.flex, version)
    done = run("version", version=version)
    assert (done.code, done.out.strip()) == (0, version)


def test_the_burn_fixtures_regenerate_byte_for_byte(tmp_path):
    """tests/data/burn is what `python3 tests/burn_harness.py` writes: Burn's output is deterministic, and
    the committed files are Burn's, not edited."""
    write_fixtures(tmp_path)
    for name in (FIXTURE_SOURCE, *FIXTURE_SCHEMES):
        assert (tmp_path / name).read_bytes() == (FIXTURES / name).read_bytes(), name


@pytest.mark.parametrize("name", [n for n, (_, scheme) in FIXTURE_SCHEMES.items() if scheme is not None])
def test_qcli_decodes_burns_quantized_files_as_burn_does(name, tmp_path):
    """A QFloat burnpack Burn wrote (its own quantizer, its own store): qcli's decoder gives Burn's values."""
    backend, _ = FIXTURE_SCHEMES[name]
    burn = dequantize(backend, FIXTURES / name, tmp_path / "burn.safetensors")
    mine = qcli_decodes(FIXTURES / name)
    assert sorted(burn) == sorted(mine)
    for tensor, got in burn.items():
        assert same_bits(got, mine[tensor]), tensor


def readme_rust_example() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("```rust\n") + len("```rust\n")
    return text[start : text.index("```", start)]


@pytest.mark.parametrize("transpose", [True, False], ids=["row", "col"])
def test_the_readmes_burn_example_compiles_and_loads_a_qcli_file(transpose, tmp_path):
    """The README's Rust snippet is the harness's example program, which cargo compiled; run on a qcli
    file written with `--transpose` (its Linears in `LinearLayout::Row`) or without (`Col`), it loads it with
    `load_from` and runs the model, and refuses the file in the other layout (its weights are not square)."""
    require(BurnBackend.flex)
    assert readme_rust_example() in (CRATE / "examples" / "load_qcli.rs").read_text()
    generator = torch.Generator().manual_seed(6)
    source = save_f32(tmp_path / "model.safetensors", {
        "up.weight": torch.randn(128, 256, generator=generator), "up.bias": torch.randn(128, generator=generator),
        "down.weight": torch.randn(64, 128, generator=generator), "down.bias": torch.randn(64, generator=generator),
    })
    out = tmp_path / "model.bpk"
    assert cli("quantize", source, "-o", out, "--burn-backend", "flex", *(["--transpose"] if transpose else [])
               ).code == 0
    layout, other = ("row", "col") if transpose else ("col", "row")
    done = subprocess.run([example("load_qcli"), out, layout], capture_output=True, text=True, timeout=300)
    assert (done.returncode, done.stdout.strip()) == (0, "[1, 64]"), done.stderr
    assert subprocess.run([example("load_qcli"), out, other], capture_output=True, timeout=300).returncode != 0


def test_transpose_writes_what_burns_row_layout_computes_as_torch_does(tmp_path):
    """`--transpose` without a recipe: a stack of a non-square and a square Linear loaded into Burn's default
    `LinearLayout::Row` computes torch's `nn.Linear` on the source weights, within their 8-bit rounding,
    and exactly what the weights qcli decodes give."""
    require(BurnBackend.flex)
    generator = torch.Generator().manual_seed(8)
    weights = {
        "layers.0.weight": torch.randn(96, 64, generator=generator) * 0.1,  # [out, in], not square
        "layers.0.bias": torch.randn(96, generator=generator) * 0.1,
        "layers.1.weight": torch.randn(96, 96, generator=generator) * 0.1,  # square: Row or Col, no error
        "layers.1.bias": torch.randn(96, generator=generator) * 0.1,
    }
    source = save_f32(tmp_path / "model.safetensors", weights)
    out = tmp_path / "model.bpk"
    assert cli("quantize", source, "-o", out, "--transpose", "--scheme", "q8s-b32", "--device", "cpu").code == 0
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(9))
    save_f32(tmp_path / "x.safetensors", {"x": x})
    done = run("forward", "--backend", "flex", "--layout", "row", out, tmp_path / "x.safetensors",
               tmp_path / "y.safetensors")
    assert done.code == 0, done.err
    y = load_file(tmp_path / "y.safetensors")["y"].double()
    reference = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.Linear(96, 96)).double()
    reference.load_state_dict({name.removeprefix("layers."): t.double() for name, t in weights.items()})
    with torch.no_grad():
        expected = reference(x.double())
    torch.testing.assert_close(y, expected, rtol=0, atol=0.02 * float(expected.abs().max()))
    decoded = qcli_decodes(out)
    for i in range(2):
        assert decoded[f"layers.{i}.weight"].shape == weights[f"layers.{i}.weight"].T.shape
    mine = x.double()
    for i in range(2):
        mine = mine @ decoded[f"layers.{i}.weight"].double() + decoded[f"layers.{i}.bias"].double()
    torch.testing.assert_close(y, mine, rtol=1e-5, atol=1e-5)
    wrong = x.double() @ weights["layers.0.weight"].double().T + weights["layers.0.bias"].double()
    wrong = wrong @ weights["layers.1.weight"].double() + weights["layers.1.bias"].double()  # square not transposed
    assert not torch.allclose(y, wrong, atol=0.1 * float(expected.abs().max()))


def test_a_bf16_model_loads_on_ndarray_with_its_kept_tensors_cast_to_f32(tmp_path):
    """ndarray builds no BF16 tensor: `cast_kept = "F32"` writes the norms as F32, which it loads, their
    values the source's exactly (BF16 widens to F32 without rounding)."""
    recipe = tmp_path / "f32.toml"
    recipe.write_text('version = 1\n\n[defaults]\ncast_kept = "F32"\n')
    out = tmp_path / "tiny.bpk"
    args = ["quantize", SINGLE, "-o", out, "--scheme", "q8s-b32", "--recipe", recipe, "--burn-backend", "ndarray"]
    assert cli(*args, "--device", "cpu").code == 0
    burn, original = dequantize(BurnBackend.ndarray, out, tmp_path / "burn.safetensors"), load_file(SINGLE)
    mine = qcli_decodes(out)
    for name, got in burn.items():
        assert same_bits(got, mine[name]), name
        if "norm" in name:
            assert same_bits(got, original[name].to(torch.float32)), name


SEARCHED = {  # recipe keys of the searched schemes, with the backends of Burn 0.22.1 that decode them
    "Q4F b32 F16": ('value = "Q4F"\nblock = [32]\nblock_scale = "F16"', (BurnBackend.flex, BurnBackend.wgpu)),
    "Q8F b32 F16": ('value = "Q8F"\nblock = [32]\nblock_scale = "F16"', (BurnBackend.flex, BurnBackend.ndarray,
                                                                        BurnBackend.wgpu)),
    "Q4S b32 F16": ('value = "Q4S"\nblock = [32]\nblock_scale = "F16"', (BurnBackend.flex, BurnBackend.wgpu)),
    "Q8S tensor F32": ('value = "Q8S"', (BurnBackend.flex, BurnBackend.ndarray, BurnBackend.wgpu)),
    "E2M1 b32 F16": ('value = "E2M1"\nblock = [32]\nblock_scale = "F16"', (BurnBackend.wgpu,)),
}


@pytest.mark.parametrize(("name", "backend"), [(n, b) for n, (_, backends) in SEARCHED.items() for b in backends],
                         ids=str)
def test_searched_scales_negative_ones_included_decode_in_burn_as_qcli_decodes_them(name, backend, tmp_path):
    """`calibration = "mse"` stores scales MinMax never would (rounded to nearest, clipped, and for Q4F and
    Q8F negative): Burn decodes each tensor to exactly qcli's values."""
    require(backend)
    source = checkpoint(tmp_path / "model.safetensors")
    recipe = tmp_path / "recipe.toml"
    rule = SEARCHED[name][0]
    recipe.write_text(f'version = 1\n[[rule]]\nmatch = "*.weight"\n{rule}\ncalibration = "mse"\n')
    out = tmp_path / "model.bpk"
    # No --burn-backend: it also refuses what a model computes wrong with (Q4F on flex, say), not this test's.
    result = cli("quantize", source, "-o", out, "--recipe", recipe, "--device", "cpu")
    assert result.code == 0, result.err
    burn, mine = dequantize(backend, out, tmp_path / "burn.safetensors"), qcli_decodes(out)
    for tensor, got in burn.items():
        assert same_bits(got, mine[tensor]), f"{tensor}: Burn ({backend}) decodes other values than qcli"
    if name.startswith(("Q4F", "Q8F")):
        reader = BurnpackReader.open(out)
        entry = next(e for e in reader.entries() if e.name == "layers.0.weight")
        assert bool((block_scales(bytes(reader.read(entry.name)), entry.dtype.scheme, entry.shape) < 0).any())
