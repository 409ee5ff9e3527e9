"""`qcli eval`: its scores held to a computation of their own (transformers' model loaded by itself, the
quantized weights decoded by the hand decoder of tests/cli_support.py, KL by torch's kl_div), the exact
case, what it refuses, its --json document, and a run on the sample weights."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.calibrate_support import TEXT, tiny_llama
from tests.cli_support import SAMPLES, SHARDED, assert_user_error, cli, decode_packed, validate_json
from tests.formats.test_gguf_smollm2 import smollm2  # noqa: F401 - the fixture

pytest.importorskip("transformers")

SEQ_LEN, WINDOWS = 24, 4
KEEP_ALL = '[[rule]]\nmatch = "*"\nkeep = true\n'


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    folder = tiny_llama(tmp_path_factory.mktemp("eval") / "llama", seed=3)
    (folder.parent / "text.txt").write_text(TEXT)
    return folder


def quantized(model: Path, target: Path | str, *options: str) -> Path:
    done = cli("quantize", model, "-o", target, "--device", "cpu", "--force", "--quiet", *options)
    assert done.code == 0, done.err
    return Path(target)


def evaluate(quantized: Path, model: Path, *options: str) -> dict:
    done = cli("eval", quantized, "--against", model, "--text", model.parent / "text.txt", "--samples",
               str(WINDOWS), "--seq-len", str(SEQ_LEN), "--device", "cpu", "--json", *options)
    assert done.code == 0, done.err
    validate_json(done.json)
    return done.json


def hand_decoded(bpk: Path) -> dict[str, torch.Tensor]:
    """Each tensor of `bpk` as the model takes it: a QFloat one decoded by the hand decoder (symmetric
    integers in PackedU32 with F16 block scales of 32), the others as stored, turned back where the file's
    metadata lists it as transposed."""
    from qcli.io.burnpack import BurnpackReader
    from qcli.io.dtypes import QFloat

    reader = BurnpackReader.open(bpk)
    transposed = set(json.loads(reader.metadata["transposed"]))
    weights = {}
    for entry in reader.entries():
        data = bytes(reader.read(entry.name))
        if isinstance(entry.dtype, QFloat):
            serde = entry.dtype.scheme.to_serde()
            assert serde["store"] == {"PackedU32": 0} and serde["block"]["dtype"] == "F16", serde
            bits = {"Q8S": 8, "Q4S": 4}[serde["value"]]
            values, _ = decode_packed(data, tuple(entry.shape), bits, serde["block"]["size"]["storage"][0])
            tensor = torch.from_numpy(values)
        else:
            tensor = torch.from_numpy(np.frombuffer(data, dtype=np.float32).copy()).reshape(tuple(entry.shape))
        weights[entry.name] = tensor.t() if entry.name in transposed else tensor
    return weights


def direct(model: Path, weights: dict[str, torch.Tensor]) -> dict:
    """KL(source || quantized), top-1 agreement and both perplexities, from the models' logits on WINDOWS
    windows of SEQ_LEN tokens laid end to end from the text's start (the tokenizer adds no special token)."""
    from transformers import AutoModelForCausalLM

    other = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    missing, unexpected = other.load_state_dict(weights, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    return compared(model, other)


def compared(model: Path, other: torch.nn.Module) -> dict:
    """`direct`'s scores of the model `other` against `model`'s own."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    ids = tokenizer(TEXT, add_special_tokens=False).input_ids
    assert tokenizer("a").input_ids == tokenizer("a", add_special_tokens=False).input_ids
    windows = torch.tensor(ids[: WINDOWS * SEQ_LEN]).view(WINDOWS, SEQ_LEN)
    source = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    with torch.no_grad():
        p = source(windows).logits[:, :-1].double().log_softmax(-1).reshape(-1, 300)
        q = other(windows).logits[:, :-1].double().log_softmax(-1).reshape(-1, 300)
    targets = windows[:, 1:].reshape(-1, 1)
    return {"kl": float(F.kl_div(q, p, log_target=True, reduction="sum")) / len(p),
            "same_top1": float((p.argmax(-1) == q.argmax(-1)).double().mean()),
            "source": math.exp(-float(p.gather(1, targets).mean())),
            "quantized": math.exp(-float(q.gather(1, targets).mean())), "tokens": len(p)}


@pytest.mark.parametrize("options", [(), ("--transpose",)], ids=["as-pytorch", "transposed"])
def test_the_scores_are_a_direct_computations(model, tmp_path, options):
    bpk = quantized(model, tmp_path / "q.bpk", *options)
    got = evaluate(bpk, model)
    want = direct(model, hand_decoded(bpk))
    assert got["tokens"] == want["tokens"] == WINDOWS * (SEQ_LEN - 1)
    assert got["kl"] == pytest.approx(want["kl"], rel=1e-3, abs=1e-7)
    assert want["kl"] > 1e-6  # 4-bit weights move the predictions: the check is not of two equal models
    assert got["same_top1"] == pytest.approx(want["same_top1"], abs=1.5 / want["tokens"])
    assert got["perplexity"]["source"] == pytest.approx(want["source"], rel=1e-4)
    assert got["perplexity"]["quantized"] == pytest.approx(want["quantized"], rel=1e-4)
    assert got["tensors"]["transposed"] == (14 + 1 if options else 0)  # the blocks' Linears and the head
    assert got["windows"] == WINDOWS and got["seq_len"] == SEQ_LEN


def test_a_file_of_kept_tensors_scores_exactly(model, tmp_path):
    recipe = tmp_path / "keep.toml"
    recipe.write_text("version = 1\n" + KEEP_ALL)
    got = evaluate(quantized(model, tmp_path / "kept.bpk", "--recipe", recipe), model)
    assert got["kl"] == 0.0 and got["kl_max"] == 0.0 and got["same_top1"] == 1.0
    assert got["perplexity"]["source"] == got["perplexity"]["quantized"]
    assert got["tensors"]["quantized"] == 0


def test_a_model_folder_gives_its_config_and_names(model, tmp_path):
    folder = quantized(model, f"{tmp_path}/out/")
    done = cli("eval", folder, "--against", model / "model.safetensors", "--text", model.parent / "text.txt",
               "--samples", "2", "--seq-len", str(SEQ_LEN), "--device", "cpu")
    assert done.code == 0, done.err
    assert "KL " in done.out and "top-1" in done.out and str(folder / "config.json") in done.out
    quiet = cli("eval", folder, "--against", model, "--text", model.parent / "text.txt", "--samples", "2",
                "--seq-len", str(SEQ_LEN), "--device", "cpu", "--quiet")
    assert quiet.code == 0 and quiet.out.strip().splitlines() == [done.out.strip().splitlines()[-1]]


def test_a_folder_written_with_hf_names_scores_against_a_safetensors_source(model, tmp_path):
    """A folder quantize wrote from a GGUF file with --names hf holds Hugging Face's names, as a safetensors
    checkpoint of the same model does: its record's `hf` applies to a GGUF source only."""
    folder = quantized(model, f"{tmp_path}/out/")
    record = json.loads((folder / "qcli.json").read_text())
    record["options"]["names"] = "hf"
    (folder / "qcli.json").write_text(json.dumps(record))
    done = cli("eval", folder, "--against", model, "--text", model.parent / "text.txt", "--samples", "2",
               "--seq-len", str(SEQ_LEN), "--device", "cpu", "--quiet")
    assert done.code == 0, done.err


def test_a_short_text_scores_the_windows_it_holds(model, tmp_path):
    done = cli("eval", quantized(model, tmp_path / "q.bpk"), "--against", model, "--text", model.parent / "text.txt",
               "--samples", "1000", "--seq-len", str(SEQ_LEN), "--device", "cpu", "--json")
    assert done.code == 0, done.err
    assert done.json["windows"] > WINDOWS
    assert len(done.json["warnings"]) == 1 and "fewer than 1000 windows" in done.json["warnings"][0]


def renamed_copy(model: Path, folder: Path, rename: dict[str, str] | None = None, extra: bool = False,
                 reshape: str | None = None) -> Path:
    """A copy of `model`'s folder, its tensors renamed, one added, or one cut to other rows."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(model, folder)
    tensors = load_file(model / "model.safetensors")
    tensors = {(rename or {}).get(k, k): v for k, v in tensors.items()}
    if extra:
        tensors["model.extra.weight"] = torch.zeros(4, 64)
    if reshape:
        tensors[reshape] = tensors[reshape][:32].contiguous()
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def eval_error(quantized: Path, against: Path, text: Path, code: int, *options: str) -> list[str]:
    return assert_user_error(cli("eval", quantized, "--against", against, "--text", text, "--seq-len",
                                 str(SEQ_LEN), "--samples", "2", "--device", "cpu", *options), code)


def test_what_eval_refuses(model, tmp_path):
    text = model.parent / "text.txt"
    bpk = quantized(model, tmp_path / "q.bpk")
    lines = eval_error(tmp_path / "none.bpk", model, text, 2)
    assert "no such file" in lines[0]
    lines = eval_error(model / "model.safetensors", model, text, 2)
    assert "not a burnpack" in lines[0] and "--against" in lines[-1]
    lines = eval_error(tmp_path, model, text, 2)
    assert "holds no model.bpk" in lines[0]
    lines = eval_error(bpk, model, tmp_path / "missing.txt", 2)
    assert "no such file" in lines[0]
    short = tmp_path / "short.txt"
    short.write_text("The river runs.")
    lines = eval_error(bpk, model, short, 3)
    assert "fewer than one window" in lines[0]
    lines = eval_error(bpk, model, text, 2, "--seq-len", "1000")
    assert "positions" in lines[0]
    lines = eval_error(bpk, SAMPLES / "tiny-llama.safetensors", text, 2)
    assert "'lm_head.weight' is [300, 64]" in lines[0] and "[1000, 128]" in lines[0]
    sample = quantized(SAMPLES / "tiny-llama.safetensors", tmp_path / "sample.bpk")
    lines = eval_error(sample, SAMPLES / "tiny-llama.safetensors", text, 2)
    assert "no config.json" in lines[0]


def test_tensors_that_do_not_pair_are_refused(model, tmp_path):
    text = model.parent / "text.txt"
    other = renamed_copy(model, tmp_path / "renamed", {"model.norm.weight": "model.final_norm.weight"})
    lines = eval_error(quantized(other, tmp_path / "renamed.bpk"), model, text, 2)
    assert "are not in" in lines[0] and "'model.final_norm.weight'" in lines[0]
    assert "written from" in lines[-1]
    bigger = renamed_copy(model, tmp_path / "bigger", extra=True)
    lines = eval_error(quantized(model, tmp_path / "q.bpk"), bigger, text, 2)
    assert "lacks 1 of the tensors" in lines[0] and "'model.extra.weight'" in lines[0]
    cut = renamed_copy(model, tmp_path / "cut", reshape="model.layers.0.mlp.up_proj.weight")
    lines = eval_error(quantized(cut, tmp_path / "cut.bpk"), model, text, 2)
    assert "'model.layers.0.mlp.up_proj.weight' is [32, 64]" in lines[0] and "[128, 64]" in lines[0]


def test_a_burnpack_qcli_did_not_write_is_refused(model, tmp_path):
    from qcli.io.burnpack import BurnpackReader, BurnpackWriter

    bpk = quantized(model, tmp_path / "q.bpk")
    reader = BurnpackReader.open(bpk)
    entries = reader.entries()
    metadata = {k: v for k, v in reader.metadata.items() if k != "producer"}
    with BurnpackWriter(tmp_path / "foreign.bpk", entries, metadata) as writer:
        for e in entries:
            writer.write(e.name, bytearray(reader.read(e.name)))
        writer.commit()
    lines = eval_error(tmp_path / "foreign.bpk", model, model.parent / "text.txt", 2)
    assert "not written by qcli" in lines[0]


def test_the_sample_model_folder(tmp_path):
    folder = tmp_path / "tiny"
    assert cli("quantize", SHARDED, "-o", f"{folder}/", "--device", "cpu", "--quiet").code == 0
    done = cli("eval", folder, "--against", SHARDED, "--text", SAMPLES / "calibration.txt", "--samples", "4",
               "--seq-len", "64", "--device", "cpu", "--json")
    assert done.code == 0, done.err
    validate_json(done.json)
    assert 0 < done.json["kl"] < 0.1 and done.json["tokens"] == 4 * 63


@pytest.mark.slow
def test_smollm2_against_its_gguf(smollm2, tmp_path):  # noqa: F811
    """A real model from the GGUF file a user downloads: no config.json anywhere, so the model and its
    tokenizer are made from the file's metadata; the names quantize read it with come from the folder's record.
    Q4_1 weights requantized to q4s-b32 lose a little of the model, not most of it."""
    folder = tmp_path / "smol"
    assert cli("quantize", smollm2, "-o", f"{folder}/", "--names", "hf", "--requantize", "q4s-b32", "--device", "cpu",
               "--quiet", "--no-stats", "--no-verify").code == 0
    done = cli("eval", folder, "--against", smollm2, "--text", SAMPLES / "calibration.txt", "--samples", "2",
               "--seq-len", "64", "--device", "cpu", "--json")
    assert done.code == 0, done.err
    validate_json(done.json)
    report = done.json
    assert report["config"] == f"{smollm2} (its metadata)" and report["tokens"] == 2 * 63
    assert 0 < report["kl"] < 1 and 0.4 < report["same_top1"] < 1
    assert 1 < report["perplexity"]["source"] < report["perplexity"]["quantized"] < 4 * report["perplexity"]["source"]


def alone_recipe(tmp_path: Path, *names: str) -> Path:
    """A recipe that quantizes `names` to Q4S in blocks of 32 (F16 scales) and keeps every other tensor."""
    recipe = tmp_path / "alone.toml"
    rules = "".join(f'[[rule]]\nmatch = "{n}"\nvalue = "Q4S"\nblock = [32]\nblock_scale = "F16"\n\n' for n in names)
    recipe.write_text("version = 1\n" + rules + KEEP_ALL)
    return recipe


def test_one_tensor_quantized_contributes_the_whole_kl(model, tmp_path):
    name = "model.layers.1.mlp.down_proj.weight"
    got = evaluate(quantized(model, tmp_path / "one.bpk", "--recipe", alone_recipe(tmp_path, name)), model,
                   "--per-tensor", "3")
    assert [t["name"] for t in got["per_tensor"]] == [name]
    alone = got["per_tensor"][0]
    assert got["kl"] > 1e-6 and alone["kl"] == got["kl"] and alone["kl_max"] == got["kl_max"]
    assert alone["same_top1"] == got["same_top1"] and alone["perplexity"] == got["perplexity"]["quantized"]


def test_each_tensor_alone_is_a_direct_computation(model, tmp_path):
    """Two tensors quantized: each one's scores are those of the source model with that one tensor's values
    replaced by its hand-decoded ones (transformers' model loaded by itself), the largest KL first."""
    from safetensors.torch import load_file

    names = ["model.layers.0.self_attn.v_proj.weight", "model.layers.1.mlp.up_proj.weight"]
    bpk = quantized(model, tmp_path / "two.bpk", "--recipe", alone_recipe(tmp_path, *names), "--transpose")
    got = evaluate(bpk, model, "--per-tensor", "1")
    source, decoded = load_file(model / "model.safetensors"), hand_decoded(bpk)
    want = {n: direct(model, source | {n: decoded[n]}) for n in names}
    assert [t["name"] for t in got["per_tensor"]] == sorted(names, key=lambda n: -want[n]["kl"])
    for alone in got["per_tensor"]:
        expected = want[alone["name"]]
        assert expected["kl"] > 1e-6
        assert alone["kl"] == pytest.approx(expected["kl"], rel=1e-3, abs=1e-7)
        assert alone["same_top1"] == pytest.approx(expected["same_top1"], abs=1.5 / expected["tokens"])
        assert alone["perplexity"] == pytest.approx(expected["quantized"], rel=1e-4)
    both = direct(model, source | {n: decoded[n] for n in names})
    assert got["kl"] == pytest.approx(both["kl"], rel=1e-3, abs=1e-7)


def test_the_worst_tensors_table(model, tmp_path):
    names = ["model.layers.0.self_attn.v_proj.weight", "model.layers.1.mlp.up_proj.weight"]
    bpk = quantized(model, tmp_path / "two.bpk", "--recipe", alone_recipe(tmp_path, *names))
    common = ("--text", model.parent / "text.txt", "--samples", "2", "--seq-len", str(SEQ_LEN), "--device", "cpu")
    report = cli("eval", bpk, "--against", model, *common, "--json", "--per-tensor", "1").json
    done = cli("eval", bpk, "--against", model, *common, "--per-tensor", "1")
    assert done.code == 0, done.err
    lines = done.out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("each tensor quantized alone"))
    assert "exact, 2 tensors" in lines[start] and "the 1 of largest KL" in lines[start]
    worst = report["per_tensor"][0]
    assert lines[start + 1].split() == ["tensor", "KL", "share", "top-1", "perplexity"]
    row = lines[start + 3].split()
    assert row[:2] == [worst["name"], f"{worst['kl']:.5f}"]
    total = sum(t["kl"] for t in report["per_tensor"])
    assert row[2] == f"{100 * worst['kl'] / total:.1f}"
    assert lines[start + 4].startswith("sum over the 2 tensors")
    plain = cli("eval", bpk, "--against", model, *common)
    assert "each tensor" not in plain.out and "per_tensor" not in cli("eval", bpk, "--against", model, *common,
                                                                        "--json").json
    lines = eval_error(bpk, model, model.parent / "text.txt", 2, "--per-tensor", "0")
    assert "--per-tensor 0" in lines[0] and "--per-tensor 10" in lines[-1]


def test_fused_experts_are_made_of_the_files_tensors(tmp_path):
    """A Mixtral whose experts transformers fuses from the per-expert tensors the file holds: the scores are
    those of transformers' own model loaded from a checkpoint of the hand-decoded tensors (its own conversion
    fusing them), and --per-tensor scores each fused parameter under the model's name."""
    import shutil

    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    from tests.calibrate_support import tiny_decoder

    model = tiny_decoder(tmp_path / "mixtral", "mixtral")
    (tmp_path / "text.txt").write_text(TEXT)
    bpk = quantized(model, tmp_path / "q.bpk")
    got = evaluate(bpk, model, "--per-tensor", "1")
    decoded = shutil.copytree(model, tmp_path / "decoded")
    save_file({k: v.contiguous() for k, v in hand_decoded(bpk).items()}, decoded / "model.safetensors",
              metadata={"format": "pt"})
    want = compared(model, AutoModelForCausalLM.from_pretrained(decoded, dtype=torch.float32).eval())
    assert want["kl"] > 1e-6
    assert got["kl"] == pytest.approx(want["kl"], rel=1e-3, abs=1e-7)
    assert got["perplexity"]["quantized"] == pytest.approx(want["quantized"], rel=1e-4)
    names = {t["name"] for t in got["per_tensor"]}
    assert "model.layers.0.mlp.experts.gate_up_proj" in names and "model.layers.3.mlp.experts.down_proj" in names
    assert "model.layers.0.self_attn.q_proj.weight" in names
