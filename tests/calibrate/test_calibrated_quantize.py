"""`qcli quantize --calibration gptq` end to end on a tiny Llama and a tiny BERT, judged by Burn and transformers.

Burn (the harness, flex) decodes what qcli wrote; transformers' own model (from_pretrained, forward hooks, no
qcli code) gives each Linear's calibration inputs as the sequential run sees them: the blocks before its own
with Burn's decode of their weights in place, its own block float. On those inputs GPTQ's output error is no
larger than MinMax's with the same blocks, and the error qcli reports is the one measured here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from qcli.burn_backends import BurnBackend
from tests import burn_harness
from tests.calibrate_support import tiny_bert, tiny_llama
from tests.cli_support import cli

SEQ_LEN = 16
# One paragraph: the calibration stream is its tokens, and a text shorter than the windows asked for is cut
# into windows end to end from its first token, which this test reproduces without qcli.
TEXT = ("The river runs past the old mill, where the miller keeps his grain in sacks of rough cloth. In spring the "
        "water rises and the wheel turns faster, and the children watch the ducks along the bank. Every evening "
        "the miller walks to the bridge and counts the boats that pass beneath it on their way to the town. ") * 6
# The error qcli reports against the one measured here on transformers' float32 activations: on CUDA the
# run's blocks compute in TF32 (qcli.calibrate.runner).
REPORTED_RTOL = {"cpu": 1e-3, "cuda": 1e-2}
ARCHITECTURES = {"llama": ("model.layers", "AutoModelForCausalLM"), "bert": ("encoder.layer", "AutoModel")}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    built = {"llama": tiny_llama(tmp_path_factory.mktemp("llama")), "bert": tiny_bert(tmp_path_factory.mktemp("bert"))}
    for folder in built.values():
        (folder / "calibration.txt").write_text(TEXT)
    return built


def quantized(folder: Path, out: Path, device: str, *calibration: str) -> dict:
    result = cli("quantize", folder, "-o", out, "--scheme", "q4s-b32", "--device", device, "--json", "--samples",
                 "1000", "--seq-len", str(SEQ_LEN), *calibration)
    assert result.code == 0, result.err
    return json.loads(result.out)


def test_calibration_text_with_minmax_measures_its_output_error_and_writes_the_same_tensors(checkpoints, tmp_path):
    """A MinMax run given calibration text reports an output error for every Linear of the blocks, and its
    tensors are those of a run without the text, byte for byte (only the metadata records the text)."""
    from qcli.io.burnpack import BurnpackReader

    folder = checkpoints["llama"]
    data = ("--calibration-data", folder / "calibration.txt")
    measured = quantized(folder, tmp_path / "measured.bpk", "cpu", *data)
    plain = quantized(folder, tmp_path / "plain.bpk", "cpu")
    linears = {t["name"] for t in plain["tensors"] if t["decision"] == "quantize" and ".layers." in t["name"]}
    assert {t["name"] for t in measured["tensors"] if t["output_error"] is not None} == linears
    assert all(0 < t["output_error"] < 1 for t in measured["tensors"] if t["name"] in linears)
    assert not [w for w in measured["warnings"] if "not calibrated" in w["message"]]
    a, b = (BurnpackReader.open(tmp_path / f"{name}.bpk") for name in ("measured", "plain"))
    assert [(e.name, bytes(a.read(e.name))) for e in a.entries()] == [(e.name, bytes(b.read(e.name)))
                                                                       for e in b.entries()]


def windows(folder: Path) -> torch.Tensor:
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(folder)(TEXT, add_special_tokens=False)["input_ids"]
    count = len(ids) // SEQ_LEN
    return torch.tensor(ids[: count * SEQ_LEN]).view(count, SEQ_LEN)


def block_inputs(folder: Path, arch: str, decoded: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Each block's Linears' inputs (f64 [tokens, in], by weight name) on the windows, the blocks before it
    holding `decoded`'s weights."""
    import transformers

    prefix, cls_name = ARCHITECTURES[arch]
    ids, inputs = windows(folder), {}
    blocks = getattr(transformers, cls_name).from_pretrained(folder).config.num_hidden_layers
    for block in range(blocks):
        model = getattr(transformers, cls_name).from_pretrained(folder, torch_dtype=torch.float32).eval()
        earlier = {n: t for n, t in decoded.items() if any(n.startswith(f"{prefix}.{b}.") for b in range(block))}
        missing = model.load_state_dict(earlier, strict=False).unexpected_keys
        assert not missing, missing
        hooks = []
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear) and name.startswith(f"{prefix}.{block}."):
                def keep(_m, args, _out, name=f"{name}.weight"):
                    inputs[name] = torch.cat([inputs.get(name, torch.empty(0, args[0].shape[-1], dtype=torch.float64)),
                                              args[0].reshape(-1, args[0].shape[-1]).double()])
                hooks.append(module.register_forward_hook(keep))
        with torch.no_grad():
            for window in ids:
                model(input_ids=window[None])
        for hook in hooks:
            hook.remove()
    return inputs


def relative_error(x: torch.Tensor, weight: torch.Tensor, approx: torch.Tensor) -> float:
    reference = x @ weight.double().T
    return float((reference - x @ approx.double().T).norm() / reference.norm())


@pytest.mark.burn
@pytest.mark.parametrize("arch", ["llama", "bert"])
def test_gptq_errs_no_more_than_minmax_on_its_calibration_inputs_in_burns_decode(checkpoints, arch, tmp_path, device):
    from safetensors.torch import load_file

    folder = checkpoints[arch]
    data = ("--calibration-data", folder / "calibration.txt")
    gptq = quantized(folder, tmp_path / "gptq.bpk", device, "--calibration", "gptq", *data)
    minmax = quantized(folder, tmp_path / "minmax.bpk", device, "--calibration", "minmax", *data)
    assert minmax["calibration"]["method"] == "minmax"  # the text measures MinMax's output error alone
    assert gptq["calibration"]["method"] == "gptq" and gptq["calibration"]["samples"] == len(windows(folder))
    assert [w["kind"] for w in gptq["warnings"]].count("calibration") >= 1  # the text is shorter than asked
    burn_gptq = burn_harness.dequantize(BurnBackend.flex, tmp_path / "gptq.bpk", tmp_path / "gptq.safetensors")
    burn_minmax = burn_harness.dequantize(BurnBackend.flex, tmp_path / "minmax.bpk", tmp_path / "minmax.safetensors")
    source = load_file(folder / "model.safetensors")
    inputs = block_inputs(folder, arch, burn_gptq)
    float_inputs = block_inputs(folder, arch, source)
    reported = {t["name"]: t["output_error"] for t in gptq["tensors"] if t["output_error"] is not None}
    measured = {t["name"]: t["output_error"] for t in minmax["tensors"] if t["output_error"] is not None}
    assert set(measured) == set(inputs)
    assert set(reported) == set(inputs), set(reported) ^ set(inputs)
    ratios = []
    for name, x in inputs.items():
        ours = relative_error(x, source[name], burn_gptq[name])
        plain = relative_error(x, source[name], burn_minmax[name])
        assert ours <= plain, (name, ours, plain)
        assert reported[name] == pytest.approx(ours, rel=REPORTED_RTOL[device]), name
        # MinMax's on the inputs of the float blocks before it: the run that measured it left them float
        assert measured[name] == pytest.approx(relative_error(float_inputs[name], source[name], burn_minmax[name]),
                                               rel=REPORTED_RTOL[device]), name
        ratios.append(ours / plain)
    assert sum(ratios) / len(ratios) < 0.95, ratios  # and below it on the whole, not merely tied
    assert all(t["output_error"] is None for t in gptq["tensors"] if t["name"] not in inputs)
